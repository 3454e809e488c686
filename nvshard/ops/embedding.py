"""embedding_fwd: rows of a weight table picked by an integer tensor
(torch.nn.functional.embedding).

Rule: the indices' axes pass through to the result's leading axes; the
embedding dimension passes from the weight to the result's last axis; the
table's rows are REPLICATED (any row may be picked)."""

from __future__ import annotations

import torch.nn.functional as F

from ..ir.nodes import NvShardError
from . import common
from .registry import FactorKind, OpSpec, ShardingRule, frontend, register

_PAD = " " * 12


class EmbeddingFwdOp(OpSpec):
    def __init__(self):
        super().__init__("embedding_fwd")

    def define(self, input, weight, padding_idx=None, max_norm=None, norm_type=None, scale_grad_by_freq=None,
               sparse=None):
        fusion = common.current_fusion(input, weight)
        indices = common.expect_tv(input, "embedding_fwd", "input")
        weight = common.expect_tv(weight, "embedding_fwd", "weight")
        if not indices.dtype().is_integral:
            raise NvShardError(f"embedding_fwd: input {indices.short_name()} must have an integer dtype, "
                               f"got {indices.dtype()}")
        if weight.ndim != 2:
            raise NvShardError(f"embedding_fwd: weight {weight.short_name()} must be 2-D, got rank {weight.ndim}")
        defaults = {"norm_type": 2.0, "scale_grad_by_freq": False, "sparse": False}  # torch's
        given = {"padding_idx": padding_idx, "max_norm": max_norm, "norm_type": norm_type,
                 "scale_grad_by_freq": scale_grad_by_freq, "sparse": sparse}
        scalars = {}
        for name, value in given.items():
            value = defaults.get(name) if value is None else value
            scalars[name] = None if value is None else common.as_val(fusion, value)
        ids = common.strip_reductions(fusion, indices) + [fusion.new_id(common.logical_shape(weight)[1].extent())]
        out = fusion.new_tv(weight.dtype(), ids)
        fusion.add_expr(self, [indices, weight] + [v for v in scalars.values() if v is not None], [out],
                        {"scalars": scalars})
        return out

    def rule(self, expr):
        rule = ShardingRule()
        indices, weight = expr.inputs[:2]
        axes = [(rule.add_factor(f"a{k}", id_.extent()),) for k, id_ in enumerate(common.logical_shape(indices))]
        rows, dim = common.logical_shape(weight)
        r = rule.add_factor("v", rows.extent(), FactorKind.REPLICATED)
        e = rule.add_factor("e", dim.extent())
        rule.operands += [axes, [(r,), (e,)]]
        rule.results.append(axes + [(e,)])
        return rule

    def evaluate(self, expr, args, ctx):
        s = {k: (ctx.scalar(v) if v is not None else None) for k, v in expr.attrs["scalars"].items()}
        weight = args[1] if s["max_norm"] is None else args[1].clone()  # max_norm renormalizes the table in place
        out = F.embedding(args[0], weight, s["padding_idx"], s["max_norm"], s["norm_type"],
                          bool(s["scale_grad_by_freq"]), bool(s["sparse"]))
        return [common.to_dtype(out, expr.outputs[0].dtype())]

    def format(self, expr):
        s = expr.attrs["scalars"]
        text = f"{expr.outputs[0]},\n   = embedding({expr.inputs[0]},\n{_PAD}{expr.inputs[1]},\n"
        for name in ("padding_idx", "max_norm"):
            if s[name] is not None:
                text += f"{_PAD}{name} = {s[name]},\n"
        text += f"{_PAD}norm_type = {s['norm_type']},\n{_PAD}scale_grad_by_freq = {s['scale_grad_by_freq']},\n"
        return text + f"{_PAD}sparse = {s['sparse']})\n"


_embedding_fwd = register(EmbeddingFwdOp())
frontend("embedding_fwd")(_embedding_fwd.define)
