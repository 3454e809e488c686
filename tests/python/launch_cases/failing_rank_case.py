"""A test that fails on rank 1 while rank 0 enters a collective (run by test_launch.py)."""

import pytest
import torch

import nvshard as nvfuser
from nvshard import FusionDefinition


@pytest.mark.mpi
def test_rank1_fails(multidevice_test):
    d = multidevice_test.size
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([d * 2])
        out = fd.ops.set(inp)
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        inp.outer_split(0, d)
        inp.axis(0).parallelize(nvfuser.ParallelType.mesh_x)
        out.set_device_mesh(mesh)
    assert multidevice_test.rank != 1, "rank 1 fails on purpose"
    multidevice_test.execute(fd, [torch.ones(d * 2)])
