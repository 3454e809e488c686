"""Rank 1 fails before the collective its peers wait in (run by test_launch.py)."""

import torch

import nvshard as nvfuser
from nvshard import FusionDefinition

comm = nvfuser.multidevice.Communicator.instance()
mesh = nvfuser.multidevice.DeviceMesh(torch.arange(comm.size()))
with FusionDefinition() as fd:
    inp = fd.define_tensor([comm.size() * 2])
    out = fd.ops.set(inp)
    fd.add_output(out)
    inp.set_device_mesh(mesh)
    inp.outer_split(0, comm.size())
    inp.axis(0).parallelize(nvfuser.ParallelType.mesh_x)
    out.set_device_mesh(mesh)
if comm.rank() == 1:
    raise RuntimeError("rank 1 fails before the allgather")
fd.execute([torch.ones(2)])  # the other ranks would wait here forever
