"""Pass-through classes: tensor axes that share one layout unless a reshard
separates them (Shardy's factor-based propagation, grouped once per fusion).

Two axes are *linked* by an expr when it carries one pass-through factor on
both, each axis made of that factor alone (no reshape splits or merges it),
neither a pending sum, neither annotated (annotations are sources, never
targets), and both tensors in the same pipeline stage. An expr with a
contraction factor links nothing: what crosses a contraction waits for all
its operands (engine.py), so it is decided where classes meet.

A class is what the links join (union-find groups them when asked, for
tests and tools; the engine needs only the links). When none of an expr's
tensors is annotated and all are in one stage, as nearly always, its links
are its rule's structure alone: they are made once and kept with the rule,
and each plan only files them under their tensors (the engine keeps the
classes themselves with the fusion, for the next plan with the same
annotations and rules). The engine spreads a
decision along its class's links in one pass, a link layer at a time (so
waves that meet compete as they would through proposals), without
recomputing the proposals of the exprs in between; the exprs where classes
meet (a contraction, a reshape, an annotated or replicated factor) keep
proposing.
"""

from __future__ import annotations

from dataclasses import dataclass

try:
    import cython
except ImportError:  # Python without Cython: the class directives do nothing (native.PythonDirectives)
    from ..native import PythonDirectives as cython

from ..ops.registry import FactorKind
from .projection import Role, axis_factors
from .proposals import Direction

# Members read in inner loops, as module names: on Python 3.11 every attribute
# read on an Enum class goes through EnumType.__getattr__'s slot hook.
_OPERAND = Role.OPERAND
_PASS, _SUM = FactorKind.PASS, FactorKind.SUM
_FORWARD, _BACKWARD, _SIDEWAYS = Direction.FORWARD, Direction.BACKWARD, Direction.SIDEWAYS
_NO_ENDS: list = []  # an unlinked axis's ends (read only)


@cython.cclass
@dataclass
class End:
    """Where a decision on a linked axis arrives: the other axis, and what
    the spread's decision there is propagated through. Flat: the spread
    reads one per arrival, and big fusions keep hundreds of thousands."""

    __slots__ = ("tv", "number", "axis", "direction", "expr", "names")

    tv: object  # TensorView
    number: int  # tv's number (the spread finds tv's entry by it, without reading tv)
    axis: int  # logical axis of tv
    direction: Direction
    expr: object  # the Expr that links the axes
    names: str  # the factor names of tv's axis there


@cython.cclass
class Link:
    """Where a decision on one axis spreads: the expr and the linked axes on
    its factor (AxisFactors; one Link shared by all of them). Pure structure
    of the expr's rule: kept with the rule, from plan to plan."""

    __slots__ = ("expr", "members")

    def __init__(self, expr, members: tuple):
        self.expr = expr
        self.members = members

    def __repr__(self) -> str:
        return f"Link({self.expr!r}, {[(m.tv.short_name(), m.axis) for m in self.members]})"

    def ends(self, tv) -> list:
        """[End] of the other axes, for a decision on one of tv's axes. Made
        anew on each call: PassThroughClasses.ends_of keeps them (a second
        copy here would double what big fusions keep). A tensor has one role
        in an expr (an expr never reads its own result); direction_between,
        unrolled."""
        role = None
        for m in self.members:
            if m.tv is tv:
                role = m.role
                break
        across = _FORWARD if role is _OPERAND else _BACKWARD
        return [End(m.tv, m.tv.number, m.axis, _SIDEWAYS if m.role is role else across, self.expr, m.names)
                for m in self.members if m.tv is not tv]


class PassThroughClasses:
    __slots__ = ("links", "linked_positions", "internal", "_parent", "_ends")

    def __init__(self, program, frozen: set, home: dict):
        """program None: no links (every decision travels by proposals)."""
        # tv -> per logical axis its [Link] (None: unlinked); keyed by tensor,
        # not (tensor, axis): no pair to build and hash per lookup
        self.links: dict = {}
        self.linked_positions: dict = {}  # expr -> positions in axis_factors(expr) that are linked
        self.internal: set = set()  # exprs whose every axis is linked: they never propose
        self._parent = None  # union-find over the links, built when a class is first asked for
        # by tensor number (a list index: a dict of every tensor misses the caches at 10k exprs),
        # per logical axis, the ends of all its links (ends_of)
        self._ends: list = []
        if program is not None:
            self._link_all(program, frozen, home)

    def _link_all(self, program, frozen: set, home: dict) -> None:
        for e in program.exprs:
            if e.tv_outputs:
                self._link_expr(e, program.rule(e), frozen, home)

    def _link_expr(self, expr, rule, frozen: set, home: dict) -> None:
        slots = axis_factors(expr, rule)
        groups = _pass_groups(rule, slots)
        if not groups:
            return
        if _open_one_stage(slots, frozen, home):
            # The common case: the links are the rule's structure alone, made
            # once per rule (kept with it, as its axis factors are).
            made = rule.cache.get("open_links")
            if made is None:
                made = rule.cache["open_links"] = _make_links(expr, slots, groups, _NOTHING_FROZEN, {})
        else:
            made = _make_links(expr, slots, groups, frozen, home)
        made_links, positions = made
        if not made_links:
            return
        links = self.links
        for link in made_links:
            for a in link.members:
                per_axis = links.get(a.tv)
                if per_axis is None:
                    per_axis = links[a.tv] = [None] * len(a.tv.logical)
                out = per_axis[a.axis]
                if out is None:
                    per_axis[a.axis] = [link]
                else:
                    out.append(link)
        self.linked_positions[expr] = positions
        if len(positions) == len(slots):
            self.internal.add(expr)

    def of(self, tv, axis: int):
        """The links of one axis (None: unlinked)."""
        per_axis = self.links.get(tv)
        return None if per_axis is None else per_axis[axis]

    def ends_of(self, tv, axis: int, number: int = -1) -> list:
        """Link.ends(tv) of every link of the axis, in link order (none: an
        unlinked axis), as one list made when first asked for (callers must
        not change it): the spread walks it once per decision. number: tv's
        (-1: read from tv)."""
        if number < 0:
            number = tv.number
        by_number = self._ends
        if number >= len(by_number):
            by_number.extend([None] * (number + 1 - len(by_number)))
        per_axis = by_number[number]
        if per_axis is None:
            per_axis = by_number[number] = [None] * len(tv.logical)
        ends = per_axis[axis]
        if ends is None:
            links = self.of(tv, axis)
            if links is None:
                per_axis[axis] = _NO_ENDS
                return _NO_ENDS
            ends = links[0].ends(tv)
            for j in range(1, len(links)):  # (most axes have one link: its list is the whole answer)
                link = links[j]
                ends += link.ends(tv)
            per_axis[axis] = ends
        return ends

    # -- union-find (asked for by tests and tools; the spread walks links) ---------------------------
    def _find(self, slot):
        parent = self._parent
        root = slot
        while root in parent:  # roots are not in parent
            root = parent[root]
        while slot != root:  # path compression
            parent[slot], slot = root, parent[slot]
        return root

    def _union(self, a, b) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self._parent[rb] = ra

    def _grouped(self) -> None:
        if self._parent is None:
            self._parent = {}
            for tv, k in self._linked_axes():
                for link in self.of(tv, k):
                    first = link.members[0]
                    self._union((first.tv, first.axis), (tv, k))

    def _linked_axes(self) -> list:
        """(tv, axis) of every linked axis."""
        return [(tv, k) for tv, per_axis in self.links.items() for k, out in enumerate(per_axis) if out]

    def class_of(self, tv, axis):
        """A representative axis of the class (tv, axis) is in (itself when unlinked)."""
        self._grouped()
        return self._find((tv, axis))

    def count(self) -> tuple:
        """(classes, linked axes)."""
        self._grouped()
        linked = self._linked_axes()
        roots = {self._find(s) for s in linked}
        return len(roots), len(linked)


_NOTHING_FROZEN: frozenset = frozenset()


def _make_links(expr, slots: list, groups: list, frozen, home: dict) -> tuple:
    """([Link], the linked positions) of expr: per pass-through
    group, its axes not annotated, split by pipeline stage."""
    made, positions = [], []
    for group in groups:
        members = []
        for i in group:
            s = slots[i]
            if s.tv not in frozen:
                members.append(i)
        if len(members) < 2:
            continue
        s = slots[members[0]]
        stage = home.get(s.tv)
        if _one_stage(members, slots, home, stage):
            parts = [members]
        else:  # a stage cut: each stage's axes link among themselves
            stages = {home.get(slots[i].tv) for i in members}
            parts = [[i for i in members if home.get(slots[i].tv) == mesh] for mesh in stages]
        for part in parts:
            axes = tuple([slots[i] for i in part])
            if _one_tensor(axes):
                continue  # one tensor (x * x) links nothing
            made.append(Link(expr, axes))
            positions += part
    return made, tuple(positions)  # (a tuple: a frozenset is four times its size, and few positions link)


def _open_one_stage(slots: list, frozen: set, home: dict) -> bool:
    """Whether no tensor of the expr is annotated and all are in one stage."""
    stage = home.get(slots[0].tv)
    for s in slots:
        if s.tv in frozen:
            return False
        mesh = home.get(s.tv)
        if mesh is not stage and mesh != stage:  # (identity first: the common case)
            return False
    return True


def _one_stage(members: list, slots: list, home: dict, stage) -> bool:
    """Whether every member axis's tensor is in `stage`."""
    for i in members:
        s = slots[i]
        if home.get(s.tv) != stage:
            return False
    return True


def _one_tensor(axes: tuple) -> bool:
    """Whether all the axes are of one tensor."""
    first = axes[0].tv
    for a in axes:
        if a.tv is not first:
            return False
    return True


def _pass_groups(rule, slots) -> list:
    """Positions of the axes on each pass-through factor that could link (made
    of that factor alone, not a pending sum); none when the expr contracts.
    Fixed per expr: cached with its rule."""
    groups = rule.cache.get("pass_groups")
    if groups is None:
        by_factor: dict = {}
        if not _contracts(rule):
            factors = rule.factors
            for i in range(len(slots)):  # (an index loop: compiled, the slot typed)
                s = slots[i]
                if not s.compound and not s.reduction and factors[s.factors[0]].kind is _PASS:
                    by_factor.setdefault(s.factors[0], []).append(i)
        groups = rule.cache["pass_groups"] = [g for g in by_factor.values() if len(g) > 1]
    return groups


def _contracts(rule) -> bool:
    """Whether the rule has a contraction (sum) factor."""
    for f in rule.factors:
        if f.kind is _SUM:
            return True
    return False
