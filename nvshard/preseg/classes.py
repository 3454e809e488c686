"""Pass-through classes: tensor axes that share one layout unless a reshard
separates them (Shardy's factor-based propagation, grouped once per fusion).

Two axes are *linked* by an expr when it carries one pass-through factor on
both, each axis made of that factor alone (no reshape splits or merges it),
neither a pending sum, neither annotated (annotations are sources, never
targets), and both tensors in the same pipeline stage. An expr with a
contraction factor links nothing: what crosses a contraction waits for all
its operands (engine.py), so it is decided where classes meet.

Union-find groups linked axes into classes. The engine spreads a decision
along its class's links in one pass, a link layer at a time (so waves that
meet compete as they would through proposals), without recomputing the
proposals of the exprs in between; the exprs where classes meet (a
contraction, a reshape, an annotated or replicated factor) keep proposing.
"""

from __future__ import annotations

from typing import NamedTuple

from ..ops.registry import FactorKind
from .projection import Role, axis_factors
from .proposals import Direction


class Link(NamedTuple):
    """The other end of a link from one axis: where a decision spreads to."""

    tv: object
    axis: int
    expr: object
    names: str  # the factor's name, for the log
    direction: Direction


_DIRECTION = {(a, b): Direction.between(a, b) for a in Role for b in Role}


class PassThroughClasses:
    def __init__(self, program, frozen: set, home: dict):
        self.links: dict = {}  # (tv, axis) -> [Link]
        self.linked_positions: dict = {}  # expr -> positions in axis_factors(expr) that are linked
        self.internal: set = set()  # exprs whose every axis is linked: they never propose
        self._parent: dict = {}
        for e in program.exprs:
            if e.tv_outputs:
                self._link_expr(e, program.rule(e), frozen, home)

    def _link_expr(self, expr, rule, frozen, home) -> None:
        factors = rule.factors
        if any(f.kind is FactorKind.SUM for f in factors):
            return
        slots = axis_factors(expr, rule)
        by_factor: dict = {}  # (factor, stage mesh) -> [position]
        for i, s in enumerate(slots):
            if s.compound or s.reduction or s.tv in frozen:
                continue
            f = s.factors[0]
            if factors[f].kind is FactorKind.PASS:
                key = (f, home.get(s.tv))
                group = by_factor.get(key)
                if group is None:
                    by_factor[key] = [i]
                else:
                    group.append(i)
        positions = []
        links = self.links
        for group in by_factor.values():
            if len(group) < 2:
                continue
            first = (slots[group[0]].tv, slots[group[0]].axis)
            for i in group:
                a = slots[i]
                ends = [b for b in (slots[j] for j in group) if b.tv is not a.tv]
                if not ends:
                    continue  # one tensor twice (x * x) links nothing
                positions.append(i)
                out = links.get((a.tv, a.axis))
                if out is None:
                    out = links[(a.tv, a.axis)] = []
                out += [Link(b.tv, b.axis, expr, b.names, _DIRECTION[a.role, b.role]) for b in ends]
                self._union(first, (a.tv, a.axis))
        if positions:
            self.linked_positions[expr] = frozenset(positions)
            if len(positions) == len(slots):
                self.internal.add(expr)

    # -- union-find -------------------------------------------------------------------------
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

    def class_of(self, tv, axis):
        """A representative axis of the class (tv, axis) is in (itself when unlinked)."""
        return self._find((tv, axis))

    def count(self) -> tuple:
        """(classes, linked axes)."""
        roots = {self._find(s) for s in self.links}
        return len(roots), len(self.links)
