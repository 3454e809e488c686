"""Per-rank execution of a planned program.

Compute exprs run their op's torch evaluation on the local shards of the
ranks this process owns; communication exprs go through a Backend
(torch.distributed under mpirun, or simulated ranks in one process).
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from .. import profiler
from . import streams
from ..ir.dtypes import DataType
from ..ir.nodes import NvShardError, Scalar, TensorView
from ..multidevice import layout
from ..multidevice.communicator import Communicator
from ..preseg.projection import result_only_axes
from .backends import Backend, SimulatedBackend
from .context import EvalContext, localize_result_only
from ..ir.size_evaluator import SizeEvaluator
from .sizes import agree_on_global_shapes, needs_shape_exchange


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
    schedule = _schedule(plan)
    rt = RunState(plan, backend, list(inputs_by_rank), device, execution_index)
    if schedule.prepared_by is not backend:  # groups are made once per backend
        backend.prepare_groups(plan.groups())
        schedule.prepared_by = backend
    for r, inputs in inputs_by_rank.items():
        for val, t in zip(program.inputs, inputs):
            if isinstance(val, TensorView) and t is not None and on_rank(program.state[val], r):
                rt.values[r][val] = t
    ctxs = {r: schedule.context(r, device, execution_index) for r in rt.local_ranks}
    profiled = profiler.active()
    for step in schedule.steps:
        if profiled:
            _profiled(rt, step, ctxs)
        else:
            _run_expr(rt, step, ctxs)
        # drop what no later expr reads, so a rank holds only live tensors
        for tv in step.dead_after:
            for r in rt.local_ranks:
                rt.values[r].pop(tv, None)
    outputs = {}
    for r in rt.local_ranks:
        # ops may return views of their operands (set, permute, slice); an
        # output never shares memory with the caller's inputs, as in nvFuser
        inputs = {t.untyped_storage().data_ptr() for t in inputs_by_rank[r] if isinstance(t, torch.Tensor)}
        outs = []
        for tv in program.outputs:
            if tv in rt.values[r]:
                t = rt.values[r][tv]
                outs.append(t.clone() if t.untyped_storage().data_ptr() in inputs else t)
            else:  # this rank is outside the output's mesh
                outs.append(torch.empty(0, dtype=tv.dtype().torch_dtype, device=device))
        outputs[r] = outs
    return outputs


class _Step:
    """One expr with a tensor result, with what running it needs that is the
    same on every execution of the plan."""

    __slots__ = ("expr", "is_communication", "out_state", "chunking", "dead_after", "operands", "outputs",
                 "cut_results")

    def __init__(self, plan, expr, dead_after: list):
        self.expr = expr
        self.is_communication = expr.op.is_communication
        self.out_state = plan.program.state[expr.tv_outputs[0]]
        self.chunking = None if self.is_communication else streams.chunked_dims(plan, expr)
        self.dead_after = dead_after
        # per input: (TensorView, None), (None, Scalar) or (None, None) with the value itself
        self.operands = [(v, None) if isinstance(v, TensorView) else (None, v) if isinstance(v, Scalar)
                         else (None, None) for v in expr.inputs]
        self.outputs = list(enumerate(expr.tv_outputs))
        # results with axes the op computes whole, cut to this device's block after
        self.cut_results = None if self.is_communication else {
            i for i in range(len(expr.tv_outputs)) if any(result_only_axes(expr, plan.program.rule(expr), i))}


class _Schedule:
    """A plan's exprs ready to run, and each rank's EvalContext (whose
    answers depend only on the plan), built on the first execution and
    reused by the next ones."""

    def __init__(self, plan):
        program = plan.program
        last_use = _last_uses(program)
        keep = set(program.outputs)
        self.plan = plan
        self.steps = []
        for index, expr in enumerate(program.exprs):
            if not expr.tv_outputs:
                continue  # scalar arithmetic: evaluated once from the sizes
            dead = [tv for tv in dict.fromkeys(expr.tv_inputs + expr.tv_outputs)
                    if last_use.get(tv, -1) <= index and tv not in keep]
            self.steps.append(_Step(plan, expr, dead))
        self.prepared_by = None
        self._contexts: dict = {}

    def context(self, rank: int, device, execution_index: int) -> EvalContext:
        ctx = self._contexts.get((rank, device))
        if ctx is None:
            ctx = self._contexts[(rank, device)] = EvalContext(self.plan.program, self.plan.sizes, rank, device)
        ctx.execution_index = execution_index
        return ctx


def _schedule(plan) -> _Schedule:
    schedule = getattr(plan, "_schedule", None)
    if schedule is None:
        schedule = plan._schedule = _Schedule(plan)
    return schedule


def _last_uses(program) -> dict:
    """TensorView -> index of the last expr that reads it."""
    last = {}
    for index, expr in enumerate(program.exprs):
        for tv in expr.tv_inputs:
            last[tv] = index
    return last


def _run_expr(rt: RunState, step: _Step, ctxs: dict) -> None:
    expr = step.expr
    if step.is_communication:
        expr.op.run(expr, rt)
        return
    mesh = step.out_state.mesh
    for r in rt.local_ranks:
        if mesh is not None and not mesh.has(r):
            continue
        values = rt.values[r]
        args = []
        for tv, v in step.operands:
            if tv is not None:
                t = values.get(tv)
                if t is None:
                    raise NvShardError(f"rank {r}: {tv.short_name()} is not available for {expr.op.name}")
                args.append(t)
            elif v is not None:
                args.append(rt.sizes.scalar(v))
            else:
                args.append(expr.inputs[len(args)])
        ctx = ctxs[r]
        ctx.bind(expr)
        if step.chunking is not None:  # a stream-parallel result: run in chunks
            results = streams.run_in_chunks(expr, args, ctx, *step.chunking)
        else:
            results = expr.op.evaluate(expr, args, ctx)
        for (i, tv), t in zip(step.outputs, results):
            values[tv] = localize_result_only(ctx, expr, i, t) if i in step.cut_results else t


_SCHEDULERS = {"pointwise": "pointwise", "reduction": "reduction"}


def _moves_nothing(rt: RunState, expr) -> bool:
    """A collective over a mesh axis of one device."""
    step = expr.attrs.get("step")
    mesh = rt.program.state[expr.tv_outputs[0]].mesh
    if step is None or mesh is None or expr.op.collective.between_meshes:
        return False
    return step.mesh_axis is None or mesh.axis_size(step.mesh_axis) == 1


def _profiled(rt: RunState, step: _Step, ctxs: dict) -> None:
    """Run one expr and record it with the open PythonProfilers."""
    expr = step.expr
    before = {r: rt.backend.received.get(r, 0.0) for r in rt.local_ranks}
    start = time.perf_counter()
    _run_expr(rt, step, ctxs)
    elapsed_ms = (time.perf_counter() - start) * 1e3
    family = type(expr.op).__module__.rsplit(".", 1)[-1]
    scheduler = "communication" if expr.op.is_communication else _SCHEDULERS.get(family, "expr_eval")
    if expr.op.is_communication and expr.op.collective.local:
        scheduler = "expr_eval"  # a slice moves no data
    elif expr.op.is_communication and _moves_nothing(rt, expr):
        return  # a collective over one device: nvFuser lowers no communication for it

    def nbytes(tvs):
        return sum(t.numel() * t.element_size() for r in rt.local_ranks for tv in tvs
                   if isinstance(t := rt.values[r].get(tv), torch.Tensor))

    profiler.record(profiler.KernelProfile(
        name=expr.op.name, scheduler=scheduler, segment_id=0, device=rt.local_ranks[0] if rt.local_ranks else 0,
        time_ms=elapsed_ms, input_bytes=nbytes(expr.tv_inputs), output_bytes=nbytes(expr.tv_outputs),
        received_bytes=sum(rt.backend.received.get(r, 0.0) - before[r] for r in rt.local_ranks)))


class FusionExecutor:
    """What `fd.execute` uses: caches one plan per set of global input shapes."""

    def __init__(self, fusion):
        self.fusion = fusion
        self._plans: dict = {}
        self.executions = 0
        self.last_plan = None
        self.last_backend: Optional[Backend] = None
        self._world_checked: set = set()  # (plan key, world size, rank) already checked
        # questions of the definition alone, answered on the first execute (the plans cached
        # by input shapes assume the definition no longer changes either)
        self._divisors: dict = {}  # rank -> shard_divisors
        self._exchanges: dict = {}  # world size -> needs_shape_exchange

    def plan_for(self, global_shapes: list, scalar_values: dict, options=None):
        from ..preseg.pipeline import build_plan

        key = (tuple(tuple(s) if isinstance(s, (list, tuple, torch.Size)) else s for s in global_shapes),
               tuple(sorted((v.name, scalar_values[v]) for v in scalar_values)), options)
        if key not in self._plans:
            self._plans[key] = build_plan(self.fusion, global_shapes, scalar_values, options)
        return self._plans[key]

    def _check_world(self, plan, world_size: int, rank: int) -> None:
        if (id(plan), world_size, rank) not in self._world_checked:
            plan.check_world(world_size, rank)
            self._world_checked.add((id(plan), world_size, rank))

    def execute(self, inputs: list, device=None):
        comm = Communicator.instance()
        rank = comm.rank()
        divisors = self._divisors.get(rank)
        if divisors is None:
            divisors = self._divisors[rank] = shard_divisors(self.fusion, rank)
        global_shapes, scalars = global_input_shapes(self.fusion, inputs, rank, divisors)
        device = _device_of(inputs, device)
        if comm.size() not in self._exchanges:
            self._exchanges[comm.size()] = comm.size() > 1 and needs_shape_exchange(self.fusion, comm.size())
        if self._exchanges[comm.size()]:
            from .distributed import distributed_backend

            global_shapes = agree_on_global_shapes(self.fusion, global_shapes,
                                                   distributed_backend(device).all_gather_object)
        plan = self.plan_for(global_shapes, scalars)
        self._check_world(plan, comm.size(), rank)
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


def shard_divisors(fusion, rank: int) -> list:
    """Per fusion input: per dim, how many times the global extent is this
    rank's shard (None: a scalar, or a tensor not on this rank)."""
    out = []
    for val in fusion.inputs():
        if not isinstance(val, TensorView) or (val.mesh is not None and not val.mesh.has(rank)):
            out.append(None)
            continue
        layouts = val.layouts()
        sizes = val.mesh.axis_sizes() if val.mesh is not None else {}
        out.append([layout.local_numel_divisor(layouts[i], sizes) if val.mesh is not None and layouts[i] else 1
                    for i in val.non_reduction_axes()])
    return out


def global_input_shapes(fusion, inputs: list, rank: int, divisors: Optional[list] = None):
    """Check execute()'s inputs against the definition and recover the
    global shape of each input from this rank's shard (`divisors`: what
    shard_divisors(fusion, rank) returns, computed when not given)."""
    if divisors is None:
        divisors = shard_divisors(fusion, rank)
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
        shapes.append([extent * divisor for extent, divisor in zip(t.shape, divisors[k])])
    return shapes, scalars


class MultiDeviceExecutorParams:
    """nvfuser_direct.multidevice.MultiDeviceExecutorParams. backend_type
    picks the communicator library (nccl and ucc: nvshard's process groups;
    cuda needs CUDA devices). The stream options shape how nvFuser overlaps
    chunks on CUDA streams; on CPU, chunks run in order and give the same
    results, so they are accepted and recorded."""

    def __init__(self):
        from ..multidevice.communicator import CommunicatorBackend

        self.backend_type = CommunicatorBackend.nccl
        self.use_allocation_cache = False
        self.offset_stream_indexing_by_rank = False
        self.number_of_streams = 3
        self.inter_stream_synchronization = False


class MultiDeviceExecutor:
    """nvfuser_direct.multidevice.MultiDeviceExecutor: runs a fusion on this
    rank's input shards, like fd.execute."""

    def __init__(self, fusion, params: Optional[MultiDeviceExecutorParams] = None):
        from ..ir.nodes import CudaRequiredError, Fusion
        from ..multidevice.communicator import CommunicatorBackend

        if not isinstance(fusion, Fusion):
            raise NvShardError(f"MultiDeviceExecutor expects fd.fusion, got {type(fusion).__name__}")
        self.params = params if params is not None else MultiDeviceExecutorParams()
        if not isinstance(self.params.backend_type, CommunicatorBackend):
            raise NvShardError(f"MultiDeviceExecutorParams.backend_type must be a CommunicatorBackend, "
                               f"got {self.params.backend_type!r}")
        if self.params.backend_type is CommunicatorBackend.cuda and not torch.cuda.is_available():
            raise CudaRequiredError("needs CUDA: CommunicatorBackend.cuda (copy engines and CUDA IPC between GPUs)")
        self._executor = FusionExecutor(fusion)

    def run(self, args) -> list:
        return self._executor.execute(list(args))
