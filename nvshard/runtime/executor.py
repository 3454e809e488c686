"""Per-rank execution of a planned program.

Compute exprs run their op's torch evaluation on the local shards of the
ranks this process owns; communication exprs go through a Backend
(torch.distributed under mpirun, or simulated ranks in one process).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..ir.dtypes import DataType
from ..ir.nodes import NvShardError, Scalar, TensorView
from ..multidevice import layout
from ..multidevice.communicator import Communicator
from .backends import Backend, SimulatedBackend
from .context import EvalContext, localize_result_only
from .sizes import SizeEvaluator, agree_on_global_shapes, needs_shape_exchange


class RunState:
    def __init__(self, plan, backend: Backend, local_ranks: list, device, execution_index: int):
        self.plan = plan
        self.program = plan.program
        self.sizes: SizeEvaluator = plan.sizes
        self.backend = backend
        self.local_ranks = list(local_ranks)
        self.device = device
        self.values: dict[int, dict] = {r: {} for r in local_ranks}
        self.execution_index = execution_index

    def local_shape(self, tv, state, dev: Optional[int] = None, stripped: bool = True) -> list:
        shape = []
        for d, k in enumerate(tv.non_reduction_axes()):
            id_ = tv.logical[k]
            if id_.is_broadcast() and (stripped or id_.expanded is None):
                shape.append(1)
                continue
            extent = self.sizes.global_extent(tv, d)
            digits = state.layouts[k]
            if digits and state.mesh is not None:
                extent //= layout.local_numel_divisor(digits, state.mesh.axis_sizes())
            shape.append(extent)
        return shape


def on_rank(state, rank: int) -> bool:
    return state.mesh is None or state.mesh.has(rank)


def run_program(plan, inputs_by_rank: dict, backend: Backend, device, execution_index: int = 0) -> dict:
    """inputs_by_rank: rank -> list of this rank's input values (fusion input
    order). Returns rank -> list of output shards."""
    program = plan.program
    rt = RunState(plan, backend, list(inputs_by_rank), device, execution_index)
    backend.prepare_groups(plan.groups())
    for r, inputs in inputs_by_rank.items():
        for val, t in zip(program.inputs, inputs):
            if isinstance(val, TensorView) and t is not None and on_rank(program.state[val], r):
                rt.values[r][val] = t
    ctxs = {r: EvalContext(program, plan.sizes, r, device, execution_index) for r in rt.local_ranks}
    for expr in program.exprs:
        if not expr.tv_outputs:
            continue  # scalar arithmetic: evaluated once from the sizes
        if expr.op.is_communication:
            expr.op.run(expr, rt)
            continue
        out_state = program.state[expr.tv_outputs[0]]
        for r in rt.local_ranks:
            if not on_rank(out_state, r):
                continue
            args = []
            for v in expr.inputs:
                if isinstance(v, TensorView):
                    if v not in rt.values[r]:
                        raise NvShardError(f"rank {r}: {v.short_name()} is not available for {expr.op.name}")
                    args.append(rt.values[r][v])
                elif isinstance(v, Scalar):
                    args.append(plan.sizes.scalar(v))
                else:
                    args.append(v)
            ctx = ctxs[r]
            ctx.bind(expr)
            results = expr.op.evaluate(expr, args, ctx)
            for i, (tv, t) in enumerate(zip(expr.tv_outputs, results)):
                rt.values[r][tv] = localize_result_only(ctx, expr, i, t)
    outputs = {}
    for r in rt.local_ranks:
        outs = []
        for tv in program.outputs:
            if tv in rt.values[r]:
                outs.append(rt.values[r][tv])
            else:  # this rank is outside the output's mesh
                outs.append(torch.empty(0, dtype=tv.dtype().torch_dtype, device=device))
        outputs[r] = outs
    return outputs


class FusionExecutor:
    """What `fd.execute` uses: caches one plan per set of global input shapes."""

    def __init__(self, fusion):
        self.fusion = fusion
        self._plans: dict = {}
        self.executions = 0
        self.last_plan = None
        self.last_backend: Optional[Backend] = None

    def plan_for(self, global_shapes: list, scalar_values: dict, options=None):
        from ..preseg.pipeline import build_plan

        key = (tuple(tuple(s) if isinstance(s, (list, tuple, torch.Size)) else s for s in global_shapes),
               tuple(sorted((v.name, scalar_values[v]) for v in scalar_values)), options)
        if key not in self._plans:
            self._plans[key] = build_plan(self.fusion, global_shapes, scalar_values, options)
        return self._plans[key]

    def execute(self, inputs: list, device=None):
        comm = Communicator.instance()
        rank = comm.rank()
        global_shapes, scalars = global_input_shapes(self.fusion, inputs, rank)
        device = _device_of(inputs, device)
        if comm.size() > 1 and needs_shape_exchange(self.fusion, comm.size()):
            from .distributed import distributed_backend

            global_shapes = agree_on_global_shapes(self.fusion, global_shapes,
                                                   distributed_backend(device).all_gather_object)
        plan = self.plan_for(global_shapes, scalars)
        plan.check_world(comm.size(), rank)
        if comm.size() > 1 and plan.groups():
            from .distributed import distributed_backend

            backend = distributed_backend(device)
        else:
            backend = SimulatedBackend()
        backend.reset_counters()  # counters describe the last execution
        outputs = run_program(plan, {rank: inputs}, backend, device, self.executions)
        self.executions += 1
        self.last_plan, self.last_backend = plan, backend
        return outputs[rank]


def _device_of(inputs, device):
    if device is not None:
        return torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    for t in inputs:
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def global_input_shapes(fusion, inputs: list, rank: int):
    """Check execute()'s inputs against the definition and recover the
    global shape of each input from this rank's shard."""
    expected = fusion.inputs()
    if len(inputs) != len(expected):
        names = ", ".join(v.short_name() if isinstance(v, TensorView) else str(v) for v in expected)
        raise NvShardError(f"the fusion has {len(expected)} inputs ({names}) but execute got {len(inputs)}")
    shapes, scalars = [], {}
    for k, (val, t) in enumerate(zip(expected, inputs)):
        if isinstance(val, Scalar):
            if isinstance(t, torch.Tensor):
                if t.numel() != 1:
                    raise NvShardError(f"input {k} ({val}) is a scalar; got a tensor of shape {tuple(t.shape)}")
                t = t.item()
            if not isinstance(t, (int, float, bool)):
                raise NvShardError(f"input {k} ({val}) is a scalar; got {type(t).__name__}")
            # A float where an int or bool is declared would silently change the math.
            if (val.dtype().is_integral and isinstance(t, float)) or (val.dtype() == DataType.Bool
                                                                     and not isinstance(t, bool)):
                raise NvShardError(f"input {k} ({val}) is a {val.dtype()} scalar; got {t!r}")
            scalars[val] = t
            shapes.append(t)
            continue
        if val.mesh is not None and not val.mesh.has(rank):
            shapes.append(None)  # not on this rank: its extents come from other inputs
            continue
        if not isinstance(t, torch.Tensor):
            raise NvShardError(f"input {k} ({val.short_name()}) must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != val.ndim:
            raise NvShardError(f"input {k} ({val.short_name()}) must have rank {val.ndim}, got shape {tuple(t.shape)}")
        if t.dtype != val.dtype().torch_dtype:
            raise NvShardError(
                f"input {k} ({val.short_name()}) must have dtype {val.dtype().torch_dtype}, got {t.dtype}"
            )
        shape = list(t.shape)
        if val.mesh is not None and val.mesh.has(rank):
            sizes = val.mesh.axis_sizes()
            for d, digits in enumerate(val.layouts()[i] for i in val.non_reduction_axes()):
                shape[d] *= layout.local_numel_divisor(digits, sizes) if digits else 1
        shapes.append(shape)
    return shapes, scalars
