"""The planned program as a graphviz graph.

    plan.to_dot()            DOT source (needs only the `graphviz` Python package)
    plan.render("plan.svg")  SVG or PNG by extension (needs Graphviz's `dot` binary)

Nodes: one per TensorView of the decomposed program (global shape, mesh,
one row per logical axis with its layout; pending sums on reduction axes),
one per compute expr (the op's name) and one per inserted resharding step
(kind, mesh axis, groups, bytes received per device). Edges carry the
tensor's data and are coloured by the mesh axes it is sharded over
(dashed while it holds pending sums). The user's annotations are drawn
with a thick gold border and their priority; tensors where propagation
resolved a conflict with a red border and the winning reason.

Everything is read through the plan's inspection API (program, decisions,
conflicts, communications), never the engine's internals.
"""

from __future__ import annotations

import html
import os
from typing import Optional

from ..ir.nodes import NvShardError, TensorView
from ..multidevice import layout
from ..multidevice.collectives import format_bytes

# One colour per mesh axis, readable on white and distinct for colour-blind readers (Okabe-Ito).
AXIS_COLORS = {"x": "#0072B2", "y": "#D55E00", "z": "#009E73"}
REPLICATED_COLOR = "#7f7f7f"
ANNOTATION_COLOR = "#E69F00"
CONFLICT_COLOR = "#CC0000"
FORMATS = {".svg": "svg", ".png": "png"}


def _graphviz():
    try:
        import graphviz
    except ImportError:
        raise NvShardError("drawing a plan needs the Python package graphviz: pip install graphviz") from None
    return graphviz


def tv_node_id(tv: TensorView) -> str:
    return f"T{tv.number}"


def edge_color(digit_axes) -> str:
    """Graphviz colour list: one parallel line per mesh axis, grey if none."""
    if not digit_axes:
        return REPLICATED_COLOR
    return ":".join(AXIS_COLORS[a] for a in digit_axes)


class _PlanView:
    """What the graph shows about each tensor, gathered once."""

    def __init__(self, plan):
        self.plan = plan
        self.program = plan.program
        self.fusion_tvs = set(plan.fusion.tvs())

    def extent(self, tv: TensorView, k: int) -> str:
        id_ = tv.logical[k]
        if self.plan.sizes is not None:
            size = id_.expanded if id_.is_broadcast() and id_.expanded is not None else id_.extent()
            try:
                return str(self.plan.sizes.evaluate_size(size))
            except (NvShardError, KeyError, ValueError):
                pass
        return id_.display if id_.display is not None else str(id_.extent())

    def size(self, size) -> str:
        if self.plan.sizes is not None:
            try:
                return str(self.plan.sizes.evaluate_size(size))
            except (NvShardError, KeyError, ValueError):
                pass
        return str(size)

    def global_shape(self, tv: TensorView) -> list:
        return [self.extent(tv, k) for k in tv.non_reduction_axes()]

    def axis_priorities(self, tv: TensorView) -> dict:
        """Logical axis -> priority of the last decision that set it (the
        block-layout search's decisions carry none and leave it as it was)."""
        return {d.axis: d.priority for d in self.plan.decisions(tv) if isinstance(d.priority, int)}

    def conflict(self, tv: TensorView) -> Optional[str]:
        """'N candidates, winner: why' when propagation resolved a conflict here."""
        conflicts = self.plan.conflicts(tv)
        if not conflicts:
            return None
        first = conflicts[0]
        # keep the reason's head: the full comparison is in plan.explain(tv)
        reason = first.reason.splitlines()[0].split(" (", 1)[0] if first.reason else ""
        return f"conflict, {first.candidates} candidates; winner: candidate A because {reason}"

    def annotated(self, tv: TensorView) -> bool:
        return tv in self.fusion_tvs and tv.mesh is not None

    def state(self, tv: TensorView):
        return self.program.state[tv]


def _axis_row(view: _PlanView, tv: TensorView, k: int, priorities: dict) -> str:
    state = view.state(tv)
    id_ = tv.logical[k]
    digits = state.layouts[k] if k < len(state.layouts) else ()
    kind = {"i": "", "b": "broadcast ", "r": "reduction "}[id_.iter_type.value]
    name = f"{kind}axis {k} [{view.extent(tv, k)}]"
    if not digits:
        what = "replicated" if not id_.is_reduction() else "summed"
        cell = f'<font color="{REPLICATED_COLOR}">{what}</font>'
    else:
        # outer to inner: DIDy(2) [32] is 2 blocks of 32 over DIDy; [32] DIDx(2) is cyclic
        parts = []
        for d in digits:
            if isinstance(d, str):
                size = state.mesh.axis_size(d)
                parts.append(f'<font color="{AXIS_COLORS[d]}"><b>DID{d}</b></font>({size})')
            else:
                parts.append(html.escape(f"[{view.size(d)}]"))
        cell = " ".join(parts)
        if id_.is_reduction():
            cell = "pending sum " + cell
    if k in priorities and digits:
        cell += f" (p{priorities[k]})"
    return f'<tr><td align="left">{html.escape(name)}</td><td align="left">{cell}</td></tr>'


def _tv_label(view: _PlanView, tv: TensorView) -> str:
    state = view.state(tv)
    shape = ", ".join(view.global_shape(tv))
    role = []
    if tv in view.program.input_set:
        role.append("input")
    if tv in view.program.outputs:
        role.append("output")
    title = f"{tv.short_name()} {tv.dtype()}[{shape}]" + (f" ({', '.join(role)})" if role else "")
    rows = [f'<tr><td colspan="2"><b>{html.escape(title)}</b></td></tr>']
    mesh = str(state.mesh) if state.mesh is not None else "every device"
    rows.append(f'<tr><td colspan="2">mesh {html.escape(mesh)}</td></tr>')
    priorities = view.axis_priorities(tv)
    rows += [_axis_row(view, tv, k, priorities) for k in range(len(tv.logical))]
    if view.annotated(tv):
        priority = tv.sharding_priority if tv.sharding_priority is not None else 0
        rows.append(f'<tr><td colspan="2" bgcolor="#FFF3D6">user annotation, priority {priority}</td></tr>')
    conflict = view.conflict(tv)
    if conflict:
        rows.append(f'<tr><td colspan="2" bgcolor="#FDE0E0">{html.escape(conflict)}</td></tr>')
    return '<<table border="0" cellborder="0" cellspacing="0" cellpadding="2">' + "".join(rows) + "</table>>"


def _comm_label(expr, comm) -> str:
    step = expr.attrs["step"]
    lines = [f"<b>{html.escape(step.kind)}</b>"]
    if step.mesh_axis:
        lines[0] += f' over <font color="{AXIS_COLORS[step.mesh_axis]}"><b>DID{step.mesh_axis}</b></font>'
    if comm is None:  # a local slice: every device keeps its block, nothing moves
        lines.append("local, 0 B moved")
    else:
        groups = " ".join("{" + " ".join(map(str, g)) + "}" for g in comm.groups)
        lines.append(f"groups {html.escape(groups)}")
        size = format_bytes(comm.bytes_received) if comm.bytes_received is not None else "symbolic size"
        lines.append(f"{size} received per device")
    return "<" + "<br/>".join(lines) + ">"


def build_graph(plan):
    """A graphviz.Digraph of the plan (see the module docstring)."""
    graphviz = _graphviz()
    view = _PlanView(plan)
    program = plan.program
    g = graphviz.Digraph("plan", graph_attr={"rankdir": "TB", "fontname": "Helvetica", "nodesep": "0.3",
                                             "ranksep": "0.35"},
                         node_attr={"fontname": "Helvetica", "fontsize": "10"},
                         edge_attr={"arrowsize": "0.6", "penwidth": "1.6"})
    shown: set = set()

    def show_tv(tv):
        if tv in shown:
            return
        shown.add(tv)
        border, width = "black", "1"
        if view.annotated(tv):
            border, width = ANNOTATION_COLOR, "3"
        if view.conflict(tv):
            border, width = CONFLICT_COLOR, "3"
        g.node(tv_node_id(tv), label=_tv_label(view, tv), shape="box", style="rounded", color=border,
               penwidth=width)

    def data_edge(tail, head, tv):
        state = view.state(tv)
        axes = layout.mesh_axes_of(tuple(d for k in tv.non_reduction_axes() for d in state.layouts[k]))
        pending = state.pending(tv)
        g.edge(tail, head, color=edge_color(axes + pending), style="dashed" if pending else "solid")

    for tv in program.inputs:
        if isinstance(tv, TensorView):
            show_tv(tv)
    comms = iter(plan.communications)
    for i, expr in enumerate(program.exprs):
        if not expr.tv_outputs:
            continue  # scalar arithmetic (sizes)
        node = f"e{i}"
        if expr.op.is_communication:
            step = expr.attrs["step"]
            comm = next(comms) if step.kind != "slice" else None
            color = AXIS_COLORS.get(step.mesh_axis, "black")
            g.node(node, label=_comm_label(expr, comm), shape="hexagon", style="filled",
                   fillcolor="#FFFFFF" if comm is None else "#EAF2FB", color=color, penwidth="2")
        else:
            g.node(node, label=html.escape(expr.op.name), shape="ellipse", height="0.3", margin="0.05,0.02")
        for tv in expr.tv_inputs:
            show_tv(tv)
            data_edge(tv_node_id(tv), node, tv)
        for tv in expr.tv_outputs:
            show_tv(tv)
            data_edge(node, tv_node_id(tv), tv)
    _legend(g)
    return g


def _legend(g) -> None:
    rows = [f'<tr><td align="left"><font color="{c}"><b>&#9473;&#9473; DID{a}</b></font></td></tr>'
            for a, c in AXIS_COLORS.items()]
    rows.append(f'<tr><td align="left"><font color="{REPLICATED_COLOR}">&#9473;&#9473; replicated</font></td></tr>')
    rows.append('<tr><td align="left">- - pending sum</td></tr>')
    rows.append('<tr><td align="left">DIDy(2) [32]: 2 blocks of 32</td></tr>')
    rows.append('<tr><td align="left">(p0): decided at priority 0</td></tr>')
    rows.append(f'<tr><td align="left"><font color="{ANNOTATION_COLOR}"><b>&#9633;</b></font> annotated</td></tr>')
    rows.append(f'<tr><td align="left"><font color="{CONFLICT_COLOR}"><b>&#9633;</b></font> conflict</td></tr>')
    label = '<<table border="0" cellspacing="0" cellpadding="1"><tr><td><b>legend</b></td></tr>' + "".join(rows) \
        + "</table>>"
    g.node("legend", label=label, shape="note")


def to_dot(plan) -> str:
    return build_graph(plan).source


def render(plan, path) -> str:
    """Write the plan's graph to `path` (.svg or .png); returns the path."""
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise NvShardError(f"plan.render({path!r}): the file name must end in .svg or .png, got {ext or 'none'}")
    graphviz = _graphviz()
    graph = build_graph(plan)
    try:
        data = graph.pipe(format=FORMATS[ext])
    except graphviz.ExecutableNotFound:
        raise NvShardError(
            "plan.render needs Graphviz's `dot` program, which is not on PATH: install it "
            "(Debian/Ubuntu: apt-get install graphviz; ./tools/nvshard setup does this as root), "
            "or use plan.to_dot() for the DOT source"
        ) from None
    with open(path, "wb") as f:
        f.write(data)
    return path
