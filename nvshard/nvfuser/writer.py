"""Write nvshard's decided shardings onto the real TensorViews.

Only TensorViews the user left without a mesh are written; annotated ones
are never touched. Broadcast axes are never split. A layout (see
multidevice/layout.py) becomes device splits, outermost digit first: a mesh
axis is an outer split by its size, parallelized; a local block followed by
mesh axes is an inner split by their product; a layout on a reduction axis
(a pending sum) is written the same way onto the reduction axis (rDID).

Every write is computed and checked first (`plan_writes`); nothing is
applied to the real fusion until all of them are known to be writable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.nodes import NvShardError, ParallelType
from ..multidevice import layout
from ..multidevice.splits import apply_splits, tv_splits
from .reader import ReadFusion, real_module


@dataclass
class TvWrite:
    number: int
    devices: list  # the mesh's device ids
    mesh_shape: tuple
    steps: list = field(default_factory=list)  # multidevice.splits.Split, in order
    described: list = field(default_factory=list)  # per logical axis: "DIDx", "DIDy*DIDx", ... or ""

    def describe(self) -> str:
        axes = ", ".join(d or "-" for d in self.described)
        return f"T{self.number}: mesh {list(self.devices)} shape {self.mesh_shape}, axes [{axes}]"


def plan_writes(read: ReadFusion, plan) -> list:
    writes = []
    for number, (real_tv, tv) in sorted(read.pairs.items()):
        if read.annotated(number):
            continue
        state = plan.propagated.get(tv)
        if state is None or state.mesh is None:
            continue
        loop, logical = real_tv.get_loop_domain(), real_tv.get_logical_domain()
        # loop axes an op built from other axes (scatter's, from the index) are not scheduling
        built = {k for k, id_ in enumerate(tv.loop) if all(id_ is not l for l in tv.logical)}
        if len(loop) != len(logical) or any(str(r) != str(l) for k, (r, l) in enumerate(zip(loop, logical))
                                            if k not in built):
            raise NvShardError(f"T{number} has no device mesh but a scheduled loop domain ({real_tv}); "
                               f"nvshard writes device splits only onto unscheduled TensorViews")
        mesh = state.mesh
        write = TvWrite(number, list(mesh.vector), tuple(mesh.shape), described=[""] * len(tv.logical))
        layouts = {}
        for k in reversed(range(len(tv.logical))):
            digits = state.layouts[k]
            if not digits or tv.logical[k].is_broadcast():
                continue
            if k in built:
                raise NvShardError(f"T{number} axis {k}: nvshard shards it {layout.describe(digits)}, but its loop "
                                   f"axis is {loop[k]}, built by its op, not a split of the logical axis")
            layouts[k] = digits
            write.described[k] = layout.describe(digits)
        write.steps = tv_splits(f"T{number}", layouts, mesh.axis_sizes())
        writes.append(write)
    return writes


def apply_writes(read: ReadFusion, writes: list) -> None:
    import torch

    nvf = real_module()

    def real_parallel_type(mesh_axis: str):
        return getattr(nvf.ParallelType, ParallelType.of_mesh_axis(mesh_axis).name)  # mesh_x, ...

    # not a context manager: the guard is active while the object lives
    guard = nvf.FusionGuard(read.real_fusion)
    try:
        for w in writes:
            real_tv = read.pairs[w.number][0]
            real_tv.set_device_mesh(nvf.multidevice.DeviceMesh(torch.tensor(w.devices).reshape(w.mesh_shape)))
            apply_splits(real_tv, w.steps, real_parallel_type)
    finally:
        del guard
