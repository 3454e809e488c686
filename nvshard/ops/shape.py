"""Shape ops: broadcast, broadcast_in_dim, squeeze, permute, reshape, slice,
cat, and the scalar queries size and shape."""

from __future__ import annotations

import math

import torch

from ..ir.dtypes import DataType
from ..ir.nodes import IterType, NvShardError, Scalar
from ..ir.sizes import Size, Sym, unify, whole_quotient
from . import common
from .registry import FactorKind, OpSpec, ShardingRule, frontend, register


def _size_of(fusion, entry, op: str) -> Size:
    if isinstance(entry, bool):
        raise NvShardError(f"{op}: shape entry {entry!r} is not an extent")
    if isinstance(entry, int):
        return Size(entry)
    if isinstance(entry, Scalar):
        if entry.fusion is not fusion:
            raise NvShardError(f"{op}: scalar {entry} belongs to another fusion")
        return entry.as_size()
    raise NvShardError(f"{op}: shape entries must be ints or scalars, got {entry!r}")


def _runtime_sym(fusion, compute) -> Size:
    """An extent known only at run time; `compute(ctx)` evaluates it. Once
    the definition is complete it may turn out static (see
    Fusion.resolve_static_extents)."""
    sym = Sym(fusion.new_symbol_name(), definition=compute)
    fusion.runtime_syms.append(sym)
    return Size.of(sym)


def _shape_operands(entries) -> list:
    return [e for e in entries if isinstance(e, Scalar)]


# -- broadcast -------------------------------------------------------------------


class BroadcastOp(OpSpec):
    """broadcast and broadcast_in_dim: input axes keep their factors, new
    axes (broadcasts, expanded or not) have none."""

    def __init__(self, name):
        super().__init__(name)

    def define_flags(self, arg, is_broadcast_dim):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "broadcast", "arg")
        in_ids = common.logical_shape(arg)
        flags = list(is_broadcast_dim)
        if sum(1 for f in flags if not f) != len(in_ids):
            raise NvShardError(
                f"broadcast: is_broadcast_dim has {sum(1 for f in flags if not f)} False entries, "
                f"but {arg.short_name()} has {len(in_ids)} axes"
            )
        mapping, ids, it = [], [], iter(range(len(in_ids)))
        for f in flags:
            if f:
                ids.append(fusion.new_id(Size(1), IterType.Broadcast))
                mapping.append(None)
            else:
                i = next(it)
                src = in_ids[i]
                ids.append(fusion.new_id(src.extent(), src.iter_type, src.expanded))
                mapping.append(i)
        out = fusion.new_tv(arg.dtype(), ids)
        fusion.add_expr(self, [arg], [out], {"mapping": mapping})
        return out

    def define_in_dim(self, arg, shape, broadcast_dims):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "broadcast_in_dim", "arg")
        in_ids = common.logical_shape(arg)
        shape = list(shape)
        rank = len(shape)
        dims = [common.norm_axis(d, rank, "broadcast_in_dim", what="broadcast dim") for d in broadcast_dims]
        if len(dims) != len(in_ids):
            raise NvShardError(
                f"broadcast_in_dim: broadcast_dims has {len(dims)} entries but {arg.short_name()} has {len(in_ids)} axes"
            )
        if len(set(dims)) != len(dims) or dims != sorted(dims):
            raise NvShardError(f"broadcast_in_dim: broadcast_dims {list(broadcast_dims)} must be increasing")
        sizes = [_size_of(fusion, e, "broadcast_in_dim") for e in shape]
        mapping = [None] * rank
        for i, d in enumerate(dims):
            mapping[d] = i
        ids = []
        for j in range(rank):
            i = mapping[j]
            target = sizes[j]
            if i is not None and not in_ids[i].is_broadcast():
                src = in_ids[i]
                try:
                    unify(src.extent(), target)
                except ValueError:
                    raise NvShardError(
                        f"broadcast_in_dim: axis {i} of {arg.short_name()} has extent {src.extent()}, "
                        f"but shape[{j}] is {target}"
                    ) from None
                ids.append(fusion.new_id(src.extent()))
            elif target == 1:
                ids.append(fusion.new_id(Size(1), IterType.Broadcast))
            else:
                ids.append(fusion.new_id(Size(1), IterType.Broadcast, target))
        out = fusion.new_tv(arg.dtype(), ids)
        fusion.add_expr(self, [arg] + _shape_operands(shape), [out], {"mapping": mapping})
        return out

    def rule(self, expr):
        rule = ShardingRule()
        in_ids = common.logical_shape(expr.inputs[0])
        operand = [()] * len(in_ids)
        result = []
        for j, i in enumerate(expr.attrs["mapping"]):
            if i is not None:
                f = rule.add_factor(f"a{j}", in_ids[i].extent())
                operand[i] = (f,)
                result.append((f,))
            else:
                result.append(())
        rule.operands.append(operand)
        rule.results.append(result)
        return rule

    def evaluate(self, expr, args, ctx):
        x = args[0]
        view = []
        for i in expr.attrs["mapping"]:
            view.append(1 if i is None else x.shape[i])
        return [x.reshape(view).expand(ctx.out_shape(0))]

    def format(self, expr):
        flags = ", ".join("true" if i is None else "false" for i in expr.attrs["mapping"])
        return f"{expr.outputs[0]}\n   = broadcast( {expr.inputs[0]}, flags = {{{flags}}} )\n"


_broadcast = register(BroadcastOp("broadcast"))
frontend("broadcast")(lambda arg, is_broadcast_dim: _broadcast.define_flags(arg, is_broadcast_dim))
_broadcast_in_dim = register(BroadcastOp("broadcast_in_dim"))
frontend("broadcast_in_dim")(
    lambda arg, shape, broadcast_dims: _broadcast_in_dim.define_in_dim(arg, shape, broadcast_dims)
)


# -- squeeze / permute -------------------------------------------------------------


class SqueezeOp(OpSpec):
    def __init__(self):
        super().__init__("squeeze")

    def define(self, arg, dims, squeeze_expanded=False):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "squeeze", "arg")
        in_ids = common.logical_shape(arg)
        rank = len(in_ids)
        dims = sorted({common.norm_axis(d, rank, "squeeze", arg) for d in dims})
        for d in dims:
            id_ = in_ids[d]
            # A symbolic extent may be 1: nvFuser checks it once sizes are known (check_sizes).
            if not id_.is_broadcast() and id_.extent().value not in (None, 1):
                raise NvShardError(
                    f"squeeze: axis {d} of {arg.short_name()} has extent {id_.extent()}; only extent-1 axes can be squeezed"
                )
            if id_.expanded is not None and not squeeze_expanded:
                raise NvShardError(
                    f"squeeze: axis {d} of {arg.short_name()} is expanded to {id_.expanded}; pass squeeze_expanded=True"
                )
        kept = [i for i in range(rank) if i not in dims]
        ids = common.new_like_ids(fusion, [in_ids[i] for i in kept])
        out = fusion.new_tv(arg.dtype(), ids)
        fusion.add_expr(self, [arg], [out], {"dims": dims, "kept": kept})
        return out

    def check_sizes(self, expr, sizes) -> None:
        arg = expr.inputs[0]
        for d in expr.attrs["dims"]:
            if common.logical_shape(arg)[d].is_broadcast():
                continue
            try:
                extent = sizes.global_extent(arg, d)
            except NvShardError:
                return  # not bound yet: planning before execute
            if extent != 1:
                raise NvShardError(
                    f"squeeze: axis {d} of {arg.short_name()} has extent {extent}; only extent-1 axes can be squeezed"
                )

    def rule(self, expr):
        rule = ShardingRule()
        in_ids = common.logical_shape(expr.inputs[0])
        operand = [()] * len(in_ids)
        result = []
        for i in expr.attrs["kept"]:
            f = rule.add_factor(f"a{i}", in_ids[i].extent())
            operand[i] = (f,)
            result.append((f,))
        rule.operands.append(operand)
        rule.results.append(result)
        return rule

    def evaluate(self, expr, args, ctx):
        x = args[0]
        for d in reversed(expr.attrs["dims"]):
            x = x.select(d, 0) if x.shape[d] != 1 else x.squeeze(d)
        return [x]

    def format(self, expr):
        n = len(common.logical_shape(expr.inputs[0]))
        flags = ", ".join("true" if i in expr.attrs["dims"] else "false" for i in range(n))
        return f"{expr.outputs[0]}\n   = squeeze( {expr.inputs[0]}, flags = {{{flags}}} )\n"


class PermuteOp(OpSpec):
    def __init__(self):
        super().__init__("permute")

    def define(self, arg, dims):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "permute", "arg")
        in_ids = common.logical_shape(arg)
        rank = len(in_ids)
        dims = [common.norm_axis(d, rank, "permute", arg) for d in dims]
        if sorted(dims) != list(range(rank)):
            raise NvShardError(f"permute: dims {dims} is not a permutation of 0..{rank - 1} for {arg.short_name()}")
        ids = common.new_like_ids(fusion, [in_ids[d] for d in dims])
        out = fusion.new_tv(arg.dtype(), ids)
        fusion.add_expr(self, [arg], [out], {"dims": dims})
        return out

    def rule(self, expr):
        rule = ShardingRule()
        in_ids = common.logical_shape(expr.inputs[0])
        operand = [(rule.add_factor(f"a{i}", id_.extent()),) for i, id_ in enumerate(in_ids)]
        rule.operands.append(operand)
        rule.results.append([operand[d] for d in expr.attrs["dims"]])
        return rule

    def evaluate(self, expr, args, ctx):
        return [args[0].permute(expr.attrs["dims"])]

    def format(self, expr):
        return f"{expr.outputs[0]}\n   = Set.Permute( {expr.inputs[0]}, cache_op=Streaming )\n"


_squeeze = register(SqueezeOp())
frontend("squeeze")(_squeeze.define)
_permute = register(PermuteOp())
frontend("permute")(_permute.define)


# -- reshape ------------------------------------------------------------------------


def reshape_groups(in_sizes: list, out_sizes: list):
    """Pair runs of input and output axes with equal products.

    Returns [(in_axes, out_axes)], or None where extents cannot be matched
    symbolically (the caller then treats the reshape as opaque)."""
    groups = []
    i = j = 0
    n, m = len(in_sizes), len(out_sizes)
    while i < n or j < m:
        # size-1 axes form their own groups with nothing on the other side
        if i < n and in_sizes[i] == 1:
            groups.append(([i], []))
            i += 1
            continue
        if j < m and out_sizes[j] == 1:
            groups.append(([], [j]))
            j += 1
            continue
        if i >= n or j >= m:
            return None
        gi, gj = [i], [j]
        pa, pb = in_sizes[i], out_sizes[j]
        i += 1
        j += 1
        while not pa == pb:
            if whole_quotient(pb, pa) is not None and i < n:
                pa = pa * in_sizes[i]
                gi.append(i)
                i += 1
            elif whole_quotient(pa, pb) is not None and j < m:
                pb = pb * out_sizes[j]
                gj.append(j)
                j += 1
            elif pa.is_static and pb.is_static and i < n and j < m:
                if pa.value < pb.value:
                    pa = pa * in_sizes[i]
                    gi.append(i)
                    i += 1
                else:
                    pb = pb * out_sizes[j]
                    gj.append(j)
                    j += 1
            else:
                return None
        groups.append((gi, gj))
    return groups


def _refine(in_sizes: list, out_sizes: list):
    """Common refinement of two factorizations of one extent: the factor
    sizes and, per axis, the factor indices it is made of; None if the
    prefix products do not form a divisibility chain."""
    def prefixes(sizes):
        acc, out = Size(1), []
        for s in sizes:
            acc = acc * s
            out.append(acc)
        return out

    if not (prefixes(in_sizes) or [Size(1)])[-1] == (prefixes(out_sizes) or [Size(1)])[-1]:
        return None  # totals not provably equal (symbolic vs static): no chain to share
    points = []
    for p in prefixes(in_sizes) + prefixes(out_sizes):
        if not any(p == q for q in points):
            points.append(p)
    # sort into a chain by divisibility
    chain = []
    for p in points:
        placed = False
        for k, q in enumerate(chain):
            if whole_quotient(q, p) is not None:
                chain.insert(k, p)
                placed = True
                break
            if whole_quotient(p, q) is None:
                return None
        if not placed:
            chain.append(p)
    for a, b in zip(chain, chain[1:]):
        if whole_quotient(b, a) is None:
            return None
    factor_sizes = []
    prev = Size(1)
    for p in chain:
        factor_sizes.append(whole_quotient(p, prev))
        prev = p

    def axes_of(sizes):
        result, acc, k = [], Size(1), 0
        for s in sizes:
            if s == 1:
                result.append(())  # an extent-1 axis inside a group is made of no factor
                continue
            acc = acc * s
            start = k
            while not chain[k] == acc:
                k += 1
            result.append(tuple(range(start, k + 1)))
            k += 1
        return result

    return factor_sizes, axes_of(in_sizes), axes_of(out_sizes)


class ReshapeOp(OpSpec):
    def __init__(self):
        super().__init__("reshape")

    def define(self, arg, new_shape):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "reshape", "arg")
        in_ids = common.logical_shape(arg)
        entries = list(new_shape)
        infer = [k for k, e in enumerate(entries) if isinstance(e, int) and not isinstance(e, bool) and e == -1]
        if len(infer) > 1:
            raise NvShardError(f"reshape: new_shape {entries} has more than one -1")
        sizes = []
        for k, e in enumerate(entries):
            if k in infer:
                sizes.append(None)
                continue
            size = _size_of(fusion, e, "reshape")
            if size.value is not None and size.value < 0:
                raise NvShardError(f"reshape: new_shape[{k}] = {size.value} is negative")
            sizes.append(size)
        total = Size(1)
        for id_ in in_ids:
            total = total * (id_.expanded if id_.is_broadcast() and id_.expanded is not None else id_.extent())
        given = list(sizes)  # before inference, for the run-time check
        if infer:
            known = Size(1)
            for s in sizes:
                if s is not None:
                    known = known * s
            inferred = whole_quotient(total, known)
            if inferred is None:
                inferred = _runtime_sym(fusion, _inferred_extent(arg, tuple(sizes), infer[0]))
            sizes[infer[0]] = inferred
        else:
            product = Size(1)
            for s in sizes:
                product = product * s
            if total.is_static and product.is_static and total.value != product.value:
                raise NvShardError(
                    f"reshape: {arg.short_name()} has {total.value} elements but new_shape {entries} has {product.value}"
                )
        ids = [fusion.new_id(Size(1), IterType.Broadcast) if s == 1 else fusion.new_id(s) for s in sizes]
        out = fusion.new_tv(arg.dtype(), ids)
        fusion.add_expr(self, [arg] + _shape_operands(entries), [out], {"given": given})
        return out

    def check_sizes(self, expr, sizes) -> None:
        """Once sizes are concrete: the new shape must hold the input's
        elements exactly (torch would only say the shape is invalid)."""
        arg, given = expr.inputs[0], expr.attrs["given"]
        try:
            shape = sizes.global_shape(arg)
            wanted = [None if s is None else sizes.evaluate_size(s) for s in given]
        except NvShardError:
            return  # a scalar input without a value: planning before execute
        total = math.prod(shape)
        known = math.prod(w for w in wanted if w is not None)
        if None in wanted:
            fits = known != 0 and total % known == 0
        else:
            fits = known == total
        if not fits:
            text = ", ".join("-1" if w is None else str(w) for w in wanted)
            raise NvShardError(
                f"reshape: {arg.short_name()} has shape {shape} ({total} elements), which new_shape [{text}] "
                f"of {expr.outputs[0].short_name()} cannot hold"
            )

    rule_needs_sizes = True  # concrete sizes tell how axes split and merge

    def rule(self, expr, sizes=None):
        rule = ShardingRule()
        arg, out = expr.inputs[0], expr.outputs[0]
        if sizes is not None:
            in_sizes = [Size(e) for e in sizes.global_shape(arg)]
            out_sizes = [Size(e) for e in sizes.global_shape(out)]
        else:
            in_sizes = [i.extent() for i in common.logical_shape(arg)]
            out_sizes = [i.extent() for i in common.logical_shape(out)]
        operand = [()] * len(in_sizes)
        result = [()] * len(out_sizes)
        groups = reshape_groups(in_sizes, out_sizes)
        if groups is None:
            groups = [(list(range(len(in_sizes))), list(range(len(out_sizes))))]
        for gi, gj in groups:
            if not gi or not gj:
                continue  # extent-1 axes
            refined = _refine([in_sizes[i] for i in gi], [out_sizes[j] for j in gj])
            if refined is None:
                # Extents that do not nest: the op needs the whole group.
                # (extent-1 axes are broadcasts: no factor to shard)
                for i in gi:
                    if not in_sizes[i] == 1:
                        operand[i] = (rule.add_factor(f"u{i}", in_sizes[i], FactorKind.REPLICATED),)
                for j in gj:
                    if not out_sizes[j] == 1:
                        result[j] = (rule.add_factor(f"v{j}", out_sizes[j]),)
                continue
            factor_sizes, in_axes, out_axes = refined
            ids = [rule.add_factor(f"r{len(rule.factors)}", s) for s in factor_sizes]
            for i, axes in zip(gi, in_axes):
                operand[i] = tuple(ids[a] for a in axes)
            for j, axes in zip(gj, out_axes):
                result[j] = tuple(ids[a] for a in axes)
        rule.operands.append(operand)
        rule.results.append(result)
        return rule

    def evaluate(self, expr, args, ctx):
        return [args[0].reshape(ctx.out_shape(0))]

    def format(self, expr):
        return f"{expr.outputs[0]} = reshape( {expr.inputs[0]} )\n"  # 0.2.36 prints reshape


_reshape = register(ReshapeOp())
frontend("reshape")(_reshape.define)


# -- slice ------------------------------------------------------------------------------


class SliceOp(OpSpec):
    rule_needs_sizes = True  # whether a range is the whole axis can depend on the sizes

    def __init__(self):
        super().__init__("slice")

    def define(self, arg, start_indices, end_indices, strides=None, manual_normalization=False):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "slice", "arg")
        in_ids = common.logical_shape(arg)
        rank = len(in_ids)
        starts, ends = list(start_indices), list(end_indices)
        steps = list(strides) if strides is not None else [1] * rank
        for name, lst in (("start_indices", starts), ("end_indices", ends), ("strides", steps)):
            if len(lst) != rank:
                raise NvShardError(f"slice: {name} has {len(lst)} entries but {arg.short_name()} has rank {rank}")
        ranges, ids, operands = [], [], [arg]
        for k in range(rank):
            id_ = in_ids[k]
            extent = id_.expanded if id_.is_broadcast() and id_.expanded is not None else id_.extent()
            start, end, step = starts[k], ends[k], steps[k]
            if not isinstance(step, int) or step <= 0:
                raise NvShardError(f"slice: stride {step!r} of axis {k} must be a positive int")
            for v in (start, end):
                if isinstance(v, Scalar):
                    operands.append(v)
            start_size = _size_of(fusion, start, "slice") if not (isinstance(start, int) and start < 0) else None
            end_size = _size_of(fusion, end, "slice") if not (isinstance(end, int) and end < 0) else None
            if start_size == 0 and end_size is not None and end_size == extent and step == 1:
                out_extent = extent
            elif all(isinstance(v, int) for v in (start, end)) and extent.value is not None:
                lo, hi, _ = slice(start, end, step).indices(extent.value)
                out_extent = Size(max(0, -(-(hi - lo) // step)))
            elif start_size == 0 and end_size is not None and step == 1:
                out_extent = end_size
            else:
                out_extent = _runtime_sym(fusion, _sliced_extent(arg, k, start, end, step))
            ranges.append((start, end, step))
            if id_.is_broadcast():  # slicing a broadcast leaves a broadcast
                ids.append(fusion.new_id(Size(1), IterType.Broadcast, None if out_extent == 1 else out_extent))
            elif out_extent == 1:
                ids.append(fusion.new_id(Size(1), IterType.Broadcast))
            else:
                ids.append(fusion.new_id(out_extent))
        out = fusion.new_tv(arg.dtype(), ids)
        fusion.add_expr(self, operands, [out], {"ranges": ranges, "manual": manual_normalization})
        return out

    @staticmethod
    def whole_axis(expr, k: int, sizes=None) -> bool:
        """Does the range of axis k keep the whole axis? Decided when the rule is
        built, after every extent is unified (or with concrete sizes)."""
        start, end, step = expr.attrs["ranges"][k]
        id_ = common.logical_shape(expr.inputs[0])[k]
        if step != 1 or id_.is_broadcast():
            return False
        if sizes is not None:
            extent = sizes.global_extent(expr.inputs[0], k)
            lo, hi, _ = slice(sizes.scalar(start), sizes.scalar(end), 1).indices(extent)
            return lo == 0 and hi == extent
        if isinstance(start, int) and start < 0 or isinstance(end, int) and end < 0:
            return False
        start_size = Size(start) if isinstance(start, int) else start.as_size()
        end_size = Size(end) if isinstance(end, int) else end.as_size()
        return start_size == 0 and end_size == id_.extent()

    def rule(self, expr, sizes=None):
        rule = ShardingRule()
        in_ids = common.logical_shape(expr.inputs[0])
        out_ids = common.logical_shape(expr.outputs[0])
        operand, result = [], []
        for k in range(len(in_ids)):
            if self.whole_axis(expr, k, sizes):
                f = rule.add_factor(f"a{k}", in_ids[k].extent())
                operand.append((f,))
                result.append((f,))
                continue
            # A real slice needs the whole axis; the result axis is computed whole
            # and each device keeps its block.
            operand.append((rule.add_factor(f"s{k}", in_ids[k].extent(), FactorKind.REPLICATED),))
            result.append((rule.add_factor(f"o{k}", out_ids[k].extent()),))
        rule.operands.append(operand)
        rule.results.append(result)
        return rule

    def evaluate(self, expr, args, ctx):
        index = [slice(ctx.scalar(start), ctx.scalar(end), step) for start, end, step in expr.attrs["ranges"]]
        return [args[0][tuple(index)]]

    def format(self, expr):
        parts = " ".join("{" + f"{s}, {e}, {st}" + "}" for s, e, st in expr.attrs["ranges"])
        return f"{expr.outputs[0]}\n   = slice( {expr.inputs[0]}, {{ {parts} }} )\n"


def _sliced_extent(arg, axis, start, end, step):
    def compute(ctx):
        n = ctx.global_extent(arg, axis)
        s, e, _ = slice(ctx.scalar(start), ctx.scalar(end), step).indices(n)
        return max(0, -(-(e - s) // step))

    return compute


def _inferred_extent(arg, sizes, k):
    def compute(ctx):
        total = 1
        for d in range(arg.ndim):
            total *= ctx.global_extent(arg, d)
        known = 1
        for i, s in enumerate(sizes):
            if i != k:
                known *= ctx.evaluate_size(s)
        return total // known

    return compute


_slice = register(SliceOp())


@frontend("slice")
def _slice_frontend(arg, start_indices, end_indices, strides=None, manual_normalization=False):
    return _slice.define(arg, start_indices, end_indices, strides, manual_normalization)


# -- cat --------------------------------------------------------------------------------


class CatOp(OpSpec):
    def __init__(self):
        super().__init__("cat")

    def define(self, tensors, dim=0, manual_padding=False):
        tensors = list(tensors)
        if not tensors:
            raise NvShardError("cat: needs at least one tensor")
        fusion = common.current_fusion(tensors)
        for k, t in enumerate(tensors):
            common.expect_tv(t, "cat", f"tensors[{k}]")
        shapes = [common.logical_shape(t) for t in tensors]
        rank = len(shapes[0])
        for t, s in zip(tensors, shapes):
            if len(s) != rank:
                raise NvShardError(f"cat: {t.short_name()} has rank {len(s)}, expected {rank}")
        dim = common.norm_axis(dim, rank, "cat")
        ids = []
        for k in range(rank):
            if k == dim:
                static = all(s[k].extent().value is not None for s in shapes)
                if static:
                    ids.append(fusion.new_id(Size(sum(s[k].extent().value for s in shapes))))
                else:
                    ids.append(fusion.new_id(_runtime_sym(fusion, lambda ctx, ts=tuple(tensors), d=dim: sum(
                        ctx.global_extent(t, d) for t in ts))))
                continue
            first = shapes[0][k].extent()
            for t, s in zip(tensors[1:], shapes[1:]):
                try:
                    unify(first, s[k].extent())
                except ValueError:
                    raise NvShardError(
                        f"cat: axis {k} of {t.short_name()} has extent {s[k].extent()}, expected {first}"
                    ) from None
            ids.append(fusion.new_id(first))
        dtype = common.result_dtype(tensors)
        out = fusion.new_tv(dtype, ids)
        fusion.add_expr(self, tensors, [out], {"dim": dim})
        return out

    def rule(self, expr):
        rule = ShardingRule()
        dim = expr.attrs["dim"]
        out_ids = common.logical_shape(expr.outputs[0])
        shared = {}
        for k, id_ in enumerate(out_ids):
            if k != dim:
                shared[k] = rule.add_factor(f"a{k}", id_.extent())
        for n, t in enumerate(expr.inputs):
            axes = []
            for k, id_ in enumerate(common.logical_shape(t)):
                if k == dim:
                    axes.append((rule.add_factor(f"c{n}", id_.extent(), FactorKind.REPLICATED),))
                else:
                    axes.append((shared[k],))
            rule.operands.append(axes)
        rule.results.append(
            [(rule.add_factor("c", out_ids[dim].extent()),) if k == dim else (shared[k],) for k in range(len(out_ids))]
        )
        return rule

    def evaluate(self, expr, args, ctx):
        dtype = expr.outputs[0].dtype().torch_dtype
        return [torch.cat([a.to(dtype) for a in args], dim=expr.attrs["dim"])]

    def format(self, expr):
        ins = ", ".join(str(t) for t in expr.inputs)
        return f"{expr.outputs[0]}\n   = cat( {ins}, {expr.attrs['dim']} )\n"


_cat = register(CatOp())
frontend("cat")(_cat.define)


# -- size / shape -------------------------------------------------------------------------


class SizeOp(OpSpec):
    """The GLOBAL extent of an axis (what nvFuser's fd.ops.size returns)."""

    def __init__(self):
        super().__init__("size")

    def define(self, arg, dim):
        fusion = common.current_fusion(arg)
        arg = common.expect_tv(arg, "size", "arg")
        ids = common.logical_shape(arg)
        dim = common.norm_axis(dim, len(ids), "size", arg)
        out = Scalar(fusion, DataType.Int, None, fusion.new_scalar_name(DataType.Int))
        id_ = ids[dim]
        out.extent_size = id_.expanded if id_.is_broadcast() and id_.expanded is not None else id_.extent()
        fusion.add_expr(self, [arg], [out], {"dim": dim})
        return out

    def rule(self, expr):
        return ShardingRule()

    def evaluate(self, expr, args, ctx):
        return [ctx.evaluate_size(expr.outputs[0].extent_size)]

    def format(self, expr):
        return ""


_size = register(SizeOp())
frontend("size")(_size.define)


@frontend("shape")
def _shape(arg):
    arg = common.expect_tv(arg, "shape", "arg")
    return [_size.define(arg, d) for d in range(arg.ndim)]

