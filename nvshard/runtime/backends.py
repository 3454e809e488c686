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
    """One rank per process, on nvshard's own process groups (gloo on CPU,
    NCCL on CUDA; runtime/distributed.py makes them without torch's default
    group). `new_group(ranks)` gives the group of those global ranks."""

    def __init__(self, rank: int, new_group, world):
        super().__init__()
        self.rank = rank
        self._new_group = new_group
        self._world = world
        self._groups: dict[tuple, object] = {}

    def prepare_groups(self, groups: list) -> None:
        for g in groups:
            key = tuple(g)
            if key not in self._groups and self.rank in key and len(set(key)) > 1:
                self._groups[key] = self._new_group(list(key))

    def _group(self, group):
        key = tuple(group)
        if key not in self._groups:
            raise RuntimeError(f"process group {key} was not prepared on rank {self.rank}")
        return self._groups[key]

    def _exchange(self, c, group, payload):
        pg = self._group(group) if len(set(group)) > 1 else None  # a device alone needs no group
        result = c.distributed(self.rank, pg, list(group), payload)
        return {} if result is None else {self.rank: result}

    def all_gather_object(self, obj) -> list:
        """Every rank's `obj` (picklable), in rank order, over the whole world."""
        return self._world.all_gather_object(obj)
