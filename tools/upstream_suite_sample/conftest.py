"""A miniature of upstream's tests/python/multidevice/conftest.py, written
for `tools/run_upstream_suite.py --quick` (the smoke run, where no upstream
checkout exists): CUDA calls, nvfuser_direct imports and the default
process group on NCCL at port 29500, as upstream writes them, so the
runner's mechanical changes have something to change."""

import os

import pytest
import torch
import torch.distributed as dist

import nvfuser_direct as nvfuser


class MultideviceTest:
    def __init__(self):
        self.communicator = nvfuser.multidevice.Communicator.instance()
        torch.cuda.set_device(self.communicator.local_rank())
        torch.manual_seed(0)

    @property
    def size(self):
        return self.communicator.size()

    @property
    def rank(self):
        return self.communicator.rank()

    def shard_tensor(self, t, tv):
        return nvfuser.multidevice.shard_tensor(t, tv).cuda(self.communicator.local_rank())


@pytest.fixture
def multidevice_test():
    fixture = MultideviceTest()
    yield fixture
    fixture.communicator.barrier()


@pytest.fixture(scope="session")
def setup_default_process_group():
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world_size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend="nccl",
        init_method="tcp://localhost:29500",
        world_size=world_size,
        rank=rank,
        device_id=torch.device(f"cuda:{local_rank}"),
    )
    yield
    dist.destroy_process_group()
