"""pad: widen axes by constant values before and after. `pad_widths` lists
(before, after) pairs from the LAST axis backwards, as torch's F.pad.

Rule: a padded axis needs the whole axis (REPLICATED), as a slice does; the
result axis is computed whole and each device keeps its block; other axes
pass through."""

from __future__ import annotations

import torch.nn.functional as F

from ..ir.nodes import NvShardError
from ..ir.sizes import Size
from . import common
from .registry import FactorKind, OpSpec, ShardingRule, frontend, register
from .shape import _runtime_sym


def _padded(arg, axis, extra):
    return lambda ctx: ctx.global_extent(arg, axis) + extra


class PadOp(OpSpec):
    def __init__(self):
        super().__init__("pad")

    def define(self, arg, pad_widths, value=None):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "pad", "arg")
        in_ids = common.logical_shape(arg)
        widths = list(pad_widths)
        if len(widths) % 2 or len(widths) // 2 > len(in_ids):
            raise NvShardError(f"pad: pad_widths {widths} must hold (before, after) pairs for at most "
                               f"{len(in_ids)} axes of {arg.short_name()}")
        if not all(isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in widths):
            raise NvShardError(f"pad: pad_widths must be non-negative ints, got {widths}")
        per_axis = [(0, 0)] * len(in_ids)
        for i in range(len(widths) // 2):
            per_axis[len(in_ids) - 1 - i] = (widths[2 * i], widths[2 * i + 1])
        value = common.as_val(fusion, 0.0 if value is None else value)
        ids = []
        for k, (id_, (lo, hi)) in enumerate(zip(in_ids, per_axis)):
            if lo or hi:
                if id_.is_broadcast():
                    raise NvShardError(f"pad: axis {k} of {arg.short_name()} is a broadcast axis")
                value_ = id_.extent().value
                extent = Size(value_ + lo + hi) if value_ is not None else _runtime_sym(fusion, _padded(arg, k, lo + hi))
                ids.append(fusion.new_id(extent))
            else:
                ids.append(fusion.new_id(id_.extent(), id_.iter_type, id_.expanded))
        out = fusion.new_tv(arg.dtype(), ids)
        fusion.add_expr(self, [arg, value], [out], {"widths": per_axis})
        return out

    def rule(self, expr):
        rule = ShardingRule()
        in_ids = common.logical_shape(expr.inputs[0])
        out_ids = common.logical_shape(expr.outputs[0])
        operand, result = [], []
        for k, (lo, hi) in enumerate(expr.attrs["widths"]):
            if not (lo or hi):
                f = rule.add_factor(f"a{k}", in_ids[k].extent())
                operand.append((f,))
                result.append((f,))
            else:
                operand.append((rule.add_factor(f"p{k}", in_ids[k].extent(), FactorKind.REPLICATED),))
                result.append((rule.add_factor(f"o{k}", out_ids[k].extent()),))
        rule.operands.append(operand)
        rule.results.append(result)
        return rule

    def evaluate(self, expr, args, ctx):
        flat = []
        for lo, hi in reversed(expr.attrs["widths"]):
            flat += [lo, hi]
        value = ctx.scalar(expr.inputs[1])
        return [common.to_dtype(F.pad(args[0], flat, value=float(value)), expr.outputs[0].dtype())]

    def format(self, expr):
        widths = ", ".join(f"{lo}, {hi}" for lo, hi in expr.attrs["widths"])
        return f"{expr.outputs[0]}\n   = pad( {expr.inputs[0]}, {{{widths}}} )\n"


_pad = register(PadOp())
frontend("pad")(_pad.define)
