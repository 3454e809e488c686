"""Hypothesis strategies for random, valid nvshard fusions.

A drawn `FusionCase` is a small program (a list of nodes, each one fd.ops
call, define_tensor or define_scalar), one to three device meshes of 1-8
devices (1-3-D, device ids in any order, pipeline stages on other or
overlapping devices), and annotations on a random subset of its tensors
(inputs and intermediates alike): each mesh axis on a random divisible
axis, as a block (outer split), cyclic (inner split) or mixed layout,
nested when two mesh axes share an axis, sometimes a pending sum on a
contraction's reduction axis, with random priorities. From it a test can

* `case.build()`                  define the fusion (optionally without the
                                  annotations, or in another topological op order)
* `case.make_inputs(seed)`        unsharded torch inputs
* `case.reference(inputs)`        the outputs computed with plain torch ops
* `case.expected_layout(ref)`     the layout each annotated axis must keep
* `case.source()`                 standalone Python for a regression test

The program is emitted as Python source and executed, so what a test runs
is exactly what `source()` prints (the repr of a case is its source, which
is what hypothesis shows for a failing example).

Ops: relu neg sigmoid tanh silu, rsqrt and reciprocal (of x*x + 1), add sub
mul (tensor, constant or symbolic scalar operands; rank mismatch and size-1
axes broadcast), pow, lt + where, cast (float, double, half, bfloat16),
set, sum and var_mean (any axes, keepdim), linear (with/without bias, 1-D
weights), batched matmul (broadcast batch axes, a @ a^T), permute, reshape
(split or merge, -1), slice, cat, broadcast, broadcast_in_dim (expanded
axes), squeeze, sdpfa_fwd (causal or not). `symbolic=True` defines some
input extents as -1.

Extents are 8 or 16 by default (and what reshape, slice and cat make of
them), so any mesh axis of at most 8 devices divides an input axis;
annotations only shard axes their mesh axes divide.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition

EXTENTS = (8, 16)
MESH_AXES = ("x", "y", "z")  # x = last mesh dim
FLOAT_DTYPES = (DataType.Float, DataType.Double, DataType.BFloat16, DataType.Half)

UNARY = ("relu", "neg", "sigmoid", "tanh", "silu")
BINARY = ("add", "sub", "mul")


# -- strategies, made once per argument tuple ---------------------------------------------------
# A case draws ~70 values. Hypothesis keeps st.integers and st.booleans per
# argument tuple, but makes a new st.sampled_from / st.permutations (of a
# list) at every call, and validates each new one at its first draw (about
# half of generating a case). These keep one per distinct values; the same
# strategy object draws exactly the same values, so the cases are unchanged.


def _key(values) -> tuple:
    return tuple((type(v), v) for v in values)  # 1 and True (or 1.0) stay apart


@functools.lru_cache(maxsize=None)
def _made(factory, key: tuple):
    return factory([v for _, v in key])


def _once(factory, values):
    """factory(values) (st.sampled_from, st.permutations), one per distinct values."""
    try:
        return _made(factory, _key(values))
    except TypeError:  # unhashable values: a strategy of their own
        return factory(values)


def _sampled_from(values):
    return _once(st.sampled_from, values)


def _permutations(values):
    return _once(st.permutations, values)


# -- the program -------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """Output `out` of node `node`: the structural identity of a tensor."""

    node: int
    out: int = 0

    def var(self) -> str:
        return f"t{self.node}" if self.out == 0 else f"t{self.node}_{self.out}"

    def __repr__(self) -> str:
        return self.var()


@dataclass
class Axis:
    extent: int  # the torch extent (an expanded broadcast's expanded extent; 1 for a plain broadcast)
    kind: str  # "i" iteration, "b" broadcast (size 1), "e" expanded broadcast, "r" reduction


@dataclass
class Out:
    logical: list  # [Axis], reduction axes included, as nvshard's TensorView.logical
    dtype: DataType
    exact: bool  # bit-identical under any sharding (no reduction on its path)
    lowp: bool  # half or bfloat16 somewhere on its path
    scalar: bool = False  # a symbolic scalar input (fd.define_scalar), not a tensor

    @property
    def shape(self) -> list:
        return [a.extent for a in self.logical if a.kind != "r"]

    @property
    def axes(self) -> list:
        """Non-reduction axes."""
        return [a for a in self.logical if a.kind != "r"]


@dataclass
class Node:
    op: str
    args: list  # Refs, Python scalars, or lists of Refs (cat)
    params: dict
    outs: list  # [Out]

    @property
    def is_input(self) -> bool:
        return self.op in ("input", "scalar")


@dataclass
class Annotation:
    mesh: int  # index into case.meshes
    axes: dict  # logical axis -> digits (mesh axis names and int local blocks, outer first)
    build: dict  # logical axis -> "outer" | "inner" | "around": which split calls make the layout
    priority: Optional[int] = None


@dataclass
class FusionCase:
    nodes: list
    outputs: list  # [Ref]
    meshes: list  # [(device ids, shape)]
    annotations: dict  # Ref -> Annotation
    order_seed: int = 0
    symbolic: bool = False  # some input extents are defined as -1

    # -- sizes and names -----------------------------------------------------------------
    def out(self, ref: Ref) -> Out:
        return self.nodes[ref.node].outs[ref.out]

    def refs(self) -> list:
        return [Ref(i, j) for i, n in enumerate(self.nodes) for j in range(len(n.outs))]

    def input_refs(self) -> list:
        return [Ref(i) for i, n in enumerate(self.nodes) if n.is_input]

    def input_shapes(self) -> list:
        """Global shapes of the fusion inputs (None for scalar inputs)."""
        return [None if self.out(r).scalar else self.out(r).shape for r in self.input_refs()]

    def world_size(self) -> int:
        return max((max(d) + 1 for d, _ in self.meshes), default=1)

    def mesh_axis_sizes(self, mesh: int) -> dict:
        shape = self.meshes[mesh][1]
        return dict(zip(MESH_AXES, reversed(shape)))

    def lowp(self) -> bool:
        return any(self.out(r).lowp for r in self.outputs)

    def with_priorities(self, priorities: dict) -> "FusionCase":
        """The same case with other sharding priorities (Ref -> int or None)."""
        anns = {r: Annotation(a.mesh, dict(a.axes), dict(a.build), priorities.get(r, a.priority))
                for r, a in self.annotations.items()}
        return FusionCase(self.nodes, self.outputs, self.meshes, anns, self.order_seed, self.symbolic)

    # -- orders --------------------------------------------------------------------------
    def topological_orders(self):
        """The definition order, then a random other valid one (inputs keep
        their relative order, so the fusion's signature is unchanged)."""
        return list(range(len(self.nodes))), self.other_order(self.order_seed)

    def other_order(self, seed: int) -> list:
        rng = random.Random(seed)
        deps = {i: set() for i in range(len(self.nodes))}
        last_input = None
        for i, n in enumerate(self.nodes):
            for a in _flat_refs(n.args):
                deps[i].add(a.node)
            if n.is_input:
                if last_input is not None:
                    deps[i].add(last_input)
                last_input = i
        done, order = set(), []
        while len(order) < len(self.nodes):
            ready = [i for i in range(len(self.nodes)) if i not in done and deps[i] <= done]
            i = rng.choice(ready)
            done.add(i)
            order.append(i)
        return order

    # -- source ----------------------------------------------------------------------------
    def node_lines(self, i: int) -> list:
        n = self.nodes[i]
        outs = ", ".join(Ref(i, j).var() for j in range(len(n.outs)))
        a = [_arg(x) for x in n.args]
        p = n.params
        op = n.op
        if op == "input":
            return [f"{outs} = fd.define_tensor({p.get('spelled', p['shape'])}, dtype=DataType.{p['dtype'].name})"]
        if op == "scalar":
            return [f"{outs} = fd.define_scalar(DataType.Double)"]
        if op == "set":
            return [f"{outs} = fd.ops.set({a[0]})"]
        if op == "broadcast":
            return [f"{outs} = fd.ops.broadcast({a[0]}, is_broadcast_dim={p['flags']})"]
        if op in UNARY or op in ("rsqrt", "reciprocal"):
            return [f"{outs} = fd.ops.{op}({a[0]})"]
        if op in BINARY or op in ("pow", "lt"):
            return [f"{outs} = fd.ops.{op}({a[0]}, {a[1]})"]
        if op == "cast":
            return [f"{outs} = fd.ops.cast({a[0]}, dtype=DataType.{p['dtype'].name})"]
        if op == "where":
            return [f"{outs} = fd.ops.where({a[0]}, {a[1]}, {a[2]})"]
        if op == "sum":
            return [f"{outs} = fd.ops.sum({a[0]}, dims={p['dims']}, keepdim={p['keepdim']})"]
        if op == "var_mean":
            return [f"{outs} = fd.ops.var_mean({a[0]}, dims={p['dims']}, correction={p['correction']}, "
                    f"keepdim={p['keepdim']})"]
        if op == "linear":
            bias = f", bias={a[2]}" if len(a) > 2 else ""
            return [f"{outs} = fd.ops.linear({a[0]}, {a[1]}{bias})"]
        if op == "matmul":
            return [f"{outs} = fd.ops.matmul({a[0]}, {a[1]})"]
        if op == "permute":
            return [f"{outs} = fd.ops.permute({a[0]}, dims={p['dims']})"]
        if op == "reshape":
            return [f"{outs} = fd.ops.reshape({a[0]}, new_shape={p['new_shape']})"]
        if op == "slice":
            ends = p["ends"]
            if p.get("size_ends"):
                # full ranges by the axis's own (maybe symbolic) extent, as upstream models write them
                ends = "[" + ", ".join(f"fd.ops.size({a[0]}, {k})" if k != p["axis"] else str(e)
                                       for k, e in enumerate(ends)) + "]"
            return [f"{outs} = fd.ops.slice({a[0]}, start_indices={p['starts']}, end_indices={ends})"]
        if op == "cat":
            return [f"{outs} = fd.ops.cat({a[0]}, dim={p['dim']})"]
        if op == "broadcast_in_dim":
            return [f"{outs} = fd.ops.broadcast_in_dim({a[0]}, shape={p['shape']}, "
                    f"broadcast_dims={p['broadcast_dims']})"]
        if op == "squeeze":
            return [f"{outs} = fd.ops.squeeze({a[0]}, dims={p['dims']})"]
        if op == "sdpfa_fwd":
            return [f"{outs} = fd.ops.sdpfa_fwd({a[0]}, {a[1]}, {a[2]}, dropout_p=0.0, is_causal={p['is_causal']})"]
        raise AssertionError(op)

    def annotation_lines(self, ref: Ref) -> list:
        ann = self.annotations[ref]
        v = ref.var()
        lines = [f"{v}.set_device_mesh(mesh{ann.mesh})"]
        sizes = self.mesh_axis_sizes(ann.mesh)
        # Later logical axes first: the loop positions of earlier ones stay put.
        for axis in sorted(ann.axes, reverse=True):
            lines += split_lines(v, axis, ann.axes[axis], sizes, ann.build.get(axis, "outer"))
        if ann.priority is not None:
            lines.append(f"{v}.set_sharding_priority({ann.priority})")
        return lines

    def mesh_lines(self) -> list:
        return [f"mesh{k} = nvfuser.multidevice.DeviceMesh(torch.tensor({list(d)}).reshape({list(s)}))"
                for k, (d, s) in enumerate(self.meshes)]

    def body_lines(self, order=None, annotate: bool = True) -> list:
        order = list(range(len(self.nodes))) if order is None else order
        lines = []
        for i in order:
            lines += self.node_lines(i)
        for r in self.outputs:
            lines.append(f"fd.add_output({r.var()})")
        if annotate:
            for r in sorted(self.annotations, key=lambda r: (r.node, r.out)):
                lines += self.annotation_lines(r)
        return lines

    def source(self, order=None, annotate: bool = True) -> str:
        head = self.mesh_lines() if annotate else []
        body = "\n".join("    " + line for line in self.body_lines(order, annotate))
        return "\n".join(head + ["with FusionDefinition() as fd:", body])

    def __repr__(self) -> str:
        return "FusionCase(\n" + self.source() + "\n)"

    def _repr_pretty_(self, p, cycle) -> None:  # what hypothesis prints for a failing example
        p.text(repr(self))

    # -- building ----------------------------------------------------------------------------
    def build(self, order=None, annotate: bool = True, extra_lines=()):
        """Define the fusion; returns (fd, {Ref: TensorView})."""
        ns = {"torch": torch, "nvfuser": nvfuser, "DataType": DataType, "FusionDefinition": FusionDefinition}
        src = self.source(order, annotate)
        if extra_lines:
            src += "\n" + "\n".join("    " + line for line in extra_lines)
        exec(_compiled(src), ns)
        tvs = {r: ns[r.var()] for r in self.refs()}
        return ns["fd"], tvs

    def make_inputs(self, seed: int = 0) -> list:
        gen = torch.Generator().manual_seed(seed)
        inputs = []
        for r in self.input_refs():
            o = self.out(r)
            shape = o.shape
            if o.scalar:
                inputs.append(float(torch.rand((), generator=gen, dtype=torch.float64)) * 2.0 + 0.5)
            elif o.dtype == DataType.Bool:
                inputs.append(torch.rand(shape, generator=gen) < 0.5)
            else:
                t = torch.rand(shape, generator=gen, dtype=torch.float64) * 3.0 - 1.5
                inputs.append(t.to(o.dtype.torch_dtype))
        return inputs

    # -- the torch reference -------------------------------------------------------------
    def reference(self, inputs: list) -> list:
        vals: dict = {}
        it = iter(inputs)
        for i, n in enumerate(self.nodes):
            if n.is_input:
                vals[Ref(i)] = next(it)
                continue
            args = [_value(vals, a) for a in n.args]
            results = _evaluate(n, args)
            for j, (o, t) in enumerate(zip(n.outs, results)):
                vals[Ref(i, j)] = t.to(o.dtype.torch_dtype)
        return [vals[r] for r in self.outputs]

    # -- annotations -------------------------------------------------------------------------
    def expected_layout(self, ref: Ref) -> dict:
        """logical axis -> normalized digits the plan must keep (every axis
        of an annotated tensor; unannotated axes replicated)."""
        ann = self.annotations[ref]
        out = {}
        for k, a in enumerate(self.out(ref).logical):
            digits = ann.axes.get(k, ())
            if a.kind == "r" and k not in ann.axes:
                continue  # an open reduction axis may take a pending sum
            out[k] = normalize(digits)
        return out


def split_lines(var: str, axis: int, digits: tuple, sizes: dict, how: str) -> list:
    """Scheduling calls laying logical axis `axis` (at loop position `axis`)
    out as `digits`: a chain of outer splits from the left, of inner splits
    from the right, or both around the local block."""
    lines = []
    extent = [sizes[d] if isinstance(d, str) else d for d in digits]
    par = lambda pos, d: f"{var}.axis({pos}).parallelize(nvfuser.ParallelType.mesh_{d})"  # noqa: E731
    blocks = [n for n, d in enumerate(digits) if not isinstance(d, str)]
    if how == "around" and blocks:
        # outer splits left of the local block, inner splits right of it: the
        # block is the remainder (symbolic when the extent is)
        r = blocks[0]
        pos = axis
        for d, e in zip(digits[:r], extent[:r]):
            lines.append(f"{var}.outer_split({pos}, {e})")
            if isinstance(d, str):
                lines.append(par(pos, d))
            pos += 1
        for n in range(len(digits) - 1, r, -1):
            lines.append(f"{var}.inner_split({pos}, {extent[n]})")
            if isinstance(digits[n], str):
                lines.append(par(pos + 1, digits[n]))
        return lines
    if how in ("outer", "around"):
        pos = axis
        for d, e in zip(digits[:-1], extent[:-1]):
            lines.append(f"{var}.outer_split({pos}, {e})")
            if isinstance(d, str):
                lines.append(par(pos, d))
            pos += 1
        if isinstance(digits[-1], str):
            lines.append(par(pos, digits[-1]))
    else:
        for n in range(len(digits) - 1, 0, -1):
            lines.append(f"{var}.inner_split({axis}, {extent[n]})")
            if isinstance(digits[n], str):
                lines.append(par(axis + 1, digits[n]))
        if isinstance(digits[0], str):
            lines.append(par(axis, digits[0]))
    return lines


def normalize(digits, evaluate=None) -> tuple:
    """Digits with Size blocks as ints (`evaluate` gives symbolic ones a
    value), adjacent blocks merged, 1s dropped; () when no mesh axis is left
    (replicated)."""
    out = []
    for d in digits:
        if not isinstance(d, str):
            if hasattr(d, "value"):
                d = int(d.value) if d.value is not None else int(evaluate(d))
            else:
                d = int(d)
            if d == 1:
                continue
            if out and not isinstance(out[-1], str):
                d *= out.pop()
        out.append(d)
    return tuple(out) if any(isinstance(d, str) for d in out) else ()


def _flat_refs(args) -> list:
    out = []
    for a in args:
        if isinstance(a, Ref):
            out.append(a)
        elif isinstance(a, list):
            out += [b for b in a if isinstance(b, Ref)]
    return out


def _arg(x) -> str:
    if isinstance(x, Ref):
        return x.var()
    if isinstance(x, list):
        return "[" + ", ".join(_arg(y) for y in x) + "]"
    return repr(x)


def _value(vals, a):
    if isinstance(a, Ref):
        return vals[a]
    if isinstance(a, list):
        return [_value(vals, b) for b in a]
    return a


def _compute(t):
    """The precision nvFuser computes in: float for half/bfloat16."""
    if isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16):
        return t.float()
    return t


def _evaluate(n: Node, args: list) -> list:
    op, p = n.op, n.params
    c = [_compute(a) for a in args]
    if op in UNARY or op in ("rsqrt", "reciprocal"):
        fn = {"relu": torch.relu, "neg": torch.neg, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
              "silu": F.silu, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal}[op]
        return [fn(c[0])]
    if op in BINARY or op in ("pow", "lt"):
        a, b = c
        if not isinstance(a, torch.Tensor):
            a, b = torch.tensor(a, dtype=b.dtype), b
        fn = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "pow": torch.pow, "lt": torch.lt}[op]
        return [fn(a, b)]
    if op == "cast":
        return [args[0]]
    if op == "where":
        pred, a, b = c
        dtype = n.outs[0].dtype.torch_dtype
        a = a.to(dtype) if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=dtype)
        b = b.to(dtype) if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=dtype)
        return [torch.where(pred, a, b)]
    if op == "sum":
        return [c[0].sum(dim=p["dims"], keepdim=p["keepdim"])]
    if op == "var_mean":
        var, mean = torch.var_mean(c[0], dim=p["dims"], correction=p["correction"], keepdim=p["keepdim"])
        return [var, mean]
    if op == "linear":
        return [F.linear(c[0], c[1], c[2] if len(c) > 2 else None)]
    if op == "matmul":
        return [torch.matmul(c[0], c[1])]
    if op == "permute":
        return [args[0].permute(p["dims"])]
    if op == "reshape":
        return [args[0].reshape(p["new_shape"])]
    if op == "slice":
        index = tuple(slice(s, e) for s, e in zip(p["starts"], p["ends"]))
        return [args[0][index]]
    if op == "cat":
        dtype = n.outs[0].dtype.torch_dtype
        return [torch.cat([t.to(dtype) for t in args[0]], dim=p["dim"])]
    if op == "broadcast_in_dim":
        x = args[0]
        view = [1] * len(p["shape"])
        for i, d in enumerate(p["broadcast_dims"]):
            view[d] = x.shape[i]
        return [x.reshape(view).expand(p["shape"])]
    if op == "squeeze":
        x = args[0]
        for d in sorted(p["dims"], reverse=True):
            x = x.squeeze(d)
        return [x]
    if op == "set":
        return [args[0].clone()]
    if op == "broadcast":
        x = args[0]
        for d, flag in enumerate(p["flags"]):
            if flag:
                x = x.unsqueeze(d)
        return [x]
    if op == "sdpfa_fwd":
        q, k, v = (t.float() for t in args)
        scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5)
        if p["is_causal"]:
            keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.exp(scores - lse.unsqueeze(-1)) @ v
        return [out, lse, torch.zeros(2, dtype=torch.uint64), torch.zeros((), dtype=torch.uint64)]
    raise AssertionError(op)


# -- the generator -------------------------------------------------------------------------


def _promote(dtypes: list) -> DataType:
    acc = dtypes[0].torch_dtype
    for d in dtypes[1:]:
        acc = torch.promote_types(acc, d.torch_dtype)
    return DataType.from_torch(acc)


def _broadcast_axes(outs: list) -> Optional[list]:
    """Result axes of a pointwise op (right-aligned broadcasting), or None
    when the shapes do not broadcast."""
    shapes = [o.axes for o in outs]
    rank = max(len(s) for s in shapes)
    result = []
    for j in range(rank):
        col = [s[j - (rank - len(s))] for s in shapes if j - (rank - len(s)) >= 0]
        concrete = [a for a in col if a.kind == "i"]
        expanded = [a for a in col if a.kind == "e"]
        sizes = {a.extent for a in col if a.extent != 1}
        if len(sizes) > 1:
            return None
        if concrete:
            result.append(Axis(concrete[0].extent, "i"))
        elif expanded:
            result.append(Axis(expanded[0].extent, "e"))
        else:
            result.append(Axis(1, "b"))
    return result


class _Gen:
    def __init__(self, draw, ops, max_rank: int, symbolic: bool = False, extents=EXTENTS):
        self.draw = draw
        self.symbolic = symbolic
        self.extents = tuple(extents)
        self.ops = ops
        self.max_rank = max_rank
        self.nodes: list = []

    # -- helpers ---------------------------------------------------------------------------
    def add(self, op, args, params, outs) -> list:
        self.nodes.append(Node(op, args, params, outs))
        i = len(self.nodes) - 1
        return [Ref(i, j) for j in range(len(outs))]

    def out(self, ref: Ref) -> Out:
        return self.nodes[ref.node].outs[ref.out]

    def tensors(self, pred=lambda o: True) -> list:
        """Tensors ops may use (not sdpfa's seed and offset)."""
        return [Ref(i, j) for i, n in enumerate(self.nodes) for j, o in enumerate(n.outs)
                if o.dtype != DataType.UInt64 and not o.scalar and pred(o)]

    def pick(self, pred=lambda o: True) -> Optional[Ref]:
        refs = self.tensors(pred)
        if not refs:
            return None
        # recent tensors first: programs grow into chains rather than fans
        return self.draw(_sampled_from(refs[::-1]))

    def new_input(self, axes: list, dtype: DataType = DataType.Float) -> Ref:
        shape = [a.extent if a.kind == "i" else 1 for a in axes]
        logical = [Axis(e, "i" if e != 1 else "b") for e in shape]
        return self.add("input", [], {"shape": shape, "dtype": dtype},
                        [Out(logical, dtype, True, dtype.is_reduced_precision)])[0]

    def random_input(self, dtype=DataType.Float) -> Ref:
        rank = self.draw(st.integers(1, self.max_rank))
        axes = []
        for _ in range(rank):
            if self.draw(st.integers(0, 9)) == 0:
                axes.append(Axis(1, "b"))
            else:
                axes.append(Axis(self.draw(_sampled_from(self.extents)), "i"))
        return self.new_input(axes, dtype)

    def pointwise(self, op, args, dtype=None) -> Ref:
        tvs = [a for a in args if isinstance(a, Ref) and not self.out(a).scalar]
        outs = [self.out(a) for a in tvs]
        axes = _broadcast_axes(outs)
        assert axes is not None, (op, args)
        if dtype is None:
            dtype = _promote([o.dtype for o in outs])
            if dtype.is_reduced_precision and op not in ("relu", "silu"):
                dtype = DataType.Float  # nvFuser's arithmetic computes and returns Float
        exact = all(o.exact for o in outs)
        lowp = any(o.lowp for o in outs) or dtype.is_reduced_precision
        params = {"dtype": dtype} if op == "cast" else {}
        return self.add(op, list(args), params, [Out(axes, dtype, exact, lowp)])[0]

    def floating(self, o: Out) -> bool:
        return o.dtype.is_floating

    def compatible_operand(self, x: Ref) -> object:
        """Something to combine with x elementwise: a scalar, a tensor that
        broadcasts with it, or a new input shaped like part of it."""
        xo = self.out(x)
        choice = self.draw(st.integers(0, 4))
        if choice == 0:
            return self.draw(_sampled_from([0.5, -1.25, 2.0]))
        if choice == 4:  # a symbolic scalar input
            return self.add("scalar", [], {}, [Out([], DataType.Double, True, False, scalar=True)])[0]
        if choice == 1:
            cands = [r for r in self.tensors(self.floating) if r != x and _broadcast_axes([xo, self.out(r)])]
            if cands:
                return self.draw(_sampled_from(cands[::-1]))
        if choice == 3:
            return x
        # a new input: drop leading axes (rank mismatch), make some axes size 1
        axes = xo.axes
        drop = self.draw(st.integers(0, max(0, len(axes) - 1)))
        new = []
        for a in axes[drop:]:
            if a.kind == "i":
                new.append(a if self.draw(st.integers(0, 3)) else Axis(1, "b"))
            elif a.kind == "e":
                new.append(Axis(1, "b"))
            else:  # a size-1 broadcast may meet a full axis
                new.append(Axis(self.draw(_sampled_from((1,) + self.extents)), "i"))
        new = [a if a.extent != 1 else Axis(1, "b") for a in new]
        return self.new_input(new, xo.dtype if xo.dtype.is_floating else DataType.Float)

    # -- ops ---------------------------------------------------------------------------------
    def step(self) -> None:
        op = self.draw(_sampled_from(self.ops))
        getattr(self, "op_" + op)()

    def op_unary(self):
        x = self.pick(self.floating)
        self.pointwise(self.draw(_sampled_from(UNARY)), [x])

    def op_safe_unary(self):
        # rsqrt / reciprocal of x*x + 1, which is never zero
        x = self.pick(self.floating)
        sq = self.pointwise("mul", [x, x])
        pos = self.pointwise("add", [sq, 1.0])
        self.pointwise(self.draw(_sampled_from(("rsqrt", "reciprocal"))), [pos])

    def op_binary(self):
        x = self.pick(self.floating)
        y = self.compatible_operand(x)
        args = [x, y]
        if self.draw(st.booleans()):
            args.reverse()
        self.pointwise(self.draw(_sampled_from(BINARY)), args)

    def op_pow(self):
        self.pointwise("pow", [self.pick(self.floating), 2.0])

    def op_cast(self):
        x = self.pick(self.floating)
        dtype = self.draw(_sampled_from([d for d in FLOAT_DTYPES if d != self.out(x).dtype]))
        self.pointwise("cast", [x], dtype)

    def op_where(self):
        exact = self.pick(lambda o: o.exact and o.dtype.is_floating)
        pred = self.pointwise("lt", [exact, 0.0], DataType.Bool)
        a = self.pick(lambda o: o.dtype.is_floating and _broadcast_axes([o, self.out(pred)]) is not None)
        b = self.compatible_operand(a) if self.draw(st.booleans()) else 0.0
        if isinstance(b, Ref) and _broadcast_axes([self.out(pred), self.out(a), self.out(b)]) is None:
            b = 0.0
        args = [pred, a, b]
        dtype = _promote([self.out(r).dtype for r in (a, b) if isinstance(r, Ref) and not self.out(r).scalar])
        self.pointwise("where", args, dtype)

    def _reduce_params(self, x: Ref):
        axes = self.out(x).axes
        reducible = [k for k, a in enumerate(axes) if a.kind == "i"]
        dims = sorted(self.draw(st.lists(st.sampled_from(reducible), min_size=1, max_size=len(reducible),
                                         unique=True)))
        keepdim = self.draw(st.booleans())
        return dims, keepdim

    def _reduced_out(self, x: Ref, dims, keepdim, dtype) -> Out:
        xo = self.out(x)
        logical = []
        for k, a in enumerate(xo.axes):
            if k in dims:
                logical.append(Axis(1, "b") if keepdim else Axis(a.extent, "r"))
            else:
                logical.append(Axis(a.extent, a.kind))
        return Out(logical, dtype, False, xo.lowp)

    def op_sum(self):
        x = self.pick(lambda o: o.dtype.is_floating and any(a.kind == "i" for a in o.axes))
        if x is None:
            return self.op_unary()
        dims, keepdim = self._reduce_params(x)
        dtype = self.out(x).dtype
        self.add("sum", [x], {"dims": dims, "keepdim": keepdim}, [self._reduced_out(x, dims, keepdim, dtype)])

    def op_var_mean(self):
        x = self.pick(lambda o: o.dtype.is_floating and any(a.kind == "i" for a in o.axes))
        if x is None:
            return self.op_unary()
        if self.out(x).dtype.is_reduced_precision:
            x = self.pointwise("cast", [x], DataType.Float)
        dims, keepdim = self._reduce_params(x)
        correction = self.draw(_sampled_from([0, 1]))
        n = 1
        for k in dims:
            n *= self.out(x).axes[k].extent
        if n <= correction:
            correction = 0
        o = self._reduced_out(x, dims, keepdim, self.out(x).dtype)
        self.add("var_mean", [x], {"dims": dims, "correction": correction, "keepdim": keepdim},
                 [o, Out(list(o.logical), o.dtype, False, o.lowp)])

    def op_linear(self):
        a = self.pick(lambda o: o.dtype.is_floating and o.axes and o.axes[-1].kind == "i")
        if a is None:
            return self.op_unary()
        ao = self.out(a)
        k = ao.axes[-1].extent
        dtype = ao.dtype
        vector = self.draw(st.integers(0, 5)) == 0
        w = None
        if not vector and self.draw(st.booleans()):
            w = self.pick(lambda o: o.dtype == dtype and len(o.axes) == 2 and o.axes[1].extent == k
                          and o.axes[1].kind == "i" and o.axes[0].kind == "i")
        if w is None:
            w_axes = [Axis(k, "i")] if vector else [Axis(self.draw(_sampled_from(self.extents)), "i"), Axis(k, "i")]
            w = self.new_input(w_axes, dtype)
        wo = self.out(w)
        args = [a, w]
        if len(wo.axes) == 2 and self.draw(st.integers(0, 2)) == 0:
            args.append(self.new_input([wo.axes[0]], dtype))
        logical = [Axis(x.extent, x.kind) for x in ao.axes[:-1]]
        if len(wo.axes) == 2:
            logical.append(Axis(wo.axes[0].extent, "i"))
        logical.append(Axis(k, "r"))
        self.add("linear", args, {}, [Out(logical, dtype, False, ao.lowp or wo.lowp)])

    def op_matmul(self):
        a = self.pick(lambda o: o.dtype.is_floating and len(o.axes) >= 2
                      and all(x.kind == "i" for x in o.axes[-2:]))
        if a is None:
            return self.op_unary()
        ao = self.out(a)
        dtype = ao.dtype
        m, k = ao.axes[-2].extent, ao.axes[-1].extent
        batch = ao.axes[:-2]
        b = None
        if self.draw(st.integers(0, 2)) == 0:
            # a @ a^T: the same tensor on both sides
            perm = list(range(len(ao.axes)))
            perm[-2], perm[-1] = perm[-1], perm[-2]
            b = self.add("permute", [a], {"dims": perm},
                         [Out([Axis(ao.axes[d].extent, ao.axes[d].kind) for d in perm], dtype, ao.exact, ao.lowp)])[0]
        if b is None:
            n = self.draw(_sampled_from(self.extents))
            drop = self.draw(st.integers(0, len(batch)))
            b_batch = [x if x.kind == "i" and self.draw(st.integers(0, 3)) else Axis(1, "b") for x in batch[drop:]]
            b = self.new_input(b_batch + [Axis(k, "i"), Axis(n, "i")], dtype)
        if self.draw(st.integers(0, 3)) == 0 and len(ao.axes) == 2:
            a, b = b, a  # the new operand first: [.., k, n] @ [m, k] needs n == m
            if self.out(a).axes[-1].extent != self.out(b).axes[-2].extent:
                a, b = b, a
        ao, bo = self.out(a), self.out(b)
        bb = _broadcast_axes([Out(ao.axes[:-2], dtype, True, False), Out(bo.axes[:-2], dtype, True, False)]) \
            if (ao.axes[:-2] or bo.axes[:-2]) else []
        logical = bb + [Axis(ao.axes[-2].extent, "i"), Axis(bo.axes[-1].extent, "i"), Axis(ao.axes[-1].extent, "r")]
        self.add("matmul", [a, b], {}, [Out(logical, dtype, False, ao.lowp or bo.lowp)])

    def op_permute(self):
        x = self.pick(lambda o: len(o.axes) >= 2)
        if x is None:
            return self.op_unary()
        xo = self.out(x)
        perm = self.draw(_permutations(range(len(xo.axes))))
        self.add("permute", [x], {"dims": list(perm)},
                 [Out([Axis(xo.axes[d].extent, xo.axes[d].kind) for d in perm], xo.dtype, xo.exact, xo.lowp)])

    def op_reshape(self):
        x = self.pick(lambda o: o.axes and all(a.kind == "i" for a in o.axes))
        if x is None:
            return self.op_unary()
        xo = self.out(x)
        shape = list(xo.shape)
        can_merge = len(shape) >= 2
        if len(shape) < self.max_rank + 1 and (not can_merge or self.draw(st.booleans())):
            k = self.draw(st.integers(0, len(shape) - 1))
            e = shape[k]
            p = self.draw(_sampled_from([d for d in (2, 4, 8) if e % d == 0 and e // d > 1] or [1]))
            new = shape[:k] + [p, e // p] + shape[k + 1:]
        else:
            k = self.draw(st.integers(0, len(shape) - 2))
            new = shape[:k] + [shape[k] * shape[k + 1]] + shape[k + 2:]
        spelled = list(new)
        if self.draw(st.integers(0, 3)) == 0:
            spelled[self.draw(st.integers(0, len(new) - 1))] = -1
        logical = [Axis(e, "i" if e != 1 else "b") for e in new]
        self.add("reshape", [x], {"new_shape": spelled}, [Out(logical, xo.dtype, xo.exact, xo.lowp)])

    def op_slice(self):
        x = self.pick(lambda o: any(a.kind == "i" and a.extent >= 8 for a in o.axes))
        if x is None:
            return self.op_unary()
        xo = self.out(x)
        k = self.draw(_sampled_from([k for k, a in enumerate(xo.axes) if a.kind == "i" and a.extent >= 8]))
        e = xo.axes[k].extent
        start, end = self.draw(_sampled_from([(0, e // 2), (e // 2, e), (e // 4, 3 * e // 4)]))
        starts = [0] * len(xo.axes)
        ends = list(xo.shape)
        starts[k], ends[k] = start, end
        logical = [Axis(a.extent, a.kind) for a in xo.axes]
        logical[k] = Axis(end - start, "i")
        self.add("slice", [x], {"starts": starts, "ends": ends, "axis": k, "size_ends": self.draw(st.booleans())},
                 [Out(logical, xo.dtype, xo.exact, xo.lowp)])

    def op_cat(self):
        # (nvshard makes cat's other axes iteration axes, so no broadcasts there)
        x = self.pick(lambda o: o.dtype.is_floating and o.axes and all(a.kind == "i" for a in o.axes))
        if x is None:
            return self.op_unary()
        xo = self.out(x)
        dim = self.draw(_sampled_from([k for k, a in enumerate(xo.axes) if a.kind == "i"]))
        if self.draw(st.booleans()):
            y = x
        else:
            axes = [Axis(a.extent, a.kind) for a in xo.axes]
            axes[dim] = Axis(self.draw(_sampled_from(self.extents)), "i")
            y = self.new_input(axes, xo.dtype)
        yo = self.out(y)
        logical = [Axis(a.extent, a.kind) for a in xo.axes]
        logical[dim] = Axis(xo.axes[dim].extent + yo.axes[dim].extent, "i")
        self.add("cat", [[x, y]], {"dim": dim},
                 [Out(logical, xo.dtype, xo.exact and yo.exact, xo.lowp or yo.lowp)])

    def op_broadcast_in_dim(self):
        x = self.pick(lambda o: 1 <= len(o.axes) < self.max_rank + 1 and all(a.kind == "i" for a in o.axes))
        if x is None:
            return self.op_unary()
        xo = self.out(x)
        rank = len(xo.axes) + 1
        new_dim = self.draw(st.integers(0, rank - 1))
        extent = self.draw(_sampled_from((1,) + self.extents))
        dims = [d for d in range(rank) if d != new_dim]
        shape = []
        logical = []
        it = iter(xo.axes)
        for d in range(rank):
            if d == new_dim:
                shape.append(extent)
                logical.append(Axis(extent, "b" if extent == 1 else "e"))
            else:
                a = next(it)
                shape.append(a.extent)
                logical.append(Axis(a.extent, "i"))
        self.add("broadcast_in_dim", [x], {"shape": shape, "broadcast_dims": dims},
                 [Out(logical, xo.dtype, xo.exact, xo.lowp)])

    def op_squeeze(self):
        x = self.pick(lambda o: any(a.kind == "b" for a in o.axes))
        if x is None:
            return self.op_unary()
        xo = self.out(x)
        cands = [k for k, a in enumerate(xo.axes) if a.kind == "b"]
        dims = sorted(self.draw(st.lists(st.sampled_from(cands), min_size=1, max_size=len(cands), unique=True)))
        logical = [Axis(a.extent, a.kind) for k, a in enumerate(xo.axes) if k not in dims]
        self.add("squeeze", [x], {"dims": dims}, [Out(logical, xo.dtype, xo.exact, xo.lowp)])

    def op_set(self):
        x = self.pick()
        xo = self.out(x)
        self.add("set", [x], {}, [Out([Axis(a.extent, a.kind) for a in xo.axes], xo.dtype, xo.exact, xo.lowp)])

    def op_broadcast(self):
        x = self.pick(lambda o: len(o.axes) < self.max_rank + 1)
        xo = self.out(x)
        rank = len(xo.axes) + 1
        new = self.draw(st.integers(0, rank - 1))
        flags = [d == new for d in range(rank)]
        it = iter(xo.axes)
        logical = [Axis(1, "b") if f else (lambda a: Axis(a.extent, a.kind))(next(it)) for f in flags]
        self.add("broadcast", [x], {"flags": flags}, [Out(logical, xo.dtype, xo.exact, xo.lowp)])

    def op_sdpa(self):
        """sdpfa_fwd on [b, h, L, E] queries: new key and value inputs; the key
        length and head dim are needed whole, the rest passes through."""
        q = self.pick(lambda o: len(o.axes) == 4 and all(a.kind == "i" for a in o.axes)
                      and o.dtype in (DataType.Float, DataType.BFloat16))
        if q is None:
            q = self.new_input([Axis(self.draw(_sampled_from(self.extents)), "i") for _ in range(4)])
        qo = self.out(q)
        b, h, L, E = qo.shape
        S = self.draw(_sampled_from(self.extents))
        Ev = self.draw(_sampled_from(self.extents))
        k = self.new_input([Axis(b, "i"), Axis(h, "i"), Axis(S, "i"), Axis(E, "i")], qo.dtype)
        v = self.new_input([Axis(b, "i"), Axis(h, "i"), Axis(S, "i"), Axis(Ev, "i")], qo.dtype)
        causal = self.draw(st.booleans())
        out = Out([Axis(b, "i"), Axis(h, "i"), Axis(L, "i"), Axis(Ev, "i")], qo.dtype, False, qo.lowp)
        lse = Out([Axis(b, "i"), Axis(h, "i"), Axis(L, "i")], DataType.Float, False, qo.lowp)
        seed = Out([Axis(2, "i")], DataType.UInt64, False, False)
        offset = Out([], DataType.UInt64, False, False)
        self.add("sdpfa_fwd", [q, k, v], {"is_causal": causal}, [out, lse, seed, offset])



ALL_OPS = ("unary", "binary", "sum", "linear", "matmul", "permute", "reshape", "slice", "cat", "where",
           "var_mean", "cast", "safe_unary", "pow", "broadcast_in_dim", "squeeze", "sdpa", "set", "broadcast")


@st.composite
def meshes(draw, max_devices: int = 8, offset_ok: bool = True):
    """(device ids, shape) of a 1-3-D mesh with at most max_devices devices."""
    shape = draw(_sampled_from([
        (2,), (4,), (8,), (1,),
        (2, 2), (2, 4), (4, 2), (1, 2), (2, 1),
        (2, 2, 2), (1, 2, 2), (2, 1, 2),
    ]))
    n = 1
    for s in shape:
        n *= s
    if n > max_devices:
        shape, n = (2,), 2
    devices = list(range(n))
    kind = draw(st.integers(0, 5)) if offset_ok else 0
    if kind == 4:  # devices in another order
        devices = draw(_permutations(devices))
    elif kind == 5 and n <= max_devices // 2:  # not starting at device 0
        devices = [d + n for d in devices]
    return list(devices), shape


def _layout_for(draw, extent: int, mesh_axes: list, sizes: dict) -> tuple:
    """Digits of an axis sharded on mesh_axes (in that order), with the local
    block at a random place: outer split, inner split, or in between."""
    d = 1
    for m in mesh_axes:
        d *= sizes[m]
    rest = extent // d
    pos = draw(st.integers(0, len(mesh_axes)))
    digits = list(mesh_axes[:pos]) + [rest] + list(mesh_axes[pos:])
    return normalize(digits)


@st.composite
def annotations_for(draw, gen_nodes: list, refs: list, n_meshes: int, mesh_sizes: list, allow_pending: bool):
    anns = {}
    for ref in refs:
        o = gen_nodes[ref.node].outs[ref.out]
        if not draw(st.integers(0, 2)) == 0 and not (gen_nodes[ref.node].is_input and draw(st.booleans())):
            continue
        mesh = draw(st.integers(0, n_meshes - 1))
        sizes = mesh_sizes[mesh]
        # a user-chosen pending sum is a partial over a contraction (var_mean's is not a sum)
        pending_ok = gen_nodes[ref.node].op in ("sum", "linear", "matmul")
        names = list(sizes)
        order = draw(_permutations(names))
        per_axis: dict = {}
        for name in order:
            cands = []
            for k, a in enumerate(o.logical):
                if a.kind == "i" or (a.kind == "r" and allow_pending and pending_ok):
                    prod = sizes[name]
                    for m in per_axis.get(k, []):
                        prod *= sizes[m]
                    if a.extent % prod == 0 and a.extent >= prod:
                        cands.append(k)
            if not cands or draw(st.integers(0, 2)) == 0:
                continue
            k = draw(_sampled_from(cands))
            if o.logical[k].kind == "r" and draw(st.integers(0, 2)) != 0:
                continue  # pending sums are rarer
            per_axis.setdefault(k, []).append(name)
        axes = {k: _layout_for(draw, o.logical[k].extent, ms, sizes) for k, ms in per_axis.items()}
        build = {k: draw(_sampled_from(["outer", "inner", "around"])) for k in axes}
        priority = draw(_sampled_from([None, None, 0, 1, 2]))
        anns[ref] = Annotation(mesh, axes, build, priority)
    return anns


@st.composite
def fusions(draw, max_ops: int = 7, ops=ALL_OPS, max_rank: int = 3, meshes_max: int = 1, allow_pending: bool = True,
            max_devices: int = 8, symbolic: bool = False, extents=EXTENTS):
    """A random valid annotated fusion (see the module docstring)."""
    gen = _Gen(draw, list(ops), max_rank, symbolic, extents)
    for _ in range(draw(st.integers(1, 2))):
        gen.random_input()
    for _ in range(draw(st.integers(1, max_ops))):
        gen.step()
    consumed = {a for n in gen.nodes for a in _flat_refs(n.args)}
    refs = [Ref(i, j) for i, n in enumerate(gen.nodes) for j in range(len(n.outs))]
    refs = [r for r in refs if gen.out(r).dtype != DataType.UInt64 and not gen.out(r).scalar]  # not sdpfa's seed/offset
    sinks = [r for r in refs if not gen.nodes[r.node].is_input and r not in consumed]
    extra = [r for r in refs if not gen.nodes[r.node].is_input and r not in sinks
             and draw(st.integers(0, 4)) == 0]
    outputs = sorted(set(sinks + extra), key=lambda r: (r.node, r.out))
    tensor_inputs = [r for r in refs if gen.nodes[r.node].op == "input"]
    if tensor_inputs and draw(st.integers(0, 9)) == 0:  # an input is also an output
        outputs.append(draw(_sampled_from(tensor_inputs)))
    if outputs and draw(st.integers(0, 9)) == 0:  # one tensor output twice
        outputs.append(draw(_sampled_from(outputs)))
    if not outputs:  # only inputs: output a copy of the last one
        x = gen.tensors()[-1]
        outputs = [gen.pointwise("neg", [x])] if gen.out(x).dtype.is_floating else []
        if not outputs:
            outputs = [gen.pointwise("where", [x, 1.0, 0.0], DataType.Float)]
    n_meshes = draw(st.integers(1, meshes_max))
    mesh_list = [draw(meshes(max_devices=max_devices))]
    for _ in range(n_meshes - 1):
        # a pipeline stage: the same shape on other (or partly the same) devices
        d0, shape = mesh_list[0]
        n = len(d0)
        shift = draw(_sampled_from([n, n // 2 if n > 1 else n]))
        devices = [d + shift for d in d0]
        if max(devices) >= max_devices:
            devices = list(reversed(d0))
        mesh_list.append((devices, shape))
    sizes = [dict(zip(MESH_AXES, reversed(s))) for _, s in mesh_list]
    anns = draw(annotations_for(gen.nodes, refs, n_meshes, sizes, allow_pending))
    seed = draw(st.integers(0, 2**16))
    is_symbolic = False
    if symbolic:
        for n in gen.nodes:
            if n.op == "input":
                spelled = [-1 if e != 1 and draw(st.booleans()) else e for e in n.params["shape"]]
                if spelled != n.params["shape"]:
                    n.params["spelled"] = spelled
                    is_symbolic = True
    return FusionCase(gen.nodes, outputs, mesh_list, anns, seed, is_symbolic)


@functools.lru_cache(maxsize=256)
def _compiled(src: str):
    """A case is built several times per example (orders, annotations): compile its source once."""
    return compile(src, "<fusion case>", "exec")
