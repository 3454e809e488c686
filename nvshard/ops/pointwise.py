"""Elementwise ops: unary, binary, where, cast, set, stride_order.

Rule: every result axis is a pass-through factor; operands map right-aligned
(nvFuser broadcasts lower-rank operands from the left); size-1 broadcast
axes map to no factor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ir.dtypes import DataType
from ..ir.nodes import NvShardError, Scalar, TensorView
from ..ir.sizes import Size
from . import common
from .registry import OpSpec, frontend, register


def _scalar_result(fusion, spec, operands, dtype):
    out = Scalar(fusion, dtype, None, fusion.new_scalar_name(dtype))
    fusion.add_expr(spec, operands, [out])
    return out


def _tensor_result(fusion, spec, operands, dtype, op_name, attrs=None):
    tvs = [o for o in operands if isinstance(o, TensorView)]
    ids = common.broadcast_output_ids(fusion, tvs, op_name)
    out = fusion.new_tv(dtype, ids)
    fusion.add_expr(spec, operands, [out], attrs)
    return out


def _to_torch(value):
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.float64)  # a Python float is a double: keep its precision
    return value if isinstance(value, torch.Tensor) else torch.tensor(value)


def _finish(result, out, args, ctx=None):
    """Cast to the result dtype; scalar results go back to Python numbers.
    Expanded broadcast axes, computed at extent 1, come back expanded."""
    if isinstance(out, Scalar):
        value = _to_torch(result).to(out.dtype().torch_dtype)
        return value.item()
    if ctx is not None and any(i.expanded is not None for i in common.logical_shape(out)):
        result = result.expand(ctx.out_shape(0))
    return common.to_dtype(result, out.dtype())


# -- unary ---------------------------------------------------------------------


class UnaryOp(OpSpec):
    """float_result: integers and reduced precision become Float (nvFuser's
    float ops); promotes: reduced precision becomes Float (neg); neither:
    the dtype stays (relu, silu)."""

    def __init__(self, name, fn, printed, float_result: bool, inline: bool = False, promotes: bool = False):
        super().__init__(name)
        self.fn = fn
        self.printed = printed
        self.float_result = float_result
        self.inline = inline
        self.promotes = promotes

    def define(self, x):
        fusion = common.current_fusion(x)
        x = common.as_val(fusion, x)
        dtype = x.dtype()
        if self.float_result and not dtype.is_floating:
            dtype = DataType.Float
        if self.promotes and dtype.is_reduced_precision:
            dtype = DataType.Float
        if isinstance(x, Scalar):
            return _scalar_result(fusion, self, [x], dtype)
        return _tensor_result(fusion, self, [x], dtype, self.name)

    def rule(self, expr):
        return common.pointwise_rule(expr)

    def evaluate(self, expr, args, ctx):
        out = expr.outputs[0]
        args = common.collapse_broadcasts(expr, args)
        x = common.upcast(_to_torch(args[0]), out.dtype())
        if not x.is_floating_point() and self.float_result:
            x = x.to(torch.float32)
        return [_finish(self.fn(x), out, args, ctx)]

    def format(self, expr):
        out, x = expr.outputs[0], expr.inputs[0]
        if isinstance(out, Scalar):
            return f"{out} = {self.printed}{x};\n" if self.inline else f"{out} = {self.printed}({x});\n"
        name = self.printed
        if not self.inline and out.dtype() == DataType.Float and self.float_result and name in ("rsqrt", "tanh"):
            name += "f"
        rhs = f"{name}{x}" if self.inline else f"{name}({x})"
        return f"{out}\n   = {rhs};\n"


_UNARY = [  # name, torch function, printed, float_result, inline
    ("relu", torch.relu, "relu", False, False),
    ("neg", torch.neg, "-", False, True),
    ("rsqrt", torch.rsqrt, "rsqrt", True, False),
    ("sigmoid", torch.sigmoid, "sigmoid", True, False),
    ("silu", F.silu, "silu", True, False),
    ("tanh", torch.tanh, "tanh", True, False),
    ("reciprocal", torch.reciprocal, "reciprocal", True, False),
]

# nvFuser defines these without type promotion: bf16 in, bf16 out.
_KEEP_REDUCED_PRECISION = {"relu", "silu"}

for _name, _fn, _printed, _float, _inline in _UNARY:
    _spec = register(UnaryOp(_name, _fn, _printed, _float, _inline, promotes=_name not in _KEEP_REDUCED_PRECISION))
    frontend(_name)(_spec.define)


# -- cast / set / stride_order -------------------------------------------------


_CAST_NAMES = {DataType.Half: "half", DataType.BFloat16: "bfloat", DataType.Float: "float",
               DataType.Double: "double", DataType.Int32: "int32", DataType.Int: "int", DataType.Bool: "bool",
               DataType.Index: "index", DataType.UInt64: "uint"}
_TO_NAMES = {**_CAST_NAMES, DataType.Int: "int64", DataType.UInt64: "uint64"}


def _cast_function(src: DataType, dst: DataType) -> str:
    """nvFuser's cast function names: __bfloat2float to or from a reduced
    precision type, else __to_float, __to_double, __to_int64, ..."""
    if src.is_reduced_precision or dst.is_reduced_precision:
        return f"__{_CAST_NAMES[src]}2{_CAST_NAMES[dst]}"
    return f"__to_{_TO_NAMES[dst]}"


class CastOp(OpSpec):
    def __init__(self):
        super().__init__("cast")

    def define(self, arg, dtype):
        if not isinstance(dtype, DataType) or dtype is DataType.Null:
            raise NvShardError(f"cast: dtype must be a DataType, got {dtype!r}")
        fusion = common.current_fusion(arg)
        arg = common.as_val(fusion, arg)
        if arg.dtype() == dtype:
            # nvFuser's castOp: a cast to the same dtype is a set (scalars stay as they are)
            return arg if isinstance(arg, Scalar) else _set.define(arg)
        if isinstance(arg, Scalar):
            return _scalar_result(fusion, self, [arg], dtype)
        return _tensor_result(fusion, self, [arg], dtype, "cast")

    def rule(self, expr):
        return common.pointwise_rule(expr)

    def evaluate(self, expr, args, ctx):
        return [_finish(_to_torch(args[0]), expr.outputs[0], args, ctx)]

    def format(self, expr):
        out, x = expr.outputs[0], expr.inputs[0]
        if isinstance(out, Scalar):
            return f"{out} = {_cast_function(x.dtype(), out.dtype())}({x});\n"
        return f"{out}\n   = {_cast_function(x.dtype(), out.dtype())}({x});\n"


class SetOp(OpSpec):
    """nvFuser's LoadStoreOp: a copy. stride_order is a copy with a new
    allocation order, which sharding ignores."""

    def __init__(self, name):
        super().__init__(name)

    def define(self, arg, stride_order=None):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, self.name, "arg")
        if stride_order is not None and len(stride_order) == 0:
            stride_order = None  # translate_fusion (0.2.36) prints the default order as []
        if stride_order is not None:
            rank = arg.ndim
            if sorted(stride_order) != list(range(rank)):
                raise NvShardError(
                    f"stride_order: {list(stride_order)} is not a permutation of 0..{rank - 1} for {arg.short_name()}"
                )
        ids = common.strip_reductions(fusion, arg)
        out = fusion.new_tv(arg.dtype(), ids)
        out.stride_order = list(stride_order) if stride_order is not None else None
        fusion.add_expr(self, [arg], [out])
        return out

    def rule(self, expr):
        return common.identity_rule(expr)

    def evaluate(self, expr, args, ctx):
        order = expr.outputs[0].stride_order
        if order is None:
            # nvFuser copies; the executor never writes a tensor in place, so
            # the same tensor is the same value without the copy
            return [args[0]]
        # Allocate as nvFuser does: the axis with the highest order is outermost.
        outer_first = sorted(range(len(order)), key=lambda i: -order[i])
        dense = args[0].permute(outer_first).clone(memory_format=torch.contiguous_format)
        return [dense.permute([outer_first.index(i) for i in range(len(order))])]

    def format(self, expr):
        return common.fmt_call(expr, "Set", [str(expr.inputs[0])], "cache_op=Streaming")


_cast = register(CastOp())
frontend("cast")(_cast.define)
_set = register(SetOp("set"))
frontend("set")(_set.define)
_stride_order = register(SetOp("stride_order"))
frontend("stride_order")(lambda arg, stride_order: _stride_order.define(arg, stride_order))


# -- binary ----------------------------------------------------------------------


class BinaryOp(OpSpec):
    def __init__(self, name, fn, printed, inline: bool, bool_result: bool = False):
        super().__init__(name)
        self.fn = fn
        self.printed = printed
        self.inline = inline
        self.bool_result = bool_result

    def define(self, lhs, rhs):
        fusion = common.current_fusion(lhs, rhs)
        a, b = common.as_val(fusion, lhs), common.as_val(fusion, rhs)
        dtype = DataType.Bool if self.bool_result else common.result_dtype([a, b], reduced_to_float=True)
        if not isinstance(a, TensorView) and not isinstance(b, TensorView):
            out = _scalar_result(fusion, self, [a, b], dtype)
            if self.name == "mul" and a.extent_size is not None and b.extent_size is not None:
                out.extent_size = a.extent_size * b.extent_size
            return out
        return _tensor_result(fusion, self, [a, b], dtype, self.name)

    def rule(self, expr):
        return common.pointwise_rule(expr)

    def evaluate(self, expr, args, ctx):
        out = expr.outputs[0]
        args = common.collapse_broadcasts(expr, args)
        if self.bool_result:
            compute = common.result_dtype(expr.inputs)
        else:
            compute = out.dtype()
        a = common.upcast(args[0], compute)
        b = common.upcast(args[1], compute)
        if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
            a = torch.tensor(a, dtype=compute.torch_dtype)  # scalar arithmetic in the result's dtype
        elif not isinstance(a, torch.Tensor):
            # torch.lt and friends take no Python number first; a 0-dim tensor
            # promotes like one (double keeps a float scalar's precision).
            a = torch.tensor(a, dtype=torch.float64 if isinstance(a, float) else None)
        return [_finish(self.fn(a, b), out, args, ctx)]

    def format(self, expr):
        out, a, b = expr.outputs[0], expr.inputs[0], expr.inputs[1]
        if isinstance(out, Scalar):
            return f"{out} = {a} {self.printed} {b};\n" if self.inline else f"{out} = {self.printed}({a}, {b});\n"
        if self.inline:
            return f"{out}\n   = {a}\n   {self.printed} {b};\n"
        return f"{out}\n   = {self.printed}({a}\n  , {b});\n"


_BINARY = [
    ("add", torch.add, "+", True, False),
    ("sub", torch.sub, "-", True, False),
    ("mul", torch.mul, "*", True, False),
    ("pow", torch.pow, "pow", False, False),
    ("lt", torch.lt, "<", True, True),
    ("le", torch.le, "<=", True, True),
    ("gt", torch.gt, ">", True, True),
    ("ge", torch.ge, ">=", True, True),
    ("eq", torch.eq, "==", True, True),
    ("ne", torch.ne, "!=", True, True),
]

for _name, _fn, _printed, _inline, _bool in _BINARY:
    _spec = register(BinaryOp(_name, _fn, _printed, _inline, _bool))
    frontend(_name)(_spec.define)


# -- where -----------------------------------------------------------------------------


class WhereOp(OpSpec):
    def __init__(self):
        super().__init__("where")

    def define(self, pred, value_if_true, value_if_false):
        fusion = common.current_fusion(pred, value_if_true, value_if_false)
        c, a, b = (common.as_val(fusion, v) for v in (pred, value_if_true, value_if_false))
        dtype = common.result_dtype([a, b])
        if not any(isinstance(v, TensorView) for v in (c, a, b)):
            return _scalar_result(fusion, self, [c, a, b], dtype)
        return _tensor_result(fusion, self, [c, a, b], dtype, "where")

    def rule(self, expr):
        return common.pointwise_rule(expr)

    def evaluate(self, expr, args, ctx):
        out = expr.outputs[0]
        args = common.collapse_broadcasts(expr, args)
        c = _to_torch(args[0]).bool()
        a = common.upcast(args[1], out.dtype())
        b = common.upcast(args[2], out.dtype())
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            common_dtype = torch.promote_types(a.dtype, b.dtype)
            a, b = a.to(common_dtype), b.to(common_dtype)
        elif isinstance(a, torch.Tensor):
            b = torch.tensor(b, dtype=a.dtype)
        elif isinstance(b, torch.Tensor):
            a = torch.tensor(a, dtype=b.dtype)
        else:
            a, b = torch.tensor(a), torch.tensor(b)
        return [_finish(torch.where(c, a, b), out, args, ctx)]

    def format(self, expr):
        out, c, a, b = expr.outputs[0], *expr.inputs
        if isinstance(out, Scalar):
            return f"{out} = where({c}, {a}, {b});\n"
        return f"{out}\n   = where({c}\n  , {a}\n  , {b});\n"


_where = register(WhereOp())
frontend("where")(_where.define)

__all__ = ["UnaryOp", "BinaryOp", "WhereOp", "CastOp", "SetOp", "Size"]
