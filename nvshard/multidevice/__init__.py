"""nvfuser_direct.multidevice: DeviceMesh, Communicator, shard_tensor."""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import NvShardError
from . import layout
from .communicator import Communicator
from .mesh import DeviceMesh


def shard_tensor(t: torch.Tensor, tv, rank: Optional[int] = None) -> torch.Tensor:
    """This rank's shard of the unsharded tensor `t`, as `tv`'s annotation
    lays it out (any split, inner or outer, on any mesh axis); a view of `t`
    where the layout allows one (outer splits), so sharding copies nothing."""
    if tv.mesh is None:
        return t
    rank = Communicator.instance().rank() if rank is None else rank
    coords = tv.mesh.coords(rank)
    if coords is None:
        raise NvShardError(f"rank {rank} is not in {tv.short_name()}'s mesh {tv.mesh}")
    layouts = tv.layouts()
    axes = tv.non_reduction_axes()
    if t.dim() != len(axes):
        raise NvShardError(f"{tv.short_name()} has rank {len(axes)}; got a tensor of shape {tuple(t.shape)}")
    sizes = tv.mesh.axis_sizes()
    for d, k in enumerate(axes):
        digits = layouts[k]
        if not digits:
            continue
        try:
            segs = layout.segments(digits, t.shape[d], sizes, _bindings(tv.logical[k].extent(), t.shape[d]))
        except (layout.ShardingError, KeyError, ValueError):
            raise NvShardError(
                f"{tv.short_name()}: axis {d} has extent {t.shape[d]}, which "
                f"{layout.describe(digits)} ({layout.local_numel_divisor(digits, sizes)} devices) does not divide"
            ) from None
        t = layout.take_local(t, d, segs, coords)
    return t


def _bindings(extent, value: int) -> dict:
    """Bind the axis's symbolic extent to the tensor's, so split sizes like
    ceilDiv(i0, 2) evaluate."""
    c = extent.canonical()
    if len(c.syms) == 1:
        return {c.syms[0]: int(value / c.coef)}
    return {}


# nvshard/__init__.py adds MultiDeviceExecutor(Params) from the runtime, which imports this package.
__all__ = ["Communicator", "DeviceMesh", "shard_tensor"]
