"""Communication exprs inserted by DecomposeReshardings: one per reshard step
(see preseg/reshard.py), each moving data over a single mesh axis. Defined
here like any other op: printing and per-rank execution."""

from __future__ import annotations

import torch

from ..multidevice import layout
from .registry import OpSpec, register

_PRINTED = {
    "slice": "Slice",
    "allgather": "Allgather",
    "reduce_scatter": "ReduceScatter",
    "allreduce": "Allreduce",
    "all_to_all": "AllToAll",
    "broadcast": "Broadcast",
    "send_recv": "SendRecv",
}


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


class CommunicationOp(OpSpec):
    is_communication = True

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind

    def format(self, expr) -> str:
        step = expr.attrs["step"]
        parts = [str(expr.inputs[0])]
        if step.mesh_axis:
            parts.append(f"mesh axis = deviceIdx.{step.mesh_axis}")
        if step.bytes:
            from ..preseg.reshard import format_bytes

            parts.append(f"bytes received per device = {format_bytes(step.bytes)}")
        return f"{expr.outputs[0]}\n   = {_PRINTED[self.kind]}( {', '.join(parts)} )\n"

    # -- execution -----------------------------------------------------------------
    def run(self, expr, rt) -> None:
        src, dst = expr.inputs[0], expr.outputs[0]
        step = expr.attrs["step"]
        before, after = rt.program.state[src], rt.program.state[dst]
        getattr(self, "_" + self.kind)(rt, src, dst, step, before, after)

    def _members(self, rt, group, tv):
        return [r for r in group if r in rt.local_ranks and tv in rt.values[r]]

    def _slice(self, rt, src, dst, step, before, after):
        for r in rt.local_ranks:
            if tv_missing(rt, r, src) or not after.mesh.has(r):
                continue
            t = _strip(src, rt.values[r][src])
            if step.mesh_axis is not None:
                k = step.axis
                d = _dim(src, k)
                chunks = layout.expose(t, d, _segs(rt, dst, after, k), step.mesh_axis)
                t = chunks.select(d, after.mesh.coords(r)[step.mesh_axis])
            rt.values[r][dst] = _unstrip(rt, dst, after, t)

    def _allgather(self, rt, src, dst, step, before, after):
        k, m = step.axis, step.mesh_axis
        d = _dim(src, k)
        segs = _segs(rt, src, before, k)
        for group in after.mesh.groups(m):
            members = self._members(rt, group, src)
            if not members:
                continue
            pieces = rt.backend.all_gather(group, {r: _strip(src, rt.values[r][src]) for r in members})
            for r in members:
                rt.values[r][dst] = _unstrip(rt, dst, after, layout.insert_gathered(pieces[r], d, segs, m))

    def _reduce_scatter(self, rt, src, dst, step, before, after):
        k, m = step.dst_axis, step.mesh_axis
        d = _dim(dst, k)
        segs = _segs(rt, dst, after, k)
        for group in after.mesh.groups(m):
            members = self._members(rt, group, src)
            if not members:
                continue
            chunks = {r: list(layout.expose(_strip(src, rt.values[r][src]), d, segs, m).unbind(d)) for r in members}
            out = rt.backend.reduce_scatter(group, chunks)
            for r in members:
                rt.values[r][dst] = _unstrip(rt, dst, after, out[r])

    def _allreduce(self, rt, src, dst, step, before, after):
        m = step.mesh_axis
        for group in after.mesh.groups(m):
            members = self._members(rt, group, src)
            if not members:
                continue
            out = rt.backend.all_reduce(group, {r: _strip(src, rt.values[r][src]) for r in members})
            for r in members:
                rt.values[r][dst] = _unstrip(rt, dst, after, out[r])

    def _all_to_all(self, rt, src, dst, step, before, after):
        a, b, m = step.axis, step.dst_axis, step.mesh_axis
        if a == b:
            return self._all_to_all_within_axis(rt, src, dst, step, before, after)
        da, db = _dim(src, a), _dim(src, b)
        segs_b = _segs(rt, dst, after, b)
        segs_a = _segs(rt, src, before, a)
        for group in after.mesh.groups(m):
            members = self._members(rt, group, src)
            if not members:
                continue
            chunks = {r: list(layout.expose(_strip(src, rt.values[r][src]), db, segs_b, m).unbind(db))
                      for r in members}
            received = rt.backend.all_to_all(group, chunks)
            for r in members:
                rt.values[r][dst] = _unstrip(rt, dst, after, layout.insert_gathered(received[r], da, segs_a, m))

    def _all_to_all_within_axis(self, rt, src, dst, step, before, after):
        """The mesh digit moves inside one axis (e.g. cyclic -> block)."""
        k, m = step.axis, step.mesh_axis
        d = _dim(src, k)
        refined, ib, ia = layout.exchange_digits(_segs(rt, src, before, k), _segs(rt, dst, after, k), m)
        for group in after.mesh.groups(m):
            members = self._members(rt, group, src)
            if not members:
                continue
            chunks = {r: layout.exchange_chunks(_strip(src, rt.values[r][src]), d, refined, ib, ia) for r in members}
            received = rt.backend.all_to_all(group, chunks)
            for r in members:
                rt.values[r][dst] = _unstrip(rt, dst, after, layout.assemble_exchanged(received[r], d, refined, ib, ia))

    def _broadcast(self, rt, src, dst, step, before, after):
        root = before.mesh.vector[0]
        group = [root] + [dev for dev in after.mesh.vector if dev != root]
        members = [r for r in group if r in rt.local_ranks]
        if not members:
            return
        shape = [1 if id_.is_broadcast() else rt.sizes.global_extent(src, d)
                 for d, id_ in enumerate(src.logical[k] for k in src.non_reduction_axes())]
        tensors = {}
        for r in members:
            if r == root:
                tensors[r] = _strip(src, rt.values[r][src])
            else:
                tensors[r] = torch.empty(shape, dtype=src.dtype().torch_dtype, device=rt.device)
        out = rt.backend.broadcast(group, root, tensors)
        for r in members:
            if after.mesh.has(r):
                rt.values[r][dst] = _unstrip(rt, dst, after, out[r])

    def _send_recv(self, rt, src, dst, step, before, after):
        pairs = []
        for dev in before.mesh.vector:
            idx = before.mesh.coords(dev)
            target = next(d for d in after.mesh.vector if after.mesh.coords(d) == idx)
            pairs.append((dev, target))
        tensors = {}
        for s, t in pairs:
            if s in rt.local_ranks:
                tensors[s] = _strip(src, rt.values[s][src])
            if t in rt.local_ranks and t not in tensors:
                shape = rt.local_shape(src, before, dev=s)
                tensors[t] = torch.empty(shape, dtype=src.dtype().torch_dtype, device=rt.device)
        out = rt.backend.send_recv(pairs, tensors)
        for r, t in out.items():
            if r in rt.local_ranks:
                rt.values[r][dst] = _unstrip(rt, dst, after, t)


def tv_missing(rt, rank, tv) -> bool:
    return tv not in rt.values.get(rank, {})


COMMUNICATIONS = {kind: register(CommunicationOp(kind)) for kind in _PRINTED}
