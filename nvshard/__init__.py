"""nvshard: nvFuser-compatible sharding propagation and SPMD execution.

`import nvshard as nvfuser` runs fusion definitions written for
nvfuser_direct.
"""

from __future__ import annotations

from . import multidevice
from .frontend.fusion_definition import FusionDefinition, ops
from .ir.dtypes import DataType
from .ir.nodes import IterDomain, NvShardError, ParallelType, Scalar, TensorView
from .api import execute_with_dtensors, propagate_shardings, simulate

__all__ = [
    "DataType",
    "FusionDefinition",
    "IterDomain",
    "NvShardError",
    "ParallelType",
    "Scalar",
    "TensorView",
    "execute_with_dtensors",
    "multidevice",
    "ops",
    "propagate_shardings",
    "simulate",
]
