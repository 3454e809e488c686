"""How an expr computes, given the shardings of its results.

As in nvFuser, a result's sharding decides the computation: each factor of
the op's rule is laid out as the result axes it appears on say. A mesh axis
on both an iteration axis and a reduction axis of a result means "compute
with the contraction sharded, then reduce-scatter onto that iteration
axis", so the computation keeps that iteration axis whole on the mesh axis.
Operands must arrive laid out as the factors say; results come out with
partial sums on their reduction axes and are resharded to what was decided.

Used by the decomposition pass and by the propagation cost model alike.
"""

from __future__ import annotations

from ..multidevice import layout
from ..ops.registry import FactorKind
from .program import TvState


def _operand_axes(tv):
    return tv.non_reduction_axes()


def result_axis_factors(expr, i: int) -> list:
    """[(logical axis, factors)] of result i."""
    return list(zip(range(len(expr.tv_outputs[i].logical)), expr.rule().results[i]))


def operand_axis_factors(expr, i: int) -> list:
    """[(logical axis, factors)] of TensorView operand i."""
    return list(zip(_operand_axes(expr.tv_inputs[i]), expr.rule().operands[i]))


def factor_layouts(expr, result_states: list) -> dict:
    """factor index -> layout the computation uses."""
    rule = expr.rule()
    out: dict = {}
    for i, (tv, state) in enumerate(zip(expr.tv_outputs, result_states)):
        if state is None or state.mesh is None:
            continue
        sizes = state.mesh.axis_sizes()
        scattered = set(state.pending(tv))
        for k, factors in result_axis_factors(expr, i):
            if not factors or any(f in out for f in factors):
                continue
            digits = state.layouts[k]
            if not tv.logical[k].is_reduction():
                for m in scattered:
                    if m in layout.mesh_axes_of(digits):
                        digits = layout.without(digits, m, sizes)
            per = layout.split_layout(digits, [rule.factors[f].extent for f in factors], sizes)
            if per is None:
                per = [() for _ in factors]
            for f, d in zip(factors, per):
                out[f] = () if rule.factors[f].kind is FactorKind.REPLICATED else d
    return out


def _layout_of(axes_factors: list, n_axes: int, factors_layout: dict, rule) -> list:
    layouts = [() for _ in range(n_axes)]
    for k, factors in axes_factors:
        if factors:
            layouts[k] = layout.join_layouts(
                [factors_layout.get(f, ()) for f in factors], [rule.factors[f].extent for f in factors]
            )
    return layouts


def required_state(expr, i: int, factors_layout: dict, mesh) -> TvState:
    """How TensorView operand i must be laid out for the computation."""
    tv = expr.tv_inputs[i]
    return TvState(mesh, _layout_of(operand_axis_factors(expr, i), len(tv.logical), factors_layout, expr.rule()))


def produced_state(expr, i: int, factors_layout: dict, mesh) -> TvState:
    """How result i comes out of the computation (partials on reduction axes)."""
    tv = expr.tv_outputs[i]
    return TvState(mesh, _layout_of(result_axis_factors(expr, i), len(tv.logical), factors_layout, expr.rule()))


def resolved(tv, state: TvState) -> TvState:
    """The state a result has once its partial sums are resolved."""
    return TvState(state.mesh, [() if id_.is_reduction() else d for id_, d in zip(tv.logical, state.layouts)])
