"""A Plan: what the pre-segmenter decided for one set of input shapes.

    plan = nvshard.propagate_shardings(fd, input_shapes)
    plan.mesh_axes(tv)       per non-reduction axis, the mesh axes sharding it
    plan.partial_axes(tv)    mesh axes holding pending (partial) sums
    plan.explain(tv)         the decision-log lines about tv
    plan.decisions(tv)       the decisions behind them (axis, layout, source, priority, stage)
    plan.conflicts(tv)       the conflicts resolved at tv (candidates, winning reason)
    plan.communications      the collectives, with bytes per device
    plan.bytes_per_device    the most any device receives
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..ir.identity import identity
from ..ir.nodes import NvShardError, TensorView
from ..multidevice import layout
from ..multidevice.collectives import collective, format_bytes
from .program import indivisible


@dataclass
class Communication:
    kind: str
    tensor: str  # the TensorView resharded (its name, e.g. "T12")
    mesh_axis: Optional[str]
    groups: list  # device ids per group
    bytes_received: Optional[float]  # per device in a group; None when sizes are symbolic
    bytes_sent: Optional[float]

    def __str__(self) -> str:
        where = f" over DID{self.mesh_axis}" if self.mesh_axis else ""
        size = format_bytes(self.bytes_received) if self.bytes_received is not None else "symbolic"
        groups = " ".join("{" + " ".join(map(str, g)) + "}" for g in self.groups)
        return f"{self.kind} {self.tensor}{where}, groups {groups}: {size} received per device"


class Plan:
    def __init__(self, fusion, program, sizes, mode: str):
        self.fusion = fusion
        self.program = program
        self.sizes = sizes
        self.mode = mode
        self.propagated: dict = {}
        self.log = None
        self.communications: list[Communication] = []
        self._received: dict = {}

    # -- built by the pipeline --------------------------------------------------------
    def record_propagation(self, log) -> None:
        self.log = log
        # passes replace states, they never mutate one: a shallow copy is a snapshot
        self.propagated = dict(self.program.state)

    def check_divisibility(self) -> None:
        _check_divisibility(self.propagated, self.sizes)

    def record_communications(self) -> None:
        received: dict = {}
        # id(step) -> (step, its groups, their receiving devices): stacked
        # layers reshard alike, and their steps are one object (reshard.py
        # shares plans); the entry keeps the step alive, so its id is not reused
        per_step: dict = {}
        for expr in _communicating(self.program.exprs):
            step = expr.attrs["step"]
            src = expr.inputs[0]
            known = per_step.get(identity(step))
            if known is None:
                spec = collective(step.kind)
                groups = spec.groups(step)
                receivers = [dev for group in groups for dev in spec.receivers(group)]
                known = per_step[identity(step)] = (step, groups, receivers)
            _, groups, receivers = known
            nbytes = step.bytes if self.sizes is not None else None
            self.communications.append(Communication(step.kind, src.short_name(), step.mesh_axis, groups,
                                                     nbytes, nbytes))
            if nbytes is not None:
                for dev in receivers:
                    received[dev] = received.get(dev, 0.0) + nbytes
        self._received = received

    # -- inspection ----------------------------------------------------------------------
    def _state(self, tv: TensorView):
        if tv not in self.propagated:
            raise NvShardError(f"{tv} is not a TensorView of this fusion")
        return self.propagated[tv]

    def mesh_axes(self, tv: TensorView) -> list:
        state = self._state(tv)
        return [list(layout.mesh_axes_of(state.layouts[k])) for k in tv.non_reduction_axes()]

    def partial_axes(self, tv: TensorView) -> list:
        return list(self._state(tv).pending(tv))

    def mesh(self, tv: TensorView):
        return self._state(tv).mesh

    def explain(self, tv: TensorView) -> list:
        return self.log.explain(tv) if self.log else []

    def decisions(self, tv: TensorView) -> list:
        return self.log.decisions(tv) if self.log else []

    def conflicts(self, tv: TensorView) -> list:
        return self.log.conflicts(tv) if self.log else []

    @property
    def bytes_per_device(self) -> Optional[float]:
        if self.sizes is None:
            return None
        return max(self._received.values(), default=0.0)

    def bytes_received(self, device: int) -> float:
        return self._received.get(device, 0.0)

    def to_dot(self) -> str:
        """The plan as a graphviz graph (nvshard/visualize/graph.py says what it shows)."""
        from ..visualize.graph import to_dot

        return to_dot(self)

    def render(self, path) -> str:
        """Draw the plan to `path`, SVG or PNG by extension (needs Graphviz's dot)."""
        from ..visualize.graph import render

        return render(self, path)

    def report(self) -> str:
        if not self.communications:
            return "Communications: none"
        lines = ["Communications:"] + [f"  {c}" for c in self.communications]
        if self.sizes is not None:
            lines.append(f"  bytes received per device: {format_bytes(self.bytes_per_device)}")
        return "\n".join(lines)

    # -- execution support -------------------------------------------------------------
    def groups(self) -> list:
        """Every process group the program uses, in program order."""
        out = []
        for expr in self.program.exprs:
            if expr.op.is_communication and not expr.op.collective.local:
                step = expr.attrs["step"]
                for g in collective(step.kind).groups(step):
                    if len(g) > 1 and g not in out:
                        out.append(g)
        return out

    def devices(self) -> set:
        devs = set()
        for state in self.program.state.values():
            if state.mesh is not None:
                devs.update(state.mesh.vector)
        return devs

    def check_world(self, world_size: int, rank: int) -> None:
        devs = self.devices()
        if devs and max(devs) >= world_size:
            raise NvShardError(
                f"the fusion's meshes use devices {sorted(devs)}, but this job has {world_size} process(es); "
                f"launch with mpirun -np {max(devs) + 1}, or run the ranks in one process with nvshard.simulate"
            )


def _communicating(exprs: list) -> list:
    """The exprs that move data between devices (communications that are
    not local), in program order (a typed loop: compiled, each expr's op is
    read as a struct field)."""
    out = []
    for expr in exprs:
        op = expr.op
        if op.is_communication and not op.collective.local:
            out.append(expr)
    return out


def _check_divisibility(propagated: dict, sizes) -> None:
    """Every propagated layout divides its axis (concrete sizes)."""
    checked = set()
    # Propagation hands one layout object from tensor to tensor: each object is
    # checked once per (axis size, mesh) it meets, both found by identity.
    seen: dict = {}  # id(layout) -> (layout, [(size, mesh)] it was checked with)
    for tv, state in propagated.items():
        mesh = state.mesh
        if mesh is None:
            continue
        mesh_sizes = None  # (read once the tensor has a layout to check)
        logical, layouts = tv.logical, state.layouts
        for k in range(len(layouts)):
            digits = layouts[k]
            if not digits:
                continue
            id_ = logical[k]
            if id_.is_reduction():
                continue
            size = id_.expanded or id_.extent()
            entry = seen.get(identity(digits))
            if entry is None:
                entry = seen[identity(digits)] = (digits, [])
            if _met(entry[1], size, mesh):
                continue
            entry[1].append((size, mesh))
            key = (layout.key(digits), size.key(), mesh)
            if key in checked:
                continue
            if mesh_sizes is None:
                mesh_sizes = mesh.axis_sizes()
            extent = sizes.global_extent(tv, tv.non_reduction_axes().index(k))
            try:
                layout.segments(digits, extent, mesh_sizes, sizes.bindings)
            except (layout.ShardingError, ValueError):
                raise indivisible(tv, k, digits, extent, mesh) from None
            checked.add(key)


def _met(pairs: list, size, mesh) -> bool:
    """Whether (size, mesh) is among the pairs, by identity."""
    for i in range(len(pairs)):  # (an index loop: compiled, the list is read as a C array)
        pair = pairs[i]
        if pair[0] is size and pair[1] is mesh:
            return True
    return False
