"""Concrete sizes: binds the fusion's symbolic extents and scalar inputs to
values, from the GLOBAL (unsharded) input shapes. The planner (concrete
plans), ops (checks that need sizes) and the executor ask it."""

from __future__ import annotations

from fractions import Fraction
from typing import Optional

from ..errors import NvShardError
from .identity import identity
from .nodes import Scalar, TensorView
from .sizes import Size, Sym


class SizeEvaluator:
    def __init__(self, fusion, global_shapes: list, scalar_values: Optional[dict] = None):
        """`global_shapes`: per fusion input, a shape for tensors and a value
        (or None) for scalars."""
        self.fusion = fusion
        self.bindings: dict = {}
        self.scalars: dict = dict(scalar_values or {})
        self._checks = []
        self._evaluated: dict = {}  # id(Size) -> (Size, value)
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
        for expr in fusion.kept("exprs that check sizes", _checking_sizes, fusion):
            expr.op.check_sizes(expr, self)

    def _bind(self, size: Size, extent: int, tv: TensorView, axis: int) -> None:
        c = size.canonical()
        coef = c.key()[0]  # (the coefficient, an int when whole: compared in C, a Fraction's == is Python)
        if not c.syms:
            if coef != extent:
                raise NvShardError(
                    f"{tv.short_name()}: axis {axis} has extent {extent}, but define_tensor declared {size}"
                )
            return
        if len(c.syms) == 1 and coef == 1:
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
        # Every cost and reshard plan asks for extents: remembered per Size
        # object (the entry keeps it alive, so its id is not reused).
        known = self._evaluated.get(identity(size))
        if known is not None:
            return known[1]
        of = Size.of(size)
        c = of.canonical()
        # coef * prod(symbols) in ints (Fraction arithmetic is pure Python);
        # key() holds a whole coefficient as an int, read without Fraction's
        # numerator and denominator (Python-level properties)
        coef = of.key()[0]
        if type(coef) is int:
            numerator, denominator = coef, 1
        else:
            numerator, denominator = coef.numerator, coef.denominator
        for s in c.syms:
            numerator *= self.sym_value(s)
        if numerator % denominator:
            raise NvShardError(f"extent {size} is not a whole number ({Fraction(numerator, denominator)})")
        value = int(numerator // denominator)  # (an input's extent may be a numpy int)
        self._evaluated[identity(size)] = (size, value)
        return value

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
        return self._axis_extent(tv.logical[tv.non_reduction_axes()[axis]])

    def global_shape(self, tv: TensorView) -> list:
        logical = tv.logical
        return [self._axis_extent(logical[i]) for i in tv.non_reduction_axes()]

    def _axis_extent(self, id_) -> int:
        if id_.is_broadcast():
            return self.evaluate_size(id_.expanded) if id_.expanded is not None else 1
        return self.evaluate_size(id_.extent())

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


def _checking_sizes(fusion) -> list:
    """The fusion's exprs whose op checks concrete sizes (OpSpec.checks_sizes;
    most check nothing)."""
    return [e for e in fusion.exprs if e.op.checks_sizes]
