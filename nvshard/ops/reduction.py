"""Reductions: sum and var_mean.

Their results keep the reduced axes as reduction axes (rS), as nvFuser does.
A summed axis is a SUM factor: sharding it leaves a partial sum on the
result's reduction axis. var_mean needs the whole normalized axis
(REPLICATED): partial variances do not add.
"""

from __future__ import annotations

import torch

from ..ir.dtypes import DataType
from ..ir.nodes import IterType, NvShardError
from . import common
from .registry import FactorKind, OpSpec, ShardingRule, frontend, register
from .shape import _broadcast


def _reduced_axes(arg, dims, op: str) -> list:
    rank = arg.ndim
    if dims is None:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    axes = sorted({common.norm_axis(d, rank, op, arg) for d in dims})
    return axes


def _reduction_ids(fusion, arg, axes):
    ids = []
    for k, id_ in enumerate(common.logical_shape(arg)):
        if k in axes:
            ids.append(fusion.new_id(id_.extent(), IterType.Reduction))
        else:
            ids.append(fusion.new_id(id_.extent(), id_.iter_type, id_.expanded))
    return ids


def _keepdim(tv, axes):
    """nvFuser's keepdim: a broadcast re-inserts the reduced axes."""
    return _broadcast.define_flags(tv, [k in axes for k in range(len(tv.logical))])


def _rule(expr, reduced_kind: FactorKind) -> ShardingRule:
    rule = ShardingRule()
    arg = expr.inputs[0]
    in_ids = common.logical_shape(arg)
    axes = expr.attrs["axes"]
    operand, result = [], []
    for k, id_ in enumerate(in_ids):
        if k in axes and id_.is_broadcast() and id_.expanded is None:
            # reduced, the size-1 broadcast becomes a reduction axis, which Expr.rule's guard keeps: no pending sum
            operand.append(())
            result.append(())
            continue
        extent = id_.expanded if id_.expanded is not None else id_.extent()  # reduced, the result keeps it
        kind = reduced_kind if k in axes else FactorKind.PASS
        f = rule.add_factor(("k" if k in axes else "a") + str(k), extent, kind)
        operand.append((f,))
        result.append((f,))
    rule.operands.append(operand)
    for _ in expr.tv_outputs:
        rule.results.append(list(result))
    return rule


class SumOp(OpSpec):
    def __init__(self):
        super().__init__("sum")

    def define(self, arg, dims=None, keepdim=False, dtype=DataType.Null, *, dim=None, keep_dim=None):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "sum", "arg")
        if dim is not None:
            dims = dim
        if keep_dim is not None:  # the spelling of older nvfuser_direct bindings
            keepdim = keep_dim
        if isinstance(dims, DataType):  # sum(arg, dtype) overload
            dims, dtype = None, dims
        if dtype is None:
            dtype = DataType.Null
        if dtype is DataType.Null and (arg.dtype() is DataType.Bool or arg.dtype().is_integral):
            dtype = DataType.Int
        if dtype is not DataType.Null and dtype != arg.dtype():
            from .pointwise import _cast

            arg = _cast.define(arg, dtype)
        axes = _reduced_axes(arg, dims, "sum")
        out = fusion.new_tv(arg.dtype(), _reduction_ids(fusion, arg, axes))
        fusion.add_expr(self, [arg], [out], {"axes": axes})
        return _keepdim(out, axes) if keepdim else out

    def rule(self, expr):
        return _rule(expr, FactorKind.SUM)

    def evaluate(self, expr, args, ctx):
        out = expr.outputs[0]
        x = common.upcast(args[0], out.dtype())
        axes = expr.attrs["axes"]
        result = x.sum(dim=axes) if axes else x.clone()
        return [common.to_dtype(result, out.dtype())]

    def format(self, expr):
        out, x = expr.outputs[0], expr.inputs[0]
        init = "0" if not out.dtype().is_floating else f"{out.dtype()}(0)"
        return f"{out}\n   = reduction( {x}, op = add, initial value = {init}, allreduce = false )\n"


class VarMeanOp(OpSpec):
    def __init__(self):
        super().__init__("var_mean")

    def define(self, arg, dims, correction=1, keepdim=False):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "var_mean", "arg")
        if arg.dtype().is_reduced_precision:
            raise NvShardError(f"var_mean is not supported for {arg.dtype()} ({arg.short_name()}); please upcast to float")
        if not isinstance(correction, int) or correction < 0:
            raise NvShardError(f"var_mean: correction must be a non-negative int, got {correction!r}")
        axes = _reduced_axes(arg, dims, "var_mean")
        dtype = arg.dtype() if arg.dtype().is_floating else DataType.Float
        var = fusion.new_tv(dtype, _reduction_ids(fusion, arg, axes))
        mean = fusion.new_tv(dtype, _reduction_ids(fusion, arg, axes))
        fusion.add_expr(self, [arg], [var, mean], {"axes": axes, "correction": correction})
        if keepdim:
            return _keepdim(var, axes), _keepdim(mean, axes)
        return var, mean

    def rule(self, expr):
        return _rule(expr, FactorKind.REPLICATED)

    def evaluate(self, expr, args, ctx):
        out = expr.outputs[0]
        x = common.upcast(args[0], out.dtype()).to(out.dtype().torch_dtype)
        var, mean = torch.var_mean(x, dim=expr.attrs["axes"], correction=expr.attrs["correction"])
        return [var, mean]

    def format(self, expr):
        var, mean = expr.outputs
        return (
            f"{var}(Var),\n{mean}(Avg)\n = Welford ( {expr.inputs[0]}(Avg), "
            f"correction = {expr.attrs['correction']}, allreduce = false )\n"
        )


_sum = register(SumOp())
frontend("sum")(_sum.define)
_var_mean = register(VarMeanOp())
frontend("var_mean")(_var_mean.define)
