"""nvfuser_direct.pytorch_utils: dtype translation between torch and nvshard."""

from __future__ import annotations

from typing import Union

import torch

from .ir.dtypes import DataType
from .ir.nodes import NvShardError

# Python scalars map as nvFuser maps them: float is a double.
_PYTHON_SCALARS = {float: DataType.Double, int: DataType.Int, bool: DataType.Bool}


def torch_dtype_to_nvfuser_dtype(dtype: Union[torch.dtype, type]) -> DataType:
    """torch.bfloat16 -> DataType.BFloat16; also float, int and bool."""
    if isinstance(dtype, type) and dtype in _PYTHON_SCALARS:
        return _PYTHON_SCALARS[dtype]
    for dt in DataType:
        if dt.torch_dtype is not None and dt.torch_dtype == dtype:
            return dt
    known = sorted(str(dt.torch_dtype) for dt in DataType if dt.torch_dtype is not None)
    raise NvShardError(f"torch_dtype_to_nvfuser_dtype: nvshard has no DataType for {dtype}; it has {known}")


def python_scalar_to_nvfuser_dtype(value) -> DataType:
    kind = type(value)
    if kind not in _PYTHON_SCALARS:
        raise NvShardError(f"python_scalar_to_nvfuser_dtype: expected a bool, int or float, got {kind.__name__}")
    return _PYTHON_SCALARS[kind]


def nvfuser_dtype_to_torch_dtype(dtype: DataType) -> torch.dtype:
    if not isinstance(dtype, DataType) or dtype.torch_dtype is None:
        raise NvShardError(f"nvfuser_dtype_to_torch_dtype: expected a DataType with a torch dtype, got {dtype!r}")
    return dtype.torch_dtype


__all__ = ["nvfuser_dtype_to_torch_dtype", "python_scalar_to_nvfuser_dtype", "torch_dtype_to_nvfuser_dtype"]
