"""Entry points beyond nvfuser_direct's: inspect a plan, simulate ranks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from .ir.nodes import NvShardError, ParallelType, Scalar, TensorView
from .ir.sizes import Size
from . import multidevice
from .multidevice import layout, shard_tensor
from .multidevice.splits import apply_splits, tv_splits


def propagate_shardings(fd, input_shapes=None, propagation: Optional[str] = None, scalar_inputs=None):
    """Run the pre-segmenter without executing.

    input_shapes: the GLOBAL (unsharded) shapes of the fusion inputs in
    fd.fusion.inputs() order (a value, or None, for scalar inputs); None
    plans with symbolic sizes. propagation: "default", "legacy" or "search"
    (default: $NVSHARD_PROPAGATION or "default"); "search" needs concrete
    shapes (see nvshard/preseg/search.py)."""
    from .preseg.pipeline import build_plan

    scalars = {}
    if input_shapes is not None:
        input_shapes = list(input_shapes)
        for v, s in zip(fd.fusion.inputs(), input_shapes):
            if isinstance(v, Scalar) and s is not None:
                scalars[v] = s
    scalars.update(scalar_inputs or {})
    return build_plan(fd.fusion, input_shapes, scalars, propagation)


@dataclass
class Simulation:
    plan: object
    outputs: dict  # rank -> list of local output shards
    received: dict  # rank -> bytes received, counted by the backend
    calls: list = field(default_factory=list)

    def output(self, i: int) -> torch.Tensor:
        """Output i assembled from every rank's shard."""
        tv = self.plan.program.outputs[i]
        return assemble(self.plan, tv, {r: outs[i] for r, outs in self.outputs.items()})

    @property
    def bytes_per_device(self) -> float:
        return max(self.received.values(), default=0.0)


def assemble(plan, tv: TensorView, shards: dict) -> torch.Tensor:
    """Put per-rank shards of a TensorView back into one tensor."""
    state = plan.program.state[tv]
    if state.mesh is None or not any(state.layouts[k] for k in tv.non_reduction_axes()):
        return next(t for r, t in shards.items() if state.mesh is None or state.mesh.has(r))
    shape = plan.sizes.global_shape(tv)
    some = next(t for r, t in shards.items() if state.mesh.has(r))
    full = torch.zeros(shape, dtype=some.dtype, device=some.device)
    flat_index = torch.arange(full.numel()).reshape(shape)
    sizes = state.mesh.axis_sizes()
    layouts = [state.layouts[k] for k in tv.non_reduction_axes()]
    for rank in state.mesh.vector:
        idx = layout.take_block(flat_index, layouts, sizes, state.mesh.coords(rank), plan.sizes.bindings)
        full.view(-1)[idx.reshape(-1)] = shards[rank].reshape(-1).to(full.dtype)
    return full


def shard_by_plan(plan, tv: TensorView, full: torch.Tensor, rank: int) -> torch.Tensor:
    """Rank's block of the unsharded `full`, laid out as the plan lays out tv."""
    state = plan.program.state[tv]
    if state.mesh is None:
        return full
    if not state.mesh.has(rank):
        return full.new_empty(0)
    layouts = [state.layouts[k] for k in tv.non_reduction_axes()]
    return layout.take_block(full, layouts, state.mesh.axis_sizes(), state.mesh.coords(rank), plan.sizes.bindings)


def simulate(fd, inputs: list, world_size: Optional[int] = None, propagation: Optional[str] = None,
             execution_index: int = 0) -> Simulation:
    """Run every rank of the fusion in this process (collectives in memory).

    `inputs` are UNSHARDED: each rank gets its shard of every annotated input
    as multidevice.shard_tensor would give it."""
    from .preseg.pipeline import build_plan
    from .runtime.backends import SimulatedBackend
    from .runtime.executor import run_program

    fusion = fd.fusion
    vals = fusion.inputs()
    if len(inputs) != len(vals):
        raise NvShardError(f"the fusion has {len(vals)} inputs but simulate got {len(inputs)}")
    shapes, scalars = [], {}
    for v, t in zip(vals, inputs):
        if isinstance(v, Scalar):
            scalars[v] = t
            shapes.append(t)
        else:
            shapes.append(list(t.shape))
    plan = build_plan(fusion, shapes, scalars, propagation)
    devices = plan.devices()
    world = world_size or (max(devices) + 1 if devices else 1)
    per_rank = {}
    for rank in range(world):
        local = []
        for v, t in zip(vals, inputs):
            if isinstance(v, TensorView) and v.mesh is not None:
                local.append(shard_tensor(t, v, rank) if v.mesh.has(rank) else None)
            else:
                local.append(t)
        per_rank[rank] = local
    device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
    backend = SimulatedBackend()
    outputs = run_program(plan, per_rank, backend, device, execution_index)
    return Simulation(plan, outputs, dict(backend.received), list(backend.calls))


# -- DTensor -------------------------------------------------------------------------
#
# torch mesh dim i is nvshard mesh axis axis_names[i] (a 3-D torch mesh's dims are
# z, y, x; a 1-D one's only dim is x). Shard(d) on several torch mesh dims nests them,
# the lowest torch dim outermost, as torch chunks them; that is nvshard's layout
# (mesh axes outer first, then the local block). Partial is a pending sum.


def placements_from_layouts(tv_name: str, mesh, layouts: list, pending=()) -> list:
    """DTensor placements, one per mesh dim, for per-dim layouts (non-reduction
    axes) and the mesh axes holding pending sums."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    placements: list = [Replicate() for _ in mesh.axis_names]
    for d, digits in enumerate(layouts):
        if not digits:
            continue
        names = layout.mesh_axes_of(digits)
        dims = [mesh.axis_names.index(m) for m in names]
        # representable: mesh digits first, in torch dim order, then one local block
        mesh_first = all(isinstance(x, str) for x in digits[: len(names)])
        if not mesh_first or dims != sorted(dims):
            raise NvShardError(
                f"{tv_name}: axis {d} is laid out as {layout.describe(digits)}, which no DTensor placement "
                f"expresses (Shard nests mesh dims outer to inner in mesh-dim order: "
                f"{'*'.join('DID' + mesh.axis_names[i] for i in sorted(dims))})"
            )
        for i in dims:
            placements[i] = Shard(d)
    for m in pending:
        placements[mesh.axis_names.index(m)] = Partial()
    return placements


def _check_dtensor_shape(tv, dtensor, mesh) -> None:
    sizes = mesh.axis_sizes()
    for d in range(dtensor.dim()):
        devices = 1
        for i, p in enumerate(dtensor.placements):
            if p.is_shard() and p.dim % dtensor.dim() == d:
                devices *= sizes[mesh.axis_names[i]]
        if dtensor.shape[d] % devices:
            raise NvShardError(
                f"{tv.short_name()}: the DTensor's dim {d} has extent {dtensor.shape[d]}, which its Shard placements "
                f"({devices} devices) do not divide evenly; nvshard needs even shards"
            )


def annotate_from_dtensor(tv: TensorView, dtensor) -> None:
    """Give `tv` the mesh and layout of `dtensor`: Shard(d) becomes an outer split
    of axis d parallelized on the mesh dim's axis (nested for several mesh dims),
    Replicate and Partial leave the axis whole (a Partial input is summed first)."""
    from torch.distributed.tensor import Shard

    mesh = multidevice.DeviceMesh.from_torch(dtensor.device_mesh)
    if dtensor.dim() != tv.ndim:
        raise NvShardError(f"{tv.short_name()} has rank {tv.ndim}; got a DTensor of shape {tuple(dtensor.shape)}")
    by_dim: dict = {}
    for i, p in enumerate(dtensor.placements):
        if type(p) is Shard:  # not a subclass such as _StridedShard, whose chunks interleave
            by_dim.setdefault(p.dim % tv.ndim, []).append(i)
        elif not (p.is_replicate() or p.is_partial()):
            raise NvShardError(f"{tv.short_name()}: DTensor placement {p} on mesh dim {i} is not supported "
                               f"(Shard, Replicate or Partial)")
    _check_dtensor_shape(tv, dtensor, mesh)
    sizes = mesh.axis_sizes()
    layouts = {}
    for d, mesh_dims in by_dim.items():
        names = [mesh.axis_names[i] for i in mesh_dims]
        devices = 1
        for m in names:
            devices *= sizes[m]
        # nested outer splits: the mesh axes outer to inner, then the local block (kept even when it is 1,
        # unlike layout.block, so every Shard is an outer split as before)
        layouts[d] = (*names, Size.of(tv.logical[d].extent()).divided_by(devices))
    tv.set_device_mesh(mesh)
    apply_splits(tv, tv_splits(tv.short_name(), layouts, sizes), ParallelType.of_mesh_axis)


def execute_with_dtensors(fd, in_dtensors) -> list:
    """Run `fd` on DTensors; returns one DTensor per fusion output.

    Inputs may live on 1-, 2- or 3-D torch DeviceMeshes with Shard, Replicate
    or Partial on any mesh dim. An input the definition left unannotated takes
    its DTensor's mesh and layout (annotate_from_dtensor); an annotated one
    whose DTensor is laid out differently is redistributed to the annotation by
    torch on the DTensor's own mesh (so is any Partial input: the fusion
    starts from whole values). Outputs carry the layout the plan gave them, as
    Shard/Replicate (Partial for a pending sum), on the inputs' DeviceMesh
    object when the output's mesh is one of theirs, else on a new torch
    DeviceMesh over the output's devices."""
    from torch.distributed.tensor import DTensor, Replicate

    in_dtensors = list(in_dtensors)
    vals = fd.fusion.inputs()
    if len(in_dtensors) != len(vals):
        raise NvShardError(f"the fusion has {len(vals)} inputs but execute_with_dtensors got {len(in_dtensors)}")
    torch_meshes: dict = {}  # nvshard mesh -> the first input's torch DeviceMesh object on it
    annotated_now = False
    for tv, dt in zip(vals, in_dtensors):
        if not isinstance(tv, TensorView):
            continue
        if not isinstance(dt, DTensor):
            raise NvShardError(f"{tv.short_name()}: execute_with_dtensors needs a DTensor, got {type(dt).__name__}")
        mesh = multidevice.DeviceMesh.from_torch(dt.device_mesh)
        torch_meshes.setdefault(mesh, dt.device_mesh)
        if tv.mesh is None:
            annotate_from_dtensor(tv, dt)
            annotated_now = True
    if annotated_now:
        from .preseg.validate import validate_annotations

        validate_annotations(fd.fusion)
        fd._executor = None  # plans made before these annotations no longer hold

    local = []
    for tv, dt in zip(vals, in_dtensors):
        if not isinstance(tv, TensorView):
            local.append(dt)
            continue
        mesh = multidevice.DeviceMesh.from_torch(dt.device_mesh)
        if mesh != tv.mesh:
            raise NvShardError(f"{tv.short_name()} is annotated on {tv.mesh}, but its DTensor is on {mesh}")
        want = placements_from_layouts(tv.short_name(), mesh, [tv.layouts()[k] for k in tv.non_reduction_axes()])
        if tuple(dt.placements) != tuple(want):
            dt = dt.redistribute(dt.device_mesh, want)
        _check_dtensor_shape(tv, dt, mesh)
        local.append(dt.to_local())

    outs = fd.execute(local)
    plan = fd._executor.last_plan
    first = next((dt for dt in in_dtensors if isinstance(dt, DTensor)), None)
    device_type = first.device_mesh.device_type if first is not None else "cpu"
    result = []
    for tv, t in zip(plan.program.outputs, outs):
        state = plan.program.state[tv]
        shape = plan.sizes.global_shape(tv)
        stride = _contiguous_stride(shape)
        if state.mesh is None:  # the same value on every device
            if first is None:
                raise NvShardError(f"{tv.short_name()}: no DTensor input to take a DeviceMesh from")
            torch_mesh, placements = first.device_mesh, [Replicate()] * first.device_mesh.ndim
        else:
            torch_mesh = torch_meshes.get(state.mesh) or _torch_mesh(state.mesh, device_type, first)
            placements = placements_from_layouts(tv.short_name(), state.mesh,
                                                 [state.layouts[k] for k in tv.non_reduction_axes()],
                                                 state.pending(tv))
        result.append(DTensor.from_local(t, torch_mesh, placements, run_check=False, shape=torch.Size(shape),
                                         stride=stride))
    return result


def _contiguous_stride(shape) -> tuple:
    stride, step = [], 1
    for n in reversed(shape):
        stride.append(step)
        step *= max(n, 1)
    return tuple(reversed(stride))


_TORCH_MESHES: dict = {}  # (nvshard mesh, device type, dim names) -> torch DeviceMesh made for outputs


def _torch_mesh(mesh, device_type: str, first):
    names = None
    if first is not None and first.device_mesh.mesh_dim_names and first.device_mesh.ndim == mesh.ndim:
        names = tuple(first.device_mesh.mesh_dim_names)
    key = (mesh, device_type, names)
    if key not in _TORCH_MESHES:
        _TORCH_MESHES[key] = mesh.to_torch(device_type, names)
    return _TORCH_MESHES[key]
