"""The `nvshard` command on the example its --help prints: the console
script run as a user would, in a subprocess (--help), and every command
through the function it calls, `nvshard.cli.main(argv)`, in this process
(each subprocess spends seconds starting Python and importing torch)."""

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys

import pytest

from nvshard import cli

SCRIPT = os.path.join(os.path.dirname(sys.executable), "nvshard")


def run(*args):
    """`nvshard ARGS` as the console script does it, in this process: its
    exit status and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as e:  # argparse: --help, or a usage error
            code = e.code
    return subprocess.CompletedProcess(["nvshard", *args], code or 0, out.getvalue(), err.getvalue())


def run_script_together(*commands) -> list:
    """Runs the console script with independent arguments side by side, each
    in a subprocess; their results in order."""
    assert os.path.exists(SCRIPT), "the console script is missing: pip install -e . (./tools/nvshard setup)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_") and k not in ("RANK", "WORLD_SIZE")}
    procs = [subprocess.Popen([SCRIPT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for args in commands]
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example file from `nvshard --help`, written out as the help says."""
    help_text = run("--help").stdout
    body = help_text.split("example file, mlp.py:\n\n", 1)[1].split("\nthen:", 1)[0]
    path = tmp_path_factory.mktemp("cli") / "mlp.py"
    path.write_text("\n".join(line[4:] for line in body.splitlines()) + "\n")
    return path


def test_help_shows_the_commands_and_an_example():
    result, sub = run_script_together(["--help"], ["bench", "--help"])
    assert result.returncode == 0
    assert "{explain,render,bench}" in result.stdout
    assert "with FusionDefinition() as fd:" in result.stdout and "input_shapes = [[8192, 1024], [4096, 1024]]" \
        in result.stdout
    assert sub.returncode == 0 and "example file, mlp.py:" in sub.stdout and "--execute" in sub.stdout


def test_explain(example):
    result, by_tensor = run("explain", str(example), "--show", "T2"), run("explain", str(example), "--tensor", "T3")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "## program after the pre-segmenter" in out and "%kernel_math {" in out
    # t = 8192 > 4h = 4096: gathering the weight (12 MiB) beats gathering the tokens (24 MiB)
    assert "conflict at T2 (2 candidates):" in out
    assert "winner: candidate A because fewer bytes (12.00 MiB: allgather T1 over DIDx 12.00 MiB vs 24.00 MiB" in out
    assert "allgather T1 over DIDx, groups {0 1 2 3}: 12.00 MiB received per device" in out
    assert "T2 float[8192, 4096] on DeviceMesh{0 1 2 3} (axis 0: DIDx, axis 1: replicated)" in out
    assert re.search(r"│\s+2048:4096 │\s+1\s+│", out)
    only = by_tensor.stdout.split("## decisions", 1)[1]
    assert "T3 axis 0 <- DIDx: forward through relu" in only and "conflict at T2" not in only


def test_render(example, tmp_path):
    png = tmp_path / "mlp.png"
    if shutil.which("dot") is None:
        dot, result = run("render", str(example), "--dot"), None
    else:
        dot, result = run("render", str(example), "--dot"), run("render", str(example), "-o", str(png))
    assert dot.returncode == 0 and dot.stdout.startswith("digraph plan {")
    assert dot.stdout.count("shape=hexagon") == 1 and "12.00 MiB received per device" in dot.stdout
    if result is None:
        pytest.skip("Graphviz's dot is not installed")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote {png}: 5 tensors, 1 communications"
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bench(example):
    result = run("bench", str(example), "--repeat", "2", "--execute")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^plan: median [\d.]+ ms over 2 runs \(min [\d.]+ ms\), 2 exprs, 1 communications$",
                     result.stdout, re.M)
    assert "bytes received per device (plan): 12.00 MiB" in result.stdout
    assert re.search(r"simulated 4 ranks in [\d.]+ s; bytes received per device \(measured\): 12.00 MiB",
                     result.stdout)
    assert "planning" not in result.stderr  # no progress bar when not on a terminal


def test_errors(example, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(example.read_text().replace("input_shapes = [[8192, 1024], [4096, 1024]]",
                                               "input_shapes = [[8192, 1024]]"))
    missing, wrong = run("explain", str(tmp_path / "nope.py")), run("render", str(example), "--fusion", "g", "--dot")
    result, unknown = run("bench", str(bad)), run("explain", str(example), "--tensor", "T99")
    assert missing.returncode == 2 and "nvshard explain: error:" in missing.stderr and "no such file" in missing.stderr
    assert wrong.returncode == 2
    assert "defines no FusionDefinition named 'g'; it has fd (use --fusion NAME)" in wrong.stderr
    assert result.returncode == 2 and "input_shapes has 1 entries but the fusion has 2 inputs" in result.stderr
    assert unknown.returncode == 2 and "no TensorView T99 in the plan (it has T0, T1" in unknown.stderr
