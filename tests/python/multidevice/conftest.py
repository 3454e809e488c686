# Run command (upstream style):
#   mpirun -np [num_devices] pytest tests/python/multidevice/[test_name].py --only-mpi -s
#
# With one process, `multidevice_test` simulates NVSHARD_SIMULATED_WORLD_SIZE
# ranks (default 4) in this process, so the same tests check numerics and
# bytes without a launcher.

import os
import sys

import pytest
import torch

import nvshard as nvfuser
from nvshard import api




class Results:
    """What one execution gave the ranks this process runs."""

    def __init__(self, plan, outputs: dict, received: dict):
        self.plan = plan
        self.outputs = outputs  # rank -> list of local shards
        self.received = received  # rank -> bytes received (measured)

    def local(self, i: int, rank: int = None):
        rank = next(iter(self.outputs)) if rank is None else rank
        return self.outputs[rank][i]


class MultideviceTest:
    def __init__(self):
        self._communicator = nvfuser.multidevice.Communicator.instance()
        self.simulated = self._communicator.size() == 1
        self._size = int(os.environ.get("NVSHARD_SIMULATED_WORLD_SIZE", "4")) if self.simulated \
            else self._communicator.size()
        # Every rank creates the same unsharded data.
        torch.manual_seed(0)

    @property
    def communicator(self):
        return self._communicator

    @property
    def size(self) -> int:
        return self._size

    @property
    def rank(self) -> int:
        return self._communicator.rank()

    @property
    def local_rank(self) -> int:
        return self._communicator.local_rank()

    @property
    def local_size(self) -> int:
        return self._communicator.local_size()

    @property
    def ranks(self) -> list:
        """The ranks this process runs."""
        return list(range(self._size)) if self.simulated else [self.rank]

    def shard_tensor(self, t: torch.Tensor, tv, rank: int = None) -> torch.Tensor:
        assert t.is_cpu, "create unsharded data on CPU"
        return nvfuser.multidevice.shard_tensor(t, tv, self.rank if rank is None else rank)

    def execute(self, fd, inputs: list) -> Results:
        """Run `fd` on UNSHARDED inputs: each rank takes its shards and runs
        fd.execute under mpirun; with one process every rank is simulated."""
        if self.simulated:
            sim = api.simulate(fd, inputs, world_size=self._size)
            return Results(sim.plan, sim.outputs, sim.received)
        local = []
        for v, t in zip(fd.fusion.inputs(), inputs):
            if isinstance(v, nvfuser.TensorView) and v.mesh is not None and isinstance(t, torch.Tensor):
                local.append(self.shard_tensor(t, v) if v.mesh.has(self.rank) else t[:0])
            else:
                local.append(t)
        outs = fd.execute(local)
        received = fd._executor.last_backend.received.get(self.rank, 0.0)
        return Results(fd._executor.last_plan, {self.rank: outs}, {self.rank: received})

    def check(self, results: Results, i: int, reference: torch.Tensor, **tolerances) -> None:
        """Every local shard of output i equals the reference's shard."""
        tv = results.plan.program.outputs[i]
        for rank, outs in results.outputs.items():
            expected = api.shard_by_plan(results.plan, tv, reference, rank)
            torch.testing.assert_close(outs[i].cpu(), expected.to(outs[i].dtype), **tolerances)


@pytest.fixture
def multidevice_test():
    fixture = MultideviceTest()
    yield fixture
    fixture.communicator.barrier()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    comm = nvfuser.multidevice.Communicator.instance()
    if report.failed and comm.size() > 1:
        # The other ranks may be waiting in a collective for this one: report
        # and end the whole job rather than hang until a timeout.
        from nvshard.runtime.distributed import abort_job

        sys.stderr.write(f"\n[rank {comm.rank()}] {item.nodeid} failed:\n{report.longreprtext}\n")
        abort_job(1)
