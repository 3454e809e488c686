"""Reference models, shared by the tests and the tools in tools/: the
AlphaFold3 triangle multiplicative update (as upstream's test_alphafold3)
and triangle attention, the GPT MLP and a transformer layer, each with its
annotations (the shardings upstream's tests use) and, where tests need one,
an unsharded torch reference.

The definitions and annotations of the triangle update, the MLP and the
transformer layer work with either frontend: nvshard, or the real
`nvfuser_direct` (tests/python/nvfuser_bridge/programs.py builds them
there); they take DataType and ParallelType from the module of the
FusionDefinition or DeviceMesh they are given (`frontend_of`)."""

from __future__ import annotations

import enum
import sys
from types import ModuleType

import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, TensorView


def frontend_of(obj) -> ModuleType:
    """The frontend module a FusionDefinition, TensorView or DeviceMesh comes
    from: the real nvfuser_direct when its type is defined there, else nvshard."""
    package = type(obj).__module__.partition(".")[0]
    return sys.modules[package] if package == "nvfuser_direct" else nvfuser


class Direction(enum.Enum):
    INCOMING = "incoming"
    OUTGOING = "outgoing"


def layer_norm(fd: FusionDefinition, x: TensorView, w: TensorView, b: TensorView) -> TensorView:
    io_dtype = x.dtype()
    x = fd.ops.cast(x, dtype=frontend_of(fd).DataType.Float)
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


def gating(fd, z, w_p, z_in, w_g) -> TensorView:
    io_dtype = z.dtype()
    p = fd.ops.linear(z, w_p)
    g = fd.ops.linear(z_in, w_g)
    g = fd.ops.sigmoid(g)
    z = fd.ops.mul(p, g)
    return fd.ops.cast(z, dtype=io_dtype)


def triangle_update(fd, direction: Direction, c_z: int, dtype=None, swap_operands: bool = False):
    """Defines the triangle multiplicative update (dtype: BFloat16 unless
    given); returns (inputs dict, matmul_out)."""
    DataType = frontend_of(fd).DataType
    if dtype is None:
        dtype = DataType.BFloat16
    z_in_tv = fd.define_tensor(shape=[-1, -1, -1, c_z], dtype=dtype, contiguity=True)
    w_norm_in = fd.define_tensor(shape=[c_z], dtype=dtype, contiguity=True)
    b_norm_in = fd.define_tensor(shape=[c_z], dtype=dtype, contiguity=True)
    w_p_in = fd.define_tensor(shape=[c_z * 2, c_z], dtype=dtype, contiguity=True)
    w_g_in = fd.define_tensor(shape=[c_z * 2, c_z], dtype=dtype, contiguity=True)
    w_norm_out = fd.define_tensor(shape=[c_z], dtype=dtype, contiguity=True)
    b_norm_out = fd.define_tensor(shape=[c_z], dtype=dtype, contiguity=True)
    w_p_out = fd.define_tensor(shape=[c_z, c_z], dtype=dtype, contiguity=True)
    w_g_out = fd.define_tensor(shape=[c_z, c_z], dtype=dtype, contiguity=True)
    mask_tv = fd.define_tensor(shape=[-1, -1, -1], dtype=DataType.Bool, contiguity=True)

    batch_size = fd.ops.size(z_in_tv, 0)
    n_tokens = fd.ops.size(z_in_tv, 1)

    z_in = layer_norm(fd, z_in_tv, w_norm_in, b_norm_in)
    z = gating(fd, z_in, w_p_in, z_in, w_g_in)
    mask = fd.ops.broadcast_in_dim(mask_tv, shape=[batch_size, n_tokens, n_tokens, c_z], broadcast_dims=[0, 1, 2])
    z = fd.ops.where(mask, z, 0.0)
    a = fd.ops.slice(z, [0, 0, 0, 0], [batch_size, n_tokens, n_tokens, c_z])
    b = fd.ops.slice(z, [0, 0, 0, c_z], [batch_size, n_tokens, n_tokens, c_z * 2])
    if direction is Direction.OUTGOING:
        # z_out = einsum("bikc,bjkc->bijc", a, b)
        a = fd.ops.permute(a, [0, 3, 1, 2])  # [b, c, i, k]
        b = fd.ops.permute(b, [0, 3, 2, 1])  # [b, c, k, j]
    else:
        # z_out = einsum("bkic,bkjc->bijc", a, b)
        a = fd.ops.permute(a, [0, 3, 2, 1])  # [b, c, i, k]
        b = fd.ops.permute(b, [0, 3, 1, 2])  # [b, c, k, j]
    if swap_operands:
        # [b, c, j, k] @ [b, c, k, i] = [b, c, j, i]
        z = fd.ops.matmul(fd.ops.permute(b, [0, 1, 3, 2]), fd.ops.permute(a, [0, 1, 3, 2]))
        matmul_out = z
        z = fd.ops.permute(z, [0, 3, 2, 1])  # [b, i, j, c]
    else:
        z = fd.ops.matmul(a, b)  # [b, c, i, j]
        matmul_out = z
        z = fd.ops.permute(z, [0, 2, 3, 1])  # [b, i, j, c]
    z = layer_norm(fd, z, w_norm_out, b_norm_out)
    z = gating(fd, z, w_p_out, z_in, w_g_out)
    fd.add_output(z)
    inputs = dict(z_in=z_in_tv, w_norm_in=w_norm_in, b_norm_in=b_norm_in, w_p_in=w_p_in, w_g_in=w_g_in,
                  w_norm_out=w_norm_out, b_norm_out=b_norm_out, w_p_out=w_p_out, w_g_out=w_g_out, mask=mask_tv)
    return inputs, matmul_out


def triangle_shapes(b: int, n: int, c_z: int) -> list:
    """triangle_update's input shapes, in its input order, for b batches of n x n tokens."""
    return [[b, n, n, c_z], [c_z], [c_z], [2 * c_z, c_z], [2 * c_z, c_z], [c_z], [c_z], [c_z, c_z], [c_z, c_z],
            [b, n, n]]


def annotate_triangle(inputs: dict, mesh, dp: int, cp: int) -> None:
    """Upstream's annotation: every input on the mesh, z_in and mask split
    b->DIDz, i->DIDy, j->DIDx; the matmul output is NOT annotated."""
    P = frontend_of(mesh).ParallelType
    for tv in inputs.values():
        tv.set_device_mesh(mesh)
    for tv in (inputs["z_in"], inputs["mask"]):
        tv.outer_split(2, cp)
        tv.axis(2).parallelize(P.mesh_x)
        tv.outer_split(1, cp)
        tv.axis(1).parallelize(P.mesh_y)
        tv.outer_split(0, dp)
        tv.axis(0).parallelize(P.mesh_z)


def triangle_reference(direction: Direction, z_in, w_norm_in, b_norm_in, w_p_in, w_g_in, w_norm_out, b_norm_out,
                       w_p_out, w_g_out, mask):
    """The same math in plain torch (float32 compute, cast like nvFuser)."""
    io = z_in.dtype

    def ln(x, w, b):
        x = x.float()
        var, mean = torch.var_mean(x, dim=-1, correction=0, keepdim=True)
        y = (x - mean) * torch.rsqrt(var + 1e-5)
        return (y * w.float() + b.float()).to(x.dtype if False else io)

    def gate(z, w_p, zin, w_g):
        p = torch.nn.functional.linear(z.float(), w_p.float()).to(io)
        g = torch.nn.functional.linear(zin.float(), w_g.float()).to(io)
        g = torch.sigmoid(g.float()).to(io)
        return (p.float() * g.float()).to(io)

    c = z_in.shape[-1]
    zi = ln(z_in, w_norm_in, b_norm_in)
    z = gate(zi, w_p_in, zi, w_g_in)
    z = torch.where(mask.unsqueeze(-1), z, torch.zeros((), dtype=z.dtype))
    a, b = z[..., :c], z[..., c:]
    if direction is Direction.OUTGOING:
        out = torch.einsum("bikc,bjkc->bijc", a.float(), b.float()).to(io)
    else:
        out = torch.einsum("bkic,bkjc->bijc", a.float(), b.float()).to(io)
    out = ln(out, w_norm_out, b_norm_out)
    return gate(out, w_p_out, zi, w_g_out)


def gelu_tanh(fd, x):
    """GPT's tanh-approximated gelu, as thunder emits it."""
    x = fd.ops.cast(x, frontend_of(fd).DataType.Float)
    x3 = fd.ops.mul(fd.ops.mul(x, x), x)
    inner = fd.ops.mul(fd.define_scalar(0.797885), fd.ops.add(x, fd.ops.mul(fd.define_scalar(0.044715), x3)))
    return fd.ops.mul(fd.ops.mul(fd.define_scalar(0.5), x), fd.ops.add(fd.define_scalar(1.0), fd.ops.tanh(inner)))


def mlp(fd, t: int, h: int, dtype=None, residual: bool = True):
    """GPT MLP: out = linear(gelu(linear(inp, up_w)), down_w) [+ inp].
    t = -1 keeps the token count symbolic; dtype: Float unless given."""
    if dtype is None:
        dtype = frontend_of(fd).DataType.Float
    inp = fd.define_tensor([t, h], dtype=dtype, contiguity=True)
    up_w = fd.define_tensor([4 * h, h], dtype=dtype, contiguity=True)
    down_w = fd.define_tensor([h, 4 * h], dtype=dtype, contiguity=True)
    y = fd.ops.linear(inp, up_w)
    g = gelu_tanh(fd, y)
    g = fd.ops.cast(g, dtype)
    o = fd.ops.linear(g, down_w)
    out = fd.ops.add(o, inp) if residual else o
    out = fd.ops.cast(out, dtype)
    fd.add_output(out)
    return dict(inp=inp, up_w=up_w, down_w=down_w), dict(y=y, g=g, o=o, out=out)


def annotate_mlp(tvs: dict, mesh, sequence_parallel: bool) -> None:
    d = mesh.size
    P = frontend_of(mesh).ParallelType
    for tv in tvs.values():
        tv.set_device_mesh(mesh)
    if sequence_parallel:
        tvs["inp"].outer_split(0, d)
        tvs["inp"].axis(0).parallelize(P.mesh_x)
    tvs["up_w"].outer_split(0, d)
    tvs["up_w"].axis(0).parallelize(P.mesh_x)
    tvs["down_w"].outer_split(1, d)
    tvs["down_w"].axis(1).parallelize(P.mesh_x)


def mlp_reference(inp, up_w, down_w, residual=True):
    x = torch.nn.functional.linear(inp.float(), up_w.float()).to(inp.dtype).float()
    g = 0.5 * x * (1.0 + torch.tanh(0.797885 * (x + 0.044715 * x * x * x)))
    o = torch.nn.functional.linear(g.to(inp.dtype).float(), down_w.float()).to(inp.dtype)
    return (o.float() + inp.float()).to(inp.dtype) if residual else o


def _ln(fd, x, w, b, shape):
    """The layer norm of upstream's transformer forward (thunder's trace)."""
    DataType = frontend_of(fd).DataType
    var, mean = fd.ops.var_mean(x, dims=[2], correction=0, keepdim=False)
    var = fd.ops.broadcast_in_dim(var, shape=shape[:2] + [1], broadcast_dims=[0, 1])
    mean_b = fd.ops.broadcast_in_dim(mean, shape=shape[:2] + [1], broadcast_dims=[0, 1])
    rstd = fd.ops.rsqrt(fd.ops.add(var, fd.define_scalar(1e-5, dtype=DataType.Double)))
    y = fd.ops.sub(x, fd.ops.broadcast_in_dim(mean_b, shape=shape, broadcast_dims=[0, 1, 2]))
    y = fd.ops.mul(y, fd.ops.broadcast_in_dim(rstd, shape=shape, broadcast_dims=[0, 1, 2]))
    y = fd.ops.mul(y, fd.ops.cast(fd.ops.broadcast_in_dim(w, shape=shape, broadcast_dims=[2]), DataType.Float))
    y = fd.ops.add(y, fd.ops.cast(fd.ops.broadcast_in_dim(b, shape=shape, broadcast_dims=[2]), DataType.Float))
    return fd.ops.cast(y, DataType.BFloat16), mean, rstd


def _dropout(fd, x, shape, p: float, scale: float | None = None):
    """Keeps x where uniform < 1 - p and scales by `scale` (1 / (1 - p) unless given)."""
    DataType = frontend_of(fd).DataType
    mask = fd.ops.lt(fd.ops.uniform(0.0, 1.0, shape=shape, dtype=DataType.BFloat16), 1.0 - p)
    x = fd.ops.mul(fd.ops.cast(x, DataType.Float), fd.ops.cast(mask, DataType.Float))
    return fd.ops.mul(x, 1.0 / (1.0 - p) if scale is None else scale), mask


def transformer_forward(fd, b: int, s: int, h: int, e: int, dropout: float = 0.1, dropout_scale: float | None = None):
    """Upstream's test_transformer_forward definition (a GPT block: layer norm,
    QKV linear, causal SDPA with dropout, out-projection, residual, MLP).
    dropout_scale: what kept values are multiplied by, 1 / (1 - dropout)
    unless given (upstream's thunder trace writes the rounded 1.11111).
    Returns (inputs, named intermediates/outputs)."""
    DataType = frontend_of(fd).DataType
    bf16 = DataType.BFloat16
    shape = [b, s, e]
    inp = fd.define_tensor(shape=[b, s, e], contiguity=True, dtype=bf16)
    ln0_w = fd.define_tensor(shape=[e], contiguity=True, dtype=bf16)
    ln0_b = fd.define_tensor(shape=[e], contiguity=True, dtype=bf16)
    qkv_w = fd.define_tensor(shape=[e * 3, e], contiguity=True, dtype=bf16)
    qkv_b = fd.define_tensor(shape=[e * 3], contiguity=True, dtype=bf16)
    proj_w = fd.define_tensor(shape=[e, e], contiguity=True, dtype=bf16)
    proj_b = fd.define_tensor(shape=[e], contiguity=True, dtype=bf16)
    ln1_w = fd.define_tensor(shape=[e], contiguity=True, dtype=bf16)
    ln1_b = fd.define_tensor(shape=[e], contiguity=True, dtype=bf16)
    up_w = fd.define_tensor(shape=[e * 4, e], contiguity=True, dtype=bf16)
    up_b = fd.define_tensor(shape=[e * 4], contiguity=True, dtype=bf16)
    down_w = fd.define_tensor(shape=[e, e * 4], contiguity=True, dtype=bf16)
    down_b = fd.define_tensor(shape=[e], contiguity=True, dtype=bf16)

    x = fd.ops.cast(inp, dtype=DataType.Float)
    ln0, ln0_mean, ln0_rstd = _ln(fd, x, ln0_w, ln0_b, shape)
    qkv = fd.ops.linear(ln0, qkv_w, qkv_b)
    # Reshape before slice, to avoid slicing along a sharded axis (as upstream).
    qkv_h = fd.ops.reshape(qkv, new_shape=[b, s, h, 3 * e // h])
    q = fd.ops.slice(qkv_h, start_indices=[0, 0, 0, 0], end_indices=[b, s, h, e // h])
    k = fd.ops.slice(qkv_h, start_indices=[0, 0, 0, e // h], end_indices=[b, s, h, 2 * e // h])
    v = fd.ops.slice(qkv_h, start_indices=[0, 0, 0, 2 * e // h], end_indices=[b, s, h, 3 * e // h])
    k = fd.ops.permute(k, dims=[0, 2, 1, 3])  # k first, as upstream's trace numbers them
    q = fd.ops.permute(q, dims=[0, 2, 1, 3])
    v = fd.ops.permute(v, dims=[0, 2, 1, 3])
    sdpa_out, sdpa_lse, sdpa_seed, sdpa_offset = fd.ops.sdpfa_fwd(
        q, k, v, dropout_p=fd.define_scalar(dropout, dtype=DataType.Double),
        is_causal=fd.define_scalar(True, dtype=DataType.Bool), scale=None)
    attn = fd.ops.permute(sdpa_out, dims=[0, 2, 1, 3])
    attn = fd.ops.stride_order(attn, stride_order=[3, 2, 1, 0])
    attn = fd.ops.reshape(attn, new_shape=[b, s, e])
    proj = fd.ops.linear(attn, proj_w, proj_b)
    dropped, mha_mask = _dropout(fd, proj, shape, dropout, dropout_scale)
    resid = fd.ops.add(x, dropped)
    ln1, ln1_mean, ln1_rstd = _ln(fd, resid, ln1_w, ln1_b, shape)
    up = fd.ops.linear(ln1, up_w, up_b)
    g = fd.ops.cast(gelu_tanh(fd, up), bf16)
    down = fd.ops.linear(g, down_w, down_b)
    dropped2, mlp_mask = _dropout(fd, down, shape, dropout, dropout_scale)
    out = fd.ops.cast(fd.ops.add(resid, dropped2), bf16)
    named = dict(layernorm0_mean=ln0_mean, layernorm0_rstd=ln0_rstd, mha_linear0_out=qkv, sdpa_out=sdpa_out,
                 sdpa_logsum_exp=sdpa_lse, sdpa_seed=sdpa_seed, sdpa_offset=sdpa_offset, mha_linear1_out=proj,
                 mha_dropout_mask=mha_mask, layernorm1_mean=ln1_mean, layernorm1_rstd=ln1_rstd,
                 mlp_linear0_out=up, mlp_dropout_mask=mlp_mask, out=out)
    for tv in named.values():
        fd.add_output(tv)
    inputs = dict(inp=inp, ln0_w=ln0_w, ln0_b=ln0_b, qkv_w=qkv_w, qkv_b=qkv_b, proj_w=proj_w, proj_b=proj_b,
                  ln1_w=ln1_w, ln1_b=ln1_b, up_w=up_w, up_b=up_b, down_w=down_w, down_b=down_b)
    return inputs, named


def annotate_transformer(inputs: dict, mesh, sequence_parallel: bool) -> None:
    """Upstream's transformer_forward_multidevice_schedule."""
    d = mesh.size
    P = frontend_of(mesh).ParallelType
    for tv in inputs.values():
        tv.set_device_mesh(mesh)
    if sequence_parallel:
        inputs["inp"].outer_split(1, d)
        inputs["inp"].axis(1).parallelize(P.mesh_x)
    for name in ("qkv_w", "qkv_b", "up_w", "up_b"):
        inputs[name].outer_split(0, d)
        inputs[name].axis(0).parallelize(P.mesh_x)
    for name in ("proj_w", "down_w"):
        inputs[name].outer_split(-1, d)
        inputs[name].axis(-2).parallelize(P.mesh_x)


# -- appended for the benchmarks (tools/bench_comm.py, tools/bench_propagation.py) --------


def triangle_attention(fd, direction: Direction, c_z: int = 128, c_hidden: int = 32, n_heads: int = 4,
                       dtype=DataType.BFloat16):
    """AlphaFold3 triangle attention, as upstream's tests/python/direct/test_alphafold3.py
    defines it (starting node = OUTGOING, ending node = INCOMING). Returns
    (inputs dict, named intermediates)."""
    h = n_heads
    z_in_tv = fd.define_tensor(shape=[-1, -1, -1, c_z], dtype=dtype, contiguity=True)  # [b, i, j, c_z]
    z_in = fd.ops.permute(z_in_tv, [0, 2, 1, 3]) if direction is Direction.INCOMING else z_in_tv
    w_q = fd.define_tensor(shape=[h * c_hidden, c_z], dtype=dtype, contiguity=True)
    w_k = fd.define_tensor(shape=[h * c_hidden, c_z], dtype=dtype, contiguity=True)
    w_b = fd.define_tensor(shape=[h, c_z], dtype=dtype, contiguity=True)
    mask_tv = fd.define_tensor(shape=[-1, -1, -1], dtype=DataType.Bool, contiguity=True)  # [b, i, j]
    mask = fd.ops.permute(mask_tv, [0, 2, 1]) if direction is Direction.INCOMING else mask_tv
    w_v = fd.define_tensor(shape=[h * c_hidden, c_z], dtype=dtype, contiguity=True)
    w_g = fd.define_tensor(shape=[h * c_hidden, c_z], dtype=dtype, contiguity=True)
    w_o = fd.define_tensor(shape=[c_z, h * c_hidden], dtype=dtype, contiguity=True)

    batch_size = fd.ops.size(z_in, 0)
    n_tokens = fd.ops.size(z_in, 1)

    def heads(t):  # [b, i, j, h*c] -> [b, i, h, j, c]
        t = fd.ops.reshape(t, [batch_size, n_tokens, n_tokens, h, -1])
        return fd.ops.permute(t, [0, 1, 3, 2, 4])

    q_h = heads(fd.ops.linear(z_in, w_q))
    k_h = heads(fd.ops.linear(z_in, w_k))
    b_h = fd.ops.permute(fd.ops.linear(z_in, w_b), [0, 3, 1, 2])  # [b, h, j, k]
    b_h = fd.ops.broadcast_in_dim(b_h, shape=[batch_size, 1, h, n_tokens, n_tokens], broadcast_dims=[0, 2, 3, 4])
    mask = fd.ops.broadcast_in_dim(mask, shape=[batch_size, n_tokens, 1, 1, n_tokens], broadcast_dims=[0, 1, 4])
    v_h = heads(fd.ops.linear(z_in, w_v))
    o_h, _, _, _ = fd.ops.sdpfa_fwd(q_h, k_h, v_h, bias=b_h, mask=mask, is_causal=False)  # [b, i, h, j, c]
    g_h = heads(fd.ops.sigmoid(fd.ops.linear(z_in, w_g)))
    o_h = fd.ops.cast(fd.ops.mul(o_h, g_h), dtype=dtype)
    o = fd.ops.permute(o_h, [0, 1, 3, 2, 4])  # [b, i, j, h, c]
    o = fd.ops.reshape(o, [batch_size, n_tokens, n_tokens, -1])
    z_out = fd.ops.linear(o, w_o)  # [b, i, j, c_z]
    if direction is Direction.INCOMING:
        z_out = fd.ops.permute(z_out, [0, 2, 1, 3])
    fd.add_output(z_out)
    inputs = dict(z_in=z_in_tv, w_q=w_q, w_k=w_k, w_b=w_b, mask=mask_tv, w_v=w_v, w_g=w_g, w_o=w_o)
    return inputs, dict(q_h=q_h, k_h=k_h, b_h=b_h, v_h=v_h, o_h=o_h, z_out=z_out)


def annotate_triangle_matmul(matmul_out, mesh, dp: int, cp: int, direction: Direction, swap_operands: bool = False):
    """The hand annotation of upstream's test_triangle_updates ("TODO(#5901)"):
    matmul_out [b->DIDz, c, i->DIDy, j->DIDx] with the contraction k pending on
    DIDx (outgoing) or DIDy (incoming). With swapped operands the output is
    [b, c, j, i]: j->DIDx, i->DIDy."""
    P = nvfuser.ParallelType
    matmul_out.set_device_mesh(mesh)
    matmul_out.outer_split(-1, cp)
    matmul_out.axis(-2).parallelize(P.mesh_x if direction is Direction.OUTGOING else P.mesh_y)
    j_axis, i_axis = (3, 2) if not swap_operands else (2, 3)
    first, second = max(i_axis, j_axis), min(i_axis, j_axis)
    for axis in (first, second):
        matmul_out.outer_split(axis, cp)
        matmul_out.axis(axis).parallelize(P.mesh_x if axis == j_axis else P.mesh_y)
    matmul_out.outer_split(0, dp)
    matmul_out.axis(0).parallelize(P.mesh_z)


def split_input(fd, shape, mesh, axis) -> TensorView:
    """A float input of `shape` on `mesh`, axis `axis` split over mesh_x
    (None: replicated); the plan-quality programs (tests and tools/bench_comm.py)."""
    tv = fd.define_tensor(shape, dtype=DataType.Float)
    tv.set_device_mesh(mesh)
    if axis is not None:
        tv.outer_split(axis, mesh.size)
        tv.axis(axis).parallelize(nvfuser.ParallelType.mesh_x)
    return tv


def _split(tv, axis: int, factor: int, ptype) -> None:
    tv.outer_split(axis, factor)
    tv.axis(axis).parallelize(ptype)


def annotate_mlp_2d(tvs: dict, mesh, sequence_parallel: bool) -> None:
    """dp x tp mesh (mesh_y = dp, mesh_x = tp): inp t->DIDy (SP: t->DIDy*DIDx),
    up_w 4h->DIDx, down_w 4h->DIDx; weights replicated over dp."""
    dp, tp = mesh.shape[-2], mesh.shape[-1]
    P = nvfuser.ParallelType
    for tv in tvs.values():
        tv.set_device_mesh(mesh)
    inp = tvs["inp"]
    _split(inp, 0, dp, P.mesh_y)
    if sequence_parallel:
        _split(inp, 1, tp, P.mesh_x)
    _split(tvs["up_w"], 0, tp, P.mesh_x)
    _split(tvs["down_w"], 1, tp, P.mesh_x)


def annotate_mlp_megatron(named: dict, mesh) -> None:
    """The hand-designed (Megatron) plan: gelu's input y = [t, 4h->DIDx]
    (and t->DIDy on a dp x tp mesh)."""
    P = nvfuser.ParallelType
    y = named["y"]
    y.set_device_mesh(mesh)
    tp = mesh.shape[-1]
    _split(y, 1, tp, P.mesh_x)
    if len(mesh.shape) >= 2 and mesh.shape[-2] > 1:
        _split(y, 0, mesh.shape[-2], P.mesh_y)


def annotate_transformer_2d(inputs: dict, mesh, sequence_parallel: bool) -> None:
    """dp x tp mesh (mesh_y = dp, mesh_x = tp): inp b->DIDy (SP: also s->DIDx),
    weights as upstream's schedule on DIDx, replicated over dp."""
    dp, tp = mesh.shape[-2], mesh.shape[-1]
    P = nvfuser.ParallelType
    for tv in inputs.values():
        tv.set_device_mesh(mesh)
    _split(inputs["inp"], 0, dp, P.mesh_y)
    if sequence_parallel:
        _split(inputs["inp"], 2, tp, P.mesh_x)  # loop [dp, b/dp, s, e]: s is loop axis 2
    for name in ("qkv_w", "qkv_b", "up_w", "up_b"):
        _split(inputs[name], 0, tp, P.mesh_x)
    for name in ("proj_w", "down_w"):
        inputs[name].outer_split(-1, tp)
        inputs[name].axis(-2).parallelize(P.mesh_x)


def annotate_transformer_megatron(named: dict, mesh) -> None:
    """The hand-designed (Megatron) plan: the QKV and MLP-up linear outputs
    sharded on their output features (DIDx), batch on DIDy on a dp x tp mesh."""
    P = nvfuser.ParallelType
    tp = mesh.shape[-1]
    dp = mesh.shape[-2] if len(mesh.shape) >= 2 else 1
    for name in ("mha_linear0_out", "mlp_linear0_out"):
        tv = named[name]
        tv.set_device_mesh(mesh)
        _split(tv, 2, tp, P.mesh_x)
        if dp > 1:
            _split(tv, 0, dp, P.mesh_y)
