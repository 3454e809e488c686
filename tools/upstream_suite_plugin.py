"""pytest plugin for tools/run_upstream_suite.py (loaded with -p).

* What needs CUDA for real skips, with a reason that says so: tests marked
  `benchmark` (upstream's GPU benchmarks: GPU-sized, timed around
  cudaProfilerStart/Stop), any use of CUDA streams or the CUDA runtime,
  and nvshard's CudaRequiredError (symmetric memory, the CUDA
  communicator backend).
* Each rank appends one JSON line per test outcome to
  $NVSHARD_UPSTREAM_RESULTS/rank<R>.jsonl as it goes, so a job that times
  out still reports what ran.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

_RESULTS = os.environ.get("NVSHARD_UPSTREAM_RESULTS")
_RANK = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))


def _needs_cuda(what: str):
    def refuse(*args, **kwargs):
        pytest.skip(f"needs CUDA: {what}")

    return refuse


class _NoProfilerRuntime:
    def cudaProfilerStart(self):
        return 0

    def cudaProfilerStop(self):
        return 0


def pytest_configure(config):
    config.addinivalue_line("markers", "benchmark: upstream's GPU benchmarks")
    if not torch.cuda.is_available():
        torch.cuda.Stream = _needs_cuda("CUDA streams (torch.cuda.Stream)")
        torch.cuda.stream = _needs_cuda("CUDA streams (torch.cuda.stream)")
        torch.cuda.current_stream = _needs_cuda("CUDA streams (torch.cuda.current_stream)")
        # CPU kernels are synchronous and there is no nsys capture range to
        # open: upstream's benchmark helpers run as they are.
        torch.cuda.synchronize = lambda *args, **kwargs: None
        torch.cuda.cudart = lambda: _NoProfilerRuntime()
        torch.cuda.get_device_capability = _needs_cuda("a GPU's compute capability")


def pytest_runtest_setup(item):
    if item.get_closest_marker("benchmark") is not None and not torch.cuda.is_available():
        pytest.skip("needs CUDA: GPU benchmark (GPU-sized, timed with cudaProfilerStart/Stop and cuda.synchronize)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None:
        return
    from nvshard import CudaRequiredError

    if isinstance(call.excinfo.value, CudaRequiredError):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {call.excinfo.value}")


def _detail(report) -> str:
    if report.skipped:
        if isinstance(report.longrepr, tuple):
            return report.longrepr[2].removeprefix("Skipped: ")
        return str(report.longrepr)
    if report.failed:
        text = report.longreprtext or ""
        errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
        first = errors[0] if errors else (text.strip().splitlines() or [""])[-1]
        return first[:300]
    return ""


def _record(nodeid: str, outcome: str, detail: str, seconds: float = 0.0) -> None:
    if not _RESULTS:
        return
    with open(os.path.join(_RESULTS, f"rank{_RANK}.jsonl"), "a") as f:
        f.write(json.dumps({"nodeid": nodeid, "outcome": outcome, "detail": detail, "seconds": seconds}) + "\n")


def pytest_runtest_logreport(report):
    if report.when == "call" or report.failed or (report.when == "setup" and report.skipped):
        outcome = "failed" if report.failed else report.outcome
        if report.when == "teardown" and report.failed:
            outcome = "failed"
        _record(report.nodeid, outcome, _detail(report), report.duration)


def pytest_collectreport(report):
    if report.failed:
        _record(report.nodeid, "failed", "collection: " + _detail(report))
    elif report.skipped:  # a module that skips as a whole
        _record(report.nodeid, "skipped", _detail(report))
