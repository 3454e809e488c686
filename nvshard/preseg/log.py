"""The propagation decision log: why each tensor axis got its sharding.

Printed in the PropagateShardingsPass section of
NVFUSER_DUMP=pre_segmenter_logging; `Plan.explain(tv)` returns the lines
about one tensor.
"""

from __future__ import annotations

from ..multidevice import layout


class DecisionLog:
    """Entries are formatted only when read: big fusions log thousands of
    decisions and usually nobody prints them."""

    def __init__(self):
        self.entries: list[tuple] = []  # (tensor, text or a _Decided record)
        self._notes: set = set()

    def decide(self, tv, axis, digits, source, priority, stage, reason="") -> None:
        """`source` is formatted with str() when the log is read."""
        self.entries.append((tv, _Decided((tv, axis, digits, source, priority, stage, reason))))

    def note(self, tv, text: str) -> None:
        if (tv, text) not in self._notes:
            self._notes.add((tv, text))
            self.entries.append((tv, text))

    def conflict(self, tv, scored: list, winner: list, reason: str) -> None:
        lines = [f"conflict at {tv.short_name()} ({len(scored)} candidates):"]
        for i, (cand, cost) in enumerate(scored):
            mark = "->" if cand is winner else "  "
            parts = ", ".join(
                f"{'pending' if tv.logical[m.axis].is_reduction() else 'axis'} {m.axis}: "
                f"{layout.describe(m.digits) if m.digits else 'replicated'} (p{m.priority})"
                for m in sorted(cand, key=lambda m: m.axis)
            )
            lines.append(f"  {mark} candidate {chr(65 + i)} {{{parts}}} costs {cost.describe()}")
        lines.append(f"  winner: candidate A because {reason}")
        self.entries.append((tv, "\n".join(lines)))

    def explain(self, tv) -> list[str]:
        return [_text(entry) for t, entry in self.entries if t is tv]

    def text(self) -> str:
        return "\n".join(_text(entry) for _, entry in self.entries)


class _Decided(tuple):
    """One decision, formatted when read. (A plain record, not a closure over
    the log: a closure and its cells are eight objects per decision for the
    collector to walk, and holding the log would make it a cycle.)"""

    __slots__ = ()

    def text(self) -> str:
        tv, axis, digits, source, priority, stage, reason = self
        what = layout.describe(digits) if digits else "replicated"
        line = f"{_axis_name(tv, axis)} <- {what}: {source}; priority {priority}; stage {stage}"
        return line + (f"; chosen in a conflict ({reason})" if reason else "")


def _axis_name(tv, axis: int) -> str:
    id_ = tv.logical[axis]
    kind = "pending sum on reduction axis" if id_.is_reduction() else "axis"
    return f"{tv.short_name()} {kind} {axis}"


def _text(entry) -> str:
    return entry.text() if isinstance(entry, _Decided) else entry
