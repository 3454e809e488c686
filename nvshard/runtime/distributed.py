"""nvshard's own process groups under mpirun (or torchrun).

Nothing to call by hand: the first `fd.execute` that communicates creates
a private world group (gloo for CPU tensors, NCCL for CUDA ones) on a
TCPStore of its own. torch's default process group is never initialised,
so a program (or a test session) that calls
`torch.distributed.init_process_group` itself, before or after, works
beside nvshard, as it does beside nvFuser. Rank 0 picks a free TCP port
and shares it through mpi4py (or MASTER_ADDR/MASTER_PORT + 1 under
torchrun), so concurrent jobs never clash on a fixed port. A rank that
fails with an uncaught exception aborts the whole MPI job, so the others
do not wait forever in a collective.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import sys

import torch

from ..multidevice.communicator import Communicator, mpi
from .backends import TorchDistributedBackend

TIMEOUT_SECONDS = int(os.environ.get("NVSHARD_COLLECTIVE_TIMEOUT", "300"))

_STORE = None
_BACKENDS: dict = {}  # device type -> TorchDistributedBackend
_GROUPS: dict = {}  # (device type, ranks) -> ProcessGroup


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _store():
    """The job's key-value store, made once: every private group rendezvous here."""
    global _STORE
    if _STORE is not None:
        return _STORE
    import torch.distributed as dist

    comm = Communicator.instance()
    rank, size = comm.rank(), comm.size()
    timeout = datetime.timedelta(seconds=TIMEOUT_SECONDS)
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        # torchrun's port belongs to the default group, if the program makes one
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1
    else:
        MPI = mpi()
        if MPI is None:
            raise RuntimeError("a multi-process job needs mpi4py or MASTER_ADDR/MASTER_PORT to set up its groups")
        addr = "127.0.0.1"
        port = MPI.COMM_WORLD.bcast(_free_port() if rank == 0 else None, root=0)
    _STORE = dist.TCPStore(addr, port, size, rank == 0, timeout=timeout)
    abort_job_on_uncaught_exception()
    return _STORE


def new_group(ranks: list, device_type: str = "cpu") -> "ProcessGroup":
    """A group over `ranks` (global ranks, in order). Only members need to
    call it; each member gets the same group."""
    key = (device_type, tuple(ranks))
    if key not in _GROUPS:
        _GROUPS[key] = ProcessGroup(list(ranks), device_type)
    return _GROUPS[key]


def world_group(device_type: str = "cpu") -> "ProcessGroup":
    return new_group(list(range(Communicator.instance().size())), device_type)


class ProcessGroup:
    """A torch ProcessGroup made directly on the job's store (not registered
    with torch.distributed), with the collectives the backend uses. Ranks
    given to and reported by its methods are global ranks."""

    def __init__(self, ranks: list, device_type: str):
        import torch.distributed as dist

        self.ranks = ranks
        me = Communicator.instance().rank()
        if me not in ranks:
            raise RuntimeError(f"rank {me} is not in group {ranks}")
        self.local_rank = ranks.index(me)
        self._pg = None
        self._objects_exchanged = 0
        if len(ranks) > 1:
            prefix = dist.PrefixStore(f"nvshard/{device_type}/{'-'.join(map(str, ranks))}", _store())
            timeout = datetime.timedelta(seconds=TIMEOUT_SECONDS)
            if device_type == "cuda":
                self._pg = dist.ProcessGroupNCCL(prefix, self.local_rank, len(ranks))
            else:
                self._pg = dist.ProcessGroupGloo(prefix, self.local_rank, len(ranks), timeout)

    def all_gather(self, stacked: torch.Tensor, t: torch.Tensor) -> None:
        """stacked[i] = member i's t; both contiguous (one flat buffer each,
        so no per-member copy)."""
        if self._pg is None:
            stacked[0].copy_(t)
            return
        self._pg._allgather_base(stacked.view(-1), t.view(-1)).wait()

    def reduce_scatter(self, out: torch.Tensor, stacked: torch.Tensor) -> None:
        """out = the sum over members of their stacked[my index]; both contiguous."""
        if self._pg is None:
            out.copy_(stacked[0])
            return
        self._pg._reduce_scatter_base(out.view(-1), stacked.view(-1)).wait()

    def all_reduce(self, t: torch.Tensor) -> None:
        if self._pg is not None:
            self._pg.allreduce([t]).wait()

    def all_to_all(self, recv: list, send: list) -> None:
        if self._pg is None:
            recv[0].copy_(send[0])
            return
        import torch.distributed as dist

        flat_in = torch.cat([s.reshape(-1) for s in send])
        flat_out = torch.empty(sum(r.numel() for r in recv), dtype=flat_in.dtype, device=flat_in.device)
        self._pg.alltoall_base(flat_out, flat_in, [r.numel() for r in recv], [s.numel() for s in send],
                               dist.AllToAllOptions()).wait()
        for r, piece in zip(recv, flat_out.split([r.numel() for r in recv])):
            r.copy_(piece.view(r.shape))

    def broadcast(self, t: torch.Tensor, root: int) -> None:
        if self._pg is None:
            return
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = self.ranks.index(root)
        self._pg.broadcast([t], opts).wait()

    def isend(self, t: torch.Tensor, dst: int):
        return self._pg.send([t], self.ranks.index(dst), 0)

    def irecv(self, t: torch.Tensor, src: int):
        return self._pg.recv([t], self.ranks.index(src), 0)

    def barrier(self) -> None:
        if self._pg is not None:
            self._pg.barrier().wait()

    def all_gather_object(self, obj) -> list:
        """Every member's `obj` (picklable), in group order: through the
        job's store, so it needs no tensor of a known size."""
        if self._pg is None:
            return [obj]
        self._objects_exchanged += 1
        prefix = f"nvshard/objects/{'-'.join(map(str, self.ranks))}/{self._objects_exchanged}"
        store = _store()
        store.set(f"{prefix}/{self.local_rank}", pickle.dumps(obj))
        out = [pickle.loads(store.get(f"{prefix}/{i}")) for i in range(len(self.ranks))]
        self.barrier()  # every member has read every key before any is removed
        store.delete_key(f"{prefix}/{self.local_rank}")
        return out


def distributed_backend(device: torch.device) -> TorchDistributedBackend:
    comm = Communicator.instance()
    if device.type == "cuda":
        torch.cuda.set_device(comm.local_rank())
    backend = _BACKENDS.get(device.type)
    if backend is None:
        world = world_group(device.type)
        comm.set_barrier(world.barrier)
        backend = TorchDistributedBackend(comm.rank(), lambda ranks: new_group(ranks, device.type), world)
        _BACKENDS[device.type] = backend
    return backend


def abort_job(code: int = 1) -> None:
    """End every rank of the job now (MPI_Abort), flushing this rank's output."""
    sys.stdout.flush()
    sys.stderr.flush()
    MPI = mpi()
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


__all__ = ["ProcessGroup", "abort_job", "abort_job_on_uncaught_exception", "distributed_backend", "new_group",
           "world_group"]
