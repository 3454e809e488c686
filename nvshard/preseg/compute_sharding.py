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


# `rule` defaults to the op's symbolic rule; passes give the plan's
# (Program.rule), which knows concrete sizes.


def result_axis_factors(expr, i: int, rule=None) -> list:
    """[(logical axis, factors)] of result i."""
    rule = rule or expr.rule()
    return list(zip(range(len(expr.tv_outputs[i].logical)), rule.results[i]))


def operand_axis_factors(expr, i: int, rule=None) -> list:
    """[(logical axis, factors)] of TensorView operand i."""
    rule = rule or expr.rule()
    return list(zip(_operand_axes(expr.tv_inputs[i]), rule.operands[i]))


def factor_layouts(expr, result_states: list, rule=None) -> dict:
    """factor index -> layout the computation uses."""
    rule = rule or expr.rule()
    out: dict = {}
    for i, (tv, state) in enumerate(zip(expr.tv_outputs, result_states)):
        if state is None or state.mesh is None:
            continue
        sizes = state.mesh.axis_sizes()
        scattered = set(state.pending(tv))
        for k, factors in result_axis_factors(expr, i, rule):
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


def required_state(expr, i: int, factors_layout: dict, mesh, rule=None) -> TvState:
    """How TensorView operand i must be laid out for the computation."""
    rule = rule or expr.rule()
    tv = expr.tv_inputs[i]
    return TvState(mesh, _layout_of(operand_axis_factors(expr, i, rule), len(tv.logical), factors_layout, rule))


def produced_state(expr, i: int, factors_layout: dict, mesh, rule=None) -> TvState:
    """How result i comes out of the computation (partials on reduction axes)."""
    rule = rule or expr.rule()
    tv = expr.tv_outputs[i]
    return TvState(mesh, _layout_of(result_axis_factors(expr, i, rule), len(tv.logical), factors_layout, rule))


def resolved(tv, state: TvState) -> TvState:
    """The state a result has once its partial sums are resolved."""
    return TvState(state.mesh, [() if id_.is_reduction() else d for id_, d in zip(tv.logical, state.layouts)])
