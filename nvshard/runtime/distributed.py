"""torch.distributed set-up from the mpirun (or torchrun) environment.

Nothing to call by hand: the first `fd.execute` in a job of several
processes initialises the default process group (gloo for CPU tensors,
NCCL for CUDA ones). Rank 0 picks a free TCP port and shares it through
mpi4py, so concurrent jobs never clash on a fixed port. A rank that fails
with an uncaught exception aborts the whole MPI job, so the others do not
wait forever in a collective.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys

import torch

from ..multidevice.communicator import Communicator
from .backends import TorchDistributedBackend

_BACKEND = None
TIMEOUT_SECONDS = int(os.environ.get("NVSHARD_COLLECTIVE_TIMEOUT", "300"))


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(device: torch.device) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    comm = Communicator.instance()
    rank, size = comm.rank(), comm.size()
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(comm.local_rank())
    timeout = datetime.timedelta(seconds=TIMEOUT_SECONDS)
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=size, timeout=timeout)
    else:
        MPI = _mpi()
        if MPI is None:
            raise RuntimeError("a multi-process job needs mpi4py or MASTER_ADDR/MASTER_PORT to set up torch.distributed")
        addr = "127.0.0.1"
        port = _free_port() if rank == 0 else None
        port = MPI.COMM_WORLD.bcast(port, root=0)
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size,
                                timeout=timeout)
    abort_job_on_uncaught_exception()


def distributed_backend(device: torch.device) -> TorchDistributedBackend:
    global _BACKEND
    init_process_group(device)
    if _BACKEND is None:
        _BACKEND = TorchDistributedBackend(Communicator.instance().rank())
    return _BACKEND


class _ProcessGroup:
    def barrier(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            return
        MPI = _mpi()
        if MPI is not None:
            MPI.COMM_WORLD.Barrier()


def process_group() -> _ProcessGroup:
    return _ProcessGroup()


def abort_job(code: int = 1) -> None:
    """End every rank of the job now (MPI_Abort), flushing this rank's output."""
    sys.stdout.flush()
    sys.stderr.flush()
    MPI = _mpi()
    if MPI is not None and Communicator.instance().size() > 1:
        MPI.COMM_WORLD.Abort(code)
    os._exit(code)


def abort_job_on_uncaught_exception() -> None:
    if getattr(sys.excepthook, "_nvshard", False):
        return
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        sys.stderr.write(f"[rank {Communicator.instance().rank()}] uncaught exception: aborting the job\n")
        abort_job(1)

    hook._nvshard = True
    sys.excepthook = hook
