"""Checks of user annotations, run when a definition closes and before
propagation, so bad shardings fail with a message naming tensor and axis."""

from __future__ import annotations

from ..ir.nodes import NvShardError


def validate_annotations(fusion) -> None:
    for tv in fusion.tvs():
        used = {}
        for pos, id_ in enumerate(tv.loop):
            if not id_.is_device_dim():
                continue
            if tv.mesh is None:
                raise NvShardError(
                    f"{tv.short_name()}: loop axis {pos} is parallelized on {id_.parallel_type} "
                    f"but the tensor has no device mesh; call set_device_mesh first"
                )
            name = id_.parallel_type.mesh_axis
            if name not in tv.mesh.axis_names:
                raise NvShardError(
                    f"{tv.short_name()}: loop axis {pos} is parallelized on {id_.parallel_type}, "
                    f"but {tv.mesh} has only {', '.join('DID' + a for a in tv.mesh.axis_names)}"
                )
            key = (name, id_.is_reduction())
            if key in used:
                raise NvShardError(
                    f"{tv.short_name()}: loop axes {used[key]} and {pos} are both parallelized on "
                    f"{id_.parallel_type}; a mesh axis can shard only one axis of a tensor"
                )
            used[key] = pos
        if tv.sharding_priority is not None and tv.mesh is None:
            raise NvShardError(f"{tv.short_name()}: set_sharding_priority needs a device mesh on the tensor")
