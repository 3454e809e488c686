"""What the propagation engine decides and proposes.

A decision (log.Decision) is the layout of one (tensor, logical axis),
with its priority, the stage that applied it and its Source. A Proposal
is one layout offered to an open axis through one factor of one expr;
identical proposals from several places merge into one Choice. Two
choices for a tensor compete when they cannot both hold (`compete`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Union

try:
    import cython
except ImportError:  # Python without Cython: the class directives do nothing (native.PythonDirectives)
    from ..native import PythonDirectives as cython

from ..multidevice import layout
from ..ops.registry import FactorKind
from .projection import Role


class Stage(enum.IntEnum):
    """Easy proposals apply a stage at a time, by the factor they cross."""

    ANNOTATION = 0
    PASS_THROUGH = 1
    CONTRACTION = 2
    RESHAPE = 3


# What the log calls each stage (every decision names its stage: made once).
STAGE_TEXT = {stage: stage._name_.lower().replace("_", "-") for stage in Stage}


class Direction(enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    SIDEWAYS = "sideways"


# Members read in inner loops, as module names: on Python 3.11 every attribute
# read on an Enum class goes through EnumType.__getattr__'s slot hook.
_PASS_THROUGH, _CONTRACTION, _RESHAPE = Stage.PASS_THROUGH, Stage.CONTRACTION, Stage.RESHAPE
_FORWARD, _BACKWARD, _SIDEWAYS = Direction.FORWARD, Direction.BACKWARD, Direction.SIDEWAYS
_OPERAND, _RESULT = Role.OPERAND, Role.RESULT
_SUM = FactorKind.SUM


def crossing_stage(kind: FactorKind, compound: bool) -> Stage:
    """The stage a proposal crossing a factor of `kind` applies in:
    pass-through factors first, then contractions (pending sums), then
    factors a reshape splits or merges (compound)."""
    if compound:
        return _RESHAPE
    if kind is _SUM:
        return _CONTRACTION
    return _PASS_THROUGH


def direction_between(src_role, dst_role) -> Direction:
    """From an operand to a result is forward, back is backward; between
    two operands (or two results) sideways."""
    if src_role is _OPERAND and dst_role is _RESULT:
        return _FORWARD
    if src_role is _RESULT and dst_role is _OPERAND:
        return _BACKWARD
    return _SIDEWAYS


@cython.no_gc
@cython.freelist(256)
@cython.cclass
@dataclass(eq=False)
class Opinion:
    """The layout one tensor of an expr has on one factor."""

    digits: tuple
    tv: object
    priority: int
    role: Role
    mesh: object
    compound: bool  # read off an axis made of several factors
    linked: bool  # read off an axis of a pass-through class (classes.py)
    # the decision's layout facts, when it is the decision's whole layout (None: not given)
    mesh_axes: Optional[frozenset] = None
    key: Optional[tuple] = None


def new_opinion(digits, tv, priority, role, mesh, compound, linked, mesh_axes, key) -> Opinion:
    """Opinion(...), its fields filled directly (see log.new_decision)."""
    o = Opinion.__new__(Opinion)
    o.digits, o.tv, o.priority, o.role, o.mesh = digits, tv, priority, role, mesh
    o.compound, o.linked, o.mesh_axes, o.key = compound, linked, mesh_axes, key
    return o


@cython.no_gc
@cython.freelist(256)
@cython.cclass
@dataclass(eq=False)
class Proposal:
    tv: object
    axis: int
    digits: tuple
    mesh: object
    priority: int
    stage: Stage
    expr: object
    factor: str  # factor names, for the log
    source: Optional[object]  # the tensor whose layout is proposed
    direction: Direction
    reduction: bool  # the target axis is a reduction axis (a pending sum)
    mesh_axes: Optional[frozenset] = None  # of digits (computed when not given)
    key: Optional[tuple] = None  # layout.key(digits), for merging identical proposals

    def __post_init__(self):
        if self.mesh_axes is None:
            self.mesh_axes = frozenset(layout.mesh_axes_of(self.digits))
        if self.key is None:
            self.key = layout.key(self.digits)


@cython.no_gc
@cython.freelist(256)
@cython.cclass
@dataclass(eq=False, init=False)
class Choice:
    """A layout for one axis of a tensor, with every proposal that offers it."""

    axis: int
    digits: tuple
    mesh: object
    priority: int
    stage: Stage
    reduction: bool
    sources: list  # [Proposal]
    mesh_axes: frozenset  # of digits

    def __init__(self, axis, digits, mesh, priority, stage, reduction, sources=None, mesh_axes=None):
        # (written out: compiled, a generated __init__ with a default factory
        # and a __post_init__ costs several times as much; the engine makes many)
        self.axis = axis
        self.digits = digits
        self.mesh = mesh
        self.priority = priority
        self.stage = stage
        self.reduction = reduction
        self.sources = [] if sources is None else sources
        self.mesh_axes = frozenset(layout.mesh_axes_of(digits)) if mesh_axes is None else mesh_axes


def new_proposal(tv, axis, digits, mesh, priority, stage, expr, factor, source, direction, reduction, mesh_axes,
                 key) -> Proposal:
    """Proposal(...) with its layout facts given, its fields filled directly
    (see log.new_decision): the engine makes one per opinion per target."""
    p = Proposal.__new__(Proposal)
    p.tv, p.axis, p.digits, p.mesh, p.priority, p.stage = tv, axis, digits, mesh, priority, stage
    p.expr, p.factor, p.source, p.direction, p.reduction = expr, factor, source, direction, reduction
    p.mesh_axes, p.key = mesh_axes, key
    return p


def new_choice(axis, digits, mesh, priority, stage, reduction, mesh_axes=None) -> Choice:
    """Choice(...) with no sources yet, its fields filled directly (see
    log.new_decision)."""
    m = Choice.__new__(Choice)
    m.axis, m.digits, m.mesh, m.priority, m.stage, m.reduction = axis, digits, mesh, priority, stage, reduction
    m.sources = []
    m.mesh_axes = frozenset(layout.mesh_axes_of(digits)) if mesh_axes is None else mesh_axes
    return m


def compete(a: Choice, b: Choice) -> bool:
    """Whether two choices for one tensor cannot both hold."""
    if a.mesh is not None and b.mesh is not None and a.mesh is not b.mesh and a.mesh != b.mesh:
        return True
    if a.axis == b.axis:
        return True  # different layouts for one axis (identical ones were merged)
    if a.reduction != b.reduction:
        return False  # a mesh axis may be pending and scatter onto an axis
    return not a.mesh_axes.isdisjoint(b.mesh_axes)


# -- where a decision came from (formatted only when the log is read) -----------------------


@dataclass(frozen=True)
class Annotation:
    tensor: object

    def __init__(self, tensor):
        # (written out: compiled, a dataclass's generated __init__ runs as
        # interpreted Python, and a plan makes one per annotated tensor)
        object.__setattr__(self, "tensor", tensor)

    def __str__(self) -> str:
        return f"annotation of {self.tensor.short_name()}"


@dataclass(frozen=True)
class UnannotatedInput:
    def __str__(self) -> str:
        return "unannotated input"


@dataclass(frozen=True)
class Unreached:
    def __str__(self) -> str:
        return "nothing proposed: replicated"


@cython.no_gc
@cython.freelist(256)
@cython.cclass
class Propagated:
    """Carried through an expr by the choice's first proposal (or chosen with
    no proposal behind it, in a conflict). Keeps only what its text needs
    (a choice's sources are final once it is applied), so the engine's
    proposals and choices are freed with the engine rather than living as
    long as the plan's log."""

    __slots__ = ("direction", "expr", "factor", "tensors")  # flat: a plan keeps one per decision

    def __str__(self) -> str:
        if self.expr is None:
            return "conflict resolution"
        via = f"{self.direction.value} through {self.expr.op.name} (factor {self.factor})"
        names = sorted({t.short_name() for t in self.tensors}, key=lambda n: int(n[1:]))
        if names:
            via += " from " + ", ".join(names)
        return via


def propagated_by(choice: Choice) -> Propagated:
    """The source of a decision the choice made: carried as its first
    proposal was (the choice's proposals' source tensors named), or chosen
    with no proposal behind it, in a conflict. (A module function, like
    propagated_through: compiled, it reads the proposals' fields typed.)"""
    sources = choice.sources
    source = Propagated.__new__(Propagated)
    if sources:
        first = sources[0]
        source.direction, source.expr, source.factor = first.direction, first.expr, first.factor
    else:
        source.direction = source.expr = source.factor = None
    tensors = []
    for i in range(len(sources)):  # (an index loop: compiled, s is typed)
        s = sources[i]
        if s.source is not None:
            tensors.append(s.source)
    source.tensors = tuple(tensors)
    return source


def propagated_through(direction, expr, factor, tensors) -> Propagated:
    """Carried `direction` through `expr` (its factor names) from `tensors`,
    with no Choice behind it (a pass-through class's spread). (A module
    function: compiled, the engine calls it directly, not through the
    class's attributes.)"""
    source = Propagated.__new__(Propagated)
    source.direction, source.expr, source.factor = direction, expr, factor
    source.tensors = tuple(tensors)  # (a tuple is kept as it is)
    return source


Source = Union[Annotation, UnannotatedInput, Unreached, Propagated]
