"""Propagation speed: wall time of the pre-segmenter passes (sharding
propagation + resharding decomposition, nvshard.preseg.pipeline.build_plan)
on fusions from ~50 to ~10,000 exprs, with concrete input shapes.

    .venv/bin/python tools/bench_propagation.py [--max-exprs 10000] [--json bench-results/propagation.json]
                                                [--no-jax] [--jax-row-budget 60]
                                                [--profile N [--profile-family triangle]]
                                                # cProfile build_plan (default) at ~N exprs
    .venv/bin/python tools/bench_propagation.py --quick   # CI's smoke run: ~100 exprs per family, no JSON
    .venv/bin/python tools/bench_propagation.py --instructions 1000 [--families "MLP SP"]
                                                # instructions per plan (valgrind's callgrind): the
                                                # triangle update and each family at ~1000 exprs
    .venv/bin/python tools/bench_propagation.py --cache 1000,10000 [--families "MLP SP"]
                                                # per plan: instructions, data refs, L1 misses (cachegrind)
    .venv/bin/python tools/bench_propagation.py --paired "MLP SP" 769 5
                                                # nvshard and GSPMD back to back, 5 rounds (needs jax)

Programs: the AlphaFold3 triangle update (one block, upstream's annotation),
and generated stacks: N transformer layers (upstream's forward layer, each
layer's output feeding the next; TP or SP annotation on a 1-D mesh of 4),
N residual MLP blocks (SP), N triangle-update blocks (2x2 mesh).
Reported: the minimum CPU time (time.process_time: on a shared machine the
least disturbed run) of repeats of build_plan (default and legacy), the two
passes of the default pipeline separately, and time per expr. Repeats plan
one fusion again and again, so they reuse what is kept with each expr's
sharding rule (the rule itself, its axis factors and pass-through groups);
"first plan" is the minimum over freshly defined copies of the program of
the first build_plan, which derives all of that: what a compiler that
plans each fusion once pays.

With jax installed (the "bench" extra), tools/bench_jax.py's worker then
times the same programs in JAX (same shapes, dtypes and input shardings),
after all nvshard rows so XLA's compiles never disturb them. GSPMD: XLA's
own pass timers (TF_CPP_VMODULE=hlo_pass_pipeline=1; wall time, the only
clock they have) of sharding-propagation and spmd-partitioning, less the HLO
verifier runs inside them, min over repeated compiles. Shardy:
sdy-propagation-pipeline run through MLIR's pass manager on the module JAX
lowers, as XLA's Shardy pass runs it (CPU time, min of repeats). The JSON
also holds, as sanity checks, the whole compile time and XLA's Shardy pass
with its HLO <-> MLIR conversions (one compile). A row whose JAX timing
would take more than --jax-row-budget seconds (estimated from the family's
previous size) goes without.

--instructions counts instead of timing, where identical runs on a shared
machine can differ by 2x: valgrind's callgrind counts the instructions of
a process that plans a program once (warming what later plans of the same
fusion reuse, as the timed repeats do) and then k more times, for two
values of k; the difference divided by the difference in k is one plan,
with imports and set-up cancelled. PYTHONHASHSEED=0 fixes string
hashing; repeated counts still differ by up to about 2% (dicts keyed by object
identity probe differently from run to run). valgrind must be installed.
--cache runs the same processes under cachegrind with its cache
simulation: data references and L1 misses per plan, and their share of
the instructions, at each size asked for. Its simulated last level holds
every size's data, so it says nothing here; what --cache shows is whether
the rates stay the same as programs grow. If they do, a slower time per
instruction at the larger size comes from misses served further out (L3
rather than the 1 MiB L2).
--paired times one program in nvshard and in GSPMD back to back, round
after round with the order swapped each time, both by the wall clock:
the table's nvshard rows run minutes before its JAX rows, and this
machine's speed drifts by a sixth or more over minutes, which moves the
table's ratios as much. It prints each round's ratios, their medians,
and each side's least disturbed round.

Targets: the propagation pass no slower than XLA's GSPMD propagation, and
the whole plan no slower than GSPMD's propagation + partitioning, on the
triangle update and at 10,000 exprs; time per expr within 2x from 100 to
10,000 exprs. The GSPMD figures are this run's where jax is installed;
otherwise (and for rows without JAX timings) the ones measured with JAX
0.10.2 on this 2-core machine (GSPMD_REFERENCE_MS), labelled as such.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import json
import os
import pstats
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# this checkout's nvshard first (the venv may hold another checkout in develop
# mode: a worktree's run would otherwise time that one), then the sibling tools
for p in (HERE, os.path.dirname(HERE)):  # (each goes in front: the checkout ends up first)
    sys.path.insert(0, p)

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import nvshard as nvfuser  # noqa: E402
from nvshard import native  # noqa: E402
from nvshard import DataType, FusionDefinition  # noqa: E402
from nvshard.preseg.cost import CostModel  # noqa: E402
from nvshard.preseg.decompose_reshardings import DecomposeReshardingsPass  # noqa: E402
from nvshard.preseg.pipeline import _sizes, build_plan  # noqa: E402
from nvshard.preseg.program import Program  # noqa: E402
from nvshard.preseg.propagate_shardings import PropagateShardingsPass  # noqa: E402
from nvshard import models  # noqa: E402
from nvshard.models import Direction  # noqa: E402

import bench_jax  # noqa: E402  (imports jax only in its worker process)

P = nvfuser.ParallelType

# GSPMD on the same programs (JAX 0.10.2, CPU host devices, 2 cores, min of repeats):
# (propagation, propagation + partitioning) in ms, for the triangle update and the
# ~10k-expr stacks. Used where jax is missing. Measured by this tool's full run at
# f2f51d7 (the README's table); the first figures were about twice these.
GSPMD_REFERENCE_MS = {"triangle update": (0.6, 1.3), "MLP SP": (63.4, 140.9), "triangle": (127.8, 309.1)}

# Program sizes, shared by the nvshard generators and their JAX ports.
TRI = dict(b=2, n=64, c=128)
TF = dict(b=1, s=2048, heads=16, e=1024)
MLP_T, MLP_H = 8192, 1024
JAX_SIZES = dict(TRI=TRI, TF=TF)
# (bench_jax program key for n layers, mesh shape) per family; None: one triangle update.
JAX_PROGRAMS = {
    None: (lambda n: ("triangle", "outgoing", 0), (1, 2, 2)),
    "transformer TP": (lambda n: ("transformer", 0, n), (4,)),
    "transformer SP": (lambda n: ("transformer", 1, n), (4,)),
    "MLP SP": (lambda n: ("mlp", 1, MLP_T, MLP_H, n), (4,)),
    "triangle": (lambda n: ("triangle", "outgoing", 0, n), (1, 2, 2)),
}


def mesh_of(shape):
    n = 1
    for s in shape:
        n *= s
    return nvfuser.multidevice.DeviceMesh(torch.arange(n).reshape(shape))


# -- generators ----------------------------------------------------------------------------------


def triangle_single():
    b, n, c = TRI["b"], TRI["n"], TRI["c"]
    with FusionDefinition() as fd:
        inputs, _ = models.triangle_update(fd, Direction.OUTGOING, c, DataType.Float)
        models.annotate_triangle(inputs, mesh_of((1, 2, 2)), 1, 2)
    shapes = models.triangle_shapes(b, n, c)
    return fd, shapes


def _split(tv, axis, d):
    tv.outer_split(axis, d)
    tv.axis(axis).parallelize(P.mesh_x)


def transformer_stack(layers: int, sequence_parallel: bool, b=TF["b"], s=TF["s"], heads=TF["heads"], e=TF["e"],
                      d=4):
    """`layers` GPT blocks as upstream's test_transformer_forward defines one,
    the output of each feeding the next."""
    bf16 = DataType.BFloat16
    shape = [b, s, e]
    mesh = mesh_of((d,))
    with FusionDefinition() as fd:
        inp = fd.define_tensor(shape=[b, s, e], contiguity=True, dtype=bf16)
        inp.set_device_mesh(mesh)
        if sequence_parallel:
            _split(inp, 1, d)
        shapes = [[b, s, e]]
        x = inp
        for _ in range(layers):
            w = {}
            for name, wshape in (("ln0_w", [e]), ("ln0_b", [e]), ("qkv_w", [3 * e, e]), ("qkv_b", [3 * e]),
                                 ("proj_w", [e, e]), ("proj_b", [e]), ("ln1_w", [e]), ("ln1_b", [e]),
                                 ("up_w", [4 * e, e]), ("up_b", [4 * e]), ("down_w", [e, 4 * e]), ("down_b", [e])):
                w[name] = fd.define_tensor(shape=wshape, contiguity=True, dtype=bf16)
                w[name].set_device_mesh(mesh)
                shapes.append(wshape)
            for name in ("qkv_w", "qkv_b", "up_w", "up_b"):
                _split(w[name], 0, d)
            for name in ("proj_w", "down_w"):
                w[name].outer_split(-1, d)
                w[name].axis(-2).parallelize(P.mesh_x)
            xf = fd.ops.cast(x, dtype=DataType.Float)
            ln0, _, _ = models._ln(fd, xf, w["ln0_w"], w["ln0_b"], shape)
            qkv = fd.ops.linear(ln0, w["qkv_w"], w["qkv_b"])
            qkv_h = fd.ops.reshape(qkv, new_shape=[b, s, heads, 3 * e // heads])
            q = fd.ops.slice(qkv_h, start_indices=[0, 0, 0, 0], end_indices=[b, s, heads, e // heads])
            k = fd.ops.slice(qkv_h, start_indices=[0, 0, 0, e // heads], end_indices=[b, s, heads, 2 * e // heads])
            v = fd.ops.slice(qkv_h, start_indices=[0, 0, 0, 2 * e // heads], end_indices=[b, s, heads, 3 * e // heads])
            q, k, v = (fd.ops.permute(t, dims=[0, 2, 1, 3]) for t in (q, k, v))
            o, _, _, _ = fd.ops.sdpfa_fwd(q, k, v, dropout_p=fd.define_scalar(0.1, dtype=DataType.Double),
                                          is_causal=fd.define_scalar(True, dtype=DataType.Bool), scale=None)
            attn = fd.ops.reshape(fd.ops.permute(o, dims=[0, 2, 1, 3]), new_shape=[b, s, e])
            proj = fd.ops.linear(attn, w["proj_w"], w["proj_b"])
            dropped, _ = models._dropout(fd, proj, shape, 0.1)
            resid = fd.ops.add(xf, dropped)
            ln1, _, _ = models._ln(fd, resid, w["ln1_w"], w["ln1_b"], shape)
            up = fd.ops.linear(ln1, w["up_w"], w["up_b"])
            g = fd.ops.cast(models.gelu_tanh(fd, up), bf16)
            down = fd.ops.linear(g, w["down_w"], w["down_b"])
            dropped2, _ = models._dropout(fd, down, shape, 0.1)
            x = fd.ops.cast(fd.ops.add(resid, dropped2), bf16)
        fd.add_output(x)
    return fd, shapes


def mlp_stack(layers: int, t=MLP_T, h=MLP_H, d=4):
    """Residual SP MLP blocks: x = x + down(gelu(up(x)))."""
    mesh = mesh_of((d,))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([t, h], dtype=DataType.Float, contiguity=True)
        inp.set_device_mesh(mesh)
        _split(inp, 0, d)
        shapes = [[t, h]]
        x = inp
        for _ in range(layers):
            up_w = fd.define_tensor([4 * h, h], dtype=DataType.Float, contiguity=True)
            down_w = fd.define_tensor([h, 4 * h], dtype=DataType.Float, contiguity=True)
            for tv in (up_w, down_w):
                tv.set_device_mesh(mesh)
            _split(up_w, 0, d)
            _split(down_w, 1, d)
            shapes += [[4 * h, h], [h, 4 * h]]
            y = models.gelu_tanh(fd, fd.ops.linear(x, up_w))
            x = fd.ops.add(fd.ops.linear(y, down_w), x)
        fd.add_output(x)
    return fd, shapes


def triangle_stack(layers: int, b=TRI["b"], n=TRI["n"], c=TRI["c"]):
    """Outgoing triangle-update blocks, each block's output the next one's z."""
    mesh = mesh_of((1, 2, 2))
    with FusionDefinition() as fd:
        z_in = fd.define_tensor(shape=[-1, -1, -1, c], dtype=DataType.Float, contiguity=True)
        mask_tv = fd.define_tensor(shape=[-1, -1, -1], dtype=DataType.Bool, contiguity=True)
        models.annotate_triangle(dict(z_in=z_in, mask=mask_tv), mesh, 1, 2)
        shapes = [[b, n, n, c], [b, n, n]]
        batch_size = fd.ops.size(z_in, 0)
        n_tokens = fd.ops.size(z_in, 1)
        mask = fd.ops.broadcast_in_dim(mask_tv, shape=[batch_size, n_tokens, n_tokens, c], broadcast_dims=[0, 1, 2])
        z = z_in
        for _ in range(layers):
            ws = {}
            for name, wshape in (("w_norm_in", [c]), ("b_norm_in", [c]), ("w_p_in", [2 * c, c]),
                                 ("w_g_in", [2 * c, c]), ("w_norm_out", [c]), ("b_norm_out", [c]),
                                 ("w_p_out", [c, c]), ("w_g_out", [c, c])):
                ws[name] = fd.define_tensor(shape=wshape, dtype=DataType.Float, contiguity=True)
                ws[name].set_device_mesh(mesh)
                shapes.append(wshape)
            zi = models.layer_norm(fd, z, ws["w_norm_in"], ws["b_norm_in"])
            zz = models.gating(fd, zi, ws["w_p_in"], zi, ws["w_g_in"])
            zz = fd.ops.where(mask, zz, 0.0)
            a = fd.ops.slice(zz, [0, 0, 0, 0], [batch_size, n_tokens, n_tokens, c])
            bb = fd.ops.slice(zz, [0, 0, 0, c], [batch_size, n_tokens, n_tokens, c * 2])
            a = fd.ops.permute(a, [0, 3, 1, 2])
            bb = fd.ops.permute(bb, [0, 3, 2, 1])
            m = fd.ops.permute(fd.ops.matmul(a, bb), [0, 2, 3, 1])
            m = models.layer_norm(fd, m, ws["w_norm_out"], ws["b_norm_out"])
            z = fd.ops.add(z, models.gating(fd, m, ws["w_p_out"], zi, ws["w_g_out"]))
        fd.add_output(z)
    return fd, shapes


FAMILIES = {
    "transformer TP": lambda n: transformer_stack(n, False),
    "transformer SP": lambda n: transformer_stack(n, True),
    "MLP SP": mlp_stack,
    "triangle": triangle_stack,
}


def layers_for(family: str, target_exprs: int) -> int:
    per = len(FAMILIES[family](1)[0].fusion.exprs)
    two = len(FAMILIES[family](2)[0].fusion.exprs)
    step = two - per
    return max(1, round((target_exprs - (per - step)) / step))


# -- timing ------------------------------------------------------------------------------------------


def time_build(fusion, shapes, mode: str, repeats: int, clock=time.process_time) -> float:
    times = []
    for _ in range(repeats):
        t0 = clock()
        plan = build_plan(fusion, shapes, None, mode)
        times.append(clock() - t0)
        del plan  # (after the clock: a caller keeps its plan; freeing it is not planning)
    return min(times)


def time_passes(fusion, shapes, repeats: int, clock=time.process_time) -> tuple:
    """Minimum seconds (CPU unless `clock` says otherwise) of (propagation,
    decomposition) in the default pipeline."""
    prop, dec = [], []
    for _ in range(repeats):
        sizes = _sizes(fusion, shapes, None)
        program = Program(fusion, sizes)
        cost = CostModel(program, sizes)
        gc.disable()  # as build_plan runs the passes
        # The passes are kept until the clock has stopped: build_plan keeps
        # the propagation's log with its plan, and freeing it is not planning.
        propagate, decompose = PropagateShardingsPass(cost, "default"), DecomposeReshardingsPass(cost.numel)
        t0 = clock()
        propagate.run(program)
        t1 = clock()
        decompose.run(program)
        t2 = clock()
        del propagate, decompose
        gc.enable()
        prop.append(t1 - t0)
        dec.append(t2 - t1)
    return min(prop), min(dec)


def repeats_for(n_exprs: int) -> int:
    return 15 if n_exprs <= 200 else 5 if n_exprs <= 2000 else 3


def jax_repeats_for(n_exprs: int) -> int:
    return 5 if n_exprs <= 2000 else 3  # whole XLA compiles: seconds each at 10,000 exprs


def profile(fusion, shapes, top: int = 25) -> str:
    pr = cProfile.Profile()
    pr.enable()
    build_plan(fusion, shapes, None, "default")
    pr.disable()
    out = io.StringIO()
    stats = pstats.Stats(pr, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


_PLAN_REPEATS = {"triangle update": (1, 21)}  # else (1, 4): the pairs of k --instructions runs


def count_instructions(family: str, layers: int) -> float:
    """Instructions of one build_plan of the program (see --instructions)."""
    counts = _per_plan(["--tool=callgrind", "--callgrind-out-file=/dev/null"], family, layers,
                       lambda err: {"instructions": re.search(r"Collected : (\d+)", err)})
    return counts["instructions"]


# cachegrind's summary lines, by what --cache reports
_CACHE_EVENTS = {"instructions": "I   refs", "I1 misses": "I1  misses", "data refs": "D   refs",
                 "D1 misses": "D1  misses"}


def count_cache(family: str, layers: int) -> dict:
    """Per build_plan of the program: instructions, data references and
    first-level cache misses, as cachegrind simulates them (see --cache)."""
    return _per_plan(["--tool=cachegrind", "--cache-sim=yes", "--cachegrind-out-file=/dev/null"], family, layers,
                     lambda err: {name: re.search(r"== " + re.escape(line) + r":\s+([\d,]+)", err)
                                  for name, line in _CACHE_EVENTS.items()})


def _per_plan(tool: list, family: str, layers: int, parse) -> dict:
    """{event: count per plan}: valgrind `tool` runs the process that plans the
    program 1 + k times for two values of k, side by side; parse(stderr)
    gives each event's regex match (group 1: the count)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions and --cache need valgrind (apt install valgrind)")
    low, high = _PLAN_REPEATS.get(family, (1, 4))
    # One BLAS thread: torch's pool, woken by a tensor op while a program is
    # built, spins for a while, and valgrind counts its instructions with the
    # plan's (the transformer stacks' counts moved by 4M from run to run).
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    procs = [subprocess.Popen([valgrind, *tool, sys.executable,
                               os.path.abspath(__file__), "--plans", family, str(layers), str(k)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
             for k in (low, high)]  # the two counts run side by side
    runs = []
    for proc in procs:
        _, err = proc.communicate()
        found = parse(err)
        if proc.returncode != 0 or any(m is None for m in found.values()):
            raise SystemExit(f"valgrind run failed ({family} x{layers}):\n{err[-2000:]}")
        runs.append({name: int(m.group(1).replace(",", "")) for name, m in found.items()})
    return {name: (runs[1][name] - runs[0][name]) / (high - low) for name in runs[0]}


def _program(family: str, layers: int):
    return triangle_single() if family == "triangle update" else FAMILIES[family](layers)


def _plan_repeatedly(family: str, layers: int, repeats: int) -> None:
    """The process --instructions counts: one plan to warm up, then `repeats`."""
    fd, shapes = _program(family, layers)
    for _ in range(1 + repeats):
        build_plan(fd.fusion, shapes, None, "default")


def instructions(target_exprs: int, families: list) -> int:
    print(f"engine: {native.engine_kind()}; instructions per build_plan (callgrind, PYTHONHASHSEED=0)")
    print("| program | exprs | instructions per plan |\n|---|---|---|")
    for family, layers in [("triangle update", 1)] + [(f, layers_for(f, target_exprs)) for f in families]:
        exprs = len(_program(family, layers)[0].fusion.exprs)
        name = family if family == "triangle update" else f"{family} x{layers}"
        print(f"| {name} | {exprs} | {count_instructions(family, layers) / 1e6:.1f}M |", flush=True)
    return 0


def cache(sizes: list, families: list) -> int:
    """--cache: per plan at each size, the instructions and how the data and
    instruction caches take them. Equal rates at two sizes with a higher time
    per instruction at the larger one say that its misses go further out."""
    print(f"engine: {native.engine_kind()}; per build_plan (cachegrind's simulated caches, PYTHONHASHSEED=0)")
    print("| program | exprs | instructions | data refs / instruction | D1 misses | D1 misses / instruction "
          "| I1 misses / instruction |\n|---|---|---|---|---|---|---|")
    for family in families:
        for target in sizes:
            layers = layers_for(family, target)
            exprs = len(_program(family, layers)[0].fusion.exprs)
            c = count_cache(family, layers)
            ir = c["instructions"]
            print(f"| {family} x{layers} | {exprs} | {ir / 1e6:.1f}M | {c['data refs'] / ir:.3f} | "
                  f"{c['D1 misses'] / 1e6:.2f}M | {100 * c['D1 misses'] / ir:.2f}% | "
                  f"{100 * c['I1 misses'] / ir:.2f}% |", flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-exprs", type=int, default=10000)
    parser.add_argument("--json", default=os.path.join("bench-results", "propagation.json"))
    parser.add_argument("--profile", type=int, default=0, help="cProfile build_plan on a transformer stack of ~N exprs")
    parser.add_argument("--profile-family", default="transformer TP", choices=list(FAMILIES))
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--budget", type=float, default=240.0,
                        help="seconds; larger programs are skipped once a family's next size would exceed it")
    parser.add_argument("--quick", action="store_true", help="programs up to ~100 exprs, no JSON (a smoke run)")
    parser.add_argument("--no-jax", action="store_true", help="leave out the GSPMD and Shardy timings")
    parser.add_argument("--jax-row-budget", type=float, default=60.0,
                        help="seconds; a program's JAX timing is skipped when estimated to take longer")
    parser.add_argument("--instructions", type=int, default=0, metavar="N",
                        help="instructions per plan (valgrind's callgrind) of the triangle update and of each "
                             "family at ~N exprs, instead of times")
    parser.add_argument("--cache", default="", metavar="N,M",
                        help="per plan at ~N and ~M exprs (one size or more, comma-separated) of each of "
                             "--families (default MLP SP): instructions, data references and L1 misses "
                             "(valgrind's cachegrind), instead of times")
    parser.add_argument("--plans", nargs=3, metavar=("FAMILY", "LAYERS", "REPEATS"),
                        help="plan a program 1 + REPEATS times and exit (the process --instructions counts)")
    parser.add_argument("--paired", nargs=3, metavar=("FAMILY", "LAYERS", "ROUNDS"),
                        help="nvshard against GSPMD on one program, back to back, ROUNDS times (needs jax)")
    args = parser.parse_args(argv)
    if args.paired:
        return paired(args.paired[0], int(args.paired[1]), int(args.paired[2]))
    if args.plans:
        _plan_repeatedly(args.plans[0], int(args.plans[1]), int(args.plans[2]))
        return 0
    if args.instructions:
        return instructions(args.instructions, [f.strip() for f in args.families.split(",") if f.strip()])
    if args.cache:
        families = args.families if args.families != parser.get_default("families") else "MLP SP"
        return cache([int(n) for n in args.cache.split(",")], [f.strip() for f in families.split(",") if f.strip()])
    if args.quick:
        args.max_exprs = 100
        if args.json == parser.get_default("json"):
            args.json = ""

    if args.profile:
        fam = args.profile_family
        n = layers_for(fam, args.profile)
        fd, shapes = FAMILIES[fam](n)
        print(f"cProfile: build_plan, {fam} x{n} ({len(fd.fusion.exprs)} exprs)")
        print(profile(fd.fusion, shapes))
        return 0

    engine = native.engine_kind()
    print(f"engine: {engine} (nvshard/native.py; NVSHARD_PURE_PYTHON=1 times the Python source)", file=sys.stderr)
    rows, jax_programs = [], []  # jax_programs: (row, family, layers)
    start = time.perf_counter()
    rows.append(_measure("triangle update (1 block, 1x2x2)", triangle_single)[0])
    jax_programs.append((rows[-1], None, 1))
    targets = [t for t in (100, 300, 1000, 3000, 10000) if t <= args.max_exprs]
    for family in [f.strip() for f in args.families.split(",") if f.strip()]:
        last = None
        for target in tqdm(targets, desc=family, unit="size", disable=None):  # quiet unless on a terminal
            n = layers_for(family, target)
            if last is not None:  # extrapolate: skip what would blow the budget
                est = last[1] * target / last[0] * 2.5
                if time.perf_counter() - start + est > args.budget:
                    print(f"  skipping {family} x{n}: ~{est:.0f} s", file=sys.stderr)
                    continue
            t0 = time.perf_counter()
            row, fd = _measure(f"{family} x{n}", functools.partial(FAMILIES[family], n))
            rows.append(row)
            last = (len(fd.fusion.exprs), time.perf_counter() - t0)
            jax_programs.append((rows[-1], family, n))
    # JAX after every nvshard row: its compiles (several threads) neither
    # share the CPU with nvshard's timings nor count against --budget.
    jax_errors = 0 if args.no_jax else time_jax(jax_programs, args)
    elapsed = time.perf_counter() - start
    print(f"\nengine: {engine}")
    print(render(rows))
    print()
    print(verdict(rows))
    print(f"\n({elapsed:.0f} s)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, seconds=elapsed, engine=engine), f, indent=1)
        print(f"wrote {args.json}")
    return 1 if args.quick and jax_errors else 0


def paired(family: str, layers: int, rounds: int) -> int:
    """--paired: rounds that time one program in nvshard and in GSPMD back to
    back, the order swapped every round, so that the machine's speed, which
    drifts over minutes here, is nearly the same for both sides of each
    ratio. nvshard's times are wall clock here (GSPMD's timers have no
    other), each side the minimum of as many repeats as the table's rows
    take (plans; compiles). Prints each round's ratios and their medians."""
    if not bench_jax.available("passes"):
        print("--paired needs jax (pip install -e .[bench])", file=sys.stderr)
        return 1
    fd, shapes = _program(family, layers)
    exprs = len(fd.fusion.exprs)
    build_plan(fd.fusion, shapes, None, "default")  # (what repeated plans reuse, as in the table's rows)
    key, mesh = JAX_PROGRAMS[None if family == "triangle update" else family]
    reps, jax_reps = repeats_for(exprs), jax_repeats_for(exprs)
    print(f"{family} x{layers} ({exprs} exprs), {rounds} rounds; ms, wall clock; ratio: nvshard / GSPMD")
    print("| round | order | propagation | GSPMD propagation | ratio | full plan | GSPMD prop+partition | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    prop_ratios, full_ratios, sides = [], [], []
    for r in range(rounds):
        jax_first = r % 2 == 1
        reply = bench_jax.time_passes(key(layers), mesh, JAX_SIZES, jax_reps) if jax_first else None
        prop = time_passes(fd.fusion, shapes, reps, time.perf_counter)[0]
        full = time_build(fd.fusion, shapes, "default", reps, time.perf_counter)
        if not jax_first:
            reply = bench_jax.time_passes(key(layers), mesh, JAX_SIZES, jax_reps)
        g = reply.get("gspmd", reply)
        if "error" in g:
            print(f"JAX timing failed: {g['error']}", file=sys.stderr)
            return 1
        prop_ratios.append(prop / g["propagation_s"])
        full_ratios.append(full / g["prop_partition_s"])
        sides.append((prop, g["propagation_s"], full, g["prop_partition_s"]))
        print(f"| {r + 1} | {'GSPMD first' if jax_first else 'nvshard first'} | {prop * 1e3:.1f} | "
              f"{g['propagation_s'] * 1e3:.1f} | {prop_ratios[-1]:.2f} | {full * 1e3:.1f} | "
              f"{g['prop_partition_s'] * 1e3:.1f} | {full_ratios[-1]:.2f} |", flush=True)
    bench_jax.close()
    least = [min(side) for side in zip(*sides)]  # each side's least disturbed round
    print(f"median of the rounds' ratios: propagation {_median(prop_ratios):.2f}, full plan "
          f"{_median(full_ratios):.2f}; least disturbed rounds: propagation {least[0] * 1e3:.1f} vs "
          f"{least[1] * 1e3:.1f} ms ({least[0] / least[1]:.2f}), full plan {least[2] * 1e3:.1f} vs "
          f"{least[3] * 1e3:.1f} ms ({least[2] / least[3]:.2f})")
    return 0


def _median(values: list) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def time_jax(programs, args) -> int:
    """Adds each row's GSPMD and Shardy timings ("jax"); returns the number that failed."""
    if not bench_jax.available("passes"):
        print("jax not installed: no GSPMD/Shardy timings in this run", file=sys.stderr)
        return 0
    errors = 0
    last = {}  # family -> (exprs, seconds) of its previous JAX timing
    for row, family, n in programs:
        if family in last:
            est = last[family][1] * (row["exprs"] / last[family][0]) ** 1.5  # XLA's compiles grow faster
            if est > args.jax_row_budget:
                print(f"  no JAX timing for {row['program']}: ~{est:.0f} s", file=sys.stderr)
                row["jax"] = dict(skipped=f"~{est:.0f} s estimated")
                continue
        key, mesh = JAX_PROGRAMS[family]
        t0 = time.perf_counter()
        reply = bench_jax.time_passes(key(n), mesh, JAX_SIZES, 1 if args.quick else jax_repeats_for(row["exprs"]))
        last[family] = (row["exprs"], time.perf_counter() - t0)
        row["jax"] = reply
        failed = [e["error"] for e in (reply, reply.get("gspmd", {}), reply.get("shardy", {})) if "error" in e]
        if failed:
            errors += 1
            print(f"  {row['program']}: JAX timing failed: {failed[0]}", file=sys.stderr, flush=True)
            continue
        g, sh = reply["gspmd"], reply["shardy"]
        print(f"  {row['program']}: GSPMD propagation {g['propagation_s'] * 1e3:.1f} ms, + partitioning "
              f"{g['prop_partition_s'] * 1e3:.1f} ms (compile {g['compile_s']:.1f} s); Shardy propagation "
              f"{sh['propagation_s'] * 1e3:.1f} ms (XLA's Shardy pass {sh['xla_pass_s'] * 1e3:.1f} ms); "
              f"{last[family][1]:.0f} s", file=sys.stderr, flush=True)
    bench_jax.close()
    return errors


def time_first_plan(define, repeats: int) -> float:
    """Minimum CPU seconds of the first build_plan of a freshly defined fusion
    (define() -> (fd, shapes)): nothing kept with its rules yet."""
    times = []
    for _ in range(repeats):
        fd, shapes = define()
        gc.collect()  # (the previous copy's garbage, not this plan's)
        t0 = time.process_time()
        build_plan(fd.fusion, shapes, None, "default")
        times.append(time.process_time() - t0)
    return min(times)


def _measure(name, define) -> tuple:
    """(row, the program's fd): define() -> (fd, shapes), a fresh copy per call."""
    fd, shapes = define()
    n = len(fd.fusion.exprs)
    reps = repeats_for(n)
    default = time_build(fd.fusion, shapes, "default", reps)
    prop, dec = time_passes(fd.fusion, shapes, reps)
    legacy = time_build(fd.fusion, shapes, "legacy", reps)
    first = time_first_plan(define, min(reps, 3))
    row = dict(program=name, exprs=n, tensors=len(fd.fusion.tvs()), repeats=reps, build_plan_s=default,
               propagate_s=prop, decompose_s=dec, legacy_build_plan_s=legacy, first_plan_s=first,
               us_per_expr=default / n * 1e6)
    print(f"  {name}: {n} exprs, build_plan {default * 1e3:.1f} ms (propagate {prop * 1e3:.1f}, "
          f"decompose {dec * 1e3:.1f}; first plan {first * 1e3:.1f}), legacy {legacy * 1e3:.1f} ms",
          file=sys.stderr, flush=True)
    return row, fd


def measured(row):
    """(GSPMD propagation, GSPMD prop + partitioning, Shardy propagation) in ms
    from this run, or None."""
    j = row.get("jax", {})
    g, sh = j.get("gspmd", {}), j.get("shardy", {})
    if "propagation_s" not in g or "prop_partition_s" not in g or "propagation_s" not in sh:
        return None
    return g["propagation_s"] * 1e3, g["prop_partition_s"] * 1e3, sh["propagation_s"] * 1e3


def render(rows) -> str:
    head = ("| program | exprs | build_plan default (ms) | propagate (ms) | decompose (ms) | µs / expr | "
            "first plan (ms) | build_plan legacy (ms) |")
    jax_cols = any("jax" in r for r in rows)
    if jax_cols:
        head += " GSPMD prop (ms) | GSPMD prop+part (ms) | Shardy prop (ms) |"
    lines = [head, "|---" * head.count(" | ") + "|---|"]
    for r in rows:
        line = (f"| {r['program']} | {r['exprs']} | {r['build_plan_s'] * 1e3:.1f} | {r['propagate_s'] * 1e3:.1f} | "
                f"{r['decompose_s'] * 1e3:.1f} | {r['us_per_expr']:.0f} | {r['first_plan_s'] * 1e3:.1f} | "
                f"{r['legacy_build_plan_s'] * 1e3:.1f} |")
        if jax_cols:
            m = measured(r)
            line += " %.1f | %.1f | %.1f |" % m if m else " - | - | - |"
        lines.append(line)
    return "\n".join(lines)


def verdict(rows) -> str:
    big = [r for r in rows[1:] if r["exprs"] >= 9000]
    jax_rows = [r for r in [rows[0]] + big if measured(r)]

    def line(name, r, family, fmt):
        m = measured(r)
        ref = GSPMD_REFERENCE_MS.get(family)
        prop, full = (m[0], m[1]) if m else ref if ref else (None, None)
        head = f"  {name}: propagation {r['propagate_s'] * 1e3:{fmt}} ms"
        plan = f"full plan {r['build_plan_s'] * 1e3:{fmt}} ms (first plan {r['first_plan_s'] * 1e3:{fmt}} ms)"
        if prop is None:
            skipped = r.get("jax", {}).get("skipped")
            why = f": JAX timing skipped, {skipped} > --jax-row-budget" if skipped else ""
            return f"{head}; {plan} (no GSPMD figure{why})"
        mark = " [reference]" if jax_rows and not m else ""
        shardy = f" (Shardy {m[2]:{fmt}} ms)" if m else ""
        met = ["met" if ours * 1e3 <= theirs else "missed"
               for ours, theirs in ((r["propagate_s"], prop), (r["build_plan_s"], full))]
        return (f"{head} vs GSPMD {prop:{fmt}} ms{shardy}{mark} -> {met[0]}; "
                f"{plan} vs GSPMD prop+partition {full:{fmt}} ms{mark} -> {met[1]}")

    if jax_rows:
        version = jax_rows[0]["jax"].get("jax", "?")
        out = [f"Targets (GSPMD and Shardy measured in this run, JAX {version}; "
               "[reference]: GSPMD_REFERENCE_MS, not measured in this run):"]
    else:
        out = ["Targets (GSPMD figures: GSPMD_REFERENCE_MS, JAX 0.10.2 on this machine earlier, "
               "not measured in this run):"]
    out.append(line("triangle update", rows[0], "triangle update", ".1f"))
    for r in big:
        out.append(line(f"{r['program']} ({r['exprs']} exprs)", r, r["program"].rsplit(" x", 1)[0], ".0f"))
    if not big:
        out.append("  10,000 exprs: not measured (budget)")
    families = {}
    for r in rows[1:]:
        families.setdefault(r["program"].rsplit(" x", 1)[0], []).append(r)
    for fam, rs in families.items():
        rs = [r for r in rs if r["exprs"] >= 90]
        if len(rs) >= 2:
            ratio = rs[-1]["us_per_expr"] / rs[0]["us_per_expr"]
            out.append(f"  {fam}: µs/expr {rs[0]['us_per_expr']:.0f} at {rs[0]['exprs']} -> "
                       f"{rs[-1]['us_per_expr']:.0f} at {rs[-1]['exprs']} exprs (x{ratio:.1f}) -> "
                       f"{'within 2x' if ratio <= 2 else 'NOT within 2x'}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
