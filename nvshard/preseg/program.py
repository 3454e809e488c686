"""The program the pre-segmenter passes transform.

Passes never mutate the user's Fusion: they work on a Program that starts
as the fusion's expression list plus a sharding state per TensorView (mesh
and one layout per logical axis; a layout on a reduction axis is a pending
sum over those mesh axes). Decomposition adds TensorViews and
communication expressions to the Program only.

Printing a Program renders every TensorView from its state, so the dump
shows the device splits a pass decided, in nvFuser's printMath format.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

try:
    import cython
except ImportError:  # Python without Cython: the class directives do nothing (native.PythonDirectives)
    from ..native import PythonDirectives as cython

from ..ir import nodes
from ..ir.nodes import Expr, IterDomain, NvShardError, ParallelType, TensorView
from ..ir.printer import format_math
from ..ir.sizes import Size
from ..multidevice import layout


@cython.no_gc
@cython.freelist(256)
@cython.cclass
@dataclass(init=False)
class TvState:
    mesh: object  # DeviceMesh or None (present on every device)
    layouts: list  # per logical axis

    def __init__(self, mesh=None, layouts=None):
        # (written out: compiled, the generated __init__ with a default
        # factory costs about three times as much; plans make tens of thousands)
        self.mesh = mesh
        self.layouts = [] if layouts is None else layouts

    def pending(self, tv: TensorView) -> tuple:
        """Mesh axes holding partial sums (the reduction axes' layouts)."""
        axes = []
        logical, layouts = tv.logical, self.layouts
        for k in range(min(len(logical), len(layouts))):  # (an index loop: compiled, no tuple per pair)
            id_ = logical[k]
            if id_.is_reduction():
                axes.extend(layout.mesh_axes_of(layouts[k]))
        return tuple(axes)

    def used(self, tv: TensorView) -> set:
        """Mesh axes sharding an iteration axis."""
        used = set()
        logical, layouts = tv.logical, self.layouts
        for k in range(min(len(logical), len(layouts))):
            id_ = logical[k]
            if not id_.is_reduction():
                used.update(layout.mesh_axes_of(layouts[k]))
        return used

    def key(self) -> tuple:
        return (self.mesh, tuple([layout.key(d) for d in self.layouts]))


def new_state(mesh, layouts: list) -> TvState:
    """TvState(mesh, layouts), its fields filled directly: compiled, calling
    the class parses its arguments through Python's protocol, and the cost
    model, the projection and the decomposition make tens of thousands a plan."""
    state = TvState.__new__(TvState)
    state.mesh, state.layouts = mesh, layouts
    return state


def annotated_state(tv: TensorView) -> TvState:
    return TvState(tv.mesh, tv.layouts())


class Program:
    __slots__ = (
        "fusion", "sizes", "exprs", "inputs", "input_set", "outputs", "state", "_tv_counter", "_id_counter",
        "_rendered", "_rules", "_graph_index", "_positions"
    )

    def __init__(self, fusion, sizes=None):
        self.fusion = fusion
        self.sizes = sizes  # concrete sizes (a SizeEvaluator) or None
        self.exprs: list[Expr] = list(fusion.exprs)
        self.inputs = fusion.inputs()
        self.input_set = set(self.inputs)
        self.outputs = fusion.outputs()
        self.state: dict[TensorView, TvState] = _initial_states(fusion.tvs(), sizes)
        state = self.state
        self._tv_counter = fusion._tv_counter
        self._id_counter = fusion._id_counter
        self._rendered: dict = {}
        self._rules: dict = {}
        self._positions = None  # expr -> its index in the definition, made when first asked for
        # The fusion's own producers and consumers until a pass changes the
        # exprs (then index()): kept with the fusion, read only.
        self._graph_index = fusion.kept("program index", _index, self.exprs, state)

    # -- graph queries -----------------------------------------------------------
    def index(self) -> None:
        """The exprs changed: producers and consumers are found again when
        next asked for (after the last pass, usually never: on a 10k-expr
        program, a walk and a list per tensor the collector would scan)."""
        self._graph_index = None

    @property
    def producer(self) -> dict:
        """The expr that writes each tensor (read only)."""
        return self._indexed()[0]

    @property
    def consumers(self) -> dict:
        """The exprs that read each tensor, once per read, in program order (read only)."""
        return self._indexed()[1]

    def _indexed(self) -> tuple:
        if self._graph_index is None:
            self._graph_index = _index(self.exprs, self.state)
        return self._graph_index

    def tvs(self) -> list[TensorView]:
        return list(self.state)

    def rule(self, expr):
        """The expr's rule for this program's sizes (looked up once per expr:
        a sized rule's key evaluates shapes)."""
        rule = self._rules.get(expr)
        if rule is None:
            rule = self._rules[expr] = expr.rule(self.sizes)
        return rule

    def fill_meshes(self, mesh_of: dict, fixed, home: Optional[dict] = None) -> None:
        """Give tensors no sharding reached (uniform's output, replicated
        intermediates) their pipeline stage's mesh (`home`, where known),
        else a neighbour's, as nvFuser back-propagates meshes: the mesh most
        neighbours have, then the lowest device ids; all at once per round,
        so the order ops were defined in does not matter. `fixed` tensors
        (annotated, or inputs that live on every device) keep theirs."""
        open_tvs = [tv for tv in self.state if mesh_of[tv] is None and tv not in fixed]
        if home:
            for tv in open_tvs:
                mesh_of[tv] = home.get(tv)
            open_tvs = [tv for tv in open_tvs if mesh_of[tv] is None]
        producer, consumers = self._indexed()
        while open_tvs:
            updates = {}
            for tv in open_tvs:
                exprs = consumers.get(tv, []) + ([producer[tv]] if tv in producer else [])
                meshes = [mesh_of[t] for e in exprs for t in e.tv_inputs + e.tv_outputs if mesh_of[t] is not None]
                if meshes:
                    updates[tv] = min(set(meshes), key=lambda m: (-meshes.count(m), m.shape, m.vector))
            if not updates:
                return
            mesh_of.update(updates)
            open_tvs = [tv for tv in open_tvs if tv not in updates]

    def position(self, expr: Expr) -> int:
        """Index of a user expr in the definition (stable across passes)."""
        if self._positions is None:
            self._positions = {e: i for i, e in enumerate(self.fusion.exprs)}
        return self._positions.get(expr, -1)

    # -- construction used by passes ---------------------------------------------
    def new_tv_like(self, tv: TensorView, state: TvState) -> TensorView:
        """A fresh TensorView with tv's logical axes (reductions dropped when the
        new state has no pending sums) for an intermediate layout."""
        ids = [IterDomain(self._next_id(), i.extent(), i.iter_type, i.expanded) for i in tv.logical]
        new = TensorView(tv.fusion, self._tv_counter, tv.dtype(), ids)
        self._tv_counter += 1
        self.state[new] = state
        return new

    def _next_id(self) -> int:
        n = self._id_counter
        self._id_counter += 1
        return n

    # -- printing ---------------------------------------------------------------------
    def render_tv(self, tv: TensorView) -> str:
        state = self.state.get(tv)
        if state is None or (state.mesh == tv.mesh and state.key() == annotated_state(tv).key()):
            return tv.plain_str()
        cache_key = (tv, state.key())
        if cache_key in self._rendered:
            return self._rendered[cache_key]
        ids = []
        for axis, id_ in enumerate(tv.logical):
            digits = state.layouts[axis] if axis < len(state.layouts) else ()
            if not digits:
                ids.append(_plain(id_))
                continue
            for digit in digits:
                if isinstance(digit, str):
                    extent, ptype = Size(state.mesh.axis_size(digit)), ParallelType.of_mesh_axis(digit)
                else:
                    extent, ptype = digit, ParallelType.Serial
                ids.append(f"{id_.iter_type.value}{ptype}{self._next_id()}{{{extent}}}")
        text = f"T{tv.number}_g_{tv.dtype()}[{', '.join(ids)}]"
        if state.mesh is not None:
            text += f" ({state.mesh})"
        self._rendered[cache_key] = text
        return text

    def print_math(self) -> str:
        with render_with(self):
            return format_math(self.inputs, self.outputs, self.exprs)


def indivisible(tv: TensorView, k: int, digits, extent: int, mesh) -> NvShardError:
    """The error for a layout that does not divide its axis."""
    sizes = mesh.axis_sizes()
    axis = tv.non_reduction_axes().index(k) if k in tv.non_reduction_axes() else k
    return NvShardError(
        f"{tv.short_name()}: axis {axis} has extent {extent}, which is not divisible by "
        f"{'*'.join('DID' + m for m in layout.mesh_axes_of(digits))} "
        f"({layout.local_numel_divisor(digits, sizes)} devices)"
    )


def _index(exprs: list, tvs) -> tuple:
    """(producer per tensor, consumers per tensor, once per read in program
    order) of the exprs."""
    producer, consumers = {}, {tv: [] for tv in tvs}
    for e in exprs:
        for o in e.tv_outputs:
            producer[o] = e
        for i in e.tv_inputs:
            readers = consumers.get(i)
            if readers is None:
                consumers[i] = [e]
            else:
                readers.append(e)
    return producer, consumers


def _initial_states(tvs: list, sizes) -> dict:
    """Each tensor's state as annotated (concrete block sizes where `sizes`
    are). Unplaced tensors of one rank share one replicated state (read
    only: passes give a tensor a new state, never change one in place; the
    legacy pass, which does, copies them first). Propagation replaces
    nearly all of them: per tensor, no state to make now and free cold later."""
    state = {}
    replicated: dict = {}
    # Equal layouts are one object (read only): the passes remember what they
    # work out of a layout per object (Engine._layout_facts, CostModel.layout_number),
    # and stacked layers annotate thousands of tensors alike.
    equal: dict = {}
    for tv in tvs:
        mesh = tv.mesh
        if mesh is None:
            n = len(tv.logical)
            shared = replicated.get(n)
            if shared is None:
                shared = replicated[n] = new_state(None, [()] * n)
            state[tv] = shared
            continue
        layouts = tv.layouts()
        for k in range(len(layouts)):  # (an index loop: compiled, a C call per sharded axis)
            digits = layouts[k]
            if digits:
                if sizes is not None:  # concrete block sizes, so equal layouts compare equal
                    digits = _concrete(tv, k, digits, sizes)
                layouts[k] = equal.setdefault(digits, digits)
        state[tv] = new_state(mesh, layouts)
    return state


def _concrete(tv: TensorView, k: int, digits, sizes):
    """An annotated layout with its local blocks evaluated (`digits` as
    TensorView.layouts gives them: normalized). Blocks that are static
    ints already are: the layout is returned as it is."""
    static = True
    for d in digits:
        if not isinstance(d, str) and (d.syms or type(d.key()[0]) is not int):
            static = False
            break
    if static:
        return digits
    try:
        return layout.concrete(digits, sizes)
    except (NvShardError, ValueError, KeyError):
        extent = sizes.evaluate_size(tv.logical[k].extent())
        raise indivisible(tv, k, digits, extent, tv.mesh) from None


def _plain(id_: IterDomain) -> str:
    extent = id_.display if id_.display is not None else str(id_.extent())
    if id_.expanded is not None:
        extent = f"{extent} ex {id_.expanded}"
    return f"{id_.iter_type.value}S{id_.number}{{{extent}}}"


@contextlib.contextmanager
def render_with(program: Optional[Program]):
    """Print TensorViews as `program`'s state says while the block runs."""
    nodes.RENDER_STACK.append(program)
    try:
        yield
    finally:
        nodes.RENDER_STACK.pop()
