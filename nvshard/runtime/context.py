"""What an op's torch evaluation may ask about the device it runs on."""

from __future__ import annotations

import hashlib

import torch

from ..multidevice import layout
from ..preseg.projection import result_only_axes


class EvalContext:
    """One rank's answers for one plan. Shapes, coordinates and flags depend
    only on the plan (its sizes are bound), so each is computed once and
    kept: the executor reuses a context across executions of the plan."""

    def __init__(self, program, sizes, rank: int, device, execution_index: int = 0):
        self.program = program
        self.sizes = sizes
        self.rank = rank
        self.device = device
        self.execution_index = execution_index
        self.expr = None
        self._memo: dict = {}

    def _remember(self, key, compute):
        try:
            return self._memo[key]
        except KeyError:
            value = self._memo[key] = compute()
            return value

    def bind(self, expr) -> None:
        self.expr = expr

    # -- shapes ---------------------------------------------------------------------
    def _out(self, i):
        return self.expr.tv_outputs[i]

    def _state(self, tv):
        return self.program.state[tv]

    def coords(self, tv) -> dict:
        return dict(self._remember(("coords", tv), lambda: self._coords(tv)))

    def _coords(self, tv) -> dict:
        mesh = self._state(tv).mesh
        return mesh.coords(self.rank) if mesh is not None else {}

    def global_shape(self, i: int) -> list:
        out = self._out(i)
        return list(self._remember(("global", out), lambda: self.sizes.global_shape(out)))

    def local_shape(self, tv) -> list:
        return list(self._remember(("local", tv), lambda: self._local_shape(tv)))

    def _local_shape(self, tv) -> list:
        state = self._state(tv)
        shape = []
        for axis, k in enumerate(tv.non_reduction_axes()):
            extent = self.sizes.global_extent(tv, axis)
            digits = state.layouts[k]
            if digits:
                extent //= layout.local_numel_divisor(digits, state.mesh.axis_sizes())
            shape.append(extent)
        return shape

    def out_shape(self, i: int) -> list:
        """Local shape the op must produce: local blocks, except whole extents
        on result-only axes (the executor cuts those after)."""
        out = self._out(i)
        local = self.local_shape(out)
        full = self.global_shape(i)
        flags = self.result_only(self.expr, i)
        return [f if ro else l for l, f, ro in zip(local, full, flags)]

    def result_only(self, expr, i: int) -> list:
        """Per axis of result i: computed whole by the op, cut after (see
        preseg.projection.result_only_axes)."""
        return self._remember(("result_only", expr, i),
                              lambda: result_only_axes(expr, self.program.rule(expr), i))

    def localize(self, i: int, t: torch.Tensor, dims: list) -> torch.Tensor:
        """Cut a global tensor to this device's block: dim d of `t` follows axis
        dims[d] of result i (None: keep whole)."""
        out = self._out(i)
        state = self._state(out)
        if state.mesh is None:
            return t
        axes = out.non_reduction_axes()
        layouts = [None if a is None else state.layouts[axes[a]] for a in dims]
        return layout.take_block(t, layouts, state.mesh.axis_sizes(), state.mesh.coords(self.rank), self.sizes.bindings)

    def global_extent(self, tv, axis: int) -> int:
        return self.sizes.global_extent(tv, axis)

    def evaluate_size(self, size) -> int:
        return self.sizes.evaluate_size(size)

    def scalar(self, value):
        return self.sizes.scalar(value)

    def adds_unreduced_terms(self) -> bool:
        """False on devices whose partial sums another device's partial
        already carries an additive term for (all but coordinate 0)."""
        out = self._out(0)
        return self._remember(("adds_unreduced", out), lambda: all(
            self.coords(out).get(m, 0) == 0 for m in self._state(out).pending(out)))

    def rng_seed(self, expr) -> int:
        """Same on every rank and for every sharding of the same program."""
        position = self.program.position(expr.origin)
        digest = hashlib.sha256(f"{position}:{self.execution_index}".encode()).digest()
        return int.from_bytes(digest[:4], "little")


def localize_result_only(ctx: EvalContext, expr, i: int, t: torch.Tensor) -> torch.Tensor:
    """Keep this device's block of result-only axes the op computed whole."""
    flags = ctx.result_only(expr, i)
    if not any(flags):
        return t
    return ctx.localize(i, t, [d if ro else None for d, ro in enumerate(flags)])
