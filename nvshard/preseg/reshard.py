"""Turning one sharding of a tensor into another as single-mesh-axis steps.

Both the propagation cost model and the DecomposeReshardings pass call
`plan_reshard`, so the bytes a decision is charged are the bytes the plan
moves. Steps, each over one mesh axis:

  slice           keep this device's block (no data moves)
  reduce_scatter  sum pending partials and keep one block of an axis
  all_to_all      move a mesh axis from one tensor axis to another
  allreduce       sum pending partials, keep everything
  allgather       collect the blocks of an axis
  broadcast       copy a tensor from one mesh to the devices of another
  send_recv       move shards between meshes of one shape, device to device

Shrinking steps come first and growing ones last, so each collective moves
as little as the layouts allow (bytes are proportional to the local size
when a step runs). Bytes are those a device receives:

  allgather (d-1)*in, reduce_scatter (d-1)/d*in, allreduce 2(d-1)/d*size,
  all_to_all (d-1)/d*size, broadcast and send_recv: size
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Optional

from ..multidevice import layout
from .program import TvState


@dataclass
class Step:
    kind: str
    mesh_axis: Optional[str]
    axis: Optional[int]  # logical axis the step takes the mesh axis from (or slices)
    dst_axis: Optional[int]  # logical axis it scatters onto (reduce_scatter, all_to_all)
    before: TvState
    after: TvState
    bytes: float  # received per device
    group_size: int = 1

    def describe(self, tv_name: str) -> str:
        where = f" over DID{self.mesh_axis}" if self.mesh_axis else ""
        return f"{self.kind} {tv_name}{where} {format_bytes(self.bytes)}"


def format_bytes(n: float) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.2f} KiB"
    return f"{n:.0f} B"


def _subsets(items):
    items = list(items)
    for r in range(len(items) + 1):
        yield from itertools.combinations(items, r)


def gather_and_slice_sets(src: tuple, dst: tuple, sizes: dict):
    """Smallest set of mesh digits to gather from `src` so that inserting the
    remaining digits of `dst` (slices) yields `dst`."""
    if layout.same(src, dst):
        return (), ()
    src_axes = layout.mesh_axes_of(src)
    dst_axes = layout.mesh_axes_of(dst)
    # gathering digits that dst does not use is always needed; try those first
    needed = [m for m in src_axes if m not in dst_axes]
    optional = [m for m in src_axes if m in dst_axes]
    for extra in _subsets(optional):
        gather = tuple(needed) + tuple(extra)
        base = src
        for m in gather:
            base = layout.without(base, m, sizes)
        kept = set(layout.mesh_axes_of(base))
        slices = tuple(m for m in dst_axes if m not in kept)
        target = dst
        for m in slices:
            target = layout.without(target, m, sizes)
        if layout.same(base, target):
            return gather, slices
    raise AssertionError(f"no way from {src} to {dst}")  # gathering everything always works


class NumelModel:
    """Local element counts of a tensor for a state; `extent(tv, k)` is the
    global extent of logical axis k (a number, possibly an estimate)."""

    def __init__(self, extent: Callable):
        self.extent = extent

    def local_numel(self, tv, state: TvState) -> float:
        n = 1.0
        sizes = state.mesh.axis_sizes() if state.mesh is not None else {}
        for k, id_ in enumerate(tv.logical):
            if id_.is_reduction() or id_.is_broadcast():
                continue  # expanded axes travel as one element, re-expanded after
            e = self.extent(tv, k)
            digits = state.layouts[k]
            if digits:
                e = e / layout.local_numel_divisor(digits, sizes)
            n *= e
        return n

    def full_numel(self, tv) -> float:
        n = 1.0
        for k, id_ in enumerate(tv.logical):
            if not id_.is_reduction() and not id_.is_broadcast():
                n *= self.extent(tv, k)
        return n


def plan_reshard(tv, src: TvState, dst: TvState, model: NumelModel) -> list[Step]:
    itemsize = tv.dtype().itemsize
    if src.mesh is not None and dst.mesh is not None and src.mesh != dst.mesh:
        return _cross_mesh(tv, src, dst, model, itemsize)
    mesh = dst.mesh if dst.mesh is not None else src.mesh
    if mesh is None:
        return []
    sizes = mesh.axis_sizes()
    cur = TvState(mesh, list(src.layouts))
    steps: list[Step] = []

    def add(kind, m, axis, dst_axis, new_layouts, factor):
        nonlocal cur
        after = TvState(mesh, new_layouts)
        numel = model.local_numel(tv, cur)
        steps.append(Step(kind, m, axis, dst_axis, cur, after, factor * numel * itemsize,
                          sizes[m] if m else 1))
        cur = after

    iteration = [k for k, id_ in enumerate(tv.logical) if not id_.is_reduction()]
    reduction = [k for k, id_ in enumerate(tv.logical) if id_.is_reduction()]
    expanded = {k for k in iteration if tv.logical[k].is_broadcast()}
    # Expanded broadcast axes hold one value per position: re-lay them out locally.
    free = list(cur.layouts)
    changed = False
    for k in expanded:
        if not layout.same(free[k], dst.layouts[k]):
            free[k] = dst.layouts[k]
            changed = True
    if changed:
        add("slice", None, None, None, free, 0.0)

    gathers, slices = {}, {}
    for k in iteration:
        g, s = gather_and_slice_sets(cur.layouts[k], dst.layouts[k], sizes)
        gathers[k], slices[k] = list(g), list(s)
    pending = [m for k in reduction for m in layout.mesh_axes_of(cur.layouts[k])]
    keep_pending = {m for k in reduction for m in layout.mesh_axes_of(dst.layouts[k])}
    pending = [m for m in pending if m not in keep_pending]
    used = {m for k in iteration for m in layout.mesh_axes_of(cur.layouts[k])}

    def slice_target(m):
        for k in iteration:
            if m in slices[k]:
                return k
        return None

    def insert(layouts, k, m):
        """dst's layout of axis k restricted to the digits present so far."""
        present = set(layout.mesh_axes_of(layouts[k])) | {m}
        target = dst.layouts[k]
        for other in layout.mesh_axes_of(target):
            if other not in present:
                target = layout.without(target, other, sizes)
        return target

    def clear_pending(layouts, m):
        out = list(layouts)
        for k in reduction:
            if m in layout.mesh_axes_of(out[k]):
                out[k] = layout.without(out[k], m, sizes)
        return out

    # 1. slices onto axes that gather nothing, with free mesh axes
    for k in iteration:
        for m in list(slices[k]):
            if gathers[k] or m in used or m in pending:
                continue
            new = list(cur.layouts)
            new[k] = insert(new, k, m)
            add("slice", m, k, k, new, 0.0)
            slices[k].remove(m)
            used.add(m)
    # 2. reduce-scatter pending sums onto their target axes
    for m in list(pending):
        k = slice_target(m)
        if k is None or gathers[k] or m in used:
            continue
        new = clear_pending(cur.layouts, m)
        new[k] = insert(new, k, m)
        add("reduce_scatter", m, None, k, new, (sizes[m] - 1) / sizes[m])
        slices[k].remove(m)
        pending.remove(m)
        used.add(m)
    # 3. all-to-all: a mesh axis moving between two axes
    for a in iteration:
        for m in list(gathers[a]):
            b = slice_target(m)
            if b is None or b == a or gathers[b] or m in pending:
                continue
            new = list(cur.layouts)
            new[a] = layout.without(new[a], m, sizes)
            new[b] = insert(new, b, m)
            add("all_to_all", m, a, b, new, (sizes[m] - 1) / sizes[m])
            gathers[a].remove(m)
            slices[b].remove(m)
    # 4. allreduce pending sums that stay replicated (or whose target still gathers)
    for m in list(pending):
        if slice_target(m) is not None and m not in used:
            continue
        new = clear_pending(cur.layouts, m)
        add("allreduce", m, None, None, new, 2 * (sizes[m] - 1) / sizes[m])
        pending.remove(m)
    # 5. allgathers
    for k in iteration:
        for m in list(gathers[k]):
            new = list(cur.layouts)
            new[k] = layout.without(new[k], m, sizes)
            add("allgather", m, k, None, new, sizes[m] - 1)
            gathers[k].remove(m)
            used.discard(m)
    # 6. pending sums whose target axis had to gather first
    for m in list(pending):
        k = slice_target(m)
        new = clear_pending(cur.layouts, m)
        new[k] = insert(new, k, m)
        add("reduce_scatter", m, None, k, new, (sizes[m] - 1) / sizes[m])
        slices[k].remove(m)
        pending.remove(m)
    # 7. the remaining slices
    for k in iteration:
        for m in list(slices[k]):
            new = list(cur.layouts)
            new[k] = insert(new, k, m)
            add("slice", m, k, k, new, 0.0)
    return steps


def _cross_mesh(tv, src: TvState, dst: TvState, model: NumelModel, itemsize: int) -> list[Step]:
    """Between two meshes: device-to-device copies when both have the same
    shape and the shards line up, otherwise replicate on the source mesh,
    broadcast from its first device, and slice on the destination."""
    same_shape = src.mesh.shape == dst.mesh.shape
    if same_shape and not src.pending(tv) and all(layout.same(a, b) for a, b in zip(src.layouts, dst.layouts)):
        numel = model.local_numel(tv, src)
        return [Step("send_recv", None, None, None, src, dst, numel * itemsize)]
    replicated = [() for _ in tv.logical]
    steps = plan_reshard(tv, src, TvState(src.mesh, replicated), model)
    on_dst = TvState(dst.mesh, replicated)
    steps.append(Step("broadcast", None, None, None, TvState(src.mesh, replicated), on_dst,
                      model.full_numel(tv) * itemsize))
    steps += plan_reshard(tv, on_dst, dst, model)
    return steps


def total_bytes(steps: list[Step]) -> float:
    return sum(s.bytes for s in steps)
