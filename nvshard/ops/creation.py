"""full and iota: tensors made from scalars. Every axis is a result-only
factor (as uniform's): shard it freely, each device keeps its block."""

from __future__ import annotations

import torch

from ..ir.dtypes import DataType
from ..ir.nodes import IterType, NvShardError, Scalar
from ..ir.sizes import Size
from . import common
from .registry import OpSpec, ShardingRule, frontend, register
from .shape import _size_of


def _result_only_rule(expr) -> ShardingRule:
    rule = ShardingRule()
    ids = common.logical_shape(expr.outputs[0])
    rule.results.append([(rule.add_factor(f"u{i}", id_.extent()),) for i, id_ in enumerate(ids)])
    return rule


class FullOp(OpSpec):
    def __init__(self):
        super().__init__("full")

    def define(self, shape, fill_value, dtype=DataType.Float):
        fusion = common.current_fusion(list(shape), fill_value)
        if not isinstance(dtype, DataType) or dtype is DataType.Null:
            raise NvShardError(f"full: dtype must be a DataType, got {dtype!r}")
        value = common.as_val(fusion, fill_value)
        sizes = [_size_of(fusion, e, "full") for e in shape]
        ids = [fusion.new_id(Size(1), IterType.Broadcast) if s == 1 else fusion.new_id(s) for s in sizes]
        out = fusion.new_tv(dtype, ids)
        fusion.add_expr(self, [value] + [e for e in shape if isinstance(e, Scalar)], [out])
        return out

    def rule(self, expr):
        return _result_only_rule(expr)

    def evaluate(self, expr, args, ctx):
        out = expr.outputs[0]
        return [torch.full(ctx.out_shape(0), ctx.scalar(expr.inputs[0]), dtype=out.dtype().torch_dtype,
                           device=ctx.device)]

    def format(self, expr):
        out = expr.outputs[0]
        shape = ", ".join(str(i.extent()) for i in out.logical)
        return f"{out}\n   = full({{{shape}}}, {expr.inputs[0]});\n"


class IotaOp(OpSpec):
    def __init__(self):
        super().__init__("iota")

    def define(self, length, start=None, step=None, dtype=DataType.Int):
        fusion = common.current_fusion(length, start, step)
        if not isinstance(dtype, DataType) or dtype in (DataType.Null, DataType.Bool):
            raise NvShardError(f"iota: dtype must be a numeric DataType, got {dtype!r}")
        zero, one = (0.0, 1.0) if dtype.is_floating else (0, 1)
        start = common.as_val(fusion, zero if start is None else start)
        step = common.as_val(fusion, one if step is None else step)
        extent = _size_of(fusion, length, "iota")
        out = fusion.new_tv(dtype, [fusion.new_id(extent)])
        inputs = [v for v in (length, start, step) if isinstance(v, Scalar)]
        fusion.add_expr(self, inputs, [out], {"start": start, "step": step, "length": length})
        return out

    def rule(self, expr):
        return _result_only_rule(expr)

    def evaluate(self, expr, args, ctx):
        out = expr.outputs[0]
        n = ctx.out_shape(0)[0]
        start, step = ctx.scalar(expr.attrs["start"]), ctx.scalar(expr.attrs["step"])
        values = start + step * torch.arange(n, dtype=torch.float64 if out.dtype().is_floating else torch.int64)
        return [values.to(out.dtype().torch_dtype).to(ctx.device)]

    def format(self, expr):
        out, a = expr.outputs[0], expr.attrs
        return f"{out}\n   = iota({a['length']}, {a['start']}, {a['step']}, {out.dtype()});\n"


_full = register(FullOp())
frontend("full")(_full.define)
_iota = register(IotaOp())
frontend("iota")(_iota.define)
