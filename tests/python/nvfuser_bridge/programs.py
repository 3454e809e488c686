"""The test programs, built with the REAL `nvfuser_direct` (or nvshard) from
nvshard/models.py's definitions and annotations, which take DataType and
ParallelType from the frontend they are given: AlphaFold3's triangle
multiplicative update (upstream's tests/python/multidevice/test_alphafold3.py
at 7e04d26 as written, WITHOUT its hand annotation of the matmul output),
the GPT MLP with a residual and upstream's transformer layer forward
(test_transformer.py at 7e04d26), each with upstream's input annotations.

The transformer's dropout scale is upstream's literal 1.11111 (thunder's
print of 1 / 0.9; models.py computes it unless told). Upstream's
`is_cpu=False` and row-major `stride_order` are the defaults, so models.py
leaves them out and real nvFuser builds the same fusion.

Every builder returns (fd, named TensorViews). Input shapes are GLOBAL."""

from __future__ import annotations

import torch

from nvshard import models
from nvshard.models import Direction

PROGRAMS = [
    "triangle_outgoing", "triangle_outgoing_swapped", "triangle_incoming", "triangle_incoming_swapped",
    "mlp_tp", "mlp_sp", "transformer_tp", "transformer_sp",
]

UPSTREAM_DROPOUT_SCALE = 1.11111  # test_transformer.py's S143 and S217


def triangle(nvf, outgoing: bool, swap_operands: bool = False, d: int = 4, c_z: int = 128, annotate: bool = True):
    cp = 2
    dp = d // (cp * cp)
    direction = Direction.OUTGOING if outgoing else Direction.INCOMING
    with nvf.FusionDefinition() as fd:
        inputs, matmul_out = models.triangle_update(fd, direction, c_z, swap_operands=swap_operands)
        if annotate:
            mesh = nvf.multidevice.DeviceMesh(torch.arange(d).reshape(dp, cp, cp))
            models.annotate_triangle(inputs, mesh, dp, cp)
    out = fd.fusion.outputs()[0]
    return fd, dict(z_in=inputs["z_in"], mask=inputs["mask"], matmul_out=matmul_out, out=out)


def triangle_shapes(d: int = 4, c_z: int = 128, b_local: int = 3, n_local: int = 5):
    cp = 2
    dp = d // (cp * cp)
    b, n = b_local * dp, n_local * cp
    return [[b, n, n, c_z], [c_z], [c_z], [2 * c_z, c_z], [2 * c_z, c_z], [c_z], [c_z], [c_z, c_z], [c_z, c_z],
            [b, n, n]]


def mlp(nvf, sequence_parallel: bool, d: int = 4, h: int = 16, annotate: bool = True):
    """models.mlp with a symbolic token count, Float: out = linear(gelu(linear(inp, up_w)), down_w) + inp."""
    with nvf.FusionDefinition() as fd:
        tvs, named = models.mlp(fd, -1, h)
        if annotate:
            models.annotate_mlp(tvs, nvf.multidevice.DeviceMesh(torch.arange(d)), sequence_parallel)
    return fd, dict(inp=tvs["inp"], **named)


def mlp_shapes(d: int = 4, h: int = 16):
    return [[2 * d, h], [4 * h, h], [h, 4 * h]]


def transformer(nvf, sequence_parallel: bool, d: int = 4, b: int = 1, s: int = 8, h: int = 4, e: int = 16,
                annotate: bool = True):
    """Upstream's transformer_forward_definition and its multidevice schedule."""
    with nvf.FusionDefinition() as fd:
        inputs, named = models.transformer_forward(fd, b, s, h, e, dropout=0.1,
                                                   dropout_scale=UPSTREAM_DROPOUT_SCALE)
        if annotate:
            models.annotate_transformer(inputs, nvf.multidevice.DeviceMesh(range(d)), sequence_parallel)
    named["inp"] = inputs["inp"]
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
