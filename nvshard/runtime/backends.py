"""Where collectives exchange buffers: simulated ranks in one process, or
torch.distributed (gloo on CPU, NCCL on CUDA) with one rank per process.

What each collective does, for either backend, is declared once in
multidevice/collectives.py; a backend runs it on the ranks this process
owns, holds the process groups, and counts the bytes each rank receives
from the buffers it was actually handed (tests compare that with the plan).
"""

from __future__ import annotations

from collections import defaultdict

from ..multidevice.collectives import collective


class Backend:
    def __init__(self):
        self.received: dict[int, float] = defaultdict(float)
        self.calls: list[tuple] = []

    def exchange(self, kind: str, group: list, payload: dict) -> dict:
        """Run collective `kind` over `group`; payload and result map this
        process's ranks to their buffers (see multidevice/collectives.py)."""
        c = collective(kind)
        out = self._exchange(c, group, payload)
        for rank in out:
            nbytes = c.measured(group, rank, payload, out)
            if nbytes is not None:
                self.received[rank] += nbytes
                self.calls.append((kind, tuple(group), rank, nbytes))
        return out

    def _exchange(self, c, group: list, payload: dict) -> dict:
        raise NotImplementedError

    def reset_counters(self) -> None:
        self.received = defaultdict(float)
        self.calls = []

    def prepare_groups(self, groups: list) -> None:
        """Collectively create the groups a program will use (torch needs every
        rank to create every group, in the same order)."""


class SimulatedBackend(Backend):
    """All ranks live in this process; collectives are done in memory."""

    def _exchange(self, c, group, payload):
        return c.simulate(group, payload)


class TorchDistributedBackend(Backend):
    """One rank per process: torch.distributed (gloo on CPU, NCCL on CUDA)."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank
        self._groups: dict[tuple, object] = {}

    def prepare_groups(self, groups: list) -> None:
        import torch.distributed as dist

        for g in groups:
            key = tuple(g)
            if key not in self._groups:
                self._groups[key] = dist.new_group(list(key)) if len(key) > 1 else None

    def _group(self, group):
        key = tuple(group)
        if key not in self._groups:
            raise RuntimeError(f"process group {key} was not prepared on every rank")
        return self._groups[key]

    def _exchange(self, c, group, payload):
        result = c.distributed(self.rank, self._group(group), list(group), payload)
        return {} if result is None else {self.rank: result}

    def all_gather_object(self, obj) -> list:
        """Every rank's `obj` (picklable), in rank order, over the whole world."""
        import torch.distributed as dist

        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
