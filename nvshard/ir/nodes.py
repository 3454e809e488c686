"""Fusion IR: IterDomain, TensorView, Scalar, Expr and Fusion.

Mirrors the parts of nvFuser's IR that sharding needs. A TensorView has a
logical domain (its axes, reduction axes included, as nvFuser keeps them) and
a loop domain that scheduling calls transform: `outer_split`, `inner_split`,
`reorder`, `axis(i).parallelize(...)`. Device splits are read back from the
loop domain as a layout per logical axis (see multidevice/layout.py).
"""

from __future__ import annotations

import enum
from typing import Optional

import torch

from ..errors import CudaRequiredError, NvShardError  # noqa: F401 - also imported from here by much of nvshard
from ..multidevice import layout
from .dtypes import DataType
from .sizes import Size, Sym


# Passes push a Program here to print TensorViews with the shardings they
# decided instead of the user's annotations (see preseg/program.py).
RENDER_STACK: list = []


class ParallelType(enum.Enum):
    mesh_x = "x"
    mesh_y = "y"
    mesh_z = "z"
    stream = "stream"
    Serial = "S"

    # nvFuser spells device parallel types DIDx/DIDy/DIDz too.
    @property
    def mesh_axis(self) -> Optional[str]:
        # _value_, not .value: Enum.value is a property run as Python code,
        # and every layout read asks each axis this
        value = self._value_
        return value if value in layout.MESH_AXES else None

    @classmethod
    def of_mesh_axis(cls, axis: str) -> "ParallelType":
        """mesh_x, mesh_y or mesh_z for mesh axis "x", "y" or "z" (mesh_axis's inverse)."""
        if axis not in layout.MESH_AXES:
            raise NvShardError(f"no device parallel type for mesh axis {axis!r} (one of {', '.join(layout.MESH_AXES)})")
        return cls(axis)

    def __str__(self) -> str:
        if self.mesh_axis:
            return "deviceIdx." + self.value
        if self is ParallelType.stream:
            return "streamIdx"
        return "S"


ParallelType.DIDx = ParallelType.mesh_x
ParallelType.DIDy = ParallelType.mesh_y
ParallelType.DIDz = ParallelType.mesh_z
_MESH_X, _MESH_Y, _MESH_Z = ParallelType.mesh_x, ParallelType.mesh_y, ParallelType.mesh_z


def _path(id_) -> tuple:
    return id_.path


# Where nvFuser allocates a tensor (`global` is a Python keyword, hence the
# functional form). Only `symmetric` (memory every GPU of the job can
# address) changes anything, and it needs CUDA.
MemoryType = enum.Enum("MemoryType", [(n, n) for n in ("local", "shared", "global", "tensor", "symmetric")])


class IterType(enum.Enum):
    Iteration = "i"
    Broadcast = "b"
    Reduction = "r"
    GatherScatter = "n"  # a gather's result axis (nvFuser's IterType::GatherScatter)


# Members read in inner loops, as module names: on Python 3.11 every attribute
# read on an Enum class goes through EnumType.__getattr__'s slot hook.
_REDUCTION, _BROADCAST = IterType.Reduction, IterType.Broadcast


# ---------------------------------------------------------------------------


class IterDomain:
    """One axis. Loop ids made by splits remember which logical axis they
    come from (`logical_axis`) and where they sit in its split tree (`path`,
    compared lexicographically: outer before inner). `is_remainder` marks the
    ceilDiv part of a split; every logical axis has exactly one."""

    __slots__ = (
        "number", "_extent", "iter_type", "expanded", "parallel_type", "logical_axis", "path",
        "is_remainder", "display", "printed_extent", "printed_suffix", "owner", "swizzle"
    )

    def __init__(
        self,
        number: int,
        extent: Size,
        iter_type: IterType = IterType.Iteration,
        expanded: Optional[Size] = None,
        logical_axis: int = 0,
        path: tuple = (),
        is_remainder: bool = True,
        display: Optional[str] = None,
    ):
        self.number = number
        self._extent = extent
        self.iter_type = iter_type
        self.expanded = expanded
        self.parallel_type = ParallelType.Serial
        self.logical_axis = logical_axis
        self.path = path
        self.is_remainder = is_remainder
        self.display = display
        # what nvFuser prints between the braces and after them ("1 ex i0", "rf"),
        # kept by a fusion read from real nvFuser, whose extents are per-axis values
        self.printed_extent: Optional[str] = None
        self.printed_suffix = ""
        self.owner: Optional["TensorView"] = None
        # swizzle1d: the mesh parallel type whose device index rotates this axis
        self.swizzle: Optional[ParallelType] = None

    def extent(self) -> Size:
        return self._extent

    def is_reduction(self) -> bool:
        return self.iter_type is _REDUCTION

    def is_broadcast(self) -> bool:
        return self.iter_type is _BROADCAST

    def is_device_dim(self) -> bool:
        # (the members whose mesh_axis is not None, by identity: mesh_axis is
        # a property on an Enum, and every pass asks every loop axis this)
        parallel_type = self.parallel_type
        return parallel_type is _MESH_X or parallel_type is _MESH_Y or parallel_type is _MESH_Z

    def parallelize(self, parallel_type: ParallelType) -> None:
        if not isinstance(parallel_type, ParallelType):
            raise NvShardError(f"parallelize expects a ParallelType, got {parallel_type!r}")
        if self.owner is not None:
            self.owner._check_parallelize(self, parallel_type)
        self.parallel_type = parallel_type

    def __str__(self) -> str:
        if self.printed_extent is not None:
            return f"{self.iter_type.value}{self.parallel_type}{self.number}{{{self.printed_extent}}}{self.printed_suffix}"
        extent = self.display if self.display is not None else str(self._extent)
        if self.expanded is not None:
            extent = f"{extent} ex {self.expanded}"
        return f"{self.iter_type.value}{self.parallel_type}{self.number}{{{extent}}}"

    __repr__ = __str__


# ---------------------------------------------------------------------------


class Val:
    __slots__ = ("fusion", "definition", "uses")

    def __init__(self, fusion: "Fusion"):
        self.fusion = fusion
        self.definition: Optional[Expr] = None
        self.uses: list[Expr] = []


class Scalar(Val):
    """A scalar: a constant, a symbolic fusion input, or computed by an Expr
    (`fd.ops.size`, scalar arithmetic). `extent_size` is the symbolic extent
    it equals when known (so reshapes by `fd.ops.size(x, 0)` stay symbolic)."""

    __slots__ = ("_dtype", "value", "name", "extent_size")

    def __init__(self, fusion, dtype: DataType, value=None, name: Optional[str] = None):
        super().__init__(fusion)
        self._dtype = dtype
        self.value = value
        self.name = name
        self.extent_size: Optional[Size] = None
        if isinstance(value, bool):
            pass
        elif isinstance(value, int):
            self.extent_size = Size(value)

    def dtype(self) -> DataType:
        return self._dtype

    def is_symbolic(self) -> bool:
        return self.value is None

    def is_const(self) -> bool:
        return self.value is not None and self.definition is None

    def as_size(self) -> Size:
        """This scalar as an extent, for shapes given as scalars."""
        if self.extent_size is None:
            sym = Sym(self.fusion.new_symbol_name(), definition=self)
            self.extent_size = Size.of(sym)
        return self.extent_size

    def __str__(self) -> str:
        if self.value is not None and self.definition is None:
            if isinstance(self.value, bool):
                return "true" if self.value else "false"
            if self._dtype == DataType.Float:
                return f"float({self.value:.9g})"
            if self._dtype == DataType.Double or isinstance(self.value, float):
                # C++ streams at max_digits10, as nvFuser prints: double(1), double(0.044714999999999998)
                return f"double({self.value:.17g})"
            return str(self.value)
        return self.name or "s?"

    def __repr__(self) -> str:
        return self.__str__()  # (compiled, `__repr__ = __str__` did not take on this subclass)


class TensorView(Val):
    __slots__ = (
        "number", "_dtype", "logical", "loop", "_non_reduction", "mesh", "sharding_priority", "allocation",
        "contiguity", "stride_order", "is_cpu", "memory_type", "printed_memory"
    )

    def __init__(self, fusion, number: int, dtype: DataType, logical: list[IterDomain]):
        super().__init__(fusion)
        self.number = number
        self._dtype = dtype
        self.logical = logical
        for axis, id_ in enumerate(logical):
            id_.logical_axis = axis
            id_.owner = self
        self.loop: list[IterDomain] = list(logical)
        self._non_reduction = None
        self.mesh = None
        self.sharding_priority: Optional[int] = None
        self.allocation = None
        self.contiguity = None
        self.stride_order = None
        self.is_cpu = False
        self.memory_type = None
        self.printed_memory = "g"  # printed T0_g_...; a fusion read from real nvFuser keeps its "l" (local)

    # -- nvfuser_direct API ----------------------------------------------------
    def dtype(self) -> DataType:
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self.non_reduction_axes())

    def num_dims(self) -> int:
        return len(self.loop)

    def axis(self, index: int) -> IterDomain:
        n = len(self.loop)
        if not -n <= index < n:
            raise NvShardError(
                f"{self.short_name()}: axis({index}) is out of range; its loop domain has {n} axes"
            )
        return self.loop[index]

    def domain(self):
        return _Domain(self.loop)

    def get_logical_domain(self) -> list[IterDomain]:
        return list(self.logical)

    def get_loop_domain(self) -> list[IterDomain]:
        return list(self.loop)

    def set_device_mesh(self, mesh) -> None:
        from ..multidevice.mesh import DeviceMesh

        if not isinstance(mesh, DeviceMesh):
            raise NvShardError(f"{self.short_name()}: set_device_mesh expects a DeviceMesh, got {mesh!r}")
        previous, self.mesh = self.mesh, mesh
        try:
            for id_ in self.loop:
                if id_.is_device_dim():
                    self._check_mesh_axis(id_, id_.parallel_type)
        except NvShardError:
            self.mesh = previous  # a rejected mesh leaves the tensor as it was
            raise

    def set_sharding_priority(self, priority: int) -> None:
        """Lower numbers propagate first (0 is the highest priority), as in Shardy."""
        if not isinstance(priority, int) or priority < 0:
            raise NvShardError(f"{self.short_name()}: sharding priority must be an int >= 0, got {priority!r}")
        self.sharding_priority = priority

    def outer_split(self, axis: int, factor: int) -> None:
        self._split(axis, factor, inner=False)

    def inner_split(self, axis: int, factor: int) -> None:
        self._split(axis, factor, inner=True)

    def split(self, axis: int, factor: int, inner_split: bool = True) -> None:
        self._split(axis, factor, inner=inner_split)

    def reorder(self, old2new: dict) -> None:
        n = len(self.loop)
        norm = {}
        for old, new in old2new.items():
            for v in (old, new):
                if not -n <= v < n:
                    raise NvShardError(f"{self.short_name()}: reorder position {v} is out of range for {n} loop axes")
            norm[old % n] = new % n
        if len(set(norm.values())) != len(norm):
            raise NvShardError(f"{self.short_name()}: reorder {old2new} maps two axes to one position")
        result: list = [None] * n
        for old, new in norm.items():
            result[new] = self.loop[old]
        rest = iter(id_ for i, id_ in enumerate(self.loop) if i not in norm)
        self.loop = [r if r is not None else next(rest) for r in result]

    def swizzle1d(self, axis: int, parallel_type: ParallelType) -> "TensorView":
        """Rotate loop axis `axis` by the device index of `parallel_type`: on the
        device at coordinate c, iteration i visits (i + c) mod extent (a ring,
        so each device starts with its own chunk when the axis is stream-
        parallel). The values computed do not change; the order does."""
        n = len(self.loop)
        if not -n <= axis < n:
            raise NvShardError(f"{self.short_name()}: swizzle1d axis {axis} is out of range; the loop domain has {n} axes")
        if not isinstance(parallel_type, ParallelType) or parallel_type.mesh_axis is None:
            raise NvShardError(f"{self.short_name()}: swizzle1d needs a device parallel type (mesh_x/y/z), "
                               f"got {parallel_type!r}")
        if self.mesh is None or parallel_type.mesh_axis not in self.mesh.axis_names:
            raise NvShardError(f"{self.short_name()}: swizzle1d over {parallel_type} needs a device mesh with that "
                               f"axis; set_device_mesh first (mesh: {self.mesh})")
        old = self.loop[axis % n]
        new = IterDomain(self.fusion.next_id_number(), old.extent(), old.iter_type, old.expanded, old.logical_axis,
                         old.path, old.is_remainder, old.display)
        new.owner = self
        new.swizzle = parallel_type
        self.loop[axis % n] = new
        return self

    def set_memory_type(self, memory_type) -> None:
        if not isinstance(memory_type, MemoryType):
            raise NvShardError(f"{self.short_name()}: set_memory_type expects a MemoryType, got {memory_type!r}")
        if memory_type is MemoryType.symmetric and not torch.cuda.is_available():
            raise CudaRequiredError(f"needs CUDA: {self.short_name()} in symmetric memory (CUDA IPC / NVSHMEM)")
        self.memory_type = memory_type

    def set_allocation_domain(self, ids, contiguity) -> None:
        self.allocation = list(ids)
        self.contiguity = contiguity

    def rfactor(self, axes) -> "TensorView":
        """Accepted for compatibility: nvshard keeps partial sums as state of the
        reduction axes, so the split that rfactor makes explicit is implicit."""
        for a in axes:
            if not self.axis(a).is_reduction():
                raise NvShardError(f"{self.short_name()}: rfactor axis {a} is not a reduction axis")
        return self

    # -- helpers -----------------------------------------------------------------
    def short_name(self) -> str:
        return f"T{self.number}"

    def non_reduction_axes(self) -> list[int]:
        # the logical domain never changes once built
        if self._non_reduction is None:
            self._non_reduction = [i for i, id_ in enumerate(self.logical) if not id_.is_reduction()]
        return self._non_reduction

    def has_device_mesh(self) -> bool:
        return self.mesh is not None

    def is_fusion_input(self) -> bool:
        return self in self.fusion._inputs

    def is_fusion_output(self) -> bool:
        return self in self.fusion._outputs

    def layouts(self) -> list:
        """Per logical axis, the layout its loop domain describes. (Typed
        loops: compiled, every plan reads the layouts of every annotated
        tensor.)"""
        by_axis = []  # per logical axis, its loop leaves
        for axis in range(len(self.logical)):
            by_axis.append([])
        loop = self.loop
        for i in range(len(loop)):
            id_ = loop[i]
            leaves = by_axis[id_.logical_axis]
            leaves.append(id_)
        result = []
        for axis in range(len(by_axis)):
            leaves = by_axis[axis]
            if len(leaves) > 1:
                leaves.sort(key=_path)
            digits = []
            for i in range(len(leaves)):
                leaf = leaves[i]
                # (a device dim's mesh axis is its parallel type's value)
                digits.append(leaf.parallel_type._value_ if leaf.is_device_dim() else leaf.extent())
            result.append(layout.normalize(digits))
        return result

    def _split(self, axis: int, factor, inner: bool) -> None:
        n = len(self.loop)
        if not -n <= axis < n:
            raise NvShardError(f"{self.short_name()}: split axis {axis} is out of range; the loop domain has {n} axes")
        if not isinstance(factor, int) or isinstance(factor, bool) or factor <= 0:
            raise NvShardError(f"{self.short_name()}: split factor must be a positive int, got {factor!r}")
        pos = axis % n
        parent = self.loop[pos]
        if parent.is_device_dim():
            raise NvShardError(f"{self.short_name()}: axis {axis} is already parallelized on {parent.parallel_type}")
        factor_size = Size(factor)
        rest, rest_display = _ceil_div(parent.extent(), factor)
        fusion = self.fusion
        if parent.is_remainder:
            rest_is_remainder = True
        else:
            rest_is_remainder = False
            if parent.extent().divisible_by(factor) is False:
                raise NvShardError(
                    f"{self.short_name()}: cannot split axis {axis} of extent {parent.extent()} by {factor}"
                )
        kind = parent.iter_type
        make = lambda extent, path, remainder, display: IterDomain(  # noqa: E731
            fusion.next_id_number(), extent, kind, None, parent.logical_axis, path, remainder, display
        )
        # nvFuser numbers the inner output first.
        if inner:
            inner_id = make(factor_size, parent.path + (1,), False, None)
            outer_id = make(rest, parent.path + (0,), rest_is_remainder, rest_display)
        else:
            inner_id = make(rest, parent.path + (1,), rest_is_remainder, rest_display)
            outer_id = make(factor_size, parent.path + (0,), False, None)
        for id_ in (outer_id, inner_id):
            id_.owner = self
        self.loop[pos : pos + 1] = [outer_id, inner_id]

    def _check_parallelize(self, id_: IterDomain, parallel_type: ParallelType) -> None:
        if id_ not in self.loop:
            raise NvShardError(f"{self.short_name()}: {id_} is not in the loop domain")
        if parallel_type.mesh_axis is None:
            return
        for other in self.loop:
            if other is not id_ and other.parallel_type is parallel_type and other.is_reduction() == id_.is_reduction():
                raise NvShardError(
                    f"{self.short_name()}: {parallel_type} already parallelizes loop axis "
                    f"{self.loop.index(other)}; a mesh axis can shard only one axis of a tensor"
                )
        self._check_mesh_axis(id_, parallel_type)

    def _check_mesh_axis(self, id_: IterDomain, parallel_type: ParallelType) -> None:
        if self.mesh is None:
            return
        name = parallel_type.mesh_axis
        if name not in self.mesh.axis_names:
            raise NvShardError(
                f"{self.short_name()}: cannot parallelize loop axis {self.loop.index(id_)} on {parallel_type}: "
                f"{self.mesh} has {self.mesh.ndim} dimension(s), axes {', '.join('DID' + a for a in self.mesh.axis_names)}"
            )
        size = self.mesh.axis_size(name)
        value = id_.extent().value
        if value is not None and value != size:
            raise NvShardError(
                f"{self.short_name()}: loop axis {self.loop.index(id_)} has extent {value} but {parallel_type} "
                f"has {size} devices; split it by {size} first"
            )

    def __str__(self) -> str:
        if RENDER_STACK and RENDER_STACK[-1] is not None:
            return RENDER_STACK[-1].render_tv(self)
        return self.plain_str()

    def plain_str(self) -> str:
        ids = ", ".join(str(i) for i in self.loop)
        text = f"T{self.number}_{self.printed_memory}_{self._dtype}[{ids}]"
        if self.mesh is not None:
            text += f" ({self.mesh})"
        return text

    def __repr__(self) -> str:
        return self.__str__()  # (compiled, `__repr__ = __str__` did not take on this subclass)


class _Domain:
    def __init__(self, ids):
        self.ids = ids

    def __str__(self) -> str:
        return "[" + ", ".join(str(i) for i in self.ids) + "]"

    __repr__ = __str__


def _ceil_div(extent: Size, factor: int):
    value = extent.value
    if value is not None:
        return Size(-(-value // factor)), None
    return extent.divided_by(factor), f"( ceilDiv({extent}, {factor}) )"


# ---------------------------------------------------------------------------


class Expr:
    __slots__ = (
        "op", "inputs", "outputs", "attrs", "_rule", "_sized_rules", "tv_inputs", "tv_outputs",
        "broadcast_axes", "origin"
    )

    def __init__(self, op, inputs: list, outputs: list, attrs: Optional[dict] = None):
        self.op = op
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attrs = dict(attrs or {})
        self._rule = None
        self._sized_rules = None
        # its TensorView operands and results (an expr's values never change once it is built)
        self.tv_inputs: list[TensorView] = [v for v in self.inputs if isinstance(v, TensorView)]
        self.tv_outputs: list[TensorView] = [v for v in self.outputs if isinstance(v, TensorView)]
        self.broadcast_axes = None  # (input, axis) pairs, set by ops.common.collapse_broadcasts
        self.origin = self  # the user's expr this one was rewired from

    def rewired(self, inputs: list, outputs: list) -> "Expr":
        """The same op on other values (passes insert communication between)."""
        copy = Expr(self.op, inputs, outputs, self.attrs)
        copy.origin = self.origin
        return copy

    def rule(self, sizes=None):
        """The op's sharding rule; with concrete `sizes` for ops whose rule
        depends on them (how a reshape splits axes, whether a slice is whole)."""
        if sizes is None or not self.op.rule_needs_sizes:
            if self._rule is None:
                self._rule = _without_broadcast_factors(self, self.op.rule(self))
            return self._rule
        # keyed by the sizes the rule looks at, so plans for the same shapes share it
        key = self.op.rule_sizes_key(self, sizes)
        if self._sized_rules is None:
            self._sized_rules = {}
        if key not in self._sized_rules:
            self._sized_rules[key] = _without_broadcast_factors(self, self.op.rule(self, sizes))
        return self._sized_rules[key]

    def __str__(self) -> str:
        return self.op.format(self)

    def __repr__(self) -> str:
        outs = ", ".join(v.short_name() if isinstance(v, TensorView) else str(v) for v in self.outputs)
        return f"<{self.op.name} -> {outs}>"


def _without_broadcast_factors(expr: "Expr", rule):
    """nvFuser never shards a broadcast axis, expanded or not: such an axis
    names no factor, whatever the op's rule says (one guard for every op)."""
    _drop_broadcast_factors(expr.tv_inputs, rule.operands)
    _drop_broadcast_factors(expr.tv_outputs, rule.results)
    return rule


def _drop_broadcast_factors(tvs: list, per_tv: list) -> None:
    """_without_broadcast_factors for one side of the rule (per_tv: the
    factors of each of the tensors' axes it lists)."""
    for i in range(min(len(tvs), len(per_tv))):  # (an index loop: compiled, no tuple per tensor)
        tv = tvs[i]
        axes = per_tv[i]
        logical = tv.logical
        ids = logical if len(axes) == len(logical) else [logical[j] for j in tv.non_reduction_axes()]
        if _names_a_broadcast(ids, axes):
            # a new list: rules may share one list between an operand and a result
            per_tv[i] = [() if id_.is_broadcast() else f for id_, f in zip(ids, axes)]


def _names_a_broadcast(ids, axes) -> bool:
    """Whether a rule names a factor on one of these axes that is a broadcast."""
    for k in range(min(len(ids), len(axes))):  # (an index loop: compiled, the axis typed)
        id_ = ids[k]
        if axes[k] and id_.is_broadcast():
            return True
    return False


class Fusion:
    def __init__(self):
        self._inputs: list[Val] = []
        self._outputs: list[Val] = []
        self.exprs: list[Expr] = []
        self.runtime_syms: list = []  # extents computed from other extents at run time
        self._tv_counter = 0
        self._id_counter = 0
        self._sym_counter = 0
        self._scalar_counter = 0
        self._kept = None  # ((inputs, exprs) counted, {name: value}): see kept()

    # -- nvfuser_direct API ------------------------------------------------------
    def inputs(self) -> list[Val]:
        return list(self._inputs)

    def outputs(self) -> list[Val]:
        return list(self._outputs)

    def print_math(self) -> str:
        from .printer import print_math

        return print_math(self)

    # -- construction --------------------------------------------------------------
    def next_id_number(self) -> int:
        n = self._id_counter
        self._id_counter += 1
        return n

    def new_symbol_name(self) -> str:
        n = self._sym_counter
        self._sym_counter += 1
        return f"i{n}"

    def new_scalar_name(self, dtype: DataType) -> str:
        n = self._scalar_counter
        self._scalar_counter += 1
        prefix = {DataType.Double: "d", DataType.Float: "f", DataType.Bool: "b"}.get(dtype, "i")
        return f"{prefix}s{n}"

    def new_id(self, extent: Size, iter_type=IterType.Iteration, expanded=None) -> IterDomain:
        return IterDomain(self.next_id_number(), extent, iter_type, expanded)

    def new_tv(self, dtype: DataType, ids: list[IterDomain]) -> TensorView:
        tv = TensorView(self, self._tv_counter, dtype, ids)
        self._tv_counter += 1
        return tv

    def add_expr(self, op, inputs, outputs, attrs=None) -> Expr:
        expr = Expr(op, inputs, outputs, attrs)
        for out in outputs:
            out.definition = expr
        for inp in inputs:
            if isinstance(inp, Val) and expr not in inp.uses:
                inp.uses.append(expr)
        self.exprs.append(expr)
        return expr

    def add_input(self, val: Val) -> None:
        self._inputs.append(val)

    def add_output(self, val: Val) -> None:
        if not isinstance(val, TensorView):
            raise NvShardError(f"add_output expects a TensorView, got {val!r}")
        if val.fusion is not self:
            raise NvShardError(f"{val.short_name()} belongs to another fusion")
        self._outputs.append(val)

    def resolve_static_extents(self) -> None:
        """Bind run-time extents (a cat's total, a reshape's -1, a slice's
        length) that later unifications made static, so the plan does not
        depend on which op was defined first."""
        from .sizes import bind_static

        evaluator = _StaticSizes()
        changed = True
        while changed:
            changed = False
            for sym in self.runtime_syms:
                if sym.static_value is not None:
                    continue
                try:
                    value = int(sym.definition(evaluator))
                except _NotStatic:
                    continue
                bind_static(sym, value)
                changed = True

    def kept(self, name: str, make, *args):
        """make(*args), kept with the fusion until it grows: for what is
        derived from its inputs and exprs alone (not from annotations or
        sizes), which every plan of the fusion would derive again. A fusion
        only grows (add_input and add_expr append); callers must not change
        what they get."""
        grown = (len(self._inputs), len(self.exprs))
        if self._kept is None or self._kept[0] != grown:
            self._kept = (grown, {})
        values = self._kept[1]
        if name not in values:
            values[name] = make(*args)
        return values[name]

    def tvs(self) -> list[TensorView]:
        """Every tensor, inputs first, then in definition order."""
        return list(self.kept("tvs", _tensors_of, self))


def _tensors_of(fusion) -> list:
    seen: dict = {}  # insertion-ordered set
    for v in fusion._inputs:
        if isinstance(v, TensorView):
            seen[v] = None
    for e in fusion.exprs:
        for v in e.tv_inputs:
            seen[v] = None
        for v in e.tv_outputs:
            seen[v] = None
    return list(seen)


class _NotStatic(Exception):
    pass


class _StaticSizes:
    """Answers size queries with static extents only (see resolve_static_extents)."""

    def evaluate_size(self, size) -> int:
        value = size.value
        if value is None:
            raise _NotStatic
        return value

    def global_extent(self, tv, axis: int) -> int:
        id_ = tv.logical[tv.non_reduction_axes()[axis]]
        return self.evaluate_size(id_.expanded if id_.is_broadcast() and id_.expanded is not None else id_.extent())

    def scalar(self, value):
        if isinstance(value, Scalar):
            if value.extent_size is not None and value.extent_size.value is not None:
                return value.extent_size.value
            if value.is_const():
                return value.value
            raise _NotStatic
        return value
