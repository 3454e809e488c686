"""Sharding propagation: the designed shardings (README: the triangle update's
hand-designed plan, the Megatron MLP), priorities,
legacy mode, and ports of nvFuser's propagation unit tests
(tests/cpp/test_sharding.cpp)."""

import pytest
import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, NvShardError
from nvshard.models import Direction, annotate_mlp, annotate_triangle, mlp, triangle_shapes, triangle_update

PT = nvfuser.ParallelType


def mesh_of(*shape):
    n = 1
    for s in shape:
        n *= s
    return nvfuser.multidevice.DeviceMesh(torch.arange(n).reshape(*shape))


def shard(tv, axis, parallel_type, d, mesh=None):
    if mesh is not None:
        tv.set_device_mesh(mesh)
    tv.outer_split(axis, d)
    tv.axis(axis).parallelize(parallel_type)


# -- the triangle multiplicative update -----------------------------------------


def _triangle(direction, swap=False, dp=1):
    with FusionDefinition() as fd:
        inputs, matmul_out = triangle_update(fd, direction, 128, DataType.Float, swap)
        annotate_triangle(inputs, mesh_of(dp, 2, 2), dp, 2)
    return fd, matmul_out


@pytest.mark.parametrize("swap", [False, True], ids=["upstream_order", "swapped"])
@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
@pytest.mark.parametrize("sizes", ["symbolic", "concrete"])
def test_triangle_matmul_output_gets_designed_sharding(direction, swap, sizes):
    fd, matmul_out = _triangle(direction, swap)
    plan = nvfuser.propagate_shardings(fd, None if sizes == "symbolic" else triangle_shapes(2, 64, 128))
    i, j = (2, 3) if not swap else (3, 2)
    expected = [["z"], [], [], []]
    expected[i], expected[j] = ["y"], ["x"]
    assert plan.mesh_axes(matmul_out) == expected
    assert plan.partial_axes(matmul_out) == (["x"] if direction is Direction.OUTGOING else ["y"])
    out = fd.fusion.outputs()[0]
    assert plan.mesh_axes(out) == [["z"], ["y"], ["x"], []]  # like z_in


@pytest.mark.parametrize("swap", [False, True], ids=["upstream_order", "swapped"])
@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
def test_triangle_bytes_match_designed_plan(direction, swap):
    fd, _ = _triangle(direction, swap)
    plan = nvfuser.propagate_shardings(fd, triangle_shapes(2, 64, 128))
    kinds = sorted((c.kind, c.bytes_received) for c in plan.communications)
    assert kinds == [("allgather", 1 << 20), ("reduce_scatter", 1 << 20)]
    assert plan.bytes_per_device == 2 << 20


def test_triangle_dp2_halves_bytes():
    fd, _ = _triangle(Direction.OUTGOING, dp=2)
    plan = nvfuser.propagate_shardings(fd, triangle_shapes(2, 64, 128))
    assert plan.bytes_per_device == 1 << 20


def test_legacy_reproduces_the_outgoing_bug():
    fd, matmul_out = _triangle(Direction.OUTGOING)
    legacy = nvfuser.propagate_shardings(fd, triangle_shapes(2, 64, 128), propagation="legacy")
    # The forward sweep takes the second operand first: j gets DIDy, i nothing.
    assert legacy.mesh_axes(matmul_out) == [["z"], [], [], ["y"]]
    default = nvfuser.propagate_shardings(fd, triangle_shapes(2, 64, 128))
    assert legacy.bytes_per_device > default.bytes_per_device


def test_legacy_gets_incoming_right():
    fd, matmul_out = _triangle(Direction.INCOMING)
    legacy = nvfuser.propagate_shardings(fd, triangle_shapes(2, 64, 128), propagation="legacy")
    assert legacy.mesh_axes(matmul_out) == [["z"], [], ["y"], ["x"]]
    assert legacy.partial_axes(matmul_out) == ["y"]


def test_legacy_mode_from_environment(monkeypatch):
    fd, matmul_out = _triangle(Direction.OUTGOING)
    monkeypatch.setenv("NVSHARD_PROPAGATION", "legacy")
    assert nvfuser.propagate_shardings(fd).mesh_axes(matmul_out)[2:] == [[], ["y"]]


def test_outgoing_log_names_the_conflict_and_why():
    fd, matmul_out = _triangle(Direction.OUTGOING)
    plan = nvfuser.propagate_shardings(fd, triangle_shapes(2, 64, 128))
    lines = "\n".join(plan.explain(matmul_out))
    conflict = next(l for l in plan.explain(matmul_out) if l.startswith("conflict"))
    # the winner shards i on DIDy and j on DIDx; the loser j on DIDy
    assert "-> candidate A {axis 2: DIDy (p0), axis 3: DIDx (p0)}" in conflict
    assert "axis 3: DIDy" in conflict
    assert "because fewer bytes (2.00 MiB" in conflict
    assert f"{matmul_out.short_name()} axis 3 <- DIDx" in lines


# -- the sequence-parallel MLP counter-example -------------------------------------


def _mlp(t, sequence_parallel=True, priorities=None, h=16):
    with FusionDefinition() as fd:
        ins, mids = mlp(fd, t, h)
        annotate_mlp(ins, mesh_of(4), sequence_parallel)
        for name, p in (priorities or {}).items():
            ins[name].set_sharding_priority(p)
    shapes = None if t == -1 else [[t, h], [4 * h, h], [h, 4 * h]]
    return nvfuser.propagate_shardings(fd, shapes), mids


def test_sp_mlp_symbolic_keeps_weights_stationary():
    plan, m = _mlp(-1)
    assert plan.mesh_axes(m["y"]) == [[], ["x"]]
    assert plan.mesh_axes(m["g"]) == [[], ["x"]]
    assert plan.mesh_axes(m["o"]) == [["x"], []] and plan.partial_axes(m["o"]) == ["x"]
    assert any("weights stay stationary" in l for l in plan.explain(m["y"]))


def test_sp_mlp_small_t_is_megatron():
    plan, m = _mlp(8)  # t = 8 < 4h = 64
    assert plan.mesh_axes(m["y"]) == [[], ["x"]]
    assert sorted(c.kind for c in plan.communications) == ["allgather", "reduce_scatter"]


def test_sp_mlp_large_t_moves_weights_and_logs_both_costs():
    plan, m = _mlp(512)  # t = 512 > 4h = 64: all-gathering both weights is cheaper
    assert plan.mesh_axes(m["y"]) == [["x"], []]
    assert plan.mesh_axes(m["g"]) == [["x"], []]
    assert plan.partial_axes(m["o"]) == []
    assert sorted((c.kind, c.tensor) for c in plan.communications) == [("allgather", "T1"), ("allgather", "T2")]
    conflict = next(l for l in plan.explain(m["y"]) if l.startswith("conflict"))
    # 4h*h*4 bytes * 3/4 = 3 KiB for up_w; t*h*4 * 3/4 = 24 KiB for inp
    assert "3.00 KiB" in conflict and "24.00 KiB" in conflict


@pytest.mark.parametrize("t", [-1, 8, 512])
def test_priorities_flip_the_sp_mlp(t):
    plan, m = _mlp(t, priorities={"up_w": 1, "down_w": 1})  # sequence parallel first
    assert plan.mesh_axes(m["y"]) == [["x"], []]
    plan, m = _mlp(t, priorities={"inp": 1})  # weights first
    assert plan.mesh_axes(m["y"]) == [[], ["x"]]


def test_tp_mlp_allreduces_the_output():
    plan, m = _mlp(8, sequence_parallel=False)
    assert plan.mesh_axes(m["y"]) == [[], ["x"]]
    assert plan.partial_axes(m["o"]) == ["x"]
    assert plan.mesh_axes(m["out"]) == [[], []]
    assert [c.kind for c in plan.communications] == ["allreduce"]


# -- ports of nvFuser's tests/cpp/test_sharding.cpp ---------------------------------


def test_propagate_sharding():
    # a [x, -, -] + b [-, -, x] on a 3-device mesh: c takes a's sharding
    # (nvFuser: first operand wins; nvshard: a tie on bytes, outer axis first)
    mesh = nvfuser.multidevice.DeviceMesh([0, 1, 2])
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1, -1])
        b = fd.define_tensor([-1, -1, -1])
        c = fd.ops.add(a, b)
        fd.add_output(c)
        for tv in (a, b):
            tv.set_device_mesh(mesh)
        a.axis(0).parallelize(PT.mesh_x)
        b.axis(2).parallelize(PT.mesh_x)
    plan = nvfuser.propagate_shardings(fd)
    assert plan.mesh_axes(c) == [["x"], [], []]
    assert any("tie: outer axes first" in l for l in plan.explain(c))


def test_residual_add_backpropagates_to_uniform():
    mesh = mesh_of(2)
    with FusionDefinition() as fd:
        tv0 = fd.define_tensor([-1, -1], contiguity=True)
        tv1 = fd.ops.uniform(0.0, 1.0, fd.ops.shape(tv0))
        tv2 = fd.ops.add(tv0, tv1)
        fd.add_output(tv1)
        fd.add_output(tv2)
        shard(tv0, 0, PT.mesh_x, 2, mesh)
    plan = nvfuser.propagate_shardings(fd)
    assert plan.mesh(tv1) == mesh
    assert plan.mesh_axes(tv1) == [["x"], []]


def test_propagate_parallel_type_once():
    mesh = mesh_of(2)
    with FusionDefinition() as fd:
        tv0 = fd.define_tensor([-1, -1], contiguity=True)
        tv1 = fd.define_tensor([-1, -1], contiguity=True)
        tv2 = fd.ops.add(tv0, tv1)
        fd.add_output(tv2)
        shard(tv0, 0, PT.mesh_x, 2, mesh)
        shard(tv1, 1, PT.mesh_x, 2, mesh)
    plan = nvfuser.propagate_shardings(fd)
    assert sum(axes.count("x") for axes in plan.mesh_axes(tv2)) == 1


def test_reduction_didx_is_ignored():
    # tv3 = linear(tv0 [M, K->x], tv1 [N, K->x]) has K pending; tv4 = tv2 [M, N->x] + tv3
    mesh = mesh_of(2)
    with FusionDefinition() as fd:
        tv0 = fd.define_tensor([-1, -1], contiguity=True)
        tv1 = fd.define_tensor([-1, -1], contiguity=True)
        tv2 = fd.define_tensor([-1, -1], contiguity=True)
        tv3 = fd.ops.linear(tv0, tv1)
        tv4 = fd.ops.add(tv2, tv3)
        fd.add_output(tv4)
        for tv in (tv0, tv1, tv2):
            shard(tv, 1, PT.mesh_x, 2, mesh)
    plan = nvfuser.propagate_shardings(fd)
    assert plan.mesh_axes(tv3) == [[], ["x"]]  # N sharded by back-propagation
    assert plan.partial_axes(tv3) == ["x"]  # K pending: a reduce-scatter onto N
    assert plan.mesh_axes(tv4) == [[], ["x"]]


def test_propagation_does_not_overwrite():
    mesh = mesh_of(2, 3)
    with FusionDefinition() as fd:
        tv0 = fd.define_tensor([-1, -1], contiguity=True)
        tv1 = fd.define_tensor([-1, -1], contiguity=True)
        tv2 = fd.ops.set(tv1)
        tv3 = fd.ops.add(tv0, tv2)
        fd.add_output(tv3)
        shard(tv0, 0, PT.mesh_x, 3, mesh)
        shard(tv1, 0, PT.mesh_y, 2, mesh)
    plan = nvfuser.propagate_shardings(fd)
    assert plan.mesh_axes(tv2) == [["y"], []]
    # tv0's DIDx (3 devices) stays: moving tv2 from DIDy (2) is cheaper
    assert plan.mesh_axes(tv3) == [["x"], []]


def test_backpropagate_to_sharded_tvs():
    mesh = mesh_of(2, 3)
    with FusionDefinition() as fd:
        tv0 = fd.define_tensor([-1, -1], contiguity=True)
        tv1 = fd.define_tensor([-1, -1], contiguity=True)
        tv2 = fd.ops.set(tv1)
        tv3 = fd.ops.add(tv0, tv2)
        fd.add_output(tv3)
        shard(tv0, 0, PT.mesh_x, 3, mesh)
        shard(tv1, 1, PT.mesh_y, 2, mesh)
    plan = nvfuser.propagate_shardings(fd)
    for tv in (tv2, tv3):
        assert plan.mesh_axes(tv) == [["x"], ["y"]]


def test_sharded_reshape_with_independent_split():
    mesh = mesh_of(2, 3)  # x has 3 devices, y has 2
    dx, dy = 3, 2
    with FusionDefinition() as fd:
        tv0 = fd.define_tensor([3 * dx, 5, 7 * dy, 9], contiguity=True)
        tv1 = fd.ops.reshape(tv0, [3 * dx * 5, 7 * dy * 9])
        fd.add_output(tv1)
        tv0.set_device_mesh(mesh)
        tv0.outer_split(0, dx)
        tv0.axis(0).parallelize(PT.mesh_x)
        tv0.outer_split(3, dy)
        tv0.axis(3).parallelize(PT.mesh_y)
    plan = nvfuser.propagate_shardings(fd)
    assert plan.mesh_axes(tv1) == [["x"], ["y"]]


def test_sharded_non_divisible_reshape_is_not_propagated():
    # nvFuser throws "Require the sharded ID to be divisible by the split
    # factor". nvshard keeps [6] -> [3, 2] correct instead: DIDx (2 devices)
    # cannot split the factor 3, so tv1 stays replicated, the decomposition
    # all-gathers before the reshape, and the log says why.
    mesh = mesh_of(2)
    with FusionDefinition() as fd:
        tv0 = fd.define_tensor([6], contiguity=True)
        tv1 = fd.ops.reshape(tv0, [3, 2])
        fd.add_output(tv1)
        shard(tv0, 0, PT.mesh_x, 2, mesh)
    plan = nvfuser.propagate_shardings(fd)
    assert plan.mesh_axes(tv1) == [[], []]
    assert [c.kind for c in plan.communications] == ["allgather"]
    assert any("cannot cross reshape" in l for l in plan.explain(tv0))
    sim = nvfuser.simulate(fd, [torch.arange(6.0)])
    torch.testing.assert_close(sim.output(0), torch.arange(6.0).reshape(3, 2))


def test_sharded_inner_reshape_merges_to_a_strided_layout():
    # nvFuser: "Expected the sharding to be on the outer reshaped id". nvshard
    # carries the inner sharding into the merged axis as a strided layout.
    mesh = mesh_of(2)
    with FusionDefinition() as fd:
        tv0 = fd.define_tensor([3, 10], contiguity=True)
        tv1 = fd.ops.reshape(tv0, [30])
        fd.add_output(tv1)
        shard(tv0, 1, PT.mesh_x, 2, mesh)
    plan = nvfuser.propagate_shardings(fd)
    assert plan.mesh_axes(tv1) == [["x"]]
    assert plan.communications == []
    full = torch.arange(30.0).reshape(3, 10)
    sim = nvfuser.simulate(fd, [full])
    torch.testing.assert_close(sim.output(0), full.reshape(30))
    torch.testing.assert_close(sim.outputs[1][0], full[:, 5:].reshape(15))


def test_annotated_tensors_are_never_changed():
    fd, matmul_out = _triangle(Direction.OUTGOING)
    plan = nvfuser.propagate_shardings(fd, triangle_shapes(2, 64, 128))
    z_in, mask = fd.fusion.inputs()[0], fd.fusion.inputs()[-1]
    assert plan.mesh_axes(z_in) == [["z"], ["y"], ["x"], []]
    assert plan.mesh_axes(mask) == [["z"], ["y"], ["x"]]
    for w in fd.fusion.inputs()[1:-1]:
        assert plan.mesh_axes(w) == [[] for _ in range(w.ndim)]


def test_a_mesh_axis_shards_one_axis_per_tensor():
    fd, _ = _triangle(Direction.INCOMING, swap=True)
    plan = nvfuser.propagate_shardings(fd, triangle_shapes(2, 64, 128))
    for tv in plan.propagated:
        axes = [m for k in tv.non_reduction_axes() for m in plan.program.state[tv].layouts[k] if isinstance(m, str)]
        assert len(axes) == len(set(axes)), tv


def test_pending_annotation_needs_a_sum():
    mesh = mesh_of(2)
    with pytest.raises(NvShardError, match=r"T1: reduction axis 1 is parallelized on deviceIdx.x, but var_mean"):
        with FusionDefinition() as fd:
            x = fd.define_tensor([4, 8], contiguity=True)
            var, mean = fd.ops.var_mean(x, dims=[1])
            fd.add_output(var)
            var.set_device_mesh(mesh)
            var.outer_split(1, 2)
            var.axis(1).parallelize(PT.mesh_x)


def test_pending_annotation_on_a_sum_is_honoured():
    mesh = mesh_of(2)
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 8], contiguity=True)
        s = fd.ops.sum(x, [1])
        fd.add_output(s)
        s.set_device_mesh(mesh)
        s.outer_split(1, 2)
        s.axis(1).parallelize(PT.mesh_x)  # compute partial sums, then allreduce
    plan = nvfuser.propagate_shardings(fd)
    assert plan.partial_axes(s) == ["x"]
    assert [c.kind for c in plan.communications] == ["allreduce"]
    full = torch.randn(4, 8)
    torch.testing.assert_close(nvfuser.simulate(fd, [full]).output(0), full.sum(1))


def test_op_rules_read_as_einsum_text():
    """A rule's text names each tensor's axes by factor (a reshape's merged
    axis in brackets, a broadcast or unsharded axis "1"), then the factors
    that are not pass-through; the cost model, the conflicts and the
    decomposition remember answers by it."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6, 8])
        w = fd.define_tensor([16, 8])
        y = fd.ops.linear(x, w)
        z = fd.ops.reshape(y, [24, 16])
        fd.add_output(fd.ops.sum(z, [0]))
    assert [e.rule().describe() for e in fd.fusion.exprs] == [
        "b0 b1 k, n k -> b0 b1 n k {k: sum}",
        "r0 r1 r2 -> (r0 r1) r2",
        "k0 a1 -> k0 a1 {k0: sum}",
    ]
