"""Bytes a sharding decision costs, from the same reshard plans the
decomposition pass will emit.

With concrete sizes a cost is the bytes received per device. With symbolic
sizes (-1 extents and no input shapes) nvshard uses a documented heuristic:
static-shaped fusion inputs are parameters ("weights") and moving them is
worse than moving any activation, so costs compare (weight bytes, other
bytes) in that order, symbolic extents counting SYMBOLIC_EXTENT_GUESS each.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Optional

try:
    import cython
except ImportError:  # Python without Cython: the class directives do nothing (native.PythonDirectives)
    from ..native import PythonDirectives as cython

from ..ir.identity import identity
from ..ir.nodes import TensorView
from .program import TvState, new_state
from .projection import (annotated_sum, arriving_state, operand_plans, plan_compute, resolved, results_mesh,
                         question_head, reuses_mesh_axis, same_state, tensor_places)
from ..multidevice import layout
from ..multidevice.collectives import format_bytes
from .reshard import NumelModel, layout_number, numbered, plan_reshard

SYMBOLIC_EXTENT_GUESS = 2048
MAX_COMPLETIONS = 64


@cython.no_gc
@cython.freelist(64)
@cython.cclass
@dataclass(init=False)
class Cost:
    __slots__ = ("weight", "other", "symbolic", "steps")

    weight: float
    other: float
    symbolic: bool
    # (tensor, note, Step): named when described (a plan compares far more
    # costs than its log prints); unnamed, the tensor's place in a question
    steps: list

    def __init__(self, weight=0.0, other=0.0, symbolic=False, steps=None):
        # (written out: compiled, a generated __init__ with a default factory
        # costs several times as much; every cost adds up several)
        self.weight = weight
        self.other = other
        self.symbolic = symbolic
        self.steps = [] if steps is None else steps

    @property
    def total(self) -> float:
        return self.weight + self.other

    def key(self) -> tuple:
        return (self.weight, self.other) if self.symbolic else (self.weight + self.other,)  # (total, not its property)

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.weight + other.weight, self.other + other.other, self.symbolic, self.steps + other.steps)

    def scaled(self, factor: float, note: str) -> "Cost":
        """This cost shared: `note` says why, in the described steps."""
        steps = [(t, f"{said} ({note})" if said else f"({note})", step) for t, said, step in self.steps]
        return Cost(self.weight * factor, self.other * factor, self.symbolic, steps)

    def unnamed(self, tensors: list) -> "Cost":
        """This cost with each step's tensor as its place in `tensors` (to
        be kept for a question asked again about other tensors)."""
        place = {}
        for i in range(len(tensors)):
            place.setdefault(tensors[i], i)
        return Cost(self.weight, self.other, self.symbolic, [(place[t], note, step) for t, note, step in self.steps])

    def renamed(self, tensors: list) -> "Cost":
        """An unnamed cost with the tensors of `tensors` put back."""
        return Cost(self.weight, self.other, self.symbolic, [(tensors[i], note, step) for i, note, step in self.steps])

    def describe(self) -> str:
        if self.symbolic:
            text = f"~{format_bytes(self.total)} (weights {format_bytes(self.weight)})"
        else:
            text = format_bytes(self.total)
        moves = [f"{s.kind} {name}" + (f" over DID{s.mesh_axis}" if s.mesh_axis else "") + f" {format_bytes(s.bytes)}"
                 for name, s in self._named_steps() if s.bytes]
        return text + (f": {'; '.join(moves)}" if moves else "")

    def _named_steps(self) -> list:
        """(tensor name and note, Step) per step."""
        return [(t.short_name() + (" " + note if note else ""), step) for t, note, step in self.steps]


class CostModel:
    __slots__ = (
        "program", "sizes", "symbolic", "numel", "_answers", "_signature_numbers",
        "_layout_numbers", "_layout_table", "_expr_questions", "_weights", "_operand_plans",
        "_completions"
    )

    def __init__(self, program, sizes=None):
        self.program = program
        self.sizes = sizes
        self.symbolic = sizes is None
        self.numel = _RememberingNumel(sizes, program.fusion)
        self._answers: dict = {}  # expr_cost by structure and states
        # Questions (here and in conflicts.py) name signatures and layouts by
        # numbers, this plan's (as reshard.plan_key does): a lookup then hashes
        # and compares a few ints, not nested tuples of sizes and keys.
        self._signature_numbers: dict = {}  # tv -> its signature's number
        self._layout_numbers: dict = {}  # id(layout) -> (layout, its key's number)
        self._layout_table: dict = {}  # layout.key -> its number
        self._expr_questions: dict = {}  # expr -> the parts of its questions fixed by its structure
        # Within a plan, by the expr itself and numbered states:
        self._operand_plans: dict = {}  # (operands' part, mesh) -> projection.operand_plans
        self._completions: dict = {}  # (operands' part, results' states) -> _run_cost
        self._weights = {
            v for v in program.inputs
            if isinstance(v, TensorView) and all(id_.extent().is_static for id_ in v.logical)
        }

    def extent(self, tv: TensorView, k: int) -> float:
        return _extent(self.sizes, tv, k)

    def signature(self, tv: TensorView) -> tuple:
        """What a cost depends on of a tensor besides its state (its dtype,
        axes and extents; weight; an annotated pending sum): equal
        signatures, equal states and equal structure ask the same question.
        (What signature_number stands for; it numbers it without building it.)"""
        return (self.numel.signature(tv), self.is_weight(tv), annotated_sum(tv))

    def signature_number(self, tv: TensorView):
        """signature(tv)'s number: equal signatures, equal numbers (the numel
        signature's number and the two flags in one int: no signature tuple
        is built or hashed)."""
        n = self._signature_numbers.get(tv)
        if n is None:
            n = self._signature_numbers[tv] = 4 * self.numel.signature_number(tv) + self.signature_flags(tv)
        return n

    def shape_number(self, tv: TensorView) -> int:
        """The number of tv's shape (its item size and, per axis, canonical
        extent and kind), kept with the fusion: the same in every plan, and
        tensors of equal shapes have equal numel signatures under any sizes."""
        return _shape_number(tv, self.numel._shapes)

    def signature_flags(self, tv: TensorView) -> int:
        """What signature(tv) says besides the numel signature, as an int:
        2 * is_weight(tv) + whether the user annotated a pending sum on it."""
        return 2 * self.is_weight(tv) + annotated_sum(tv)

    def layout_number(self, digits):
        """layout.key(digits)'s number (-1: replicated): equal layouts, equal
        numbers. Kept per layout object: propagation hands one object from
        tensor to tensor (reshard.layout_number)."""
        return layout_number(digits, self._layout_numbers, self._layout_table)

    def layouts_numbered(self, layouts) -> list:
        """Each layout's number (layout_number), an open axis (None) and a
        whole one (()) kept as they are."""
        return [self.layout_number(d) if d else d for d in layouts]

    def numbered_state(self, mesh, layouts) -> tuple:
        """A state as questions name it: its mesh and its layouts' numbers
        (layouts_numbered)."""
        return (mesh, tuple(self.layouts_numbered(layouts)))

    def is_weight(self, tv: TensorView) -> bool:
        return self.symbolic and tv in self._weights

    def price(self, tv: TensorView, src: TvState, dst: TvState) -> float:
        """Bytes a reshard moves, as plan_compute weighs its alternatives."""
        return reshard_bytes(tv, src, dst, self.numel)

    def reshard(self, tv: TensorView, src: TvState, dst: TvState) -> Cost:
        if same_state(src, dst):
            return Cost(0.0, 0.0, self.symbolic)
        steps = plan_reshard(tv, src, dst, self.numel)
        total = sum([s.bytes for s in steps])
        named = [(tv, "", s) for s in steps]
        if self.is_weight(tv):
            return Cost(total, 0.0, self.symbolic, named)
        return Cost(0.0, total, self.symbolic, named)

    def expr_cost(self, expr, states: dict, options: dict, shared: Optional[dict] = None) -> Cost:
        """Cheapest way to run `expr`. `states[tv]` holds known layouts (None
        where an axis is still open); an open operand axis costs nothing (it
        will be laid out as needed); open result axes try `options[(tv, k)]`.
        `shared[operand]` = (layouts other consumers already reshard it to,
        consumers that would share a reshard of it): the decomposition
        reshards an operand once per layout, so a reshard already made costs
        nothing and one several consumers would make counts once among them."""
        # Stacked layers ask the same question over and over: answers are kept
        # by the expr's structure and states, with the tensors' names put back.
        key = self._question(expr, states, options, shared)
        known = self._answers.get(key)
        tensors = expr.tv_inputs + expr.tv_outputs
        if known is not None:
            return known.renamed(tensors)
        best = self._expr_cost(expr, states, options, shared)
        self._answers[key] = best.unnamed(tensors)
        return best

    def _question(self, expr, states, options, shared) -> tuple:
        fixed = self._expr_questions.get(expr)
        if fixed is None:  # what does not depend on the states
            tensors = expr.tv_inputs + expr.tv_outputs
            rule = self.program.rule(expr)
            first = tensor_places(expr, rule)
            head = question_head(expr, rule)
            sigs = [self.signature_number(t) for t in tensors]
            # operands are read resolved (projection.resolved): their reduction axes ask nothing
            summed = [_reduction_axes(t) if i < len(expr.tv_inputs) else () for i, t in enumerate(tensors)]
            fixed = self._expr_questions[expr] = (tensors, first, head, sigs, summed)
        tensors, first, head, sigs, summed = fixed
        parts = list(head)
        for i in range(len(tensors)):  # (an index loop: compiled, no tuple per pair)
            state = states[tensors[i]]
            # () stays (), an open axis (None) stays None
            numbers = self.layouts_numbered(state.layouts)
            for k in summed[i]:
                numbers[k] = ()
            parts.append((sigs[i], state.mesh, tuple(numbers)))
        for o in expr.tv_outputs:
            for k, d in enumerate(states[o].layouts):
                if d is None:
                    parts.append((first[o], k, tuple([self.layout_number(x) for x in options.get((o, k), [()])])))
        if shared:
            for t in expr.tv_inputs:
                if t in shared:
                    made, sharers = shared[t]
                    parts.append((first[t], frozenset(made), sharers))
        return tuple(parts)

    def _expr_cost(self, expr, states: dict, options: dict, shared: Optional[dict]) -> Cost:
        outputs = expr.tv_outputs
        actuals = [resolved(tv, states[tv]) for tv in expr.tv_inputs]  # producers resolved any partial sums
        operands = self._operands_part(expr, actuals, shared)
        mesh = results_mesh([states[o] for o in outputs])  # (the one plan_compute computes on)
        alternatives = self._known_operand_plans(expr, mesh, actuals, operands) if mesh is not None else []
        open_axes = [(o, k) for o in outputs for k in range(len(o.logical)) if states[o].layouts[k] is None]
        choices = [options.get(key, [()]) for key in open_axes]
        best = None
        for n, combo in enumerate(itertools.product(*choices)):
            if n >= MAX_COMPLETIONS:
                break
            filled = {o: new_state(states[o].mesh, list(states[o].layouts)) for o in outputs}
            for i in range(len(open_axes)):  # (an index loop: compiled, no tuple per pair)
                o, k = open_axes[i]
                filled[o].layouts[k] = combo[i]
            if not _all_consistent(outputs, filled):
                continue
            cost = self._completion_cost(expr, actuals, filled, shared, operands, alternatives)
            if best is None or cost.key() < best.key():
                best = cost
        if best is None:  # every completion reused a mesh axis: leave them replicated
            filled = {o: new_state(states[o].mesh, [() if d is None else d for d in states[o].layouts])
                      for o in outputs}
            best = self._completion_cost(expr, actuals, filled, shared, operands, alternatives)
        return best

    def _operands_part(self, expr, actuals: list, shared: Optional[dict]) -> tuple:
        """What a cost of expr reads besides its results' states: the expr,
        its operands' (resolved) states and how they are shared."""
        parts = [expr]
        for i in range(len(actuals)):  # (an index loop: compiled, state is typed only in a loop)
            state = actuals[i]
            # (an open axis arrives as required, a whole one does not: layouts_numbered keeps them apart)
            parts.append(self.numbered_state(state.mesh, state.layouts))
        if shared:
            inputs = expr.tv_inputs
            for i in range(len(inputs)):
                t = inputs[i]
                if t in shared:
                    made, sharers = shared[t]
                    parts.append((i, frozenset(made), sharers))
        return tuple(parts)

    def _known_operand_plans(self, expr, mesh, actuals: list, operands: tuple) -> list:
        """projection.operand_plans, remembered by the operands' part and the
        mesh: a conflict weighs many result shardings, and several
        candidates, against the same operands."""
        key = (operands, mesh)
        plans = self._operand_plans.get(key)
        if plans is None:
            plans = self._operand_plans[key] = operand_plans(expr, mesh, actuals, self.program.rule(expr))
        return plans

    def _completion_cost(self, expr, actuals: list, outs: dict, shared, operands: tuple, alternatives: list) -> Cost:
        """_run_cost, remembered by the operands' part and the results'
        states: a conflict's candidates, and the conflicts after it, ask
        about the same completions again."""
        parts = [operands]
        outputs = expr.tv_outputs
        for i in range(len(outputs)):  # (an index loop: compiled, state is typed only in a loop)
            state = outs[outputs[i]]
            parts.append(self.numbered_state(state.mesh, state.layouts))
        key = tuple(parts)
        cost = self._completions.get(key)
        if cost is None:
            cost = self._completions[key] = self._run_cost(expr, actuals, outs, shared, alternatives)
        return cost

    def _run_cost(self, expr, actuals: list, outs: dict, shared, alternatives: list) -> Cost:
        """The cost of `expr` with its operands as `actuals` (resolved) and
        its results as `outs` says (`alternatives`: the operand plans)."""
        for o in expr.tv_outputs:
            layouts = outs[o].layouts
            for k in range(len(layouts)):  # (an index loop: compiled, no tuple per axis)
                if layouts[k] is None:
                    layouts[k] = ()
        compute = plan_compute(expr, [outs[o] for o in expr.tv_outputs], self.program.rule(expr), actuals,
                               self.price, alternatives)
        # the sum of the reshards' costs, added up as Cost.__add__ would (no Cost per partial sum)
        weight, other, steps = 0.0, 0.0, []
        inputs, operands = expr.tv_inputs, compute.operands
        for i in range(min(len(inputs), len(operands))):  # (index loops: compiled, no tuple per pair)
            tv, actual, required = inputs[i], actuals[i], operands[i]
            cost = self.reshard(tv, arriving_state(actual, required), required)
            if shared and tv in shared and cost.weight + cost.other:
                made, sharers = shared[tv]
                if required.key() in made:
                    cost = cost.scaled(0.0, "made already")
                elif sharers > 1:
                    cost = cost.scaled(1.0 / sharers, f"shared by {sharers} consumers")
            weight += cost.weight
            other += cost.other
            steps += cost.steps
        outputs, results = expr.tv_outputs, compute.results
        for i in range(min(len(outputs), len(results))):
            tv = outputs[i]
            cost = self.reshard(tv, results[i], resolved(tv, outs[tv]))
            weight += cost.weight
            other += cost.other
            steps += cost.steps
        return Cost(weight, other, self.symbolic, steps)


def _reduction_axes(tv: TensorView) -> tuple:
    return tuple([k for k in range(len(tv.logical)) if tv.logical[k].is_reduction()])


def _extent(sizes, tv: TensorView, k: int) -> float:
    """Global extent of tv's logical axis k: concrete with sizes, else an estimate."""
    return _size_value(sizes, _axis_size(tv.logical[k]))


def _axis_size(id_):
    return id_.expanded if id_.is_broadcast() and id_.expanded is not None else id_.extent()


def _size_value(sizes, size) -> float:
    if sizes is not None:
        return float(sizes.evaluate_size(size))
    return size.estimate(SYMBOLIC_EXTENT_GUESS)


class _RememberingNumel(NumelModel):
    """A NumelModel that computes the signature of each shape of tensor
    (_shape_number) once per plan (every reshard plan looks it up), as
    NumelModel.signature does, and numbers signatures (signature_number)
    without building them."""

    __slots__ = ("_signatures", "_sizes", "_extents", "_shapes", "_by_shape", "_number_table")

    def __init__(self, sizes, fusion):
        # a function of the sizes, not a bound method: no cycle through self
        super().__init__(functools.partial(_extent, sizes))
        self._sizes = sizes
        self._signatures: dict = {}  # shape number -> its tensors' signature
        # id(size) -> (size, its value, its signature parts): axes share Size
        # objects, so few differ (the entry keeps the size alive, so its id is not reused)
        self._extents: dict = {}
        # the tensors' shape numbers (_shape_number), kept with the fusion:
        # they hold in every plan, whatever the sizes
        self._shapes: tuple = fusion.kept("tensor shapes", _new_shapes)
        self._by_shape: dict = {}  # shape number -> its tensors' signature number, this plan's
        self._number_table: dict = {}  # _signature_key -> number

    def signature(self, tv) -> tuple:
        """NumelModel.signature, built once per shape (_shape_number)."""
        shape = _shape_number(tv, self._shapes)
        sig = self._signatures.get(shape)
        if sig is None:
            sig = self._signatures[shape] = _signature(tv, self._sizes, self._extents)
        return sig

    def signature_number(self, tv) -> int:
        """signature(tv)'s number in this plan: equal signatures, equal
        numbers. Tensors of one shape (_shape_number) share one: its flat
        key of numbers (_signature_key) is built once per shape, and the
        signature itself never."""
        shape = _shape_number(tv, self._shapes)
        n = self._by_shape.get(shape)
        if n is None:
            n = self._by_shape[shape] = numbered(self._number_table, _signature_key(tv, self._sizes, self._extents))
        return n


def _new_shapes() -> tuple:
    """({tv: its shape number}, {shape key: number}): see _shape_number."""
    return {}, {}


def _shape_number(tv, shapes: tuple) -> int:
    """tv's number among the shapes in `shapes`: tensors with equal numbers
    have the same item size and, axis by axis, the same canonical extent
    (Size.key: its coefficient and symbols) and kind, so their signatures
    are equal under any sizes. (Canonical forms change only as the fusion's
    ops are defined, and what is kept with a fusion is dropped when it grows.)"""
    by_tensor, table = shapes
    n = by_tensor.get(tv)
    if n is None:
        key = [tv.dtype().itemsize]
        for id_ in tv.logical:
            key.append(_axis_size(id_).key())
            key.append(2 * id_.is_reduction() + id_.is_broadcast())
        n = by_tensor[tv] = numbered(table, tuple(key))
    return n


def _signature(tv, sizes, extents: dict) -> tuple:
    """NumelModel.signature of tv, what it says of each Size kept in `extents`."""
    axes = []
    for id_ in tv.logical:
        known = _known_extent(id_, sizes, extents)
        # one (reduction?, broadcast?, extent) tuple per Size and kind of axis, shared by
        # every axis alike: none is made per axis, and equal signatures compare by identity
        reduction = id_.is_reduction()
        broadcast = id_.is_broadcast()
        parts = known[2]
        kind = 2 * reduction + broadcast
        part = parts[kind]
        if part is None:
            part = parts[kind] = (reduction, broadcast, known[1])
        axes.append(part)
    return (tv.dtype().itemsize, tuple(axes))


def _signature_key(tv, sizes, extents: dict) -> tuple:
    """What _signature says of tv, flat: its item size, then per axis its
    extent and its kind (2 * reduction + broadcast)."""
    key = [tv.dtype().itemsize]
    for id_ in tv.logical:
        key.append(_known_extent(id_, sizes, extents)[1])
        key.append(2 * id_.is_reduction() + id_.is_broadcast())
    return tuple(key)


def _known_extent(id_, sizes, extents: dict) -> tuple:
    """extents' entry for the axis's Size: (the Size, its value, its
    signature parts by kind of axis, made by _signature)."""
    size = _axis_size(id_)
    # keyed by one int (a key tuple would be built, hashed and compared by value per axis)
    known = extents.get(identity(size))
    if known is None:
        known = extents[identity(size)] = (size, _size_value(sizes, size), [None, None, None, None])
    return known


def reshard_bytes(tv, src: TvState, dst: TvState, numel: NumelModel) -> float:
    """Bytes received per device by the reshard plan from src to dst."""
    if same_state(src, dst):
        return 0.0
    return sum([s.bytes for s in plan_reshard(tv, src, dst, numel)])


def _all_consistent(outputs: list, filled: dict) -> bool:
    """Whether no result reuses a mesh axis (projection.reuses_mesh_axis)."""
    for o in outputs:
        if reuses_mesh_axis(o, filled[o].layouts):
            return False
    return True
