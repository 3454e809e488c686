"""Checks of user annotations, run when a definition closes and before
propagation, so bad shardings fail with a message naming tensor and axis."""

from __future__ import annotations

from ..ir.nodes import NvShardError
from ..ops.registry import FactorKind


def validate_annotations(fusion) -> None:
    for tv in fusion.tvs():
        used = None  # (mesh axis, reduction?) -> loop axis; made at the first parallelized axis (most have none)
        pending = False  # a parallelized reduction axis: checked below
        loop = tv.loop
        for pos in range(len(loop)):  # (an index loop: compiled, no tuple per axis)
            id_ = loop[pos]
            if not id_.is_device_dim():
                continue
            if used is None:
                used = {}
            if tv.mesh is None:
                raise NvShardError(
                    f"{tv.short_name()}: loop axis {pos} is parallelized on {id_.parallel_type} "
                    f"but the tensor has no device mesh; call set_device_mesh first"
                )
            name = id_.parallel_type.mesh_axis
            if name not in tv.mesh.axis_names:
                raise NvShardError(
                    f"{tv.short_name()}: loop axis {pos} is parallelized on {id_.parallel_type}, "
                    f"but {tv.mesh} has only {', '.join(['DID' + a for a in tv.mesh.axis_names])}"
                )
            key = (name, id_.is_reduction())
            if key in used:
                raise NvShardError(
                    f"{tv.short_name()}: loop axes {used[key]} and {pos} are both parallelized on "
                    f"{id_.parallel_type}; a mesh axis can shard only one axis of a tensor"
                )
            used[key] = pos
            pending = pending or id_.is_reduction()
        if pending:
            _check_pending_annotations(tv)
        if tv.sharding_priority is not None and tv.mesh is None:
            raise NvShardError(f"{tv.short_name()}: set_sharding_priority needs a device mesh on the tensor")


def _check_pending_annotations(tv) -> None:
    """A parallelized reduction axis means partial sums: only a sum can leave them."""
    expr = tv.definition
    for id_ in tv.loop:
        if not (id_.is_device_dim() and id_.is_reduction()):
            continue
        k = id_.logical_axis
        kinds = set()
        if expr is not None:
            factors = expr.rule().results[expr.tv_outputs.index(tv)][k]
            kinds = {expr.rule().factors[f].kind for f in factors}
        if kinds != {FactorKind.SUM}:
            op = expr.op.name if expr is not None else "a fusion input"
            raise NvShardError(
                f"{tv.short_name()}: reduction axis {k} is parallelized on {id_.parallel_type}, but {op} cannot "
                f"leave partial results on it (only sums and contractions can)"
            )
