"""Every kind of reshard step, declared once: its name in plans and printMath,
the bytes a device receives, how it moves a tensor's local blocks, and how
each backend (simulated ranks in one process, torch.distributed) exchanges
the buffers.

The reshard planner (preseg/reshard.py) decides which steps to take and
names them by `kind`; the communication op (ops/communication.py) prints and
runs them through this table; the backends (runtime/backends.py) only count
bytes and hold process groups. Bytes received per device are
`factor(d) * bytes of the device's local input`, d the group size:

  slice           0           keep this device's block (no data moves)
  allgather       d-1         collect the blocks of a mesh axis
  reduce_scatter  (d-1)/d     sum pending partials, keep one block
  allreduce       2(d-1)/d    sum pending partials, keep everything
  all_to_all      (d-1)/d     move a mesh axis to another tensor axis, or
                              inside one axis (cyclic <-> block)
  broadcast       1           one mesh's tensor to another mesh's devices
  send_recv       1           shards between meshes of one shape

A step's `run(rt, step, src, dst, before, after)` reads this process's
ranks' local blocks of `src` from rt.values and writes those of `dst`; `rt`
is the executor's RunState (values, local_ranks, sizes, backend, program).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import layout


def format_bytes(n: float) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.2f} KiB"
    return f"{n:.0f} B"


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass(frozen=True)
class Collective:
    kind: str  # Step.kind, Communication.kind
    printed: str  # printMath name
    short: str  # in benchmark tables
    factor: Callable[[int], float]  # bytes received per device / local input bytes, for group size d
    run: Callable  # (rt, step, src, dst, before, after): move this process's ranks' data
    # The exchange of buffers, per backend; None for local steps:
    simulate: Optional[Callable] = None  # (group, payload) -> {rank: result}, every rank in this process
    distributed: Optional[Callable] = None  # (rank, process_group or None alone, group, payload) -> this rank's result
    # Bytes a rank received, measured from the buffers: (group, rank, payload, results) -> bytes, or None for
    # a rank that only sends (a broadcast's root, a send's source)
    measured: Optional[Callable] = None
    # The device groups of a step (step -> [[device, ...], ...]) and which devices of a group receive
    groups: Callable = lambda step: step.after.mesh.groups(step.mesh_axis)
    receivers: Callable = lambda group: list(group)
    local: bool = False  # moves no data between devices (slice)
    between_meshes: bool = False  # from one mesh to another (broadcast, send_recv), not over a mesh axis


COLLECTIVES: dict[str, Collective] = {}


def declare(c: Collective) -> Collective:
    COLLECTIVES[c.kind] = c
    return c


def collective(kind: str) -> Collective:
    return COLLECTIVES[kind]


# -- local blocks of one tensor -------------------------------------------------------


def _dim(tv, k: int) -> int:
    """Local tensor dim of logical axis k (reduction axes are not stored)."""
    return tv.non_reduction_axes().index(k)


def _segs(rt, tv, state, k):
    extent = rt.sizes.global_extent(tv, _dim(tv, k))
    return layout.segments(state.layouts[k], extent, state.mesh.axis_sizes(), rt.sizes.bindings)


def _strip(tv, t):
    """Expanded broadcast axes travel as one element."""
    for d, k in enumerate(tv.non_reduction_axes()):
        if tv.logical[k].is_broadcast() and t.shape[d] != 1:
            t = t.narrow(d, 0, 1)
    return t


def _unstrip(rt, tv, state, t):
    shape = list(t.shape)
    changed = False
    for d, k in enumerate(tv.non_reduction_axes()):
        id_ = tv.logical[k]
        if id_.is_broadcast() and id_.expanded is not None:
            extent = rt.sizes.global_extent(tv, d)
            digits = state.layouts[k]
            if digits and state.mesh is not None:
                extent //= layout.local_numel_divisor(digits, state.mesh.axis_sizes())
            if shape[d] != extent:
                shape[d] = extent
                changed = True
    return t.expand(shape) if changed else t


def _members(rt, group, tv):
    return [r for r in group if r in rt.local_ranks and tv in rt.values[r]]


def _local(rt, r, tv):
    return _strip(tv, rt.values[r][tv])


# -- slice: local -------------------------------------------------------------------------


def _run_slice(rt, step, src, dst, before, after):
    for r in rt.local_ranks:
        if src not in rt.values.get(r, {}) or not after.mesh.has(r):
            continue
        t = _local(rt, r, src)
        if step.mesh_axis is not None:
            k = step.axis
            d = _dim(src, k)
            chunks = layout.expose(t, d, _segs(rt, dst, after, k), step.mesh_axis)
            t = chunks.select(d, after.mesh.coords(r)[step.mesh_axis])
        rt.values[r][dst] = _unstrip(rt, dst, after, t)


declare(Collective("slice", "Slice", "SL", lambda d: 0.0, _run_slice, local=True))


# -- allgather ----------------------------------------------------------------------------


def _run_allgather(rt, step, src, dst, before, after):
    k, m = step.axis, step.mesh_axis
    d = _dim(src, k)
    segs = _segs(rt, src, before, k)
    for group in after.mesh.groups(m):
        members = _members(rt, group, src)
        if members:
            pieces = rt.backend.exchange("allgather", group, {r: _local(rt, r, src) for r in members})
            for r in members:
                rt.values[r][dst] = _unstrip(rt, dst, after, layout.insert_gathered(pieces[r], d, segs, m))


# The result of an allgather is the group's blocks stacked in one tensor
# [group size, *block]: a single buffer that gloo and NCCL fill in one call.


def _simulate_allgather(group, tensors):
    stacked = torch.stack([tensors[r] for r in group])
    return {r: stacked for r in group}  # nothing writes into a result


def _distributed_allgather(rank, pg, group, tensors):
    t = tensors[rank].contiguous()
    if pg is None:
        return t.unsqueeze(0)
    stacked = t.new_empty((len(group),) + tuple(t.shape))
    pg.all_gather(stacked, t)
    return stacked


declare(Collective("allgather", "Allgather", "AG", lambda d: d - 1, _run_allgather, _simulate_allgather,
                   _distributed_allgather, lambda group, r, sent, got: (len(group) - 1) * nbytes(sent[r])))


# -- reduce_scatter -----------------------------------------------------------------------


def _run_reduce_scatter(rt, step, src, dst, before, after):
    k, m = step.dst_axis, step.mesh_axis
    d = _dim(dst, k)
    segs = _segs(rt, dst, after, k)
    for group in after.mesh.groups(m):
        members = _members(rt, group, src)
        if members:
            # [group size, *block]: chunk c is what the peer with coordinate c keeps
            chunks = {r: layout.expose(_local(rt, r, src), d, segs, m).movedim(d, 0) for r in members}
            out = rt.backend.exchange("reduce_scatter", group, chunks)
            for r in members:
                rt.values[r][dst] = _unstrip(rt, dst, after, out[r])


def _simulate_reduce_scatter(group, chunks):
    out = {}
    for i, r in enumerate(group):
        total = chunks[group[0]][i].clone()
        for other in group[1:]:
            total = total + chunks[other][i]
        out[r] = total
    return out


def _distributed_reduce_scatter(rank, pg, group, chunks):
    if pg is None:
        return chunks[rank][0]
    mine = chunks[rank].contiguous()
    out = mine.new_empty(tuple(mine.shape[1:]))
    pg.reduce_scatter(out, mine)
    return out


declare(Collective("reduce_scatter", "ReduceScatter", "RS", lambda d: (d - 1) / d, _run_reduce_scatter,
                   _simulate_reduce_scatter, _distributed_reduce_scatter,
                   lambda group, r, sent, got: (len(group) - 1) * nbytes(sent[r][group.index(r)])))


# -- allreduce ----------------------------------------------------------------------------


def _run_allreduce(rt, step, src, dst, before, after):
    for group in after.mesh.groups(step.mesh_axis):
        members = _members(rt, group, src)
        if members:
            out = rt.backend.exchange("allreduce", group, {r: _local(rt, r, src) for r in members})
            for r in members:
                rt.values[r][dst] = _unstrip(rt, dst, after, out[r])


def _simulate_allreduce(group, tensors):
    total = tensors[group[0]].clone()
    for r in group[1:]:
        total = total + tensors[r]
    return {r: total.clone() for r in group}


def _distributed_allreduce(rank, pg, group, tensors):
    if pg is None:
        return tensors[rank]
    t = tensors[rank].clone(memory_format=torch.contiguous_format)  # reduced in place
    pg.all_reduce(t)
    return t


declare(Collective("allreduce", "Allreduce", "AR", lambda d: 2 * (d - 1) / d, _run_allreduce, _simulate_allreduce,
                   _distributed_allreduce,
                   lambda group, r, sent, got: 2 * (len(group) - 1) / len(group) * nbytes(sent[r])))


# -- all_to_all ---------------------------------------------------------------------------


def _run_all_to_all(rt, step, src, dst, before, after):
    a, b, m = step.axis, step.dst_axis, step.mesh_axis
    if a == b:  # the mesh digit moves inside one axis (e.g. cyclic -> block)
        d = _dim(src, a)
        refined, ib, ia = layout.exchange_digits(_segs(rt, src, before, a), _segs(rt, dst, after, a), m)

        def chunks_of(t):
            return layout.exchange_chunks(t, d, refined, ib, ia)

        def assemble(pieces):
            return layout.assemble_exchanged(pieces, d, refined, ib, ia)
    else:  # from axis a to axis b
        da, db = _dim(src, a), _dim(src, b)
        segs_a, segs_b = _segs(rt, src, before, a), _segs(rt, dst, after, b)

        def chunks_of(t):
            return list(layout.expose(t, db, segs_b, m).unbind(db))

        def assemble(pieces):
            return layout.insert_gathered(pieces, da, segs_a, m)
    for group in after.mesh.groups(m):
        members = _members(rt, group, src)
        if members:
            received = rt.backend.exchange("all_to_all", group, {r: chunks_of(_local(rt, r, src)) for r in members})
            for r in members:
                rt.values[r][dst] = _unstrip(rt, dst, after, assemble(received[r]))


def _simulate_all_to_all(group, chunks):
    return {r: [chunks[s][j].clone() for s in group] for j, r in enumerate(group)}


def _distributed_all_to_all(rank, pg, group, chunks):
    send = [c.contiguous() for c in chunks[rank]]
    if pg is None:
        return [send[0].clone()]
    recv = [torch.empty_like(c) for c in send]
    pg.all_to_all(recv, send)
    return recv


declare(Collective("all_to_all", "AllToAll", "A2A", lambda d: (d - 1) / d, _run_all_to_all, _simulate_all_to_all,
                   _distributed_all_to_all,
                   lambda group, r, sent, got: sum(nbytes(c) for i, c in enumerate(got[r]) if group[i] != r)))


# -- broadcast (between meshes) ----------------------------------------------------------


def _broadcast_group(before, after) -> list:
    """The source mesh's first device (the root) first, then the destination mesh's devices."""
    root = before.mesh.vector[0]
    return [root] + [dev for dev in after.mesh.vector if dev != root]


def _run_broadcast(rt, step, src, dst, before, after):
    group = _broadcast_group(before, after)
    root = group[0]
    members = [r for r in group if r in rt.local_ranks]
    if not members:
        return
    shape = [1 if id_.is_broadcast() else rt.sizes.global_extent(src, d)
             for d, id_ in enumerate(src.logical[k] for k in src.non_reduction_axes())]
    tensors = {r: _local(rt, r, src) if r == root else
               torch.empty(shape, dtype=src.dtype().torch_dtype, device=rt.device) for r in members}
    out = rt.backend.exchange("broadcast", group, tensors)
    for r in members:
        if after.mesh.has(r):
            rt.values[r][dst] = _unstrip(rt, dst, after, out[r])


def _simulate_broadcast(group, tensors):
    return {r: tensors[group[0]].clone() for r in group}


def _distributed_broadcast(rank, pg, group, tensors):
    if pg is None:
        return tensors[rank]
    t = tensors[rank].clone(memory_format=torch.contiguous_format)  # received in place
    pg.broadcast(t, group[0])
    return t


declare(Collective("broadcast", "Broadcast", "BC", lambda d: 1.0, _run_broadcast, _simulate_broadcast,
                   _distributed_broadcast, lambda group, r, sent, got: nbytes(got[r]) if r != group[0] else None,
                   groups=lambda step: [_broadcast_group(step.before, step.after)],
                   receivers=lambda group: list(group[1:]), between_meshes=True))


# -- send_recv (between meshes of one shape) ---------------------------------------------


def _send_recv_pairs(before, after) -> list:
    """[source, target]: the devices at the same mesh coordinates."""
    return [[a, b] for a, b in zip(before.mesh.vector, after.mesh.vector)]


def _run_send_recv(rt, step, src, dst, before, after):
    for s, t in _send_recv_pairs(before, after):
        tensors = {}
        if s in rt.local_ranks:
            tensors[s] = _local(rt, s, src)
        if t in rt.local_ranks and t not in tensors:
            shape = rt.local_shape(src, before, dev=s)
            tensors[t] = torch.empty(shape, dtype=src.dtype().torch_dtype, device=rt.device)
        if not tensors:
            continue
        out = rt.backend.exchange("send_recv", [s, t], tensors)
        if t in out and t in rt.local_ranks:
            rt.values[t][dst] = _unstrip(rt, dst, after, out[t])


def _simulate_send_recv(pair, tensors):
    return {pair[1]: tensors[pair[0]].clone()}


def _distributed_send_recv(rank, pg, pair, tensors):
    s, t = pair
    if s == t:
        return tensors[s].clone()
    if rank == s:
        pg.isend(tensors[s].contiguous(), t).wait()
        return None  # a source receives nothing
    buf = torch.empty_like(tensors[t])
    pg.irecv(buf, s).wait()
    return buf


declare(Collective("send_recv", "SendRecv", "CP", lambda d: 1.0, _run_send_recv, _simulate_send_recv,
                    _distributed_send_recv,
                    lambda pair, r, sent, got: nbytes(got[r]) if r == pair[1] and pair[0] != pair[1] else None,
                    groups=lambda step: _send_recv_pairs(step.before, step.after),
                    receivers=lambda pair: [pair[1]] if pair[1] != pair[0] else [], between_meshes=True))
