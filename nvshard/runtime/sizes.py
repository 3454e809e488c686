"""Sizes at run time. The SizeEvaluator (ir/size_evaluator.py) binds the
fusion's symbolic extents from the GLOBAL input shapes.

Under mpirun a rank outside an input's mesh holds none of it, so it cannot
read that input's symbolic extents; when some rank would be left so
(`needs_shape_exchange`, a question of the fusion and the world size alone,
so every rank answers it alike), the ranks exchange the global input shapes
they know before planning (`agree_on_global_shapes`), and every rank plans
with the same concrete sizes.
"""

from __future__ import annotations

from ..errors import NvShardError
from ..ir.nodes import TensorView


def needs_shape_exchange(fusion, world_size: int) -> bool:
    """Whether some rank of the world holds no input that binds one of the
    fusion's symbolic input extents."""
    covering: dict = {}  # symbol -> ranks holding an input that binds it
    for val in fusion.inputs():
        if not isinstance(val, TensorView):
            continue
        ranks = set(range(world_size)) if val.mesh is None else {r for r in range(world_size) if val.mesh.has(r)}
        for k in val.non_reduction_axes():
            id_ = val.logical[k]
            if id_.is_broadcast():
                continue
            c = id_.extent().canonical()
            if len(c.syms) == 1 and c.coef == 1:
                covering.setdefault(c.syms[0].find(), set()).update(ranks)
    return any(len(ranks) < world_size for ranks in covering.values())


def agree_on_global_shapes(fusion, shapes: list, all_gather) -> list:
    """Every rank's view of the global input shapes (None: input not on that
    rank), gathered with `all_gather(obj) -> [obj of rank 0, 1, ...]`, made
    one: each input takes the shape the ranks holding it report. Ranks that
    disagree raise the same NvShardError on every rank (after the exchange,
    so no rank is left waiting in a collective)."""
    views = all_gather([list(s) if isinstance(s, (list, tuple)) else s for s in shapes])
    agreed = []
    for k, val in enumerate(fusion.inputs()):
        if not isinstance(val, TensorView):
            agreed.append(shapes[k])
            continue
        reported = {r: view[k] for r, view in enumerate(views) if view[k] is not None}
        distinct = {tuple(s) for s in reported.values()}
        if len(distinct) > 1:
            by_shape: dict = {}
            for r, s in reported.items():
                by_shape.setdefault(tuple(s), []).append(r)
            first, second = sorted(by_shape)[:2]
            axis = next(a for a, (x, y) in enumerate(zip(first, second)) if x != y) if len(first) == len(second) else 0
            raise NvShardError(
                f"input {k} ({val.short_name()}): the ranks disagree on its global shape at axis {axis}: ranks "
                f"{by_shape[first]} give {list(first)}, ranks {by_shape[second]} give {list(second)}; every rank "
                f"of its mesh must pass its shard of the same tensor"
            )
        agreed.append(list(distinct.pop()) if distinct else None)
    return agreed
