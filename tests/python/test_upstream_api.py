"""The nvfuser_direct API upstream's multidevice suite uses, checked without
the upstream checkout: the profiler, the executor classes, dtype helpers,
nvFuser's type promotion, linear with a batched weight, attention's memory
layouts, stream-parallel chunking and bounded-memory attention dropout."""

import pytest
import torch
import torch.nn.functional as F

import nvshard as nvfuser
from nvshard import (CommunicatorBackend, CudaRequiredError, DataType, FusionDefinition, MemoryType, NvShardError,
                     PythonProfiler)
from nvshard.pytorch_utils import (nvfuser_dtype_to_torch_dtype, python_scalar_to_nvfuser_dtype,
                                   torch_dtype_to_nvfuser_dtype)

D = 4


def mesh(d=D):
    return nvfuser.multidevice.DeviceMesh(torch.arange(d))


def test_a_fusion_lists_tensors_defined_after_it_was_last_asked():
    """Fusion.tvs() is kept between calls (every plan asks twice) until
    the fusion grows: a tensor or an input defined later is listed."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 8], dtype=DataType.Float)
        y = fd.ops.relu(x)
        first = fd.fusion.tvs()
        first.append("not kept")  # callers get their own list
        z = fd.ops.neg(y)
        w = fd.define_tensor([4, 8], dtype=DataType.Float)
        fd.add_output(fd.ops.add(z, w))
    assert first[:2] == [x, y]
    assert fd.fusion.tvs()[:4] == [x, w, y, z] and len(fd.fusion.tvs()) == 5


# -- PythonProfiler ------------------------------------------------------------------------


def _reduce_scatter_linear():
    b, s, e = 2, 3, 5
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, D * s, D * e], dtype=DataType.Float)
        w = fd.define_tensor([-1, D * e], dtype=DataType.Float)
        out = fd.ops.linear(inp, w)
        fd.add_output(out)
        for tv in (inp, w, out):
            tv.set_device_mesh(mesh())
            tv.outer_split(-1, D)
            tv.axis(-2).parallelize(nvfuser.ParallelType.mesh_x)
        out.outer_split(1, D)
        out.axis(1).parallelize(nvfuser.ParallelType.mesh_x)
    inputs = [torch.randn(b, D * s, D * e), torch.randn(e, D * e)]
    return fd, inputs


def test_profiler_records_one_reduce_scatter_with_its_bytes():
    torch.manual_seed(0)
    fd, inputs = _reduce_scatter_linear()
    with PythonProfiler() as prof:
        sim = nvfuser.simulate(fd, inputs, world_size=D)
    comms = [k for k in prof.profile.kernel_profiles if k.scheduler == "communication"]
    assert [k.name for k in comms] == ["reduce_scatter"]
    assert comms[0].received_bytes == pytest.approx(sum(sim.received.values()))
    assert comms[0].received_bytes > 0
    assert {k.scheduler for k in prof.profile.kernel_profiles} == {"communication", "expr_eval"}
    torch.testing.assert_close(sim.output(0), F.linear(*inputs))


def test_profiler_records_nothing_outside_its_block():
    torch.manual_seed(0)
    fd, inputs = _reduce_scatter_linear()
    with PythonProfiler() as prof:
        pass
    nvfuser.simulate(fd, inputs, world_size=D)
    assert prof.profile.kernel_profiles == []


def test_profiler_on_one_device_has_no_communication():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, 8], dtype=DataType.Float)
        w = fd.define_tensor([-1, 8], dtype=DataType.Float)
        out = fd.ops.linear(a, w)
        fd.add_output(out)
        for tv in (a, w, out):
            tv.set_device_mesh(mesh(1))
            tv.outer_split(-1, 1)
            tv.axis(-2).parallelize(nvfuser.ParallelType.mesh_x)
    with PythonProfiler() as prof:
        fd.execute([torch.randn(3, 8), torch.randn(4, 8)])
    assert [k.scheduler for k in prof.profile.kernel_profiles if k.scheduler == "communication"] == []


# -- executor classes, memory types, dtype helpers -------------------------------------------


def _relu_fusion():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.relu(x))
    return fd


def test_multidevice_executor_runs_the_fusion():
    fd = _relu_fusion()
    params = nvfuser.multidevice.MultiDeviceExecutorParams()
    assert params.backend_type is CommunicatorBackend.nccl
    params.use_allocation_cache = True
    params.offset_stream_indexing_by_rank = True
    x = torch.randn(3, 4)
    (out,) = nvfuser.multidevice.MultiDeviceExecutor(fd.fusion, params).run([x])
    torch.testing.assert_close(out, x.relu())


def test_multidevice_executor_cuda_backend_needs_cuda():
    params = nvfuser.multidevice.MultiDeviceExecutorParams()
    params.backend_type = CommunicatorBackend.cuda
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(CudaRequiredError, match="needs CUDA: CommunicatorBackend.cuda"):
        nvfuser.multidevice.MultiDeviceExecutor(_relu_fusion().fusion, params)


def test_multidevice_executor_rejects_bad_arguments():
    with pytest.raises(NvShardError, match="expects fd.fusion"):
        nvfuser.multidevice.MultiDeviceExecutor(_relu_fusion())
    params = nvfuser.multidevice.MultiDeviceExecutorParams()
    params.backend_type = "nccl"
    with pytest.raises(NvShardError, match="must be a CommunicatorBackend"):
        nvfuser.multidevice.MultiDeviceExecutor(_relu_fusion().fusion, params)


def test_memory_types():
    assert {m.name for m in MemoryType} == {"local", "shared", "global", "tensor", "symmetric"}
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Float)
        y = fd.ops.relu(x)
        y.set_memory_type(getattr(MemoryType, "global"))
        assert y.memory_type is getattr(MemoryType, "global")
        if not torch.cuda.is_available():
            with pytest.raises(CudaRequiredError, match="symmetric memory"):
                y.set_memory_type(MemoryType.symmetric)
        with pytest.raises(NvShardError, match="expects a MemoryType"):
            y.set_memory_type("global")
        fd.add_output(y)


@pytest.mark.parametrize("dtype, expected", [(torch.bfloat16, DataType.BFloat16), (torch.float16, DataType.Half),
                                             (torch.float32, DataType.Float), (torch.int64, DataType.Int),
                                             (torch.int32, DataType.Int32), (torch.bool, DataType.Bool),
                                             (float, DataType.Double), (int, DataType.Int)])
def test_torch_dtype_to_nvfuser_dtype(dtype, expected):
    assert torch_dtype_to_nvfuser_dtype(dtype) is expected
    if isinstance(dtype, torch.dtype):
        assert nvfuser_dtype_to_torch_dtype(expected) == dtype


def test_dtype_helpers_reject_unknown():
    with pytest.raises(NvShardError, match="no DataType for torch.complex64"):
        torch_dtype_to_nvfuser_dtype(torch.complex64)
    assert python_scalar_to_nvfuser_dtype(2.5) is DataType.Double
    with pytest.raises(NvShardError, match="expected a bool, int or float"):
        python_scalar_to_nvfuser_dtype("x")


# -- type promotion (nvFuser's computeTypes) ------------------------------------------------

# Output dtypes of the real nvfuser_direct 0.2.36 for bf16 operands.
PROMOTION = {"add": DataType.Float, "sub": DataType.Float, "mul": DataType.Float, "pow": DataType.Float,
             "neg": DataType.Float, "tanh": DataType.Float, "sigmoid": DataType.Float, "rsqrt": DataType.Float,
             "reciprocal": DataType.Float, "relu": DataType.BFloat16, "silu": DataType.BFloat16,
             "where": DataType.BFloat16, "lt": DataType.Bool}


@pytest.mark.parametrize("name", sorted(PROMOTION))
@pytest.mark.parametrize("reduced", [DataType.BFloat16, DataType.Half], ids=["bf16", "half"])
def test_reduced_precision_promotion(name, reduced):
    x = (torch.rand(3, 4) + 0.5).to(reduced.torch_dtype)
    y = (torch.rand(3, 4) + 0.5).to(reduced.torch_dtype)
    c = torch.rand(3, 4) > 0.5
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=reduced)
        b = fd.define_tensor([-1, -1], dtype=reduced)
        p = fd.define_tensor([-1, -1], dtype=DataType.Bool)
        op = getattr(fd.ops, name)
        out = op(p, a, b) if name == "where" else op(a, b) if name in ("add", "sub", "mul", "pow", "lt") else op(a)
        fd.add_output(out)
    expected_dtype = PROMOTION[name] if PROMOTION[name] is not DataType.BFloat16 else reduced
    assert out.dtype() is expected_dtype
    (result,) = fd.execute([x, y, c])
    ref_fn = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "pow": torch.pow, "lt": torch.lt,
              "neg": torch.neg, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "rsqrt": torch.rsqrt,
              "reciprocal": torch.reciprocal, "relu": torch.relu, "silu": F.silu}
    if name == "where":
        ref = torch.where(c, x, y)
    elif name in ("add", "sub", "mul", "pow", "lt"):
        ref = ref_fn[name](x.float(), y.float())
    else:
        ref = ref_fn[name](x.float())
    assert result.dtype == expected_dtype.torch_dtype
    torch.testing.assert_close(result, ref.to(result.dtype), rtol=1e-2, atol=1e-2)


def test_half_plus_half_is_float_when_sharded():
    # upstream's test_binary: the sum of two Half tensors is Float, exactly x.float() + y.float()
    x, y = torch.randn(D * 2, 3).half(), torch.randn(D * 2, 3).half()
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=DataType.Half)
        b = fd.define_tensor([-1, -1], dtype=DataType.Half)
        fd.add_output(fd.ops.add(a, b))
        a.set_device_mesh(mesh())
        b.set_device_mesh(mesh())
        b.outer_split(0, D)
        b.axis(0).parallelize(nvfuser.ParallelType.mesh_x)
    sim = nvfuser.simulate(fd, [x, y], world_size=D)
    assert sim.output(0).dtype == torch.float32
    torch.testing.assert_close(sim.output(0), x.float() + y.float(), rtol=0, atol=0)


# -- linear with a batched weight --------------------------------------------------------------


def test_linear_weight_batch_axes_come_first():
    with FusionDefinition() as fd:
        a = fd.define_tensor([2, 5, 7])
        w = fd.define_tensor([3, 4, 7])
        bias = fd.define_tensor([3, 4])
        out = fd.ops.linear(a, w, bias)
        fd.add_output(out)
    # nvfuser_direct prints T3_g_float[iS8{3}, iS9{2}, iS10{5}, iS11{4}, rS12{7}]
    assert [str(i.extent()) for i in out.logical] == ["3", "2", "5", "4", "7"]
    assert out.logical[-1].is_reduction()
    x, wt, bt = torch.randn(2, 5, 7), torch.randn(3, 4, 7), torch.randn(3, 4)
    (result,) = fd.execute([x, wt, bt])
    expected = F.linear(x, wt.reshape(-1, 7), bt.reshape(-1)).view(2, 5, 3, 4).permute(2, 0, 1, 3)
    torch.testing.assert_close(result, expected)


def test_linear_logical_split_weight_sharded_on_its_batch_axis():
    # upstream's test_linear_logical_split: weight [d, e, e] and bias [d, e] sharded on axis 0
    b, s, e = 2, 6, 8
    with FusionDefinition() as fd:
        inp = fd.define_tensor([b, s, e])
        w = fd.define_tensor([D, e, e], contiguity=True)
        bias = fd.define_tensor([D, e], contiguity=True)
        fd.add_output(fd.ops.linear(inp, w, bias))
        for t in (inp, w, bias):
            t.set_device_mesh(mesh())
        for t in (w, bias):
            t.axis(0).parallelize(nvfuser.ParallelType.mesh_x)
    x, wt, bt = torch.randn(b, s, e), torch.randn(D, e, e), torch.randn(D, e)
    sim = nvfuser.simulate(fd, [x, wt, bt], world_size=D)
    expected = F.linear(x, wt.view(-1, e), bt.view(-1)).view(b, s, D, e).permute(2, 0, 1, 3)
    assert sim.plan.mesh_axes(fd.fusion.outputs()[0]) == [["x"], [], [], []]
    assert sim.bytes_per_device == 0
    torch.testing.assert_close(sim.output(0), expected)


def test_linear_rejects_a_bias_that_does_not_match_the_weight():
    with FusionDefinition() as fd:
        a = fd.define_tensor([2, 7])
        w = fd.define_tensor([3, 4, 7])
        bias = fd.define_tensor([5, 4])
        with pytest.raises(NvShardError, match=r"bias T2 must have shape \[3, 4\] or a suffix of it, got \[5, 4\]"):
            fd.ops.linear(a, w, bias)


# -- attention layouts and dropout -------------------------------------------------------------


@pytest.mark.parametrize("stride_order", [[3, 2, 1, 0], [3, 1, 2, 0]], ids=["bhse", "bshe"])
def test_sdpa_results_follow_the_inputs_layout(stride_order):
    b, h, s, e = 2, 4, 16, 8
    with FusionDefinition() as fd:
        q, k, v, g = [fd.define_tensor([-1, h, -1, e], dtype=DataType.BFloat16, stride_order=stride_order)
                      for _ in range(4)]
        p = fd.define_scalar(0.0, dtype=DataType.Double)
        causal = fd.define_scalar(True, dtype=DataType.Bool)
        attn, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, dropout_p=p, is_causal=causal)
        grads = fd.ops.sdpfa_bwd(g, q, k, v, attn, lse, p, causal, seed, offset, scale=None)
        fd.add_output(attn)
        for t in grads:
            fd.add_output(t)
    bshe = stride_order == [3, 1, 2, 0]
    ref = [torch.randn(b, h, s, e, dtype=torch.bfloat16) for _ in range(4)]
    inputs = [t.transpose(1, 2).contiguous().transpose(1, 2) if bshe else t for t in ref]
    results = fd.execute(inputs)
    qr, kr, vr = (t.float().requires_grad_() for t in ref[:3])
    out = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
    out.backward(ref[3].float())
    for got, want in zip(results, (out, qr.grad, kr.grad, vr.grad)):
        assert got.transpose(1, 2).is_contiguous() if bshe else got.is_contiguous()
        torch.testing.assert_close(got, want.to(torch.bfloat16), rtol=1.6e-2, atol=1e-2)


def _dropout_attention(shard: bool, h=8, s=32, e=16):
    with FusionDefinition() as fd:
        q, k, v = [fd.define_tensor([1, h, s, e], dtype=DataType.Float) for _ in range(3)]
        attn, lse, _, _ = fd.ops.sdpfa_fwd(q, k, v, dropout_p=fd.define_scalar(0.25, dtype=DataType.Double),
                                           is_causal=fd.define_scalar(True, dtype=DataType.Bool))
        fd.add_output(attn)
        if shard:
            for t in (q, k, v):
                t.set_device_mesh(mesh())
                t.outer_split(1, D)
                t.axis(1).parallelize(nvfuser.ParallelType.mesh_x)
    return fd


def test_attention_dropout_is_the_same_for_every_sharding():
    torch.manual_seed(0)
    inputs = [torch.randn(1, 8, 32, 16) for _ in range(3)]
    whole = nvfuser.simulate(_dropout_attention(False), inputs, world_size=1).output(0)
    sharded = nvfuser.simulate(_dropout_attention(True), inputs, world_size=D).output(0)
    torch.testing.assert_close(sharded, whole)
    without = F.scaled_dot_product_attention(*inputs, is_causal=True)
    assert not torch.allclose(whole, without)  # dropout really dropped something


def test_attention_runs_in_bounded_blocks(monkeypatch):
    # blocks of one (batch, head) entry give the same result as one block
    from nvshard.ops import attention

    torch.manual_seed(0)
    inputs = [torch.randn(1, 8, 32, 16) for _ in range(3)]
    one_block = nvfuser.simulate(_dropout_attention(False), inputs, world_size=1).output(0)
    monkeypatch.setattr(attention, "_BLOCK_ELEMENTS", 32 * 32)
    per_entry = nvfuser.simulate(_dropout_attention(False), inputs, world_size=1).output(0)
    torch.testing.assert_close(per_entry, one_block)


# -- stream-parallel axes ----------------------------------------------------------------------


def _row_parallel(h, s, d):
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, h * 4], contiguity=True, dtype=DataType.BFloat16)
        w = fd.define_tensor([h, h * 4], contiguity=True, dtype=DataType.BFloat16)
        fd.add_output(fd.ops.linear(inp, w))
        for tv in (inp, w):
            tv.set_device_mesh(mesh(d))
        inp.outer_split(0, s)
        inp.axis(0).parallelize(nvfuser.ParallelType.stream)
        inp.outer_split(2, d)
        inp.axis(2).parallelize(nvfuser.ParallelType.mesh_x)
        w.outer_split(1, d)
        w.axis(1).parallelize(nvfuser.ParallelType.mesh_x)
    return fd


@pytest.mark.parametrize("chunks", [1, 3])
def test_stream_axis_on_an_input_runs_the_linear_in_chunks(chunks):
    h, t = 2, 6
    inp = torch.randint(-3, 4, (t, h * 4)).to(torch.bfloat16)
    w = torch.randint(-3, 4, (h, h * 4)).to(torch.bfloat16)
    fd = _row_parallel(h, chunks, D)
    with torch.profiler.profile(record_shapes=True) as prof:
        sim = nvfuser.simulate(fd, [inp, w], world_size=D)
    mms = [e for e in prof.events() if e.name == "aten::mm"]
    assert len(mms) == chunks * D  # every simulated rank multiplies each chunk
    assert all(e.input_shapes == [[t // chunks, h * 4 // D], [h * 4 // D, h], [t // chunks, h]] for e in mms)
    torch.testing.assert_close(sim.output(0), F.linear(inp, w))
    assert [c.kind for c in sim.plan.communications] == ["allreduce"]


def test_stream_axis_on_the_output_spreads_back_to_the_operands():
    s, m, k, n = 4, 8, 16, 12
    with FusionDefinition() as fd:
        x = fd.define_tensor([s, D, m, k], contiguity=True, dtype=DataType.Float)
        w = fd.define_tensor([n, k], contiguity=True, dtype=DataType.Float)
        bias = fd.define_tensor([n], contiguity=True, dtype=DataType.Float)
        out = fd.ops.linear(x, w, bias)
        fd.add_output(out)
        for tv in (x, w, bias, out):
            tv.set_device_mesh(mesh())
        x.axis(1).parallelize(nvfuser.ParallelType.mesh_x)
        out.axis(0).parallelize(nvfuser.ParallelType.stream)
    xs, ws, bs = torch.randn(s, D, m, k), torch.randn(n, k), torch.randn(n)
    calls = []
    from nvshard.runtime import streams

    original = streams.run_in_chunks

    def spy(expr, args, ctx, chunks, operand_dims, result_dims, rotation):
        calls.append((chunks, operand_dims, result_dims))
        return original(expr, args, ctx, chunks, operand_dims, result_dims, rotation)

    streams.run_in_chunks = spy
    try:
        sim = nvfuser.simulate(fd, [xs, ws, bs], world_size=D)
    finally:
        streams.run_in_chunks = original
    assert calls and all(c == (s, [0, None, None], [0]) for c in calls)
    torch.testing.assert_close(sim.output(0), F.linear(xs, ws, bs))


def test_stream_axes_with_different_chunk_counts_are_an_error():
    with FusionDefinition() as fd:
        a = fd.define_tensor([6, 4], dtype=DataType.Float)
        w = fd.define_tensor([5, 4], dtype=DataType.Float)
        out = fd.ops.linear(a, w)
        fd.add_output(out)
        a.outer_split(0, 2)
        a.axis(0).parallelize(nvfuser.ParallelType.stream)
        out.outer_split(0, 3)
        out.axis(0).parallelize(nvfuser.ParallelType.stream)
    with pytest.raises(NvShardError, match=r"different numbers of chunks \[2, 3\]"):
        fd.execute([torch.randn(6, 4), torch.randn(5, 4)])


def _column_parallel(t, h, swizzle: bool):
    # upstream HEAD's column_parallel_linear_forward: the gathered input is
    # stream-parallel over the devices' blocks, ring-ordered by swizzle1d
    with FusionDefinition() as fd:
        inp = fd.define_tensor((-1, h), contiguity=True, dtype=DataType.Float)
        w = fd.define_tensor((4 * h, h), contiguity=True, dtype=DataType.Float)
        gathered = fd.ops.set(inp)
        fd.add_output(fd.ops.linear(gathered, w))
        for tv in (inp, w):
            tv.set_device_mesh(mesh())
            tv.outer_split(0, D)
            tv.axis(0).parallelize(nvfuser.ParallelType.mesh_x)
        gathered.set_device_mesh(mesh())
        gathered.outer_split(0, D)
        if swizzle:
            gathered.swizzle1d(0, nvfuser.ParallelType.mesh_x)
        gathered.axis(0).parallelize(nvfuser.ParallelType.stream)
    return fd


def test_swizzle1d_rotates_the_chunk_order_per_device():
    from nvshard.runtime import streams

    t, h = 24, 2
    inp, w = torch.randn(t, h), torch.randn(4 * h, h)
    orders = []
    original = streams.chunk_order

    def spy(chunks, ctx, rotation):
        order = original(chunks, ctx, rotation)
        orders.append((ctx.rank, order))
        return order

    streams.chunk_order = spy
    try:
        swizzled = nvfuser.simulate(_column_parallel(t, h, True), [inp, w], world_size=D)
        orders_swizzled, orders[:] = list(orders), []
        plain = nvfuser.simulate(_column_parallel(t, h, False), [inp, w], world_size=D)
    finally:
        streams.chunk_order = original
    assert sorted(orders_swizzled) == [(r, [(r + i) % D for i in range(D)]) for r in range(D)]
    assert sorted(orders) == [(r, list(range(D))) for r in range(D)]
    expected = F.linear(inp, w)
    torch.testing.assert_close(swizzled.output(0), expected)
    torch.testing.assert_close(plain.output(0), expected)


def test_swizzle1d_needs_a_mesh_axis():
    with FusionDefinition() as fd:
        x = fd.define_tensor([8], dtype=DataType.Float)
        fd.add_output(x)
        with pytest.raises(NvShardError, match="set_device_mesh first"):
            x.swizzle1d(0, nvfuser.ParallelType.mesh_x)
        x.set_device_mesh(mesh())
        with pytest.raises(NvShardError, match="needs a device parallel type"):
            x.swizzle1d(0, nvfuser.ParallelType.stream)


def test_a_stream_axis_reaches_a_linear_through_a_reduction():
    # the linear's operand keeps the summed axis in its logical domain; the
    # rule lists only its other axes, so the stream axis is found by position there
    s = 4
    with FusionDefinition() as fd:
        x = fd.define_tensor([3, 8, 6], contiguity=True, dtype=DataType.Float)
        w = fd.define_tensor([5, 6], contiguity=True, dtype=DataType.Float)
        out = fd.ops.linear(fd.ops.sum(x, dims=[0]), w)
        fd.add_output(out)
        x.outer_split(1, s)
        x.axis(1).parallelize(nvfuser.ParallelType.stream)
    xs, ws = torch.randn(3, 8, 6), torch.randn(5, 6)
    calls = []
    from nvshard.runtime import streams

    original = streams.run_in_chunks

    def spy(expr, args, ctx, chunks, operand_dims, result_dims, rotation):
        calls.append((expr.op.name, chunks, operand_dims, result_dims))
        return original(expr, args, ctx, chunks, operand_dims, result_dims, rotation)

    streams.run_in_chunks = spy
    try:
        (got,) = fd.execute([xs, ws])
    finally:
        streams.run_in_chunks = original
    assert ("linear", s, [0, None], [0]) in calls
    torch.testing.assert_close(got, F.linear(xs.sum(0), ws))
