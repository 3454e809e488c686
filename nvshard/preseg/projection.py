"""Tensor axes <-> rule factors, stated once (Shardy's sharding projection).

An op's sharding rule (ops/registry.py) names, per TensorView operand, the
factors of each *non-reduction* axis (an operand's reduction axes are sums
already finished: they carry no factor), and per result the factors of
each *logical* axis (a result's reduction axes carry the contraction
factors, so a layout there is a pending partial sum). Everything that
reads a rule goes through this module:

  axis_factors(expr, rule)    every tensor axis of the expr that carries factors
  project / unproject         tensor layouts <-> one layout per factor
  plan_compute(expr, ...)     how an expr computes, given its results' shardings
  result_only_axes(...)       result axes no operand feeds (computed whole)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Optional

try:
    import cython
except ImportError:  # Python without Cython: the class directives do nothing (native.PythonDirectives)
    from ..native import PythonDirectives as cython

from ..multidevice import layout
from ..ops.registry import FactorKind
from .program import TvState, new_state
from .reshard import numbered

# (read in inner loops: an Enum class's attribute read is slow on Python 3.11)
_REPLICATED = FactorKind.REPLICATED
_PASS = FactorKind.PASS


class Role(enum.Enum):
    OPERAND = "operand"
    RESULT = "result"


_OPERAND, _RESULT = Role.OPERAND, Role.RESULT


@dataclass(eq=False, init=False)
class AxisFactors:
    """One axis of one tensor of an expr and the rule factors it is made of
    (outer first). Made by new_axis_factors; never changed once made."""

    tv: object  # TensorView
    role: Role
    position: int  # among the expr's TensorView operands (or results)
    axis: int  # logical axis of tv
    factors: tuple
    extents: tuple  # of the factors
    reduction: bool  # a result's reduction axis: a layout there is a pending sum
    names: str  # factor names, for the log
    compound: bool  # made of several factors (a reshape splits or merges it)


def new_axis_factors(tv, role, position: int, axis: int, factors: tuple, extents: tuple, reduction: bool,
                     names: str) -> AxisFactors:
    """AxisFactors(...), its fields filled directly (compiled, calling the
    class parses its arguments through Python's protocol; a new fusion makes
    one per axis of every expr)."""
    a = AxisFactors.__new__(AxisFactors)
    a.tv, a.role, a.position, a.axis, a.factors, a.extents = tv, role, position, axis, factors, extents
    a.reduction, a.names, a.compound = reduction, names, len(factors) > 1
    return a


def operand_axes(expr, i: int, rule) -> list:
    """[(logical axis, factors)] of TensorView operand i: the rule lists its
    non-reduction axes. Cached with the rule: callers must not change it."""
    # (one list per side, keyed by a str: a str caches its hash, a (name, i) key is built and hashed per call)
    per_operand = rule.cache.get("operand_axes")
    if per_operand is None:
        per_operand = []
        tvs, operands = expr.tv_inputs, rule.operands
        for j in range(min(len(tvs), len(operands))):  # (index loops: compiled, the tensor typed, no zip)
            tv = tvs[j]
            kept, axes = tv.non_reduction_axes(), operands[j]
            per_operand.append([(kept[k], axes[k]) for k in range(min(len(kept), len(axes)))])
        rule.cache["operand_axes"] = per_operand
    return per_operand[i]


def result_axes(expr, i: int, rule) -> list:
    """[(logical axis, factors)] of result i: the rule lists every logical
    axis. Cached with the rule: callers must not change it."""
    per_result = rule.cache.get("result_axes")
    if per_result is None:
        per_result = []
        for axes in rule.results:  # (index loops: compiled, no enumerate)
            per_result.append([(k, axes[k]) for k in range(len(axes))])
        rule.cache["result_axes"] = per_result
    return per_result[i]


def pass_through_axes(expr, rule):
    """(per operand, per result: the factor each logical axis names, -1 for
    none) when every factor of expr passes through, no axis names two of
    them and no result has a reduction axis (an elementwise op, a
    broadcast, a permute): such an expr computes its results' layouts from
    operands in the same layouts, factor by factor, and nothing else. None
    for any other expr. Cached with the rule."""
    known = rule.cache.get("pass-through axes")
    if known is None:
        known = rule.cache["pass-through axes"] = _pass_through_axes(expr, rule)
    return known if known else None


def _pass_through_axes(expr, rule):
    """pass_through_axes, or () where it is None."""
    for f in rule.factors:
        if f.kind is not _PASS:
            return ()
    inputs, outputs = expr.tv_inputs, expr.tv_outputs
    if len(inputs) != len(rule.operands) or len(outputs) != len(rule.results):
        return ()
    operands, results = [], []
    for i in range(len(inputs)):  # (index loops: compiled, the tensors typed)
        named = _factor_per_axis(operand_axes(expr, i, rule), len(inputs[i].logical))
        if named is None:
            return ()
        operands.append(named)
    for i in range(len(outputs)):
        if _has_reduction(outputs[i]):
            return ()
        named = _factor_per_axis(result_axes(expr, i, rule), len(outputs[i].logical))
        if named is None:
            return ()
        results.append(named)
    return (operands, results)


def _factor_per_axis(pairs: list, n_axes: int):
    """The factor each of n_axes axes names (-1: none) from (axis, factors)
    pairs, or None when an axis names several."""
    named = [-1] * n_axes
    for k, factors in pairs:
        if len(factors) > 1:
            return None
        if factors:
            named[k] = factors[0]
    return named


def replicated_factors(rule) -> list:
    """Per factor of the rule: whether it is replicated (computed whole).
    Cached with the rule."""
    flags = rule.cache.get("replicated")
    if flags is None:
        flags = rule.cache["replicated"] = [f.kind is _REPLICATED for f in rule.factors]
    return flags


def tensor_axes(expr, tv, rule) -> Optional[list]:
    """operand_axes or result_axes of tv, whichever it is in expr (None if neither)."""
    if tv in expr.tv_outputs:
        return result_axes(expr, expr.tv_outputs.index(tv), rule)
    if tv in expr.tv_inputs:
        return operand_axes(expr, expr.tv_inputs.index(tv), rule)
    return None


def axis_factors(expr, rule) -> list:
    """Every tensor axis of expr that carries factors: operands first, then
    results (fixed structure, cached with the rule so later plans of the same
    fusion and shapes reuse it)."""
    cached = rule.cache.get("axis_factors")
    if cached is not None:
        return cached
    out = []
    # one (extent,) per factor, shared by the axes made of it alone (big fusions keep every expr's)
    extents = [(f.extent,) for f in rule.factors]
    names = [f.name for f in rule.factors]
    i = 0
    for tv in expr.tv_inputs:
        _append_axes(out, tv, _OPERAND, i, operand_axes(expr, i, rule), extents, names)
        i += 1
    i = 0
    for tv in expr.tv_outputs:
        _append_axes(out, tv, _RESULT, i, result_axes(expr, i, rule), extents, names)
        i += 1
    rule.cache["axis_factors"] = out
    return out


def _append_axes(out: list, tv, role, position: int, pairs: list, extents: list, names: list) -> None:
    """axis_factors of one tensor (pairs: operand_axes or result_axes;
    extents: (extent,) per factor)."""
    logical = tv.logical
    for k, factors in pairs:
        if not factors:
            continue
        id_ = logical[k]
        if len(factors) == 1:
            f = factors[0]
            out.append(new_axis_factors(tv, role, position, k, tuple(factors), extents[f],
                                        id_.is_reduction(), names[f]))
        else:
            out.append(new_axis_factors(tv, role, position, k, tuple(factors),
                                        tuple([extents[f][0] for f in factors]), id_.is_reduction(),
                                        " ".join([names[f] for f in factors])))


def _any_in(factors, found: dict) -> bool:
    """Whether any of the factors is in `found`."""
    for f in factors:
        if f in found:
            return True
    return False


def split_axis(digits, factors, rule, mesh_sizes: dict):
    """One axis's layout as one layout per factor it is made of; None when a
    mesh axis would straddle two factors."""
    if len(factors) == 1:
        return [digits]
    return layout.split_layout(digits, [rule.factors[f].extent for f in factors], mesh_sizes)


def join_axis(per_factor: list, factors, rule):
    """The layout of an axis made of factors laid out as given."""
    if len(factors) == 1:
        return per_factor[0]
    return layout.join_layouts(per_factor, [rule.factors[f].extent for f in factors])


def project(pairs: list, layouts: list, rule, mesh_sizes: dict, skip_replicated: bool = False) -> dict:
    """factor -> layout, from a tensor's axis layouts ([(axis, factors)] as
    operand_axes/result_axes give). Unsharded factors, axes that cannot be
    split over their factors and, if asked, replicated factors are left out."""
    out = {}
    replicated = replicated_factors(rule)
    for k, factors in pairs:
        digits = layouts[k]
        if not factors or not digits:
            continue
        per = split_axis(digits, factors, rule, mesh_sizes)
        if per is None:
            continue
        for j in range(min(len(factors), len(per))):  # (an index loop: compiled, no tuple per pair)
            f, d = factors[j], per[j]
            if d and not (skip_replicated and replicated[f]):
                out[f] = d
    return out


def unproject(pairs: list, n_axes: int, factor_layouts: dict, rule) -> list:
    """A tensor's axis layouts from one layout per factor (missing = whole)."""
    layouts = [()] * n_axes
    for k, factors in pairs:
        if len(factors) == 1:
            layouts[k] = factor_layouts.get(factors[0], ())
        elif factors:
            layouts[k] = join_axis([factor_layouts.get(f, ()) for f in factors], factors, rule)
    return layouts


def resolved(tv, state: TvState) -> TvState:
    """The state a result has once its partial sums are resolved: `state`
    itself, not a copy, when it has none (most tensors; callers only read
    what it returns)."""
    logical, given = tv.logical, state.layouts
    if len(logical) == len(given):
        pending = False
        for k in range(len(logical)):
            id_ = logical[k]
            if id_.is_reduction():
                digits = given[k]
                if digits is None or digits:
                    pending = True
                    break
        if not pending:
            return state
    layouts = []
    for k in range(min(len(logical), len(given))):  # (an index loop: compiled, it runs in C, where zip() builds tuples)
        id_ = logical[k]
        layouts.append(() if id_.is_reduction() else given[k])
    return new_state(state.mesh, layouts)


@cython.cclass
@dataclass(init=False)
class ComputePlan:
    """How one expr computes: the layout of every factor, how each operand
    must arrive and how each result comes out (pending sums on its
    reduction axes), on one mesh. (Compiled, a record whose fields the
    decomposition and the costs read as struct fields.)"""

    __slots__ = ("mesh", "factors", "operands", "results")

    mesh: object
    factors: dict  # factor -> layout
    operands: list  # TvState per TensorView operand
    results: list  # TvState per result, as computed

    def __init__(self, mesh, factors: dict, operands: list, results: list):
        self.mesh = mesh
        self.factors = factors
        self.operands = operands
        self.results = results


def factor_layouts(expr, result_states: list, rule) -> dict:
    """factor -> layout the computation uses, as the results' shardings say.

    A mesh axis on both an iteration axis and a reduction axis of a result
    means "compute with the contraction sharded, then reduce-scatter onto
    that iteration axis": the computation keeps the iteration axis whole on
    that mesh axis. Replicated factors are computed whole."""
    out: dict = {}
    outputs = expr.tv_outputs
    replicated = replicated_factors(rule)
    for i in range(min(len(outputs), len(result_states))):  # (index loops: compiled, no tuple per pair)
        tv, state = outputs[i], result_states[i]
        if state is None or state.mesh is None:
            continue
        sizes = state.mesh.axis_sizes()
        logical = tv.logical
        scattered = state.pending(tv)  # (a few mesh axes, most often none: a tuple, no set)
        for k, factors in result_axes(expr, i, rule):
            if not factors or _any_in(factors, out):
                continue
            digits = state.layouts[k]
            if scattered:
                id_ = logical[k]
                if not id_.is_reduction():
                    for m in scattered:
                        if m in layout.mesh_axes_of(digits):
                            digits = layout.without(digits, m, sizes)
            per = split_axis(digits, factors, rule, sizes)
            if per is None:
                per = [() for _ in factors]
            for j in range(min(len(factors), len(per))):
                f = factors[j]
                out[f] = () if replicated[f] else per[j]
    return out


def plan_compute(expr, result_states: list, rule, operand_states: Optional[list] = None,
                 price: Optional[Callable] = None, alternatives: Optional[list] = None) -> ComputePlan:
    """How `expr` computes given its results' shardings. Used by the cost
    model and the decomposition pass alike.

    As in nvFuser, a result's sharding decides the computation. Given the
    operands' states and `price(tv, src, dst)` (the bytes of a reshard),
    computing on the operands' shards and resharding the results after
    competes with it by the bytes moved before and after the op, ties
    keeping the results' way: a replicated result of sharded operands is
    then one gather of the result, not one per operand.
    `alternatives` are those competing plans, operand_plans(expr, mesh,
    operand_states, rule), where the caller has them: the cost model asks
    about many result shardings of the same operands."""
    mesh = results_mesh(result_states)
    base = _compute_plan(expr, factor_layouts(expr, result_states, rule), mesh, rule)
    if price is None or operand_states is None or mesh is None:
        return base
    if _moves_nothing(expr, base, result_states, operand_states):
        return base  # costs nothing: no alternative can be cheaper
    plans = operand_plans(expr, mesh, operand_states, rule) if alternatives is None else alternatives
    best, best_cost = base, None
    for plan in plans:
        if _same_factors(plan.factors, base.factors):
            continue  # the results' way itself
        if best_cost is None:
            best_cost = _plan_cost(expr, base, result_states, operand_states, price)
        cost = _plan_cost(expr, plan, result_states, operand_states, price)
        if cost < best_cost:
            best, best_cost = plan, cost
    return best


def results_mesh(result_states: list):
    """The mesh an expr computes on: its first result's that has one."""
    for s in result_states:
        if s is not None and s.mesh is not None:
            return s.mesh
    return None


def _compute_plan(expr, factors: dict, mesh, rule) -> ComputePlan:
    # (index loops, not comprehensions: compiled, tv is typed only in a loop)
    inputs, outputs, operands, results = expr.tv_inputs, expr.tv_outputs, [], []
    for i in range(len(inputs)):
        tv = inputs[i]
        operands.append(new_state(mesh, unproject(operand_axes(expr, i, rule), len(tv.logical), factors, rule)))
    for i in range(len(outputs)):
        tv = outputs[i]
        results.append(new_state(mesh, unproject(result_axes(expr, i, rule), len(tv.logical), factors, rule)))
    return ComputePlan(mesh, factors, operands, results)


def operand_plans(expr, mesh, operand_states: list, rule) -> list:
    """The plans that compete with computing the results' way on `mesh`:
    computing as the operands on that mesh already are (first operand
    first), where no tensor would reuse a mesh axis. They read the
    operands' states and the mesh only, never the results'."""
    # a pending sum the user annotated says how to compute: it stays
    for tv in expr.tv_outputs:
        if annotated_sum(tv):
            return []
    from_operands: dict = {}
    for i in range(min(len(expr.tv_inputs), len(operand_states))):  # (an index loop: compiled, no tuples)
        state = operand_states[i]
        if state is None or state.mesh != mesh:
            continue
        known = [d or () for d in state.layouts]
        for f, digits in project(operand_axes(expr, i, rule), known, rule, mesh.axis_sizes(),
                                 skip_replicated=True).items():
            from_operands.setdefault(f, digits)
    if not from_operands:
        return []
    plan = _compute_plan(expr, from_operands, mesh, rule)
    return [plan] if _realizable(expr, plan) else []


def rule_text(rule) -> str:
    """The rule as text, made once: the structural part of the questions
    the cost model, the conflicts and the decomposition remember answers by."""
    text = rule.cache.get("text")
    if text is None:
        text = rule.cache["text"] = rule.describe()
    return text


def tensor_places(expr, rule) -> dict:
    """Each of expr's tensors -> its first place among expr's operands then
    results (a tensor read twice names one place). Fixed by expr's
    structure: made once, kept with its rule; callers must not change it."""
    first = rule.cache.get("tensor places")
    if first is None:
        first = {}
        tensors = expr.tv_inputs + expr.tv_outputs
        for i in range(len(tensors)):  # (an index loop: compiled, no tuple per pair)
            first.setdefault(tensors[i], i)
        rule.cache["tensor places"] = first
    return first


def question_head(expr, rule) -> tuple:
    """(the rule's text, each tensor's place (tensor_places)): what the cost
    model's and the decomposition's questions about expr start with. Made
    once, kept with its rule."""
    head = rule.cache.get("question head")
    if head is None:
        first = tensor_places(expr, rule)
        places = []
        tensors = expr.tv_inputs + expr.tv_outputs
        for i in range(len(tensors)):  # (an index loop: compiled)
            places.append(first[tensors[i]])
        head = rule.cache["question head"] = (rule_text(rule), tuple(places))
    return head


# question head -> its number, for every rule in the process: heads are few
# (an op's rule text and its tensors' places), and one int stands for one
# head in any fusion, however fusions grow
_HEAD_NUMBERS: dict = {}


def question_head_number(expr, rule) -> int:
    """question_head's number (_HEAD_NUMBERS), kept with the rule: a flat
    question hashes and compares one int for the head."""
    n = rule.cache.get("question head number")
    if n is None:
        n = rule.cache["question head number"] = numbered(_HEAD_NUMBERS, question_head(expr, rule))
    return n


def annotated_sum(tv) -> bool:
    """Whether the user annotated a pending sum on tv (a parallelized
    reduction axis): plan_compute keeps it as it is."""
    if tv.mesh is None or not _has_reduction(tv):
        return False  # most annotated tensors have no reduction axis: no layouts to read
    for id_, digits in zip(tv.logical, tv.layouts()):
        if id_.is_reduction() and digits:
            return True
    return False


def _has_reduction(tv) -> bool:
    for id_ in tv.logical:
        if id_.is_reduction():
            return True
    return False


def _same_factors(a: dict, b: dict) -> bool:
    for f in set(a) | set(b):
        if not layout.same(a.get(f, ()), b.get(f, ())):
            return False
    return True


def _realizable(expr, plan: ComputePlan) -> bool:
    """No tensor of the plan reuses a mesh axis (reuses_mesh_axis)."""
    # (an index loop: compiled, it runs in C, where zip() builds tuples)
    tensors, states = expr.tv_inputs + expr.tv_outputs, plan.operands + plan.results
    for i in range(min(len(tensors), len(states))):
        if reuses_mesh_axis(tensors[i], states[i].layouts):
            return False
    return True


def reuses_mesh_axis(tv, layouts) -> bool:
    """Whether a mesh axis lays out two iteration axes of tv (or two of its
    reduction axes), or one axis twice: a sharding no device can hold.
    Open axes (None) lay out nothing."""
    iteration, reduction = [], []  # (lists: a tensor takes a few mesh axes at most)
    logical = tv.logical
    for k in range(min(len(logical), len(layouts))):
        digits = layouts[k]
        if not digits:
            continue  # replicated or open (most axes)
        id_ = logical[k]
        taken = reduction if id_.is_reduction() else iteration
        for d in digits:
            if isinstance(d, str):
                if d in taken:
                    return True
                taken.append(d)
    return False


def same_state(a: TvState, b: TvState) -> bool:
    """a.key() == b.key() without building the keys (layout.same per axis;
    an open axis, None, keys as replicated)."""
    if a.mesh is not b.mesh and a.mesh != b.mesh:  # (identity first: one mesh is the common case)
        return False
    la, lb = a.layouts, b.layouts
    if len(la) != len(lb):
        return False
    for k in range(len(la)):  # (an index loop: compiled, no tuple per pair)
        if not layout.same(la[k], lb[k]):
            return False
    return True


def _moves_nothing(expr, plan: ComputePlan, result_states: list, operand_states: list) -> bool:
    """Whether `_plan_cost(plan)` is zero because every reshard it prices is
    from a state to itself."""
    operands = plan.operands
    for i in range(min(len(operand_states), len(operands))):
        actual, required = operand_states[i], operands[i]
        if actual is not None and not same_state(arriving_state(actual, required), required):
            return False
    outputs, results = expr.tv_outputs, plan.results
    for i in range(min(len(outputs), len(results), len(result_states))):
        if not same_state(results[i], resolved(outputs[i], result_states[i])):
            return False
    return True


def _plan_cost(expr, plan: ComputePlan, result_states: list, operand_states: list, price) -> float:
    total = 0.0
    inputs, operands = expr.tv_inputs, plan.operands
    for i in range(min(len(inputs), len(operand_states), len(operands))):
        actual, required = operand_states[i], operands[i]
        if actual is not None:
            total += price(inputs[i], arriving_state(actual, required), required)
    outputs, results = expr.tv_outputs, plan.results
    for i in range(min(len(outputs), len(results), len(result_states))):
        total += price(outputs[i], results[i], resolved(outputs[i], result_states[i]))
    return total


def arriving_state(actual: TvState, required: TvState) -> TvState:
    """An operand as it arrives: its open axes (None) as required."""
    a, r = actual.layouts, required.layouts
    return new_state(actual.mesh, [r[k] if a[k] is None else a[k] for k in range(min(len(a), len(r)))])


def result_only_axes(expr, rule, out_index: int) -> list:
    """Per non-reduction axis of result `out_index`: True when none of its
    factors appears in an operand. Ops compute such axes whole (a slice,
    random numbers, an expansion); the executor keeps the local block."""
    operand_factors = {f for axes in rule.operands for a in axes for f in a}
    flags = []
    for k, factors in result_axes(expr, out_index, rule):
        if expr.tv_outputs[out_index].logical[k].is_reduction():
            continue
        flags.append(bool(factors) and not any(f in operand_factors for f in factors))
    return flags
