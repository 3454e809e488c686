"""How an expr computes, given the shardings of its results: the per-expr
view of projection.plan_compute, one operand or result at a time (for
callers that look at a few tensors of an expr, such as tools/optimum.py).

`rule` defaults to the op's symbolic rule; passes give the plan's
(Program.rule), which knows concrete sizes.
"""

from __future__ import annotations

from . import projection
from .program import TvState
from .projection import resolved  # noqa: F401  (part of this view)


def factor_layouts(expr, result_states: list, rule=None) -> dict:
    """factor index -> layout the computation uses."""
    return projection.factor_layouts(expr, result_states, rule or expr.rule())


def required_state(expr, i: int, factors_layout: dict, mesh, rule=None) -> TvState:
    """How TensorView operand i must be laid out for the computation."""
    rule = rule or expr.rule()
    pairs = projection.operand_axes(expr, i, rule)
    return TvState(mesh, projection.unproject(pairs, len(expr.tv_inputs[i].logical), factors_layout, rule))


def produced_state(expr, i: int, factors_layout: dict, mesh, rule=None) -> TvState:
    """How result i comes out of the computation (partials on reduction axes)."""
    rule = rule or expr.rule()
    pairs = projection.result_axes(expr, i, rule)
    return TvState(mesh, projection.unproject(pairs, len(expr.tv_outputs[i].logical), factors_layout, rule))
