"""Golden tests of printMath and the printed forms of TensorView,
IterDomain, extents and DeviceMesh, in nvFuser's format."""

import pytest
import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition
from nvshard.multidevice import DeviceMesh

ParallelType = nvfuser.ParallelType


# -- (a) upstream's 3-D add ------------------------------------------------------------------

ADD_3D = """\
Inputs:
  T0_g_float[iS0{2}, iS1{4}, iS2{8}]
  T1_g_float[iS3{2}, iS4{4}, iS5{8}]
Outputs:
  T2_g_float[iS6{2}, iS7{4}, iS8{8}]

%kernel_math {
T2_g_float[iS6{2}, iS7{4}, iS8{8}]
   = T0_g_float[iS0{2}, iS1{4}, iS2{8}]
   + T1_g_float[iS3{2}, iS4{4}, iS5{8}];
} // %kernel_math \n\n"""


def _add_3d():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([2, 4, 8])
        t1 = fd.define_tensor([2, 4, 8])
        t2 = fd.ops.add(t0, t1)
        fd.add_output(t2)
    return fd, t0, t1, t2


def test_print_math_3d_add_matches_upstream():
    fd, *_ = _add_3d()
    assert fd.fusion.print_math() == ADD_3D
    # printing does not change the fusion
    assert fd.fusion.print_math() == ADD_3D


def test_fusion_definition_repr_wraps_print_math():
    fd, *_ = _add_3d()
    assert repr(fd) == "FusionDefinition(\n" + ADD_3D + ")"


def test_tensor_iterdomain_and_extent_strings():
    _, t0, t1, t2 = _add_3d()
    assert str(t0) == "T0_g_float[iS0{2}, iS1{4}, iS2{8}]"
    assert repr(t1) == "T1_g_float[iS3{2}, iS4{4}, iS5{8}]"
    assert str(t2.axis(0)) == "iS6{2}"
    assert str(t0.axis(-1)) == "iS2{8}"
    assert str(t0.axis(0).extent()) == "2"
    assert str(t0.domain()) == "[iS0{2}, iS1{4}, iS2{8}]"


@pytest.mark.parametrize(
    "dtype,spelling",
    [(DataType.Float, "float"), (DataType.BFloat16, "__bfloat"), (DataType.Half, "__half"), (DataType.Bool, "bool"),
     (DataType.Double, "double"), (DataType.Int32, "int"), (DataType.Int, "int64_t")],
)
def test_dtype_spellings(dtype, spelling):
    with FusionDefinition() as fd:
        t = fd.define_tensor([3], dtype=dtype)
    assert str(t) == f"T0_g_{spelling}[iS0{{3}}]"
    assert t.dtype() == dtype


def test_symbolic_broadcast_and_reduction_axes():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, 1, -1])
        t1 = fd.ops.sum(t0, dims=[2])
        fd.add_output(t1)
    assert str(t0) == "T0_g_float[iS0{i0}, bS1{1}, iS2{i1}]"
    assert str(t0.axis(2).extent()) == "i1"
    assert str(t1) == "T1_g_float[iS3{i0}, bS4{1}, rS5{i1}]"
    assert t1.axis(2).is_reduction() and t0.axis(1).is_broadcast()


def test_splits_print_ceil_div_and_number_the_inner_output_first():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, 12])
        fd.add_output(t0)
        t0.outer_split(0, 4)  # outer {4} is iS3, inner {ceilDiv(i0, 4)} iS2
        t0.inner_split(2, 3)  # inner {3} is iS4, outer {4} iS5
    assert str(t0) == "T0_g_float[iS3{4}, iS2{( ceilDiv(i0, 4) )}, iS5{4}, iS4{3}]"
    assert str(t0.axis(1).extent()) == "( ceilDiv(i0, 4) )"


# -- (b) a 2-D mesh with device splits ---------------------------------------------------------

MESH_2D = """\
Inputs:
  T0_g_float[ideviceIdx.x10{2}, iS9{( ceilDiv(i0, 2) )}, ideviceIdx.y12{2}, iS11{( ceilDiv(i1, 2) )}] (DeviceMesh{{0 1}{2 3}})
Outputs:
  T4_g___bfloat[iS8{i0}]

%kernel_math {
T1_g_float[iS2{i0}, iS3{i1}]
   = relu(T0_g_float[ideviceIdx.x10{2}, iS9{( ceilDiv(i0, 2) )}, ideviceIdx.y12{2}, iS11{( ceilDiv(i1, 2) )}] (DeviceMesh{{0 1}{2 3}}));
T2_g_float[iS4{i0}, iS5{i1}]
   = T1_g_float[iS2{i0}, iS3{i1}]
   + T0_g_float[ideviceIdx.x10{2}, iS9{( ceilDiv(i0, 2) )}, ideviceIdx.y12{2}, iS11{( ceilDiv(i1, 2) )}] (DeviceMesh{{0 1}{2 3}});
T3_g_float[iS6{i0}, rS7{i1}]
   = reduction( T2_g_float[iS4{i0}, iS5{i1}], op = add, initial value = float(0), allreduce = false )
T4_g___bfloat[iS8{i0}]
   = __float2bfloat(T3_g_float[iS6{i0}, rS7{i1}]);
} // %kernel_math \n\n"""


def _mesh_2d_fusion():
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2))
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        t1 = fd.ops.relu(t0)
        t2 = fd.ops.add(t1, t0)
        t3 = fd.ops.sum(t2, [1])
        t4 = fd.ops.cast(t3, DataType.BFloat16)
        fd.add_output(t4)
        # Scheduling after the ops, as upstream tests do.
        t0.set_device_mesh(mesh)
        t0.outer_split(0, 2)
        t0.axis(0).parallelize(ParallelType.mesh_x)
        t0.outer_split(2, 2)
        t0.axis(2).parallelize(ParallelType.mesh_y)
    return fd, t0


def test_print_math_2d_mesh():
    fd, t0 = _mesh_2d_fusion()
    assert fd.fusion.print_math() == MESH_2D


def test_sharded_tensor_strings():
    _, t0 = _mesh_2d_fusion()
    assert str(t0.axis(0)) == "ideviceIdx.x10{2}"
    assert str(t0.axis(1)) == "iS9{( ceilDiv(i0, 2) )}"
    assert str(t0.axis(2)) == "ideviceIdx.y12{2}"
    assert str(t0.axis(0).extent()) == "2"
    assert str(t0.axis(-1).extent()) == "( ceilDiv(i1, 2) )"
    assert t0.axis(0).parallel_type is ParallelType.mesh_x and t0.axis(1).parallel_type is ParallelType.Serial


def test_api_example_tensor():
    # One outer split on DIDx, the second axis untouched.
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.neg(t0))
        t0.set_device_mesh(DeviceMesh(torch.arange(4).reshape(2, 2)))
        t0.outer_split(0, 2)
        t0.axis(0).parallelize(ParallelType.mesh_x)
    assert str(t0) == "T0_g_float[ideviceIdx.x5{2}, iS4{( ceilDiv(i0, 2) )}, iS1{i1}] (DeviceMesh{{0 1}{2 3}})"


def test_stream_and_didz_parallel_types_print():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, 8])
        fd.add_output(t0)
        t0.set_device_mesh(DeviceMesh(torch.arange(2).reshape(2, 1, 1)))
        t0.outer_split(0, 2)
        t0.axis(0).parallelize(ParallelType.mesh_z)
        t0.axis(2).parallelize(ParallelType.stream)
    assert str(t0) == "T0_g_float[ideviceIdx.z3{2}, iS2{( ceilDiv(i0, 2) )}, istreamIdx1{8}] (DeviceMesh{{{0}}{{1}}})"
    # a device dim is an axis parallelized on a mesh axis (stream and serial are not)
    assert [i.is_device_dim() for i in t0.loop] == [True, False, False]
    assert {p.name for p in ParallelType if p.mesh_axis is not None} == {"mesh_x", "mesh_y", "mesh_z"}


# -- printed form of each op ----------------------------------------------------------------------

A = "T0_g_float[iS0{i0}, iS1{4}]"

OP_FORMATS = [
    ("relu", lambda fd, a: fd.ops.relu(a), f"T1_g_float[iS2{{i0}}, iS3{{4}}]\n   = relu({A});\n"),
    ("rsqrt", lambda fd, a: fd.ops.rsqrt(a), f"T1_g_float[iS2{{i0}}, iS3{{4}}]\n   = rsqrtf({A});\n"),
    ("tanh", lambda fd, a: fd.ops.tanh(a), f"T1_g_float[iS2{{i0}}, iS3{{4}}]\n   = tanhf({A});\n"),
    ("sigmoid", lambda fd, a: fd.ops.sigmoid(a), f"T1_g_float[iS2{{i0}}, iS3{{4}}]\n   = sigmoid({A});\n"),
    ("neg", lambda fd, a: fd.ops.neg(a), f"T1_g_float[iS2{{i0}}, iS3{{4}}]\n   = -{A};\n"),
    ("cast", lambda fd, a: fd.ops.cast(a, DataType.Half), f"T1_g___half[iS2{{i0}}, iS3{{4}}]\n   = __float2half({A});\n"),
    ("sub", lambda fd, a: fd.ops.sub(a, a), f"T1_g_float[iS2{{i0}}, iS3{{4}}]\n   = {A}\n   - {A};\n"),
    ("lt", lambda fd, a: fd.ops.lt(a, a), f"T1_g_bool[iS2{{i0}}, iS3{{4}}]\n   = {A}\n   < {A};\n"),
    ("pow", lambda fd, a: fd.ops.pow(a, a), f"T1_g_float[iS2{{i0}}, iS3{{4}}]\n   = pow({A}\n  , {A});\n"),
    ("where", lambda fd, a: fd.ops.where(fd.ops.lt(a, a), a, a),
     f"T2_g_float[iS4{{i0}}, iS5{{4}}]\n   = where(T1_g_bool[iS2{{i0}}, iS3{{4}}]\n  , {A}\n  , {A});\n"),
    ("set", lambda fd, a: fd.ops.set(a), f"T1_g_float[iS2{{i0}}, iS3{{4}}]\n   = Set( {A}, cache_op=Streaming )\n"),
    ("cast_to_same", lambda fd, a: fd.ops.cast(a, DataType.Float),
     f"T1_g_float[iS2{{i0}}, iS3{{4}}]\n   = Set( {A}, cache_op=Streaming )\n"),
    ("permute", lambda fd, a: fd.ops.permute(a, [1, 0]),
     f"T1_g_float[iS2{{4}}, iS3{{i0}}]\n   = Set.Permute( {A}, cache_op=Streaming )\n"),
    ("broadcast", lambda fd, a: fd.ops.broadcast(a, [False, True, False]),
     f"T1_g_float[iS2{{i0}}, bS3{{1}}, iS4{{4}}]\n   = broadcast( {A}, flags = {{false, true, false}} )\n"),
    ("squeeze", lambda fd, a: fd.ops.squeeze(fd.ops.broadcast(a, [True, False, False]), [0]),
     "T2_g_float[iS5{i0}, iS6{4}]\n   = squeeze( T1_g_float[bS2{1}, iS3{i0}, iS4{4}], flags = {true, false, false} )\n"),
    ("reshape", lambda fd, a: fd.ops.reshape(a, [-1]), f"T1_g_float[iS2{{( 4 * i0 )}}] = reshape( {A} )\n"),
    ("slice", lambda fd, a: fd.ops.slice(a, [0, 1], [2, 3]),
     f"T1_g_float[iS2{{2}}, iS3{{2}}]\n   = slice( {A}, {{ {{0, 2, 1}} {{1, 3, 1}} }} )\n"),
    ("cat", lambda fd, a: fd.ops.cat([a, a], 1), f"T1_g_float[iS2{{i0}}, iS3{{8}}]\n   = cat( {A}, {A}, 1 )\n"),
    ("sum", lambda fd, a: fd.ops.sum(a, [0]),
     f"T1_g_float[rS2{{i0}}, iS3{{4}}]\n   = reduction( {A}, op = add, initial value = float(0), allreduce = false )\n"),
    ("matmul", lambda fd, a: fd.ops.matmul(a, fd.ops.permute(a, [1, 0])),
     f"T2_g_float[iS4{{i0}}, iS5{{i0}}, rS6{{4}}]\n   = matmul({A},\n            T1_g_float[iS2{{4}}, iS3{{i0}}])\n"),
    ("linear", lambda fd, a: fd.ops.linear(a, a),
     f"T1_g_float[iS2{{i0}}, iS3{{i0}}, rS4{{4}}]\n   = linear({A},\n            {A}  )\n"),
    ("uniform", lambda fd, a: fd.ops.uniform(0.0, 1.0, [3, 4], dtype=DataType.BFloat16),
     "T1_g___bfloat[iS2{3}, iS3{4}]\n   = rng_uniform({3, 4}, __bfloat);\n"),
]


@pytest.mark.parametrize("build,expected", [c[1:] for c in OP_FORMATS], ids=[c[0] for c in OP_FORMATS])
def test_op_format(build, expected):
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, 4])
        out = build(fd, a)
        fd.add_output(out)
    assert str(out.definition) == expected
    assert expected in fd.fusion.print_math()


def test_linear_with_bias_format():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, 4])
        w = fd.define_tensor([6, 4])
        b = fd.define_tensor([6])
        out = fd.ops.linear(a, w, b)
        fd.add_output(out)
    # nvFuser's LinearOp::toString, its stray indentation included
    assert str(out.definition) == (
        "T3_g_float[iS5{i0}, iS6{6}, rS7{4}]\n"
        "   = linear(T0_g_float[iS0{i0}, iS1{4}],\n"
        "            T1_g_float[iS2{6}, iS3{4}]  ,\n"
        "          T2_g_float[iS4{6}]  )\n"
    )


def test_sdpa_formats():
    with FusionDefinition() as fd:
        q, k, v = (fd.define_tensor([2, 2, 8, 8]) for _ in range(3))
        out, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, is_causal=fd.define_scalar(True))
        fd.add_output(out)
    text = str(out.definition)
    assert text.startswith(
        "T3_g_float[iS12{2}, iS13{2}, iS14{8}, iS15{8}],\n"
        "T4_g_float[iS16{2}, iS17{2}, iS18{8}],\n"
        "T5_g_uint64_t[iS19{2}],\n"
        "T6_g_uint64_t[]\n"
        "   = sdpa(T0_g_float[iS0{2}, iS1{2}, iS2{8}, iS3{8}],\n"
        "            T1_g_float[iS4{2}, iS5{2}, iS6{8}, iS7{8}],\n"
        "            T2_g_float[iS8{2}, iS9{2}, iS10{8}, iS11{8}],\n"
    ), text
    assert text.endswith("            dropout_p = double(0.0),\n            is_causal=true,\n  )\n"), text


def test_print_math_lists_only_tensor_exprs():
    # size/shape make scalars: they do not appear in %kernel_math
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1])
        out = fd.ops.reshape(a, [fd.ops.size(a, 0), -1])
        fd.add_output(out)
    text = fd.fusion.print_math()
    assert text.count(" = ") == 1 and "reshape(" in text
    assert text.startswith("Inputs:\n  T0_g_float[iS0{i0}, iS1{i1}]\nOutputs:\n  T1_g_float[iS2{i0}, iS3{i1}]\n")


def test_scalar_strings():
    with FusionDefinition() as fd:
        d = fd.define_scalar(DataType.Double)
        i = fd.define_scalar(DataType.Int)
        c = fd.define_scalar(True)
    assert (str(d), str(i), str(c)) == ("ds0", "is1", "true")
    assert d.dtype() == DataType.Double and i.is_symbolic() and c.is_const()


# -- DeviceMesh -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "devices,text,shape,size",
    [
        (torch.arange(2), "DeviceMesh{0 1}", (2,), 2),
        ([3, 1, 2], "DeviceMesh{3 1 2}", (3,), 3),
        (range(1), "DeviceMesh{0}", (1,), 1),
        (torch.arange(4).reshape(2, 2), "DeviceMesh{{0 1}{2 3}}", (2, 2), 4),
        (torch.arange(6).reshape(2, 3), "DeviceMesh{{0 1 2}{3 4 5}}", (2, 3), 6),
        (torch.arange(6).reshape(3, 2), "DeviceMesh{{0 1}{2 3}{4 5}}", (3, 2), 6),
        (torch.arange(8).reshape(2, 2, 2), "DeviceMesh{{{0 1}{2 3}}{{4 5}{6 7}}}", (2, 2, 2), 8),
        (torch.arange(4).reshape(1, 2, 2), "DeviceMesh{{{0 1}{2 3}}}", (1, 2, 2), 4),
    ],
)
def test_device_mesh_repr_shape_size(devices, text, shape, size):
    mesh = DeviceMesh(devices)
    assert repr(mesh) == text and str(mesh) == text
    assert mesh.shape == shape
    assert mesh.size == size
    assert mesh.ndim == len(shape)


def test_device_mesh_axis_names():
    # mesh_x is the last mesh dimension, mesh_y the second to last, mesh_z the third to last.
    mesh = DeviceMesh(torch.arange(12).reshape(2, 3, 2))
    assert mesh.axis_names == ("z", "y", "x")
    assert mesh.axis_sizes() == {"z": 2, "y": 3, "x": 2}


def test_device_mesh_groups():
    mesh = DeviceMesh(torch.arange(12).reshape(2, 3, 2))
    assert mesh.group(7, "x") == [6, 7]
    assert mesh.group(7, "y") == [7, 9, 11]
    assert mesh.group(7, "z") == [1, 7]
    assert mesh.coords(7) == {"z": 1, "y": 0, "x": 1}
