"""PythonProfiler: what each `fd.execute` inside the `with` block ran.

    with PythonProfiler() as prof:
        fd.execute(inputs)
    [kp.scheduler for kp in prof.profile.kernel_profiles]   # e.g. ["expr_eval", "communication"]

nvFuser profiles CUDA kernels; nvshard has no kernels, so each executed
expr of the planned program is one "kernel": communications (scheduler
"communication", named by their kind, with the bytes this rank received)
and compute exprs (scheduler "pointwise", "reduction" or "expr_eval", the
scheduler nvFuser would give them, named by the op). Times are host wall
times of this rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

_ACTIVE: list = []  # profilers whose `with` block is open


@dataclass
class KernelProfile:
    name: str
    scheduler: str
    segment_id: int
    device: int
    time_ms: float
    input_bytes: int = 0
    output_bytes: int = 0
    received_bytes: float = 0.0


@dataclass
class FusionProfile:
    fusion_id: int = 0
    kernel_profiles: list = field(default_factory=list)
    host_time_ms: float = 0.0

    @property
    def segments(self) -> int:
        return len(self.kernel_profiles)

    @property
    def kernel_time_ms(self) -> float:
        return sum(k.time_ms for k in self.kernel_profiles)


class PythonProfiler:
    def __init__(self):
        self.profile = FusionProfile()
        self._start: Optional[float] = None

    def __enter__(self) -> "PythonProfiler":
        self.profile = FusionProfile()
        self._start = time.perf_counter()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> bool:
        _ACTIVE.remove(self)
        self.profile.host_time_ms = (time.perf_counter() - self._start) * 1e3
        return False


def active() -> bool:
    return bool(_ACTIVE)


def record(kernel: KernelProfile) -> None:
    for prof in _ACTIVE:
        kernel.segment_id = len(prof.profile.kernel_profiles)
        prof.profile.kernel_profiles.append(kernel)


__all__ = ["FusionProfile", "KernelProfile", "PythonProfiler"]
