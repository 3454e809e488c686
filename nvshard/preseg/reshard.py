"""Turning one sharding of a tensor into another as single-mesh-axis steps.

Both the propagation cost model and the DecomposeReshardings pass call
`plan_reshard`, so the bytes a decision is charged are the bytes the plan
moves. Steps, each over one mesh axis, are the kinds declared in
multidevice/collectives.py (which also gives their bytes): slice,
reduce_scatter, all_to_all (between two axes, or inside one axis where peers
exchange equal chunks), allreduce, allgather; between meshes, broadcast and
send_recv. This file decides where each kind applies.

The sequence is the cheapest one (a shortest-path search over layouts, each
edge one step weighted by its bytes): e.g. [DIDy, DIDx] -> [DIDx, DIDy]
becomes an allgather over DIDy, an all-to-all over DIDx and a free slice,
not two allgathers.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Optional

from ..ir.identity import identity
from ..multidevice import layout
from ..multidevice.collectives import collective, format_bytes
from .program import TvState, new_state


@dataclass(slots=True)
class Step:
    kind: str
    mesh_axis: Optional[str]
    axis: Optional[int]  # logical axis the step takes the mesh axis from (or slices)
    dst_axis: Optional[int]  # logical axis it scatters onto (reduce_scatter, all_to_all)
    before: TvState
    after: TvState
    bytes: float  # received per device
    group_size: int = 1

    def describe(self, tv_name: str) -> str:
        where = f" over DID{self.mesh_axis}" if self.mesh_axis else ""
        return f"{self.kind} {tv_name}{where} {format_bytes(self.bytes)}"


class NumelModel:
    """Local element counts of a tensor for a state; `extent(tv, k)` is the
    global extent of logical axis k (a number, possibly an estimate)."""

    __slots__ = ("extent", "plans", "_signature_numbers", "_layout_numbers", "_generation", "_numbered_signatures")

    def __init__(self, extent: Callable):
        self.extent = extent
        self.plans: dict = {}  # reshard plans by plan_key
        # What plan_key reads, remembered: tv -> its signature's number, and
        # id(layout) -> (layout, its key's number) (the entry keeps the layout
        # alive, so its id is not reused); numbers of _numbers_generation.
        self._signature_numbers: dict = {}
        self._layout_numbers: dict = {}
        self._generation = _numbers_generation
        self._numbered_signatures: dict = {}  # a signature -> its number (signature_number)

    def signature(self, tv) -> tuple:
        """What a reshard plan depends on besides the layouts."""
        return (tv.dtype().itemsize,
                tuple([(id_.is_reduction(), id_.is_broadcast(), self.extent(tv, k)) for k, id_ in enumerate(tv.logical)]))

    def signature_number(self, tv) -> int:
        """signature(tv)'s number in this model: equal signatures, equal
        numbers (never reset, unlike plan_key's)."""
        return numbered(self._numbered_signatures, self.signature(tv))

    def local_numel(self, tv, state: TvState) -> float:
        n = 1.0
        sizes = state.mesh.axis_sizes() if state.mesh is not None else {}
        for k, id_ in enumerate(tv.logical):
            if id_.is_reduction() or id_.is_broadcast():
                continue  # expanded axes travel as one element, re-expanded after
            e = self.extent(tv, k)
            digits = state.layouts[k]
            if digits:
                e = e / layout.local_numel_divisor(digits, sizes)
            n *= e
        return n

    def full_numel(self, tv) -> float:
        n = 1.0
        for k, id_ in enumerate(tv.logical):
            if not id_.is_reduction() and not id_.is_broadcast():
                n *= self.extent(tv, k)
        return n


# Plans by plan_key, shared by every plan of the process: a fusion is planned
# again for each new set of input shapes, and programs repeat the same
# reshards. Steps and states are never mutated.
_SHARED_PLANS: dict = {}
_SHARED_PLANS_LIMIT = 100_000
# The numbers plan keys are made of, by value: a signature, a layout's key.
# Forgotten with the plans (a new generation), so that no key made of old
# numbers meets a new one.
_SIGNATURE_NUMBERS: dict = {}
_LAYOUT_NUMBERS: dict = {}
_numbers_generation = 0


def plan_reshard(tv, src: TvState, dst: TvState, model: NumelModel) -> list[Step]:
    """The cheapest sequence of single-mesh-axis steps from src to dst."""
    global _numbers_generation
    if len(_SHARED_PLANS) >= _SHARED_PLANS_LIMIT:
        _SHARED_PLANS.clear()
        _SIGNATURE_NUMBERS.clear()
        _LAYOUT_NUMBERS.clear()
        _numbers_generation += 1
    if model._generation != _numbers_generation:
        model.plans.clear()
        model._signature_numbers.clear()
        model._layout_numbers.clear()
        model._generation = _numbers_generation
    key = plan_key(tv, src, dst, model)
    steps = model.plans.get(key)
    if steps is None:
        steps = _SHARED_PLANS.get(key)
        if steps is None:
            steps = _SHARED_PLANS[key] = _plan_reshard(tv, src, dst, model)
        model.plans[key] = steps
    return list(steps)  # the cached list stays untouched


def plan_key(tv, src: TvState, dst: TvState, model: NumelModel) -> tuple:
    """What a reshard plan depends on, as (signature, src.key(), dst.key())
    would say it, with the signature and each layout's key as a number: a
    key of a few ints hashes and compares in a few steps (nested tuples of
    sizes took thousands, and every lookup hashes and compares its key)."""
    n = model._signature_numbers.get(tv)
    if n is None:
        n = model._signature_numbers[tv] = numbered(_SIGNATURE_NUMBERS, model.signature(tv))
    known = model._layout_numbers
    return (n, src.mesh, layout_numbers(src.layouts, known, _LAYOUT_NUMBERS), dst.mesh,
            layout_numbers(dst.layouts, known, _LAYOUT_NUMBERS))


def layout_numbers(layouts, known: dict, numbers: dict) -> tuple:
    """Each layout's key as its number in `numbers` (-1: replicated or open,
    whose key is ()), remembered in `known` per layout object: propagation
    hands one layout object from tensor to tensor (the entry keeps it alive,
    so its id is not reused)."""
    out = []
    for digits in layouts:
        out.append(layout_number(digits, known, numbers))
    return tuple(out)


def layout_number(digits, known: dict, numbers: dict):
    """One layout's number, as layout_numbers gives it."""
    if not digits:
        return -1
    entry = known.get(identity(digits))
    if entry is None:
        entry = known[identity(digits)] = (digits, numbered(numbers, layout.key(digits)))
    return entry[1]


def numbered(numbers: dict, value) -> int:
    """value's number in `numbers` (the next one when it is new)."""
    n = numbers.get(value)
    if n is None:
        n = numbers[value] = len(numbers)
    return n


class LastNumbered:
    """numbered() in one table, remembering the value it numbered last (by
    identity): a plan's questions name one mesh object over and over, and
    this answers them without hashing it."""

    __slots__ = ("numbers", "last", "last_number")

    def __init__(self, numbers: dict):
        self.numbers = numbers
        self.last = None
        self.last_number = -1

    def number(self, value) -> int:
        if value is self.last:
            return self.last_number
        n = numbered(self.numbers, value)
        self.last, self.last_number = value, n
        return n


def _plan_reshard(tv, src: TvState, dst: TvState, model: NumelModel) -> list[Step]:
    itemsize = tv.dtype().itemsize
    if src.mesh is not None and dst.mesh is not None and src.mesh != dst.mesh:
        return _cross_mesh(tv, src, dst, model, itemsize)
    mesh = dst.mesh if dst.mesh is not None else src.mesh
    if mesh is None:
        return []
    steps: list[Step] = []
    cur = new_state(mesh, list(src.layouts))
    # Expanded broadcast axes hold one value per position: re-lay them out locally.
    relaid = [dst.layouts[k] if tv.logical[k].is_broadcast() and not tv.logical[k].is_reduction() else d
              for k, d in enumerate(cur.layouts)]
    if not _all_same(relaid, cur.layouts):
        after = new_state(mesh, relaid)
        steps.append(Step("slice", None, None, None, cur, after, 0.0))
        cur = after
    if cur.key() == dst.key():
        return steps
    return steps + _search(tv, cur, dst, model, itemsize)


def _search(tv, src: TvState, dst: TvState, model: NumelModel, itemsize: int) -> list[Step]:
    """Dijkstra over layouts; each edge is one collective (or a free slice)
    over one mesh axis, weighted by the bytes a device receives."""
    mesh = src.mesh
    sizes = mesh.axis_sizes()
    iteration = [k for k, id_ in enumerate(tv.logical) if not id_.is_reduction()]
    reduction = [k for k, id_ in enumerate(tv.logical) if id_.is_reduction()]
    keep_pending = {m for k in reduction for m in layout.mesh_axes_of(dst.layouts[k])}
    goal = dst.key()

    start = new_state(mesh, list(src.layouts))
    frontier = [(0.0, 0, start.key(), start, [])]
    best = {start.key(): 0.0}
    counter = 1
    while frontier:
        cost, _, key, state, path = heapq.heappop(frontier)
        if key == goal:
            return path
        if cost > best.get(key, float("inf")):
            continue
        numel = model.local_numel(tv, state)
        for kind, m, a, b, new_layouts in _moves(state, dst, sizes, iteration, reduction, keep_pending):
            after = new_state(mesh, new_layouts)
            nbytes = collective(kind).factor(sizes[m]) * numel * itemsize
            new_key = after.key()
            new_cost = cost + nbytes
            if new_cost < best.get(new_key, float("inf")):
                best[new_key] = new_cost
                step = Step(kind, m, a, b, state, after, nbytes, sizes[m])
                heapq.heappush(frontier, (new_cost, counter, new_key, after, path + [step]))
                counter += 1
    raise AssertionError(f"no resharding path for {tv.short_name()} from {src.layouts} to {dst.layouts}")


# _search's helpers are module functions, not closures: compiled, closures
# that call each other form a cycle the collector would have to find.


def _toward(dst: TvState, sizes: dict, layouts, k, m):
    """dst's layout of axis k with m added to the digits present, if that
    is the present layout plus m (the axis is on its way to dst)."""
    present = set(layout.mesh_axes_of(layouts[k])) | {m}
    if m not in layout.mesh_axes_of(dst.layouts[k]):
        return None
    target = dst.layouts[k]
    for other in layout.mesh_axes_of(target):
        if other not in present:
            target = layout.without(target, other, sizes)
    return target if layout.same(layout.without(target, m, sizes), layouts[k]) else None


def _without_pending(lay, reduction: list, m, sizes: dict) -> list:
    out = list(lay)
    for k in reduction:
        if m in layout.mesh_axes_of(out[k]):
            out[k] = layout.without(out[k], m, sizes)
    return out


def _all_same(a: list, b: list) -> bool:
    """Whether the layouts are the same, axis by axis."""
    for x, y in zip(a, b):
        if not layout.same(x, y):
            return False
    return True


def _moves(state: TvState, dst: TvState, sizes: dict, iteration: list, reduction: list, keep_pending: set):
    """The single steps from `state`: (kind, mesh axis, from axis, to axis, layouts after)."""
    lay = state.layouts
    used = {m for k in iteration for m in layout.mesh_axes_of(lay[k])}
    pending = [m for k in reduction for m in layout.mesh_axes_of(lay[k]) if m not in keep_pending]
    for m in pending:
        for b in iteration:
            t = _toward(dst, sizes, lay, b, m) if m not in used else None
            if t is not None:
                new = _without_pending(lay, reduction, m, sizes)
                new[b] = t
                yield "reduce_scatter", m, None, b, new
        yield "allreduce", m, None, None, _without_pending(lay, reduction, m, sizes)
    if pending:
        return  # resolve partial sums before moving data around
    for a in iteration:
        for m in layout.mesh_axes_of(lay[a]):
            gathered = list(lay)
            gathered[a] = layout.without(lay[a], m, sizes)
            yield "allgather", m, a, None, gathered
            for b in iteration:
                t = _toward(dst, sizes, gathered, b, m)
                if t is None:
                    continue
                if b == a and (layout.same(t, lay[a]) or layout.exchange_digits(
                        _segments(lay[a], sizes), _segments(t, sizes), m) is None):
                    continue  # within one axis: only where peers exchange equal chunks
                moved = list(gathered)
                moved[b] = t
                yield "all_to_all", m, a, b, moved
    for b in iteration:
        for m in layout.mesh_axes_of(dst.layouts[b]):
            if m in used:
                continue
            t = _toward(dst, sizes, lay, b, m)
            if t is not None:
                new = list(lay)
                new[b] = t
                yield "slice", m, b, b, new


def _segments(digits, mesh_sizes) -> list:
    return [(d, mesh_sizes[d]) if isinstance(d, str) else (None, d) for d in digits]


def _cross_mesh(tv, src: TvState, dst: TvState, model: NumelModel, itemsize: int) -> list[Step]:
    """Between two meshes: device-to-device copies when both have the same
    shape and the shards line up, otherwise replicate on the source mesh,
    broadcast from its first device, and slice on the destination."""
    same_shape = src.mesh.shape == dst.mesh.shape
    if same_shape and not src.pending(tv) and _all_same(src.layouts, dst.layouts):
        numel = model.local_numel(tv, src)
        # copies: cached steps must not share states a pass may still change
        return [Step("send_recv", None, None, None, new_state(src.mesh, list(src.layouts)),
                     new_state(dst.mesh, list(dst.layouts)), numel * itemsize)]
    replicated = [() for _ in tv.logical]
    steps = plan_reshard(tv, src, new_state(src.mesh, replicated), model)
    on_dst = new_state(dst.mesh, replicated)
    steps.append(Step("broadcast", None, None, None, new_state(src.mesh, replicated), on_dst,
                      model.full_numel(tv) * itemsize))
    steps += plan_reshard(tv, on_dst, dst, model)
    return steps


