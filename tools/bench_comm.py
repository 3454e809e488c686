"""Communication volume, side by side: nvshard's default propagation, nvFuser's
current heuristic (legacy), the hand-designed plan, the optimum, and (when jax
is importable) Shardy and GSPMD.

    .venv/bin/python tools/bench_comm.py [--json bench-results/comm.json] [--only triangle,mlp]
                                         [--no-optimum] [--verify] [--no-jax] [--quick]

--quick (CI's smoke run): small sizes, the first row of each program, with
--verify. Any row that raises, or a verified plan whose measured bytes or
outputs disagree, makes the exit status 1.

Every figure is bytes received per device (the most any device receives) by
all collectives of the program, with concrete sizes:

    allgather       out - in          = (d-1) * local input
    reduce-scatter  in - out          = (d-1)/d * local input
    allreduce       2(d-1)/d * size
    all-to-all      (d-1)/d * size
    permute / send  size

Columns
  default   nvshard.propagate_shardings(fd, shapes, propagation="default")
  legacy    propagation="legacy": nvFuser's pass today (forward sweep that
            prefers the weight / matmul's second operand, then backward sweep)
  designed  the hand-designed plan: the annotations of upstream's tests plus the
            intermediate annotation they need (triangle: matmul_out [b->z, c,
            i->y, j->x], k pending, as upstream's "TODO(#5901)" block; MLP and
            transformer: Megatron's layout, linear outputs sharded on their
            output features), then nvshard's default propagation
  search    propagation="search": default propagation, then the exact block
            layout search of nvshard/preseg/search.py over the unannotated
            tensors (outputs keep default's layouts, contractions split over
            every mesh axis); its plan is taken only when it moves fewer bytes,
            "◦" marks rows where default propagation's plan stands
  optimum   the same search on its own (tools/optimum.py, balanced=True): exact
            minimum over block shardings of every unannotated tensor, with the
            fusion outputs pinned to the layouts nvshard default gives them (a
            pending sum may still end in a reduce-scatter onto them), every
            tensor on the mesh default gives it, and every linear/matmul/
            attention splitting its work over all mesh axes; on 3-D meshes
            without nested splits of one axis. Its model computes each expr as
            its results say, so it can sit above default where default
            computes on operand shards (transformer TP on 4) or runs a
            contraction unsplit (weight gradient)
  Shardy / GSPMD  (only when jax is installed) the same program in JAX on CPU
            host devices (tools/bench_jax.py)

A cell reads "MiB (collectives)"; AG allgather, RS reduce-scatter, AR allreduce,
A2A all-to-all, CP collective-permute / send-recv. "†" marks a plan whose
fusion outputs end up sharded differently from nvshard default's (so its bytes
are for a different result layout).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
# this checkout's nvshard first (the venv may hold another checkout in develop
# mode: a worktree's run would otherwise time that one), then the sibling tools
for p in (HERE, os.path.dirname(HERE)):  # (each goes in front: the checkout ends up first)
    sys.path.insert(0, p)

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import nvshard as nvfuser  # noqa: E402
from nvshard import DataType, FusionDefinition  # noqa: E402
from nvshard import models  # noqa: E402
from nvshard.models import Direction  # noqa: E402
from nvshard.multidevice.collectives import COLLECTIVES  # noqa: E402

MiB = float(1 << 20)
# nvshard's collectives by their short names, and XLA's collective-permute (Shardy/GSPMD columns)
ABBREV = {**{kind: c.short for kind, c in COLLECTIVES.items()}, "collective_permute": "CP"}
FORMULAS = {
    "allgather": "out - in = (d-1) * local input",
    "reduce_scatter": "in - out = (d-1)/d * local input",
    "allreduce": "2(d-1)/d * size",
    "all_to_all": "(d-1)/d * size",
    "collective_permute / send_recv": "size",
    "broadcast": "size (cross-mesh; not used here)",
}

# Sizes (global)
TRI = dict(b=2, n=64, c=128)  # f32
ATTN = dict(b=2, n=64, c=128, c_hidden=32, heads=4)  # f32
MLP_H = 512  # f32; 4h = 2048
MLP_T = {"t<4h": 1024, "t>4h": 8192}
TF = dict(b=2, s=1024, heads=8, e=1024)  # bf16, as upstream's test


def make_mesh(shape):
    return nvfuser.multidevice.DeviceMesh(torch.arange(math.prod(shape)).reshape(shape))


# -- programs ------------------------------------------------------------------------------


@dataclass
class Case:
    program: str  # e.g. "triangle update outgoing"
    variant: str  # e.g. "upstream order"
    mesh_shape: tuple
    build: Callable  # build(designed: bool) -> (fd, input_shapes, unsharded inputs maker)
    has_designed: bool
    jax_key: Optional[tuple] = None  # what bench_jax needs to rebuild the program

    @property
    def name(self) -> str:
        return f"{self.program}, {self.variant}" if self.variant else self.program

    @property
    def mesh_text(self) -> str:
        return "x".join(str(s) for s in self.mesh_shape)


def _triangle_case(direction: Direction, swap: bool, mesh_shape):
    b, n, c = TRI["b"], TRI["n"], TRI["c"]

    def build(designed: bool):
        dp, cp = mesh_shape[0], mesh_shape[1]
        with FusionDefinition() as fd:
            inputs, mm = models.triangle_update(fd, direction, c, DataType.Float, swap)
            mesh = make_mesh(mesh_shape)
            models.annotate_triangle(inputs, mesh, dp, cp)
            if designed:
                models.annotate_triangle_matmul(mm, mesh, dp, cp, direction, swap)
        shapes = models.triangle_shapes(b, n, c)

        def data():
            g = torch.Generator().manual_seed(0)
            r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
            return [r(b, n, n, c), r(c), r(c), r(2 * c, c) / c ** 0.5, r(2 * c, c) / c ** 0.5, r(c), r(c),
                    r(c, c) / c ** 0.5, r(c, c) / c ** 0.5, torch.rand(b, n, n, generator=g) > 0.2]
        return fd, shapes, data

    return Case(f"triangle update {direction.value}", "operands swapped" if swap else "upstream order",
                mesh_shape, build, True, ("triangle", direction.value, swap))


def _attention_case(direction: Direction, mesh_shape):
    b, n, c, ch, h = ATTN["b"], ATTN["n"], ATTN["c"], ATTN["c_hidden"], ATTN["heads"]

    def build(designed: bool):
        with FusionDefinition() as fd:
            inputs, _ = models.triangle_attention(fd, direction, c, ch, h, DataType.Float)
            mesh = make_mesh(mesh_shape)
            models.annotate_triangle(inputs, mesh, mesh_shape[0], mesh_shape[1])
        hc = h * ch
        shapes = [[b, n, n, c], [hc, c], [hc, c], [h, c], [b, n, n], [hc, c], [hc, c], [c, hc]]

        def data():
            g = torch.Generator().manual_seed(0)
            r = lambda *s: torch.randn(*s, generator=g) / 8  # noqa: E731
            return [r(b, n, n, c), r(hc, c), r(hc, c), r(h, c), torch.rand(b, n, n, generator=g) > 0.2, r(hc, c),
                    r(hc, c), r(c, hc)]
        return fd, shapes, data

    node = "starting node" if direction is Direction.OUTGOING else "ending node"
    return Case(f"triangle attention {direction.value}", node, mesh_shape, build, False,
                ("attention", direction.value))


def _mlp_case(sp: bool, size: str, mesh_shape):
    t, h = MLP_T[size], MLP_H

    def build(designed: bool):
        with FusionDefinition() as fd:
            tvs, named = models.mlp(fd, t, h, DataType.Float)
            mesh = make_mesh(mesh_shape)
            if len(mesh_shape) == 1:
                models.annotate_mlp(tvs, mesh, sp)
            else:
                models.annotate_mlp_2d(tvs, mesh, sp)
            if designed:
                models.annotate_mlp_megatron(named, mesh)
        shapes = [[t, h], [4 * h, h], [h, 4 * h]]

        def data():
            g = torch.Generator().manual_seed(0)
            return [torch.randn(t, h, generator=g), torch.randn(4 * h, h, generator=g) / h ** 0.5,
                    torch.randn(h, 4 * h, generator=g) / (4 * h) ** 0.5]
        return fd, shapes, data

    return Case(f"MLP {'SP' if sp else 'TP'}", f"{size} (t={t}, h={h})", mesh_shape, build, True,
                ("mlp", sp, t, h))


def _transformer_case(sp: bool, mesh_shape):
    b, s, heads, e = TF["b"], TF["s"], TF["heads"], TF["e"]

    def build(designed: bool):
        with FusionDefinition() as fd:
            inputs, named = models.transformer_forward(fd, b, s, heads, e)
            mesh = make_mesh(mesh_shape)
            if len(mesh_shape) == 1:
                models.annotate_transformer(inputs, mesh, sp)
            else:
                models.annotate_transformer_2d(inputs, mesh, sp)
            if designed:
                models.annotate_transformer_megatron(named, mesh)
        shapes = [[b, s, e], [e], [e], [3 * e, e], [3 * e], [e, e], [e], [e], [e], [4 * e, e], [4 * e], [e, 4 * e],
                  [e]]

        def data():
            g = torch.Generator().manual_seed(0)
            out = []
            for shape in shapes:
                fan = shape[-1]
                out.append((torch.randn(*shape, generator=g) / fan ** 0.5).to(torch.bfloat16))
            return out
        return fd, shapes, data

    return Case(f"transformer layer {'SP' if sp else 'TP'}", f"b={b} s={s} e={e} heads={heads}", mesh_shape, build,
                True, ("transformer", sp))


def _quality_cases() -> list:
    """Plan-quality regressions (tests/python/test_plan_quality.py), f32 on 4 devices."""

    def case(program, variant, define, shapes):
        def build(designed: bool):
            with FusionDefinition() as fd:
                define(fd, make_mesh((4,)))

            def data():
                g = torch.Generator().manual_seed(0)
                # scaled by fan-in so stacked layers stay O(1) and float sums in another order stay close
                return [torch.randn(*s, generator=g) / s[-1] ** 0.5 for s in shapes]
            return fd, shapes, data
        return Case(program, variant, (4,), build, False)

    def weight_gradient(fd, mesh):  # dW = dy^T @ x, both split on the contracted tokens
        dy, x = (models.split_input(fd, [256, 1024], mesh, 0) for _ in range(2))
        fd.add_output(fd.ops.matmul(fd.ops.permute(dy, [1, 0]), x))

    def replicated_sum(fd, mesh):  # row-sharded a + b into a replicated annotated output
        a, b = (models.split_input(fd, [1024, 512], mesh, 0) for _ in range(2))
        c = fd.ops.add(a, b)
        c.set_device_mesh(mesh)
        fd.add_output(c)

    def three_projections(fd, mesh):  # column-parallel q, k, v of one sequence-parallel x
        x = models.split_input(fd, [2048, 512], mesh, 0)
        for _ in range(3):
            fd.add_output(fd.ops.linear(x, models.split_input(fd, [1024, 512], mesh, 0)))

    def mlp_backward(fd, mesh):  # two linears forward and backward, tokens split (SP)
        x, w1, w2, dout = (models.split_input(fd, [1024, 512], mesh, 0), models.split_input(fd, [2048, 512], mesh, 0),
                           models.split_input(fd, [512, 2048], mesh, 1), models.split_input(fd, [1024, 512], mesh, 0))
        h1 = fd.ops.linear(x, w1)
        dh1 = fd.ops.matmul(dout, w2)
        dw1, dw2 = fd.ops.matmul(fd.ops.permute(dh1, [1, 0]), x), fd.ops.matmul(fd.ops.permute(dout, [1, 0]), h1)
        for o in (fd.ops.linear(h1, w2), fd.ops.matmul(dh1, w1), dw1, dw2):
            fd.add_output(o)
        for grad, axis in ((dw1, 0), (dw2, 1)):  # gradients sharded like their weights, as training code keeps them
            grad.set_device_mesh(mesh)
            grad.outer_split(axis, mesh.size)
            grad.axis(axis).parallelize(nvfuser.ParallelType.mesh_x)

    def stage_cut(fd, mesh):  # stage 1 on {0, 1}; the user sets its tail's result onto {2, 3}
        stage1, stage2 = make_mesh((2,)), nvfuser.multidevice.DeviceMesh(torch.tensor([2, 3]))
        h = fd.ops.relu(models.split_input(fd, [2048, 512], stage1, 0))
        boundary = fd.ops.set(fd.ops.add(fd.ops.mul(h, h), h))
        boundary.set_device_mesh(stage2)
        boundary.outer_split(0, 2)
        boundary.axis(0).parallelize(nvfuser.ParallelType.mesh_x)
        fd.add_output(fd.ops.relu(boundary))

    def mlp_blocks(layers, t, h):
        def define(fd, mesh):
            x = models.split_input(fd, [t, h], mesh, 0)
            for _ in range(layers):
                up = fd.ops.linear(x, models.split_input(fd, [4 * h, h], mesh, 0))
                x = fd.ops.add(fd.ops.linear(models.gelu_tanh(fd, up), models.split_input(fd, [h, 4 * h], mesh, 1)), x)
            fd.add_output(x)
        return define

    return [
        case("weight gradient dy^T x", "t=256 split, h=1024", weight_gradient, [[256, 1024], [256, 1024]]),
        case("replicated output of sharded operands", "a + b, 1024x512", replicated_sum,
             [[1024, 512], [1024, 512]]),
        case("three projections of one SP input", "x 2048x512, W 1024x512", three_projections,
             [[2048, 512]] + [[1024, 512]] * 3),
        case("MLP forward+backward SP", "t=1024 h=512 f=2048", mlp_backward,
             [[1024, 512], [2048, 512], [512, 2048], [1024, 512]]),
        case("pipeline stage cut", "{0,1} -> set onto {2,3}, 2048x512", stage_cut, [[2048, 512]]),
        case("stacked MLP blocks SP", "3 layers, t=8192 h=1024", mlp_blocks(3, 8192, 1024),
             [[8192, 1024]] + [[4096, 1024], [1024, 4096]] * 3),
    ]


def cases() -> list:
    out = []
    for ms in [(1, 2, 2), (2, 2, 2)]:
        for direction in (Direction.OUTGOING, Direction.INCOMING):
            for swap in (False, True):
                out.append(_triangle_case(direction, swap, ms))
    for ms in [(1, 2, 2), (2, 2, 2)]:
        for direction in (Direction.OUTGOING, Direction.INCOMING):
            out.append(_attention_case(direction, ms))
    for sp in (False, True):
        for size in MLP_T:
            for ms in [(4,), (2, 2)]:
                out.append(_mlp_case(sp, size, ms))
    for sp in (False, True):
        for ms in [(4,), (2, 2)]:
            out.append(_transformer_case(sp, ms))
    return out + _quality_cases()


# -- measuring ------------------------------------------------------------------------------


def summarize(comms) -> tuple:
    """(bytes per device, {kind: count}) from nvshard Communication records;
    collectives over groups of one device (size-1 mesh axes) move nothing and
    are left out."""
    counts: dict = {}
    for c in comms:
        if c.groups and max(len(g) for g in c.groups) <= 1:
            continue
        counts[c.kind] = counts.get(c.kind, 0) + 1
    return counts


def cell(entry) -> str:
    if entry is None:
        return "–"
    if "error" in entry:
        return "error"
    text = f"{entry['bytes'] / MiB:.2f}"
    counts = entry.get("collectives") or {}
    parts = [f"{n}{ABBREV.get(k, k)}" if n > 1 else ABBREV.get(k, k) for k, n in sorted(counts.items())]
    text += f" ({' '.join(parts)})" if parts else " (none)"
    if entry.get("output_differs"):
        text += " †"
    return text


def out_keys(plan, fusion) -> list:
    """The outputs' shardings, comparable across fusions (mesh axes per axis)."""
    from nvshard.multidevice import layout

    keys = []
    for o in fusion.outputs():
        s = plan.propagated[o]
        keys.append((str(s.mesh), tuple(layout.mesh_axes_of(d) for d, i in zip(s.layouts, o.logical)
                                        if not i.is_reduction())))
    return keys


def run_nvshard(fd, shapes, mode: str, reference_outputs=None) -> dict:
    t0 = time.perf_counter()
    plan = nvfuser.propagate_shardings(fd, shapes, propagation=mode)
    entry = dict(bytes=plan.bytes_per_device, collectives=summarize(plan.communications),
                 plan_s=time.perf_counter() - t0,
                 communications=[dict(kind=c.kind, tensor=c.tensor, mesh_axis=c.mesh_axis,
                                      bytes=c.bytes_received) for c in plan.communications])
    if reference_outputs is not None:
        entry["output_differs"] = out_keys(plan, fd.fusion) != reference_outputs
    return entry, plan


def run_optimum(fd, shapes, default_plan, mesh_shape) -> dict:
    from optimum import Infeasible, TooBig, optimum

    active = sum(1 for s in mesh_shape if s > 1)
    nested = active <= 2
    fixed = {o: default_plan.propagated[o] for o in fd.fusion.outputs()}
    t0 = time.perf_counter()
    try:
        r = optimum(fd, shapes, fixed=fixed, nested=nested, balanced=True)
    except TooBig as e:
        return dict(error=f"too big: {e}")
    except Infeasible as e:
        return dict(error=f"infeasible: {e}")
    entry = dict(bytes=r.bytes_per_device, collectives=summarize(r.communications), exact=r.exact,
                 lower_bound=r.lower_bound,
                 nested=nested, balanced=True, search_s=time.perf_counter() - t0, stats=r.stats,
                 objective=r.objective, plan=r.plan,
                 communications=[dict(kind=c.kind, tensor=c.tensor, mesh_axis=c.mesh_axis, bytes=c.bytes_received)
                                 for c in r.communications])
    if active <= 2:  # cheap: also without the balance constraint
        try:
            u = optimum(fd, shapes, fixed=fixed, nested=nested, balanced=False)
            entry["unbalanced"] = dict(bytes=u.bytes_per_device, collectives=summarize(u.communications),
                                       exact=u.exact)
        except (TooBig, Infeasible):
            pass
    return entry


def jax_sizes() -> dict:
    return dict(TRI=TRI, ATTN=ATTN, MLP_H=MLP_H, TF=TF)


def jax_output_specs(case, plan, fusion) -> list:
    """The fusion outputs' shardings under `plan` as bench_jax.measure wants
    them: per output, per dimension, the mesh axis names outer first."""
    specs = [[list(axes) for axes in dims] for _, dims in out_keys(plan, fusion)]
    if case.jax_key[0] == "transformer":
        del specs[5:7]  # sdpfa_fwd's philox seed and offset: not in the JAX port
    return specs


def jax_demo(text: str, want_hlo: bool) -> int:
    """--jax-demo "triangle outgoing 0 1x2x2": one program, both partitioners, the collectives."""
    import bench_jax

    words = text.split()
    mesh = tuple(int(x) for x in words[-1].split("x"))
    conv = [int(x) if x.lstrip("-").isdigit() else x for x in words[1:-1]]
    key = (words[0], *conv)
    if words[0] in ("mlp", "transformer"):
        key = (words[0], bool(conv[0]), *conv[1:])
    elif words[0] == "triangle":
        key = (words[0], conv[0], bool(conv[1]))
    case = next((c for c in cases() if tuple(c.jax_key or ()) == key and tuple(c.mesh_shape) == mesh), None)
    if case is None:
        print(f"no bench_comm row for {key} on {words[-1]}", file=sys.stderr)
        return 2
    fd, shapes, _ = case.build(False)
    plan = nvfuser.propagate_shardings(fd, shapes, propagation="default")
    expected = jax_output_specs(case, plan, fd.fusion)
    reply = bench_jax.measure(key, mesh, jax_sizes(), expected, hlo=want_hlo)
    print(bench_jax.describe(reply, expected, want_hlo))
    return 0


def verify(plan, data_fn) -> dict:
    """Run every rank of a plan in this process (simulated collectives): bytes
    each rank received against the plan, and the output against unsharded
    torch evaluation of the same fusion."""
    from nvshard.api import assemble
    from nvshard.multidevice import shard_tensor
    from nvshard.runtime.backends import SimulatedBackend
    from nvshard.runtime.executor import run_program

    inputs = data_fn()
    vals = plan.fusion.inputs()
    devices = plan.devices()
    world = max(devices) + 1
    # a rank outside an input's mesh holds none of it (as simulate() gives it)
    per_rank = {r: [(shard_tensor(t, v, r) if v.mesh.has(r) else None) if v.mesh is not None else t
                    for v, t in zip(vals, inputs)] for r in range(world)}
    backend = SimulatedBackend()
    outputs = run_program(plan, per_rank, backend, torch.device("cpu"), 0)
    measured = dict(backend.received)
    planned = {r: plan.bytes_received(r) for r in range(world)}
    bytes_ok = all(abs(measured.get(r, 0.0) - planned[r]) < 1e-6 for r in range(world))
    outs = [assemble(plan, tv, {r: o[i] for r, o in outputs.items()}) for i, tv in enumerate(plan.program.outputs)]
    return dict(bytes_ok=bytes_ok, measured=max(measured.values(), default=0.0), outputs=outs)


# -- main ------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=os.path.join("bench-results", "comm.json"))
    parser.add_argument("--only", default="", help="comma-separated substrings of program names")
    parser.add_argument("--no-optimum", action="store_true")
    parser.add_argument("--no-jax", action="store_true")
    parser.add_argument("--no-search", action="store_true", help='skip the propagation="search" column')
    parser.add_argument("--verify", action="store_true",
                        help="also run each nvshard plan and the optimum's on simulated ranks: measured bytes "
                             "== planned, outputs equal (slower)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, one row per program, verified; for CI (a smoke run, not figures)")
    parser.add_argument("--jax-demo", metavar="PROGRAM",
                        help='one program through Shardy and GSPMD, e.g. "triangle outgoing 0 1x2x2" (needs jax)')
    parser.add_argument("--hlo", action="store_true", help="with --jax-demo: print the partitioned HLO")
    args = parser.parse_args(argv)
    if args.jax_demo:
        return jax_demo(args.jax_demo, args.hlo)
    if args.quick:
        use_quick_sizes()
        args.verify = True
        if args.json == parser.get_default("json"):
            args.json = ""

    jax_bench = None
    if not args.no_jax:
        try:
            import bench_jax
            if bench_jax.available():
                jax_bench = bench_jax
        except Exception:  # noqa: BLE001 - jax is optional
            jax_bench = None

    selected = [c for c in cases() if not args.only or any(s.strip().lower() in c.name.lower()
                                                            for s in args.only.split(","))]
    if args.quick:
        firsts = {}
        for c in selected:
            firsts.setdefault(c.program, c)
        selected = list(firsts.values())
    rows = []
    start = time.perf_counter()
    for case in tqdm(selected, desc="bench_comm", unit="case", disable=None):  # quiet unless on a terminal
        row = dict(program=case.program, variant=case.variant, mesh=list(case.mesh_shape))
        try:
            fd, shapes, data = case.build(False)
            row["exprs"] = len(fd.fusion.exprs)
            row["default"], dplan = run_nvshard(fd, shapes, "default")
            ref = out_keys(dplan, fd.fusion)
            row["legacy"], lplan = run_nvshard(fd, shapes, "legacy", ref)
            plans = {"default": dplan, "legacy": lplan}
            if not args.no_search:
                row["search"], splan = run_nvshard(fd, shapes, "search", ref)
                row["search"]["outcome"] = splan.search
                plans["search"] = splan
            if case.has_designed:
                dfd, dshapes, _ = case.build(True)
                row["designed"], plans["designed"] = run_nvshard(dfd, dshapes, "default", ref)
            if not args.no_optimum:
                try:
                    row["optimum"] = run_optimum(fd, shapes, dplan, case.mesh_shape)
                except Exception as e:  # noqa: BLE001 - keep the row's other columns
                    row["optimum"] = dict(error=f"{type(e).__name__}: {e}")
                if "plan" in row["optimum"]:
                    plans["optimum"] = row["optimum"].pop("plan")
            if jax_bench is not None and case.jax_key is not None:
                try:
                    row.update(jax_bench.measure(case.jax_key, case.mesh_shape, jax_sizes(),
                                                 jax_output_specs(case, dplan, fd.fusion)))
                except Exception as e:  # noqa: BLE001
                    row["shardy"] = row["gspmd"] = dict(error=f"{type(e).__name__}: {e}")
            if args.verify:
                checks = {}
                reference = None
                for name, plan in plans.items():
                    v = verify(plan, data)
                    if reference is None:
                        reference = v["outputs"]
                    close = all(torch.allclose(a.float(), b.float(), atol=2e-2, rtol=2e-2)
                                for a, b in zip(v["outputs"], reference))
                    checks[name] = dict(bytes_ok=v["bytes_ok"], measured=v["measured"], outputs_match_default=close)
                row["verify"] = checks
        except Exception as e:  # noqa: BLE001 - keep benchmarking the rest
            row["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        rows.append(row)
        _progress(row)
    elapsed = time.perf_counter() - start

    print()
    print(render(rows, jax_bench is not None))
    print()
    print(notes(rows, jax_bench))
    print(f"\n({len(rows)} programs in {elapsed:.0f} s)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(sizes=dict(triangle_update=TRI, triangle_attention=ATTN, mlp=dict(h=MLP_H, t=MLP_T),
                                      transformer=TF),
                           formulas=FORMULAS, rows=rows, seconds=elapsed), f, indent=1, default=_json_default)
        print(f"wrote {args.json}")
    failed = failures(rows)
    for line in failed:
        print("FAILED " + line, file=sys.stderr)
    return 1 if failed else 0


def failures(rows) -> list:
    """Rows that raised, and verified plans whose measured bytes or outputs disagree."""
    out = []
    for row in rows:
        name = f"{row['program']}, {row['variant']} on {'x'.join(map(str, row['mesh']))}"
        if "error" in row:
            out.append(f"{name}: {row['error']}")
        for plan, v in row.get("verify", {}).items():
            if not (v["bytes_ok"] and v["outputs_match_default"]):
                out.append(f"{name}: {plan} plan verified wrong {v}")
    return out


def use_quick_sizes() -> None:
    """Shrink every program (in place, so the case builders see it) for --quick."""
    TRI.update(b=2, n=8, c=8)
    ATTN.update(b=2, n=8, c=8, c_hidden=4, heads=2)
    MLP_T.update({"t<4h": 32, "t>4h": 128})
    TF.update(b=2, s=16, heads=4, e=32)
    global MLP_H
    MLP_H = 16


def _json_default(o):
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def _progress(row) -> None:
    parts = [f"{row['program']}, {row['variant']} on {'x'.join(map(str, row['mesh']))}:"]
    for col in ("default", "legacy", "search", "designed", "optimum", "shardy", "gspmd"):
        if col in row:
            parts.append(f"{col} {cell(row[col])}")
    if "error" in row:
        parts.append("ERROR " + row["error"])
    print("  " + "; ".join(parts), file=sys.stderr, flush=True)


COLUMNS = [("default", "nvshard default"), ("legacy", "nvshard legacy"), ("search", "nvshard search"),
           ("designed", "designed"), ("optimum", "optimum")]


def render(rows, with_jax: bool) -> str:
    cols = COLUMNS + ([("shardy", "Shardy"), ("gspmd", "GSPMD")] if with_jax else [])
    head = "| program | mesh | " + " | ".join(t for _, t in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for row in rows:
        cells = []
        for key, _ in cols:
            entry = row.get(key)
            text = cell(entry)
            if key == "search" and entry and entry.get("outcome", {}).get("chosen") == "default":
                text += " ◦"
            if key == "optimum" and entry and "bytes" in entry:
                if not entry.get("nested", True):
                    text += " ‡"
                if not entry.get("exact", True) and entry["lower_bound"] < entry["bytes"] - 0.5:
                    text += f" ≥{entry['lower_bound'] / MiB:.2f}"
            cells.append(text)
        if "error" in row:
            cells = [f"error: {row['error']}"] + [""] * (len(cols) - 1)
        lines.append(f"| {row['program']}, {row['variant']} | {'x'.join(map(str, row['mesh']))} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def notes(rows, jax_bench) -> str:
    out = ["Bytes received per device, MiB, by collective kind:"]
    out += [f"  {k}: {v}" for k, v in FORMULAS.items()]
    out.append("Sizes: triangle update f32 b=%(b)d n=%(n)d c=%(c)d; " % TRI
               + "triangle attention f32 b=%(b)d n=%(n)d c_z=%(c)d c_hidden=%(c_hidden)d heads=%(heads)d; " % ATTN
               + f"MLP f32 h={MLP_H} (4h={4 * MLP_H}), t={MLP_T['t<4h']} or {MLP_T['t>4h']}; "
               + "transformer bf16 b=%(b)d s=%(s)d e=%(e)d heads=%(heads)d." % TF)
    out.append("Meshes: triangle programs (dp, cp, cp) = z, y, x with z_in/mask b->z, i->y, j->x; MLP and "
               "transformer 1-D tp=4 (x), or 2x2 = dp (y) x tp (x) with the batch/tokens on dp.")
    out.append("† outputs sharded differently from nvshard default's.  ‡ 3-D mesh: optimum over layouts without "
               "nested splits of one axis.  ≥L: not proven optimal (a tensor with more than 3 consumer ops: the search charged each consumer its own reshard); the optimum lies in [L, shown]; without a mark the value is proven optimal.")
    out.append("The optimum pins the fusion outputs to nvshard default's shardings; 'designed' is the designed "
               "annotation + nvshard default propagation.  ◦ search: default propagation's plan kept (the searched "
               "plan moved no fewer bytes, or the search was too big).")
    out.append("Optimum above default: the optimum's model computes every expr as its results say and splits every "
               "contraction over all mesh axes; default may compute on its operands' shards (transformer TP on 4) "
               "or gather both operands and run the contraction unsplit (weight gradient, 1.50 MiB without the "
               "balance constraint, below).")
    worse = []
    for row in rows:
        d = row.get("default")
        if not d or "bytes" not in d:
            continue
        for key in ("legacy", "designed", "optimum"):
            other = row.get(key)
            if other and "bytes" in other and other["bytes"] < d["bytes"] - 0.5 and not other.get("output_differs"):
                worse.append(f"  {row['program']}, {row['variant']} on {'x'.join(map(str, row['mesh']))}: "
                             f"default {d['bytes'] / MiB:.2f} MiB > {key} {other['bytes'] / MiB:.2f} MiB")
    if worse:
        out.append("nvshard default moves more than:")
        out += worse
    else:
        out.append("nvshard default is never worse than legacy, designed or the optimum.")
    gaps = []
    for row in rows:
        s, o = row.get("search"), row.get("optimum")
        if s and o and "bytes" in s and "bytes" in o and s["bytes"] > o["bytes"] + 0.5:
            gaps.append(f"  {row['program']}, {row['variant']} on {'x'.join(map(str, row['mesh']))}: "
                        f"search {s['bytes'] / MiB:.2f} MiB > optimum {o['bytes'] / MiB:.2f} MiB")
    if any("search" in r for r in rows):
        out.append("nvshard search moves more than the optimum:" if gaps else
                   "nvshard search is never worse than the optimum.")
        out += gaps
    cheaper = [f"  {r['program']}, {r['variant']} on {'x'.join(map(str, r['mesh']))}: "
               f"{r['optimum']['unbalanced']['bytes'] / MiB:.2f} MiB {cell(r['optimum']['unbalanced'])}"
               for r in rows if "unbalanced" in r.get("optimum", {})
               and r["optimum"]["unbalanced"]["bytes"] < r["optimum"]["bytes"] - 0.5]
    if cheaper:
        out.append("Without the balance constraint (linear/matmul/attention may run replicated), fewer bytes:")
        out += cheaper
    if any("verify" in r for r in rows):
        bad = [f"  {r['program']}, {r['variant']} on {'x'.join(map(str, r['mesh']))}: {k} {v}"
               for r in rows for k, v in r.get("verify", {}).items()
               if not (v["bytes_ok"] and v["outputs_match_default"])]
        out.append("Simulated runs: " + ("every plan's measured bytes equal its plan and outputs agree."
                                         if not bad else "MISMATCHES:"))
        out += bad
    if jax_bench is None:
        out.append("Shardy/GSPMD columns: not measured (needs jax: pip install -e .[bench]; the README's table "
                   "has the last measured figures).")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
