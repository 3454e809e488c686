"""Contractions: linear, matmul, grouped_mm.

Results carry the contraction as a trailing reduction axis (rS), as nvFuser's
LinearOp and MatmulOp do; the contraction is a SUM factor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ir.dtypes import DataType
from ..ir.nodes import IterType, NvShardError
from ..ir.sizes import unify
from . import common
from .registry import FactorKind, OpSpec, ShardingRule, frontend, register


def _unify_k(a_id, b_id, op, a, b):
    try:
        unify(a_id.extent(), b_id.extent())
    except ValueError:
        raise NvShardError(
            f"{op}: contraction extents differ: {a.short_name()} has {a_id.extent()}, {b.short_name()} has {b_id.extent()}"
        ) from None


def _axes(fs):
    return [() if f is None else (f,) for f in fs]


def _compute(args, out_dtype: DataType):
    """Operands as the contraction takes them. When every floating operand
    already has the result's reduced-precision dtype they stay as they are:
    torch's bf16/fp16 matmuls accumulate in float and round once, as cuBLAS
    does for nvFuser, and upcasting would double the weights' memory."""
    tensors = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if out_dtype.is_reduced_precision and all(t.dtype == out_dtype.torch_dtype for t in tensors):
        return list(args)
    return [common.upcast(a, out_dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


# -- linear ------------------------------------------------------------------------


class LinearOp(OpSpec):
    chunkable = True

    def __init__(self):
        super().__init__("linear")

    def define(self, arg1, arg2, bias=None):
        """arg1 [*a, k]; arg2 (the weight) [k] or [*w, n, k]; bias right-aligned
        to [*w, n]. The result is [*w, *a, n, r{k}], as nvFuser's linear: the
        weight's leading axes come first."""
        fusion = common.current_fusion(arg1, arg2)
        a = common.expect_tv(arg1, "linear", "arg1")
        w = common.expect_tv(arg2, "linear", "arg2")
        a_ids, w_ids = common.logical_shape(a), common.logical_shape(w)
        if len(a_ids) < 1 or len(w_ids) < 1:
            raise NvShardError(
                f"linear: expects arg1 of rank >= 1 and a weight of rank >= 1; got {a.short_name()} rank "
                f"{len(a_ids)} and {w.short_name()} rank {len(w_ids)}"
            )
        _unify_k(a_ids[-1], w_ids[-1], "linear", a, w)
        ids = common.new_like_ids(fusion, w_ids[:-2]) + common.new_like_ids(fusion, a_ids[:-1])
        inputs = [a, w]
        if len(w_ids) >= 2:
            ids.append(fusion.new_id(w_ids[-2].extent()))
        if bias is not None:
            bias = common.expect_tv(bias, "linear", "bias")
            b_ids = common.logical_shape(bias)
            expected = w_ids[:-1]
            if len(w_ids) >= 2 and (len(b_ids) > len(expected) or not all(
                    b.is_broadcast() or _try_unify(b, e) for b, e in zip(b_ids[::-1], expected[::-1]))):
                shape = ", ".join(str(e.extent()) for e in expected)
                raise NvShardError(
                    f"linear: bias {bias.short_name()} must have shape [{shape}] or a suffix of it, got "
                    f"[{', '.join(str(b.extent()) for b in b_ids)}]"
                )
            inputs.append(bias)
        ids.append(fusion.new_id(a_ids[-1].extent(), IterType.Reduction))
        out = fusion.new_tv(a.dtype(), ids)
        fusion.add_expr(self, inputs, [out], {"has_bias": bias is not None})
        return out

    def rule(self, expr):
        rule = ShardingRule()
        a, w = expr.inputs[0], expr.inputs[1]
        a_ids, w_ids = common.logical_shape(a), common.logical_shape(w)
        batch = [rule.add_factor(f"b{i}", id_.extent()) for i, id_ in enumerate(a_ids[:-1])]
        w_batch = [rule.add_factor(f"w{i}", id_.extent()) for i, id_ in enumerate(w_ids[:-2])]
        k = rule.add_factor("k", a_ids[-1].extent(), FactorKind.SUM)
        n = rule.add_factor("n", w_ids[-2].extent()) if len(w_ids) >= 2 else None
        rule.operands.append(_axes(batch) + [(k,)])
        rule.operands.append(_axes(w_batch) + ([(n,)] if n is not None else []) + [(k,)])
        result = _axes(w_batch) + _axes(batch) + ([(n,)] if n is not None else []) + [(k,)]
        if expr.attrs["has_bias"]:
            b_ids = common.logical_shape(expr.inputs[2])
            if n is None:
                rule.operands.append([() for _ in b_ids])
            else:
                targets = (w_batch + [n])[len(w_batch) + 1 - len(b_ids):]
                rule.operands.append(_axes(targets))
        rule.results.append(result)
        return rule

    def evaluate(self, expr, args, ctx):
        out = expr.outputs[0]
        a, w = _compute(args[:2], out.dtype())
        bias = None
        # A partial product must add the bias once: on the first device of
        # each group that later sums the partials.
        if expr.attrs["has_bias"] and ctx.adds_unreduced_terms():
            bias = _compute([args[2]], out.dtype())[0].to(a.dtype)
        w = w.to(a.dtype)
        if a.dim() == 2 and w.dim() == 2 and bias is None:
            # allocate the result, then multiply into it (aten::mm with its
            # output), as nvFuser's host IR allocates and then runs linear
            result = torch.empty(a.shape[0], w.shape[0], dtype=a.dtype, device=a.device)
            torch.mm(a, w.t(), out=result)
        elif w.dim() <= 2:
            result = F.linear(a, w, bias)
        else:
            # [*w, n, k]: one linear with the weight's leading axes folded into
            # n, then those axes moved to the front.
            w_batch, n = list(w.shape[:-2]), w.shape[-2]
            if bias is not None:
                bias = bias.expand(*w_batch, n).reshape(-1)
            result = F.linear(a, w.reshape(-1, w.shape[-1]), bias)
            result = result.view(*a.shape[:-1], *w_batch, n)
            nb, na = len(w_batch), a.dim() - 1
            result = result.permute(*range(na, na + nb), *range(na), na + nb)
        return [common.to_dtype(result, out.dtype())]

    def format(self, expr):
        # nvFuser's LinearOp::toString, stray indents included
        ins = expr.inputs
        text = f"{expr.outputs[0]}\n   = linear({ins[0]},\n            {ins[1]}"
        if expr.attrs["has_bias"]:
            text += f"  ,\n          {ins[2]}"
        return text + "  )\n"

    def legacy_reference_order(self, expr):
        # nvFuser: weight, then bias, then input
        return [1, 2, 0] if expr.attrs["has_bias"] else [1, 0]


def _try_unify(a_id, b_id) -> bool:
    try:
        unify(a_id.extent(), b_id.extent())
        return True
    except ValueError:
        return False


# -- matmul ---------------------------------------------------------------------------


class MatmulOp(OpSpec):
    chunkable = True
    """torch.matmul semantics, batch axes broadcast right-aligned."""

    def __init__(self):
        super().__init__("matmul")

    def define(self, arg1, arg2):
        fusion = common.current_fusion(arg1, arg2)
        a = common.expect_tv(arg1, "matmul", "arg1")
        b = common.expect_tv(arg2, "matmul", "arg2")
        a_ids, b_ids = common.logical_shape(a), common.logical_shape(b)
        if not a_ids or not b_ids:
            raise NvShardError("matmul: operands must have rank >= 1")
        a_k = a_ids[-1]
        b_k = b_ids[-2] if len(b_ids) >= 2 else b_ids[0]
        _unify_k(a_k, b_k, "matmul", a, b)
        a_batch = a_ids[:-2] if len(a_ids) >= 2 else []
        b_batch = b_ids[:-2] if len(b_ids) >= 2 else []
        rank = max(len(a_batch), len(b_batch))
        ids = []
        for j in range(rank):
            cands = []
            for batch in (a_batch, b_batch):
                k = j - (rank - len(batch))
                if k >= 0:
                    cands.append(batch[k])
            concrete = [c for c in cands if not c.is_broadcast()]
            if concrete:
                for c in concrete[1:]:
                    if not _try_unify(concrete[0], c):
                        raise NvShardError(
                            f"matmul: batch axis {j} differs: {concrete[0].extent()} vs {c.extent()} "
                            f"({a.short_name()}, {b.short_name()})"
                        )
                ids.append(fusion.new_id(concrete[0].extent()))
            else:
                ids.append(fusion.new_id(cands[0].extent(), IterType.Broadcast, cands[0].expanded))
        if len(a_ids) >= 2:
            ids.append(fusion.new_id(a_ids[-2].extent()))
        if len(b_ids) >= 2:
            ids.append(fusion.new_id(b_ids[-1].extent()))
        ids.append(fusion.new_id(a_k.extent(), IterType.Reduction))
        out = fusion.new_tv(a.dtype(), ids)
        fusion.add_expr(self, [a, b], [out])
        return out

    def rule(self, expr):
        rule = ShardingRule()
        a, b = expr.inputs
        out = expr.outputs[0]
        a_ids, b_ids = common.logical_shape(a), common.logical_shape(b)
        out_ids = common.logical_shape(out)
        rank = len(out_ids) - (len(a_ids) >= 2) - (len(b_ids) >= 2)
        batch = [rule.add_factor(f"b{j}", out_ids[j].extent()) for j in range(rank)]
        k = rule.add_factor("k", a_ids[-1].extent(), FactorKind.SUM)
        m = rule.add_factor("m", a_ids[-2].extent()) if len(a_ids) >= 2 else None
        n = rule.add_factor("n", b_ids[-1].extent()) if len(b_ids) >= 2 else None

        def batch_axes(ids):
            return _axes(batch[rank - len(ids):])

        if len(a_ids) >= 2:
            rule.operands.append(batch_axes(a_ids[:-2]) + [(m,), (k,)])
        else:
            rule.operands.append([(k,)])
        if len(b_ids) >= 2:
            rule.operands.append(batch_axes(b_ids[:-2]) + [(k,), (n,)])
        else:
            rule.operands.append([(k,)])
        result = _axes(batch)
        if m is not None:
            result.append((m,))
        if n is not None:
            result.append((n,))
        result.append((k,))
        rule.results.append(result)
        return rule

    def evaluate(self, expr, args, ctx):
        out = expr.outputs[0]
        a, b = _compute(args, out.dtype())
        return [common.to_dtype(torch.matmul(a, b.to(a.dtype)), out.dtype())]

    def format(self, expr):
        a, b = expr.inputs
        return f"{expr.outputs[0]}\n   = matmul({a},\n            {b})\n"

    def legacy_reference_order(self, expr):
        return [1, 0]  # nvFuser: the second operand first


# -- grouped_mm ----------------------------------------------------------------------------


class GroupedMmOp(OpSpec):
    """out[rows of group g] = mat1[rows of group g] @ mat2[g]; `offsets` are the
    cumulative row counts. Rows and groups must stay whole on each device."""

    def __init__(self):
        super().__init__("grouped_mm")

    def define(self, mat1, mat2, offsets):
        fusion = common.current_fusion(mat1, mat2, offsets)
        a = common.expect_tv(mat1, "grouped_mm", "mat1")
        b = common.expect_tv(mat2, "grouped_mm", "mat2")
        off = common.expect_tv(offsets, "grouped_mm", "offsets")
        a_ids, b_ids, o_ids = (common.logical_shape(t) for t in (a, b, off))
        if len(a_ids) != 2 or len(b_ids) != 3 or len(o_ids) != 1:
            raise NvShardError(
                f"grouped_mm: supports mat1 [m, k], mat2 [g, k, n], offsets [g]; got ranks "
                f"{len(a_ids)}, {len(b_ids)}, {len(o_ids)}"
            )
        _unify_k(a_ids[1], b_ids[1], "grouped_mm", a, b)
        if not _try_unify(b_ids[0], o_ids[0]):
            raise NvShardError(f"grouped_mm: mat2 has {b_ids[0].extent()} groups but offsets has {o_ids[0].extent()}")
        ids = [fusion.new_id(a_ids[0].extent()), fusion.new_id(b_ids[2].extent()),
               fusion.new_id(a_ids[1].extent(), IterType.Reduction)]
        out = fusion.new_tv(a.dtype(), ids)
        fusion.add_expr(self, [a, b, off], [out])
        return out

    def rule(self, expr):
        rule = ShardingRule()
        a, b, off = expr.inputs
        a_ids, b_ids = common.logical_shape(a), common.logical_shape(b)
        m = rule.add_factor("m", a_ids[0].extent(), FactorKind.REPLICATED)
        k = rule.add_factor("k", a_ids[1].extent(), FactorKind.SUM)
        g = rule.add_factor("g", b_ids[0].extent(), FactorKind.REPLICATED)
        n = rule.add_factor("n", b_ids[2].extent())
        rule.operands = [[(m,), (k,)], [(g,), (k,), (n,)], [(g,)]]
        rule.results = [[(m,), (n,), (k,)]]
        return rule

    def evaluate(self, expr, args, ctx):
        out = expr.outputs[0]
        a, b = _compute(args[:2], out.dtype())
        offsets = args[2].tolist()
        pieces, start = [], 0
        for g, end in enumerate(offsets):
            pieces.append(a[start:end] @ b[g].to(a.dtype))
            start = end
        result = torch.cat(pieces, dim=0) if pieces else a.new_zeros((0, b.shape[2]))
        return [common.to_dtype(result, out.dtype())]

    def format(self, expr):
        a, b, off = expr.inputs
        return f"{expr.outputs[0]}\n   = grouped_mm({a},\n            {b},\n            {off})\n"


_linear = register(LinearOp())
frontend("linear")(_linear.define)
_matmul = register(MatmulOp())
frontend("matmul")(_matmul.define)
_grouped_mm = register(GroupedMmOp())
frontend("grouped_mm")(_grouped_mm.define)
