"""The ops translate_fusion emits for the bridged programs, in nvshard alone
(no real nvFuser needed): expand, welford, the comparisons and
stride_order([]) against torch, their sharding rules, and sharded
execution on simulated ranks."""

import pytest
import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, NvShardError
from nvshard.multidevice import DeviceMesh

P = nvfuser.ParallelType


def _shard(tv, mesh, axis):
    tv.set_device_mesh(mesh)
    tv.outer_split(axis, mesh.size)
    tv.axis(axis).parallelize(P.mesh_x)


# -- expand -------------------------------------------------------------------------------------


def test_expand_matches_torch_and_prints_the_expanded_extent():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 1, 4])
        n = fd.ops.size(x, 0)
        y = fd.ops.expand(x, shape=[n, 5, -1])
        fd.add_output(fd.ops.mul(y, 2.0))
    x_ref = torch.randn(3, 1, 4)
    (out,) = fd.execute([x_ref])
    torch.testing.assert_close(out, x_ref.expand(3, 5, 4) * 2.0)
    assert str(y) == "T1_g_float[iS3{i0}, bS4{1 ex 5}, iS5{4}]"
    assert y.definition.rule().describe() == "a0 1 a2 -> a0 1 a2"  # the broadcast axis names no factor


def test_expand_rejects_a_new_extent_on_an_iteration_axis():
    with FusionDefinition() as fd:
        x = fd.define_tensor([3, 4])
        with pytest.raises(NvShardError, match=r"expand: axis 1 of T0 has extent 4 and is not a broadcast axis"):
            fd.ops.expand(x, shape=[3, 6])


def test_expanded_broadcast_axis_is_never_sharded():
    mesh = DeviceMesh(torch.arange(2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([1, 6])
        y = fd.define_tensor([8, 6])
        xe = fd.ops.expand(x, shape=[8, 6])
        out = fd.ops.add(xe, y)
        fd.add_output(out)
        x.set_device_mesh(mesh)
        _shard(y, mesh, 0)
    x_ref, y_ref = torch.randn(1, 6), torch.randn(8, 6)
    sim = nvfuser.simulate(fd, [x_ref, y_ref])
    torch.testing.assert_close(sim.output(0), x_ref + y_ref)
    assert sim.plan.mesh_axes(out) == [["x"], []]
    assert sim.plan.mesh_axes(xe) == [[], []]  # nvFuser never shards a broadcast axis, expanded or not
    assert sim.plan.communications == []


# -- welford ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dims", [[1], [0, 2], [-1]])
def test_welford_matches_torch(dims):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1])
        avg, m2, count = fd.ops.welford(x, dims=dims)
        for t in (avg, m2, count):
            fd.add_output(t)
    x_ref = torch.randn(3, 4, 5)
    avg_out, m2_out, count_out = fd.execute([x_ref])
    var, mean = torch.var_mean(x_ref, dim=dims, correction=0)
    n = x_ref.numel() // mean.numel()
    torch.testing.assert_close(avg_out, mean)
    torch.testing.assert_close(m2_out, var * n)
    assert count_out.dtype == torch.int64 and bool((count_out == n).all())
    assert count.dtype() == DataType.Index


def test_welford_prints_like_nvfuser():
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, 8])
        avg, m2, count = fd.ops.welford(x, dims=[1])
        fd.add_output(avg)
    assert str(avg.definition) == (
        "T1_g_float[iS2{2}, rS3{8}](Avg),\nT2_g_float[iS4{2}, rS5{8}](Var),\n"
        "T3_g_nvfuser_index_t[iS6{2}, rS7{8}](Count)\n = Welford ( T0_g_float[iS0{2}, iS1{8}](Avg), \n"
        "  allreduce = false )\n")


def test_welford_sharded_keeps_or_gathers():
    mesh = DeviceMesh(torch.arange(2))
    for axis, kinds in ((0, []), (1, ["allgather"])):
        with FusionDefinition() as fd:
            x = fd.define_tensor([8, 16])
            avg, m2, _ = fd.ops.welford(x, dims=[1])
            fd.add_output(avg)
            fd.add_output(m2)
            _shard(x, mesh, axis)
        x_ref = torch.randn(8, 16)
        sim = nvfuser.simulate(fd, [x_ref])
        torch.testing.assert_close(sim.output(0), x_ref.mean(1))
        torch.testing.assert_close(sim.output(1), x_ref.var(1, correction=0) * 16)
        assert [c.kind for c in sim.plan.communications] == kinds  # partial M2s do not add: gather the axis


def test_welford_rejects_bf16_and_integers():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4], dtype=DataType.BFloat16)
        with pytest.raises(NvShardError, match="welford is not supported for __bfloat"):
            fd.ops.welford(x, dims=[0])
        i = fd.define_tensor([4], dtype=DataType.Int)
        with pytest.raises(NvShardError, match="welford: T1 has dtype int64_t"):
            fd.ops.welford(i, dims=[0])


# -- comparisons ----------------------------------------------------------------------------------

_COMPARE = {"ge": torch.ge, "gt": torch.gt, "le": torch.le, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt}
_PRINTED = {"ge": ">=", "gt": ">", "le": "<=", "eq": "==", "ne": "!=", "lt": "<"}


@pytest.mark.parametrize("op", sorted(_COMPARE))
def test_comparison_matches_torch(op):
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, 4])
        b = fd.define_tensor([1, 4], dtype=DataType.BFloat16)
        t = getattr(fd.ops, op)(a, b)
        s = getattr(fd.ops, op)(a, 0.25)
        fd.add_output(t)
        fd.add_output(s)
    a_ref = torch.tensor([[0.25, 1.0, -1.0, 0.5], [0.5, 0.5, 0.25, -2.0]])
    b_ref = torch.tensor([[0.25, 0.5, 0.5, 0.5]], dtype=torch.bfloat16)
    out_t, out_s = fd.execute([a_ref, b_ref])
    assert out_t.dtype == torch.bool and torch.equal(out_t, _COMPARE[op](a_ref, b_ref.float()))
    assert torch.equal(out_s, _COMPARE[op](a_ref, 0.25))
    assert f"   {_PRINTED[op]} T1_g___bfloat" in str(t.definition)


def test_scalar_comparison_prints_on_one_line():
    with FusionDefinition() as fd:
        x = fd.define_tensor([3])
        c = fd.ops.ge(fd.ops.cast(fd.define_scalar(2), DataType.Double), fd.define_scalar(0.0))
        fd.add_output(fd.ops.where(c, x, 0.0))
    text = fd.fusion.print_math()
    assert "ds0 = __to_double(2);\nbs1 = ds0 >= double(0);\n" in text


# -- stride_order as translate_fusion (0.2.36) prints it ----------------------------------------------


def test_stride_order_empty_is_a_copy():
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, 3])
        y = fd.ops.stride_order(x, stride_order=[])
        fd.add_output(y)
    x_ref = torch.randn(2, 3)
    (out,) = fd.execute([x_ref])
    torch.testing.assert_close(out, x_ref)
    assert "= Set( T0_g_float" in str(y.definition)


# -- full, iota, pad, argsort, topk ------------------------------------------------------------------------


def test_full_and_iota_match_torch():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 6])
        f = fd.ops.full(shape=[fd.ops.size(x, 0), 6], fill_value=fd.define_scalar(1.5, dtype=DataType.Float),
                        dtype=DataType.Float)
        i = fd.ops.iota(length=6, start=2, step=3)
        fi = fd.ops.iota(length=6, start=0.5, step=0.25, dtype=DataType.Float)
        fd.add_output(fd.ops.add(fd.ops.mul(x, f), fi))
        fd.add_output(i)
    x_ref = torch.randn(3, 6)
    out, idx = fd.execute([x_ref])
    torch.testing.assert_close(out, x_ref * 1.5 + (0.5 + 0.25 * torch.arange(6)))
    assert idx.dtype == torch.int64 and torch.equal(idx, 2 + 3 * torch.arange(6))
    assert "= full({i0, 6}, float(1.5));" in fd.fusion.print_math()
    assert "= iota(6, 2, 3, int64_t);" in fd.fusion.print_math()


def test_full_sharded_like_its_consumer():
    mesh = DeviceMesh(torch.arange(2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 6])
        f = fd.ops.full(shape=[8, 6], fill_value=2.0, dtype=DataType.Float)
        out = fd.ops.mul(x, f)
        fd.add_output(out)
        _shard(x, mesh, 0)
    x_ref = torch.randn(8, 6)
    sim = nvfuser.simulate(fd, [x_ref])
    torch.testing.assert_close(sim.output(0), x_ref * 2)
    assert sim.plan.mesh_axes(f) == [["x"], []] and sim.plan.communications == []


def test_pad_matches_torch_and_gathers_a_sharded_padded_axis():
    mesh = DeviceMesh(torch.arange(2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 6])
        p = fd.ops.pad(x, pad_widths=[1, 2], value=fd.define_scalar(-1.0))
        fd.add_output(p)
        _shard(x, mesh, 1)
    x_ref = torch.randn(4, 6)
    sim = nvfuser.simulate(fd, [x_ref])
    torch.testing.assert_close(sim.output(0), torch.nn.functional.pad(x_ref, [1, 2], value=-1.0))
    assert [c.kind for c in sim.plan.communications] == ["allgather"]  # padding needs the whole axis
    assert "= pad( T0_g_float" in fd.fusion.print_math() and "{0, 0, 1, 2} )" in fd.fusion.print_math()


def test_pad_rejects_bad_widths():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6])
        with pytest.raises(NvShardError, match=r"pad: pad_widths \[1, 2, 3\] must hold \(before, after\) pairs"):
            fd.ops.pad(x, pad_widths=[1, 2, 3])
        with pytest.raises(NvShardError, match="non-negative ints"):
            fd.ops.pad(x, pad_widths=[-1, 0])


@pytest.mark.parametrize("descending", [False, True])
def test_argsort_matches_torch_and_keeps_other_axes_sharded(descending):
    mesh = DeviceMesh(torch.arange(2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 6])
        a = fd.ops.argsort(x, dim=1, descending=descending, stable=True)
        fd.add_output(a)
        _shard(x, mesh, 0)
    x_ref = torch.randn(8, 6)
    sim = nvfuser.simulate(fd, [x_ref])
    assert torch.equal(sim.output(0), torch.argsort(x_ref, dim=1, descending=descending, stable=True))
    assert sim.plan.mesh_axes(a) == [["x"], []] and sim.plan.communications == []


def test_topk_matches_torch_and_gathers_the_sorted_axis():
    mesh = DeviceMesh(torch.arange(2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 6])
        values, indices = fd.ops.topk(x, 2, dim=1, largest=True, sorted=True)
        fd.add_output(values)
        fd.add_output(indices)
        _shard(x, mesh, 1)
    x_ref = torch.randn(8, 6)
    sim = nvfuser.simulate(fd, [x_ref])
    ref_values, ref_indices = torch.topk(x_ref, 2, dim=1, largest=True, sorted=True)
    torch.testing.assert_close(sim.output(0), ref_values)
    assert torch.equal(sim.output(1), ref_indices)
    assert [c.kind for c in sim.plan.communications] == ["allgather"]
    assert str(values.definition) == (
        "( T1_g_float[iS2{8}, iS4{2}], T2_g_int64_t[iS5{8}, iS6{2}] ) = topk( T0_g_float[iS0{8}, ideviceIdx.x8{2}, "
        "iS7{3}] (DeviceMesh{0 1}), 2, dim = 1, largest = True, sorted = True )\n")


# -- select, index_select, gather -----------------------------------------------------------------------


def test_select_matches_torch_and_gathers_the_selected_axis():
    mesh = DeviceMesh(torch.arange(2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6])
        s = fd.ops.select(x, 3, dim=1)
        fd.add_output(s)
        _shard(x, mesh, 1)
    x_ref = torch.randn(4, 6)
    sim = nvfuser.simulate(fd, [x_ref])
    torch.testing.assert_close(sim.output(0), x_ref[:, 3])
    assert [c.kind for c in sim.plan.communications] == ["allgather"]
    assert "= select( T0_g_float" in str(s.definition) and ", index = 3 )" in str(s.definition)


def test_index_select_keeps_other_axes_sharded():
    mesh = DeviceMesh(torch.arange(2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([5, 6])
        idx = fd.define_tensor([-1], dtype=DataType.Int)
        out = fd.ops.index_select(x, idx, 0)
        fd.add_output(out)
        _shard(x, mesh, 1)
        idx.set_device_mesh(mesh)
    x_ref, idx_ref = torch.randn(5, 6), torch.tensor([4, 0, 2, 2])
    sim = nvfuser.simulate(fd, [x_ref, idx_ref])
    torch.testing.assert_close(sim.output(0), x_ref[idx_ref])
    assert sim.plan.mesh_axes(out) == [[], ["x"]] and sim.plan.communications == []
    # nvFuser stores the index broadcast to the input's rank
    assert "bS" in str(out.definition.inputs[1]) and "= indexSelect( T0_g_float" in str(out.definition)


def test_gather_matches_torch():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 6])
        idx = fd.define_tensor([-1, 3], dtype=DataType.Int)
        g = fd.ops.gather(x, idx, 1)
        fd.add_output(g)
    x_ref, idx_ref = torch.randn(4, 6), torch.randint(0, 6, (4, 3))
    (out,) = fd.execute([x_ref, idx_ref])
    assert torch.equal(out, torch.gather(x_ref, 1, idx_ref))
    assert str(g) == "T2_g_float[nS4{i1}, nS5{3}]"  # nvFuser's GatherScatter axes, the index's extents


def test_gather_with_sharded_rows_needs_no_communication():
    mesh = DeviceMesh(torch.arange(2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6])
        idx = fd.define_tensor([4, 3], dtype=DataType.Int)
        g = fd.ops.gather(x, idx, 1)
        fd.add_output(g)
        _shard(x, mesh, 0)
        _shard(idx, mesh, 0)
    x_ref, idx_ref = torch.randn(4, 6), torch.randint(0, 6, (4, 3))
    sim = nvfuser.simulate(fd, [x_ref, idx_ref])
    assert torch.equal(sim.output(0), torch.gather(x_ref, 1, idx_ref))
    assert sim.plan.mesh_axes(g) == [["x"], []] and sim.plan.communications == []


# -- scatter ------------------------------------------------------------------------------------------------


def _distinct_rows(rows: int, n: int, cols: int) -> torch.Tensor:
    """An index [rows, cols] into n positions along dim 0, distinct in each column (scatter's result is then
    defined: no position is written twice)."""
    return torch.stack([torch.randperm(n)[:rows] for _ in range(cols)], 1)


def test_scatter_matches_torch_with_a_tensor_and_a_scalar_source():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 6])
        idx = fd.define_tensor([-1, 6], dtype=DataType.Int)
        src = fd.define_tensor([-1, 6])
        idx_cols = fd.define_tensor([-1, 3], dtype=DataType.Int)
        rows = fd.ops.scatter(x, idx, src, dim=0)
        cols = fd.ops.scatter(x, idx_cols, fd.define_scalar(1.5, dtype=DataType.Float), dim=1)
        fd.add_output(rows)
        fd.add_output(cols)
    x_ref, src_ref = torch.randn(5, 6), torch.randn(4, 6)
    idx_ref = _distinct_rows(4, 5, 6)
    idx_cols_ref = torch.stack([torch.randperm(6)[:3] for _ in range(5)])
    out_rows, out_cols = fd.execute([x_ref, idx_ref, src_ref, idx_cols_ref])
    assert torch.equal(out_rows, torch.scatter(x_ref, 0, idx_ref, src_ref))
    assert torch.equal(out_cols, torch.scatter(x_ref, 1, idx_cols_ref, 1.5))
    assert not torch.equal(out_rows, x_ref) and not torch.equal(out_cols, x_ref)


def test_scatter_prints_like_nvfuser():
    """As real nvFuser 0.2.36 prints it: the result's loop domain is the index's axes, a new IterDomain for dim,
    arg's GatherScatter axis where the index covers arg (exact sizes), new ones everywhere when it does not."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 6])
        idx = fd.define_tensor([-1, 6], dtype=DataType.Int)
        src = fd.define_tensor([-1, 6])
        exact = fd.ops.scatter(x, idx, src, dim=0)
        short = fd.ops.scatter(x, fd.define_tensor([-1, 3], dtype=DataType.Int),
                               fd.define_scalar(2.0, dtype=DataType.Float), dim=1)
        fd.add_output(exact)
        fd.add_output(short)
    assert str(exact.definition) == (
        "T3_g_float[iS8{i1}, nS7{6}]\n   = scatter(in = T0_g_float[iS0{i0}, iS1{6}], dim = 0, "
        "src = T2_g_float[iS4{i2}, iS5{6}], idx = T1_g_int64_t[iS2{i1}, iS3{6}] )\n")
    assert [str(i) for i in exact.get_logical_domain()] == ["nS6{i0}", "nS7{6}"]
    assert str(short.definition) == (
        "T5_g_float[iS13{i3}, iS14{3}]\n   = scatter(in = T0_g_float[iS0{i0}, iS1{6}], dim = 1, "
        "src = float(2), idx = T4_g_int64_t[iS9{i3}, iS10{3}] )\n")
    assert [str(i) for i in short.get_logical_domain()] == ["nS11{i0}", "nS12{6}"]


def test_scatter_rule_passes_covered_axes_only():
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 6])
        idx = fd.define_tensor([4, 6], dtype=DataType.Int)
        src = fd.define_tensor([4, 6])
        exact = fd.ops.scatter(x, idx, src, 0)
        short = fd.ops.scatter(x, fd.define_tensor([4, 3], dtype=DataType.Int), fd.define_tensor([4, 3]), 0)
        fd.add_output(exact)
        fd.add_output(short)
    assert exact.definition.rule().describe() == (
        "s0 a1, n0 a1, u0 a1 -> s0 a1 {s0: replicated, n0: replicated, u0: replicated}")
    assert short.definition.rule().describe() == (
        "s0 s1, n0 n1, u0 u1 -> s0 s1 {s0: replicated, n0: replicated, u0: replicated, "
        "s1: replicated, n1: replicated, u1: replicated}")


@pytest.mark.parametrize("axis, kinds", [(1, []), (0, ["all_to_all"])])
def test_scatter_sharded_keeps_covered_axes_and_moves_the_written_one(axis, kinds):
    mesh = DeviceMesh(torch.arange(2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 6])
        idx = fd.define_tensor([4, 6], dtype=DataType.Int)
        src = fd.define_tensor([4, 6])
        out = fd.ops.scatter(x, idx, src, 0)
        fd.add_output(fd.ops.mul(out, 2.0))
        _shard(x, mesh, axis)
        _shard(idx, mesh, 1)
        _shard(src, mesh, 1)
    x_ref, src_ref, idx_ref = torch.randn(8, 6), torch.randn(4, 6), _distinct_rows(4, 8, 6)
    sim = nvfuser.simulate(fd, [x_ref, idx_ref, src_ref])
    assert torch.equal(sim.output(0), torch.scatter(x_ref, 0, idx_ref, src_ref) * 2.0)
    # columns sharded like the index stay where they are; x's rows (any row may be written) move to its columns
    assert sim.plan.mesh_axes(out) == [[], ["x"]]
    assert [c.kind for c in sim.plan.communications] == kinds


def test_scatter_rejects_bad_input():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6])
        idx = fd.define_tensor([2, 6], dtype=DataType.Int)
        with pytest.raises(NvShardError, match=r"scatter: index T2 must have an integer dtype"):
            fd.ops.scatter(x, fd.define_tensor([2, 6]), x, 0)
        with pytest.raises(NvShardError, match=r"scatter: src T3 has rank 1, T0 has rank 2"):
            fd.ops.scatter(x, idx, fd.define_tensor([6]), 0)
        with pytest.raises(NvShardError, match=r"scatter: src T4 has dtype __half, T0 has dtype float"):
            fd.ops.scatter(x, idx, fd.define_tensor([2, 6], dtype=DataType.Half), 0)
        with pytest.raises(NvShardError, match=r"scatter: dim 2 is out of range for rank 2 of T0"):
            fd.ops.scatter(x, idx, x, 2)


def test_index_ops_reject_float_indices():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6])
        with pytest.raises(NvShardError, match="index_select: index T0 must have an integer dtype|index T1"):
            fd.ops.index_select(x, fd.define_tensor([2]), 0)


# -- embedding_fwd ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("padding_idx", [None, 3])
def test_embedding_matches_torch(padding_idx):
    with FusionDefinition() as fd:
        idx = fd.define_tensor([-1, -1], dtype=DataType.Int)
        w = fd.define_tensor([10, 8], dtype=DataType.BFloat16)
        e = fd.ops.embedding_fwd(idx, w, padding_idx, None, None, None, None)
        fd.add_output(e)
    i_ref, w_ref = torch.randint(0, 10, (3, 4)), torch.randn(10, 8, dtype=torch.bfloat16)
    (out,) = fd.execute([i_ref, w_ref])
    assert torch.equal(out, torch.nn.functional.embedding(i_ref, w_ref, padding_idx))
    assert ("padding_idx = 3,\n" in str(e.definition)) == (padding_idx is not None)


def test_embedding_sharded_rows_gather_the_table_sharded_tokens_do_not():
    mesh = DeviceMesh(torch.arange(2))
    for shard_weight_rows, kinds in ((False, []), (True, ["allgather"])):
        with FusionDefinition() as fd:
            idx = fd.define_tensor([4, 6], dtype=DataType.Int)
            w = fd.define_tensor([10, 8])
            e = fd.ops.embedding_fwd(idx, w, None, None, None, None, None)
            fd.add_output(e)
            _shard(idx, mesh, 0)
            if shard_weight_rows:
                _shard(w, mesh, 0)
            else:
                w.set_device_mesh(mesh)
        i_ref, w_ref = torch.randint(0, 10, (4, 6)), torch.randn(10, 8)
        sim = nvfuser.simulate(fd, [i_ref, w_ref])
        torch.testing.assert_close(sim.output(0), torch.nn.functional.embedding(i_ref, w_ref))
        assert sim.plan.mesh_axes(e) == [["x"], [], []]
        assert [c.kind for c in sim.plan.communications] == kinds  # any row may be picked
