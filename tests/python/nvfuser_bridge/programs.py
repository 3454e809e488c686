"""The test programs, written against a module with nvfuser_direct's API
(the real `nvfuser_direct`, or `nvshard`): AlphaFold3's triangle
multiplicative update (upstream's tests/python/multidevice/test_alphafold3.py
at 7e04d26, WITHOUT its hand annotation of the matmul output), the GPT MLP
with a residual (nvshard/models.py) and upstream's transformer layer
forward (test_transformer.py), each with upstream's input annotations.

Every builder returns (fd, named TensorViews). Input shapes are GLOBAL."""

from __future__ import annotations

import torch

PROGRAMS = [
    "triangle_outgoing", "triangle_outgoing_swapped", "triangle_incoming", "triangle_incoming_swapped",
    "mlp_tp", "mlp_sp", "transformer_tp", "transformer_sp",
]


def _layer_norm(nvf, fd, x, w, b):
    DataType = nvf.DataType
    io_dtype = x.dtype()
    x = fd.ops.cast(x, dtype=DataType.Float)
    var, mean = fd.ops.var_mean(x, dims=[-1], correction=0, keepdim=True)
    y = fd.ops.sub(x, mean)
    var = fd.ops.add(var, fd.define_scalar(1e-5))
    y = fd.ops.mul(y, fd.ops.rsqrt(var))
    shape = fd.ops.shape(x)
    w = fd.ops.broadcast_in_dim(w, shape=shape, broadcast_dims=[-1])
    y = fd.ops.mul(y, w)
    b = fd.ops.broadcast_in_dim(b, shape=shape, broadcast_dims=[-1])
    y = fd.ops.add(y, b)
    return fd.ops.cast(y, dtype=io_dtype)


def _gating(nvf, fd, z, w_p, z_in, w_g):
    io_dtype = z.dtype()
    p = fd.ops.linear(z, w_p)
    g = fd.ops.sigmoid(fd.ops.linear(z_in, w_g))
    return fd.ops.cast(fd.ops.mul(p, g), dtype=io_dtype)


def triangle(nvf, outgoing: bool, swap_operands: bool = False, d: int = 4, c_z: int = 128, annotate: bool = True):
    DataType, P = nvf.DataType, nvf.ParallelType
    cp = 2
    dp = d // (cp * cp)
    bf16 = DataType.BFloat16
    with nvf.FusionDefinition() as fd:
        z_in_tv = fd.define_tensor(shape=[-1, -1, -1, c_z], dtype=bf16, contiguity=True)
        w_norm_in = fd.define_tensor(shape=[c_z], dtype=bf16, contiguity=True)
        b_norm_in = fd.define_tensor(shape=[c_z], dtype=bf16, contiguity=True)
        w_p_in = fd.define_tensor(shape=[c_z * 2, c_z], dtype=bf16, contiguity=True)
        w_g_in = fd.define_tensor(shape=[c_z * 2, c_z], dtype=bf16, contiguity=True)
        w_norm_out = fd.define_tensor(shape=[c_z], dtype=bf16, contiguity=True)
        b_norm_out = fd.define_tensor(shape=[c_z], dtype=bf16, contiguity=True)
        w_p_out = fd.define_tensor(shape=[c_z, c_z], dtype=bf16, contiguity=True)
        w_g_out = fd.define_tensor(shape=[c_z, c_z], dtype=bf16, contiguity=True)
        mask_tv = fd.define_tensor(shape=[-1, -1, -1], dtype=DataType.Bool, contiguity=True)
        batch_size = fd.ops.size(z_in_tv, 0)
        n_tokens = fd.ops.size(z_in_tv, 1)
        z_in = _layer_norm(nvf, fd, z_in_tv, w_norm_in, b_norm_in)
        z = _gating(nvf, fd, z_in, w_p_in, z_in, w_g_in)
        mask = fd.ops.broadcast_in_dim(mask_tv, shape=[batch_size, n_tokens, n_tokens, c_z], broadcast_dims=[0, 1, 2])
        z = fd.ops.where(mask, z, 0.0)
        a = fd.ops.slice(z, [0, 0, 0, 0], [batch_size, n_tokens, n_tokens, c_z])
        b = fd.ops.slice(z, [0, 0, 0, c_z], [batch_size, n_tokens, n_tokens, c_z * 2])
        if outgoing:  # einsum("bikc,bjkc->bijc", a, b)
            a = fd.ops.permute(a, [0, 3, 1, 2])  # [b, c, i, k]
            b = fd.ops.permute(b, [0, 3, 2, 1])  # [b, c, k, j]
        else:  # einsum("bkic,bkjc->bijc", a, b)
            a = fd.ops.permute(a, [0, 3, 2, 1])
            b = fd.ops.permute(b, [0, 3, 1, 2])
        if swap_operands:  # [b, c, j, k] @ [b, c, k, i] = [b, c, j, i]
            z = fd.ops.matmul(fd.ops.permute(b, [0, 1, 3, 2]), fd.ops.permute(a, [0, 1, 3, 2]))
            matmul_out = z
            z = fd.ops.permute(z, [0, 3, 2, 1])
        else:
            z = fd.ops.matmul(a, b)  # [b, c, i, j]
            matmul_out = z
            z = fd.ops.permute(z, [0, 2, 3, 1])
        z = _layer_norm(nvf, fd, z, w_norm_out, b_norm_out)
        z = _gating(nvf, fd, z, w_p_out, z_in, w_g_out)
        fd.add_output(z)
        inputs = [z_in_tv, w_norm_in, b_norm_in, w_p_in, w_g_in, w_norm_out, b_norm_out, w_p_out, w_g_out, mask_tv]
        if annotate:
            mesh = nvf.multidevice.DeviceMesh(torch.arange(d).reshape(dp, cp, cp))
            for tv in inputs:
                tv.set_device_mesh(mesh)
            for tv in (z_in_tv, mask_tv):
                tv.outer_split(2, cp)
                tv.axis(2).parallelize(P.mesh_x)
                tv.outer_split(1, cp)
                tv.axis(1).parallelize(P.mesh_y)
                tv.outer_split(0, dp)
                tv.axis(0).parallelize(P.mesh_z)
    return fd, dict(z_in=z_in_tv, mask=mask_tv, matmul_out=matmul_out, out=z)


def triangle_shapes(d: int = 4, c_z: int = 128, b_local: int = 3, n_local: int = 5):
    cp = 2
    dp = d // (cp * cp)
    b, n = b_local * dp, n_local * cp
    return [[b, n, n, c_z], [c_z], [c_z], [2 * c_z, c_z], [2 * c_z, c_z], [c_z], [c_z], [c_z, c_z], [c_z, c_z],
            [b, n, n]]


def _gelu_tanh(nvf, fd, x):
    x = fd.ops.cast(x, nvf.DataType.Float)
    x3 = fd.ops.mul(fd.ops.mul(x, x), x)
    inner = fd.ops.mul(fd.define_scalar(0.797885), fd.ops.add(x, fd.ops.mul(fd.define_scalar(0.044715), x3)))
    return fd.ops.mul(fd.ops.mul(fd.define_scalar(0.5), x), fd.ops.add(fd.define_scalar(1.0), fd.ops.tanh(inner)))


def mlp(nvf, sequence_parallel: bool, d: int = 4, h: int = 16, annotate: bool = True):
    """The GPT MLP of nvshard/models.py: out = linear(gelu(linear(inp, up_w)), down_w) + inp."""
    DataType, P = nvf.DataType, nvf.ParallelType
    f32 = DataType.Float
    with nvf.FusionDefinition() as fd:
        inp = fd.define_tensor([-1, h], dtype=f32, contiguity=True)
        up_w = fd.define_tensor([4 * h, h], dtype=f32, contiguity=True)
        down_w = fd.define_tensor([h, 4 * h], dtype=f32, contiguity=True)
        y = fd.ops.linear(inp, up_w)
        g = fd.ops.cast(_gelu_tanh(nvf, fd, y), f32)
        o = fd.ops.linear(g, down_w)
        out = fd.ops.cast(fd.ops.add(o, inp), f32)
        fd.add_output(out)
        if annotate:
            mesh = nvf.multidevice.DeviceMesh(torch.arange(d))
            for tv in (inp, up_w, down_w):
                tv.set_device_mesh(mesh)
            if sequence_parallel:
                inp.outer_split(0, d)
                inp.axis(0).parallelize(P.mesh_x)
            up_w.outer_split(0, d)
            up_w.axis(0).parallelize(P.mesh_x)
            down_w.outer_split(1, d)
            down_w.axis(1).parallelize(P.mesh_x)
    return fd, dict(inp=inp, y=y, g=g, o=o, out=out)


def mlp_shapes(d: int = 4, h: int = 16):
    return [[2 * d, h], [4 * h, h], [h, 4 * h]]


def transformer(nvf, sequence_parallel: bool, d: int = 4, b: int = 1, s: int = 8, h: int = 4, e: int = 16,
                annotate: bool = True):
    """Upstream's transformer_forward_definition and its multidevice schedule."""
    DataType, P = nvf.DataType, nvf.ParallelType
    bf16, f32, f64 = DataType.BFloat16, DataType.Float, DataType.Double
    with nvf.FusionDefinition() as fd:
        def tensor(shape):
            return fd.define_tensor(shape=shape, contiguity=True, dtype=bf16, is_cpu=False,
                                    stride_order=list(range(len(shape) - 1, -1, -1)))

        inp = tensor([b, s, e])
        ln0_w, ln0_b = tensor([e]), tensor([e])
        qkv_w, qkv_b = tensor([e * 3, e]), tensor([e * 3])
        proj_w, proj_b = tensor([e, e]), tensor([e])
        ln1_w, ln1_b = tensor([e]), tensor([e])
        up_w, up_b = tensor([e * 4, e]), tensor([e * 4])
        down_w, down_b = tensor([e, e * 4]), tensor([e])

        def layer_norm(x, w, bias):
            var, mean = fd.ops.var_mean(x, dims=[2], correction=0, keepdim=False)
            var = fd.ops.broadcast_in_dim(var, shape=[b, s, 1], broadcast_dims=[0, 1])
            mean_b = fd.ops.broadcast_in_dim(mean, shape=[b, s, 1], broadcast_dims=[0, 1])
            rstd = fd.ops.rsqrt(fd.ops.add(var, fd.define_scalar(1e-05, dtype=f64)))
            y = fd.ops.sub(x, fd.ops.broadcast_in_dim(mean_b, shape=[b, s, e], broadcast_dims=[0, 1, 2]))
            y = fd.ops.mul(y, fd.ops.broadcast_in_dim(rstd, shape=[b, s, e], broadcast_dims=[0, 1, 2]))
            y = fd.ops.mul(y, fd.ops.cast(fd.ops.broadcast_in_dim(w, shape=[b, s, e], broadcast_dims=[2]), f32))
            y = fd.ops.add(y, fd.ops.cast(fd.ops.broadcast_in_dim(bias, shape=[b, s, e], broadcast_dims=[2]), f32))
            return fd.ops.cast(y, dtype=bf16), mean, rstd

        def dropout(x):
            r = fd.ops.uniform(fd.define_scalar(0.0, dtype=f64), fd.define_scalar(1.0, dtype=f64), shape=[b, s, e],
                               dtype=bf16)
            mask = fd.ops.lt(r, fd.define_scalar(0.9, dtype=f64))
            x = fd.ops.mul(fd.ops.cast(x, dtype=f32), fd.ops.cast(mask, dtype=f32))
            return fd.ops.mul(x, fd.define_scalar(1.11111, dtype=f64)), mask

        x = fd.ops.cast(inp, dtype=f32)
        ln0, ln0_mean, ln0_rstd = layer_norm(x, ln0_w, ln0_b)
        qkv = fd.ops.linear(ln0, qkv_w, qkv_b)
        qkv_h = fd.ops.reshape(qkv, new_shape=[b, s, h, 3 * e // h])
        q = fd.ops.slice(qkv_h, start_indices=[0, 0, 0, 0], end_indices=[b, s, h, e // h])
        k = fd.ops.slice(qkv_h, start_indices=[0, 0, 0, e // h], end_indices=[b, s, h, 2 * e // h])
        v = fd.ops.slice(qkv_h, start_indices=[0, 0, 0, 2 * e // h], end_indices=[b, s, h, 3 * e // h])
        k = fd.ops.permute(k, dims=[0, 2, 1, 3])
        q = fd.ops.permute(q, dims=[0, 2, 1, 3])
        v = fd.ops.permute(v, dims=[0, 2, 1, 3])
        sdpa_out, sdpa_lse, sdpa_seed, sdpa_offset = fd.ops.sdpfa_fwd(
            q, k, v, dropout_p=fd.define_scalar(0.1, dtype=f64), is_causal=fd.define_scalar(True, dtype=DataType.Bool),
            scale=None)
        attn = fd.ops.permute(sdpa_out, dims=[0, 2, 1, 3])
        attn = fd.ops.stride_order(attn, stride_order=[3, 2, 1, 0])
        attn = fd.ops.reshape(attn, new_shape=[b, s, e])
        proj = fd.ops.linear(attn, proj_w, proj_b)
        dropped, mha_mask = dropout(proj)
        resid = fd.ops.add(x, dropped)
        ln1, ln1_mean, ln1_rstd = layer_norm(resid, ln1_w, ln1_b)
        up = fd.ops.linear(ln1, up_w, up_b)
        g = fd.ops.cast(_gelu_tanh(nvf, fd, up), dtype=bf16)
        down = fd.ops.linear(g, down_w, down_b)
        dropped2, mlp_mask = dropout(down)
        out = fd.ops.cast(fd.ops.add(resid, dropped2), dtype=bf16)
        named = dict(layernorm0_mean=ln0_mean, layernorm0_rstd=ln0_rstd, mha_linear0_out=qkv, sdpa_out=sdpa_out,
                     sdpa_logsum_exp=sdpa_lse, sdpa_seed=sdpa_seed, sdpa_offset=sdpa_offset, mha_linear1_out=proj,
                     mha_dropout_mask=mha_mask, layernorm1_mean=ln1_mean, layernorm1_rstd=ln1_rstd,
                     mlp_linear0_out=up, mlp_dropout_mask=mlp_mask, out=out)
        for tv in named.values():
            fd.add_output(tv)
        if annotate:
            mesh = nvf.multidevice.DeviceMesh(range(d))
            inputs = [inp, ln0_w, ln0_b, qkv_w, qkv_b, proj_w, proj_b, ln1_w, ln1_b, up_w, up_b, down_w, down_b]
            for tv in inputs:
                tv.set_device_mesh(mesh)
            if sequence_parallel:
                inp.outer_split(1, d)
                inp.axis(1).parallelize(P.mesh_x)
            for tv in (qkv_w, qkv_b, up_w, up_b):
                tv.outer_split(0, d)
                tv.axis(0).parallelize(P.mesh_x)
            for tv in (proj_w, down_w):
                tv.outer_split(-1, d)
                tv.axis(-2).parallelize(P.mesh_x)
    named["inp"] = inp
    return fd, named


def transformer_shapes(d: int = 4, b: int = 1, s: int = 8, e: int = 16):
    return [[b, s, e], [e], [e], [3 * e, e], [3 * e], [e, e], [e], [e], [e], [4 * e, e], [4 * e], [e, 4 * e], [e]]


def build(nvf, name: str, d: int = 4, annotate: bool = True, gpu_sizes: bool = False):
    """(fd, named TensorViews, global input shapes) of one of PROGRAMS.
    gpu_sizes: sizes GPU kernels accept (attention head dim 32, not 4)."""
    if name.startswith("triangle"):
        fd, named = triangle(nvf, "outgoing" in name, name.endswith("swapped"), d, annotate=annotate)
        return fd, named, triangle_shapes(d, n_local=8 if gpu_sizes else 5)
    if name.startswith("mlp"):
        h = 64 if gpu_sizes else 16
        fd, named = mlp(nvf, name.endswith("sp"), d, h=h, annotate=annotate)
        return fd, named, mlp_shapes(d, h=h)
    s, h, e = (64, 8, 256) if gpu_sizes else (8, 4, 16)
    fd, named = transformer(nvf, name.endswith("sp"), d, s=s, h=h, e=e, annotate=annotate)
    return fd, named, transformer_shapes(d, s=s, e=e)
