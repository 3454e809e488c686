"""How one logical axis is laid out over a device mesh.

An axis sharding is a tuple of *digits*, outermost first. A digit is a mesh
axis name ("x", "y", "z") or a local block given by its `Size`. Element `e`
of the axis is owned by the devices whose mesh coordinates equal the mesh
digits of `e` written in that mixed radix. With N the extent and d the mesh
axis size:

    ()                 replicated
    ("x", N/d)         outer split parallelized on DIDx (block sharding)
    (N/d, "x")         inner split parallelized on DIDx (cyclic sharding)
    ("y", "x", N/4)    two nested outer splits
    (S, "x", M/d)      what merging [S, M->x] into one axis gives

The local data of a device is its local blocks in order, so one reshape and
index recipe shards, gathers and scatters every layout.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..ir.sizes import Size, whole_quotient

MESH_AXES = ("x", "y", "z")

AxisSharding = tuple  # of str | Size
REPLICATED: AxisSharding = ()


class ShardingError(ValueError):
    """A sharding that cannot be applied to the tensor it is on."""


def normalize(digits: Sequence) -> AxisSharding:
    """Merge adjacent local blocks, drop blocks of size 1; () if no mesh digit."""
    for d in digits:
        if isinstance(d, str):
            break
    else:
        return ()
    out: list = []
    for d in digits:
        if not isinstance(d, str):
            d = Size.of(d)
            if d == 1:
                continue
            if out and not isinstance(out[-1], str):
                d = out.pop() * d
        out.append(d)
    return tuple(out)


def block(mesh_axes: Sequence[str], extent: Size, mesh_sizes: dict) -> AxisSharding:
    """Nested outer splits: block(("y", "x"), N, m) == ("y", "x", N/(dy*dx))."""
    if not mesh_axes:
        return ()
    divisor = 1
    for m in mesh_axes:
        divisor *= mesh_sizes[m]
    rest = Size.of(extent).divided_by(divisor)
    return normalize(tuple(mesh_axes) + (rest,))


def mesh_axes_of(digits: AxisSharding) -> tuple:
    return tuple([d for d in digits if isinstance(d, str)])


def key(digits: AxisSharding) -> tuple:
    """Hashable, orderable, union-find-stable form for comparisons."""
    if not digits:
        return ()
    return tuple([(0, d) if isinstance(d, str) else (1, d.key()) for d in digits])


def concrete(digits: AxisSharding, sizes) -> AxisSharding:
    """The same layout with every local block evaluated (a SizeEvaluator)."""
    if not digits:
        return ()
    return normalize([d if isinstance(d, str) else Size(sizes.evaluate_size(d)) for d in digits])


def keep_outer(digits: AxisSharding, banned: set, mesh_sizes: dict) -> AxisSharding:
    """The longest outer part of a layout avoiding `banned` mesh axes: from
    the first banned digit inward, everything becomes local (Shardy's
    longest compatible prefix)."""
    out, cut = [], False
    for d in digits:
        if isinstance(d, str) and (cut or d in banned):
            cut = True
            d = Size(mesh_sizes[d])
        out.append(d)
    return normalize(out)


def same(a: AxisSharding, b: AxisSharding) -> bool:
    """key(a) == key(b), digit by digit, without building either key."""
    if a is b:
        return True
    if not a or not b:
        return not a and not b
    if len(a) != len(b):
        return False
    for i in range(len(a)):  # (an index loop: compiled, no tuple per pair)
        x, y = a[i], b[i]
        if x is y:
            continue
        if isinstance(x, str):
            if not isinstance(y, str) or x != y:
                return False
        elif isinstance(y, str) or x.key() != y.key():
            return False
    return True


def without(digits: AxisSharding, mesh_axis: str, mesh_sizes: dict) -> AxisSharding:
    """The layout after gathering `mesh_axis`: its digit becomes a local block."""
    return normalize([Size(mesh_sizes[d]) if d == mesh_axis else d for d in digits])


def describe(digits: AxisSharding) -> str:
    """Short form for logs: DIDx, DIDy*DIDx, [* DIDx] for inner splits."""
    if not digits:
        return "replicated"
    if not isinstance(digits[-1], str) and all(isinstance(d, str) for d in digits[:-1]):
        return "*".join("DID" + d for d in digits[:-1])
    return "[" + " ".join("DID" + d if isinstance(d, str) else "*" for d in digits) + "]"


def segments(digits: AxisSharding, extent: int, mesh_sizes: dict, bindings=None) -> list:
    """Concrete digits [(mesh axis or None, size)] whose sizes multiply to extent."""
    if not digits:
        return [(None, extent)]
    out = []
    total = 1
    for d in digits:
        if isinstance(d, str):
            size = mesh_sizes[d]
            out.append((d, size))
        else:
            size = d.evaluate(bindings or {})
            out.append((None, size))
        total *= size
    if total != extent:
        raise ShardingError(f"extent {extent} does not split into {[s for _, s in out]}")
    return out


def local_numel_divisor(digits: AxisSharding, mesh_sizes: dict) -> int:
    divisor = 1
    for d in digits:
        if isinstance(d, str):
            divisor *= mesh_sizes[d]
    return divisor


# -- layouts of axes made of several factors (reshapes) ----------------------


def split_layout(digits: AxisSharding, extents: Sequence[Size], mesh_sizes: dict):
    """Distribute an axis layout over the factors the axis is made of (outer
    first). None when a mesh digit would straddle two factors, e.g. DIDx with
    2 devices over factors [3, 2]."""
    if len(extents) == 1:
        return [digits]
    if not digits:
        return [() for _ in extents]
    out: list = [[] for _ in extents]
    fi, rem = 0, Size.of(extents[0])
    n = len(extents)

    def advance():
        nonlocal fi, rem
        while rem == 1 and fi < n - 1:
            fi += 1
            rem = Size.of(extents[fi])

    for d in digits:
        if isinstance(d, str):
            advance()
            q = whole_quotient(rem, Size(mesh_sizes[d]))
            if q is None:
                return None
            out[fi].append(d)
            rem = q
            continue
        s = d
        while not s == 1:
            advance()
            if s == rem:
                out[fi].append(s)
                s, rem = Size(1), Size(1)
            elif not rem == 1 and whole_quotient(s, rem) is not None:
                out[fi].append(rem)
                s, rem = whole_quotient(s, rem), Size(1)
            elif whole_quotient(rem, s) is not None:
                out[fi].append(s)
                rem, s = whole_quotient(rem, s), Size(1)
            else:
                return None
    return [normalize(o) for o in out]


def join_layouts(per_factor: Sequence[AxisSharding], extents: Sequence[Size]) -> AxisSharding:
    """The layout of an axis made of factors laid out as given."""
    if len(per_factor) == 1:
        return per_factor[0]
    digits: list = []
    for d, e in zip(per_factor, extents):
        digits.extend(d if d else (Size.of(e),))
    return normalize(digits)


# -- moving a mesh digit within one axis (cyclic <-> block) ------------------


def _divides(a: Size, b: Size) -> bool:
    return whole_quotient(b, a) is not None


def exchange_digits(before: Sequence, after: Sequence, mesh_axis: str):
    """How an all-to-all over `mesh_axis` turns one layout of an axis into
    another that differs only in where that mesh digit sits, e.g. cyclic
    [N/d, x] into block [x, N/d]. `before`/`after` are segments [(mesh axis
    or None, size)]; other mesh digits must match. Writes the device's data
    with the digit gathered as the finest common digits `refined` (outer
    first); the digit is refined[ib] before and refined[ia] after. Returns
    (refined, ib, ia), or None when no uniform all-to-all does it (the digit
    straddles a boundary of the other layout, so peers would exchange
    unequal chunks) or it is not a move of that digit."""
    def locals_of(segs):
        pos = [i for i, (n, _) in enumerate(segs) if n == mesh_axis]
        others = [(n, Size.of(s)) for n, s in segs if n is not None and n != mesh_axis]
        return [Size.of(s) for n, s in segs if n is None or n == mesh_axis], pos, others

    b_locals, b_pos, b_others = locals_of(before)
    a_locals, a_pos, a_others = locals_of(after)
    if len(b_pos) != 1 or len(a_pos) != 1 or b_others != a_others:
        return None
    b_at = sum(1 for n, _ in before[: b_pos[0]] if n is None)  # the digit's place among the locals
    a_at = sum(1 for n, _ in after[: a_pos[0]] if n is None)

    def bounds(seq):  # suffix products, innermost (1) first
        out = [Size(1)]
        for s in reversed(seq):
            out.append(out[-1] * s)
        return out

    b_bounds, a_bounds = bounds(b_locals), bounds(a_locals)
    if b_bounds[-1] != a_bounds[-1]:
        return None
    merged: list = []
    i = j = 0
    while i < len(b_bounds) or j < len(a_bounds):  # merge two divisibility chains
        if j == len(a_bounds) or (i < len(b_bounds) and b_bounds[i] == a_bounds[j]):
            nxt = b_bounds[i]
        elif i == len(b_bounds):
            nxt = a_bounds[j]
        elif _divides(b_bounds[i], a_bounds[j]):
            nxt = b_bounds[i]
        elif _divides(a_bounds[j], b_bounds[i]):
            nxt = a_bounds[j]
        else:
            return None
        if not merged or merged[-1] != nxt:
            merged.append(nxt)
        while i < len(b_bounds) and b_bounds[i] == nxt:
            i += 1
        while j < len(a_bounds) and a_bounds[j] == nxt:
            j += 1
    refined = [whole_quotient(merged[k + 1], merged[k]) for k in range(len(merged) - 1)][::-1]
    if any(r is None for r in refined):
        return None
    n = len(refined)

    def refined_index(seq, at):
        inner, outer = bounds(seq)[len(seq) - at - 1], bounds(seq)[len(seq) - at]
        k = merged.index(inner)
        if k + 1 >= len(merged) or merged[k + 1] != outer:
            return None  # the digit spans several refined digits
        return n - 1 - k

    ib, ia = refined_index(b_locals, b_at), refined_index(a_locals, a_at)
    if ib is None or ia is None or ib == ia:
        return None
    return refined, ib, ia


def exchange_chunks(local: torch.Tensor, axis: int, refined: list, ib: int, ia: int) -> list:
    """The chunks a device sends in an in-axis all-to-all (exchange_digits),
    chunk c for the peer with coordinate c."""
    sizes = [int(s.value) for i, s in enumerate(refined) if i != ib]
    shape = list(local.shape)
    t = local.reshape(shape[:axis] + sizes + shape[axis + 1 :])
    at = ia if ia < ib else ia - 1
    chunk_shape = shape[:axis] + [shape[axis] // sizes[at]] + shape[axis + 1 :]
    return [t.select(axis + at, c).reshape(chunk_shape) for c in range(sizes[at])]


def assemble_exchanged(pieces: list, axis: int, refined: list, ib: int, ia: int) -> torch.Tensor:
    """The received chunks (from peers in coordinate order) as the device's
    local block of the layout after an in-axis all-to-all."""
    sizes = [int(s.value) for i, s in enumerate(refined) if i not in (ib, ia)]
    shape = list(pieces[0].shape)
    unflat = [p.reshape(shape[:axis] + sizes + shape[axis + 1 :]) for p in pieces]
    at = ib if ib < ia else ib - 1
    t = torch.stack(unflat, dim=axis + at)
    return t.reshape(shape[:axis] + [shape[axis] * len(pieces)] + shape[axis + 1 :])


# -- moving data between layouts --------------------------------------------


def take_local(full: torch.Tensor, axis: int, segs: list, coords: dict) -> torch.Tensor:
    """The block of `full` along `axis` owned by the device at `coords`."""
    sizes = [s for _, s in segs]
    shape = list(full.shape)
    t = full.reshape(shape[:axis] + sizes + shape[axis + 1 :])
    index: list = [slice(None)] * t.dim()
    for i, (name, _) in enumerate(segs):
        if name is not None:
            index[axis + i] = slice(coords[name], coords[name] + 1)
    t = t[tuple(index)]
    local = 1
    for name, s in segs:
        if name is None:
            local *= s
    return t.reshape(shape[:axis] + [local] + shape[axis + 1 :])


def take_block(t: torch.Tensor, layouts: list, mesh_sizes: dict, coords: dict, bindings=None) -> torch.Tensor:
    """The device's block of a global tensor whose dim d is laid out as
    layouts[d] (() or None: kept whole)."""
    for d, digits in enumerate(layouts):
        if digits:
            t = take_local(t, d, segments(digits, t.shape[d], mesh_sizes, bindings), coords)
    return t


def _position_among_locals(segs: list, mesh_axis: str) -> int:
    position = 0
    for name, _ in segs:
        if name == mesh_axis:
            return position
        if name is None:
            position += 1
    raise ShardingError(f"layout {segs} has no DID{mesh_axis}")


def insert_gathered(pieces: list, axis: int, segs: list, mesh_axis: str) -> torch.Tensor:
    """Inverse of take_local for one mesh digit. `pieces[c]` is the local block
    of the peer with coordinate c on `mesh_axis`, laid out as `segs` (a list,
    or the blocks stacked in one tensor); the result is the local block of
    the layout with that digit gathered."""
    if isinstance(pieces, torch.Tensor):
        stacked = pieces.movedim(0, axis)  # [..., d, local, ...]
    else:
        stacked = torch.stack(pieces, dim=axis)
    local_sizes = [s for name, s in segs if name is None]
    position = _position_among_locals(segs, mesh_axis)
    shape = list(stacked.shape)
    t = stacked.reshape(shape[: axis + 1] + local_sizes + shape[axis + 2 :])
    perm = list(range(t.dim()))
    gathered = perm.pop(axis)
    perm.insert(axis + position, gathered)
    t = t.permute(perm)
    return t.reshape(shape[:axis] + [shape[axis] * shape[axis + 1]] + shape[axis + 2 :])


def expose(local: torch.Tensor, axis: int, segs_after: list, mesh_axis: str) -> torch.Tensor:
    """View a block that is full along `mesh_axis` as [d, rest] in dim `axis`,
    chunk c being what the peer with coordinate c owns once `segs_after` (the
    layout with the digit) applies. Used before a scatter or a local slice."""
    sizes = []
    position = None
    for name, s in segs_after:
        if name == mesh_axis:
            position = len(sizes)
            sizes.append(s)
        elif name is None:
            sizes.append(s)
    if position is None:
        raise ShardingError(f"layout {segs_after} has no DID{mesh_axis}")
    shape = list(local.shape)
    t = local.reshape(shape[:axis] + sizes + shape[axis + 1 :])
    perm = list(range(t.dim()))
    chunk_dim = perm.pop(axis + position)
    perm.insert(axis, chunk_dim)
    t = t.permute(perm)
    d = sizes[position]
    rest = 1
    for s in sizes:
        rest *= s
    return t.reshape(shape[:axis] + [d, rest // d] + shape[axis + 1 :])


