"""propagation="search": the exact block layout search over the tensors
nobody annotated (nvshard/preseg/search.py). Each test asserts the plan's
collectives and bytes per device, that annotated tensors and the outputs'
layouts stay as they were, and the simulated numerics against torch with
bytes measured = planned.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, models
from nvshard.errors import NvShardError
from nvshard.models import Direction
from nvshard.preseg import search as search_module

P = nvfuser.ParallelType
KiB = 1024.0


def mesh(devices):
    return nvfuser.multidevice.DeviceMesh(torch.tensor(devices))


def sharded(fd, shape, m, axis):
    """An input of `shape` on mesh m, axis `axis` split over mesh_x (None: replicated)."""
    tv = fd.define_tensor(shape, dtype=DataType.Float)
    tv.set_device_mesh(m)
    if axis is not None:
        tv.outer_split(axis, m.size)
        tv.axis(axis).parallelize(P.mesh_x)
    return tv


def moving(plan) -> list:
    """(kind, tensor, bytes) of the collectives that move data (groups of more than one device)."""
    return sorted((c.kind, c.tensor, c.bytes_received) for c in plan.communications
                  if max(len(g) for g in c.groups) > 1)


def check_numerics(fd, inputs, expected, atol=1e-4):
    sim = nvfuser.simulate(fd, inputs, propagation="search")
    for i, ref in enumerate(expected):
        torch.testing.assert_close(sim.output(i), ref, atol=atol, rtol=atol)
    for rank, got in sim.received.items():
        assert got == pytest.approx(sim.plan.bytes_received(rank))
    return sim.plan


def mlp_forward_backward(t, h, f, annotate_h1=None):
    """Two linears forward and backward under sequence parallelism (x, dout
    split on the tokens, W1 [f, h] on its output, W2 [h, f] on its input
    features); annotate_h1 = (axis, priority) also annotates h1."""
    m = mesh([0, 1, 2, 3])
    with FusionDefinition() as fd:
        x = sharded(fd, [t, h], m, 0)
        w1 = sharded(fd, [f, h], m, 0)
        w2 = sharded(fd, [h, f], m, 1)
        dout = sharded(fd, [t, h], m, 0)
        h1 = fd.ops.linear(x, w1)
        if annotate_h1 is not None:
            axis, priority = annotate_h1
            h1.set_device_mesh(m)
            h1.outer_split(axis, m.size)
            h1.axis(axis).parallelize(P.mesh_x)
            h1.set_sharding_priority(priority)
        out = fd.ops.linear(h1, w2)
        dh1 = fd.ops.matmul(dout, w2)
        dw2 = fd.ops.matmul(fd.ops.permute(dout, [1, 0]), h1)
        dx = fd.ops.matmul(dh1, w1)
        dw1 = fd.ops.matmul(fd.ops.permute(dh1, [1, 0]), x)
        for o in (out, dx, dw1, dw2):
            fd.add_output(o)
        for grad, axis in ((dw1, 0), (dw2, 1)):  # gradients sharded like their weights, as training code keeps them
            grad.set_device_mesh(m)
            grad.outer_split(axis, m.size)
            grad.axis(axis).parallelize(P.mesh_x)
    return fd, dict(x=x, w1=w1, w2=w2, dout=dout, h1=h1, dh1=dh1, outputs=[out, dx, dw1, dw2])


def mlp_reference(x, w1, w2, d):
    h1 = x @ w1.T
    dh1 = d @ w2
    return [h1 @ w2.T, dh1 @ w1, dh1.T @ x, d.T @ h1]


def test_search_gathers_the_activations_once_in_mlp_forward_backward():
    """t=32, h=16, f=64 (the bench row's proportions) on 4 devices, the
    weight gradients sharded like their weights: default propagation
    gathers x, dout and one more activation and allreduces the two
    unannotated outputs (10.5 KiB); the search gathers x and dout once
    (9 KiB). Every annotated and output layout stays as default has it."""
    t, h, f = 32, 16, 64
    fd, tvs = mlp_forward_backward(t, h, f)
    shapes = [[t, h], [f, h], [h, f], [t, h]]
    default = nvfuser.propagate_shardings(fd, shapes)
    assert default.bytes_per_device == 10.5 * KiB
    plan = nvfuser.propagate_shardings(fd, shapes, propagation="search")
    assert plan.mode == "search" and plan.search["chosen"] == "search"
    assert moving(plan) == [("allgather", "T0", 1.5 * KiB), ("allgather", "T3", 1.5 * KiB),
                            ("allreduce", "T13", 3 * KiB), ("allreduce", "T15", 3 * KiB)]
    assert plan.bytes_per_device == 9 * KiB
    for name, axes in (("x", [["x"], []]), ("w1", [["x"], []]), ("w2", [[], ["x"]]), ("dout", [["x"], []])):
        assert plan.mesh_axes(tvs[name]) == axes
    for o in tvs["outputs"]:
        assert plan.mesh_axes(o) == default.mesh_axes(o)
    assert plan.search["search_bytes"] == 9 * KiB and plan.search["default_bytes"] == 10.5 * KiB
    assert any("search: block layout search chosen: searched plan 9.00 KiB in 4 collectives" in line
               and "default propagation's 10.50 KiB in 5" in line for line in plan.log.explain(None))
    g = torch.Generator().manual_seed(0)
    data = [torch.randn(*s, generator=g) for s in shapes]
    check_numerics(fd, data, mlp_reference(*data))


def test_search_keeps_an_annotation_of_any_priority():
    """The same program with h1 annotated row-split at priority 1 (the search
    alone would split its columns): h1 stays row-split; default propagation
    costs 15 KiB, the search 12 KiB (dW2 computed on W2's layout, so one
    reduce-scatter fewer)."""
    t, h, f = 32, 16, 64
    fd, tvs = mlp_forward_backward(t, h, f, annotate_h1=(0, 1))
    shapes = [[t, h], [f, h], [h, f], [t, h]]
    default = nvfuser.propagate_shardings(fd, shapes)
    assert default.bytes_per_device == 15 * KiB
    plan = nvfuser.propagate_shardings(fd, shapes, propagation="search")
    assert plan.search["chosen"] == "search"
    assert plan.mesh_axes(tvs["h1"]) == [["x"], []] and plan.partial_axes(tvs["h1"]) == []
    assert not any("search (was" in line for line in plan.explain(tvs["h1"]))
    assert moving(plan) == [("all_to_all", "T4", 1.5 * KiB), ("allgather", "T0", 1.5 * KiB),
                            ("allgather", "T1", 3 * KiB), ("allgather", "T3", 1.5 * KiB),
                            ("allreduce", "T16", 3 * KiB), ("reduce_scatter", "T14", 1.5 * KiB)]
    assert plan.bytes_per_device == 12 * KiB
    for o in tvs["outputs"]:
        assert plan.mesh_axes(o) == default.mesh_axes(o)
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(*s, generator=g) for s in shapes]
    check_numerics(fd, data, mlp_reference(*data))


def triangle_attention_reference(z, w_q, w_k, w_b, mask, w_v, w_g, w_o, heads):
    """Starting-node triangle attention from its math: per row i, attention
    over the row's keys with a pair bias and the key mask."""
    b, n, _, _ = z.shape

    def split_heads(t):  # [b, i, j, h*c] -> [b, i, h, j, c]
        return t.reshape(b, n, n, heads, -1).permute(0, 1, 3, 2, 4)

    q, k, v = (split_heads(F.linear(z, w)) for w in (w_q, w_k, w_v))
    bias = F.linear(z, w_b).permute(0, 3, 1, 2).unsqueeze(1)  # [b, 1, h, j, k]
    keep = mask[:, :, None, None, :]  # [b, i, 1, 1, k]
    attn_mask = bias.masked_fill(~keep, float("-inf"))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    o = o * split_heads(torch.sigmoid(F.linear(z, w_g)))
    return F.linear(o.permute(0, 1, 3, 2, 4).reshape(b, n, n, -1), w_o)


def test_search_shards_triangle_attention_on_the_heads():
    """Triangle attention (starting node) with only z_in and mask annotated
    (b->z, i->y, j->x on 1x2x2): default propagation keeps q, k, v split on
    the keys j and gathers k and v (10.06 KiB); the search moves DIDx from
    j to the heads with all-to-alls, Ulysses-style, an assignment nobody
    annotated (9.56 KiB)."""
    b, n, c, ch, heads = 1, 16, 16, 4, 4
    hc = heads * ch
    with FusionDefinition() as fd:
        inputs, named = models.triangle_attention(fd, Direction.OUTGOING, c, ch, heads, DataType.Float)
        m = nvfuser.multidevice.DeviceMesh(torch.arange(4).reshape(1, 2, 2))
        models.annotate_triangle(inputs, m, 1, 2)
    shapes = [[b, n, n, c], [hc, c], [hc, c], [heads, c], [b, n, n], [hc, c], [hc, c], [c, hc]]
    default = nvfuser.propagate_shardings(fd, shapes)
    assert default.bytes_per_device == 10304
    plan = nvfuser.propagate_shardings(fd, shapes, propagation="search")
    assert plan.search["chosen"] == "search"
    assert plan.bytes_per_device == 9792
    assert moving(plan) == [("all_to_all", "T12", 2048), ("all_to_all", "T14", 512), ("all_to_all", "T19", 2048),
                            ("all_to_all", "T21", 2048), ("all_to_all", "T9", 2048), ("allgather", "T4", 64),
                            ("allgather", "T40", 1024)]
    for name in ("q_h", "k_h", "v_h"):  # [b, i, h, j, c]: the heads on DIDx, the keys whole
        assert default.mesh_axes(named[name]) == [["z"], ["y"], [], ["x"], []]
        assert plan.mesh_axes(named[name]) == [["z"], ["y"], ["x"], [], []]
    assert plan.mesh_axes(named["z_out"]) == default.mesh_axes(named["z_out"])
    for name in ("z_in", "mask"):
        assert plan.mesh_axes(inputs[name]) == [["z"], ["y"], ["x"], []][: len(shapes[0 if name == "z_in" else 4])]
    g = torch.Generator().manual_seed(0)
    data = [torch.randn(*s, generator=g) / 4 for s in shapes]
    data[4] = torch.rand(b, n, n, generator=g) > 0.2
    check_numerics(fd, data, [triangle_attention_reference(*data, heads)], atol=1e-4)


def test_search_keeps_pipeline_stages():
    """Stage 1 on {0, 1}, its result set onto {2, 3}: each tensor keeps the
    stage default propagation gave it; only the boundary crosses (4 KiB)."""
    stage1, stage2 = mesh([0, 1]), mesh([2, 3])
    with FusionDefinition() as fd:
        x = sharded(fd, [64, 32], stage1, 0)
        h = fd.ops.relu(x)
        tail = fd.ops.add(fd.ops.mul(h, h), h)
        boundary = fd.ops.set(tail)
        boundary.set_device_mesh(stage2)
        boundary.outer_split(0, 2)
        boundary.axis(0).parallelize(P.mesh_x)
        fd.add_output(fd.ops.relu(boundary))
    x_ = torch.randn(64, 32)
    plan = check_numerics(fd, [x_], [(x_.relu() * x_.relu() + x_.relu()).relu()])
    assert moving(plan) == [("send_recv", "T3", 4 * KiB)]
    assert plan.program.state[tail].mesh == stage1
    assert plan.search["chosen"] == "default" and "no fewer bytes" in plan.search["reason"]


def test_search_falls_back_to_default_propagation_with_a_reason(monkeypatch):
    t, h, f = 32, 16, 64
    fd, _ = mlp_forward_backward(t, h, f)
    shapes = [[t, h], [f, h], [h, f], [t, h]]
    default = nvfuser.propagate_shardings(fd, shapes)
    monkeypatch.setattr(search_module, "SEARCH_TABLE_LIMIT", 10)
    plan = nvfuser.propagate_shardings(fd, shapes, propagation="search")
    assert plan.search["chosen"] == "default"
    assert "(limit 10" in plan.search["reason"]
    assert any(line.startswith("search: default propagation kept: ") and "(limit 10" in line
               for line in plan.log.explain(None))
    assert moving(plan) == moving(default) and plan.bytes_per_device == 10.5 * KiB


def test_search_needs_concrete_sizes():
    m = mesh([0, 1])
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 16], dtype=DataType.Float)
        x.set_device_mesh(m)
        x.outer_split(0, 2)
        x.axis(0).parallelize(P.mesh_x)
        fd.add_output(fd.ops.relu(x))
    plan = nvfuser.propagate_shardings(fd, propagation="search")
    assert plan.search["chosen"] == "default" and "concrete input shapes" in plan.search["reason"]


def test_unknown_propagation_mode_names_the_modes():
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.relu(fd.define_tensor([4], dtype=DataType.Float)))
    with pytest.raises(NvShardError, match="propagation='serach' is not a propagation mode; expected one of "
                                           "'default', 'legacy', 'search'"):
        nvfuser.propagate_shardings(fd, [[4]], propagation="serach")


def test_the_dump_shows_the_search_decisions(monkeypatch, capsys):
    t, h, f = 32, 16, 64
    fd, _ = mlp_forward_backward(t, h, f)
    monkeypatch.setenv("NVFUSER_DUMP", "pre_segmenter_logging")
    nvfuser.propagate_shardings(fd, [[t, h], [f, h], [h, f], [t, h]], propagation="search")
    out = capsys.readouterr().out
    section = out.split("Fusion after pass: SearchShardingsPass\n", 1)[1].split("Fusion after pass:", 1)[0]
    assert "Search decisions:\nsearch: block layout search chosen: searched plan 9.00 KiB" in section
    assert "; stage search" in section


# -- random programs ---------------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402

from fusion_strategies import fusions  # noqa: E402
from test_properties import SETTINGS, check_execution  # noqa: E402

SEARCH_EXECUTION_EXAMPLES = 150


@settings(max_examples=SEARCH_EXECUTION_EXAMPLES, **SETTINGS)
@given(fusions(max_ops=6, meshes_max=2))
def test_search_executes_random_programs_correctly(case):
    """The property suite's execution checks under propagation="search":
    annotations kept, valid shardings, every rank's output block against
    torch, bytes measured = planned."""
    check_execution(case, propagation="search")
