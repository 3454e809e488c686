"""The executor's reuse across executions of one plan (schedule, per-rank
EvalContext memo) and its copy-avoidance: results stay right from one
execution to the next, and an output never shares memory with an input."""

import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition
from nvshard.multidevice import DeviceMesh, shard_tensor
from nvshard.runtime.backends import SimulatedBackend
from nvshard.runtime.executor import run_program

P = nvfuser.ParallelType


def test_same_dtype_cast_output_does_not_alias_the_input():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6])
        fd.add_output(fd.ops.cast(x, DataType.Float))  # a set: no copy inside the program
        fd.add_output(fd.ops.permute(x, [1, 0]))
    x_ref = torch.randn(4, 6)
    kept = x_ref.clone()
    same, transposed = fd.execute([x_ref])
    assert torch.equal(same, x_ref) and torch.equal(transposed, x_ref.t())
    same.zero_()
    transposed.fill_(1.0)
    assert torch.equal(x_ref, kept)  # the caller's input is untouched


def test_repeated_executions_reuse_the_plan_and_stay_right():
    mesh = DeviceMesh(torch.arange(2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 6])
        w = fd.define_tensor([6, 6])
        y = fd.ops.linear(x, w)
        fd.add_output(fd.ops.add(y, fd.ops.uniform(0.0, 1.0, shape=[8, 6])))
        x.set_device_mesh(mesh)
        w.set_device_mesh(mesh)
        w.outer_split(1, 2)
        w.axis(1).parallelize(P.mesh_x)  # k sharded: partial sums, then a reduction
    plan = nvfuser.simulate(fd, [torch.randn(8, 6), torch.randn(6, 6)]).plan
    outs = []
    for execution in range(3):  # the same plan, so its schedule and contexts are reused
        x_ref, w_ref = torch.randn(8, 6), torch.randn(6, 6)
        per_rank = {r: [shard_tensor(x_ref, x, r), shard_tensor(w_ref, w, r)] for r in range(2)}
        out = run_program(plan, per_rank, SimulatedBackend(), torch.device("cpu"), execution)
        torch.testing.assert_close(out[0][0], out[1][0])  # the partial sums were reduced on both ranks
        noise = out[0][0] - x_ref @ w_ref.t()
        assert bool((noise >= -1e-5).all() and (noise <= 1 + 1e-5).all())  # the product is right each time
        outs.append(noise)
    # random numbers follow the execution count
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[1], outs[2])


def test_fd_execute_twice_runs_one_plan_with_fresh_random_numbers():
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 6])
        w = fd.define_tensor([6, 6])
        fd.add_output(fd.ops.add(fd.ops.linear(x, w), fd.ops.uniform(0.0, 1.0, shape=[8, 6])))
    x_ref, w_ref = torch.randn(8, 6), torch.randn(6, 6)
    first = fd.execute([x_ref, w_ref])[0]
    second = fd.execute([x_ref, w_ref])[0]
    assert len(fd._executor._plans) == 1  # one plan, its schedule reused
    for out in (first, second):
        noise = out - x_ref @ w_ref.t()
        assert bool((noise >= -1e-5).all() and (noise <= 1 + 1e-5).all())
    assert not torch.equal(first, second)  # the second execution draws new numbers
