"""The propagation decision log: why each tensor axis got its sharding.

Printed in the PropagateShardingsPass section of
NVFUSER_DUMP=pre_segmenter_logging; `Plan.explain(tv)` returns the lines
about one tensor, `Plan.decisions(tv)` / `Plan.conflicts(tv)` the records
behind them (what plan.to_dot() reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

try:
    import cython
except ImportError:  # Python without Cython: the class directives do nothing (native.PythonDirectives)
    from ..native import PythonDirectives as cython

from ..multidevice import layout


class DecisionLog:
    """Entries are formatted only when read: big fusions log thousands of
    decisions and usually nobody prints them."""

    __slots__ = ("entries", "_notes")

    def __init__(self):
        self.entries: list = []  # Decision, LoggedConflict or LoggedNote, each naming its tensor
        self._notes: set = set()

    def decide(self, tv, axis, digits, source, priority, stage, reason="") -> None:
        """`source` and `reason` are formatted with str() when the log is read."""
        self.entries.append(new_decision(tv, axis, digits, source, priority, stage, reason, None, None))

    def record(self, decision: Decision) -> None:
        """Log a decision made elsewhere (the engine keeps the same record)."""
        self.entries.append(decision)

    def note(self, tv, text: str) -> None:
        if (tv, text) not in self._notes:
            self._notes.add((tv, text))
            self.entries.append(LoggedNote(tv, text))

    def conflict(self, tv, scored: list, winner: list, reason) -> None:
        # The candidates' choices may still be merged (and change) after this:
        # keep what the text needs as plain values, formatted when read.
        candidates = []
        for cand, cost in scored:
            facts = []
            for m in cand:  # (a loop: compiled, m is typed only in a loop)
                facts.append((m.axis, m.digits, m.priority))
            facts.sort()
            flat = []
            for fact in facts:
                flat += fact
            candidates.append(new_logged_candidate(cand is winner, tuple(flat), cost))
        self.entries.append(LoggedConflict(tv, len(scored), reason, tuple(candidates)))

    def explain(self, tv) -> list[str]:
        return [entry.text() for entry in self.entries if entry.tv is tv]

    def decisions(self, tv) -> list[Decision]:
        """The decisions about tv's axes, in the order they were made."""
        return [entry for entry in self.entries if entry.tv is tv and isinstance(entry, Decision)]

    def conflicts(self, tv) -> list[LoggedConflict]:
        """The conflicts resolved at tv, in order."""
        return [entry for entry in self.entries if entry.tv is tv and isinstance(entry, LoggedConflict)]

    def text(self) -> str:
        return "\n".join(entry.text() for entry in self.entries)


@cython.no_gc
@cython.freelist(256)
@cython.cclass
@dataclass(eq=False)
class Decision:
    """The layout of one (tensor, logical axis), with its priority, the stage
    that applied it and its source; formatted when read. The engine keeps
    the record it logs (one object per decision: a big fusion makes tens of
    thousands). (A plain record, not a closure over the log: a closure and
    its cells are eight objects per decision for the collector to walk, and
    holding the log would make it a cycle.) Never changed once made."""

    tv: Any
    axis: int  # logical axis of tv
    digits: tuple  # the layout decided; () is replicated
    source: Any  # what the sharding came from (proposals.Source, or text); str() says it
    priority: Any  # an int, or "-" for the block-layout search (which has none)
    stage: str
    why: Any  # why, when the decision won a conflict ("" otherwise); str() says it
    # what the engine compares of the layout, carried from decision to decision
    # as a spread hands it on (None when not given)
    mesh_axes: Optional[frozenset] = None  # of digits
    key: Optional[tuple] = None  # layout.key(digits)

    @property
    def reason(self) -> str:
        return str(self.why)

    def text(self) -> str:
        what = layout.describe(self.digits) if self.digits else "replicated"
        line = (f"{_axis_name(self.tv, self.axis)} <- {what}: {self.source}; priority {self.priority}; "
                f"stage {self.stage}")
        return line + (f"; chosen in a conflict ({self.why})" if self.why else "")


def new_decision(tv, axis, digits, source, priority, stage, why, mesh_axes, key) -> Decision:
    """Decision(...), its fields filled directly. (Compiled, calling a
    record's class parses its arguments through Python's protocol; a plan
    makes one per decision.)"""
    d = Decision.__new__(Decision)
    d.tv, d.axis, d.digits, d.source, d.priority, d.stage, d.why = tv, axis, digits, source, priority, stage, why
    d.mesh_axes, d.key = mesh_axes, key
    return d


@cython.no_gc
@cython.cclass
class LoggedCandidate:
    """One candidate of a logged conflict as plain values: whether it won,
    its choices as one flat tuple (axis, layout, priority, axis, ...; in
    that order), its cost. One tuple per candidate, not one per choice,
    and out of the collector's way: a 10k-expr plan logs thousands, and
    the collector scans every tuple and list a plan leaves once."""

    __slots__ = ("won", "choices", "cost")

    def facts(self) -> list:
        """[(axis, layout, priority)] of its choices."""
        flat = self.choices
        return [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]


def new_logged_candidate(won: bool, choices: tuple, cost) -> LoggedCandidate:
    """LoggedCandidate(...), its fields filled directly (see new_decision)."""
    c = LoggedCandidate.__new__(LoggedCandidate)
    c.won, c.choices, c.cost = won, choices, cost
    return c


@cython.no_gc
@cython.cclass
@dataclass(eq=False)
class LoggedConflict:
    """A conflict resolved at one tensor: how many candidates, why the winner won."""

    tv: Any
    candidates: int
    why: Any  # why the winner won; str() says it
    scored: tuple  # LoggedCandidate per candidate, best first

    @property
    def reason(self) -> str:
        return str(self.why)

    def text(self) -> str:
        """Every candidate with its cost, as the log prints it."""
        tv = self.tv
        lines = [f"conflict at {tv.short_name()} ({self.candidates} candidates):"]
        for i, candidate in enumerate(self.scored):
            parts = ", ".join(
                f"{'pending' if tv.logical[axis].is_reduction() else 'axis'} {axis}: "
                f"{layout.describe(digits) if digits else 'replicated'} (p{priority})"
                for axis, digits, priority in candidate.facts())
            lines.append(f"  {'->' if candidate.won else '  '} candidate {chr(65 + i)} {{{parts}}} costs "
                         f"{candidate.cost.describe()}")
        lines.append(f"  winner: candidate A because {self.reason}")
        return "\n".join(lines)


@cython.no_gc
@cython.cclass
@dataclass(eq=False)
class LoggedNote:
    """Something the log says about a tensor that is not a decision."""

    tv: Any
    note: str

    def text(self) -> str:
        return self.note


def _axis_name(tv, axis: int) -> str:
    id_ = tv.logical[axis]
    kind = "pending sum on reduction axis" if id_.is_reduction() else "axis"
    return f"{tv.short_name()} {kind} {axis}"

