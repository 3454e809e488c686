"""Plan census: the plans the default pipeline builds over many programs, so two
versions of the engine can be compared by the bytes their plans move.

    .venv/bin/python tools/plan_census.py record OUT.json [--examples 3000] [--seed 0] [--jobs 2]
    .venv/bin/python tools/plan_census.py diff BASE.json NEW.json
    .venv/bin/python tools/plan_census.py --quick   # CI's smoke run: compiled and Python engines agree

record plans (nvshard.propagate_shardings(fd, shapes, propagation="default"),
as tests/python/test_properties.py does) for
  * random programs drawn from tests/python/fusion_strategies.py, in the
    proportions of test_properties' three propagation tests (plain 5 :
    symbolic extents 2 : large 1), deterministically: the same --examples
    and --seed give the same programs in any checkout;
  * every row of tools/bench_comm.py (default and, where it has one, the
    designed annotation), and the same models at bench_comm's --quick sizes.
Per program it keeps the bytes per device, the sorted (kind, bytes) of its
communications, a hash of every TensorView's final sharding, or the error's
class, and for random programs their source (to reproduce a regression).

diff prints how many programs are identical, move equal / fewer / more bytes,
whose error changed, the worst regressions and best improvements; exit status 1
when any program moves more bytes or an error changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# this checkout's nvshard first (the venv may hold another checkout in develop mode)
for p in (os.path.join(ROOT, "tests", "python"), HERE, ROOT):
    sys.path.insert(0, p)

from hypothesis import HealthCheck, Phase, configuration, given, seed as hseed, settings  # noqa: E402
from tqdm import tqdm  # noqa: E402

import nvshard  # noqa: E402
from nvshard import native  # noqa: E402
from fusion_strategies import fusions, normalize  # noqa: E402

# test_properties' propagation tests: (name, weight, strategy); weights are its example counts 1000:400:200
VARIANTS = [
    ("plain", 5, lambda: fusions(meshes_max=2)),
    ("symbolic", 2, lambda: fusions(meshes_max=2, symbolic=True, extents=(6, 8, 12, 16))),
    ("large", 1, lambda: fusions(max_ops=14, meshes_max=3, max_rank=4)),
]
PLAN_TIMEOUT_S = 30  # as test_properties: a plan that does not terminate is an error, not a hang


def short_hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


# -- programs ------------------------------------------------------------------------------


def draw_cases(strategy, n: int, seed: str, seen: set) -> list:
    """The first n cases not in `seen` that hypothesis generates for this seed:
    generation only (no shrinking, no database), so the sequence depends on
    nothing else. About one draw in eight repeats a program, hence 2n draws."""
    out: dict = {}

    @settings(max_examples=2 * n + 20, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), print_blob=False)
    @hseed(seed)
    @given(strategy)
    def collect(case):
        key = short_hash(case.source())
        if len(out) < n and key not in seen:
            out[key] = case
            seen.add(key)

    collect()
    return list(out.items())


def random_programs(n: int, seed: int) -> list:
    """[(key, variant, case)], n distinct programs split over VARIANTS by weight."""
    total = sum(w for _, w, _ in VARIANTS)
    counts = [n * w // total for _, w, _ in VARIANTS]
    counts[0] += n - sum(counts)
    out, seen = [], set()
    for (name, _, strategy), count in zip(VARIANTS, counts):
        out += [(key, name, case) for key, case in draw_cases(strategy(), count, f"{seed} {name}", seen)]
    return out


def bench_programs() -> list:
    """[(key, category, fd, shapes)]: bench_comm's rows at its sizes, then its
    models (not its plan-quality rows, which have one size) at --quick sizes."""
    import bench_comm

    out = []
    for c in bench_comm.cases():
        for designed in (False, True) if c.has_designed else (False,):
            fd, shapes, _ = c.build(designed)  # build reads the sizes now: before use_quick_sizes
            out.append((f"bench_comm: {c.name} [{c.mesh_text}]" + (" designed" if designed else ""), "bench_comm",
                        fd, shapes))
    quality = {c.name for c in bench_comm._quality_cases()}
    bench_comm.use_quick_sizes()
    for c in bench_comm.cases():
        if c.name not in quality:
            fd, shapes, _ = c.build(False)
            out.append((f"models small: {c.name} [{c.mesh_text}]", "models", fd, shapes))
    return out


# -- planning ------------------------------------------------------------------------------


def _timeout(signum, frame):
    raise TimeoutError(f"planning took over {PLAN_TIMEOUT_S} s")


def census_entry(fd, shapes) -> dict:
    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(PLAN_TIMEOUT_S)
    try:
        plan = nvshard.propagate_shardings(fd, shapes, propagation="default")
    except Exception as e:  # errors are part of the census: they must match between versions
        return dict(error=type(e).__name__, message=str(e)[:300])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    evaluate = plan.sizes.evaluate_size if plan.sizes is not None else None
    state = plan.program.state
    shardings = []
    # the fusion's own TensorViews in definition order: names of tensors that
    # decomposition inserts may differ between versions, their states show in the communications
    for tv in fd.fusion.tvs():
        s = state.get(tv) or plan.propagated[tv]
        mesh = None if s.mesh is None else (tuple(s.mesh.shape), tuple(s.mesh.vector))
        shardings.append((mesh, tuple(normalize(d, evaluate) if evaluate else repr(d) for d in s.layouts)))
    comms = sorted(([c.kind, c.bytes_received] for c in plan.communications), key=lambda c: (c[0], c[1] or 0.0))
    return dict(bytes=plan.bytes_per_device, comms=comms, sharding=short_hash(repr(shardings)),
                log=short_hash(plan.log.text()))


def _plan_case(item):
    key, variant, case = item
    fd, _ = case.build()
    return key, census_entry(fd, case.input_shapes())


def record(args) -> int:
    configuration.set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "nvshard-hypothesis"))
    print(f"nvshard from {os.path.dirname(nvshard.__file__)}", file=sys.stderr)
    t0 = time.perf_counter()
    programs: dict = {}
    for key, category, fd, shapes in bench_programs():
        programs[key] = dict(category=category, **census_entry(fd, shapes))
    cases = random_programs(args.examples, args.seed)
    print(f"drew {len(cases)} random programs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    variant_of = {key: (variant, case) for key, variant, case in cases}
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for key, entry in tqdm(pool.imap(_plan_case, cases, chunksize=8), total=len(cases), desc="planning"):
            variant, case = variant_of[key]
            programs[key] = dict(category=f"random {variant}", **entry, source=case.source(),
                                 shapes=case.input_shapes())
    elapsed = time.perf_counter() - t0
    meta = dict(examples=args.examples, seed=args.seed, nvshard=os.path.dirname(nvshard.__file__),
                engine=native.engine_kind())
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, programs=programs), f, indent=1, sort_keys=True)
    counts: dict = {}
    for e in programs.values():
        counts[e["category"]] = counts.get(e["category"], 0) + 1
    errors = sum("error" in e for e in programs.values())
    print(f"{len(programs)} programs ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}), "
          f"{errors} errors, {elapsed:.0f} s -> {args.out}", file=sys.stderr)
    return 0


# -- comparing -----------------------------------------------------------------------------


def print_source(entry) -> None:
    """A random program as a reproducer: its source and the shapes it was planned with."""
    if entry.get("source"):
        print(entry["source"] + f"\nplan = nvfuser.propagate_shardings(fd, {entry['shapes']}, propagation=\"default\")")


def diff(args) -> int:
    base, new = (json.load(open(p))["programs"] for p in (args.base, args.new))
    common = sorted(set(base) & set(new))
    same, equal, fewer, more, errs = [], [], [], [], []
    for k in common:
        b, n = base[k], new[k]
        if b.get("error") or n.get("error"):
            if b.get("error") != n.get("error"):
                errs.append((k, b.get("error"), n.get("error")))
            else:
                same.append(k)
            continue
        if b["sharding"] == n["sharding"] and b["comms"] == n["comms"]:
            same.append(k)
            continue
        bb, nb = b["bytes"] or 0.0, n["bytes"] or 0.0
        (equal if nb == bb else fewer if nb < bb else more).append((k, bb, nb))
    only = len(set(base) ^ set(new))
    print(f"{len(common)} programs in both ({only} in one only)")
    print(f"  identical plans:            {len(same)}")
    print(f"  differ, equal bytes:        {len(equal)}")
    print(f"  move fewer bytes:           {len(fewer)}")
    print(f"  move more bytes:            {len(more)}")
    print(f"  errors changed:             {len(errs)}")
    for k, e0, e1 in errs:
        print(f"\nerror changed {k}: {e0} -> {e1}")
        if new[k].get("message"):
            print(f"  new: {new[k]['message']}")
        print_source(base[k])

    def show(rows, title):
        if rows:
            print(f"\n-- {title} --")
        for k, bb, nb in rows:
            print(f"\n{k} [{base[k]['category']}]: {bb:.0f} B -> {nb:.0f} B ({nb - bb:+.0f})")
            print(f"  comms {base[k]['comms']} -> {new[k]['comms']}")
            print_source(base[k])

    show(sorted(more, key=lambda r: (r[1] - r[2], r[0]))[:15], f"worst regressions (15 of {len(more)})")
    show(sorted(fewer, key=lambda r: (r[2] - r[1], r[0]))[:5], f"biggest improvements (5 of {len(fewer)})")
    return 1 if more or errs else 0


def quick() -> int:
    """CI's smoke run: two small censuses, one by the compiled engine and one
    by its Python source (NVSHARD_PURE_PYTHON=1), must be identical, logs
    included (determinism, and the compiled core against its reference)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, f"{i}.json") for i in range(2)]
        for path, pure in zip(paths, ("", "1")):  # a process each: bench_comm's sizes are module state
            env = dict(os.environ, **{native.PURE_PYTHON_ENV: pure})
            subprocess.run([sys.executable, __file__, "record", path, "--examples", "40", "--jobs", "1"], check=True,
                           env=env)
        with open(paths[0]) as a, open(paths[1]) as b:
            first, second = json.load(a), json.load(b)
        print(f"plan census: engine {first['meta']['engine']} vs {second['meta']['engine']}")
        if first["programs"] != second["programs"]:
            print("plan census: the two runs differ")
            return 1
        return diff(argparse.Namespace(base=paths[0], new=paths[1]))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--quick"]:
        return quick()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="plan every program and write OUT.json")
    r.add_argument("out")
    r.add_argument("--examples", type=int, default=3000, help="random programs (default 3000)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="planning processes")
    d = sub.add_parser("diff", help="compare two censuses")
    d.add_argument("base")
    d.add_argument("new")
    args = ap.parse_args(argv)
    return record(args) if args.cmd == "record" else diff(args)


if __name__ == "__main__":
    sys.exit(main())
