"""select, index_select and gather (torch.gather, nvFuser's torchGather):
reading along one axis at positions given by a scalar or an index tensor.

Rules: the axis read from is REPLICATED on the input (any position may be
asked for); the index tensor's axes and the result's axes share factors;
the input's other axes pass through to the result where their extents are
the result's (gather allows a shorter index there: then they are
REPLICATED too)."""

from __future__ import annotations

import torch

from ..ir.nodes import IterType, NvShardError, Scalar
from . import common
from .registry import FactorKind, OpSpec, ShardingRule, frontend, register
from .shape import _broadcast


def _expect_index(index, op: str):
    index = common.expect_tv(index, op, "index")
    if not index.dtype().is_integral:
        raise NvShardError(f"{op}: index {index.short_name()} must have an integer dtype, got {index.dtype()}")
    return index


class SelectOp(OpSpec):
    def __init__(self):
        super().__init__("select")

    def define(self, arg, index, dim):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "select", "arg")
        dim = common.norm_axis(dim, arg.ndim, "select", arg)
        if isinstance(index, bool) or not isinstance(index, (int, Scalar)):
            raise NvShardError(f"select: index must be an int or an integer scalar, got {index!r}")
        index = common.as_val(fusion, index)
        ids = common.strip_reductions(fusion, arg)
        del ids[dim]
        out = fusion.new_tv(arg.dtype(), ids)
        fusion.add_expr(self, [arg, index], [out], {"dim": dim})
        return out

    def rule(self, expr):
        rule = ShardingRule()
        dim = expr.attrs["dim"]
        operand, result = [], []
        for k, id_ in enumerate(common.logical_shape(expr.inputs[0])):
            if k == dim:
                operand.append((rule.add_factor(f"s{k}", id_.extent(), FactorKind.REPLICATED),))
                continue
            f = rule.add_factor(f"a{k}", id_.expanded or id_.extent())
            operand.append((f,))
            result.append((f,))
        rule.operands.append(operand)
        rule.results.append(result)
        return rule

    def evaluate(self, expr, args, ctx):
        return [args[0].select(expr.attrs["dim"], int(ctx.scalar(expr.inputs[1])))]

    def format(self, expr):
        axis = common.logical_shape(expr.inputs[0])[expr.attrs["dim"]]
        return f"{expr.outputs[0]}\n   = select( {expr.inputs[0]}, axis = {axis}, index = {expr.inputs[1]} )\n"


class IndexSelectOp(OpSpec):
    """The index is 1-D, or already broadcast to the input's rank (every
    axis but `dim` a broadcast axis), as nvFuser stores it."""

    def __init__(self):
        super().__init__("index_select")

    def define(self, arg, index, dim):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "index_select", "arg")
        index = _expect_index(index, "index_select")
        rank = arg.ndim
        dim = common.norm_axis(dim, rank, "index_select", arg)
        if index.ndim == 1 and rank > 1:
            index = _broadcast.define_flags(index, [k != dim for k in range(rank)])
        index_ids = common.logical_shape(index)
        if len(index_ids) != rank or any(not i.is_broadcast() for k, i in enumerate(index_ids) if k != dim):
            raise NvShardError(f"index_select: index {index.short_name()} must be 1-D (or broadcast to rank {rank} "
                               f"on every axis but {dim})")
        ids = common.strip_reductions(fusion, arg)
        ids[dim] = fusion.new_id(index_ids[dim].extent())
        out = fusion.new_tv(arg.dtype(), ids)
        fusion.add_expr(self, [arg, index], [out], {"dim": dim})
        return out

    def rule(self, expr):
        rule = ShardingRule()
        dim = expr.attrs["dim"]
        arg_ids = common.logical_shape(expr.inputs[0])
        index_ids = common.logical_shape(expr.inputs[1])
        operand, index, result = [], [], []
        for k, id_ in enumerate(arg_ids):
            if k == dim:
                operand.append((rule.add_factor(f"s{k}", id_.extent(), FactorKind.REPLICATED),))
                f = rule.add_factor(f"n{k}", index_ids[k].extent())
                index.append((f,))
                result.append((f,))
                continue
            f = rule.add_factor(f"a{k}", id_.expanded or id_.extent())
            operand.append((f,))
            index.append(())
            result.append((f,))
        rule.operands += [operand, index]
        rule.results.append(result)
        return rule

    def evaluate(self, expr, args, ctx):
        return [torch.index_select(args[0], expr.attrs["dim"], args[1].reshape(-1))]

    def format(self, expr):
        arg, index = expr.inputs
        return f"{expr.outputs[0]}\n   = indexSelect( {arg}, dim = {expr.attrs['dim']}, {index} )\n"


class GatherOp(OpSpec):
    def __init__(self):
        super().__init__("gather")

    def define(self, arg1, index, dim):
        fusion = common.current_fusion(arg1)
        arg = common.expect_tv(arg1, "gather", "arg1")
        index = _expect_index(index, "gather")
        rank = arg.ndim
        dim = common.norm_axis(dim, rank, "gather", arg)
        if index.ndim != rank:
            raise NvShardError(f"gather: index {index.short_name()} has rank {index.ndim}, "
                               f"{arg.short_name()} has rank {rank}")
        ids = [fusion.new_id(i.extent(), IterType.GatherScatter) for i in common.logical_shape(index)]
        out = fusion.new_tv(arg.dtype(), ids)
        fusion.add_expr(self, [arg, index], [out], {"dim": dim})
        return out

    def rule(self, expr):
        rule = ShardingRule()
        dim = expr.attrs["dim"]
        arg_ids = common.logical_shape(expr.inputs[0])
        index_ids = common.logical_shape(expr.inputs[1])
        operand, index = [], []
        for k, (a, i) in enumerate(zip(arg_ids, index_ids)):
            f = rule.add_factor(f"n{k}", i.extent())
            index.append((f,))
            if k != dim and a.extent() == i.extent():
                operand.append((f,))
            else:  # the axis read from, or a longer input axis: any position may be asked for
                operand.append((rule.add_factor(f"s{k}", a.extent(), FactorKind.REPLICATED),))
        rule.operands += [operand, index]
        rule.results.append(list(index))
        return rule

    def evaluate(self, expr, args, ctx):
        return [torch.gather(args[0], expr.attrs["dim"], args[1])]

    def format(self, expr):
        arg, index = expr.inputs
        return f"{expr.outputs[0]}\n   = torchGather( {arg}, dim = {expr.attrs['dim']}, {index} )\n"


_select = register(SelectOp())
frontend("select")(_select.define)
_index_select = register(IndexSelectOp())
frontend("index_select")(_index_select.define)
_gather = register(GatherOp())
frontend("gather")(_gather.define)
