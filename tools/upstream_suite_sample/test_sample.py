"""Two tests in upstream's style for the runner's smoke run: one through
nvshard's own groups, one beside torch's default group."""

import pytest
import torch
import torch.distributed as dist

import nvfuser_direct as nvfuser
from nvfuser_direct import DataType, FusionDefinition


@pytest.mark.mpi
def test_allgather_relu(multidevice_test):
    d = multidevice_test.size
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 3], dtype=DataType.Float)
        y = fd.ops.relu(x)
        fd.add_output(y)
        x.set_device_mesh(mesh)
        y.set_device_mesh(mesh)
        x.outer_split(0, d)
        x.axis(0).parallelize(nvfuser.ParallelType.mesh_x)
    ref = torch.randn(d * 2, 3)
    (out,) = fd.execute([multidevice_test.shard_tensor(ref, x)])
    torch.testing.assert_close(out.cpu(), ref.relu())


@pytest.mark.mpi
def test_beside_the_default_group(setup_default_process_group, multidevice_test):
    t = torch.ones(2, device="cuda") * multidevice_test.rank
    dist.all_reduce(t)
    d = multidevice_test.size
    torch.testing.assert_close(t.cpu(), torch.full((2,), float(d * (d - 1) // 2)))
