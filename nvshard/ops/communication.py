"""Communication exprs inserted by DecomposeReshardings: one per reshard step
(see preseg/reshard.py), each moving data over a single mesh axis. What each
kind prints as and how it moves data is declared in
multidevice/collectives.py; this op is its place in the op registry."""

from __future__ import annotations

from ..multidevice.collectives import COLLECTIVES, format_bytes
from .registry import OpSpec, register


class CommunicationOp(OpSpec):
    is_communication = True

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind
        self.collective = COLLECTIVES[kind]

    def format(self, expr) -> str:
        step = expr.attrs["step"]
        parts = [str(expr.inputs[0])]
        if step.mesh_axis:
            parts.append(f"mesh axis = deviceIdx.{step.mesh_axis}")
        if step.bytes:
            parts.append(f"bytes received per device = {format_bytes(step.bytes)}")
        return f"{expr.outputs[0]}\n   = {self.collective.printed}( {', '.join(parts)} )\n"

    def run(self, expr, rt) -> None:
        src, dst = expr.inputs[0], expr.outputs[0]
        self.collective.run(rt, expr.attrs["step"], src, dst, rt.program.state[src], rt.program.state[dst])


COMMUNICATIONS = {kind: register(CommunicationOp(kind)) for kind in COLLECTIVES}
