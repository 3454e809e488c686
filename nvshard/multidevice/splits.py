"""The scheduling calls that give a TensorView's logical axes their layouts
(layout.py), for nvshard's TensorViews (api.annotate_from_dtensor) and real
nvFuser's (nvfuser/writer.py) alike.

Per axis, outermost digit first: a mesh axis is an outer split by its size,
parallelized on it; a local block followed by more digits is an inner split
by their product (an outer split by its own extent when that product is
symbolic); a mesh axis left last is parallelized unsplit. Axes are split
last first, so the loop positions of the axes before them stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import NvShardError
from ..ir.sizes import Size
from . import layout


@dataclass(frozen=True)
class Split:
    kind: str  # "outer" or "inner" split of loop axis `pos`, or "leaf": parallelize it, unsplit
    pos: int
    factor: Optional[int] = None
    mesh_axis: Optional[str] = None  # parallelize loop axis `pos` (after the split) on this mesh axis


def axis_splits(tv_name: str, axis: int, digits, mesh_sizes: dict) -> list:
    """The splits turning logical axis `axis` (at loop position `axis`) into `digits`."""

    def extent(d):
        return Size(mesh_sizes[d]) if isinstance(d, str) else Size.of(d)

    steps, pos = [], axis
    for i, d in enumerate(digits[:-1]):
        if isinstance(d, str):
            steps.append(Split("outer", pos, mesh_sizes[d], d))
        else:
            product = Size(1)
            for r in digits[i + 1:]:
                product = product * extent(r)
            if product.value is not None:
                steps.append(Split("inner", pos, product.value))
            elif extent(d).value is not None:
                steps.append(Split("outer", pos, extent(d).value))
            else:
                raise NvShardError(f"{tv_name} axis {axis}: layout {layout.describe(digits)} needs a split by a "
                                   f"symbolic extent; pass global input shapes")
        pos += 1
    if digits and isinstance(digits[-1], str):
        steps.append(Split("leaf", pos, None, digits[-1]))
    return steps


def tv_splits(tv_name: str, layouts: dict, mesh_sizes: dict) -> list:
    """The splits of every axis in `layouts` (logical axis -> digits), last axis first."""
    steps = []
    for axis in sorted(layouts, reverse=True):
        steps += axis_splits(tv_name, axis, layouts[axis], mesh_sizes)
    return steps


def apply_splits(tv, steps: list, parallel_type: Callable) -> None:
    """Schedule `tv`, an nvshard or a real nvFuser TensorView (same calls);
    parallel_type: mesh axis name -> that frontend's ParallelType."""
    for step in steps:
        if step.kind == "outer":
            tv.outer_split(step.pos, step.factor)
        elif step.kind == "inner":
            tv.inner_split(step.pos, step.factor)
        if step.mesh_axis is not None:
            tv.axis(step.pos).parallelize(parallel_type(step.mesh_axis))
