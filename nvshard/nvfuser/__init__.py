"""nvshard inside real nvFuser.

    import nvfuser_direct as nvfuser
    import nvshard.nvfuser

    with nvfuser.FusionDefinition() as fd:
        ...                                   # define and annotate as usual
    plan = nvshard.nvfuser.propagate(fd, input_shapes)   # or None: symbolic
    print(plan.report())                      # what was written, the collectives, bytes

`propagate` reads the real fusion into nvshard's IR (reader.py), runs
nvshard's pre-segmenter passes and writes every decided sharding onto the
real TensorViews the user left without a mesh (writer.py). `enable()` makes
every `FusionDefinition.execute` do that first (switch.py).
"""

from __future__ import annotations

from typing import Optional

from ..ir.nodes import NvShardError
from .reader import ReadFusion, read_fusion, tv_number
from .switch import disable, enable, enabled
from .writer import apply_writes, plan_writes

__all__ = ["BridgePlan", "NvShardError", "disable", "enable", "enabled", "propagate", "propagate_read", "read_fusion",
           "tv_number"]


class BridgePlan:
    """What nvshard decided for a real fusion, and what it wrote."""

    def __init__(self, read: ReadFusion, plan, writes: list):
        self.read = read
        self.plan = plan  # nvshard's Plan over read.fd
        self.writes = writes

    def nvshard_tv(self, real_tv):
        return self.read.nvshard_tv(real_tv)

    def mesh_axes(self, real_tv) -> list:
        return self.plan.mesh_axes(self.nvshard_tv(real_tv))

    def partial_axes(self, real_tv) -> list:
        return self.plan.partial_axes(self.nvshard_tv(real_tv))

    def explain(self, real_tv) -> list:
        return self.plan.explain(self.nvshard_tv(real_tv))

    @property
    def communications(self) -> list:
        return self.plan.communications

    @property
    def bytes_per_device(self) -> Optional[float]:
        return self.plan.bytes_per_device

    @property
    def written(self) -> list:
        """Names of the real TensorViews nvshard gave a mesh and splits."""
        return [f"T{w.number}" for w in self.writes]

    def report(self) -> str:
        lines = [f"nvshard wrote {len(self.writes)} TensorView(s):"]
        lines += [f"  {w.describe()}" for w in self.writes]
        lines.append(self.plan.report())
        return "\n".join(lines)


def propagate(fd, input_shapes=None, propagation: Optional[str] = None, write: bool = True) -> BridgePlan:
    """Read the real FusionDefinition (or Fusion) `fd`, run nvshard's
    pre-segmenter and, with write=True, give every unannotated TensorView
    the sharding nvshard decided. input_shapes: GLOBAL shapes of the fusion
    inputs in order (None: symbolic). Raises NvShardError naming the
    expression nvshard cannot read; the real fusion is then unchanged."""
    fusion = fd.fusion if hasattr(fd, "fusion") else fd  # a FusionDefinition or its Fusion
    return propagate_read(read_fusion(fusion), input_shapes, propagation, write)


def propagate_read(read: ReadFusion, input_shapes=None, propagation: Optional[str] = None,
                   write: bool = True) -> BridgePlan:
    """propagate() on a fusion read_fusion() has read (the switch reads it
    once, for the global input shapes and the plan)."""
    from ..api import propagate_shardings

    plan = propagate_shardings(read.fd, input_shapes, propagation)
    writes = plan_writes(read, plan)
    if write:
        apply_writes(read, writes)
    return BridgePlan(read, plan, writes)
