"""Adversarial inputs: conflicting annotations, pipeline stages on different
meshes, non-divisible extents, op/sharding combinations an op cannot run
sharded, and bad inputs at execute. Each either fails with a clear
NvShardError (naming the tensor and axis) or is resharded by explicit
communication, with correct numerics, bytes equal to the plan's, and the
decision explained."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, NvShardError
from nvshard.api import shard_by_plan

P = nvfuser.ParallelType


def mesh(devices, shape=None):
    t = torch.tensor(devices)
    return nvfuser.multidevice.DeviceMesh(t.reshape(shape) if shape is not None else t)


def block(tv, axis, mesh_axis, d):
    """Logical axis `axis` (at loop position `axis`): outer split by d on mesh_axis."""
    tv.outer_split(axis, d)
    tv.axis(axis).parallelize(mesh_axis)


def cyclic(tv, axis, mesh_axis, d):
    tv.inner_split(axis, d)
    tv.axis(axis + 1).parallelize(mesh_axis)


def simulate_and_check(fd, inputs, expected, atol=1e-5, rtol=1e-5):
    """Every rank's shard of every output equals the reference's, and the
    bytes each rank received equal the plan's."""
    sim = nvfuser.simulate(fd, inputs)
    plan = sim.plan
    for i, (tv, ref) in enumerate(zip(plan.program.outputs, expected)):
        state = plan.program.state[tv]
        for rank, outs in sim.outputs.items():
            if state.mesh is not None and not state.mesh.has(rank):
                assert outs[i].numel() == 0
                continue
            torch.testing.assert_close(outs[i], shard_by_plan(plan, tv, ref, rank), atol=atol, rtol=rtol)
        torch.testing.assert_close(sim.output(i), ref, atol=atol, rtol=rtol)
    for rank in set(sim.received) | set(range(max(plan.devices(), default=0) + 1)):
        assert sim.received.get(rank, 0.0) == pytest.approx(plan.bytes_received(rank))
    return sim


def kinds(plan) -> list:
    return sorted(c.kind for c in plan.communications)


# -- conflicting annotations ---------------------------------------------------------------------


def test_operands_on_different_meshes_are_moved_and_explained():
    """add() needs its operands together, but the user put them on disjoint
    meshes with different shardings: one is moved across (no error), the
    result is right, and the log says which side won and why."""
    m0, m1 = mesh([0, 1]), mesh([2, 3])
    with FusionDefinition() as fd:
        a = fd.define_tensor([8, 16], dtype=DataType.Float)
        b = fd.define_tensor([8, 16], dtype=DataType.Float)
        c = fd.ops.add(a, b)
        fd.add_output(c)
        a.set_device_mesh(m0)
        block(a, 0, P.mesh_x, 2)
        b.set_device_mesh(m1)
        block(b, 1, P.mesh_x, 2)
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    sim = simulate_and_check(fd, [x, y], [x + y])
    plan = sim.plan
    assert plan.mesh(c) in (m0, m1)
    assert {"broadcast", "send_recv"} & set(kinds(plan)), plan.report()
    explanation = "\n".join(plan.explain(c))
    assert "conflict at" in explanation and "winner" in explanation, explanation
    # the annotated operands are untouched
    assert plan.mesh(a) == m0 and plan.mesh_axes(a) == [["x"], []]
    assert plan.mesh(b) == m1 and plan.mesh_axes(b) == [[], ["x"]]


def test_annotated_consumer_disagreeing_with_both_operands():
    """Both operands say DIDx on axis 0 and DIDy on axis 1, the annotated sum
    says the opposite: the annotation wins, the operands are resharded
    (all-to-all, no allgather of everything), numerics hold."""
    m = mesh([0, 1, 2, 3], (2, 2))
    with FusionDefinition() as fd:
        a = fd.define_tensor([8, 16], dtype=DataType.Float)
        b = fd.define_tensor([8, 16], dtype=DataType.Float)
        c = fd.ops.mul(a, b)
        d = fd.ops.relu(c)
        fd.add_output(d)
        for tv in (a, b, c):
            tv.set_device_mesh(m)
        for tv in (a, b):
            block(tv, 1, P.mesh_y, 2)
            block(tv, 0, P.mesh_x, 2)
        block(c, 1, P.mesh_x, 2)
        block(c, 0, P.mesh_y, 2)
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    sim = simulate_and_check(fd, [x, y], [torch.relu(x * y)])
    plan = sim.plan
    assert plan.mesh_axes(c) == [["y"], ["x"]]
    assert plan.mesh_axes(d) == [["y"], ["x"]]  # follows its producer, no extra move
    # each operand's [4, 8] shard is transposed over the mesh; gathering both
    # whole would cost 2 * 3 * 128 B per device
    assert plan.bytes_per_device <= 2 * 2 * 128, plan.report()


@pytest.mark.parametrize("winner", ["a", "b"])
def test_priority_decides_a_conflict(winner):
    """Two annotations propose different axes for DIDx of one result; the one
    with the lower priority number wins, whichever it is."""
    m = mesh([0, 1])
    with FusionDefinition() as fd:
        a = fd.define_tensor([8, 16], dtype=DataType.Float)
        b = fd.define_tensor([8, 16], dtype=DataType.Float)
        c = fd.ops.add(a, b)
        d = fd.ops.sigmoid(c)
        fd.add_output(d)
        a.set_device_mesh(m)
        block(a, 0, P.mesh_x, 2)
        b.set_device_mesh(m)
        block(b, 1, P.mesh_x, 2)
        a.set_sharding_priority(0 if winner == "a" else 1)
        b.set_sharding_priority(1 if winner == "a" else 0)
    plan = nvfuser.propagate_shardings(fd)
    want = [["x"], []] if winner == "a" else [[], ["x"]]
    assert plan.mesh_axes(c) == want and plan.mesh_axes(d) == want
    assert any(f"from {(a if winner == 'a' else b).short_name()}" in line for line in plan.explain(c))
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    simulate_and_check(fd, [x, y], [torch.sigmoid(x + y)])


def test_contraction_sharded_block_and_cyclic_on_the_two_operands():
    """matmul's k is DIDx on both operands, but block on one and cyclic on the
    other: the partial sums would not line up, so one operand is resharded
    before the contraction."""
    m = mesh([0, 1])
    with FusionDefinition() as fd:
        a = fd.define_tensor([8, 16], dtype=DataType.Float)
        b = fd.define_tensor([16, 8], dtype=DataType.Float)
        c = fd.ops.matmul(a, b)
        fd.add_output(c)
        a.set_device_mesh(m)
        block(a, 1, P.mesh_x, 2)
        b.set_device_mesh(m)
        cyclic(b, 0, P.mesh_x, 2)
    x, y = torch.randn(8, 16), torch.randn(16, 8)
    sim = simulate_and_check(fd, [x, y], [x @ y], atol=1e-4)
    assert sim.plan.communications, "the mismatched k layouts need communication"


# -- pipeline stages (several meshes) ------------------------------------------------------------


def test_pipeline_stages_of_one_shape_send_and_receive():
    """Stage 0 on devices {0, 1}, stage 1 on {2, 3}, both sharded alike: each
    shard goes device to device (send/recv), nothing is gathered."""
    s0, s1 = mesh([0, 1]), mesh([2, 3])
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 16], dtype=DataType.Float)
        w0 = fd.define_tensor([16, 16], dtype=DataType.Float)
        w1 = fd.define_tensor([16, 16], dtype=DataType.Float)
        h = fd.ops.relu(fd.ops.linear(x, w0))
        y = fd.ops.linear(h, w1)
        fd.add_output(y)
        for tv in (x, w0, h):
            tv.set_device_mesh(s0)
        for tv in (w1, y):
            tv.set_device_mesh(s1)
        block(x, 0, P.mesh_x, 2)
        block(h, 0, P.mesh_x, 2)
        block(y, 0, P.mesh_x, 2)
    xs, a, b = torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16)
    sim = simulate_and_check(fd, [xs, a, b], [F.linear(torch.relu(F.linear(xs, a)), b)], atol=1e-4)
    plan = sim.plan
    assert "send_recv" in kinds(plan), plan.report()
    send = next(c for c in plan.communications if c.kind == "send_recv")
    assert sorted(sorted(g) for g in send.groups) == [[0, 2], [1, 3]]
    assert send.bytes_received == 4 * 16 * 4  # one [4, 16] float shard
    assert "allgather" not in kinds(plan)


def test_pipeline_stage_onto_a_larger_mesh_broadcasts():
    s0, s1 = mesh([0]), mesh([1, 2, 3])
    with FusionDefinition() as fd:
        a = fd.define_tensor([12, 16], dtype=DataType.Float)
        b = fd.ops.relu(a)
        c = fd.ops.sigmoid(b)
        fd.add_output(c)
        a.set_device_mesh(s0)
        b.set_device_mesh(s0)
        c.set_device_mesh(s1)
        block(c, 0, P.mesh_x, 3)
    x = torch.randn(12, 16)
    sim = simulate_and_check(fd, [x], [torch.sigmoid(torch.relu(x))])
    assert kinds(sim.plan) == ["broadcast"]
    assert sim.received.get(0, 0.0) == 0.0 and sim.received[1] == 12 * 16 * 4


def test_three_stages_on_overlapping_meshes():
    """Stages on {0, 1}, {1, 2} and {3, 0}: devices take part in two stages;
    every move is explicit and the result is right."""
    s0, s1, s2 = mesh([0, 1]), mesh([1, 2]), mesh([3, 0])
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 8], dtype=DataType.Float)
        a = fd.ops.tanh(x)
        b = fd.ops.mul(a, a)
        c = fd.ops.sum(b, dims=[1])
        fd.add_output(c)
        fd.add_output(a)
        x.set_device_mesh(s0)
        block(x, 1, P.mesh_x, 2)
        b.set_device_mesh(s1)
        block(b, 0, P.mesh_x, 2)
        c.set_device_mesh(s2)
    xs = torch.randn(8, 8)
    a_ref = torch.tanh(xs)
    sim = simulate_and_check(fd, [xs], [(a_ref * a_ref).sum(1), a_ref])
    assert set(kinds(sim.plan)) & {"send_recv", "broadcast"}


# -- non-divisible extents ---------------------------------------------------------------------------


def test_static_extent_not_divisible_is_named():
    with FusionDefinition() as fd:
        a = fd.define_tensor([10, 16], dtype=DataType.Float)
        fd.add_output(fd.ops.relu(a))
        a.set_device_mesh(mesh([0, 1, 2, 3]))
        block(a, 0, P.mesh_x, 4)
    with pytest.raises(NvShardError, match=rf"{a.short_name()}: axis 0 has extent 10.*DIDx \(4 devices\)"):
        nvfuser.propagate_shardings(fd)


@pytest.mark.parametrize("split", ["block", "cyclic", "nested"])
def test_symbolic_extent_not_divisible_at_run_time_is_named(split):
    m = mesh([0, 1, 2, 3], (2, 2))
    with FusionDefinition() as fd:
        a = fd.define_tensor([16, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(a))
        a.set_device_mesh(m)
        if split == "block":
            block(a, 1, P.mesh_x, 2)
        elif split == "cyclic":
            cyclic(a, 1, P.mesh_x, 2)
        else:  # DIDy*DIDx: 4 devices on one axis
            block(a, 1, P.mesh_y, 2)
            block(a, 2, P.mesh_x, 2)
    x = torch.randn(16, 12)
    simulate_and_check(fd, [x], [-x])  # divisible: runs
    bad = 6 if split == "nested" else 7  # 4 devices do not divide 6; 2 do not divide 7
    with pytest.raises(NvShardError, match=rf"{a.short_name()}: axis 1 has extent {bad}, which is not divisible"):
        nvfuser.simulate(fd, [torch.randn(16, bad)])


def test_annotated_intermediate_not_divisible_is_named():
    """The input is fine; the annotated intermediate (a slice) is not."""
    m = mesh([0, 1, 2, 3])
    with FusionDefinition() as fd:
        a = fd.define_tensor([16, 8], dtype=DataType.Float)
        s = fd.ops.slice(a, start_indices=[0, 0], end_indices=[6, 8])
        fd.add_output(fd.ops.relu(s))
        a.set_device_mesh(m)
        block(a, 0, P.mesh_x, 4)
        s.set_device_mesh(m)
        block(s, 0, P.mesh_x, 4)
    with pytest.raises(NvShardError, match=rf"{s.short_name()}: axis 0 has extent 6"):
        nvfuser.propagate_shardings(fd)


def test_propagation_never_makes_an_extent_indivisible():
    """DIDx (4 devices) on an axis of 16 meets a reshape to [2, 8] and a
    slice to 6 rows: it cannot go there, so they are gathered, not sharded
    into an error."""
    m = mesh([0, 1, 2, 3])
    with FusionDefinition() as fd:
        a = fd.define_tensor([16, 8], dtype=DataType.Float)
        r = fd.ops.reshape(a, new_shape=[2, 8, 8])
        s = fd.ops.slice(a, start_indices=[0, 0], end_indices=[6, 8])
        fd.add_output(fd.ops.relu(r))
        fd.add_output(fd.ops.relu(s))
        a.set_device_mesh(m)
        block(a, 0, P.mesh_x, 4)
    x = torch.randn(16, 8)
    sim = simulate_and_check(fd, [x], [torch.relu(x.reshape(2, 8, 8)), torch.relu(x[:6])])
    assert sim.plan.mesh_axes(s) == [[], []]
    assert "x" not in sim.plan.mesh_axes(r)[0]


# -- ops that cannot run sharded the way they are annotated --------------------------------------------


@pytest.mark.parametrize("keepdim", [False, True])
def test_var_mean_over_a_sharded_axis_gathers_it(keepdim):
    """var_mean needs its normalized axis whole (partial variances do not
    add): the sharded axis is gathered before it, results are exact."""
    m = mesh([0, 1])
    with FusionDefinition() as fd:
        a = fd.define_tensor([8, 16], dtype=DataType.Float)
        var, mean = fd.ops.var_mean(a, dims=[1], correction=1, keepdim=keepdim)
        fd.add_output(var)
        fd.add_output(mean)
        if keepdim:
            fd.add_output(fd.ops.sub(a, mean))
        a.set_device_mesh(m)
        block(a, 1, P.mesh_x, 2)
    x = torch.randn(8, 16)
    v, mu = torch.var_mean(x, dim=1, correction=1, keepdim=keepdim)
    sim = simulate_and_check(fd, [x], [v, mu] + ([x - mu] if keepdim else []))
    assert "allgather" in kinds(sim.plan)
    assert sim.plan.partial_axes(var) == []


def test_var_mean_partial_result_annotation_is_rejected():
    """A pending sum (rDIDx) on var_mean's result asks for partial variances,
    which do not add: rejected (when the definition closes, or at the latest
    when planning), naming the tensor and axis."""
    with pytest.raises(NvShardError, match=r"T1: reduction axis 1 is parallelized on deviceIdx.x.*var_mean"):
        with FusionDefinition() as fd:
            a = fd.define_tensor([8, 16], dtype=DataType.Float)
            var, mean = fd.ops.var_mean(a, dims=[1])
            fd.add_output(var)
            var.set_device_mesh(mesh([0, 1]))
            block(var, 1, P.mesh_x, 2)
        nvfuser.propagate_shardings(fd)


def _attention_reference(q, k, v, causal):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    return torch.softmax(scores, -1) @ v, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sharded", ["key_length", "head_dim", "query_length"])
def test_sdpa_with_sharded_axes(sharded, causal):
    """sdpfa_fwd needs the key length and the q/k head dim whole: those are
    gathered; the query length passes through (no communication)."""
    m = mesh([0, 1, 2, 3])
    with FusionDefinition() as fd:
        q = fd.define_tensor([2, 2, 16, 8], dtype=DataType.Float)
        k = fd.define_tensor([2, 2, 16, 8], dtype=DataType.Float)
        v = fd.define_tensor([2, 2, 16, 8], dtype=DataType.Float)
        out, lse, _, _ = fd.ops.sdpfa_fwd(q, k, v, dropout_p=0.0, is_causal=causal)
        fd.add_output(out)
        fd.add_output(lse)
        for tv in (q, k, v):
            tv.set_device_mesh(m)
        if sharded == "key_length":
            block(k, 2, P.mesh_x, 4)
            block(v, 2, P.mesh_x, 4)
        elif sharded == "head_dim":
            block(q, 3, P.mesh_x, 4)
            block(k, 3, P.mesh_x, 4)
        else:
            block(q, 2, P.mesh_x, 4)
    ins = [torch.randn(2, 2, 16, 8) for _ in range(3)]
    sim = simulate_and_check(fd, ins, list(_attention_reference(*ins, causal)), atol=1e-5)
    plan = sim.plan
    if sharded == "query_length":
        assert plan.communications == [] and plan.mesh_axes(out)[2] == ["x"]
    else:
        assert kinds(plan) == ["allgather", "allgather"]
        assert plan.mesh_axes(out) == [[], [], [], []]


@pytest.mark.parametrize("op", ["slice", "cat"])
def test_slice_and_cat_along_a_sharded_axis(op):
    m = mesh([0, 1])
    with FusionDefinition() as fd:
        a = fd.define_tensor([16, 8], dtype=DataType.Float)
        if op == "slice":
            out = fd.ops.slice(a, start_indices=[4, 0], end_indices=[12, 8])
        else:
            out = fd.ops.cat([a, fd.ops.neg(a)], dim=0)
        fd.add_output(out)
        a.set_device_mesh(m)
        block(a, 0, P.mesh_x, 2)
    x = torch.randn(16, 8)
    ref = x[4:12] if op == "slice" else torch.cat([x, -x], 0)
    sim = simulate_and_check(fd, [x], [ref])
    assert sim.plan.communications, "a sliced/concatenated axis must be whole"


def test_reshape_across_a_sharded_axis_that_does_not_fit():
    """[16 -> DIDx(4), 8] reshaped to [2, 64]: DIDx would straddle the new
    axes, so the data is gathered first (and the result is right)."""
    m = mesh([0, 1, 2, 3])
    with FusionDefinition() as fd:
        a = fd.define_tensor([16, 8], dtype=DataType.Float)
        r = fd.ops.reshape(a, new_shape=[2, 64])
        fd.add_output(fd.ops.relu(r))
        a.set_device_mesh(m)
        block(a, 0, P.mesh_x, 4)
    x = torch.randn(16, 8)
    sim = simulate_and_check(fd, [x], [torch.relu(x.reshape(2, 64))])
    assert kinds(sim.plan) == ["allgather"]


def test_user_pending_sum_on_an_output_is_reduced():
    """The user asks for matmul's contraction to stay sharded (rDIDx) on a
    fusion output: every device still ends with the full product."""
    m = mesh([0, 1])
    with FusionDefinition() as fd:
        a = fd.define_tensor([8, 16], dtype=DataType.Float)
        b = fd.define_tensor([16, 8], dtype=DataType.Float)
        c = fd.ops.matmul(a, b)
        fd.add_output(c)
        a.set_device_mesh(m)
        block(a, 1, P.mesh_x, 2)
        c.set_device_mesh(m)
        block(c, 2, P.mesh_x, 2)
    x, y = torch.randn(8, 16), torch.randn(16, 8)
    sim = simulate_and_check(fd, [x, y], [x @ y], atol=1e-4)
    assert kinds(sim.plan) == ["allreduce"]
    for rank in (0, 1):
        torch.testing.assert_close(sim.outputs[rank][0], x @ y, atol=1e-4, rtol=1e-4)


# -- bad annotations and bad inputs ------------------------------------------------------------------


def _define(annotate):
    with FusionDefinition() as fd:
        a = fd.define_tensor([8, 16], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(a))
        annotate(a)
    return fd


@pytest.mark.parametrize("annotate, message", [
    (lambda a: (a.set_device_mesh(mesh([0, 1])), block(a, 0, P.mesh_x, 2), block(a, 2, P.mesh_x, 2)),
     r"T0: .*deviceIdx.x already parallelizes loop axis 0"),
    (lambda a: (a.set_device_mesh(mesh([0, 1])), block(a, 0, P.mesh_y, 2)),
     r"T0: cannot parallelize loop axis 0 on deviceIdx.y"),
    (lambda a: (a.set_device_mesh(mesh([0, 1])), a.axis(0).parallelize(P.mesh_x)),
     r"T0: loop axis 0 has extent 8 but deviceIdx.x has 2 devices"),
    (lambda a: a.set_sharding_priority(1), r"T0: set_sharding_priority needs a device mesh"),
    (lambda a: (a.set_device_mesh(mesh([0, 1])), a.set_sharding_priority(-1)), r"T0: sharding priority must be"),
    (lambda a: block(a, 0, P.mesh_x, 2),
     r"T0: loop axis 0 is parallelized on deviceIdx.x but the tensor has no device mesh"),
], ids=["mesh_axis_twice", "axis_not_in_mesh", "unsplit_axis", "priority_without_mesh", "negative_priority",
        "parallelize_without_mesh"])
def test_bad_annotations_are_rejected(annotate, message):
    with pytest.raises(NvShardError, match=message):
        _define(annotate)


@pytest.fixture
def add_fusion():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, 16], dtype=DataType.Float)
        b = fd.define_tensor([-1, 16], dtype=DataType.Float)
        c = fd.define_tensor([1, 16], dtype=DataType.Float)
        fd.add_output(fd.ops.add(fd.ops.add(a, b), c))
    return fd


@pytest.mark.parametrize("inputs, message", [
    (lambda: [torch.randn(4, 16), torch.randn(4, 16)], r"the fusion has 3 inputs \(T0, T1, T2\) but execute got 2"),
    (lambda: [torch.randn(4, 16, 1), torch.randn(4, 16), torch.randn(1, 16)], r"input 0 \(T0\) must have rank 2"),
    (lambda: [torch.randn(4, 16).double(), torch.randn(4, 16), torch.randn(1, 16)],
     r"input 0 \(T0\) must have dtype torch.float32"),
    (lambda: [torch.randn(4, 8), torch.randn(4, 8), torch.randn(1, 8)],
     r"T0: axis 1 has extent 8, but define_tensor declared 16"),
    (lambda: [torch.randn(4, 16), torch.randn(5, 16), torch.randn(1, 16)], r"T1: axis 0 has extent 5.*must be equal"),
    (lambda: [torch.randn(4, 16), torch.randn(4, 16), torch.randn(3, 16)], r"T2: axis 0 is a broadcast axis"),
    (lambda: [[1.0] * 16, torch.randn(4, 16), torch.randn(1, 16)], r"input 0 \(T0\) must be a torch.Tensor"),
], ids=["count", "rank", "dtype", "static_extent", "symbolic_mismatch", "broadcast_extent", "not_a_tensor"])
def test_mismatched_inputs_at_execute(add_fusion, inputs, message):
    with pytest.raises(NvShardError, match=message):
        add_fusion.execute(inputs())


def test_mismatched_inputs_at_simulate():
    with FusionDefinition() as fd:
        a = fd.define_tensor([8, 16], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(a))
        a.set_device_mesh(mesh([0, 1]))
        block(a, 0, P.mesh_x, 2)
    with pytest.raises(NvShardError, match=r"T0: axis 1 has extent 12, but define_tensor declared 16"):
        nvfuser.simulate(fd, [torch.randn(8, 12)])
    with pytest.raises(NvShardError, match=r"the fusion has 1 inputs but simulate got 2"):
        nvfuser.simulate(fd, [torch.randn(8, 16), torch.randn(8, 16)])


def test_execute_in_too_few_processes_says_how_to_launch():
    with FusionDefinition() as fd:
        a = fd.define_tensor([8, 16], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(a))
        a.set_device_mesh(mesh([0, 1]))
        block(a, 0, P.mesh_x, 2)
    with pytest.raises(NvShardError, match=r"launch with mpirun -np 2"):
        fd.execute([torch.randn(4, 16)])
