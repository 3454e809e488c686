"""Data types as nvFuser names and prints them, with their torch equivalents."""

from __future__ import annotations

import enum

import torch


class DataType(enum.Enum):
    Float = ("float", torch.float32)
    Half = ("__half", torch.float16)
    BFloat16 = ("__bfloat", torch.bfloat16)
    Bool = ("bool", torch.bool)
    Double = ("double", torch.float64)
    Int32 = ("int", torch.int32)
    Int = ("int64_t", torch.int64)
    UInt64 = ("uint64_t", torch.uint64)
    Index = ("nvfuser_index_t", torch.int64)  # after Int: from_torch(int64) is Int
    Null = ("null", None)

    def __init__(self, printed: str, torch_dtype):
        self.printed = printed
        self.torch_dtype = torch_dtype
        # read once: every tensor's cost signature asks, and torch answers slowly
        self._itemsize = None if torch_dtype is None else torch_dtype.itemsize

    def __str__(self) -> str:
        return self.printed

    def __repr__(self) -> str:
        return f"DataType.{self.name}"

    @property
    def is_floating(self) -> bool:
        return self in (DataType.Float, DataType.Half, DataType.BFloat16, DataType.Double)

    @property
    def is_reduced_precision(self) -> bool:
        return self in (DataType.Half, DataType.BFloat16)

    @property
    def is_integral(self) -> bool:
        return self in (DataType.Int32, DataType.Int, DataType.UInt64, DataType.Index)

    @property
    def itemsize(self) -> int:
        if self._itemsize is None:
            raise TypeError(f"{self!r} has no item size")
        return self._itemsize

    @staticmethod
    def from_torch(dtype: torch.dtype) -> "DataType":
        for dt in DataType:
            if dt.torch_dtype == dtype:
                return dt
        raise TypeError(f"nvshard has no DataType for torch dtype {dtype}")


def _category(dt: DataType) -> int:
    """0 bool, 1 integral, 2 floating: torch's promotion categories."""
    if dt == DataType.Bool:
        return 0
    if dt.is_integral:
        return 1
    return 2


def promote(tensor_dtypes: list[DataType], scalar_dtypes: list[DataType],
            reduced_to_float: bool = False) -> DataType:
    """Result dtype of an elementwise op, following torch.result_type.

    Tensor operands decide the dtype unless a scalar operand belongs to a higher
    category (bool < integral < floating); then the category's default wins.
    With `reduced_to_float` (nvFuser's computeTypes for arithmetic: binary
    ops, neg, the float unary ops), a Half or BFloat16 common type becomes
    Float: the op computes and returns Float. Ops that keep the operands'
    dtype (where, relu, cat, ...) leave it False.
    """
    def fold(dtypes: list[DataType]) -> DataType:
        acc = dtypes[0].torch_dtype
        for d in dtypes[1:]:
            acc = torch.promote_types(acc, d.torch_dtype)
        return DataType.from_torch(acc)

    if not tensor_dtypes:
        result = fold(scalar_dtypes)
    else:
        result = fold(tensor_dtypes)
        top_scalar = max((_category(d) for d in scalar_dtypes), default=-1)
        if top_scalar > _category(result):
            result = DataType.Float if top_scalar == 2 else DataType.Int
    if reduced_to_float and result.is_reduced_precision:
        result = DataType.Float
    return result


def compute_dtype(dt: DataType) -> torch.dtype:
    """The dtype nvFuser kernels compute in: reduced precision is upcast to float."""
    return torch.float32 if dt.is_reduced_precision else dt.torch_dtype
