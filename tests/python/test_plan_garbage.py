"""Planning leaves no cyclic garbage: what it allocates and drops is freed
by reference counting, so the collector has no cycles to search big plans
for (bench_propagation's times include the collection after a plan). The
plan itself holds cycles (a TensorView and its IterDomains point at each
other); those are freed with it."""

import gc

import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, models
from nvshard.models import Direction


def _cyclic_garbage(build) -> list:
    """Types of the objects in cycles that build() left unreachable (after
    one warm-up call: first calls import modules, whose classes may leave
    cycles of their own)."""
    build()
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        plan = build()  # noqa: F841  (kept alive: its own cycles are not garbage)
        gc.collect()
        return [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()


def test_planning_the_triangle_update_leaves_no_cycles():
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(4).reshape(1, 2, 2))
    with FusionDefinition() as fd:
        inputs, _ = models.triangle_update(fd, Direction.OUTGOING, 16, DataType.Float)
        models.annotate_triangle(inputs, mesh, 1, 2)
    shapes = models.triangle_shapes(2, 8, 16)
    garbage = _cyclic_garbage(lambda: nvfuser.propagate_shardings(fd, shapes))
    assert garbage == [], f"{len(garbage)} objects in cycles, e.g. {sorted(set(garbage))[:8]}"
    # the check sees cycles: one made on purpose is found
    assert "list" in _cyclic_garbage(lambda: (lambda cycle: cycle.append(cycle))([]))


def test_planning_a_symbolic_mlp_with_searched_reshards_leaves_no_cycles():
    """Symbolic sizes (Size arithmetic), a partial sum and reshard searches."""
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(4))
    with FusionDefinition() as fd:
        inputs, _ = models.mlp(fd, -1, 32, DataType.Float)
        models.annotate_mlp(inputs, mesh, sequence_parallel=True)
    garbage = _cyclic_garbage(lambda: nvfuser.propagate_shardings(fd, [[64, 32], [128, 32], [32, 128]]))
    assert garbage == [], f"{len(garbage)} objects in cycles, e.g. {sorted(set(garbage))[:8]}"
