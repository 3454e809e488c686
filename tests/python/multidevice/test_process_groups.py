"""nvshard communicates on process groups of its own and never initialises
torch's default process group, so a program that makes the default group
itself (upstream's test_dtensor, test_expert_parallel) runs beside it in
one process, before or after nvshard's first collective."""

import datetime
import socket

import pytest
import torch
import torch.distributed as dist

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition


def _allgather_fusion(d):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 3], dtype=DataType.Float)
        y = fd.ops.relu(x)
        fd.add_output(y)
        mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d))
        x.set_device_mesh(mesh)
        y.set_device_mesh(mesh)
        x.outer_split(0, d)
        x.axis(0).parallelize(nvfuser.ParallelType.mesh_x)
    return fd


def _free_port_everywhere() -> int:
    from mpi4py import MPI

    port = None
    if MPI.COMM_WORLD.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    return MPI.COMM_WORLD.bcast(port, root=0)


@pytest.mark.mpi
def test_default_process_group_stays_the_programs(multidevice_test):
    d = multidevice_test.size
    ref = torch.randn(d * 2, 3)
    fd = _allgather_fusion(d)
    had_default_group = dist.is_initialized()  # test_dtensor's programs make one, as DTensor users do
    results = multidevice_test.execute(fd, [ref])
    multidevice_test.check(results, 0, ref.relu())
    assert [c.kind for c in results.plan.communications] == (["allgather"] if d > 1 else [])
    assert dist.is_initialized() == had_default_group  # nvshard's collectives neither made nor needed it
    if multidevice_test.simulated:
        return
    # The program makes the default group now (unless it already has); nvshard goes on beside it.
    if not had_default_group:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port_everywhere()}",
                                rank=multidevice_test.rank, world_size=d, timeout=datetime.timedelta(seconds=60))
    try:
        t = torch.full((2,), float(multidevice_test.rank))
        dist.all_reduce(t)
        torch.testing.assert_close(t, torch.full((2,), float(sum(range(d)))))
        again = multidevice_test.execute(fd, [ref])
        multidevice_test.check(again, 0, ref.relu())
        assert again.received[multidevice_test.rank] == results.received[multidevice_test.rank] > 0
    finally:
        if not had_default_group:
            dist.destroy_process_group()
