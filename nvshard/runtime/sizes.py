"""Concrete sizes: binds the fusion's symbolic extents and scalar inputs to
values, from the GLOBAL (unsharded) input shapes.

Under mpirun a rank outside an input's mesh holds none of it, so it cannot
read that input's symbolic extents; when some rank would be left so
(`needs_shape_exchange`, a question of the fusion and the world size alone,
so every rank answers it alike), the ranks exchange the global input shapes
they know before planning (`agree_on_global_shapes`), and every rank plans
with the same concrete sizes.
"""

from __future__ import annotations

from typing import Optional

from ..ir.nodes import NvShardError, Scalar, TensorView
from ..ir.sizes import Size, Sym


def needs_shape_exchange(fusion, world_size: int) -> bool:
    """Whether some rank of the world holds no input that binds one of the
    fusion's symbolic input extents."""
    covering: dict = {}  # symbol -> ranks holding an input that binds it
    for val in fusion.inputs():
        if not isinstance(val, TensorView):
            continue
        ranks = set(range(world_size)) if val.mesh is None else {r for r in range(world_size) if val.mesh.has(r)}
        for k in val.non_reduction_axes():
            id_ = val.logical[k]
            if id_.is_broadcast():
                continue
            c = id_.extent().canonical()
            if len(c.syms) == 1 and c.coef == 1:
                covering.setdefault(c.syms[0].find(), set()).update(ranks)
    return any(len(ranks) < world_size for ranks in covering.values())


def agree_on_global_shapes(fusion, shapes: list, all_gather) -> list:
    """Every rank's view of the global input shapes (None: input not on that
    rank), gathered with `all_gather(obj) -> [obj of rank 0, 1, ...]`, made
    one: each input takes the shape the ranks holding it report. Ranks that
    disagree raise the same NvShardError on every rank (after the exchange,
    so no rank is left waiting in a collective)."""
    views = all_gather([list(s) if isinstance(s, (list, tuple)) else s for s in shapes])
    agreed = []
    for k, val in enumerate(fusion.inputs()):
        if not isinstance(val, TensorView):
            agreed.append(shapes[k])
            continue
        reported = {r: view[k] for r, view in enumerate(views) if view[k] is not None}
        distinct = {tuple(s) for s in reported.values()}
        if len(distinct) > 1:
            by_shape: dict = {}
            for r, s in reported.items():
                by_shape.setdefault(tuple(s), []).append(r)
            first, second = sorted(by_shape)[:2]
            axis = next(a for a, (x, y) in enumerate(zip(first, second)) if x != y) if len(first) == len(second) else 0
            raise NvShardError(
                f"input {k} ({val.short_name()}): the ranks disagree on its global shape at axis {axis}: ranks "
                f"{by_shape[first]} give {list(first)}, ranks {by_shape[second]} give {list(second)}; every rank "
                f"of its mesh must pass its shard of the same tensor"
            )
        agreed.append(list(distinct.pop()) if distinct else None)
    return agreed


class SizeEvaluator:
    def __init__(self, fusion, global_shapes: list, scalar_values: Optional[dict] = None):
        """`global_shapes`: per fusion input, a shape for tensors and a value
        (or None) for scalars."""
        self.fusion = fusion
        self.bindings: dict = {}
        self.scalars: dict = dict(scalar_values or {})
        self._checks = []
        inputs = fusion.inputs()
        if len(global_shapes) != len(inputs):
            raise NvShardError(f"expected {len(inputs)} input shapes, got {len(global_shapes)}")
        for val, shape in zip(inputs, global_shapes):
            if isinstance(val, Scalar):
                if shape is not None:
                    self.scalars[val] = shape
                continue
            if shape is None:
                # Not on this rank: static extents are known, symbolic ones
                # must come from other inputs.
                continue
            ids = [val.logical[i] for i in val.non_reduction_axes()]
            for axis, (id_, extent) in enumerate(zip(ids, shape)):
                if id_.is_broadcast():
                    if extent != 1 and id_.expanded is None:
                        raise NvShardError(f"{val.short_name()}: axis {axis} is a broadcast axis and must have extent 1, got {extent}")
                    continue
                self._bind(id_.extent(), extent, val, axis)
        for size, extent, tv, axis in self._checks:
            got = self.evaluate_size(size)
            if got != extent:
                raise NvShardError(f"{tv.short_name()}: axis {axis} has extent {extent}, but the fusion requires {size} = {got}")
        # What only concrete sizes can check: a reshape's new shape, a squeezed symbolic axis.
        for expr in fusion.exprs:
            expr.op.check_sizes(expr, self)

    def _bind(self, size: Size, extent: int, tv: TensorView, axis: int) -> None:
        c = size.canonical()
        if not c.syms:
            if c.coef != extent:
                raise NvShardError(
                    f"{tv.short_name()}: axis {axis} has extent {extent}, but define_tensor declared {size}"
                )
            return
        if len(c.syms) == 1 and c.coef == 1:
            sym = c.syms[0]
            if sym in self.bindings and self.bindings[sym] != extent:
                raise NvShardError(
                    f"{tv.short_name()}: axis {axis} has extent {extent}, but {sym.name} = {self.bindings[sym]} "
                    f"from another input must be equal"
                )
            self.bindings[sym] = extent
            return
        self._checks.append((size, extent, tv, axis))

    # -- queries used by ops (through EvalContext) and the cost model -------------
    def evaluate_size(self, size: Size) -> int:
        c = Size.of(size).canonical()
        value = c.coef
        for s in c.syms:
            value *= self.sym_value(s)
        if value.denominator != 1:
            raise NvShardError(f"extent {size} is not a whole number ({value})")
        return int(value)

    def sym_value(self, sym: Sym) -> int:
        root = sym.find()
        if root in self.bindings:
            return self.bindings[root]
        definition = root.definition
        if isinstance(definition, Scalar):
            value = int(self.scalar(definition))
        elif callable(definition):
            value = int(definition(self))
        else:
            raise NvShardError(f"extent {root.name} is not bound by any input")
        self.bindings[root] = value
        return value

    def global_extent(self, tv: TensorView, axis: int) -> int:
        ids = [tv.logical[i] for i in tv.non_reduction_axes()]
        id_ = ids[axis]
        if id_.is_broadcast():
            return self.evaluate_size(id_.expanded) if id_.expanded is not None else 1
        return self.evaluate_size(id_.extent())

    def global_shape(self, tv: TensorView) -> list:
        return [self.global_extent(tv, a) for a in range(tv.ndim)]

    def scalar(self, value):
        if not isinstance(value, Scalar):
            return value
        if value.definition is None:
            if value.value is not None:
                return value.value
            if value not in self.scalars:
                raise NvShardError(f"scalar input {value} has no value")
            return self.scalars[value]
        if value in self.scalars:
            return self.scalars[value]
        expr = value.definition
        args = [self.scalar(a) if isinstance(a, Scalar) else a for a in expr.inputs]
        result = expr.op.evaluate(expr, args, self)[0]
        self.scalars[value] = result
        return result

    # SizeOp.evaluate calls ctx.evaluate_size; scalar arithmetic ignores ctx.
