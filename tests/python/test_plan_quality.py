"""Plan quality: programs where a hand-derived plan moves fewer bytes than
nvshard used to. Each test asserts the collectives and bytes per device of
the plan, and the simulated numerics against torch with bytes measured =
planned. The numbers in the docstrings are bytes received per device.
"""

from __future__ import annotations

import pytest
import torch

import nvshard as nvfuser
from nvshard import FusionDefinition

from nvshard.models import gelu_tanh
from nvshard.models import split_input as sharded  # a float input on mesh m, `axis` split over mesh_x

P = nvfuser.ParallelType
KiB = 1024.0
MiB = 1024.0 * 1024.0


def mesh(devices):
    return nvfuser.multidevice.DeviceMesh(torch.tensor(devices))


def place_rows(tv, m) -> None:
    """The user places a computed tensor on mesh m, its rows split over mesh_x."""
    tv.set_device_mesh(m)
    tv.outer_split(0, m.size)
    tv.axis(0).parallelize(P.mesh_x)


def collectives(plan) -> list:
    return sorted((c.kind, c.tensor, c.bytes_received) for c in plan.communications)


def check_numerics(fd, inputs, expected):
    sim = nvfuser.simulate(fd, inputs)
    for i, ref in enumerate(expected):
        torch.testing.assert_close(sim.output(i), ref, atol=1e-4, rtol=1e-4)
    for rank, got in sim.received.items():
        assert got == pytest.approx(sim.plan.bytes_received(rank))


def test_gathering_the_operands_beats_allreducing_a_partial_sum():
    """dW = dy^T @ x, dy and x [32, 128] split on the contracted tokens over 4
    devices, dW unannotated: allreducing the 64 KiB partial dW costs 96 KiB,
    reduce-scattering it 48 KiB, gathering both operands 24 KiB."""
    m = mesh([0, 1, 2, 3])
    with FusionDefinition() as fd:
        dy = sharded(fd, [32, 128], m, 0)
        x = sharded(fd, [32, 128], m, 0)
        fd.add_output(fd.ops.matmul(fd.ops.permute(dy, [1, 0]), x))
    plan = nvfuser.propagate_shardings(fd)
    assert collectives(plan) == [("allgather", "T1", 12 * KiB), ("allgather", "T2", 12 * KiB)]
    assert plan.bytes_per_device == 24 * KiB
    legacy = nvfuser.propagate_shardings(fd, propagation="legacy")
    assert [c.kind for c in legacy.communications] == ["allreduce"] and legacy.bytes_per_device == 96 * KiB
    a, b = torch.randn(32, 128), torch.randn(32, 128)
    check_numerics(fd, [a, b], [a.T @ b])


def test_a_partial_output_is_reduce_scattered_where_the_user_shards_it():
    """The same weight gradient with t=1024: gathering the operands costs
    768 KiB, allreducing the 64 KiB partial dW 96 KiB, reduce-scattering it
    onto dW's rows 48 KiB. Unannotated, dW comes back whole, as in nvFuser
    (upstream's row-parallel linear expects that), so it is allreduced;
    annotated on its rows, it is reduce-scattered."""
    m = mesh([0, 1, 2, 3])
    for annotated in (False, True):
        with FusionDefinition() as fd:
            dy = sharded(fd, [1024, 128], m, 0)
            x = sharded(fd, [1024, 128], m, 0)
            dw = fd.ops.matmul(fd.ops.permute(dy, [1, 0]), x)
            fd.add_output(dw)
            if annotated:
                dw.set_device_mesh(m)
                dw.outer_split(0, m.size)
                dw.axis(0).parallelize(P.mesh_x)
        plan = nvfuser.propagate_shardings(fd)
        if annotated:
            assert [(k, n) for k, _, n in collectives(plan)] == [("reduce_scatter", 48 * KiB)]
            assert plan.mesh_axes(dw) == [["x"], []]
        else:
            assert [(k, n) for k, _, n in collectives(plan)] == [("allreduce", 96 * KiB)]
            assert plan.mesh_axes(dw) == [[], []]
        a, b = torch.randn(1024, 128), torch.randn(1024, 128)
        check_numerics(fd, [a, b], [a.T @ b])


def test_a_replicated_output_is_computed_on_shards_and_gathered_once():
    """c = a + b with a, b [32, 64] row-sharded over 4 devices and c annotated
    replicated: gathering both operands costs 12 KiB, adding the shards and
    gathering the sum 6 KiB."""
    m = mesh([0, 1, 2, 3])
    with FusionDefinition() as fd:
        a = sharded(fd, [32, 64], m, 0)
        b = sharded(fd, [32, 64], m, 0)
        c = fd.ops.add(a, b)
        c.set_device_mesh(m)
        fd.add_output(c)
    plan = nvfuser.propagate_shardings(fd)
    assert plan.mesh_axes(c) == [[], []]
    assert [(k, n) for k, _, n in collectives(plan)] == [("allgather", 6 * KiB)]
    a_, b_ = torch.randn(32, 64), torch.randn(32, 64)
    check_numerics(fd, [a_, b_], [a_ + b_])


def test_a_gather_shared_by_several_consumers_counts_once():
    """Three column-parallel projections of one sequence-parallel x [64, 32]
    (weights [32, 32] split on their output features over 4 devices):
    gathering each weight costs 3 KiB, 9 KiB in all; gathering x once 6 KiB."""
    m = mesh([0, 1, 2, 3])
    with FusionDefinition() as fd:
        x = sharded(fd, [64, 32], m, 0)
        ws = [sharded(fd, [32, 32], m, 0) for _ in range(3)]
        ys = [fd.ops.linear(x, w) for w in ws]
        for y in ys:
            fd.add_output(y)
    plan = nvfuser.propagate_shardings(fd)
    assert collectives(plan) == [("allgather", "T0", 6 * KiB)]
    for y in ys:
        assert plan.mesh_axes(y) == [[], ["x"]]
    x_, w_ = torch.randn(64, 32), [torch.randn(32, 32) for _ in range(3)]
    check_numerics(fd, [x_] + w_, [x_ @ w.T for w in w_])


def test_stacked_mlp_blocks_move_the_weights_in_every_layer():
    """Residual sequence-parallel MLP blocks, t=8192 > 4h=4096 on 4 devices
    (tools/bench_propagation.py's stack): gathering both weights costs 24 MiB
    a layer, as XLA's plans do. The first layer did; from the second on the
    up-projection took the weight's sharding through the matmul before the
    activation's arrived (a gather of the activation and a reduce-scatter of
    the output, 48 MiB a layer)."""
    layers, t, h = 3, 8192, 1024
    m = mesh([0, 1, 2, 3])
    with FusionDefinition() as fd:
        x = sharded(fd, [t, h], m, 0)
        for _ in range(layers):
            up_w = sharded(fd, [4 * h, h], m, 0)
            down_w = sharded(fd, [h, 4 * h], m, 1)
            x = fd.ops.add(fd.ops.linear(gelu_tanh(fd, fd.ops.linear(x, up_w)), down_w), x)
        fd.add_output(x)
    plan = nvfuser.propagate_shardings(fd)
    assert [c.kind for c in plan.communications] == ["allgather"] * (2 * layers)
    assert plan.bytes_per_device == 24 * MiB * layers


def test_a_mesh_the_user_places_is_a_stage_cut():
    """Stage 1 on devices {0, 1} ends in a pointwise tail whose result the
    user sets onto {2, 3} (the next stage), everything split on the rows:
    only that result crosses (4 KiB to each device of stage 2). The tail used
    to follow the boundary's mesh backwards, and two tensors crossed (8 KiB)."""
    stage1, stage2 = mesh([0, 1]), mesh([2, 3])
    with FusionDefinition() as fd:
        x = sharded(fd, [64, 32], stage1, 0)
        h = fd.ops.relu(x)
        tail = fd.ops.add(fd.ops.mul(h, h), h)
        boundary = fd.ops.set(tail)
        place_rows(boundary, stage2)
        y = fd.ops.relu(boundary)
        fd.add_output(y)
    plan = nvfuser.propagate_shardings(fd)
    assert collectives(plan) == [("send_recv", "T3", 4 * KiB)]
    assert plan.program.state[tail].mesh == stage1
    x_ = torch.randn(64, 32)
    h_ = x_.relu()
    check_numerics(fd, [x_], [(h_ * h_ + h_).relu()])


def test_moving_a_placed_tensor_between_plans_moves_its_stage():
    """The stage meshes are kept with the fusion between plans: placing the
    boundary back on stage 1's devices after a plan must end the stage cut
    (its consumer's stage follows it), not reuse the kept stages."""
    stage1, stage2 = mesh([0, 1]), mesh([2, 3])
    with FusionDefinition() as fd:
        x = sharded(fd, [64, 32], stage1, 0)
        boundary = fd.ops.set(fd.ops.relu(x))
        place_rows(boundary, stage2)
        y = fd.ops.relu(boundary)
        fd.add_output(y)
    plan = nvfuser.propagate_shardings(fd)
    assert collectives(plan) == [("send_recv", "T1", 4 * KiB)]
    assert plan.program.state[y].mesh == stage2
    boundary.set_device_mesh(mesh([0, 1]))  # (an equal mesh, another object)
    plan = nvfuser.propagate_shardings(fd)
    assert collectives(plan) == []
    assert plan.program.state[y].mesh == stage1


def test_mlp_backward_under_sequence_parallelism_shards_both_weight_gradients():
    """Two linears forward and backward, x and dout [64, 32] split on the
    tokens, W1 [64, 32] on its output and W2 [32, 64] on its input features
    over 4 devices, the weight gradients annotated sharded on their rows (as
    training code shards gradients): 24 KiB (gather both weights,
    reduce-scatter dW1 and dW2). Before, da^T took x's sharding through the
    contraction ahead of da's and dW1 was allreduced: 36 KiB. Legacy moves
    49.5 KiB."""
    m = mesh([0, 1, 2, 3])
    with FusionDefinition() as fd:
        x = sharded(fd, [64, 32], m, 0)
        w1 = sharded(fd, [64, 32], m, 0)
        w2 = sharded(fd, [32, 64], m, 1)
        dout = sharded(fd, [64, 32], m, 0)
        h1 = fd.ops.linear(x, w1)
        out = fd.ops.linear(h1, w2)
        dh1 = fd.ops.matmul(dout, w2)
        dw2 = fd.ops.matmul(fd.ops.permute(dout, [1, 0]), h1)
        dx = fd.ops.matmul(dh1, w1)
        dw1 = fd.ops.matmul(fd.ops.permute(dh1, [1, 0]), x)
        for o in (out, dx, dw1, dw2):
            fd.add_output(o)
        for grad in (dw1, dw2):
            grad.set_device_mesh(m)
            grad.outer_split(0, m.size)
            grad.axis(0).parallelize(P.mesh_x)
    plan = nvfuser.propagate_shardings(fd)
    assert nvfuser.propagate_shardings(fd, propagation="legacy").bytes_per_device == 49.5 * KiB
    assert sorted(k for k, _, _ in collectives(plan)) == ["allgather", "allgather", "reduce_scatter", "reduce_scatter"]
    assert plan.bytes_per_device == 24 * KiB
    assert plan.mesh_axes(dw1) == [["x"], []] and plan.mesh_axes(dw2) == [["x"], []]
    x_, w1_, w2_, d_ = torch.randn(64, 32), torch.randn(64, 32), torch.randn(32, 64), torch.randn(64, 32)
    h_ = x_ @ w1_.T
    dh_ = d_ @ w2_
    check_numerics(fd, [x_, w1_, w2_, d_], [h_ @ w2_.T, dh_ @ w1_, dh_.T @ x_, d_.T @ h_])
