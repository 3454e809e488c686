"""Scaled dot-product attention, forward and backward (nvFuser's sdpfa_fwd and
sdpfa_bwd), evaluated with explicit math in float so that dropout and
causal masks are generated for the global shape and then cut to the local
block: sharded runs equal unsharded runs.

Rule: leading (batch, head) axes and the query length pass through; the key
length and the q/k head dim are needed whole (softmax and the logits are not
sums of per-device parts). The backward pass needs queries whole too
(key/value gradients sum over queries).
"""

from __future__ import annotations

import math

import torch

from ..ir.dtypes import DataType
from ..ir.nodes import NvShardError, TensorView
from ..ir.sizes import Size, unify
from . import common
from .registry import FactorKind, OpSpec, ShardingRule, frontend, register


def _same_extent(a, a_ids, b, b_ids, i, j, what):
    """sdpfa_fwd needs axis i of a and axis j of b equal (the error names both)."""
    try:
        unify(a_ids[i].extent(), b_ids[j].extent())
    except ValueError:
        raise NvShardError(
            f"sdpfa_fwd: {what} must match: {a.short_name()} axis {i} has extent {a_ids[i].extent()}, "
            f"{b.short_name()} axis {j} has {b_ids[j].extent()}"
        ) from None


def _scalar_arg(fusion, value, name):
    if value is None:
        return None
    if isinstance(value, TensorView):
        raise NvShardError(f"sdpfa: {name} must be a scalar, got {value.short_name()}")
    return common.as_val(fusion, value)


# elements of one block of attention scores (16 MiB in float: one 2048x2048
# head; a block's temporaries, kept for the backward, are a few times that)
_BLOCK_ELEMENTS = 1 << 22


def _local_indices(global_rows_shape, localize):
    """Global (flat batch index, query row) of each local row: [B, lL] each,
    B the local batch entries flattened. Built as [*batch, L, 1] index
    tensors cut like the result, so any layout of the batch and query axes
    works."""
    batch, n_rows = list(global_rows_shape[:-1]), global_rows_shape[-1]
    n_batch = math.prod(batch)
    flat = torch.arange(n_batch).view(*batch, 1, 1).expand(*batch, n_rows, 1)
    rows = torch.arange(n_rows).view(*([1] * len(batch)), n_rows, 1).expand(*batch, n_rows, 1)
    flat, rows = localize(flat), localize(rows)
    local_rows = flat.shape[-2]
    return flat.reshape(-1, local_rows), rows.reshape(-1, local_rows)


def _dropout_keep(seed: int, batch_index: int, rows: torch.Tensor, n_keys: int, p: float) -> torch.Tensor:
    """Keep-mask of one (batch, head) entry's local rows: each entry draws its
    own [L, S] numbers from (seed, entry), so every sharding sees the same
    values and no rank draws the global tensor."""
    gen = torch.Generator(device="cpu").manual_seed((int(seed) * 1_000_003 + int(batch_index)) % (1 << 63))
    n_rows = int(rows.max()) + 1 if rows.numel() else 0
    return torch.rand(n_rows, n_keys, generator=gen).index_select(0, rows) >= p


def _attention(q, k, v, bias, mask, dropout_p, is_causal, scale, seed, global_rows_shape, localize, grad_out=None):
    """Float math attention on this device's block, a few (batch, head)
    entries at a time so memory stays bounded. `global_rows_shape` is the
    global [*batch, L]; `localize(t)` cuts a global [*batch, L, X] tensor to
    this device's block. Returns (out, logsumexp), or with `grad_out` the
    gradients of q, k and v."""
    lead, n_q, e = q.shape[:-2], q.shape[-2], q.shape[-1]
    n_k, ev = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    flat_index, row_index = _local_indices(global_rows_shape, localize)
    q3, k3, v3 = q.reshape(-1, n_q, e), k.reshape(-1, n_k, e), v.reshape(-1, n_k, ev)
    full = (*lead, n_q, n_k)
    bias3 = bias.expand(full).reshape(-1, n_q, n_k) if bias is not None else None
    mask3 = mask.expand(full).reshape(-1, n_q, n_k) if mask is not None else None
    g3 = grad_out.reshape(-1, n_q, ev) if grad_out is not None else None
    n = q3.shape[0]
    step = max(1, _BLOCK_ELEMENTS // max(1, n_q * n_k))
    outs, lses, grads = [], [], ([], [], [])
    for start in range(0, n, step):
        sl = slice(start, min(n, start + step))
        qb, kb, vb = q3[sl], k3[sl], v3[sl]
        if grad_out is not None:
            qb, kb, vb = (t.detach().requires_grad_(True) for t in (qb, kb, vb))
        with torch.enable_grad() if grad_out is not None else torch.no_grad():
            scores = torch.matmul(qb, kb.transpose(-1, -2)) * scale
            if bias3 is not None:
                scores = scores + bias3[sl]
            if mask3 is not None:
                scores = scores.masked_fill(~mask3[sl], float("-inf"))
            if is_causal:
                keys = torch.arange(n_k, device=scores.device)
                causal = keys.view(1, 1, n_k) <= row_index[sl].to(scores.device).unsqueeze(-1)
                scores = scores.masked_fill(~causal, float("-inf"))
            lse = torch.logsumexp(scores, dim=-1)
            probs = torch.exp(scores - lse.unsqueeze(-1))
            if dropout_p:
                keep = torch.stack([_dropout_keep(seed, flat_index[i, 0], row_index[i], n_k, dropout_p)
                                    for i in range(sl.start, sl.stop)])
                probs = probs * keep.to(probs.device) / (1.0 - dropout_p)
            out = torch.matmul(probs, vb)
        if grad_out is not None:
            for acc, g in zip(grads, torch.autograd.grad(out, (qb, kb, vb), g3[sl])):
                acc.append(g)
        else:
            outs.append(out)
            lses.append(lse)
    if grad_out is not None:
        return [torch.cat(g).view(*t.shape) for g, t in zip(grads, (q, k, v))]
    return torch.cat(outs).view(*lead, n_q, ev), torch.cat(lses).view(*lead, n_q)


def _in_layout_of(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """`t` laid out in memory like `ref` (same rank): nvFuser allocates
    attention's output like the query and each gradient like its input, so
    a [b, s, h, e]-ordered query gives a [b, s, h, e]-ordered output."""
    if not isinstance(ref, torch.Tensor) or ref.dim() != t.dim() or ref.is_contiguous():
        return t.contiguous()
    # outermost first; ties (extent-1 axes) keep their logical order
    order = sorted(range(ref.dim()), key=lambda d: (-ref.stride(d), d))
    inverse = [order.index(d) for d in range(ref.dim())]
    return t.permute(order).contiguous().permute(inverse)


class SdpaFwdOp(OpSpec):
    def __init__(self):
        super().__init__("sdpfa_fwd")

    def define(self, query, key, value, bias=None, mask=None, dropout_p=None, is_causal=None, scale=None):
        fusion = common.current_fusion(query, key, value)
        q = common.expect_tv(query, "sdpfa_fwd", "query")
        k = common.expect_tv(key, "sdpfa_fwd", "key")
        v = common.expect_tv(value, "sdpfa_fwd", "value")
        qi, ki, vi = (common.logical_shape(t) for t in (q, k, v))
        if not len(qi) == len(ki) == len(vi) or len(qi) < 4:
            raise NvShardError(f"sdpfa_fwd: query, key and value must have the same rank >= 4, got "
                               f"{len(qi)}, {len(ki)}, {len(vi)}")
        if not q.dtype() == k.dtype() == v.dtype():
            raise NvShardError(f"sdpfa_fwd: query, key and value dtypes differ: {q.dtype()}, {k.dtype()}, {v.dtype()}")
        n = len(qi)
        for j in range(n - 2):
            for t, ids in ((k, ki), (v, vi)):
                _same_extent(q, qi, t, ids, j, j, "batch and head")
        _same_extent(q, qi, k, ki, n - 1, n - 1, "head dim")
        _same_extent(k, ki, v, vi, n - 2, n - 2, "key length")
        inputs = [q, k, v]
        attrs = {"has_bias": bias is not None, "has_mask": mask is not None}
        for name, t, dtype in (("bias", bias, q.dtype()), ("mask", mask, DataType.Bool)):
            if t is None:
                continue
            t = common.expect_tv(t, "sdpfa_fwd", name)
            if len(common.logical_shape(t)) != len(qi):
                raise NvShardError(f"sdpfa_fwd: {name} {t.short_name()} must have rank {len(qi)}")
            if t.dtype() != dtype:
                raise NvShardError(f"sdpfa_fwd: {name} {t.short_name()} must be {dtype}, got {t.dtype()}")
            inputs.append(t)
        scalars = {}
        for name, val in (("dropout_p", dropout_p), ("is_causal", is_causal), ("scale", scale)):
            sv = _scalar_arg(fusion, val, name)
            scalars[name] = sv
            if sv is not None:
                inputs.append(sv)
        attrs["scalars"] = scalars
        # a broadcast batch axis of the query stays a broadcast axis, as in nvFuser
        out_ids = common.new_like_ids(fusion, qi[:-1]) + [fusion.new_id(vi[-1].extent())]
        lse_ids = common.new_like_ids(fusion, qi[:-1])
        out = fusion.new_tv(q.dtype(), out_ids)
        lse = fusion.new_tv(DataType.Float, lse_ids)
        seed = fusion.new_tv(DataType.UInt64, [fusion.new_id(Size(2))])
        offset = fusion.new_tv(DataType.UInt64, [])
        fusion.add_expr(self, inputs, [out, lse, seed, offset], attrs)
        return out, lse, seed, offset

    def rule(self, expr):
        rule = ShardingRule()
        q, k, v = expr.inputs[:3]
        qi, ki, vi = (common.logical_shape(t) for t in (q, k, v))
        batch = [rule.add_factor(f"b{j}", qi[j].extent()) for j in range(len(qi) - 2)]
        L = rule.add_factor("l", qi[-2].extent())
        S = rule.add_factor("s", ki[-2].extent(), FactorKind.REPLICATED)
        E = rule.add_factor("e", qi[-1].extent(), FactorKind.REPLICATED)
        Ev = rule.add_factor("ev", vi[-1].extent())
        rule.operands.append([(f,) for f in batch] + [(L,), (E,)])
        rule.operands.append([(f,) for f in batch] + [(S,), (E,)])
        rule.operands.append([(f,) for f in batch] + [(S,), (Ev,)])
        full = batch + [L, S]
        for t in expr.tv_inputs[3:]:
            ids = common.logical_shape(t)
            rule.operands.append([(f,) for f in full[:len(ids)]])
        seed_axis = rule.add_factor("seed", 2, FactorKind.REPLICATED)
        rule.results = [
            [(f,) for f in batch] + [(L,), (Ev,)],
            [(f,) for f in batch] + [(L,)],
            [(seed_axis,)],
            [],
        ]
        return rule

    def evaluate(self, expr, args, ctx):
        out_tv = expr.outputs[0]
        tensors = args[: len(expr.tv_inputs)]
        q, k, v = (common.upcast(t, DataType.Float).float() for t in tensors[:3])
        extra = iter(tensors[3:])
        bias = next(extra).float() if expr.attrs["has_bias"] else None
        mask = next(extra).bool() if expr.attrs["has_mask"] else None
        s = expr.attrs["scalars"]
        dropout_p = float(ctx.scalar(s["dropout_p"])) if s["dropout_p"] is not None else 0.0
        is_causal = bool(ctx.scalar(s["is_causal"])) if s["is_causal"] is not None else False
        scale = float(ctx.scalar(s["scale"])) if s["scale"] is not None else None
        seed = ctx.rng_seed(expr)
        rows = ctx.global_shape(0)[:-1]  # [*batch, L]
        localize = lambda t: ctx.localize(0, t, list(range(len(rows))) + [None])  # noqa: E731
        out, lse = _attention(q, k, v, bias, mask, dropout_p, is_causal, scale, seed, rows, localize)
        seed_t = torch.tensor([seed, 0], dtype=torch.uint64)
        offset_t = torch.tensor(0, dtype=torch.uint64)
        out = _in_layout_of(common.to_dtype(out, out_tv.dtype()), tensors[0])
        return [out, lse.float().contiguous(), seed_t, offset_t]

    def format(self, expr):
        # nvFuser's SdpaFwdOp::toString; it fills in dropout_p and is_causal when omitted.
        q, k, v = expr.inputs[:3]
        extra = iter(expr.tv_inputs[3:])
        outs = ",\n".join(str(o) for o in expr.outputs)
        text = f"{outs}\n   = sdpa({q},\n{_CONT}{k},\n{_CONT}{v},\n"
        if expr.attrs["has_bias"]:
            text += f"{_CONT}bias={next(extra)},\n"
        if expr.attrs["has_mask"]:
            text += f"{_CONT}mask={next(extra)},\n"
        s = expr.attrs["scalars"]
        dropout = s["dropout_p"] if s["dropout_p"] is not None else "double(0.0)"
        causal = s["is_causal"] if s["is_causal"] is not None else "false"
        text += f"{_CONT}dropout_p = {dropout},\n{_CONT}is_causal={causal},\n"
        if s["scale"] is not None:
            text += f"{_CONT}scale={s['scale']},\n"
        return text + "  )\n"


class SdpaBwdOp(OpSpec):
    def __init__(self):
        super().__init__("sdpfa_bwd")

    def define(self, grad_output, query, key, value, output, logsumexp, dropout_p, is_causal,
               philox_seed, philox_offset, scale):
        fusion = common.current_fusion(query, key, value)
        tvs = []
        for name, t in (("grad_output", grad_output), ("query", query), ("key", key), ("value", value),
                        ("output", output), ("logsumexp", logsumexp), ("philox_seed", philox_seed),
                        ("philox_offset", philox_offset)):
            tvs.append(common.expect_tv(t, "sdpfa_bwd", name))
        scalars = {}
        inputs = list(tvs)
        for name, val in (("dropout_p", dropout_p), ("is_causal", is_causal), ("scale", scale)):
            sv = _scalar_arg(fusion, val, name)
            scalars[name] = sv
            if sv is not None:
                inputs.append(sv)
        outs = [fusion.new_tv(t.dtype(), common.strip_reductions(fusion, t)) for t in tvs[1:4]]
        fusion.add_expr(self, inputs, outs, {"scalars": scalars})
        return tuple(outs)

    def rule(self, expr):
        rule = ShardingRule()
        grad_out, q, k, v, out, lse, seed, offset = expr.tv_inputs
        qi, ki, vi = (common.logical_shape(t) for t in (q, k, v))
        batch = [rule.add_factor(f"b{j}", qi[j].extent()) for j in range(len(qi) - 2)]
        L = rule.add_factor("l", qi[-2].extent(), FactorKind.REPLICATED)
        S = rule.add_factor("s", ki[-2].extent(), FactorKind.REPLICATED)
        E = rule.add_factor("e", qi[-1].extent(), FactorKind.REPLICATED)
        Ev = rule.add_factor("ev", vi[-1].extent(), FactorKind.REPLICATED)
        bq = [(f,) for f in batch]
        seed_axis = rule.add_factor("seed", 2, FactorKind.REPLICATED)
        rule.operands = [bq + [(L,), (Ev,)], bq + [(L,), (E,)], bq + [(S,), (E,)], bq + [(S,), (Ev,)],
                         bq + [(L,), (Ev,)], bq + [(L,)], [(seed_axis,)], []]
        rule.results = [bq + [(L,), (E,)], bq + [(S,), (E,)], bq + [(S,), (Ev,)]]
        return rule

    def evaluate(self, expr, args, ctx):
        grad_out, q, k, v, out, lse, seed_t, _ = args[:8]
        s = expr.attrs["scalars"]
        dropout_p = float(ctx.scalar(s["dropout_p"])) if s["dropout_p"] is not None else 0.0
        is_causal = bool(ctx.scalar(s["is_causal"])) if s["is_causal"] is not None else False
        scale = float(ctx.scalar(s["scale"])) if s["scale"] is not None else None
        seed = int(seed_t[0].item())
        rows = ctx.global_shape(0)[:-1]  # grad_q is [*batch, L, E]
        localize = lambda t: ctx.localize(0, t, list(range(len(rows))) + [None])  # noqa: E731
        grads = _attention(q.float(), k.float(), v.float(), None, None, dropout_p, is_causal, scale, seed, rows,
                           localize, grad_out=grad_out.float())
        return [_in_layout_of(common.to_dtype(g, t.dtype()), like)
                for g, t, like in zip(grads, expr.outputs, (q, k, v))]

    def format(self, expr):
        # nvFuser's SdpaBwdOp::toString
        grad, q, k, v, out, lse, seed, offset = expr.tv_inputs
        s = expr.attrs["scalars"]
        outs = ",\n".join(str(o) for o in expr.outputs)
        text = f"{outs}\n   = sdpa_bwd({grad},\n"
        text += "".join(f"{_CONT}{t},\n" for t in (q, k, v, out))
        dropout = s["dropout_p"] if s["dropout_p"] is not None else "double(0.0)"
        causal = s["is_causal"] if s["is_causal"] is not None else "false"
        text += (f"{_CONT}logsum_exp = {lse},\n{_CONT}dropout_p = {dropout},\n{_CONT}is_causal = {causal},\n"
                 f"{_CONT}philox_seed = {seed},\n{_CONT}philox_offset = {offset},\n")
        if s["scale"] is not None:
            text += f"  ,\n          scale = {s['scale']}"
        return text + "  )\n"


_CONT = " " * 12  # where nvFuser's multi-line tensor ops continue their operand lists


_sdpa_fwd = register(SdpaFwdOp())
frontend("sdpfa_fwd")(_sdpa_fwd.define)
_sdpa_bwd = register(SdpaBwdOp())
frontend("sdpfa_bwd")(_sdpa_bwd.define)
