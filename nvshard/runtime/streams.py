"""Stream-parallel axes (ParallelType.stream): nvFuser runs such an axis as a
loop of chunks (on CUDA streams, overlapping communication and compute).

Here the annotation spreads like a sharding, through the pass-through
factors of each expr's rule and through communications (which keep their
logical axes), to a fixed point, forward and backward. A compute expr whose
result carries a stream axis then runs chunk by chunk when its op says it
may (`OpSpec.chunkable`: the op computes each block of a pass-through axis
from the same block of its operands): operands are cut into the same
chunks along the axes that carry the factor, other operands go whole, and
the results are assembled in one output. Communications run once on the
whole tensor: on CPU there is no second stream to overlap them with. The
results equal the unchunked program's.
"""

from __future__ import annotations

import torch

from ..ir.nodes import NvShardError, ParallelType, TensorView
from ..ops.registry import FactorKind
from ..preseg.projection import tensor_axes


def stream_axes(plan) -> dict:
    """TensorView -> (local dim, number of chunks) for every tensor that
    carries a stream-parallel axis; cached on the plan. A swizzled
    (swizzle1d) stream axis is recorded in plan._stream_rotations."""
    cached = getattr(plan, "_stream_axes", None)
    if cached is not None:
        return cached
    program = plan.program
    found: dict = {}
    rotations: dict = {}
    for tv in program.state:
        for id_ in tv.loop:
            if id_.parallel_type is not ParallelType.stream or id_.is_reduction():
                continue
            axes = tv.non_reduction_axes()
            value = id_.extent().value
            chunks = value if value is not None else plan.sizes.evaluate_size(id_.extent())
            found[tv] = (axes.index(id_.logical_axis), int(chunks))
            if id_.swizzle is not None:
                rotations[tv] = id_.swizzle.mesh_axis
    changed = bool(found)
    while changed:
        changed = False
        for expr in program.exprs:
            tvs = expr.tv_inputs + expr.tv_outputs
            if not any(t in found for t in tvs):
                continue
            for tv, dim in _carriers(program, expr, found):
                if tv not in found:
                    found[tv] = (dim, _chunks_of(expr, found))
                    changed = True
    plan._stream_axes = found
    plan._stream_rotations = rotations
    return found


def _chunks_of(expr, found) -> int:
    counts = {found[t][1] for t in expr.tv_inputs + expr.tv_outputs if t in found}
    if len(counts) > 1:
        names = ", ".join(t.short_name() for t in expr.tv_inputs + expr.tv_outputs if t in found)
        raise NvShardError(f"{expr.op.name}: stream axes of {names} have different numbers of chunks {sorted(counts)}")
    return counts.pop()


def _carriers(program, expr, found) -> list:
    """(tv, local dim) of every tensor of `expr` that carries the stream factor
    of a streamed neighbour."""
    tvs = expr.tv_inputs + expr.tv_outputs
    if expr.op.is_communication:
        src = next(t for t in tvs if t in found)
        return [(t, found[src][0]) for t in tvs]
    rule = program.rule(expr)
    # logical axis -> factors, per tensor (operands list only their non-reduction axes)
    factors_of = {t: dict(tensor_axes(expr, t, rule)) for t in tvs}
    factors = set()
    for t in tvs:
        if t in found:
            k = t.non_reduction_axes()[found[t][0]]
            axis_factors = factors_of[t].get(k, ())
            if len(axis_factors) == 1 and rule.factors[axis_factors[0]].kind is FactorKind.PASS:
                factors.add(axis_factors[0])
    result = []
    for t in tvs:
        for dim, k in enumerate(t.non_reduction_axes()):
            if tuple(factors_of[t].get(k, ())) in {(f,) for f in factors}:
                result.append((t, dim))
    return result


def chunked_dims(plan, expr):
    """For a compute expr that runs in chunks: (chunks, operand dims, result
    dims), a dim None where that tensor goes whole; else None."""
    if not getattr(expr.op, "chunkable", False):
        return None
    found = stream_axes(plan)
    if not any(t in found for t in expr.tv_outputs):
        return None
    carriers = dict(_carriers(plan.program, expr, found))
    if not all(t in carriers for t in expr.tv_outputs):
        return None
    chunks = _chunks_of(expr, found)
    operand_dims = [carriers.get(v) if isinstance(v, TensorView) else None for v in expr.inputs]
    rotation = next(((t, plan._stream_rotations[t]) for t in expr.tv_inputs + expr.tv_outputs
                     if t in plan._stream_rotations), None)
    return chunks, operand_dims, [carriers[t] for t in expr.tv_outputs], rotation


def chunk_order(chunks: int, ctx, rotation) -> list:
    """The order this device visits the chunks: 0..chunks-1, rotated by its
    coordinate on the swizzle's mesh axis (swizzle1d)."""
    if rotation is None:
        return list(range(chunks))
    tv, mesh_axis = rotation
    offset = ctx.coords(tv).get(mesh_axis, 0)
    return [(i + offset) % chunks for i in range(chunks)]


def run_in_chunks(expr, args: list, ctx, chunks: int, operand_dims: list, result_dims: list, rotation=None) -> list:
    """Evaluate `expr` chunk by chunk (in the device's order); the results
    are assembled along their stream dims."""
    extent = next(a.shape[d] for a, d in zip(args, operand_dims) if d is not None and isinstance(a, torch.Tensor))
    size = -(-extent // chunks)  # nvFuser splits by ceilDiv
    pieces = {}
    for index in chunk_order(chunks, ctx, rotation):
        start = index * size
        if start >= extent:
            continue
        length = min(size, extent - start)
        chunk_args = [a.narrow(d, start, length) if d is not None and isinstance(a, torch.Tensor) else a
                      for a, d in zip(args, operand_dims)]
        pieces[index] = expr.op.evaluate(expr, chunk_args, ctx)
    ordered = [pieces[i] for i in sorted(pieces)]
    return [torch.cat([p[i] for p in ordered], dim=d) for i, d in enumerate(result_dims)]
