"""plan.to_dot / plan.render and the per-tensor sharding picture.

The graph's structure is checked from the DOT source: one node per
TensorView, one per compute expr, one per inserted communication with its
kind, mesh axis, groups and bytes; edges coloured by mesh axis."""

import os
import re
import shutil

import pytest
import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, NvShardError
from nvshard.visualize import graph, sharding_text

from nvshard.models import Direction, annotate_mlp, annotate_triangle, mlp, triangle_update

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRIANGLE_SHAPES = [[2, 64, 64, 128], [128], [128], [256, 128], [256, 128], [128], [128], [128, 128], [128, 128],
                   [2, 64, 64]]
X, Y, Z = graph.AXIS_COLORS["x"], graph.AXIS_COLORS["y"], graph.AXIS_COLORS["z"]


def parse_dot(source: str):
    """(nodes: id -> attribute text, edges: [(tail, head, attribute text)])."""
    nodes, edges = {}, []
    for line in source.splitlines():
        m = re.match(r"^\t(\w+) -> (\w+) \[(.*)\]$", line)
        if m:
            edges.append(m.groups())
            continue
        m = re.match(r"^\t(\w+) \[(.*)\]$", line)
        if m:
            nodes[m.group(1)] = m.group(2)
    return nodes, edges


def text_of(attrs: str) -> str:
    """A node's label without HTML tags."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]*>", " ", attrs))


def triangle_plan():
    with FusionDefinition() as fd:
        inputs, matmul_out = triangle_update(fd, Direction.OUTGOING, 128, DataType.Float)
        mesh = nvfuser.multidevice.DeviceMesh(torch.arange(4).reshape(1, 2, 2))
        annotate_triangle(inputs, mesh, 1, 2)
    return nvfuser.propagate_shardings(fd, TRIANGLE_SHAPES), inputs, matmul_out


def mlp_plan():
    with FusionDefinition() as fd:
        ins, mids = mlp(fd, 8, 16)
        annotate_mlp(ins, nvfuser.multidevice.DeviceMesh(torch.arange(4)), sequence_parallel=True)
        ins["up_w"].set_sharding_priority(1)
    return nvfuser.propagate_shardings(fd, [[8, 16], [64, 16], [16, 64]]), ins, mids


def test_triangle_graph_structure():
    plan, inputs, matmul_out = triangle_plan()
    nodes, edges = parse_dot(plan.to_dot())
    tv_nodes = {n for n in nodes if re.fullmatch(r"T\d+", n)}
    program = plan.program
    # one node per TensorView the program uses: 58 = 56 of the fusion + 2 made by the decomposition
    assert len(tv_nodes) == len(program.state) == 58
    exprs = [e for e in program.exprs if e.tv_outputs]
    assert len([n for n in nodes if re.fullmatch(r"e\d+", n)]) == len(exprs)
    assert len(edges) == sum(len(e.tv_inputs) + len(e.tv_outputs) for e in exprs)
    # the two communications, in program order, each its own hexagon node
    comms = [(n, text_of(a)) for n, a in nodes.items() if "shape=hexagon" in a]
    assert len(comms) == 2
    (ag_id, ag), (rs_id, rs) = comms
    assert "allgather over DIDy" in ag and "groups {0 2} {1 3}" in ag and "1.00 MiB received per device" in ag
    assert "reduce_scatter over DIDx" in rs and "groups {0 1} {2 3}" in rs and "1.00 MiB received" in rs
    # the allgather reads the matmul's second operand and feeds the matmul, whose partial sums go to the
    # reduce-scatter, whose output is the matmul output the user wrote
    ag_in = [t for t, h, _ in edges if h == ag_id]
    ag_out = [h for t, h, _ in edges if t == ag_id]
    rs_in = [t for t, h, _ in edges if h == rs_id]
    rs_out = [h for t, h, _ in edges if t == rs_id]
    assert rs_out == [f"T{matmul_out.number}"]
    matmul_node = next(t for t, h, _ in edges if h == rs_in[0])
    assert nodes[matmul_node].startswith("label=matmul")
    assert {t for t, h, _ in edges if h == matmul_node} >= set(ag_out)
    assert ag_in == ["T34"]
    # the partial-sum edge is dashed and drawn in the three mesh axes' colours (z, y on the iteration axes,
    # x for the pending sum)
    (attrs,) = [a for t, h, a in edges if h == rs_id]
    assert f'color="{Z}:{Y}:{X}"' in attrs and "style=dashed" in attrs
    partial = text_of(nodes[rs_in[0]])
    assert "reduction axis 4 [64] pending sum DIDx (2) [32]" in partial
    # replicated data is grey: the allgather's output along DIDy is still sharded on DIDz and DIDx
    (attrs,) = [a for t, h, a in edges if t == ag_id]
    assert f'color="{Z}:{X}"' in attrs and "style=solid" in attrs


def test_triangle_annotations_conflicts_and_priorities():
    plan, inputs, matmul_out = triangle_plan()
    nodes, _ = parse_dot(plan.to_dot())
    border = 'color="{}" penwidth=3 shape=box style=rounded'
    annotated = {n for n, a in nodes.items() if a.endswith(border.format(graph.ANNOTATION_COLOR))}
    assert annotated == {f"T{tv.number}" for tv in inputs.values()}
    for tv in inputs.values():
        assert "user annotation, priority 0" in text_of(nodes[f"T{tv.number}"])
    z_in = text_of(nodes[f"T{inputs['z_in'].number}"])
    assert "T0 float[2, 64, 64, 128] (input)" in z_in
    assert "axis 1 [64] DIDy (2) [32]" in z_in and "axis 3 [128] replicated" in z_in
    conflicted = {n for n, a in nodes.items() if a.endswith(border.format(graph.CONFLICT_COLOR))}
    assert conflicted == {f"T{matmul_out.number}"}
    label = text_of(nodes[f"T{matmul_out.number}"])
    assert "conflict, 2 candidates; winner: candidate A because fewer bytes" in label
    # decisions show the priority they were made at
    assert "axis 2 [64] DIDy (2) [32] (p0)" in label and "axis 3 [64] DIDx (2) [32] (p0)" in label
    assert "legend" in nodes


def test_mlp_graph_structure_and_priorities():
    plan, ins, mids = mlp_plan()
    nodes, edges = parse_dot(plan.to_dot())
    comms = [text_of(a) for a in nodes.values() if "shape=hexagon" in a]
    assert [c.split()[1] for c in comms] == ["allgather", "all_to_all", "reduce_scatter"]
    assert "groups {0 1 2 3}" in comms[0] and "3.00 KiB received per device" in comms[0]
    assert "384 B received per device" in comms[1] and "384 B received per device" in comms[2]
    assert "user annotation, priority 1" in text_of(nodes[f"T{ins['up_w'].number}"])
    assert "user annotation, priority 0" in text_of(nodes[f"T{ins['inp'].number}"])
    ops = sorted(text_of(a).split("=", 1)[1].split()[0] for n, a in nodes.items()
                 if re.fullmatch(r"e\d+", n) and "shape=ellipse" in a)
    assert ops.count("linear") == 2 and ops.count("tanh") == 1
    tv_nodes = [n for n in nodes if re.fullmatch(r"T\d+", n)]
    assert len(tv_nodes) == len(plan.program.state)
    # the all-gathered weight flows on in grey (replicated)
    gathered = [h for t, h, _ in edges if t == next(n for n, a in nodes.items() if "allgather" in a)]
    assert "axis 0 [64] replicated" in text_of(nodes[gathered[0]])
    assert any(a == f'color="{graph.REPLICATED_COLOR}" style=solid' for t, h, a in edges if t == gathered[0])


def test_symbolic_plan_graph_says_symbolic():
    with FusionDefinition() as fd:
        ins, mids = mlp(fd, -1, 16)
        annotate_mlp(ins, nvfuser.multidevice.DeviceMesh(torch.arange(4)), sequence_parallel=True)
    nodes, _ = parse_dot(nvfuser.propagate_shardings(fd).to_dot())
    assert any("symbolic size" in text_of(a) for a in nodes.values() if "shape=hexagon" in a)
    assert "float[i0, 16]" in text_of(nodes[f"T{ins['inp'].number}"])


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_render_png_and_svg_golden():
    """Writes the triangle update's picture to bench-results/ (git-ignored) for people to look at."""
    plan, _, _ = triangle_plan()
    out = os.path.join(ROOT, "bench-results")
    os.makedirs(out, exist_ok=True)
    png = plan.render(os.path.join(out, "triangle_outgoing_plan.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    svg = plan.render(os.path.join(out, "triangle_outgoing_plan.svg"))
    with open(svg) as f:
        text = f.read()
    exprs = [e for e in plan.program.exprs if e.tv_outputs]
    assert "<svg" in text and "reduce_scatter" in text
    assert text.count('<g id="node') == len(plan.program.state) + len(exprs) + 1  # + the legend


def test_render_errors(tmp_path, monkeypatch):
    plan, _, _ = mlp_plan()
    with pytest.raises(NvShardError, match=r"must end in \.svg or \.png, got \.pdf"):
        plan.render(tmp_path / "plan.pdf")
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot here
    with pytest.raises(NvShardError, match=r"needs Graphviz's `dot` program.*apt-get install graphviz.*to_dot"):
        plan.render(tmp_path / "plan.png")
    assert not (tmp_path / "plan.png").exists()
    assert plan.to_dot().startswith("digraph plan {")  # DOT needs no binary


# -- the sharding picture ----------------------------------------------------------


def test_sharding_text_2d_outer_split():
    plan, ins, mids = mlp_plan()
    assert sharding_text(plan, ins["down_w"]) == """\
T2 float[16, 64] on DeviceMesh{0 1 2 3} (axis 0: replicated, axis 1: DIDx)
┌─────────────────┬──────┬───────┬───────┬───────┐
│ axis 0 \\ axis 1 │ 0:16 │ 16:32 │ 32:48 │ 48:64 │
├─────────────────┼──────┼───────┼───────┼───────┤
│            0:16 │  0   │   1   │   2   │   3   │
└─────────────────┴──────┴───────┴───────┴───────┘"""


def test_sharding_text_pending_sum_and_replication():
    plan, ins, mids = mlp_plan()
    # the down projection's output: rows sharded on DIDx (the all-to-all), partials summed by the reduce-scatter
    text = sharding_text(plan, ins["inp"], dims=(1,))
    assert text.splitlines()[0] == "T0 float[8, 16] on DeviceMesh{0 1 2 3} (axis 0: DIDx, axis 1: replicated); " \
                                   "slice at axis 0 = 0"
    assert "│ axis 1 │  0   │" in text  # one block of 16, held by device 0 only (index 0 of axis 0)
    partial = next(tv for tv in plan.program.state if plan.program.state[tv].pending(tv))
    assert "pending sum over DIDx: each block is partial" in sharding_text(plan, partial)


def test_sharding_text_2d_mesh_and_cut_cyclic_layout():
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(4).reshape(2, 2))
    with FusionDefinition() as fd:
        a = fd.define_tensor([8, 32], dtype=DataType.Float)
        b = fd.ops.relu(a)
        fd.add_output(b)
        a.set_device_mesh(mesh)
        a.outer_split(0, 2)
        a.axis(0).parallelize(nvfuser.ParallelType.mesh_y)
        a.inner_split(2, 2)  # [16, 2]: element j of axis 1 lives on x = j % 2 (cyclic)
        a.axis(3).parallelize(nvfuser.ParallelType.mesh_x)
    plan = nvfuser.propagate_shardings(fd, [[8, 32]])
    text = sharding_text(plan, a)
    lines = text.splitlines()
    assert lines[0] == "T0 float[8, 32] on DeviceMesh{{0 1}{2 3}} (axis 0: DIDy, axis 1: [* DIDx])"
    assert lines[2] == "│ axis 0 \\ axis 1 │ 0 │ 1 │ 2 │ 3 │ 4 │ 5 │ 6 │ 7 │ ... │"
    assert lines[4] == "│             0:4 │ 0 │ 1 │ 0 │ 1 │ 0 │ 1 │ 0 │ 1 │ ... │"
    assert lines[6] == "│             4:8 │ 2 │ 3 │ 2 │ 3 │ 2 │ 3 │ 2 │ 3 │ ... │"
    # relu's output took the same layout
    assert sharding_text(plan, b).splitlines()[1:] == lines[1:]


def test_sharding_text_errors():
    plan, ins, mids = mlp_plan()
    with pytest.raises(NvShardError, match=r"T2: dims must be one or two distinct axes of 0\.\.1, got \(0, 0\)"):
        sharding_text(plan, ins["down_w"], dims=(0, 0))
    with pytest.raises(NvShardError, match=r"T2: index must give one position per axis within \[16, 64\]"):
        sharding_text(plan, ins["down_w"], dims=(0,), index=[0, 64])
    with FusionDefinition() as fd:
        ins, mids = mlp(fd, -1, 16)
    with pytest.raises(NvShardError, match="T0: the sharding picture needs concrete sizes"):
        sharding_text(nvfuser.propagate_shardings(fd), ins["inp"])
