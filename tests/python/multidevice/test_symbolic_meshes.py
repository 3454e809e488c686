# mpirun -np 4 python -m pytest tests/python/multidevice/test_symbolic_meshes.py --only-mpi
#
# Symbolic extents when some ranks hold none of the inputs that define them:
# every rank must plan with the same concrete sizes.

import pytest
import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, NvShardError

PT = nvfuser.ParallelType


def _stage_fusion():
    """inp [-1, 16] rows on DIDx of {0, 1}; relu there; out = 2 * relu, rows on DIDx of {2, 3}."""
    first = nvfuser.multidevice.DeviceMesh(torch.tensor([0, 1]))
    second = nvfuser.multidevice.DeviceMesh(torch.tensor([2, 3]))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, 16], contiguity=True, dtype=DataType.Float)
        mid = fd.ops.relu(inp)
        out = fd.ops.mul(mid, 2.0)
        fd.add_output(out)
        for tv, mesh in ((inp, first), (mid, first), (out, second)):
            tv.set_device_mesh(mesh)
            tv.outer_split(0, 2)
            tv.axis(0).parallelize(PT.mesh_x)
    return fd


@pytest.mark.mpi
def test_symbolic_extent_reaches_ranks_outside_the_input_mesh(multidevice_test):
    """Ranks 2 and 3 hold no input, yet they learn the row count (12) and
    receive the result; ranks 0 and 1 send it (same mesh shape, same layout:
    one send/recv of a 6 x 16 f32 shard, 384 B to each receiver)."""
    if multidevice_test.size < 4:
        pytest.skip("needs 4 devices")
    fd = _stage_fusion()
    ref = torch.randn(12, 16)
    results = multidevice_test.execute(fd, [ref])
    assert [c.kind for c in results.plan.communications] == ["send_recv"]
    multidevice_test.check(results, 0, torch.relu(ref) * 2)
    for rank, measured in results.received.items():
        assert measured == results.plan.bytes_received(rank)
        assert measured == (384.0 if rank in (2, 3) else 0.0)


@pytest.mark.mpi
def test_ranks_disagreeing_on_a_symbolic_extent_all_raise(multidevice_test):
    """Rank 0 passes 6 rows, rank 1 passes 5: every rank (also 2 and 3, which
    hold nothing) raises the same error naming the input and axis, instead of
    some ranks waiting forever in a collective."""
    if multidevice_test.simulated or multidevice_test.size < 4:
        pytest.skip("needs 4 processes (the shapes each process passes)")
    fd = _stage_fusion()
    rank = multidevice_test.rank
    local = torch.randn(6 if rank == 0 else 5, 16) if rank in (0, 1) else torch.empty(0, 16)
    with pytest.raises(NvShardError, match=r"input 0 \(T0\).*disagree.*axis 0: ranks \[1\] give \[10, 16\], "
                                           r"ranks \[0\] give \[12, 16\]"):
        fd.execute([local])
