"""Helpers shared by op definitions: argument checking, output construction,
the pointwise sharding rule and nvFuser-style printing."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..ir.dtypes import DataType, compute_dtype, promote
from ..ir.nodes import IterType, NvShardError, Scalar, TensorView, Val
from ..ir.sizes import Size, unify
from .registry import ShardingRule

_FUSION_STACK: list = []


def push_fusion(fusion) -> None:
    _FUSION_STACK.append(fusion)


def pop_fusion() -> None:
    _FUSION_STACK.pop()


def current_fusion(*args):
    for a in args:
        if isinstance(a, Val):
            return a.fusion
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, Val):
                    return b.fusion
    if not _FUSION_STACK:
        raise NvShardError("fd.ops must be called inside `with FusionDefinition() as fd:`")
    return _FUSION_STACK[-1]


def python_scalar_dtype(value) -> DataType:
    if isinstance(value, bool):
        return DataType.Bool
    if isinstance(value, int):
        return DataType.Int
    if isinstance(value, float):
        return DataType.Double
    raise NvShardError(f"unsupported scalar {value!r}")


def as_val(fusion, value) -> Val:
    """Wrap Python numbers as constant scalars."""
    if isinstance(value, Val):
        if value.fusion is not fusion:
            raise NvShardError(f"{value} belongs to another fusion")
        return value
    if isinstance(value, (bool, int, float)):
        return Scalar(fusion, python_scalar_dtype(value), value)
    raise NvShardError(f"expected a TensorView or a scalar, got {value!r}")


def expect_tv(value, op: str, arg: str) -> TensorView:
    if not isinstance(value, TensorView):
        raise NvShardError(f"{op}: argument '{arg}' must be a TensorView, got {value!r}")
    return value


def norm_axis(axis: int, rank: int, op: str, tv: Optional[TensorView] = None, what: str = "dim") -> int:
    if not isinstance(axis, int) or not -rank <= axis < rank:
        name = f" of {tv.short_name()}" if tv is not None else ""
        raise NvShardError(f"{op}: {what} {axis} is out of range for rank {rank}{name}")
    return axis % rank


def logical_shape(tv: TensorView) -> list:
    """Non-reduction logical ids: the axes a tensor actually has."""
    logical = tv.logical
    return [logical[i] for i in tv.non_reduction_axes()]


def new_like_ids(fusion, ids) -> list:
    return [fusion.new_id(i.extent(), i.iter_type, i.expanded) for i in ids]


def strip_reductions(fusion, tv: TensorView) -> list:
    return new_like_ids(fusion, logical_shape(tv))


# -- pointwise ---------------------------------------------------------------


def broadcast_output_ids(fusion, operands: Sequence[TensorView], op: str) -> list:
    """Output axes of a pointwise op, right-aligning operand ranks like nvFuser
    and unifying the extents that must be equal."""
    shapes = [logical_shape(t) for t in operands]
    rank = max(len(s) for s in shapes)
    ids = []
    for j in range(rank):
        concrete = []
        expanded = []
        for t, s in zip(operands, shapes):
            k = j - (rank - len(s))
            if k < 0:
                continue
            id_ = s[k]
            if id_.is_broadcast():
                if id_.expanded is not None:
                    expanded.append(id_.expanded)
            else:
                concrete.append((t, id_))
        if concrete:
            first = concrete[0][1].extent()
            for t, id_ in concrete[1:]:
                try:
                    unify(first, id_.extent())
                except ValueError:
                    raise NvShardError(
                        f"{op}: axis {j} of the result needs equal extents, but "
                        f"{concrete[0][0].short_name()} has {first} and {t.short_name()} has {id_.extent()}"
                    ) from None
            # nvFuser does not check an expanded extent against concrete ones
            ids.append(fusion.new_id(first))
        elif expanded:
            ids.append(fusion.new_id(Size(1), IterType.Broadcast, expanded[0]))
        else:
            ids.append(fusion.new_id(Size(1), IterType.Broadcast))
    return ids


def pointwise_rule(expr) -> ShardingRule:
    """Every result axis is a factor; operand axes map to it right-aligned
    (Expr.rule drops the factors of broadcast axes)."""
    rule = ShardingRule()
    out = expr.tv_outputs[0]
    out_ids = logical_shape(out)
    rank = len(out_ids)
    letters = "abcdefghijklmnopqrstuvw"
    factor_of = []
    for j in range(rank):  # (an index loop: compiled, the axis typed)
        id_ = out_ids[j]
        factor_of.append(rule.add_factor(letters[j % len(letters)], id_.extent()))
    for t in expr.tv_inputs:
        ids = logical_shape(t)
        rule.operands.append([(factor_of[k + rank - len(ids)],) for k in range(len(ids))])
    for o in expr.tv_outputs:
        rule.results.append([(f,) for f in factor_of])
    return rule


def identity_rule(expr) -> ShardingRule:
    """One operand, one result, same axes (reductions kept as they are;
    Expr.rule drops the factors of broadcast axes)."""
    rule = ShardingRule()
    factors = [(rule.add_factor(f"f{k}", id_.extent()),) for k, id_ in enumerate(logical_shape(expr.tv_inputs[0]))]
    rule.operands.append(factors)
    rule.results.append(list(factors))
    return rule


# -- evaluation helpers ------------------------------------------------------


def upcast(t, dtype: DataType):
    """Reduced-precision tensors compute in float, as nvFuser kernels do."""
    if isinstance(t, torch.Tensor):
        want = compute_dtype(dtype) if dtype.is_floating else None
        if want is not None and t.is_floating_point() and t.dtype != want and t.dtype != torch.float64:
            return t.to(want)
    return t


def collapse_broadcasts(expr, args: list) -> list:
    """Expanded broadcast axes back to extent 1, so operands broadcast in
    torch even where an expanded extent differs from the result's."""
    axes = expr.broadcast_axes
    if axes is None:  # fixed per expr; the executor asks every step
        axes = expr.broadcast_axes = [
            (i, d) for i, v in enumerate(expr.inputs) if isinstance(v, TensorView)
            for d, id_ in enumerate(logical_shape(v)) if id_.is_broadcast()]
    if not axes:
        return args
    out = list(args)
    for i, d in axes:
        a = out[i]
        if isinstance(a, torch.Tensor) and a.shape[d] != 1:
            out[i] = a.narrow(d, 0, 1)
    return out


def to_dtype(t, dtype: DataType):
    if isinstance(t, torch.Tensor) and t.dtype != dtype.torch_dtype:
        return t.to(dtype.torch_dtype)
    return t


def result_dtype(operands: Sequence, reduced_to_float: bool = False) -> DataType:
    """The operands' common dtype; see dtypes.promote for `reduced_to_float`."""
    tensors = [o.dtype() for o in operands if isinstance(o, TensorView)]
    scalars = [o.dtype() for o in operands if isinstance(o, Scalar)]
    return promote(tensors, scalars, reduced_to_float)


# -- printing ------------------------------------------------------------------


def fmt_call(expr, name: str, args: Sequence[str], extra: str = "") -> str:
    """`out\\n   = name( args, extra )` as nvFuser prints tensor ops."""
    outs = ",\n".join(str(o) for o in expr.outputs)
    inner = ", ".join(args)
    if extra:
        inner += ", " + extra
    return f"{outs}\n   = {name}( {inner} )\n"
