"""nvshard: nvFuser-compatible sharding propagation and SPMD execution.

`import nvshard as nvfuser` runs fusion definitions written for
nvfuser_direct.
"""

from __future__ import annotations

from . import native

native.install()  # before any compiled module is imported: the source wins when a build is stale

from . import multidevice
from .frontend.fusion_definition import FusionDefinition, ops
from .ir.dtypes import DataType
from .ir.nodes import CudaRequiredError, IterDomain, MemoryType, NvShardError, ParallelType, Scalar, TensorView
from .multidevice.communicator import CommunicatorBackend
from .profiler import PythonProfiler
from .api import execute_with_dtensors, propagate_shardings, simulate
from .visualize import sharding_text, visualize_sharding
from .runtime.executor import MultiDeviceExecutor, MultiDeviceExecutorParams

# nvfuser_direct has them in its multidevice module; the runtime that defines
# them imports nvshard.multidevice, so they are attached here, from above.
multidevice.MultiDeviceExecutor = MultiDeviceExecutor
multidevice.MultiDeviceExecutorParams = MultiDeviceExecutorParams

# Under mpirun, a rank that dies of an uncaught exception ends the whole job
# (MPI_Abort) instead of leaving its peers waiting in a collective.
if multidevice.Communicator.instance().size() > 1:
    from .runtime.distributed import abort_job_on_uncaught_exception

    abort_job_on_uncaught_exception()

__all__ = [
    "CommunicatorBackend",
    "CudaRequiredError",
    "DataType",
    "FusionDefinition",
    "IterDomain",
    "MemoryType",
    "NvShardError",
    "ParallelType",
    "PythonProfiler",
    "Scalar",
    "TensorView",
    "execute_with_dtensors",
    "multidevice",
    "ops",
    "propagate_shardings",
    "sharding_text",
    "simulate",
    "visualize_sharding",
]
