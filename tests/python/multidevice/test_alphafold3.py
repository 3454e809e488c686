# mpirun -np 4 python -m pytest tests/python/multidevice/test_alphafold3.py --only-mpi -s
# (-np 8 runs dp=2; -np 1 simulates a 2x2 mesh in one process)

import pytest
import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition
from nvshard.models import Direction, annotate_triangle, triangle_reference, triangle_update

MiB = 1 << 20


def _inputs(b, n, c, dtype):
    t = dtype.torch_dtype
    return [
        torch.testing.make_tensor(b, n, n, c, dtype=t, device="cpu"),
        torch.testing.make_tensor(c, dtype=t, device="cpu"),
        torch.testing.make_tensor(c, dtype=t, device="cpu"),
        torch.testing.make_tensor(2 * c, c, dtype=t, device="cpu", low=-0.2, high=0.2),
        torch.testing.make_tensor(2 * c, c, dtype=t, device="cpu", low=-0.2, high=0.2),
        torch.testing.make_tensor(c, dtype=t, device="cpu"),
        torch.testing.make_tensor(c, dtype=t, device="cpu"),
        torch.testing.make_tensor(c, c, dtype=t, device="cpu", low=-0.2, high=0.2),
        torch.testing.make_tensor(c, c, dtype=t, device="cpu", low=-0.2, high=0.2),
        torch.testing.make_tensor(b, n, n, dtype=torch.bool, device="cpu"),
    ]


def _define(direction, d, c, dtype, swap=False):
    cp = 2
    dp = d // (cp * cp)
    with FusionDefinition() as fd:
        inputs, matmul_out = triangle_update(fd, direction, c, dtype, swap)
        mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d).reshape(dp, cp, cp))
        annotate_triangle(inputs, mesh, dp, cp)
    return fd, inputs, matmul_out, dp


@pytest.mark.mpi
@pytest.mark.parametrize("swap", [False, True], ids=["upstream_order", "swapped"])
@pytest.mark.parametrize("direction", [Direction.OUTGOING, Direction.INCOMING], ids=lambda d: d.value)
def test_triangle_updates(direction, swap, multidevice_test):
    d = multidevice_test.size
    cp_size = 2
    if d % (cp_size * cp_size) != 0:
        pytest.skip(f"{d} devices: need a multiple of {cp_size * cp_size}")
    c_z = 16
    fd, inputs, matmul_out, dp = _define(direction, d, c_z, DataType.BFloat16, swap)
    batch_per_rank, n_tokens_per_rank = 2, 4
    ins = _inputs(batch_per_rank * dp, n_tokens_per_rank * cp_size, c_z, DataType.BFloat16)
    results = multidevice_test.execute(fd, ins)

    # The matmul output gets the designed sharding with no annotation on it.
    plan = results.plan
    i_axis, j_axis = (2, 3) if not swap else (3, 2)
    expected = [["z"], [], [], []]
    expected[i_axis], expected[j_axis] = ["y"], ["x"]
    assert plan.mesh_axes(matmul_out) == expected
    assert plan.partial_axes(matmul_out) == (["x"] if direction is Direction.OUTGOING else ["y"])

    # Numerics against the unsharded reference, on every rank.
    ref = triangle_reference(direction, *ins)
    multidevice_test.check(results, 0, ref, atol=0.05, rtol=0.05)
    assert tuple(results.local(0).shape) == (batch_per_rank, n_tokens_per_rank, n_tokens_per_rank, c_z)

    # One allgather and one reduce-scatter, and the bytes moved equal the plan.
    kinds = sorted(c.kind for c in plan.communications)
    assert kinds == ["allgather", "reduce_scatter"]
    for rank, measured in results.received.items():
        assert measured == plan.bytes_received(rank)
