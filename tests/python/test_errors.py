"""Bad input raises NvShardError naming the tensor, the axis and what was expected."""

import re

import pytest
import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, NvShardError
from nvshard.multidevice import DeviceMesh, shard_tensor

ParallelType = nvfuser.ParallelType


def _add_fusion():
    """T0 [i0, 4] float + T1 [i0, 4] bf16."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, 4], dtype=DataType.Float)
        b = fd.define_tensor([-1, 4], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.add(a, b))
    return fd


def test_nvshard_error_is_a_value_error():
    assert issubclass(NvShardError, ValueError)


# -- execute() inputs -------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 3])
def test_wrong_number_of_inputs(n):
    inputs = [torch.randn(2, 4), torch.randn(2, 4).bfloat16(), torch.randn(2, 4)][:n]
    with pytest.raises(NvShardError, match=rf"2 inputs \(T0, T1\) but execute got {n}"):
        _add_fusion().execute(inputs)


@pytest.mark.parametrize("shape", [(2, 4, 1), (8,), ()])
def test_input_rank_mismatch(shape):
    with pytest.raises(NvShardError, match=rf"input 1 \(T1\) must have rank 2, got shape {re.escape(str(shape))}"):
        _add_fusion().execute([torch.randn(2, 4), torch.randn(shape).bfloat16()])


@pytest.mark.parametrize("which", [0, 1])
def test_input_static_extent_mismatch(which):
    inputs = [torch.randn(2, 4), torch.randn(2, 4).bfloat16()]
    inputs[which] = inputs[which][:, :3]
    with pytest.raises(NvShardError, match=rf"T{which}: axis 1 has extent 3, but define_tensor declared 4"):
        _add_fusion().execute(inputs)


def test_input_dtype_mismatch():
    with pytest.raises(NvShardError, match=r"input 1 \(T1\) must have dtype torch.bfloat16, got torch.float32"):
        _add_fusion().execute([torch.randn(2, 4), torch.randn(2, 4)])


def test_symbolic_extents_that_must_be_equal():
    with pytest.raises(NvShardError, match=r"T1: axis 0 has extent 3, but i0 = 2 from another input must be equal"):
        _add_fusion().execute([torch.randn(2, 4), torch.randn(3, 4).bfloat16()])


def test_contraction_extents_checked_at_execute():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1])
        b = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.matmul(a, b))
    with pytest.raises(NvShardError, match=r"T1: axis 0 has extent 5, but i1 = 4"):
        fd.execute([torch.randn(3, 4), torch.randn(5, 6)])


def test_broadcast_axis_given_a_larger_extent():
    with FusionDefinition() as fd:
        a = fd.define_tensor([1, -1])
        fd.add_output(fd.ops.neg(a))
    with pytest.raises(NvShardError, match=r"T0: axis 0 is a broadcast axis and must have extent 1, got 3"):
        fd.execute([torch.randn(3, 4)])


def _scalar_fusion():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1])
        s = fd.define_scalar(DataType.Double)
        fd.add_output(fd.ops.mul(a, s))
    return fd


@pytest.mark.parametrize(
    "bad,message",
    [("x", r"input 1 \(ds0\) is a scalar; got str"),
     (torch.randn(3), r"input 1 \(ds0\) is a scalar; got a tensor of shape \(3,\)")],
)
def test_scalar_input_given_a_non_scalar(bad, message):
    with pytest.raises(NvShardError, match=message):
        _scalar_fusion().execute([torch.randn(2), bad])


@pytest.mark.parametrize("dtype,bad,spelling", [(DataType.Int, 2.5, "int64_t"), (DataType.Bool, 1, "bool")])
def test_scalar_input_of_the_wrong_kind(dtype, bad, spelling):
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1])
        s = fd.define_scalar(dtype)
        fd.add_output(fd.ops.mul(a, fd.ops.cast(s, DataType.Float)))
    name = str(s)
    with pytest.raises(NvShardError, match=rf"input 1 \({name}\) is a {spelling} scalar; got {bad!r}"):
        fd.execute([torch.ones(2), bad])
    good = 3 if dtype == DataType.Int else True
    torch.testing.assert_close(fd.execute([torch.ones(2), good])[0], torch.full((2,), float(good)))


def test_tensor_input_given_a_number():
    with pytest.raises(NvShardError, match=r"input 0 \(T0\) must be a torch.Tensor, got float"):
        _scalar_fusion().execute([3.0, 2.0])


@pytest.mark.parametrize("new_shape,text", [([5, -1], r"\[5, -1\]"), ([5, 2], r"\[5, 2\]")])
def test_reshape_that_cannot_hold_the_input(new_shape, text):
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.reshape(a, new_shape))
    with pytest.raises(NvShardError, match=rf"reshape: T0 has shape \[3, 4\] \(12 elements\), which new_shape {text} of T1"):
        fd.execute([torch.randn(3, 4)])


def test_squeeze_of_a_symbolic_axis_that_is_not_one():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.squeeze(a, [0]))
    assert fd.execute([torch.ones(1, 3)])[0].shape == (3,)
    with pytest.raises(NvShardError, match=r"squeeze: axis 0 of T0 has extent 2; only extent-1 axes can be squeezed"):
        fd.execute([torch.ones(2, 3)])


# -- definition ---------------------------------------------------------------------------


def test_static_extents_that_differ_at_definition():
    with FusionDefinition() as fd:
        a = fd.define_tensor([3, 4])
        b = fd.define_tensor([3, 5])
        with pytest.raises(NvShardError, match=r"add: axis 1 of the result needs equal extents, but T0 has 4 and T1 has 5"):
            fd.ops.add(a, b)


def test_static_contraction_mismatch_at_definition():
    with FusionDefinition() as fd:
        a = fd.define_tensor([3, 4])
        b = fd.define_tensor([5, 6])
        with pytest.raises(NvShardError, match=r"matmul: contraction extents differ: T0 has 4, T1 has 5"):
            fd.ops.matmul(a, b)


@pytest.mark.parametrize(
    "kwargs,message",
    [(dict(shape=[-2, 3]), r"shape\[0\] = -2"),
     (dict(shape=[-1, 3], contiguity=[True]), r"contiguity has 1 entries for rank 2"),
     (dict(shape=[-1, 3], dtype=torch.float32), r"dtype must be a DataType, got torch.float32"),
     (dict(shape=[2, 3], stride_order=[0, 0]), r"stride_order \[0, 0\] is not a permutation of 0..1")],
)
def test_bad_define_tensor(kwargs, message):
    with FusionDefinition() as fd:
        with pytest.raises(NvShardError, match=message):
            fd.define_tensor(**kwargs)


def test_define_outside_the_with_block():
    with FusionDefinition() as fd:
        fd.define_tensor([2])
    with pytest.raises(NvShardError, match="inside `with FusionDefinition"):
        fd.define_tensor([2])


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda fd, x: fd.ops.sum(x, dimz=[0]), r"fd.ops.sum: unknown keyword 'dimz'; expected one of \['arg', 'dims'"),
        (lambda fd, x: fd.ops.var_mean(x, dims=[0], corection=0), r"fd.ops.var_mean: unknown keyword 'corection'"),
        (lambda fd, x: fd.ops.broadcast_in_dim(x, shape=[2, 3], broadcast_dim=[1]),
         r"fd.ops.broadcast_in_dim: unknown keyword 'broadcast_dim'"),
        (lambda fd, x: fd.ops.add(x), r"fd.ops.add: missing a required argument: 'rhs'"),
    ],
)
def test_bad_op_keywords(call, message):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 3])
        for _ in range(2):  # the second read of fd.ops.<op> reuses its wrapper: it checks as well
            with pytest.raises(NvShardError, match=message):
                call(fd, x)


def test_unknown_op_name():
    with FusionDefinition() as fd:
        fd.define_tensor([3])
        with pytest.raises(AttributeError, match="fd.ops has no op 'addd'"):
            fd.ops.addd


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda fd, x: fd.ops.sum(x, dims=[2]), r"sum: dim 2 is out of range for rank 2 of T0"),
        (lambda fd, x: fd.ops.permute(x, dims=[0, 0]), r"permute: dims \[0, 0\] is not a permutation of 0..1 for T0"),
        (lambda fd, x: fd.ops.squeeze(x, dims=[1]), r"squeeze: axis 1 of T0 has extent 3; only extent-1 axes"),
        (lambda fd, x: fd.ops.reshape(x, [4, 4]), r"reshape: T0 has 6 elements but new_shape \[4, 4\] has 16"),
        (lambda fd, x: fd.ops.broadcast_in_dim(x, shape=[2, 4], broadcast_dims=[0, 1]),
         r"broadcast_in_dim: axis 1 of T0 has extent 3, but shape\[1\] is 4"),
        (lambda fd, x: fd.ops.slice(x, [0], [1]), r"slice: start_indices has 1 entries but T0 has rank 2"),
        (lambda fd, x: fd.ops.cast(x, DataType.Null), r"cast: dtype must be a DataType"),
    ],
)
def test_bad_op_arguments(call, message):
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, 3])
        with pytest.raises(NvShardError, match=message):
            call(fd, x)


def test_var_mean_rejects_reduced_precision():
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, 3], dtype=DataType.BFloat16)
        with pytest.raises(NvShardError, match=r"var_mean is not supported for __bfloat \(T0\)"):
            fd.ops.var_mean(x, [1])


# -- scheduling ------------------------------------------------------------------------------


@pytest.mark.parametrize("index", [2, -3, 7])
def test_axis_out_of_range(index):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 4])
        fd.add_output(x)
        with pytest.raises(NvShardError, match=rf"T0: axis\({index}\) is out of range; its loop domain has 2 axes"):
            x.axis(index)


def test_axis_range_follows_the_loop_domain():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 4])
        fd.add_output(x)
        x.outer_split(0, 2)
        assert str(x.axis(2)) == "iS1{4}"  # three loop axes after the split
        with pytest.raises(NvShardError, match=r"T0: axis\(3\) is out of range; its loop domain has 3 axes"):
            x.axis(3)


@pytest.mark.parametrize("factor", [0, -2, 1.5])
@pytest.mark.parametrize("method", ["outer_split", "inner_split", "split"])
def test_split_factor_must_be_positive(method, factor):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 4])
        fd.add_output(x)
        with pytest.raises(NvShardError, match=rf"T0: split factor must be a positive int, got {factor}"):
            getattr(x, method)(0, factor)


def test_split_axis_out_of_range():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 4])
        fd.add_output(x)
        with pytest.raises(NvShardError, match=r"T0: split axis 5 is out of range; the loop domain has 2 axes"):
            x.outer_split(5, 2)


def test_same_mesh_axis_on_two_loop_axes():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.neg(x))
        x.set_device_mesh(DeviceMesh(torch.arange(2)))
        x.outer_split(0, 2)
        x.outer_split(2, 2)
        x.axis(0).parallelize(ParallelType.mesh_x)
        with pytest.raises(NvShardError, match=r"T0: deviceIdx.x already parallelizes loop axis 0"):
            x.axis(2).parallelize(ParallelType.mesh_x)


def test_same_mesh_axis_on_two_loop_axes_2d_mesh():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1])
        fd.add_output(fd.ops.neg(x))
        x.set_device_mesh(DeviceMesh(torch.arange(4).reshape(2, 2)))
        x.outer_split(1, 2)
        x.axis(1).parallelize(ParallelType.mesh_y)
        x.outer_split(0, 2)
        with pytest.raises(NvShardError, match=r"T0: deviceIdx.y already parallelizes loop axis 2"):
            x.axis(0).parallelize(ParallelType.mesh_y)


@pytest.mark.parametrize("mesh_first", [True, False], ids=["mesh_then_parallelize", "parallelize_then_mesh"])
@pytest.mark.parametrize("ptype,name", [(ParallelType.mesh_y, "y"), (ParallelType.mesh_z, "z")])
def test_mesh_axis_the_mesh_does_not_have(ptype, name, mesh_first):
    mesh = DeviceMesh(torch.arange(2))
    with pytest.raises(NvShardError, match=rf"T0: cannot parallelize loop axis 0 on deviceIdx.{name}: "
                                           r"DeviceMesh\{0 1\} has 1 dimension\(s\), axes DIDx"):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1])
            fd.add_output(fd.ops.neg(x))
            if mesh_first:
                x.set_device_mesh(mesh)
            x.outer_split(0, 2)
            x.axis(0).parallelize(ptype)
            if not mesh_first:
                x.set_device_mesh(mesh)


def test_mesh_z_on_2d_mesh():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.neg(x))
        x.set_device_mesh(DeviceMesh(torch.arange(4).reshape(2, 2)))
        x.outer_split(1, 2)
        with pytest.raises(NvShardError, match=r"T0: cannot parallelize loop axis 1 on deviceIdx.z: .* axes DIDy, DIDx"):
            x.axis(1).parallelize(ParallelType.mesh_z)


def test_parallelized_axis_without_a_mesh():
    with pytest.raises(NvShardError, match=r"T0: loop axis 0 is parallelized on deviceIdx.x but the tensor has no device mesh"):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1])
            fd.add_output(fd.ops.neg(x))
            x.outer_split(0, 2)
            x.axis(0).parallelize(ParallelType.mesh_x)


def test_parallelizing_an_extent_other_than_the_mesh_size():
    with FusionDefinition() as fd:
        x = fd.define_tensor([3, -1])
        fd.add_output(fd.ops.neg(x))
        x.set_device_mesh(DeviceMesh(torch.arange(4)))
        with pytest.raises(NvShardError, match=r"T0: loop axis 0 has extent 3 but deviceIdx.x has 4 devices; split it by 4"):
            x.axis(0).parallelize(ParallelType.mesh_x)


def test_splitting_a_parallelized_axis():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.neg(x))
        x.set_device_mesh(DeviceMesh(torch.arange(2)))
        x.outer_split(0, 2)
        x.axis(0).parallelize(ParallelType.mesh_x)
        with pytest.raises(NvShardError, match=r"T0: axis 0 is already parallelized on deviceIdx.x"):
            x.outer_split(0, 2)


# -- divisibility of sharded extents ------------------------------------------------------------


def _sharded(shape=(-1, -1), mesh=None, splits=((0, 4, ParallelType.mesh_x, False),)):
    """One input, split and parallelized per `splits`: (axis, factor, type, inner)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(list(shape))
        fd.add_output(fd.ops.neg(x))
        x.set_device_mesh(mesh or DeviceMesh(torch.arange(4)))
        for axis, factor, ptype, inner in splits:
            if inner:
                x.inner_split(axis, factor)
                x.axis(axis + 1).parallelize(ptype)
            else:
                x.outer_split(axis, factor)
                x.axis(axis).parallelize(ptype)
    return fd, x


def test_simulate_with_an_extent_the_mesh_does_not_divide():
    fd, _ = _sharded()
    with pytest.raises(NvShardError, match=r"T0: axis 0 has extent 6, which is not divisible by DIDx \(4 devices\)"):
        nvfuser.simulate(fd, [torch.randn(6, 3)])


def test_propagate_shardings_with_an_extent_the_mesh_does_not_divide():
    fd, _ = _sharded()
    with pytest.raises(NvShardError, match=r"T0: axis 0 has extent 6, which is not divisible by DIDx \(4 devices\)"):
        nvfuser.propagate_shardings(fd, [[6, 3]])
    # a dividing extent plans fine
    assert nvfuser.propagate_shardings(fd, [[8, 3]]).mesh_axes(fd.fusion.inputs()[0]) == [["x"], []]


def test_static_extent_the_mesh_does_not_divide():
    fd, _ = _sharded(shape=(6, 3))
    with pytest.raises(NvShardError, match=r"T0: axis 0 has extent 6, which is not divisible by DIDx \(4 devices\)"):
        nvfuser.simulate(fd, [torch.randn(6, 3)])


def test_2d_mesh_inner_split_not_divisible():
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2))
    splits = ((1, 2, ParallelType.mesh_y, True), (0, 2, ParallelType.mesh_x, False))
    fd, _ = _sharded(mesh=mesh, splits=splits)
    with pytest.raises(NvShardError, match=r"T0: axis 1 has extent 5, which is not divisible by DIDy \(2 devices\)"):
        nvfuser.simulate(fd, [torch.randn(4, 5)])
    with pytest.raises(NvShardError, match=r"T0: axis 0 has extent 3, which is not divisible by DIDx \(2 devices\)"):
        nvfuser.simulate(fd, [torch.randn(3, 4)])


def test_shard_tensor_with_an_extent_the_mesh_does_not_divide():
    _, x = _sharded()
    with pytest.raises(NvShardError, match=r"T0: axis 0 has extent 6, which DIDx \(4 devices\) does not divide"):
        shard_tensor(torch.randn(6, 3), x, 0)
    assert shard_tensor(torch.arange(8.0).reshape(8, 1), x, 2).flatten().tolist() == [4.0, 5.0]


def test_shard_tensor_unsplit_device_axis_must_equal_the_mesh_size():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.neg(x))
        x.set_device_mesh(DeviceMesh(torch.arange(4)))
        x.axis(0).parallelize(ParallelType.mesh_x)
    with pytest.raises(NvShardError, match=r"T0: axis 0 has extent 3, which \[DIDx\] \(4 devices\) does not divide"):
        shard_tensor(torch.randn(3, 2), x, 0)
    assert shard_tensor(torch.arange(8.0).reshape(4, 2), x, 1).tolist() == [[2.0, 3.0]]


def test_shard_tensor_rank_and_rank_outside_mesh():
    _, x = _sharded()
    with pytest.raises(NvShardError, match=r"T0 has rank 2; got a tensor of shape \(8,\)"):
        shard_tensor(torch.randn(8), x, 0)
    with pytest.raises(NvShardError, match=r"rank 5 is not in T0's mesh DeviceMesh\{0 1 2 3\}"):
        shard_tensor(torch.randn(8, 2), x, 5)


def test_mesh_shard_tensor_not_divisible():
    with pytest.raises(NvShardError, match=r"axis 0 of extent 4 is not divisible by the mesh size 3"):
        DeviceMesh([0, 1, 2]).shard_tensor(torch.randn(4), 0, 0)


def test_execute_needs_as_many_processes_as_devices():
    fd, _ = _sharded()
    with pytest.raises(NvShardError, match=r"meshes use devices \[0, 1, 2, 3\], but this job has 1 process"):
        fd.execute([torch.randn(2, 3)])


# -- DeviceMesh ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "devices,dups",
    [([0, 1, 1], r"\[1\] in \[0, 1, 1\]"),
     (torch.tensor([[0, 1], [2, 0]]), r"\[0\] in \[0, 1, 2, 0\]"),
     (torch.tensor([[[3, 3]], [[3, 4]]]), r"\[3\] in \[3, 3, 3, 4\]")],
)
def test_mesh_with_duplicate_devices(devices, dups):
    with pytest.raises(NvShardError, match=r"DeviceMesh devices contain duplicates: " + dups):
        DeviceMesh(devices)


def test_mesh_bad_rank_and_ids():
    with pytest.raises(NvShardError, match=r"DeviceMesh must be 1-D to 3-D, got shape \(2, 2, 2, 2\)"):
        DeviceMesh(torch.arange(16).reshape(2, 2, 2, 2))
    with pytest.raises(NvShardError, match=r"device ids must be >= 0, got \[0, -1\]"):
        DeviceMesh([0, -1])


def test_set_device_mesh_needs_a_mesh():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        with pytest.raises(NvShardError, match=r"T0: set_device_mesh expects a DeviceMesh, got \[0, 1\]"):
            x.set_device_mesh([0, 1])



@pytest.mark.parametrize("k_shape,v_shape,message", [
    ([2, 4, 8, 32], [2, 4, 8, 16], r"sdpfa_fwd: head dim must match: T0 axis 3 has extent 16, T1 axis 3 has 32"),
    ([2, 4, 8, 16], [2, 4, 6, 16], r"sdpfa_fwd: key length must match: T1 axis 2 has extent 8, T2 axis 2 has 6"),
    ([2, 4, 8, 16], [2, 2, 8, 16], r"sdpfa_fwd: batch and head must match: T0 axis 1 has extent 4, T2 axis 1 has 2"),
], ids=["head_dim", "key_length", "heads"])
def test_sdpfa_fwd_mismatched_extents(k_shape, v_shape, message):
    with FusionDefinition() as fd:
        q, k, v = (fd.define_tensor(s, dtype=DataType.Float) for s in ([2, 4, 8, 16], k_shape, v_shape))
        with pytest.raises(NvShardError, match=message):
            fd.ops.sdpfa_fwd(q, k, v)
