"""expand: broadcast axes take a (possibly symbolic) extent without copying
data; every other axis must keep its extent (-1 means "keep it").

Rule: non-broadcast axes pass through; broadcast axes, expanded or not,
name no factor (nvFuser never shards a broadcast axis).
"""

from __future__ import annotations

from ..ir.nodes import IterType, NvShardError
from ..ir.sizes import Size, unify
from . import common
from .registry import OpSpec, ShardingRule, frontend, register
from .shape import _shape_operands, _size_of


class ExpandOp(OpSpec):
    def __init__(self):
        super().__init__("expand")

    def define(self, arg, shape):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "expand", "arg")
        in_ids = common.logical_shape(arg)
        shape = list(shape)
        if len(shape) != len(in_ids):
            raise NvShardError(f"expand: shape has {len(shape)} entries but {arg.short_name()} has {len(in_ids)} axes")
        ids = []
        for k, (id_, entry) in enumerate(zip(in_ids, shape)):
            if isinstance(entry, int) and not isinstance(entry, bool) and entry == -1:
                ids.append(fusion.new_id(id_.extent(), id_.iter_type, id_.expanded))
                continue
            target = _size_of(fusion, entry, "expand")
            if id_.is_broadcast():
                if target == 1:
                    ids.append(fusion.new_id(Size(1), IterType.Broadcast, id_.expanded))
                else:
                    ids.append(fusion.new_id(Size(1), IterType.Broadcast, target))
                continue
            try:
                unify(id_.extent(), target)
            except ValueError:
                raise NvShardError(
                    f"expand: axis {k} of {arg.short_name()} has extent {id_.extent()} and is not a broadcast axis, "
                    f"but shape[{k}] is {target}"
                ) from None
            ids.append(fusion.new_id(id_.extent()))
        out = fusion.new_tv(arg.dtype(), ids)
        fusion.add_expr(self, [arg] + _shape_operands(shape), [out])
        return out

    def rule(self, expr):
        rule = ShardingRule()
        axes = [(rule.add_factor(f"a{k}", id_.extent()),) for k, id_ in enumerate(common.logical_shape(expr.inputs[0]))]
        rule.operands.append(axes)
        rule.results.append(list(axes))
        return rule

    def evaluate(self, expr, args, ctx):
        return [args[0].expand(ctx.out_shape(0))]

    def format(self, expr):
        return f"{expr.outputs[0]} = expand( {expr.inputs[0]} )\n"


_expand = register(ExpandOp())
frontend("expand")(_expand.define)
