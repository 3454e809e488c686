"""Communicator backends behind one small interface.

Each call takes the tensors of the ranks this process runs (all of them for
simulated ranks, one under mpirun) and returns theirs. Every backend counts
the bytes each rank receives, by the formulas in preseg/reshard.py, from
the buffers it was actually handed; tests compare that with the plan.
"""

from __future__ import annotations

from collections import defaultdict

import torch


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Backend:
    def __init__(self):
        self.received: dict[int, float] = defaultdict(float)
        self.calls: list[tuple] = []

    def _count(self, kind: str, group: list, rank: int, nbytes: float) -> None:
        self.received[rank] += nbytes
        self.calls.append((kind, tuple(group), rank, nbytes))

    def reset_counters(self) -> None:
        self.received = defaultdict(float)
        self.calls = []

    def prepare_groups(self, groups: list) -> None:
        """Collectively create the groups a program will use (torch needs every
        rank to create every group, in the same order)."""


class SimulatedBackend(Backend):
    """All ranks live in this process; collectives are done in memory."""

    def all_gather(self, group, tensors):
        pieces = [tensors[r] for r in group]
        out = {}
        for r in group:
            self._count("allgather", group, r, (len(group) - 1) * _nbytes(tensors[r]))
            out[r] = [p.clone() for p in pieces]
        return out

    def reduce_scatter(self, group, chunks):
        d = len(group)
        out = {}
        for i, r in enumerate(group):
            total = chunks[group[0]][i].clone()
            for other in group[1:]:
                total = total + chunks[other][i]
            out[r] = total
            self._count("reduce_scatter", group, r, (d - 1) * _nbytes(chunks[r][i]))
        return out

    def all_reduce(self, group, tensors):
        total = tensors[group[0]].clone()
        for r in group[1:]:
            total = total + tensors[r]
        d = len(group)
        out = {}
        for r in group:
            self._count("allreduce", group, r, 2 * (d - 1) / d * _nbytes(tensors[r]))
            out[r] = total.clone()
        return out

    def all_to_all(self, group, chunks):
        out = {}
        for j, r in enumerate(group):
            out[r] = [chunks[src][j].clone() for src in group]
            self._count("all_to_all", group, r, sum(_nbytes(c) for i, c in enumerate(out[r]) if i != j))
        return out

    def broadcast(self, group, root, tensors):
        data = tensors[root]
        out = {}
        for r in group:
            out[r] = data.clone()
            if r != root:
                self._count("broadcast", group, r, _nbytes(data))
        return out

    def send_recv(self, pairs, tensors):
        out = {}
        for src, dst in pairs:
            out[dst] = tensors[src].clone()
            if src != dst:
                self._count("send_recv", (src, dst), dst, _nbytes(tensors[src]))
        return out


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
            if key not in self._groups and self.rank in key:
                self._groups[key] = self._new_group(list(key))

    def _group(self, group):
        key = tuple(group)
        if key not in self._groups:
            raise RuntimeError(f"process group {key} was not prepared on rank {self.rank}")
        return self._groups[key]

    def all_gather(self, group, tensors):
        t = tensors[self.rank].contiguous()
        pieces = [torch.empty_like(t) for _ in group]
        self._group(group).all_gather(pieces, t)
        self._count("allgather", group, self.rank, (len(group) - 1) * _nbytes(t))
        return {self.rank: pieces}

    def reduce_scatter(self, group, chunks):
        mine = [c.contiguous() for c in chunks[self.rank]]
        i = group.index(self.rank)
        out = torch.empty_like(mine[i])
        self._group(group).reduce_scatter(out, mine)
        self._count("reduce_scatter", group, self.rank, (len(group) - 1) * _nbytes(mine[i]))
        return {self.rank: out}

    def all_reduce(self, group, tensors):
        t = tensors[self.rank].contiguous().clone()
        self._group(group).all_reduce(t)
        d = len(group)
        self._count("allreduce", group, self.rank, 2 * (d - 1) / d * _nbytes(t))
        return {self.rank: t}

    def all_to_all(self, group, chunks):
        send = [c.contiguous() for c in chunks[self.rank]]
        recv = [torch.empty_like(c) for c in send]
        self._group(group).all_to_all(recv, send)
        j = group.index(self.rank)
        self._count("all_to_all", group, self.rank, sum(_nbytes(c) for i, c in enumerate(recv) if i != j))
        return {self.rank: recv}

    def broadcast(self, group, root, tensors):
        t = tensors[self.rank].contiguous().clone()
        self._group(group).broadcast(t, root)
        if self.rank != root:
            self._count("broadcast", group, self.rank, _nbytes(t))
        return {self.rank: t}

    def send_recv(self, pairs, tensors):
        works, out = [], {}
        for src, dst in pairs:
            if src == dst:
                if self.rank == src:
                    out[dst] = tensors[src].clone()
            elif self.rank == src:
                works.append(self._world.isend(tensors[src].contiguous(), dst))
            elif self.rank == dst:
                buf = torch.empty_like(tensors[dst])
                works.append(self._world.irecv(buf, src))
                out[dst] = buf
        for work in works:
            work.wait()
        if self.rank in out and (self.rank, self.rank) not in pairs:
            self._count("send_recv", tuple(pairs), self.rank, _nbytes(out[self.rank]))
        return out
