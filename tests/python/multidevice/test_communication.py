# mpirun -np 4 python -m pytest tests/python/multidevice/test_communication.py --only-mpi
#
# One test per collective kind: each resharding must become the expected
# communication, move the planned bytes, and give the unsharded numbers.

import pytest
import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition

PT = nvfuser.ParallelType


def _kinds(results):
    return [c.kind for c in results.plan.communications]


def _check_bytes(results):
    for rank, measured in results.received.items():
        assert measured == results.plan.bytes_received(rank)


@pytest.mark.mpi
def test_allgather(multidevice_test):
    d = multidevice_test.size
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((d * 4,), contiguity=True, dtype=DataType.Float)
        out = fd.ops.set(inp)
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        inp.outer_split(0, d)
        inp.axis(0).parallelize(PT.mesh_x)
        out.set_device_mesh(mesh)
    ref = torch.randn(d * 4)
    results = multidevice_test.execute(fd, [ref])
    assert _kinds(results) == ["allgather"]
    multidevice_test.check(results, 0, ref)
    _check_bytes(results)
    assert results.plan.bytes_per_device == (d - 1) * 4 * 4


@pytest.mark.mpi
def test_allgather_inner_split(multidevice_test):
    """A cyclic (inner-split) layout gathers into the right order."""
    d = multidevice_test.size
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((d * 3, 5), contiguity=True)
        out = fd.ops.mul(inp, 2.0)
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        inp.inner_split(0, d)  # [3, d]: element i lives on device i % d
        inp.axis(1).parallelize(PT.mesh_x)
        out.set_device_mesh(mesh)
    ref = torch.randn(d * 3, 5)
    results = multidevice_test.execute(fd, [ref])
    assert _kinds(results) == ["allgather"]
    multidevice_test.check(results, 0, ref * 2)
    _check_bytes(results)


@pytest.mark.mpi
def test_allgather_2d(multidevice_test):
    d = multidevice_test.size
    if d % 2:
        pytest.skip("needs an even number of devices")
    dp, tp = d // 2, 2
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d).reshape(dp, tp))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, -1], contiguity=True)
        out = fd.ops.set(inp)
        fd.add_output(out)
        for tv in (inp, out):
            tv.set_device_mesh(mesh)
            tv.outer_split(0, dp)
            tv.axis(0).parallelize(PT.mesh_y)
        inp.outer_split(2, tp)
        inp.axis(2).parallelize(PT.mesh_x)
    ref = torch.randn(dp * 2, tp * 3)
    results = multidevice_test.execute(fd, [ref])
    assert [(c.kind, c.mesh_axis) for c in results.plan.communications] == [("allgather", "x")]
    multidevice_test.check(results, 0, ref)
    _check_bytes(results)


@pytest.mark.mpi
def test_allgather_expanded_broadcast(multidevice_test):
    d = multidevice_test.size
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([d], contiguity=True)
        expanded = fd.ops.broadcast_in_dim(inp, [d, 3], [0])
        out = fd.ops.set(expanded)
        fd.add_output(out)
        for tv in (inp, expanded, out):
            tv.set_device_mesh(mesh)
        inp.axis(0).parallelize(PT.mesh_x)
        expanded.axis(0).parallelize(PT.mesh_x)
    ref = torch.randn(d)
    results = multidevice_test.execute(fd, [ref])
    assert _kinds(results) == ["allgather"]
    multidevice_test.check(results, 0, ref.unsqueeze(-1).expand(-1, 3))
    # the expanded axis travels as one element: (d-1) floats
    assert results.plan.bytes_per_device == (d - 1) * 4
    _check_bytes(results)


@pytest.mark.mpi
def test_allreduce(multidevice_test):
    d = multidevice_test.size
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((-1, -1, -1), contiguity=True)
        out = fd.ops.sum(inp, [1])
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        inp.outer_split(1, d)
        inp.axis(1).parallelize(PT.mesh_x)
    ref = torch.randn(2, d * 3, 5)
    results = multidevice_test.execute(fd, [ref])
    assert _kinds(results) == ["allreduce"]
    assert results.plan.partial_axes(out) == ["x"]
    multidevice_test.check(results, 0, ref.sum(1))
    _check_bytes(results)


@pytest.mark.mpi
@pytest.mark.parametrize("noncontiguous", [False, True])
def test_reduce_scatter(multidevice_test, noncontiguous):
    d = multidevice_test.size
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d))
    shape = (d, 3, d * 4) if noncontiguous else (d, d * 4)
    with FusionDefinition() as fd:
        inp = fd.define_tensor(shape, contiguity=True)
        out = fd.ops.sum(inp, [0])
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        inp.axis(0).parallelize(PT.mesh_x)
        out.set_device_mesh(mesh)
        out.outer_split(-1, d)
        out.axis(-2).parallelize(PT.mesh_x)
    ref = torch.randn(*shape)
    results = multidevice_test.execute(fd, [ref])
    assert _kinds(results) == ["reduce_scatter"]
    multidevice_test.check(results, 0, ref.sum(0))
    _check_bytes(results)


@pytest.mark.mpi
@pytest.mark.parametrize("inp_axis,out_axis", [(0, 1), (1, 0)], ids=["dispatch", "combine"])
def test_alltoall(multidevice_test, inp_axis, out_axis):
    d = multidevice_test.size
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d))
    n = 3
    with FusionDefinition() as fd:
        inp = fd.define_tensor((d, d * n), contiguity=True, dtype=DataType.Half)
        out = fd.ops.set(inp)
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        inp.outer_split(inp_axis, d)
        inp.axis(inp_axis).parallelize(PT.mesh_x)
        out.set_device_mesh(mesh)
        out.outer_split(out_axis, d)
        out.axis(out_axis).parallelize(PT.mesh_x)
    ref = torch.randn(d, d * n, dtype=torch.float16)
    results = multidevice_test.execute(fd, [ref])
    assert _kinds(results) == ["all_to_all"]
    multidevice_test.check(results, 0, ref)
    _check_bytes(results)


@pytest.mark.mpi
def test_two_mesh_axes_at_once(multidevice_test):
    """[y, x] -> [x, y]: one single-axis collective per mesh axis."""
    d = multidevice_test.size
    if d % 4:
        pytest.skip("needs a multiple of 4 devices")
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(4).reshape(2, 2))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((4, 6), contiguity=True)
        out = fd.ops.set(inp)
        fd.add_output(out)
        for tv, (a, b) in ((inp, (PT.mesh_y, PT.mesh_x)), (out, (PT.mesh_x, PT.mesh_y))):
            tv.set_device_mesh(mesh)
            tv.outer_split(0, 2)
            tv.axis(0).parallelize(a)
            tv.outer_split(2, 2)
            tv.axis(2).parallelize(b)
    ref = torch.randn(4, 6)
    results = multidevice_test.execute(fd, [ref])
    # the cheapest order: gather DIDy (24 B), move DIDx across axes (24 B), slice DIDy
    assert [(c.kind, c.mesh_axis) for c in results.plan.communications] == [("allgather", "y"), ("all_to_all", "x")]
    assert results.plan.bytes_per_device == 48
    multidevice_test.check(results, 0, ref)
    _check_bytes(results)


@pytest.mark.mpi
def test_broadcast_between_meshes(multidevice_test):
    """A tensor on device 0 alone, consumed on every device."""
    d = multidevice_test.size
    with FusionDefinition() as fd:
        inp = fd.define_tensor((4, 5), contiguity=True)
        out = fd.ops.relu(inp)
        fd.add_output(out)
        inp.set_device_mesh(nvfuser.multidevice.DeviceMesh([0]))
        out.set_device_mesh(nvfuser.multidevice.DeviceMesh(torch.arange(d)))
    ref = torch.randn(4, 5)
    results = multidevice_test.execute(fd, [ref])
    assert _kinds(results) == ["broadcast"]
    multidevice_test.check(results, 0, ref.relu())
    _check_bytes(results)


@pytest.mark.mpi
def test_send_recv_between_pipeline_stages(multidevice_test):
    """Stage 0 on the first half of the devices, stage 1 on the second half,
    same sharding: each shard moves device to device."""
    d = multidevice_test.size
    if d % 2:
        pytest.skip("needs an even number of devices")
    half = d // 2
    stage0 = nvfuser.multidevice.DeviceMesh(torch.arange(half))
    stage1 = nvfuser.multidevice.DeviceMesh(torch.arange(half, d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((half * 2, 3), contiguity=True)
        mid = fd.ops.mul(inp, 3.0)
        out = fd.ops.add(mid, 1.0)
        fd.add_output(out)
        for tv, mesh in ((inp, stage0), (mid, stage0), (out, stage1)):
            tv.set_device_mesh(mesh)
            tv.outer_split(0, half)
            tv.axis(0).parallelize(PT.mesh_x)
    ref = torch.randn(half * 2, 3)
    results = multidevice_test.execute(fd, [ref])
    assert _kinds(results) == ["send_recv"]
    multidevice_test.check(results, 0, ref * 3 + 1)
    _check_bytes(results)


@pytest.mark.mpi
def test_all_to_all_cyclic_to_block(multidevice_test):
    """DIDx moving inside one axis, cyclic [2d, DIDx] -> block [DIDx, 2d]: an
    all-to-all of equal chunks, (d-1)/d of the local shard, not an allgather."""
    d = multidevice_test.size
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((2 * d * d, 3), contiguity=True, dtype=DataType.Float)
        out = fd.ops.neg(inp)
        fd.add_output(out)
        for tv in (inp, out):
            tv.set_device_mesh(mesh)
        inp.inner_split(0, d)
        inp.axis(1).parallelize(PT.mesh_x)
        out.outer_split(0, d)
        out.axis(0).parallelize(PT.mesh_x)
    ref = torch.randn(2 * d * d, 3)
    results = multidevice_test.execute(fd, [ref])
    assert _kinds(results) == (["all_to_all"] if d > 1 else [])
    multidevice_test.check(results, 0, -ref)
    _check_bytes(results)
    assert results.plan.bytes_per_device == (d - 1) / d * (2 * d * 3 * 4)
