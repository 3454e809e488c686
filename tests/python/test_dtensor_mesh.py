"""nvshard DeviceMesh <-> torch DeviceMesh, and DTensor placements <-> layouts,
in one process on torch's fake process group (no data moves). The mpirun
tests in multidevice/test_dtensor.py run DTensors for real."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, NvShardError
from nvshard.api import annotate_from_dtensor, placements_from_layouts
from nvshard.ir.sizes import Size


@pytest.fixture
def fake_world():
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError:
        pytest.skip("this torch has no fake process group (torch.testing._internal.distributed.fake_pg)")
    if dist.is_initialized():
        pytest.skip("torch.distributed is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("shape", [(8,), (2, 4), (2, 2, 2)])
def test_mesh_round_trip(fake_world, shape):
    devices = torch.arange(8).flip(0).reshape(shape)  # any order of ranks
    torch_mesh = TorchDeviceMesh("cpu", devices)
    mesh = nvfuser.multidevice.DeviceMesh.from_torch(torch_mesh)
    assert mesh.shape == shape and mesh.vector == devices.flatten().tolist()
    assert mesh.axis_names == ("z", "y", "x")[3 - len(shape):]
    back = mesh.to_torch("cpu", mesh_dim_names=tuple(f"d{i}" for i in range(len(shape))))
    assert torch.equal(back.mesh, devices.to(back.mesh.dtype)) and back.mesh_dim_names[-1] == f"d{len(shape) - 1}"


def test_placements_from_layouts():
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(8).reshape(2, 2, 2))  # z y x = torch dims 0 1 2
    assert placements_from_layouts("T0", mesh, [("y", Size(4)), (), ("x", Size(3))]) == \
        [Replicate(), Shard(0), Shard(2)]
    assert placements_from_layouts("T0", mesh, [("z", "y", Size(2)), ()], pending=("x",)) == \
        [Shard(0), Shard(0), Partial()]
    with pytest.raises(NvShardError, match=r"T0: axis 0 is laid out as \[\* DIDx\], which no DTensor placement"):
        placements_from_layouts("T0", mesh, [(Size(4), "x")])
    with pytest.raises(NvShardError, match=r"T5: axis 1 is laid out as DIDx\*DIDz.*in mesh-dim order: DIDz\*DIDx"):
        placements_from_layouts("T5", mesh, [(), ("x", "z", Size(2))])


def test_annotate_from_dtensor(fake_world):
    torch_mesh = TorchDeviceMesh("cpu", torch.arange(8).reshape(2, 2, 2))
    local = torch.zeros(2, 3, 5)
    dt = DTensor.from_local(local, torch_mesh, [Shard(0), Shard(0), Shard(1)], run_check=False,
                            shape=torch.Size([8, 6, 5]), stride=(30, 5, 1))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, 5], dtype=DataType.Float)
        fd.add_output(fd.ops.relu(x))
        annotate_from_dtensor(x, dt)
    assert x.mesh == nvfuser.multidevice.DeviceMesh(torch.arange(8).reshape(2, 2, 2))
    plan = nvfuser.propagate_shardings(fd, [[8, 6, 5]])
    assert plan.mesh_axes(x) == [["z", "y"], ["x"], []]
    assert placements_from_layouts("T0", x.mesh, [plan.program.state[x].layouts[k] for k in range(3)]) == \
        [Shard(0), Shard(0), Shard(1)]
    uneven = DTensor.from_local(torch.zeros(1, 5), TorchDeviceMesh("cpu", torch.arange(8)), [Shard(0)],
                                run_check=False, shape=torch.Size([9, 5]), stride=(5, 1))
    with FusionDefinition() as fd2:
        y = fd2.define_tensor([-1, 5], dtype=DataType.Float)
        fd2.add_output(fd2.ops.relu(y))
        with pytest.raises(NvShardError, match=r"T0: the DTensor's dim 0 has extent 9, which its Shard placements "
                                               r"\(8 devices\) do not divide evenly"):
            annotate_from_dtensor(y, uneven)


def test_execute_with_dtensors_input_errors(fake_world):
    torch_mesh = TorchDeviceMesh("cpu", torch.arange(8).reshape(2, 4))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 4], dtype=DataType.Float)
        fd.add_output(fd.ops.relu(x))
        x.set_device_mesh(nvfuser.multidevice.DeviceMesh(torch.arange(8)))
    dt = DTensor.from_local(torch.zeros(2, 4), torch_mesh, [Shard(0), Replicate()], run_check=False,
                            shape=torch.Size([4, 4]), stride=(4, 1))
    with pytest.raises(NvShardError, match=r"T0 is annotated on DeviceMesh\{0 1 2 3 4 5 6 7\}, but its DTensor is on "
                                           r"DeviceMesh\{\{0 1 2 3\}\{4 5 6 7\}\}"):
        nvfuser.execute_with_dtensors(fd, [dt])
    with pytest.raises(NvShardError, match=r"T0: execute_with_dtensors needs a DTensor, got Tensor"):
        nvfuser.execute_with_dtensors(fd, [torch.zeros(4, 4)])
    with pytest.raises(NvShardError, match=r"the fusion has 1 inputs but execute_with_dtensors got 2"):
        nvfuser.execute_with_dtensors(fd, [dt, dt])


def test_strided_shard_is_refused(fake_world):
    from torch.distributed.tensor.placement_types import _StridedShard

    torch_mesh = TorchDeviceMesh("cpu", torch.arange(8).reshape(2, 4))
    dt = DTensor.from_local(torch.zeros(2, 4), torch_mesh, [_StridedShard(0, split_factor=4), Shard(0)],
                            run_check=False, shape=torch.Size([16, 4]), stride=(4, 1))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 4], dtype=DataType.Float)
        fd.add_output(fd.ops.relu(x))
        with pytest.raises(NvShardError, match=r"T0: DTensor placement .* on mesh dim 0 is not supported "
                                               r"\(Shard, Replicate or Partial\)"):
            annotate_from_dtensor(x, dt)
