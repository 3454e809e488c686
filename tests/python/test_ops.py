"""Per-op numerics: every fd.op (the ops upstream's multidevice tests use) against torch, in one process.

Reduced precision follows nvFuser: kernels compute in float and cast the
result, so bf16 references compute in float and cast the same way.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition

BF16 = torch.bfloat16


def _dtype(t) -> DataType:
    return DataType.from_torch(t.dtype)


def define_inputs(fd, inputs, static=False):
    """A fusion input per value: tensors get -1 extents (or their sizes when
    `static`), extent-1 axes are broadcast axes; Python numbers become
    symbolic scalar inputs."""
    vals = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            shape = [1 if n == 1 else (n if static else -1) for n in x.shape]
            vals.append(fd.define_tensor(shape, dtype=_dtype(x), contiguity=True))
        elif isinstance(x, bool):
            vals.append(fd.define_scalar(DataType.Bool))
        elif isinstance(x, int):
            vals.append(fd.define_scalar(DataType.Int))
        else:
            vals.append(fd.define_scalar(DataType.Double))
    return vals


def run(build, inputs, static=False):
    """Define a fusion whose outputs are `build(fd, *inputs)` and execute it."""
    with FusionDefinition() as fd:
        vals = define_inputs(fd, inputs, static)
        outs = build(fd, *vals)
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        for o in outs:
            fd.add_output(o)
    results = fd.execute(list(inputs))
    assert len(results) == len(outs)
    for r, o in zip(results, outs):
        assert r.dtype == o.dtype().torch_dtype, f"{o.short_name()} is {o.dtype()} but the result is {r.dtype}"
    return results


def close(actual, expected, **tol):
    """Same shape and dtype, values close."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    torch.testing.assert_close(actual, expected, **tol)


def in_float(fn, *tensors, out_dtype=None):
    """nvFuser's reduced-precision reference: compute in float, cast back."""
    dtype = out_dtype or tensors[0].dtype
    up = [t.float() if isinstance(t, torch.Tensor) and t.dtype in (BF16, torch.float16) else t for t in tensors]
    return fn(*up).to(dtype)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# -- unary -------------------------------------------------------------------------------

UNARY = {
    "relu": torch.relu,
    "neg": torch.neg,
    "rsqrt": torch.rsqrt,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "tanh": torch.tanh,
    "reciprocal": torch.reciprocal,
}
POSITIVE_ONLY = {"rsqrt", "reciprocal"}


def _unary_input(name, shape, dtype):
    x = torch.randn(shape, dtype=torch.float32)
    if name in POSITIVE_ONLY:
        x = x.abs() + 0.5
    return x.to(dtype)


@pytest.mark.parametrize("static", [False, True], ids=["symbolic", "static"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float(name, static):
    x = _unary_input(name, (3, 5), torch.float32)
    (out,) = run(lambda fd, a: getattr(fd.ops, name)(a), [x], static)
    close(out, UNARY[name](x))


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_bf16(name):
    # nvFuser: neg and the float ops compute and return Float; relu and silu keep bf16.
    x = _unary_input(name, (4, 6), BF16)
    (out,) = run(lambda fd, a: getattr(fd.ops, name)(a), [x])
    out_dtype = BF16 if name in ("relu", "silu") else torch.float32
    close(out, in_float(UNARY[name], x, out_dtype=out_dtype), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("name", ["relu", "neg"])
def test_unary_int_keeps_dtype(name):
    x = torch.randint(-5, 5, (7,), dtype=torch.int64)
    (out,) = run(lambda fd, a: getattr(fd.ops, name)(a), [x])
    close(out, UNARY[name](x))


@pytest.mark.parametrize("name", ["rsqrt", "sigmoid", "tanh", "reciprocal"])
def test_unary_int_computes_in_float(name):
    x = torch.randint(1, 9, (7,), dtype=torch.int64)
    (out,) = run(lambda fd, a: getattr(fd.ops, name)(a), [x])
    close(out, UNARY[name](x.float()))


def test_unary_of_scalar_input():
    # A unary op on a symbolic scalar, broadcast into a tensor op.
    x = torch.randn(4)
    (out,) = run(lambda fd, t, s: fd.ops.mul(t, fd.ops.neg(fd.ops.reciprocal(s))), [x, 4.0])
    close(out, x * -0.25)


def test_unary_rank0_and_rank3():
    x = torch.randn(2, 3, 4)
    s = torch.tensor(0.7)
    out3, out0 = run(lambda fd, a, b: [fd.ops.tanh(a), fd.ops.sigmoid(b)], [x, s])
    close(out3, torch.tanh(x))
    close(out0, torch.sigmoid(s))


# -- binary ------------------------------------------------------------------------------

BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "pow": torch.pow,
    "lt": torch.lt,
}

# (lhs shape, rhs shape): same shapes, right-aligned rank mismatch, size-1 axes
BROADCAST_SHAPES = [
    ((3, 4), (3, 4)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 3, 4)),
    ((2, 3, 4), (3, 4)),
    ((3, 1), (1, 4)),
    ((2, 1, 4), (3, 1)),
    ((1, 1), (5,)),
]


def _binary_operands(name, a_shape, b_shape, dtype):
    a = torch.randn(a_shape).to(dtype)
    b = torch.randn(b_shape).to(dtype)
    if name == "pow":
        a = (a.float().abs() + 0.5).to(dtype)
    return a, b


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=lambda s: f"{list(s[0])}x{list(s[1])}")
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcasting(name, shapes):
    a, b = _binary_operands(name, *shapes, torch.float32)
    (out,) = run(lambda fd, x, y: getattr(fd.ops, name)(x, y), [a, b])
    close(out, BINARY[name](a, b))


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_static_shapes(name):
    a, b = _binary_operands(name, (2, 1, 4), (3, 4), torch.float32)
    (out,) = run(lambda fd, x, y: getattr(fd.ops, name)(x, y), [a, b], static=True)
    close(out, BINARY[name](a, b))


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_bf16(name):
    a, b = _binary_operands(name, (3, 8), (8,), BF16)
    (out,) = run(lambda fd, x, y: getattr(fd.ops, name)(x, y), [a, b])
    # nvFuser's arithmetic computes and returns Float for reduced-precision operands
    expected = in_float(BINARY[name], a, b, out_dtype=torch.bool if name == "lt" else torch.float32)
    close(out, expected, atol=1e-2, rtol=1e-2)


def test_binary_bf16_with_float_promotes():
    a = torch.randn(3, 4).to(BF16)
    b = torch.randn(3, 4)
    (out,) = run(lambda fd, x, y: fd.ops.mul(x, y), [a, b])
    close(out, a.float() * b)


@pytest.mark.parametrize("scalar", [2, 0.5, -1.5])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_python_scalar(name, scalar):
    a, _ = _binary_operands(name, (3, 4), (1,), torch.float32)
    fn = BINARY[name]
    lhs, rhs = run(lambda fd, x: [getattr(fd.ops, name)(x, scalar), getattr(fd.ops, name)(scalar, x)], [a])
    close(lhs, fn(a, scalar))
    if name == "pow":
        # a negative base with a fractional exponent is nan in both
        close(rhs, fn(torch.tensor(float(scalar)), a), equal_nan=True)
    else:
        close(rhs, fn(torch.full_like(a, scalar), a))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "lt"])
def test_binary_define_scalar_constant(name):
    a = torch.randn(2, 5)
    (out,) = run(lambda fd, x: getattr(fd.ops, name)(x, fd.define_scalar(0.25, dtype=DataType.Double)), [a])
    close(out, BINARY[name](a, 0.25))


@pytest.mark.parametrize("value", [3.0, -0.5])
@pytest.mark.parametrize("name", ["add", "sub", "mul", "pow", "lt"])
def test_binary_symbolic_scalar_input(name, value):
    a = torch.rand(2, 5) + 0.5
    (out,) = run(lambda fd, x, s: getattr(fd.ops, name)(x, s), [a, value])
    close(out, BINARY[name](a, value))


def test_symbolic_scalar_changes_between_executions():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        s = fd.define_scalar(DataType.Double)
        fd.add_output(fd.ops.mul(x, s))
    a = torch.randn(6)
    close(fd.execute([a, 2.0])[0], a * 2.0)
    close(fd.execute([a, -3.0])[0], a * -3.0)
    close(fd.execute([a, torch.tensor(0.5)])[0], a * 0.5)


def test_scalar_arithmetic_before_tensor_op():
    a = torch.randn(4, 3)
    (out,) = run(lambda fd, x, s, t: fd.ops.add(x, fd.ops.mul(fd.ops.add(s, t), 2.0)), [a, 1.5, 2])
    close(out, a + (1.5 + 2) * 2.0)


def test_scalar_arithmetic_keeps_double_precision():
    # Scalars are doubles (or int64): 0.1 must not pass through float32.
    x = torch.randn(5, dtype=torch.float64)

    def build(fd, a, s):
        factor = fd.ops.mul(fd.ops.size(a, 0), 0.1)  # int * double
        return fd.ops.mul(fd.ops.mul(a, factor), fd.ops.neg(fd.ops.reciprocal(s)))

    (out,) = run(build, [x, 0.3])
    torch.testing.assert_close(out, x * (5 * 0.1) * -(1 / 0.3), rtol=1e-15, atol=0)


def test_int_tensor_with_float_scalar_promotes_to_float():
    a = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    add_f, add_i, lt = run(lambda fd, x: [fd.ops.add(x, 0.5), fd.ops.mul(x, 3), fd.ops.lt(x, 2.5)], [a])
    close(add_f, a + 0.5)
    close(add_i, a * 3)
    close(lt, a < 2.5)


def test_int32_and_int64_promote():
    a = torch.arange(6, dtype=torch.int32)
    b = torch.arange(6, dtype=torch.int64)
    (out,) = run(lambda fd, x, y: fd.ops.add(x, y), [a, b])
    close(out, a + b)


def test_bf16_with_python_scalar_computes_in_float():
    a = torch.randn(4, 4).to(BF16)
    (out,) = run(lambda fd, x: fd.ops.mul(fd.ops.add(x, 1.0), 3.0), [a])
    close(out, (a.float() + 1.0) * 3.0)


def test_broadcast_axes_of_define_tensor():
    # define_tensor with 1 makes a broadcast axis; it broadcasts against any extent.
    a = torch.randn(3, 1, 5)
    b = torch.randn(1, 4, 1)
    (out,) = run(lambda fd, x, y: fd.ops.sub(x, y), [a, b])
    close(out, a - b)


def test_pointwise_chain_rank_mismatch():
    a, b, c = torch.randn(2, 3, 4), torch.randn(4), torch.randn(3, 1)
    (out,) = run(lambda fd, x, y, z: fd.ops.mul(fd.ops.add(x, y), z), [a, b, c])
    close(out, (a + b) * c)



def _expanded(fd, a, rows=4):
    return fd.ops.broadcast_in_dim(a, shape=[rows, fd.ops.size(a, 0)], broadcast_dims=[1])


@pytest.mark.parametrize("op", ["neg", "mul_scalar", "add_expanded", "cast", "where"])
def test_pointwise_keeps_expanded_extent(op):
    # An expanded broadcast axis keeps its extent through pointwise ops.
    x = torch.randn(3)
    build = {
        "neg": lambda fd, a: fd.ops.neg(_expanded(fd, a)),
        "mul_scalar": lambda fd, a: fd.ops.mul(_expanded(fd, a), 2.0),
        "add_expanded": lambda fd, a: fd.ops.add(_expanded(fd, a), _expanded(fd, a)),
        "cast": lambda fd, a: fd.ops.cast(_expanded(fd, a), DataType.Double),
        "where": lambda fd, a: fd.ops.where(fd.ops.lt(_expanded(fd, a), 0.0), 0.0, _expanded(fd, a)),
    }[op]
    expected = {
        "neg": -x, "mul_scalar": 2 * x, "add_expanded": x + x, "cast": x.double(), "where": x.clamp(min=0),
    }[op]
    (out,) = run(build, [x])
    close(out, expected.expand(4, 3))


def test_expanded_operand_against_full_tensor_and_sum():
    x, y = torch.randn(3), torch.randn(4, 3)
    out, total = run(lambda fd, a, b: [fd.ops.sub(b, _expanded(fd, a)), fd.ops.sum(_expanded(fd, a), [0])], [x, y])
    close(out, y - x)
    close(total, 4 * x)

# -- where -------------------------------------------------------------------------------


def test_where_tensors():
    c = torch.randn(3, 4) > 0
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    (out,) = run(lambda fd, p, x, y: fd.ops.where(p, x, y), [c, a, b])
    close(out, torch.where(c, a, b))


@pytest.mark.parametrize("branch", ["true", "false"])
def test_where_scalar_branch(branch):
    c = torch.randn(3, 4) > 0
    a = torch.randn(3, 4)
    if branch == "true":
        (out,) = run(lambda fd, p, x: fd.ops.where(p, 2.5, x), [c, a])
        close(out, torch.where(c, torch.tensor(2.5), a))
    else:
        (out,) = run(lambda fd, p, x: fd.ops.where(p, x, 0.0), [c, a])
        close(out, torch.where(c, a, torch.tensor(0.0)))


def test_where_broadcast_predicate_and_symbolic_scalar():
    c = torch.randn(3, 1) > 0
    a = torch.randn(2, 3, 4)
    (out,) = run(lambda fd, p, x, s: fd.ops.where(p, x, s), [c, a, -7.0])
    close(out, torch.where(c, a, torch.tensor(-7.0)))


def test_where_bf16_with_scalar():
    c = torch.randn(4, 4) > 0
    a = torch.randn(4, 4).to(BF16)
    (out,) = run(lambda fd, p, x: fd.ops.where(p, x, 0.0), [c, a])
    close(out, torch.where(c, a, torch.zeros((), dtype=BF16)))


def test_where_predicate_from_lt():
    a = torch.randn(5, 6)
    (out,) = run(lambda fd, x: fd.ops.where(fd.ops.lt(x, 0.0), fd.ops.neg(x), x), [a])
    close(out, a.abs())


def test_where_mixed_dtypes_promote():
    c = torch.randn(4) > 0
    a = torch.randn(4).to(BF16)
    b = torch.randn(4)
    (out,) = run(lambda fd, p, x, y: fd.ops.where(p, x, y), [c, a, b])
    close(out, torch.where(c, a.float(), b))


# -- cast / set / stride_order ------------------------------------------------------------

CASTS = [
    (torch.float32, DataType.BFloat16),
    (torch.bfloat16, DataType.Float),
    (torch.float32, DataType.Half),
    (torch.float32, DataType.Double),
    (torch.float32, DataType.Int),
    (torch.float32, DataType.Int32),
    (torch.int64, DataType.Float),
    (torch.bool, DataType.Float),
    (torch.float32, DataType.Bool),
    (torch.float32, DataType.Float),  # a set
    (torch.bfloat16, DataType.BFloat16),
]


@pytest.mark.parametrize("src,dst", CASTS, ids=lambda v: str(v))
def test_cast(src, dst):
    x = (torch.randn(3, 5) * 4).to(src) if src != torch.bool else torch.randn(3, 5) > 0
    (out,) = run(lambda fd, a: fd.ops.cast(a, dtype=dst), [x])
    close(out, x.to(dst.torch_dtype))


def test_cast_positional_and_roundtrip_rounds():
    x = torch.randn(64)
    (out,) = run(lambda fd, a: fd.ops.cast(fd.ops.cast(a, DataType.BFloat16), DataType.Float), [x])
    close(out, x.to(BF16).float())
    assert not torch.equal(out, x)  # bf16 really rounds


def test_set_copies():
    x = torch.randn(2, 3)
    (out,) = run(lambda fd, a: fd.ops.set(a), [x])
    close(out, x)
    assert out.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("order", [[1, 0], [0, 1]])
def test_stride_order_2d(order):
    x = torch.randn(3, 5)
    (out,) = run(lambda fd, a: fd.ops.stride_order(a, stride_order=order), [x])
    close(out, x)
    # stride_order[i] ranks axis i's stride: the highest is outermost.
    outer_first = sorted(range(2), key=lambda i: -order[i])
    assert out.stride(outer_first[0]) > out.stride(outer_first[1])
    assert out.stride(outer_first[1]) == 1


def test_stride_order_makes_permuted_contiguous():
    # The transformer's attention output: permute, then stride_order to row major.
    x = torch.randn(2, 3, 4, 5)
    (out,) = run(lambda fd, a: fd.ops.stride_order(fd.ops.permute(a, [0, 2, 1, 3]), stride_order=[3, 2, 1, 0]), [x])
    close(out, x.permute(0, 2, 1, 3))
    assert out.is_contiguous()


# -- broadcast / broadcast_in_dim / squeeze / permute ----------------------------------------


@pytest.mark.parametrize(
    "flags,view",
    [([True, False], (1, 4)), ([False, True], (4, 1)), ([True, False, True], (1, 4, 1))],
)
def test_broadcast(flags, view):
    x = torch.randn(4)
    (out,) = run(lambda fd, a: fd.ops.broadcast(a, is_broadcast_dim=flags), [x])
    close(out, x.reshape(view))


def test_broadcast_then_add():
    x, y = torch.randn(3), torch.randn(3, 5)
    (out,) = run(lambda fd, a, b: fd.ops.add(fd.ops.broadcast(a, [False, True]), b), [x, y])
    close(out, x[:, None] + y)


@pytest.mark.parametrize(
    "x_shape,shape,dims",
    [
        ((3,), [2, 3], [1]),
        ((3,), [3, 2], [0]),
        ((3,), [2, 3], [-1]),
        ((2, 3), [2, 4, 3], [0, -1]),
        ((2, 3), [2, 4, 3], [-3, 2]),
        ((1, 3), [5, 3], [0, 1]),  # expands an extent-1 axis
        ((), [2, 2], []),
    ],
)
def test_broadcast_in_dim_static_shape(x_shape, shape, dims):
    x = torch.randn(x_shape)
    (out,) = run(lambda fd, a: fd.ops.broadcast_in_dim(a, shape=shape, broadcast_dims=dims), [x])
    view = [1] * len(shape)
    for i, d in enumerate(dims):
        view[d % len(shape)] = x.shape[i]
    close(out, x.reshape(view).expand(shape))


def test_broadcast_in_dim_shape_from_fd_ops_shape():
    x, w = torch.randn(2, 3, 4), torch.randn(4)
    (out,) = run(lambda fd, a, b: fd.ops.mul(a, fd.ops.broadcast_in_dim(b, shape=fd.ops.shape(a), broadcast_dims=[-1])),
                 [x, w])
    close(out, x * w)


def test_broadcast_in_dim_shape_with_scalars():
    # The triangle update's mask: [b, n, n] -> [b, n, n, c] with b, n from fd.ops.size.
    mask = torch.randn(2, 3, 3) > 0
    z = torch.randn(2, 3, 3, 4)

    def build(fd, m, zz):
        b, n = fd.ops.size(zz, 0), fd.ops.size(zz, 1)
        mb = fd.ops.broadcast_in_dim(m, shape=[b, n, n, 4], broadcast_dims=[0, 1, 2])
        return fd.ops.where(mb, zz, 0.0)

    (out,) = run(build, [mask, z])
    close(out, torch.where(mask[..., None], z, torch.tensor(0.0)))


def test_broadcast_in_dim_shape_with_symbolic_scalar_input():
    x = torch.randn(3)
    (out,) = run(lambda fd, a, n: fd.ops.broadcast_in_dim(a, shape=[n, 3], broadcast_dims=[1]), [x, 4])
    close(out, x.expand(4, 3))


@pytest.mark.parametrize("dims", [[1], [-2], [0, 1], [-1, 0]])
def test_squeeze(dims):
    x = torch.randn(1, 1, 4) if dims != [1] and dims != [-2] else torch.randn(3, 1, 4)
    if dims == [-1, 0]:
        x = torch.randn(1, 4, 1)
    (out,) = run(lambda fd, a: fd.ops.squeeze(a, dims=dims), [x])
    expected = x
    for d in sorted((d % x.dim() for d in dims), reverse=True):
        expected = expected.squeeze(d)
    close(out, expected)


def test_squeeze_static_extent_one():
    x = torch.randn(3, 1)
    with FusionDefinition() as fd:
        a = fd.define_tensor([3, 1])
        fd.add_output(fd.ops.squeeze(a, [1]))
    close(fd.execute([x])[0], x[:, 0])


def test_squeeze_symbolic_axis_of_extent_one():
    # nvFuser squeezes a symbolic axis and checks its extent at execute.
    x = torch.randn(4, 1, 3)
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1, -1])
        fd.add_output(fd.ops.squeeze(a, [1]))
    close(fd.execute([x])[0], x[:, 0])


@pytest.mark.parametrize("dims", [[1, 0, 2], [2, 0, 1], [0, 2, 1], [-1, 0, -2]])
def test_permute(dims):
    x = torch.randn(2, 3, 4)
    (out,) = run(lambda fd, a: fd.ops.permute(a, dims=dims), [x])
    close(out, x.permute([d % 3 for d in dims]))


def test_permute_then_pointwise():
    x, y = torch.randn(2, 3), torch.randn(3, 2)
    (out,) = run(lambda fd, a, b: fd.ops.add(fd.ops.permute(a, [1, 0]), b), [x, y])
    close(out, x.T + y)


# -- reshape -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "in_shape,new_shape",
    [
        ((2, 3, 4), [6, 4]),
        ((2, 3, 4), [2, 12]),
        ((2, 3, 4), [24]),
        ((6, 4), [2, 3, 4]),
        ((2, 3, 4), [-1, 4]),
        ((2, 3, 4), [2, -1]),
        ((2, 3, 4), [4, -1, 2]),
        ((2, 3, 4), [2, 1, 12]),
        ((2, 6), [3, 4]),
        ((6, 5), [2, 1, 3, 5]),
        ((2, 3, 1), [6]),
    ],
)
@pytest.mark.parametrize("static", [False, True], ids=["symbolic", "static"])
def test_reshape(in_shape, new_shape, static):
    x = torch.randn(in_shape)
    (out,) = run(lambda fd, a: fd.ops.reshape(a, new_shape=new_shape), [x], static)
    close(out, x.reshape(new_shape))


def test_reshape_with_size_scalars():
    x = torch.randn(2, 3, 4)

    def build(fd, a):
        return fd.ops.reshape(a, [fd.ops.size(a, 0), -1])

    (out,) = run(build, [x])
    close(out, x.reshape(2, 12))


def test_reshape_merge_with_scalar_product():
    x = torch.randn(2, 3, 4)

    def build(fd, a):
        n = fd.ops.mul(fd.ops.size(a, 0), fd.ops.size(a, 1))
        return fd.ops.reshape(a, [n, fd.ops.size(a, -1)])

    (out,) = run(build, [x])
    close(out, x.reshape(6, 4))


def test_reshape_with_symbolic_scalar_inputs():
    x = torch.randn(4, 6)
    (out,) = run(lambda fd, a, h: fd.ops.reshape(a, [4, h, -1]), [x, 3])
    close(out, x.reshape(4, 3, 2))


def test_reshape_transformer_heads():
    b, s, h, e = 2, 3, 2, 8
    x = torch.randn(b, s, 3 * e)
    (out,) = run(lambda fd, a: fd.ops.reshape(a, new_shape=[b, s, h, 3 * e // h]), [x], static=True)
    close(out, x.reshape(b, s, h, 3 * e // h))


# -- slice / cat -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "starts,ends,strides",
    [
        ([0, 0], [3, 4], None),
        ([1, 0], [3, 2], None),
        ([0, 1], [4, 6], [1, 2]),
        ([1, 0], [4, 6], [2, 3]),
        ([0, 2], [4, 2], None),  # empty
    ],
)
@pytest.mark.parametrize("static", [False, True], ids=["symbolic", "static"])
def test_slice(starts, ends, strides, static):
    x = torch.randn(4, 6)
    (out,) = run(lambda fd, a: fd.ops.slice(a, starts, ends, strides), [x], static)
    index = tuple(slice(s, e, st) for s, e, st in zip(starts, ends, strides or [1, 1]))
    close(out, x[index])


def test_slice_keywords_and_scalar_ends():
    # As the triangle update does: ends from fd.ops.size, the channel split static.
    z = torch.randn(2, 3, 3, 8)

    def build(fd, a):
        b, n = fd.ops.size(a, 0), fd.ops.size(a, 1)
        lo = fd.ops.slice(a, start_indices=[0, 0, 0, 0], end_indices=[b, n, n, 4])
        hi = fd.ops.slice(a, start_indices=[0, 0, 0, 4], end_indices=[b, n, n, 8])
        return [lo, hi]

    lo, hi = run(build, [z])
    close(lo, z[..., :4])
    close(hi, z[..., 4:])


def test_slice_symbolic_scalar_bounds():
    x = torch.randn(10, 3)
    (out,) = run(lambda fd, a, s, e: fd.ops.slice(a, [s, 0], [e, 3]), [x, 2, 7])
    close(out, x[2:7])


def test_slice_normalizes_negative_and_out_of_range():
    x = torch.randn(6)
    a_out, b_out = run(lambda fd, a: [fd.ops.slice(a, [-4], [-1]), fd.ops.slice(a, [2], [100])], [x], static=True)
    close(a_out, x[-4:-1])
    close(b_out, x[2:])


def test_slice_to_extent_one():
    x = torch.randn(5, 4)
    (out,) = run(lambda fd, a: fd.ops.add(fd.ops.slice(a, [2, 0], [3, 4]), a), [x], static=True)
    close(out, x[2:3] + x)


@pytest.mark.parametrize("dim", [0, 1, -1, -2])
@pytest.mark.parametrize("static", [False, True], ids=["symbolic", "static"])
def test_cat(dim, static):
    shapes = [[2, 3], [2, 3], [2, 3]]
    for i, s in enumerate(shapes):
        s[dim % 2] += i  # different extents on the cat axis
    xs = [torch.randn(s) for s in shapes]
    (out,) = run(lambda fd, *ts: fd.ops.cat(list(ts), dim=dim), xs, static)
    close(out, torch.cat(xs, dim=dim))


def test_cat_slices_back():
    x = torch.randn(4, 6)
    (out,) = run(lambda fd, a: fd.ops.cat([fd.ops.slice(a, [0, 3], [4, 6]), fd.ops.slice(a, [0, 0], [4, 3])], 1), [x])
    close(out, torch.cat([x[:, 3:], x[:, :3]], 1))


def test_cat_bf16():
    xs = [torch.randn(2, 3).to(BF16), torch.randn(2, 5).to(BF16)]
    (out,) = run(lambda fd, a, b: fd.ops.cat([a, b], -1), xs)
    close(out, torch.cat(xs, -1))


# -- reductions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dims", [[0], [1], [-1], [0, 2], [-1, -3], [0, 1, 2]])
def test_sum(dims, keepdim):
    x = torch.randn(2, 3, 4)
    (out,) = run(lambda fd, a: fd.ops.sum(a, dims=dims, keepdim=keepdim), [x])
    close(out, x.sum(dim=dims, keepdim=keepdim))


def test_sum_keyword_spellings():
    # nvfuser_direct has spelled these dim/dims and keep_dim/keepdim
    x = torch.randn(2, 3, 4)
    a, b = run(lambda fd, t: [fd.ops.sum(t, dim=1, keep_dim=True), fd.ops.sum(t, dims=[0, 2], keepdim=True)], [x])
    close(a, x.sum(1, keepdim=True))
    close(b, x.sum([0, 2], keepdim=True))


def test_sum_bf16_computes_in_float():
    x = torch.randn(4, 64).to(BF16)
    (out,) = run(lambda fd, a: fd.ops.sum(a, dims=[1]), [x])
    close(out, x.float().sum(1).to(BF16))


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Double])
def test_sum_dtype(dtype):
    x = torch.randn(4, 8).to(BF16)
    (out,) = run(lambda fd, a: fd.ops.sum(a, [0], False, dtype), [x])
    close(out, x.to(dtype.torch_dtype).sum(0))
    (out,) = run(lambda fd, a: fd.ops.sum(a, dims=[-1], keepdim=True, dtype=dtype), [x])
    close(out, x.to(dtype.torch_dtype).sum(-1, keepdim=True))


def test_sum_int_and_bool_give_int64():
    x = torch.randint(-3, 4, (3, 5), dtype=torch.int32)
    b = torch.randn(3, 5) > 0
    sx, sb = run(lambda fd, a, m: [fd.ops.sum(a, [1]), fd.ops.sum(m, [0])], [x, b])
    close(sx, x.sum(1))
    close(sb, b.sum(0))


def test_sum_then_broadcast_back():
    # softmax-like normalization: x / sum(x, -1, keepdim)
    x = torch.rand(3, 5) + 0.1
    (out,) = run(lambda fd, a: fd.ops.mul(a, fd.ops.reciprocal(fd.ops.sum(a, [-1], keepdim=True))), [x])
    close(out, x / x.sum(-1, keepdim=True))


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("correction", [0, 1, 2])
@pytest.mark.parametrize("dims", [[-1], [0], [0, 2]])
def test_var_mean(dims, correction, keepdim):
    x = torch.randn(3, 4, 5)
    var, mean = run(lambda fd, a: list(fd.ops.var_mean(a, dims=dims, correction=correction, keepdim=keepdim)), [x])
    ref_var, ref_mean = torch.var_mean(x, dim=dims, correction=correction, keepdim=keepdim)
    close(var, ref_var)
    close(mean, ref_mean)


def test_var_mean_default_correction_and_cast_from_bf16():
    x = torch.randn(4, 16).to(BF16)
    var, mean = run(lambda fd, a: list(fd.ops.var_mean(fd.ops.cast(a, DataType.Float), [1])), [x])
    ref_var, ref_mean = torch.var_mean(x.float(), dim=1)  # correction=1
    close(var, ref_var)
    close(mean, ref_mean)


# -- size / shape ---------------------------------------------------------------------------------


def test_size_and_shape_follow_the_input():
    # size/shape are scalars; they reach the output through shapes of other ops.
    def build(fd, a, v):
        n = fd.ops.size(a, -1)
        full = fd.ops.broadcast_in_dim(v, shape=[fd.ops.size(a, 0), n], broadcast_dims=[1])
        same = fd.ops.broadcast_in_dim(fd.ops.sum(a, [0]), shape=fd.ops.shape(a), broadcast_dims=[1])
        return [full, same]

    for rows in (2, 5):
        x, v = torch.randn(rows, 3), torch.randn(3)
        full, same = run(build, [x, v])
        close(full, v.expand(rows, 3))
        close(same, x.sum(0).expand(rows, 3))


def test_size_in_scalar_arithmetic():
    # mean over a symbolic axis: sum * (1 / size)
    x = torch.randn(4, 7)
    (out,) = run(lambda fd, a: fd.ops.mul(fd.ops.sum(a, [1]), fd.ops.reciprocal(fd.ops.size(a, 1))), [x])
    close(out, x.sum(1) / 7)


def test_shape_is_a_list_of_scalars():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1, 5])
        shape = fd.ops.shape(a)
        fd.add_output(fd.ops.reshape(a, [shape[0], fd.ops.mul(shape[1], shape[2])]))
    assert len(shape) == 3 and all(isinstance(s, nvfuser.Scalar) for s in shape)
    x = torch.randn(2, 3, 5)
    close(fd.execute([x])[0], x.reshape(2, 15))


# -- linear / matmul / grouped_mm --------------------------------------------------------------------


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("a_shape", [(5, 8), (2, 5, 8), (2, 3, 5, 8), (8,)], ids=str)
def test_linear(a_shape, bias):
    a, w, b = torch.randn(a_shape), torch.randn(6, 8), torch.randn(6)
    if bias:
        (out,) = run(lambda fd, x, y, z: fd.ops.linear(x, y, z), [a, w, b])
        close(out, F.linear(a, w, b))
    else:
        (out,) = run(lambda fd, x, y: fd.ops.linear(x, y), [a, w])
        close(out, F.linear(a, w))


def test_linear_keywords_and_static_weight():
    a, w, b = torch.randn(3, 4, 8), torch.randn(6, 8), torch.randn(6)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, 8])
        y = fd.define_tensor([6, 8])
        z = fd.define_tensor([6])
        fd.add_output(fd.ops.linear(x, y, bias=z))
    close(fd.execute([a, w, b])[0], F.linear(a, w, b))


def test_linear_1d_weight():
    a, w = torch.randn(3, 8), torch.randn(8)
    (out,) = run(lambda fd, x, y: fd.ops.linear(x, y), [a, w])
    close(out, F.linear(a, w))


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_linear_bf16(bias):
    a, w, b = (torch.randn(s).to(BF16) for s in ((2, 5, 16), (12, 16), (12,)))
    args = [a, w, b] if bias else [a, w]
    (out,) = run(lambda fd, *ts: fd.ops.linear(*ts), args)
    expected = F.linear(a.float(), w.float(), b.float() if bias else None).to(BF16)
    close(out, expected, atol=1e-2, rtol=1e-2)


MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 3, 4), (4, 5)),  # broadcast batch
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 6)),  # size-1 batch axis against a longer batch
    ((1, 3, 4), (2, 4, 5)),
    ((3, 4), (4, 1)),  # an extent-1 n
    ((4,), (4, 5)),  # 1-D lhs
    ((3, 4), (4,)),  # 1-D rhs
    ((4,), (4,)),  # dot
    ((2, 3, 4), (4,)),
    ((4,), (2, 4, 5)),
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=lambda s: f"{list(s[0])}@{list(s[1])}")
def test_matmul(shapes):
    a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
    (out,) = run(lambda fd, x, y: fd.ops.matmul(x, y), [a, b])
    close(out, torch.matmul(a, b))


def test_matmul_expanded_batch():
    a, b = torch.randn(3, 4), torch.randn(5, 4, 2)
    (out,) = run(lambda fd, x, y: fd.ops.matmul(fd.ops.broadcast_in_dim(x, [5, 3, 4], [1, 2]), y), [a, b])
    close(out, torch.matmul(a.expand(5, 3, 4), b))


def test_matmul_static_shapes_and_bf16():
    a, b = torch.randn(2, 3, 16).to(BF16), torch.randn(2, 16, 5).to(BF16)
    (out,) = run(lambda fd, x, y: fd.ops.matmul(x, y), [a, b], static=True)
    close(out, torch.matmul(a.float(), b.float()).to(BF16), atol=1e-2, rtol=1e-2)


def test_matmul_of_permuted_operands():
    # The triangle update's einsum("bikc,bjkc->bijc") through permutes.
    a, b = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)

    def build(fd, x, y):
        m = fd.ops.matmul(fd.ops.permute(x, [0, 3, 1, 2]), fd.ops.permute(y, [0, 3, 2, 1]))
        return fd.ops.permute(m, [0, 2, 3, 1])

    (out,) = run(build, [a, b])
    close(out, torch.einsum("bikc,bjkc->bijc", a, b), atol=1e-5, rtol=1e-5)


def _grouped_mm_reference(a, b, offsets):
    pieces, start = [], 0
    for g, end in enumerate(offsets.tolist()):
        pieces.append(a[start:end].float() @ b[g].float())
        start = end
    return torch.cat(pieces).to(a.dtype)


@pytest.mark.parametrize("offsets", [[2, 5, 8], [0, 3, 8], [8, 8, 8]], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=str)
def test_grouped_mm(offsets, dtype):
    a, b = torch.randn(8, 4).to(dtype), torch.randn(3, 4, 6).to(dtype)
    off = torch.tensor(offsets, dtype=torch.int32)
    (out,) = run(lambda fd, x, y, o: fd.ops.grouped_mm(x, y, o), [a, b, off])
    assert out.shape == (8, 6)
    close(out, _grouped_mm_reference(a, b, off), atol=1e-2, rtol=1e-2)


# -- attention ---------------------------------------------------------------------------------------


def _qkv(b=2, h=3, l=5, s=7, e=8, ev=4, dtype=torch.float32):
    return (torch.randn(b, h, l, e).to(dtype), torch.randn(b, h, s, e).to(dtype), torch.randn(b, h, s, ev).to(dtype))


def _lse(q, k, scale=None, causal=False, bias=None, mask=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q.float() @ k.float().transpose(-1, -2) * scale
    if bias is not None:
        scores = scores + bias.float()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if causal:
        scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return torch.logsumexp(scores, -1)


@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpfa_fwd(causal, scale):
    q, k, v = _qkv(l=6, s=6)

    def build(fd, q_, k_, v_):
        out, lse, seed, offset = fd.ops.sdpfa_fwd(
            q_, k_, v_, dropout_p=fd.define_scalar(0.0, dtype=DataType.Double),
            is_causal=fd.define_scalar(causal, dtype=DataType.Bool),
            scale=None if scale is None else fd.define_scalar(scale, dtype=DataType.Double))
        return [out, lse]

    out, lse = run(build, [q, k, v])
    close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale), atol=1e-5, rtol=1e-5)
    close(lse, _lse(q, k, scale, causal), atol=1e-5, rtol=1e-5)


def test_sdpfa_fwd_defaults_and_cross_attention():
    q, k, v = _qkv(l=3, s=9, ev=5)
    out, lse, seed, offset = run(lambda fd, *t: list(fd.ops.sdpfa_fwd(*t)), [q, k, v])
    close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=1e-5)
    close(lse, _lse(q, k), atol=1e-5, rtol=1e-5)
    assert seed.dtype == torch.uint64 and offset.dtype == torch.uint64


def test_sdpfa_fwd_bias_and_mask():
    q, k, v = _qkv()
    bias = torch.randn(2, 3, 5, 7)
    mask = torch.randn(2, 1, 5, 7) > -0.5
    mask[..., 0] = True  # no fully masked row
    with FusionDefinition() as fd:
        tvs = define_inputs(fd, [q, k, v, bias, mask])
        out, lse, _, _ = fd.ops.sdpfa_fwd(*tvs[:3], bias=tvs[3], mask=tvs[4])
        fd.add_output(out)
        fd.add_output(lse)
    out, lse = fd.execute([q, k, v, bias, mask])
    close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~mask, float("-inf"))),
          atol=1e-5, rtol=1e-5)
    close(lse, _lse(q, k, bias=bias, mask=mask), atol=1e-5, rtol=1e-5)


def test_sdpfa_fwd_5d_with_broadcast_bias_and_mask():
    # AlphaFold's triangle attention: [b, i, h, j, c] with bias [b, 1, h, j, k] and mask [b, i, 1, 1, k]
    b, n, h, c = 2, 5, 2, 4
    q, k, v = (torch.randn(b, n, h, n, c) for _ in range(3))
    bias = torch.randn(b, 1, h, n, n)
    mask = torch.randn(b, n, 1, 1, n) > -0.5
    mask[..., 0] = True
    with FusionDefinition() as fd:
        tvs = define_inputs(fd, [q, k, v, bias, mask])
        out, lse, _, _ = fd.ops.sdpfa_fwd(*tvs[:3], bias=tvs[3], mask=tvs[4], is_causal=False)
        fd.add_output(out)
        fd.add_output(lse)
    out, lse = fd.execute([q, k, v, bias, mask])
    attn_bias = (bias + torch.zeros(b, n, 1, 1, n)).masked_fill(~mask, float("-inf"))
    close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias), atol=1e-5, rtol=1e-5)
    close(lse, _lse(q, k, bias=bias, mask=mask), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpfa_fwd_bf16(causal):
    q, k, v = _qkv(l=8, s=8, e=16, ev=16, dtype=BF16)
    (out,) = run(lambda fd, *t: fd.ops.sdpfa_fwd(*t, is_causal=causal)[0], [q, k, v])
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal).to(BF16)
    close(out, expected, atol=2e-2, rtol=2e-2)


def test_sdpfa_fwd_dropout_is_deterministic_per_seed_and_scaled():
    q, k, v = _qkv(b=1, h=1, l=16, s=16, e=4, ev=16)
    v = torch.ones_like(v)
    with FusionDefinition() as fd:
        tvs = define_inputs(fd, [q, k, v])
        out, lse, seed, offset = fd.ops.sdpfa_fwd(*tvs, dropout_p=0.5)
        fd.add_output(out)
        fd.add_output(lse)
    out, lse = fd.execute([q, k, v])
    # lse does not see dropout; with v = 1 each row is (sum of kept probs) / (1 - p).
    close(lse, _lse(q, k), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, torch.ones_like(out))
    assert (out >= 0).all() and torch.allclose(out[..., 0:1].expand_as(out), out)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=str)
def test_sdpfa_bwd(causal, dtype):
    q, k, v = _qkv(l=6, s=6, e=8, ev=8, dtype=dtype)
    grad = torch.randn(2, 3, 6, 8).to(dtype)
    scale = 0.4

    with FusionDefinition() as fd:
        q_, k_, v_, g_ = define_inputs(fd, [q, k, v, grad])
        dropout = fd.define_scalar(0.0, dtype=DataType.Double)
        is_causal = fd.define_scalar(causal, dtype=DataType.Bool)
        sc = fd.define_scalar(scale, dtype=DataType.Double)
        out, lse, seed, offset = fd.ops.sdpfa_fwd(q_, k_, v_, dropout_p=dropout, is_causal=is_causal, scale=sc)
        dq, dk, dv = fd.ops.sdpfa_bwd(g_, q_, k_, v_, out, lse, dropout, is_causal, seed, offset, sc)
        for t in (out, dq, dk, dv):
            fd.add_output(t)
    out, dq, dk, dv = fd.execute([q, k, v, grad])

    qf, kf, vf = (t.float().requires_grad_(True) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, scale=scale)
    ref.backward(grad.float())
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    close(out, ref.detach().to(dtype), **tol)
    close(dq, qf.grad.to(dtype), **tol)
    close(dk, kf.grad.to(dtype), **tol)
    close(dv, vf.grad.to(dtype), **tol)


# -- uniform -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16, DataType.Double])
def test_uniform_range_shape_dtype(dtype):
    (out,) = run(lambda fd: fd.ops.uniform(-2.0, 3.0, shape=[64, 32], dtype=dtype), [])
    assert out.shape == (64, 32) and out.dtype == dtype.torch_dtype
    assert out.min() >= -2.0 and out.max() <= 3.0
    # spread over the whole range, not a constant
    assert out.min() < -1.5 and out.max() > 2.5
    assert abs(out.float().mean().item() - 0.5) < 0.2


def test_uniform_shape_from_input():
    x = torch.randn(5, 7)
    (out,) = run(lambda fd, a: fd.ops.uniform(0.0, 1.0, shape=fd.ops.shape(a)), [x])
    assert out.shape == x.shape and out.dtype == torch.float32
    assert ((out >= 0) & (out < 1)).all()


def test_uniform_scalar_bounds():
    (out,) = run(lambda fd, lo, hi: fd.ops.uniform(lo, hi, shape=[1000]), [10.0, 10.5])
    assert out.min() >= 10.0 and out.max() <= 10.5


def _uniform_fd(seeded: bool):
    with FusionDefinition() as fd:
        if seeded:
            seed = fd.define_scalar(DataType.Int)
            offset = fd.define_scalar(DataType.Int)
            u = fd.ops.uniform(0.0, 1.0, shape=[8, 8], rng_seed=seed, rng_offset=offset)
        else:
            u = fd.ops.uniform(0.0, 1.0, shape=[8, 8])
        fd.add_output(u)
    return fd


def test_uniform_rng_seed_determinism():
    fd = _uniform_fd(seeded=True)
    a = fd.execute([7, 0])[0]
    b = fd.execute([7, 0])[0]
    c = fd.execute([8, 0])[0]
    d = fd.execute([7, 1])[0]
    assert torch.equal(a, b)
    assert not torch.equal(a, c) and not torch.equal(a, d)
    # a new definition with the same seed draws the same numbers
    assert torch.equal(_uniform_fd(seeded=True).execute([7, 0])[0], a)


def test_uniform_unseeded_advances_between_executions():
    fd = _uniform_fd(seeded=False)
    a, b = fd.execute([])[0], fd.execute([])[0]
    assert not torch.equal(a, b)


def test_uniform_as_dropout_mask():
    # The transformer's dropout: lt(uniform, 1 - p) keeps about 1 - p.
    x = torch.ones(200, 50)

    def build(fd, a):
        keep = fd.ops.lt(fd.ops.uniform(0.0, 1.0, shape=fd.ops.shape(a)), 0.9)
        return fd.ops.mul(fd.ops.mul(a, fd.ops.cast(keep, DataType.Float)), 1 / 0.9)

    (out,) = run(build, [x])
    kept = (out != 0).float().mean().item()
    assert 0.87 < kept < 0.93
    close(out[out != 0], torch.full_like(out[out != 0], 1 / 0.9))
