"""The `nvshard` console script, run as a user would: in a subprocess, on the
example its --help prints."""

import os
import re
import shutil
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(sys.executable), "nvshard")


def run(*args, cwd=None):
    assert os.path.exists(SCRIPT), "the console script is missing: pip install -e . (./tools/nvshard setup)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_") and k not in ("RANK", "WORLD_SIZE")}
    return subprocess.run([SCRIPT, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example file from `nvshard --help`, written out as the help says."""
    help_text = run("--help").stdout
    body = help_text.split("example file, mlp.py:\n\n", 1)[1].split("\nthen:", 1)[0]
    path = tmp_path_factory.mktemp("cli") / "mlp.py"
    path.write_text("\n".join(line[4:] for line in body.splitlines()) + "\n")
    return path


def test_help_shows_the_commands_and_an_example():
    result = run("--help")
    assert result.returncode == 0
    assert "{explain,render,bench}" in result.stdout
    assert "with FusionDefinition() as fd:" in result.stdout and "input_shapes = [[8192, 1024], [4096, 1024]]" \
        in result.stdout
    sub = run("bench", "--help")
    assert sub.returncode == 0 and "example file, mlp.py:" in sub.stdout and "--execute" in sub.stdout


def test_explain(example):
    result = run("explain", str(example), "--show", "T2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "## program after the pre-segmenter" in out and "%kernel_math {" in out
    # t = 8192 > 4h = 4096: gathering the weight (12 MiB) beats gathering the tokens (24 MiB)
    assert "conflict at T2 (2 candidates):" in out
    assert "winner: candidate A because fewer bytes (12.00 MiB: allgather T1 over DIDx 12.00 MiB vs 24.00 MiB" in out
    assert "allgather T1 over DIDx, groups {0 1 2 3}: 12.00 MiB received per device" in out
    assert "T2 float[8192, 4096] on DeviceMesh{0 1 2 3} (axis 0: DIDx, axis 1: replicated)" in out
    assert re.search(r"│\s+2048:4096 │\s+1\s+│", out)
    only = run("explain", str(example), "--tensor", "T3").stdout.split("## decisions", 1)[1]
    assert "T3 axis 0 <- DIDx: forward through relu" in only and "conflict at T2" not in only


def test_render(example, tmp_path):
    dot = run("render", str(example), "--dot")
    assert dot.returncode == 0 and dot.stdout.startswith("digraph plan {")
    assert dot.stdout.count("shape=hexagon") == 1 and "12.00 MiB received per device" in dot.stdout
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed")
    result = run("render", str(example), "-o", str(tmp_path / "mlp.png"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote {tmp_path / 'mlp.png'}: 5 tensors, 1 communications"
    assert (tmp_path / "mlp.png").read_bytes()[:4] == b"\x89PNG"


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
    missing = run("explain", str(tmp_path / "nope.py"))
    assert missing.returncode == 2 and "nvshard explain: error:" in missing.stderr and "no such file" in missing.stderr
    wrong = run("render", str(example), "--fusion", "g", "--dot")
    assert wrong.returncode == 2
    assert "defines no FusionDefinition named 'g'; it has fd (use --fusion NAME)" in wrong.stderr
    bad = tmp_path / "bad.py"
    bad.write_text(example.read_text().replace("input_shapes = [[8192, 1024], [4096, 1024]]",
                                               "input_shapes = [[8192, 1024]]"))
    result = run("bench", str(bad))
    assert result.returncode == 2 and "input_shapes has 1 entries but the fusion has 2 inputs" in result.stderr
    unknown = run("explain", str(example), "--tensor", "T99")
    assert unknown.returncode == 2 and "no TensorView T99 in the plan (it has T0, T1" in unknown.stderr
