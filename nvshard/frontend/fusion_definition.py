"""FusionDefinition: the nvfuser_direct entry point.

    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 128], dtype=DataType.BFloat16)
        y = fd.ops.relu(x)
        fd.add_output(y)
    (out,) = fd.execute([torch.randn(4, 128, dtype=torch.bfloat16)])
"""

from __future__ import annotations

import inspect
from typing import Optional

from .. import ops as _ops
from ..ir.dtypes import DataType
from ..ir.nodes import Fusion, IterType, NvShardError, Scalar
from ..ir.sizes import Size, Sym
from ..ops import common


class _OpsNamespace:
    """`fd.ops`: every registered op, with nvfuser_direct's keyword names.
    Unknown keywords raise an NvShardError naming the op and its keywords."""

    def __init__(self):
        # name -> (op, its checked wrapper): reading a signature costs more
        # than most ops do, and big fusions call the same few ops thousands of times
        self._wrapped: dict = {}

    def __getattr__(self, name: str):
        fn = _ops.FRONTEND.get(name)
        if fn is None:
            raise AttributeError(f"fd.ops has no op '{name}'")
        known = self._wrapped.get(name)
        if known is None or known[0] is not fn:  # (an op registered again gets a new wrapper)
            known = self._wrapped[name] = (fn, _checked(name, fn))
        return known[1]

    def __dir__(self):
        return sorted(_ops.FRONTEND)


def _checked(name, fn):
    sig = inspect.signature(fn)
    accepts_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())

    def call(*args, **kwargs):
        if not accepts_kwargs:
            unknown = [k for k in kwargs if k not in sig.parameters]
            if unknown:
                known = [p for p in sig.parameters]
                raise NvShardError(f"fd.ops.{name}: unknown keyword {unknown[0]!r}; expected one of {known}")
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            raise NvShardError(f"fd.ops.{name}: {e}") from None
        return fn(*args, **kwargs)

    call.__name__ = name
    call.__doc__ = fn.__doc__
    return call


ops = _OpsNamespace()


class FusionDefinition:
    def __init__(self):
        self.ops = ops
        self._fusion: Optional[Fusion] = None
        self._executor = None

    # -- context manager -------------------------------------------------------
    def __enter__(self) -> "FusionDefinition":
        self._fusion = Fusion()
        self._executor = None
        common.push_fusion(self._fusion)
        return self

    def __exit__(self, exc_type, exc, tb):
        common.pop_fusion()
        if exc_type is None:
            from ..preseg.validate import validate_annotations

            self._fusion.resolve_static_extents()
            validate_annotations(self._fusion)
        return False

    @property
    def fusion(self) -> Fusion:
        if self._fusion is None:
            raise NvShardError("the FusionDefinition is empty: define it inside `with FusionDefinition() as fd:`")
        return self._fusion

    # -- definition ----------------------------------------------------------------
    def define_tensor(self, shape=None, contiguity=False, dtype=DataType.Float, is_cpu=False, stride_order=None,
                      sizes=None, strides=None):
        fusion = self._active()
        if shape is None and sizes is not None:
            shape = sizes
        if shape is None:
            raise NvShardError("define_tensor: shape is required")
        shape = list(shape)
        if not isinstance(dtype, DataType) or dtype is DataType.Null:
            raise NvShardError(f"define_tensor: dtype must be a DataType, got {dtype!r}")
        ids = []
        for k, e in enumerate(shape):
            if not isinstance(e, int) or isinstance(e, bool) or e < -1:
                raise NvShardError(f"define_tensor: shape[{k}] = {e!r}; use -1 (symbolic), 1 (broadcast) or a size")
            if e == -1:
                ids.append(fusion.new_id(Size.of(Sym(fusion.new_symbol_name()))))
            elif e == 1:
                ids.append(fusion.new_id(Size(1), IterType.Broadcast))
            else:
                ids.append(fusion.new_id(Size(e)))
        rank = len(shape)
        if isinstance(contiguity, (list, tuple)) and len(contiguity) not in (0, rank):
            raise NvShardError(f"define_tensor: contiguity has {len(contiguity)} entries for rank {rank}")
        if stride_order:
            if sorted(stride_order) != list(range(rank)):
                raise NvShardError(f"define_tensor: stride_order {list(stride_order)} is not a permutation of 0..{rank - 1}")
        tv = fusion.new_tv(dtype, ids)
        tv.contiguity = contiguity
        tv.stride_order = list(stride_order) if stride_order else None
        tv.is_cpu = is_cpu
        fusion.add_input(tv)
        return tv

    def define_scalar(self, value=None, dtype=None):
        fusion = self._active()
        if isinstance(value, DataType):
            value, dtype = None, value
        if value is None:
            dtype = dtype or DataType.Double
            scalar = Scalar(fusion, dtype, None, fusion.new_scalar_name(dtype))
            fusion.add_input(scalar)
            return scalar
        if dtype is None:
            dtype = common.python_scalar_dtype(value)
        if dtype.is_floating:
            value = float(value)
        elif dtype == DataType.Bool:
            value = bool(value)
        else:
            value = int(value)
        return Scalar(fusion, dtype, value)

    def define_vector(self, size: int):
        return [self.define_scalar(None, DataType.Int) for _ in range(size)]

    def add_output(self, tv) -> None:
        self._active_or_built().add_output(tv)

    def _active(self) -> Fusion:
        if self._fusion is None or not common._FUSION_STACK or common._FUSION_STACK[-1] is not self._fusion:
            raise NvShardError("define the fusion inside `with FusionDefinition() as fd:`")
        return self._fusion

    def _active_or_built(self) -> Fusion:
        if self._fusion is None:
            raise NvShardError("define the fusion inside `with FusionDefinition() as fd:`")
        return self._fusion

    # -- execution -------------------------------------------------------------------
    def execute(self, inputs, *, device=None, _enable_options=(), _disable_options=(), **_ignored):
        """Run on this rank's input shards; returns this rank's output shards."""
        from ..runtime.executor import FusionExecutor

        if self._executor is None:
            self._executor = FusionExecutor(self.fusion)
        return self._executor.execute(list(inputs), device=device)

    def __repr__(self) -> str:
        return f"FusionDefinition(\n{self.fusion.print_math() if self._fusion else ''})"
