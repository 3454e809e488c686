"""welford: the running mean, the sum of squared deviations (M2, nvFuser's
"Var" output) and the element count over the reduced axes, as nvFuser
lowers var_mean. M2 / (count - correction) is the variance.

Rule: the reduced axes are REPLICATED (partial M2s do not simply add);
the others pass through to all three results.
"""

from __future__ import annotations

import torch

from ..ir.dtypes import DataType
from ..ir.nodes import NvShardError
from . import common
from .reduction import _reduced_axes, _reduction_ids, _rule
from .registry import FactorKind, OpSpec, frontend, register


class WelfordOp(OpSpec):
    def __init__(self):
        super().__init__("welford")

    def define(self, arg, dims):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "welford", "arg")
        if not arg.dtype().is_floating:
            raise NvShardError(f"welford: {arg.short_name()} has dtype {arg.dtype()}; expected a floating dtype")
        if arg.dtype().is_reduced_precision:
            raise NvShardError(f"welford is not supported for {arg.dtype()} ({arg.short_name()}); please upcast to float")
        axes = _reduced_axes(arg, dims, "welford")
        avg = fusion.new_tv(arg.dtype(), _reduction_ids(fusion, arg, axes))
        m2 = fusion.new_tv(arg.dtype(), _reduction_ids(fusion, arg, axes))
        count = fusion.new_tv(DataType.Index, _reduction_ids(fusion, arg, axes))
        fusion.add_expr(self, [arg], [avg, m2, count], {"axes": axes})
        return avg, m2, count

    def rule(self, expr):
        return _rule(expr, FactorKind.REPLICATED)

    def evaluate(self, expr, args, ctx):
        avg_tv = expr.outputs[0]
        x = common.upcast(args[0], avg_tv.dtype()).to(avg_tv.dtype().torch_dtype)
        axes = expr.attrs["axes"]
        mean = x.mean(dim=axes)
        m2 = (x - x.mean(dim=axes, keepdim=True)).square().sum(dim=axes)
        n = 1
        for a in axes:
            n *= x.shape[a]
        count = torch.full(mean.shape, n, dtype=torch.int64, device=mean.device)
        return [mean, m2, count]

    def format(self, expr):
        avg, m2, count = expr.outputs
        return (f"{avg}(Avg),\n{m2}(Var),\n{count}(Count)\n = Welford ( {expr.inputs[0]}(Avg), \n"
                f"  allreduce = false )\n")


_welford = register(WelfordOp())
frontend("welford")(_welford.define)
