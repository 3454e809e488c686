"""Which device holds which block of a tensor: a text picture of one 1-D or
2-D slice of a TensorView's layout on its mesh, in the spirit of JAX's
`jax.debug.visualize_array_sharding`, for any nvshard layout (outer and
inner splits, nested mesh axes, pending sums).

    print(nvshard.sharding_text(plan, tv))                 # 1-D / 2-D tensors
    print(nvshard.sharding_text(plan, tv, dims=(1, 3)))    # axes 1 and 3, index 0 of the others
    nvshard.visualize_sharding(plan, tv)                   # the same, coloured, on the terminal

Each cell is a run of consecutive elements owned by the same mesh
coordinates, labelled with the devices that hold it; row and column
headers give the element ranges. Axes other than `dims` are fixed at
`index` (default 0), which selects the devices that own that index.
"""

from __future__ import annotations

import io
from typing import Optional, Sequence

from ..ir.nodes import NvShardError, TensorView
from ..multidevice import layout

MAX_RUNS = 8  # blocks shown per axis; a longer (cyclic) pattern is cut with an ellipsis


def _owner(segs: list, e: int) -> dict:
    """The mesh coordinates owning element e of an axis laid out as segs."""
    owner = {}
    for name, size in reversed(segs):
        if name is not None:
            owner[name] = e % size
        e //= size
    return owner


def _owner_runs(digits, extent: int, mesh_sizes: dict, bindings, limit: int) -> list:
    """[(start, stop, {mesh axis: coordinate})] runs of consecutive elements
    with the same owners along one axis; at most limit + 1 of them, the last
    reaching the end of the axis."""
    segs = layout.segments(digits, extent, mesh_sizes, bindings)
    # owners change only every `step` elements: the local block inside the innermost mesh digit
    step = 1
    for name, size in reversed(segs):
        if name is not None:
            break
        step *= size
    runs: list = []
    for e in range(0, extent, step):
        owner = _owner(segs, e)
        if runs and runs[-1][2] == owner:
            runs[-1][1] = e + step
        elif len(runs) == limit:
            runs.append([e, extent, None])  # the rest, not drawn
            break
        else:
            runs.append([e, e + step, owner])
    return [tuple(r) for r in runs]


class ShardingPicture:
    """The blocks of one slice: rows x columns of device lists."""

    def __init__(self, plan, tv: TensorView, dims: Optional[Sequence[int]] = None,
                 index: Optional[Sequence[int]] = None):
        if plan.sizes is None:
            raise NvShardError(f"{tv.short_name()}: the sharding picture needs concrete sizes; "
                               f"plan with nvshard.propagate_shardings(fd, input_shapes)")
        state = plan.program.state.get(tv)
        if state is None:
            raise NvShardError(f"{tv} is not a TensorView of this plan")
        axes = tv.non_reduction_axes()
        ndim = len(axes)
        if dims is None:
            if ndim > 2:
                raise NvShardError(f"{tv.short_name()} has {ndim} axes: choose one or two with dims=(a, b)")
            dims = tuple(range(ndim))
        dims = tuple(d % ndim if ndim else d for d in dims)
        if not 1 <= len(dims) <= 2 or len(set(dims)) != len(dims) or any(not 0 <= d < ndim for d in dims):
            raise NvShardError(f"{tv.short_name()}: dims must be one or two distinct axes of 0..{ndim - 1}, "
                               f"got {tuple(dims)}")
        shape = plan.sizes.global_shape(tv)
        index = list(index) if index is not None else [0] * ndim
        if len(index) != ndim or any(not 0 <= i < s for i, s in zip(index, shape)):
            raise NvShardError(f"{tv.short_name()}: index must give one position per axis within {shape}, "
                               f"got {index}")
        self.tv, self.dims, self.shape, self.index = tv, dims, shape, index
        self.mesh = state.mesh
        mesh_sizes = state.mesh.axis_sizes() if state.mesh is not None else {}
        bindings = plan.sizes.bindings
        self.layouts = [state.layouts[k] for k in axes]
        # the devices of the slice: fixed axes pin the coordinates of their mesh axes
        fixed: dict = {}
        for d in range(ndim):
            if d not in dims and self.layouts[d]:
                fixed.update(_owner(layout.segments(self.layouts[d], shape[d], mesh_sizes, bindings), index[d]))
        self.runs = [_owner_runs(self.layouts[d], shape[d], mesh_sizes, bindings, MAX_RUNS) for d in dims]
        self.pending = state.pending(tv)
        self.cells = []
        row_runs = self.runs[0] if len(dims) == 2 else [(0, 1, {})]
        col_runs = self.runs[-1]
        for _, _, row_owner in row_runs[:MAX_RUNS]:
            self.cells.append([self._devices({**fixed, **row_owner, **col_owner})
                               for _, _, col_owner in col_runs[:MAX_RUNS]])

    def _devices(self, want: dict) -> list:
        if self.mesh is None:
            return []  # on every device
        return [dev for dev in self.mesh.vector
                if all(self.mesh.coords(dev)[m] == c for m, c in want.items())]

    def title(self) -> str:
        desc = ", ".join(f"axis {d}: {layout.describe(self.layouts[d])}" for d in range(len(self.shape)))
        what = f"{self.tv.short_name()} {self.tv.dtype()}{self.shape}"
        where = f" on {self.mesh}" if self.mesh is not None else " on every device"
        line = f"{what}{where} ({desc})"
        others = [d for d in range(len(self.shape)) if d not in self.dims]
        if others:
            line += "; slice at " + ", ".join(f"axis {d} = {self.index[d]}" for d in others)
        if self.pending:
            line += "; pending sum over " + ", ".join("DID" + m for m in self.pending) + ": each block is partial"
        return line


def _range(run) -> str:
    start, stop, _ = run
    return f"{start}" if stop == start + 1 else f"{start}:{stop}"


def _cut(items: list, limit: int) -> tuple:
    return (items[:limit], True) if len(items) > limit else (items, False)


def _table(pic: ShardingPicture, colour: bool):
    from rich import box
    from rich.table import Table
    from rich.text import Text

    palette = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta"]
    two_d = len(pic.dims) == 2
    cols, cols_cut = _cut(pic.runs[-1], MAX_RUNS)
    rows_all = pic.runs[0] if two_d else [(0, 1, {})]
    rows, rows_cut = _cut(rows_all, MAX_RUNS)
    table = Table(box=box.SQUARE, show_lines=True, padding=(0, 1))
    corner = f"axis {pic.dims[0]} \\ axis {pic.dims[-1]}" if two_d else f"axis {pic.dims[0]}"
    table.add_column(corner if two_d else "", justify="right", no_wrap=True)
    for run in cols:
        table.add_column(_range(run), justify="center", no_wrap=True)
    if cols_cut:
        table.add_column("...", justify="center")
    groups: dict = {}
    for r, run in enumerate(rows):
        label = _range(run) if two_d else corner
        cells = []
        for c in range(len(cols)):
            devices = pic.cells[r][c]
            text = " ".join(map(str, devices)) if pic.mesh is not None else "all"
            style = palette[groups.setdefault(tuple(devices), len(groups)) % len(palette)] if colour else None
            cells.append(Text(text, style=style))
        if cols_cut:
            cells.append(Text("..."))
        table.add_row(label, *cells)
    if rows_cut:
        table.add_row("...", *["..." for _ in range(len(cols) + cols_cut)])
    return table


def sharding_text(plan, tv: TensorView, dims: Optional[Sequence[int]] = None,
                  index: Optional[Sequence[int]] = None, width: int = 120) -> str:
    """The picture as plain text (no colour): for logs and tests."""
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, force_terminal=False, highlight=False)
    pic = ShardingPicture(plan, tv, dims, index)
    console.print(pic.title(), soft_wrap=True)
    console.print(_table(pic, colour=False))
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def visualize_sharding(plan, tv: TensorView, dims: Optional[Sequence[int]] = None,
                       index: Optional[Sequence[int]] = None, console=None) -> None:
    """Print the picture, each device group in its own colour on a terminal."""
    from rich.console import Console

    console = console or Console(highlight=False)
    pic = ShardingPicture(plan, tv, dims, index)
    console.print(pic.title(), soft_wrap=True)
    console.print(_table(pic, colour=True))


__all__ = ["ShardingPicture", "sharding_text", "visualize_sharding"]
