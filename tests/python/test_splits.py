"""multidevice/splits.py: the scheduling calls for a layout, read back by
nvshard's TensorView as the same layout (the writer to real nvFuser and
annotate_from_dtensor both use them)."""

from __future__ import annotations

import pytest
import torch

from nvshard import DataType, FusionDefinition, NvShardError, ParallelType
from nvshard.ir.sizes import Size
from nvshard.multidevice import DeviceMesh, layout
from nvshard.multidevice.splits import Split, apply_splits, tv_splits

SIZES = {"z": 2, "y": 3, "x": 2}


def _tv(shape):
    with FusionDefinition() as fd:
        tv = fd.define_tensor(shape, dtype=DataType.Float)
        fd.add_output(tv)
    tv.set_device_mesh(DeviceMesh(torch.arange(12).reshape(2, 3, 2)))
    return tv


@pytest.mark.parametrize("shape, layouts, expected", [
    ([12, 24, 10, 2], {0: ("x", Size(6)), 1: (Size(4), "y", Size(2)), 3: ("z",)},
     [Split("leaf", 3, None, "z"), Split("inner", 1, 6), Split("outer", 2, 3, "y"), Split("outer", 0, 2, "x")]),
    ([12, 10], {0: ("z", "y", Size(2)), 1: (Size(5), "x")},
     [Split("inner", 1, 2), Split("leaf", 2, None, "x"), Split("outer", 0, 2, "z"), Split("outer", 1, 3, "y")]),
], ids=["block-cyclic-leaf", "nested"])
def test_splits_of_a_layout_read_back_as_it(shape, layouts, expected):
    tv = _tv(shape)
    steps = tv_splits("T0", layouts, SIZES)
    assert steps == expected  # last axis first
    apply_splits(tv, steps, ParallelType.of_mesh_axis)
    read = tv.layouts()
    for axis in range(len(shape)):
        assert layout.same(read[axis], layouts.get(axis, ())), (axis, read[axis])


def _symbolic() -> Size:
    with FusionDefinition() as fd:
        tv = fd.define_tensor([-1], dtype=DataType.Float)
        fd.add_output(tv)
    return Size.of(tv.logical[0].extent())


@pytest.mark.parametrize("a, b, expected", [
    ((), None, True),
    (("x",), ("x",), True),
    (("x", Size(4)), ("x", Size(4)), True),  # equal Sizes, distinct objects
    (("y", "x", Size(2)), ("y", "x", Size(2)), True),
    (("x",), ("y",), False),
    (("x", Size(4)), ("x", Size(2)), False),
    (("x",), ("x", Size(2)), False),
    ((Size(2), "x"), ("x", Size(2)), False),
    (("x",), (), False),
])
def test_same_layout_is_equal_keys(a, b, expected):
    """layout.same compares digit by digit; it must agree with the keys."""
    assert layout.same(a, b) is expected and layout.same(b, a) is expected
    assert (layout.key(a) == layout.key(b)) is expected


def test_symbolic_local_block_before_a_mesh_axis_is_an_error():
    with pytest.raises(NvShardError, match=r"T5 axis 0: layout \[\* DIDx \*\] needs a split by a symbolic extent"):
        tv_splits("T5", {0: (_symbolic(), "x", _symbolic())}, SIZES)
    assert tv_splits("T5", {0: (_symbolic(), "x")}, SIZES) == [Split("inner", 0, 2), Split("leaf", 1, None, "x")]  # known product after


def test_unknown_mesh_axis_has_no_parallel_type():
    with pytest.raises(NvShardError, match="no device parallel type for mesh axis 'w'"):
        ParallelType.of_mesh_axis("w")
