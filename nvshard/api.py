"""Entry points beyond nvfuser_direct's: inspect a plan, simulate ranks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from .ir.nodes import NvShardError, Scalar, TensorView
from .multidevice import layout, shard_tensor


def propagate_shardings(fd, input_shapes=None, propagation: Optional[str] = None, scalar_inputs=None):
    """Run the pre-segmenter without executing.

    input_shapes: the GLOBAL (unsharded) shapes of the fusion inputs in
    fd.fusion.inputs() order (a value, or None, for scalar inputs); None
    plans with symbolic sizes. propagation: "default" or "legacy" (default:
    $NVSHARD_PROPAGATION or "default")."""
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


def execute_with_dtensors(fd, in_dtensors):
    """Run on DTensor inputs (their local shards); return DTensor outputs with
    the placements the plan gave the outputs."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    in_dtensors = list(in_dtensors)
    outs = fd.execute([d.to_local() for d in in_dtensors])
    plan = fd._executor.last_plan
    device_type = in_dtensors[0].device.type if in_dtensors else "cpu"
    result = []
    for tv, t in zip(plan.program.outputs, outs):
        state = plan.program.state[tv]
        mesh = state.mesh
        shape = mesh.shape if mesh is not None else (1,)
        torch_mesh = init_device_mesh(device_type, shape)
        placements = []
        for name in (mesh.axis_names if mesh is not None else ("x",)):
            axis = None
            for d, k in enumerate(tv.non_reduction_axes()):
                digits = state.layouts[k]
                if name in layout.mesh_axes_of(digits):
                    if digits[0] != name or len(layout.mesh_axes_of(digits)) > 1:
                        raise NvShardError(f"{tv.short_name()}: layout {layout.describe(digits)} has no DTensor placement")
                    axis = d
            placements.append(Shard(axis) if axis is not None else Replicate())
        result.append(DTensor.from_local(t, torch_mesh, placements))
    return result
