"""argsort and topk: along one axis, which each device needs whole
(REPLICATED); the other axes pass through. topk's k-long result axis names
no factor: it stays whole."""

from __future__ import annotations

import torch

from ..ir.dtypes import DataType
from ..ir.nodes import NvShardError, Scalar
from . import common
from .registry import FactorKind, OpSpec, ShardingRule, frontend, register
from .shape import _size_of


def _along_axis_rule(expr, k_axis_has_factor: bool) -> ShardingRule:
    rule = ShardingRule()
    dim = expr.attrs["dim"]
    operand, result = [], []
    for k, id_ in enumerate(common.logical_shape(expr.inputs[0])):
        if k == dim:
            operand.append((rule.add_factor(f"s{k}", id_.extent(), FactorKind.REPLICATED),))
            result.append(operand[-1] if k_axis_has_factor else ())
        else:
            f = rule.add_factor(f"a{k}", id_.extent())
            operand.append((f,))
            result.append((f,))
    rule.operands.append(operand)
    for _ in expr.tv_outputs:
        rule.results.append(list(result))
    return rule


class ArgsortOp(OpSpec):
    def __init__(self):
        super().__init__("argsort")

    def define(self, arg, dim, descending=False, stable=False):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "argsort", "arg")
        dim = common.norm_axis(dim, arg.ndim, "argsort", arg)
        out = fusion.new_tv(DataType.Int, common.strip_reductions(fusion, arg))
        fusion.add_expr(self, [arg], [out], {"dim": dim, "descending": bool(descending), "stable": bool(stable)})
        return out

    def rule(self, expr):
        return _along_axis_rule(expr, True)

    def evaluate(self, expr, args, ctx):
        a = expr.attrs
        return [torch.argsort(args[0], dim=a["dim"], descending=a["descending"], stable=a["stable"])]

    def format(self, expr):
        a = expr.attrs
        return (f"{expr.outputs[0]} = argsort( {expr.inputs[0]}, dim = {a['dim']}, "
                f"descending = {a['descending']}, stable = {a['stable']} )\n")


class TopkOp(OpSpec):
    def __init__(self):
        super().__init__("topk")

    def define(self, arg, k, dim=-1, largest=True, sorted=False):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "topk", "arg")
        dim = common.norm_axis(dim, arg.ndim, "topk", arg)
        if isinstance(k, int) and (isinstance(k, bool) or k < 0):
            raise NvShardError(f"topk: k must be a non-negative int, got {k!r}")
        k_size = _size_of(fusion, k, "topk")
        ids = common.strip_reductions(fusion, arg)
        extent = ids[dim].extent()
        if k_size.value is not None and extent.value is not None and k_size.value > extent.value:
            raise NvShardError(f"topk: k = {k_size.value} exceeds axis {dim} of {arg.short_name()} (extent {extent})")
        ids[dim] = fusion.new_id(k_size)
        values = fusion.new_tv(arg.dtype(), ids)
        index_ids = list(common.new_like_ids(fusion, ids))
        indices = fusion.new_tv(DataType.Int, index_ids)
        inputs = [arg] + ([k] if isinstance(k, Scalar) else [])
        fusion.add_expr(self, inputs, [values, indices],
                        {"dim": dim, "k": k, "largest": bool(largest), "sorted": bool(sorted)})
        return values, indices

    def rule(self, expr):
        return _along_axis_rule(expr, False)

    def evaluate(self, expr, args, ctx):
        a = expr.attrs
        values, indices = torch.topk(args[0], int(ctx.scalar(a["k"])), dim=a["dim"], largest=a["largest"],
                                     sorted=a["sorted"])
        return [values, indices]

    def format(self, expr):
        a = expr.attrs
        values, indices = expr.outputs
        return (f"( {values}, {indices} ) = topk( {expr.inputs[0]}, {a['k']}, dim = {a['dim']}, "
                f"largest = {a['largest']}, sorted = {a['sorted']} )\n")


_argsort = register(ArgsortOp())
frontend("argsort")(_argsort.define)
_topk = register(TopkOp())
frontend("topk")(_topk.define)
