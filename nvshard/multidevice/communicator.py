"""The process's place in the world, as nvFuser's Communicator reports it.

Rank and size come from the launcher's environment: Open MPI's
OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}, else torchrun's
RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE, else a single process.
"""

from __future__ import annotations

import enum
import os
from typing import Callable, Iterable, Optional


def _env_int(names: Iterable[str], default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value:
            return int(value)
    return default


class CommunicatorBackend(enum.Enum):
    """Which library moves the data. On CPU tensors nccl and ucc both mean
    nvshard's torch.distributed groups (gloo); cuda (copy engines and CUDA
    IPC between GPUs) exists only on CUDA devices."""

    nccl = "nccl"
    ucc = "ucc"
    cuda = "cuda"


def mpi():
    """mpi4py's MPI module, or None where it is not installed."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI


class Communicator:
    _instance = None

    def __init__(self):
        # nvshard's world group, once the runtime made one (runtime/distributed.py)
        self._group_barrier: Optional[Callable[[], None]] = None
        self._rank = _env_int(["OMPI_COMM_WORLD_RANK", "RANK"], 0)
        self._size = _env_int(["OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"], 1)
        self._local_rank = _env_int(["OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"], 0)
        self._local_size = _env_int(["OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"], 1)

    @classmethod
    def instance(cls) -> "Communicator":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def local_size(self) -> int:
        return self._local_size

    def local_rank(self) -> int:
        return self._local_rank

    def is_distributed(self) -> bool:
        return self._size > 1

    def set_barrier(self, barrier: Callable[[], None]) -> None:
        self._group_barrier = barrier

    def barrier(self) -> None:
        """Every rank waits for the others: on nvshard's own world group once it
        exists, else through MPI (never torch's default process group)."""
        if not self.is_distributed():
            return
        if self._group_barrier is not None:
            self._group_barrier()
            return
        MPI = mpi()
        if MPI is not None:
            MPI.COMM_WORLD.Barrier()
