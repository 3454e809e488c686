"""Fusion definitions shared by tests, benchmarks and the main job: the
AlphaFold3 triangle multiplicative update (as upstream's test_alphafold3),
the GPT MLP and a transformer layer."""

from __future__ import annotations

import enum

import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, TensorView


class Direction(enum.Enum):
    INCOMING = "incoming"
    OUTGOING = "outgoing"


def layer_norm(fd: FusionDefinition, x: TensorView, w: TensorView, b: TensorView) -> TensorView:
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


def gating(fd, z, w_p, z_in, w_g) -> TensorView:
    io_dtype = z.dtype()
    p = fd.ops.linear(z, w_p)
    g = fd.ops.linear(z_in, w_g)
    g = fd.ops.sigmoid(g)
    z = fd.ops.mul(p, g)
    return fd.ops.cast(z, dtype=io_dtype)


def triangle_update(fd, direction: Direction, c_z: int, dtype=DataType.BFloat16, swap_operands: bool = False):
    """Defines the triangle multiplicative update; returns (inputs dict, matmul_out)."""
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


def annotate_triangle(inputs: dict, mesh, dp: int, cp: int) -> None:
    """Upstream's annotation: every input on the mesh, z_in and mask split
    b->DIDz, i->DIDy, j->DIDx; the matmul output is NOT annotated."""
    for tv in inputs.values():
        tv.set_device_mesh(mesh)
    for tv in (inputs["z_in"], inputs["mask"]):
        tv.outer_split(2, cp)
        tv.axis(2).parallelize(nvfuser.ParallelType.mesh_x)
        tv.outer_split(1, cp)
        tv.axis(1).parallelize(nvfuser.ParallelType.mesh_y)
        tv.outer_split(0, dp)
        tv.axis(0).parallelize(nvfuser.ParallelType.mesh_z)


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
