# mpirun -np 4 python -m pytest tests/python/multidevice/test_mlp.py --only-mpi
#
# The GPT MLP with a residual, tensor parallel and sequence parallel.

import pytest
import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition
from nvshard.models import annotate_mlp, mlp, mlp_reference


@pytest.mark.mpi
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "sp"])
def test_mlp(multidevice_test, sequence_parallel):
    d = multidevice_test.size
    t, h = 2 * d, 16  # t < 4h: Megatron's layout is the cheaper one
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        ins, mids = mlp(fd, -1, h, DataType.Float)
        annotate_mlp(ins, mesh, sequence_parallel)
    inp, up_w, down_w = torch.randn(t, h), torch.randn(4 * h, h) / 4, torch.randn(h, 4 * h) / 8
    results = multidevice_test.execute(fd, [inp, up_w, down_w])
    plan = results.plan
    assert plan.mesh_axes(mids["y"]) == [[], ["x"]]
    assert plan.partial_axes(mids["o"]) == ["x"]
    if sequence_parallel:
        assert [c.kind for c in plan.communications] == ["allgather", "reduce_scatter"]
        assert tuple(results.local(0).shape) == (t // d, h)
    else:
        assert [c.kind for c in plan.communications] == ["allreduce"]
        assert tuple(results.local(0).shape) == (t, h)
    multidevice_test.check(results, 0, mlp_reference(inp, up_w, down_w), atol=1e-4, rtol=1e-4)
    for rank, measured in results.received.items():
        assert measured == plan.bytes_received(rank)
