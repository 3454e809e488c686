# mpirun -np 4 python -m pytest tests/python/multidevice/test_dtensor.py --only-mpi
#
# nvshard.execute_with_dtensors on 1-, 2- and 3-D torch DeviceMeshes, on every
# mesh axis, with Shard/Replicate/Partial inputs; outputs are checked against
# the unsharded torch reference through DTensor.full_tensor() (which gathers
# by the placements, so a wrong placement fails as surely as wrong data).
#
# DTensor needs one process per device: under `mpirun -np 1` only the tests
# whose mesh fits one device run (the others skip, saying why).

import socket

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, NvShardError

PT = nvfuser.ParallelType


@pytest.fixture
def world(multidevice_test):
    """torch's default process group over the mpirun job, made here as a
    DTensor program makes it (nvshard never does); returns the number of
    processes."""
    comm = multidevice_test.communicator
    if not dist.is_initialized():
        port = None
        if comm.rank() == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        if comm.size() > 1:
            from mpi4py import MPI

            port = MPI.COMM_WORLD.bcast(port, root=0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank(),
                                world_size=comm.size())
    return dist.get_world_size()


def _need(world: int, divisor: int, what: str) -> None:
    if world % divisor:
        pytest.skip(f"{what} needs a multiple of {divisor} processes (DTensor runs one process per device); "
                    f"this job has {world}")


@pytest.mark.mpi
def test_plus_one(world):
    """Upstream's test_plus_one: the output is on the input's DeviceMesh object."""
    with FusionDefinition() as fd:
        inp = fd.define_tensor((-1, -1), contiguity=False, dtype=DataType.Float)
        one = fd.define_scalar(1.0, dtype=DataType.Float)
        fd.add_output(fd.ops.add(inp, one))
    torch.manual_seed(0)
    in_tensor = torch.randn(world, 4)
    mesh = init_device_mesh("cpu", [world], mesh_dim_names=["tp"])
    in_dtensor = distribute_tensor(in_tensor, mesh, [Shard(0)])
    (out_dtensor,) = nvfuser.execute_with_dtensors(fd, [in_dtensor])
    torch.testing.assert_close(out_dtensor.to_local(), in_dtensor.to_local() + 1)
    assert out_dtensor.device_mesh is in_dtensor.device_mesh
    assert out_dtensor.placements == in_dtensor.placements
    assert out_dtensor.device_mesh.mesh_dim_names == ("tp",)
    torch.testing.assert_close(out_dtensor.full_tensor(), in_tensor + 1)


@pytest.mark.mpi
def test_column_parallel_linear_1d(world):
    """Replicated activations, weight Shard(0): the output comes back Shard(-1)."""
    b, e = 3, 5
    with FusionDefinition() as fd:
        x = fd.define_tensor([b, e], dtype=DataType.Float)
        w = fd.define_tensor([world * e, e], dtype=DataType.Float)
        fd.add_output(fd.ops.linear(x, w))
    torch.manual_seed(0)
    xt, wt = torch.randn(b, e), torch.randn(world * e, e)
    mesh = init_device_mesh("cpu", [world])
    (out,) = nvfuser.execute_with_dtensors(fd, [distribute_tensor(xt, mesh, [Replicate()]),
                                                distribute_tensor(wt, mesh, [Shard(0)])])
    assert out.device_mesh is mesh and out.placements == (Shard(1),)
    assert out.to_local().shape == (b, e)
    torch.testing.assert_close(out.full_tensor(), torch.nn.functional.linear(xt, wt))


@pytest.mark.mpi
def test_2d_mesh_every_axis(world):
    """dp x tp: tokens on dp (mesh_y), the weight's rows on tp (mesh_x)."""
    _need(world, 2, "a 2-D mesh")
    dp, tp = world // 2, 2
    t, h, n = 4 * dp, 6, 4 * tp
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, h], dtype=DataType.Float)
        w = fd.define_tensor([n, h], dtype=DataType.Float)
        fd.add_output(fd.ops.relu(fd.ops.linear(x, w)))
    torch.manual_seed(1)
    xt, wt = torch.randn(t, h), torch.randn(n, h)
    mesh = init_device_mesh("cpu", [dp, tp], mesh_dim_names=["dp", "tp"])
    (out,) = nvfuser.execute_with_dtensors(fd, [distribute_tensor(xt, mesh, [Shard(0), Replicate()]),
                                                distribute_tensor(wt, mesh, [Replicate(), Shard(0)])])
    assert out.device_mesh is mesh
    assert out.placements == (Shard(0), Shard(1))
    assert out.to_local().shape == (t // dp, n // tp)
    torch.testing.assert_close(out.full_tensor(), torch.relu(torch.nn.functional.linear(xt, wt)))
    # the fusion inputs took the DTensors' layouts: x's tokens on DIDy, w's rows on DIDx
    plan = fd._executor.last_plan
    assert plan.mesh_axes(fd.fusion.inputs()[0]) == [["y"], []]
    assert plan.mesh_axes(fd.fusion.inputs()[1]) == [["x"], []]


@pytest.mark.mpi
def test_2d_partial_input_and_row_parallel(world):
    """A Partial input is summed (by torch, on its mesh) before the fusion; a
    contraction sharded on tp makes nvshard reduce, and the output's
    placements say where the result lives."""
    _need(world, 2, "a 2-D mesh")
    dp, tp = world // 2, 2
    t, k, n = 2 * dp, 4 * tp, 3
    with FusionDefinition() as fd:
        x = fd.define_tensor([t, k], dtype=DataType.Float)
        w = fd.define_tensor([n, k], dtype=DataType.Float)
        fd.add_output(fd.ops.linear(x, w))
    torch.manual_seed(2)
    xt, wt = torch.randn(t, k), torch.randn(n, k)
    mesh = init_device_mesh("cpu", [dp, tp], mesh_dim_names=["dp", "tp"])
    # every rank holds a different part of x's value on tp: parts sum to x
    coord = mesh.get_coordinate()
    weight = (coord[1] + 1) / sum(range(1, tp + 1))
    x_local = (xt * weight).chunk(dp, dim=0)[coord[0]]
    x_partial = DTensor.from_local(x_local, mesh, [Shard(0), Partial()], run_check=False)
    w_dt = distribute_tensor(wt, mesh, [Replicate(), Shard(1)])
    (out,) = nvfuser.execute_with_dtensors(fd, [x_partial, w_dt])
    assert out.device_mesh is mesh
    torch.testing.assert_close(out.full_tensor(), torch.nn.functional.linear(xt, wt), rtol=1e-5, atol=1e-5)
    plan = fd._executor.last_plan
    # x arrives whole on tp (Partial was summed) and is sharded to match w's contraction: the sum over tp is
    # then nvshard's, and the result is whole on tp
    assert [c.kind for c in plan.communications] == ["allreduce"]
    assert out.placements == (Shard(0), Replicate())


@pytest.mark.mpi
def test_3d_mesh_transpose_add(world):
    """dp x cp x cp, z_in-like input on all three mesh axes; x + x^T over (i, j)
    needs communication on both cp axes."""
    _need(world, 4, "a (d/4, 2, 2) mesh")
    dp, cp = world // 4, 2
    b, n, c = 2 * dp, 4, 3
    with FusionDefinition() as fd:
        x = fd.define_tensor([b, n, n, c], dtype=DataType.Float)
        fd.add_output(fd.ops.add(x, fd.ops.permute(x, [0, 2, 1, 3])))
    torch.manual_seed(3)
    xt = torch.randn(b, n, n, c)
    mesh = init_device_mesh("cpu", [dp, cp, cp], mesh_dim_names=["dp", "cp_i", "cp_j"])
    x_dt = distribute_tensor(xt, mesh, [Shard(0), Shard(1), Shard(2)])
    (out,) = nvfuser.execute_with_dtensors(fd, [x_dt])
    assert out.device_mesh is mesh
    torch.testing.assert_close(out.full_tensor(), xt + xt.permute(0, 2, 1, 3))
    plan = fd._executor.last_plan
    assert plan.mesh_axes(fd.fusion.inputs()[0]) == [["z"], ["y"], ["x"], []]
    assert out.placements == (Shard(0), Shard(1), Shard(2))
    assert {c.mesh_axis for c in plan.communications} == {"x", "y"}


@pytest.mark.mpi
def test_3d_mesh_nested_shard(world):
    """Shard(0) on two mesh dims nests them (the lower torch dim outer), as torch chunks."""
    _need(world, 4, "a (d/4, 2, 2) mesh")
    dp = world // 4
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 5], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(x, 3.0))
    torch.manual_seed(4)
    xt = torch.randn(8 * dp, 5)
    mesh = init_device_mesh("cpu", [dp, 2, 2])
    x_dt = distribute_tensor(xt, mesh, [Shard(0), Shard(0), Replicate()])
    (out,) = nvfuser.execute_with_dtensors(fd, [x_dt])
    assert out.device_mesh is mesh and out.placements == (Shard(0), Shard(0), Replicate())
    torch.testing.assert_close(out.to_local(), x_dt.to_local() * 3)
    torch.testing.assert_close(out.full_tensor(), xt * 3)
    assert fd._executor.last_plan.mesh_axes(fd.fusion.inputs()[0]) == [["z", "y"], []]


@pytest.mark.mpi
def test_annotated_fusion_redistributes_the_input(world):
    """The definition shards x on DIDx; a replicated DTensor is sliced to match."""
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(world))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 3], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(x))
        x.set_device_mesh(mesh)
        x.outer_split(0, world)
        x.axis(0).parallelize(PT.mesh_x)
    torch.manual_seed(5)
    xt = torch.randn(2 * world, 3)
    torch_mesh = mesh.to_torch("cpu")
    assert nvfuser.multidevice.DeviceMesh.from_torch(torch_mesh) == mesh
    (out,) = nvfuser.execute_with_dtensors(fd, [distribute_tensor(xt, torch_mesh, [Replicate()])])
    assert out.placements == (Shard(0),) and out.device_mesh is torch_mesh
    torch.testing.assert_close(out.full_tensor(), -xt)


@pytest.mark.mpi
def test_uneven_shard_is_an_error(world):
    _need(world, 2, "an uneven shard")
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(x))
    mesh = init_device_mesh("cpu", [world])
    x_dt = distribute_tensor(torch.randn(world + 1), mesh, [Shard(0)])
    with pytest.raises(NvShardError, match=r"T0: the DTensor's dim 0 has extent \d+, which its Shard placements "
                                           rf"\({world} devices\) do not divide evenly"):
        nvfuser.execute_with_dtensors(fd, [x_dt])


@pytest.mark.mpi
def test_output_on_another_mesh(world):
    """The output is annotated on a 1-D mesh of the same devices: it comes back on a
    torch DeviceMesh made for that mesh (once: a second run reuses it)."""
    _need(world, 2, "a 2-D mesh")
    mesh_1d = nvfuser.multidevice.DeviceMesh(torch.arange(world))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 3], dtype=DataType.Float)
        y = fd.ops.mul(x, 2.0)
        fd.add_output(y)
        y.set_device_mesh(mesh_1d)
        y.outer_split(0, world)
        y.axis(0).parallelize(PT.mesh_x)
    torch.manual_seed(6)
    xt = torch.randn(2 * world, 3)
    mesh_2d = init_device_mesh("cpu", [world // 2, 2], mesh_dim_names=["dp", "tp"])
    x_dt = distribute_tensor(xt, mesh_2d, [Shard(0), Replicate()])
    (out,) = nvfuser.execute_with_dtensors(fd, [x_dt])
    assert nvfuser.multidevice.DeviceMesh.from_torch(out.device_mesh) == mesh_1d
    assert out.placements == (Shard(0),) and out.to_local().shape == (2, 3)
    torch.testing.assert_close(out.full_tensor(), xt * 2)
    assert [c.kind for c in fd._executor.last_plan.communications] == ["allgather", "broadcast"]
    (again,) = nvfuser.execute_with_dtensors(fd, [x_dt])
    assert again.device_mesh is out.device_mesh
