"""select, index_select, gather (torch.gather, nvFuser's torchGather) and
scatter (torch.scatter): reading along one axis at positions given by a
scalar or an index tensor, and writing along one axis at positions given by
an index tensor.

Rules: the axis read from is REPLICATED on the input (any position may be
asked for); the index tensor's axes and the result's axes share factors;
the input's other axes pass through to the result where their extents are
the result's (gather allows a shorter index there: then they are
REPLICATED too). Scatter mirrors gather: the axis written to is REPLICATED
on the input, the index and the source, and the result keeps it whole;
the other axes pass through all four where the index covers the input
(nvFuser's "exact sizes"), else everything is REPLICATED."""

from __future__ import annotations

import torch

from ..ir.nodes import IterType, NvShardError, Scalar, TensorView
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
            f = rule.add_factor(f"a{k}", id_.extent())
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
            f = rule.add_factor(f"a{k}", id_.extent())
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


class ScatterOp(OpSpec):
    """nvFuser's ScatterOp without accumulation, as fd.ops.scatter(arg, index,
    src, dim) defines it (src a TensorView or a scalar): a copy of arg with
    src[..j..] written at position index[..j..] along dim. The result has
    arg's logical axes (GatherScatter iteration) and, as nvFuser 0.2.36 builds
    it, a loop domain of the index's axes: a new axis for dim, and for every
    axis when the index and arg differ in extent off dim; arg's axis otherwise."""

    def __init__(self):
        super().__init__("scatter")

    def define(self, arg, index, src, dim):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "scatter", "arg")
        index = _expect_index(index, "scatter")
        rank = arg.ndim
        dim = common.norm_axis(dim, rank, "scatter", arg)
        if index.ndim != rank:
            raise NvShardError(f"scatter: index {index.short_name()} has rank {index.ndim}, "
                               f"{arg.short_name()} has rank {rank}")
        if isinstance(src, TensorView):
            if src.ndim != rank:
                raise NvShardError(f"scatter: src {src.short_name()} has rank {src.ndim}, "
                                   f"{arg.short_name()} has rank {rank}")
            if src.dtype() != arg.dtype():
                raise NvShardError(f"scatter: src {src.short_name()} has dtype {src.dtype()}, "
                                   f"{arg.short_name()} has dtype {arg.dtype()}")
        elif isinstance(src, bool) or not isinstance(src, (int, float, Scalar)):
            raise NvShardError(f"scatter: src must be a TensorView or a scalar, got {src!r}")
        src = common.as_val(fusion, src)
        arg_ids, index_ids = common.logical_shape(arg), common.logical_shape(index)
        ids = [fusion.new_id(i.extent(), IterType.GatherScatter if i.iter_type is IterType.Iteration
                             else i.iter_type, i.expanded) for i in arg_ids]
        out = fusion.new_tv(arg.dtype(), ids)
        exact = _exact_sizes(arg_ids, index_ids, dim)
        loop = []
        for k, i in enumerate(index_ids):
            if k == dim or not exact:
                id_ = fusion.new_id(i.extent(), i.iter_type, i.expanded)
                id_.logical_axis, id_.owner = k, out
                loop.append(id_)
            else:
                loop.append(ids[k])
        out.loop = loop
        fusion.add_expr(self, [arg, index, src], [out], {"dim": dim, "exact": exact})
        return out

    def rule(self, expr):
        rule = ShardingRule()
        dim, exact = expr.attrs["dim"], expr.attrs["exact"]
        arg, index, src = expr.inputs
        arg_ids, index_ids = common.logical_shape(arg), common.logical_shape(index)
        src_ids = common.logical_shape(src) if isinstance(src, TensorView) else None
        operand, idx, source, result = [], [], [], []
        for k, (a, i) in enumerate(zip(arg_ids, index_ids)):
            s = src_ids[k] if src_ids is not None else None
            passes = (exact and k != dim and not a.is_broadcast() and not i.is_broadcast()
                      and (s is None or s.extent() == i.extent()))
            if passes:  # position j of this axis of index and src writes position j of arg's
                f = rule.add_factor(f"a{k}", i.extent())
                operand.append((f,))
                idx.append((f,))
                source.append((f,))
                result.append((f,))
                continue
            # written anywhere along the axis: every tensor keeps it whole
            shared = (rule.add_factor(f"s{k}", a.extent(), FactorKind.REPLICATED),)
            operand.append(shared)
            result.append(shared)
            idx.append((rule.add_factor(f"n{k}", i.extent(), FactorKind.REPLICATED),))
            if s is not None:
                source.append((rule.add_factor(f"u{k}", s.extent(), FactorKind.REPLICATED),))
        rule.operands += [operand, idx] + ([source] if src_ids is not None else [])
        rule.results.append(result)
        return rule

    def evaluate(self, expr, args, ctx):
        arg, index, src = args
        if isinstance(src, torch.Tensor):
            return [torch.scatter(arg, expr.attrs["dim"], index, src)]
        return [torch.scatter(arg, expr.attrs["dim"], index, value=src)]

    def format(self, expr):
        arg, index, src = expr.inputs
        return (f"{expr.outputs[0]}\n   = scatter(in = {arg}, dim = {expr.attrs['dim']}, src = {src}, "
                f"idx = {index} )\n")


def _exact_sizes(arg_ids, index_ids, dim) -> bool:
    """nvFuser's is_exact: the index covers arg on every axis but dim."""
    return all((a.expanded or a.extent()) == (i.expanded or i.extent())
               for k, (a, i) in enumerate(zip(arg_ids, index_ids)) if k != dim)


_select = register(SelectOp())
frontend("select")(_select.define)
_index_select = register(IndexSelectOp())
frontend("index_select")(_index_select.define)
_gather = register(GatherOp())
frontend("gather")(_gather.define)
_scatter = register(ScatterOp())
frontend("scatter")(_scatter.define)
