"""uniform: random numbers drawn for the global shape from a seeded generator,
so any sharding sees the same values as the unsharded program. Every axis is
a result-only factor: shard it freely, each device keeps its block."""

from __future__ import annotations

import torch

from ..ir.dtypes import DataType
from ..ir.nodes import IterType, NvShardError
from ..ir.sizes import Size
from . import common
from .registry import OpSpec, ShardingRule, frontend, register
from .shape import _size_of


class UniformOp(OpSpec):
    def __init__(self):
        super().__init__("uniform")

    def define(self, minval, maxval, shape, *, rng_seed=None, rng_offset=None, dtype=DataType.Float):
        fusion = common.current_fusion(minval, maxval, list(shape), rng_seed, rng_offset)
        if not isinstance(dtype, DataType) or not dtype.is_floating:
            raise NvShardError(f"uniform: dtype must be a floating DataType, got {dtype!r}")
        lo, hi = common.as_val(fusion, minval), common.as_val(fusion, maxval)
        sizes = [_size_of(fusion, e, "uniform") for e in shape]
        ids = [fusion.new_id(Size(1), IterType.Broadcast) if s == 1 else fusion.new_id(s) for s in sizes]
        out = fusion.new_tv(dtype, ids)
        inputs = [lo, hi] + [e for e in shape if not isinstance(e, int)]
        seed = common.as_val(fusion, rng_seed) if rng_seed is not None else None
        offset = common.as_val(fusion, rng_offset) if rng_offset is not None else None
        inputs += [v for v in (seed, offset) if v is not None]
        fusion.add_expr(self, inputs, [out], {"seed": seed, "offset": offset})
        return out

    def rule(self, expr):
        rule = ShardingRule()
        ids = common.logical_shape(expr.outputs[0])
        rule.results.append([(rule.add_factor(f"u{i}", id_.extent()),) for i, id_ in enumerate(ids)])
        return rule

    def evaluate(self, expr, args, ctx):
        out = expr.outputs[0]
        lo, hi = ctx.scalar(expr.inputs[0]), ctx.scalar(expr.inputs[1])
        if expr.attrs["seed"] is not None:
            seed = int(ctx.scalar(expr.attrs["seed"])) * 1_000_003 + int(ctx.scalar(expr.attrs["offset"] or 0))
        else:
            seed = ctx.rng_seed(expr)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        values = torch.rand(ctx.out_shape(0), generator=gen, dtype=torch.float32)
        values = lo + (hi - lo) * values
        return [values.to(out.dtype().torch_dtype).to(ctx.device)]

    def format(self, expr):
        lo, hi = expr.inputs[:2]
        out = expr.outputs[0]
        shape = ", ".join(str(i.extent()) for i in out.logical)
        if expr.attrs["seed"] is None and lo.is_const() and hi.is_const() and (lo.value, hi.value) == (0, 1):
            return f"{out}\n   = rng_uniform({{{shape}}}, {out.dtype()});\n"  # nvFuser's RNGOp Uniform
        text = f"{out}\n   = rng_uniform_range({{{shape}}}, {lo}, {hi}, {out.dtype()}"
        if expr.attrs["seed"] is not None:
            text += f", {expr.attrs['seed']}"
        return text + ");\n"


_uniform = register(UniformOp())
frontend("uniform")(_uniform.define)
