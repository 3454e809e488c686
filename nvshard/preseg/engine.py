"""The sharding propagation engine: factors, meshes and priorities; no op names.

State is a decision per (tensor, logical axis): the layout of that axis (a
layout on a reduction axis is a pending partial sum). User-annotated
tensors are decided up front and never change; their priority (default 0)
says when their shardings start to spread.

For each priority level, lowest first:

 1. Every expr offers *proposals*: through each factor of its rule, the
    layout one tensor has on that factor is proposed to the undecided axes
    of the other tensors on it, forward, backward or sideways. Contraction
    factors reach a result's reduction axis (a pending sum) only once every
    operand on them has decided, since partial sums commit all operands.
 2. A proposal is *easy* when nothing else competes for its target: no
    other layout for the same axis and no other axis of the tensor wanting
    the same mesh axis. Easy proposals are applied a stage at a time, by
    the factor they cross (pass-through factors, then contractions, then
    factors a reshape splits or merges), and propagation continues to a
    fixed point. Axes joined by pass-through factors form classes
    (classes.py): a decision spreads through its class directly, a link
    layer at a time under the same rule, and only exprs where classes meet
    make proposals. After a decision, an adjacent expr re-derives only the
    proposals of its targets on the factors the decided axis carries.
 3. Only when nothing easy is left is one *conflict* resolved: the tensor's
    consistent candidate assignments (with the longest compatible prefix of
    multi-axis layouts) are scored by priority, then by the bytes the
    adjacent exprs would move (concrete sizes) or the weights-stationary
    heuristic (symbolic sizes), then by deterministic tie-breaks (keep the
    producer's sharding, outer axes first). Then propagation resumes.
 4. When nothing is left at all, contraction factors are released with
    open operands treated as replicated, and the loop runs once more.

Undecided axes end replicated; tensors no sharding reached get the mesh of
a neighbour. Every decision is logged with its source, priority and stage.
"""

from __future__ import annotations

import heapq
import itertools
import operator
import zlib

try:
    import cython
except ImportError:  # Python without Cython: the class directives do nothing (native.PythonDirectives)
    from ..native import PythonDirectives as cython

from ..ir.identity import identity
from ..ir.nodes import NvShardError, TensorView
from ..multidevice import layout
from ..ops.registry import FactorKind
from .classes import PassThroughClasses
from .conflicts import ConflictResolver
from .cost import CostModel
from .log import Decision, DecisionLog, new_decision
from .program import Program, new_state
from .projection import Role, axis_factors, split_axis
from .proposals import (STAGE_TEXT, Annotation, Choice, Opinion, Proposal, Stage, UnannotatedInput, Unreached,
                        compete, crossing_stage, direction_between, new_choice, new_opinion, new_proposal,
                        propagated_by, propagated_through)

# Members read in inner loops, as module names: on Python 3.11 every attribute
# read on an Enum class goes through EnumType.__getattr__'s slot hook.
_OPERAND, _RESULT = Role.OPERAND, Role.RESULT
_SUM, _REPLICATED = FactorKind.SUM, FactorKind.REPLICATED
_PASS_THROUGH, _CONTRACTION, _RESHAPE = Stage.PASS_THROUGH, Stage.CONTRACTION, Stage.RESHAPE
_ANNOTATION = Stage.ANNOTATION
_ANNOTATION_TEXT, _PASS_THROUGH_TEXT = STAGE_TEXT[_ANNOTATION], STAGE_TEXT[_PASS_THROUGH]  # as decisions say them
# Sources with nothing to say but what they are: one each (frozen, so sharing them is safe).
_UNANNOTATED_INPUT, _UNREACHED = UnannotatedInput(), Unreached()
_NO_MESH_AXES = frozenset()  # a replicated layout's
_NOTHING_CLASSIFIED = ([], [], [])  # the classification of a tensor no proposal targets (read only)
_NOTHING_CROSSED: set = set()  # a refresh's crossed factors when the changed axes carry none (read only)
# The order every rank visits tensors in (a sort key that is a C function:
# a module function would be called through Python's protocol per element)
_NUMBER = operator.attrgetter("number")


@cython.no_gc
@cython.cclass
class TensorEntry:
    """What the engine knows of one tensor during a plan, in one record: the
    inner loops look a tensor up once, not once per thing they read of it."""

    __slots__ = ("tv", "number", "decided", "mesh", "home", "frozen", "reduction_flags", "adjacent", "adjacent_at",
                 "used_iteration", "used_reduction", "classified", "by_expr", "as_source", "changed_axes", "closed",
                 "order", "refreshed", "stale", "with_easy", "conflicted")

    tv: object
    number: int  # the tensor's number (the order every rank visits tensors in)
    decided: list  # [Decision or None] per logical axis
    mesh: object  # its mesh, once it has one (None: not yet)
    home: object  # its stage's mesh (_stage_meshes), or None
    frozen: bool  # annotated, or an unannotated input: decided up front
    reduction_flags: list  # per logical axis, whether it is a reduction axis
    adjacent: list  # the exprs with results that touch it (_adjacency)
    adjacent_at: list  # their positions in the program (Engine.by_position)
    # the mesh axes its decided iteration (reduction) axes use: None until asked, and after they change
    used_iteration: object
    used_reduction: object
    classified: object  # its (easy, competing, valid) choices (Engine._classified); None when stale
    by_expr: object  # {expr (or _CLASS): [Proposal]} targeting it; None when there are none
    # (tv,), once a spread carries its layouts: the decisions it reaches name it as their source
    # tensors, and share this one tuple (the plan's log keeps them all)
    as_source: object
    # the axes decided since the adjacent exprs' last refresh, as bits (_axis_bit; 0: none): a plan
    # decides tens of thousands of axes, and a set per tensor is an allocation and a free each
    changed_axes: int
    closed: bool  # no more decisions can reach it (Engine._closed): frozen, or every mesh axis taken
    order: object  # (depth, structural key): where it stands among conflicts (Engine._conflict_order)
    refreshed: int  # the number of the last refresh that touched its proposals (Engine._refresh)
    # Flags where the engine had sets of tensors (a set's lookups and growth miss the caches at
    # 10k exprs): listed in Engine._stale; in one of Engine._easy_targets' sets; in the conflict heap
    stale: bool
    with_easy: bool
    conflicted: bool


def new_entry(tv, decided: list, mesh, home, frozen: bool, structure: tuple) -> TensorEntry:
    """A TensorEntry with nothing derived yet, its fields filled directly
    (compiled, calling the class would parse arguments through Python's
    protocol; a plan makes one per tensor). structure: tv's in
    _graph_structure."""
    t = TensorEntry.__new__(TensorEntry)
    t.tv, t.number, t.decided, t.mesh, t.home, t.frozen = tv, tv.number, decided, mesh, home, frozen
    t.reduction_flags, t.adjacent, t.order, t.adjacent_at = structure[1], structure[2], structure[3], structure[4]
    t.closed = frozen
    t.refreshed = t.changed_axes = 0
    t.stale = t.with_easy = t.conflicted = False
    t.used_iteration = t.used_reduction = t.classified = t.by_expr = t.as_source = None
    return t


@cython.no_gc
@cython.cclass
class ExprEntry:
    """What the engine keeps of one proposing expr during a plan, in one
    record: a refresh looks the expr up once, not once per thing it reads
    of it (at 10k exprs each lookup in a per-expr dict misses the caches)."""

    __slots__ = ("expr", "rule", "slots", "kinds", "has_sum", "open_to", "slot_entries", "linked", "proposals",
                 "per_target", "listed")

    expr: object
    rule: object  # its rule for this program's sizes
    slots: list  # axis_factors(expr, rule)
    kinds: list  # each factor's kind
    has_sum: bool  # a factor is a contraction
    open_to: tuple  # positions of the slots that may take a proposal (annotations are final)
    slot_entries: list  # each slot's TensorEntry
    linked: object  # the positions its pass-through classes link (they reach each other through the class)
    proposals: object  # [Proposal] as last derived; None before the first derivation
    per_target: object  # (waiting, {target position: [Proposal]}) as last derived, or None
    listed: int  # the number of the last refresh _after_change listed it for (each once)


class Engine:
    __slots__ = (
        "p", "cost", "log", "frozen", "level", "releasing", "expr_entries", "by_position", "in_order", "by_number",
        "_stale", "_easy_targets", "_conflict_heap", "_heap_counter",
        "tensor_structure", "_layouts_seen",
        "_changed", "_held_back", "_refresh_by_factor", "_refreshes", "home", "resolver", "classes", "depth", "canon"
    )

    def __init__(self, program: Program, cost: CostModel, log: DecisionLog, spread_classes: bool = True,
                 refresh_by_factor: bool = True):
        """spread_classes=False: every decision travels by proposals alone;
        refresh_by_factor=False: a change re-derives all of an adjacent expr's
        proposals (the references the shortcuts are tested against)."""
        self.p = program
        self.cost = cost
        self.log = log
        self.frozen: set = set()
        self.level = 0
        self.releasing = False
        # expr -> ExprEntry, for the exprs that propose (not a class's internal
        # ones), in program order (the first refresh derives them all)
        self.expr_entries: dict = {}
        # the same by the expr's position in the program (None: it does not propose), for the
        # refresh after a change (_after_change: no dict probed per adjacent expr)
        self.by_position: list = [None] * len(program.exprs)
        # every tensor's TensorEntry (its proposals by expr, its choices, ...), in the program's
        # order: a list, not a dict by tensor (at 10k exprs a dict's growth and probes miss the caches)
        self.in_order: list = []
        self.by_number: list = []  # the same entries by tensor number (entry(): a list index, no hashing)
        # Targets whose class must be recomputed, and indexes over the classes,
        # so each round touches only what changed (linear in program size).
        # TensorEntry whose class must be recomputed, each once (TensorEntry.stale),
        # in the order invalidated (about the program's order: the order of the records in memory)
        self._stale: list = []
        self._easy_targets: dict = {}  # stage -> targets with easy proposals of that stage (TensorEntry.with_easy)
        self._conflict_heap: list = []
        self._heap_counter = 0
        # (read only: kept with the fusion)
        self.tensor_structure, self.depth, self.canon = _kept_with_fusion(
            program, "engine graph structure", _graph_structure, program)
        self._layouts_seen: dict = {}  # id(layout) -> (layout, mesh axes, key)
        self._changed: list = []  # TensorEntry with changed axes
        # exprs whose current proposals `releasing` holds back (a contraction
        # waiting for an open operand, a pending sum blocked by one)
        self._held_back: set = set()
        self._refresh_by_factor = refresh_by_factor
        self._refreshes = 0
        self.home = _stage_meshes(program)
        self.resolver = ConflictResolver(self, _kept_with_fusion(program, "conflict places", dict))
        self._seed()
        self.classes = (_pass_through_classes(program, self.frozen, self.home) if spread_classes
                        else PassThroughClasses(None, self.frozen, self.home))

    # -- setup ------------------------------------------------------------------------
    def _seed(self) -> None:
        home, structure = self.home, self.tensor_structure
        # (an Annotation is immutable: one per tensor, kept with the fusion)
        annotations = _kept_with_fusion(self.p, "annotation sources", dict)
        by_number = self.by_number = [None] * len(self.p.state)
        i = 0
        for tv, state in self.p.state.items():
            # (read in the program's order: no lookup per tensor)
            known = structure[i] if i < len(structure) else None
            if known is None or known[0] is not tv:  # (a program whose tensors are not its fusion's, in order)
                structure = _graph_structure(self.p)[0]
                known = structure[i]
            i += 1
            reduction = known[1]
            n = len(tv.logical)
            frozen = True
            if tv.mesh is not None:
                prio = tv.sharding_priority or 0
                source = annotations.get(tv)
                if source is None:
                    source = annotations[tv] = Annotation(tv)
                decided = []
                layouts = state.layouts
                for k in range(n):  # (an index loop over the kept flags: compiled, no method call per axis)
                    digits = layouts[k]
                    if reduction[k] and not digits:
                        decided.append(None)  # pending sums stay open
                    else:
                        mesh_axes, key = self._layout_facts(digits)
                        decided.append(new_decision(tv, k, digits, source, prio, _ANNOTATION_TEXT, "", mesh_axes, key))
                mesh = tv.mesh
            elif tv in self.p.input_set:
                # Unannotated inputs arrive whole on every device.
                decided = [new_decision(tv, k, (), _UNANNOTATED_INPUT, 0, _ANNOTATION_TEXT, "", _NO_MESH_AXES, ())
                           for k in range(n)]
                mesh = None
            else:
                decided = [None] * n
                mesh = None
                frozen = False
            if frozen:
                self.frozen.add(tv)
            t = new_entry(tv, decided, mesh, home.get(tv), frozen, known)
            self.in_order.append(t)
            number = t.number
            if number >= len(by_number):  # (a fusion numbers its tensors from 0: seldom past the count)
                by_number.extend([None] * (number + 1 - len(by_number)))
            if by_number[number] is not None:
                raise NvShardError(f"{tv.short_name()} shares its number with {by_number[number].tv.short_name()}")
            by_number[number] = t

    @property
    def entries(self) -> dict:
        """{tv: its TensorEntry}, in the program's order (for tests and tools: made on each call)."""
        return {t.tv: t for t in self.in_order}

    def entry(self, tv) -> TensorEntry:
        """tv's TensorEntry, by its number (a list index: no hashing)."""
        number = tv.number  # (compiled, a C integer: the list is indexed directly)
        return self.by_number[number]

    # -- the main loop ----------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        finally:
            # The resolver points back at the engine: without it the engine's
            # proposals and classes are freed as soon as the pass drops it,
            # instead of waiting for (and costing) the cyclic collector.
            self.resolver = None

    def _run(self) -> None:
        levels = sorted({d.priority for tv in self.frozen for d in self.entry(tv).decided if d is not None}) or [0]
        for level in levels:
            self.level = level
            self.releasing = False
            self._refresh_entries(self._all_entries())
            while True:
                easy = self._easy()
                if easy:
                    self._apply_easy(easy)
                    continue
                target = self._next_conflict()
                if target is not None:
                    choices, reason = self.resolver.resolve(target.tv)
                    self._apply([(target, m) for m in choices], reason)
                    continue
                if not self.releasing:
                    self.releasing = True
                    self._refresh(self._held_back_exprs())
                    continue
                break
        self._finish()

    def _all_entries(self) -> list:
        """Every proposing expr's ExprEntry, in program order, made where
        missing (a class's internal exprs never propose)."""
        internal = self.classes.internal
        by_position = self.by_position
        exprs = self.p.exprs
        out = []
        for i in range(len(exprs)):  # (an index loop: compiled, the position is the index)
            r = by_position[i]
            if r is None:
                e = exprs[i]
                if not e.tv_outputs or e in internal:
                    continue
                r = by_position[i] = self.expr_entries[e] = self._expr_entry(e)
            out.append(r)
        return out

    def _held_back_exprs(self) -> list:
        """The exprs `releasing` held back when their proposals were last
        derived, in program order: no other expr's proposals change when
        it flips. Every expr that proposes has its proposals in
        self.expr_entries, in program order (the level's first refresh)."""
        held_back = self._held_back
        out = []
        if held_back:
            for e in self.expr_entries:
                if e in held_back:
                    out.append(e)
        return out

    def _reclassify(self) -> None:
        stale, self._stale = self._stale, []
        # In any order: a tensor's class reads only its own record, and the
        # conflict heap's keys end with the tensor's number (no ties).
        for t in stale:
            t.stale = False
            classified = self._classified(t)
            easy, competing = classified[0], classified[1]
            if not easy:  # (most stale tensors: no set of stages to make)
                if t.with_easy:  # (otherwise no stage's targets hold it: nothing to discard)
                    t.with_easy = False
                    for targets in self._easy_targets.values():
                        targets.discard(t)
            else:
                stages = {m.stage for m in easy}
                for stage, targets in self._easy_targets.items():
                    if stage not in stages:
                        targets.discard(t)
                for stage in stages:
                    self._easy_targets.setdefault(stage, set()).add(t)
                t.with_easy = True
            if competing:
                if not t.conflicted:
                    t.conflicted = True
                    self._push_conflict(t)
            else:
                t.conflicted = False

    def _easy(self) -> list:
        """The easy proposals of the earliest stage that has any, as
        [(TensorEntry, Choice)]."""
        self._reclassify()
        for stage in sorted(self._easy_targets):
            targets = self._easy_targets[stage]
            if targets:
                # sorted: every rank of a job must build the same plan
                out = []
                for t in sorted(targets, key=_NUMBER):  # (a loop: compiled, t typed)
                    for m in self._classified(t)[0]:
                        if m.stage == stage:
                            out.append((t, m))
                return out
        return []

    def _push_conflict(self, t: TensorEntry) -> None:
        # One flat entry (the order's four parts, a counter, the tensor's entry): the
        # heap compares entries without a nested tuple, in the same order.
        order = self._conflict_order(t)
        heapq.heappush(self._conflict_heap, (order[0], order[1], order[2], order[3], self._heap_counter, t))
        self._heap_counter += 1

    def _next_conflict(self):
        """The entry of the conflicted tensor to resolve first: lowest priority
        number, then the shallowest, then a structural key (independent of
        op order)."""
        self._reclassify()
        heap = self._conflict_heap
        while heap:
            top = heap[0]
            t = top[5]
            if not t.conflicted:
                heapq.heappop(heap)
                continue
            current = self._conflict_order(t)
            if current[0] != top[0] or current[1] != top[1] or current[2] != top[2] or current[3] != top[3]:
                heapq.heappop(heap)
                self._push_conflict(t)
                continue
            return t
        return None

    def _conflict_order(self, t: TensorEntry):
        competing = self._classified(t)[1]
        best = competing[0].priority
        for m in competing:  # (a loop: compiled, min() is a call through Python's protocol)
            if m.priority < best:
                best = m.priority
        order = t.order  # (the fusion fixes it: _graph_structure)
        return (best, order[0], order[1], t.number)

    # -- proposals ------------------------------------------------------------------------------
    def _closed(self, t: TensorEntry) -> bool:
        """No more decisions will reach this tensor's open axes. Kept once
        true (decisions are never undone, a mesh never changes once set)."""
        if t.closed:
            return True
        mesh = t.mesh
        if mesh is None:
            return False
        sizes = mesh.axis_sizes()
        used = self.used(t, False)
        if len(used) < len(sizes):
            return False  # (most tensors: fewer axes used than the mesh has, no subset to test)
        if sizes.keys() <= used:
            t.closed = True
            return True
        return False

    def used(self, t: TensorEntry, reduction: bool) -> frozenset:
        """Mesh axes the tensor's decided iteration (or reduction) axes use;
        kept until its decisions change (_record). A frozenset: the shared
        empty one when no axis is sharded, the decision's own when one is,
        so most tensors make no set of their own."""
        used = t.used_reduction if reduction else t.used_iteration
        if used is None:
            used = _NO_MESH_AXES
            flags, decided = t.reduction_flags, t.decided
            for k in range(len(decided)):
                d = decided[k]
                if d is not None and d.digits and flags[k] == reduction:
                    used = used | d.mesh_axes if used else d.mesh_axes
            if reduction:
                t.used_reduction = used
            else:
                t.used_iteration = used
        return used

    @property
    def proposals(self) -> dict:
        """{expr: its proposals as last derived}, in program order."""
        return {e: r.proposals for e, r in self.expr_entries.items()}

    def _expr_entry(self, expr) -> ExprEntry:
        """A new ExprEntry for expr, with what the plan fixes of it."""
        rule = self.p.rule(expr)
        slots, kinds, has_sum = _expr_structure(expr, rule)
        r = ExprEntry.__new__(ExprEntry)
        r.expr, r.rule, r.slots, r.kinds, r.has_sum = expr, rule, slots, kinds, has_sum
        slot_entries = r.slot_entries = [self.entry(s.tv) for s in slots]
        open_to = []
        for i in range(len(slots)):  # (an index loop: compiled, reads both lists typed)
            s = slots[i]
            t = slot_entries[i]
            if s.reduction or not t.frozen:  # (annotations are final)
                open_to.append(i)
        r.open_to = tuple(open_to)
        r.linked = self.classes.linked_positions.get(expr, ())
        r.proposals = r.per_target = None
        r.listed = 0
        return r

    def _expr_proposals(self, r: ExprEntry, by_factor: bool = False) -> list:
        """The proposals of r's expr, in target order. With `by_factor` (its tensors'
        changed_axes say what was decided since expr's last refresh), a
        target whose factors none of the changed axes carry keeps its
        previous proposals: they read only the layouts on its own factors.
        Pending sums read their operands' state as a whole and are always
        re-derived, as is everything when the contraction's waiting flips."""
        expr = r.expr
        self._held_back.discard(expr)  # (until this derivation says otherwise)
        rule, slots, kinds, has_sum = r.rule, r.slots, r.kinds, r.has_sum
        previous = r.per_target
        r.per_target = None
        open_to, slot_entries = r.open_to, r.slot_entries
        crossed = None  # factors the changed axes carry (None: re-derive every target)
        if by_factor and previous is not None:
            crossed = _NOTHING_CROSSED  # (read only: a set is made when a factor is crossed)
            for i in range(len(slots)):  # (an index loop: compiled, no tuple per slot)
                s = slots[i]
                t = slot_entries[i]
                if t.changed_axes & _axis_bit(s.axis):
                    if crossed is _NOTHING_CROSSED:
                        crossed = set()
                    for f in s.factors:  # (a loop: compiled, set.update is a method call)
                        crossed.add(f)
        # linked axes reach each other through their class (_spread), not here
        linked = r.linked
        targets = []
        for i in open_to:  # (a loop, not a comprehension: compiled, only a loop reads s's fields typed)
            s = slots[i]
            t = slot_entries[i]
            # (an iteration axis of a tensor whose mesh axes are all taken can take no layout)
            if t.decided[s.axis] is None and (s.reduction or not self._closed(t)):
                targets.append(i)
        if not targets:
            return []
        level = self.level
        opinions = None  # factor -> [Opinion], made with the first (most derivations find none)
        for i in range(len(slots)):  # (an index loop: compiled, no tuple per slot)
            s = slots[i]
            t = slot_entries[i]
            d = t.decided[s.axis]
            if d is None or not d.digits or d.priority > level:
                continue
            mesh = t.mesh
            if not s.compound:
                f = s.factors[0]
                o = new_opinion(d.digits, s.tv, d.priority, s.role, mesh, False, i in linked, d.mesh_axes, d.key)
                if opinions is None:
                    opinions = {f: [o]}
                    continue
                ops = opinions.get(f)
                if ops is None:
                    opinions[f] = [o]
                else:
                    ops.append(o)
                continue
            per = split_axis(d.digits, s.factors, rule, mesh.axis_sizes())
            if per is None:
                self.log.note(s.tv, f"{s.tv.short_name()} axis {s.axis}: {layout.describe(d.digits)} cannot cross "
                                    f"{expr.op.name} (a mesh axis would straddle two of its factors); not propagated")
                continue
            for f, digits in zip(s.factors, per):
                if digits:
                    if opinions is None:
                        opinions = {}
                    opinions.setdefault(f, []).append(
                        new_opinion(digits, s.tv, d.priority, s.role, mesh, True, False, None, None))
        if not opinions:
            return []
        # Through a contraction, an operand still open may yet bring a
        # competing sharding: what crosses the op waits for the contraction
        # stage, so the pass-through wave reaches that operand first.
        waiting = has_sum and not self.releasing and self._operand_open(slots, slot_entries)
        if waiting:
            self._held_back.add(expr)
        if previous is not None and previous[0] != waiting:
            crossed = None
        per_target = {}
        r.per_target = (waiting, per_target)
        proposals = []
        for i in targets:
            s = slots[i]
            is_pending = s.reduction and s.role is _RESULT
            if crossed is not None and not (is_pending and has_sum) and _none_in(s.factors, crossed):
                kept = previous[1].get(i)
                if kept:
                    per_target[i] = kept
                    proposals += kept
                continue
            start = len(proposals)
            self._target_proposals(i, s, expr, rule, kinds, opinions, linked, waiting, is_pending, slots, proposals)
            if len(proposals) > start:
                per_target[i] = proposals[start:]
        return proposals

    def _target_proposals(self, i, s, expr, rule, kinds, opinions, linked, waiting, is_pending, slots, proposals):
        """Appends the proposals for target slot i (AxisFactors s) of expr."""
        if not s.compound:
            f = s.factors[0]
            kind = kinds[f]
            if kind is _REPLICATED:
                ops = []
            elif i in linked:
                ops = [o for o in opinions.get(f, ()) if o.tv is not s.tv and not o.linked]
            else:
                ops = [o for o in opinions.get(f, ()) if o.tv is not s.tv]
            if is_pending and kind is _SUM:
                ops = self._pending_options(f, ops, slots)
                if ops is None:
                    self._held_back.add(expr)
                    return
            if not ops:
                return
            # one factor: one proposal per opinion
            stage = crossing_stage(kind, False)
            if waiting:
                stage = max(stage, _CONTRACTION)
            for c in ops:
                if c.key is None:  # (a part of a layout a reshape splits, or an operand's "replicated")
                    mesh_axes, key = self._layout_facts(c.digits)
                else:
                    mesh_axes, key = c.mesh_axes, c.key
                proposals.append(new_proposal(
                    s.tv, s.axis, c.digits, c.mesh, c.priority, _RESHAPE if c.compound else stage, expr,
                    s.names, c.tv, direction_between(c.role, s.role), s.reduction, mesh_axes, key))
            return
        self._compound_proposals(s, expr, kinds, opinions, is_pending, slots, proposals)

    def _compound_proposals(self, s, expr, kinds, opinions, is_pending, slots, proposals):
        """_target_proposals for an axis made of several factors (a reshape
        splits or merges it): one proposal per combination of opinions."""
        per_factor = []
        for f in s.factors:
            kind = kinds[f]
            ops = [] if kind is _REPLICATED else [o for o in opinions.get(f, ()) if o.tv is not s.tv]
            if is_pending and kind is _SUM:
                ops = self._pending_options(f, ops, slots)
                if ops is None:
                    self._held_back.add(expr)
                    per_factor = None
                    break
            per_factor.append(ops)
        if per_factor is None or not any(per_factor):
            return
        # a factor nobody has an opinion on stays whole in this proposal
        options = [o if o else [None] for o in per_factor]
        for combo in itertools.product(*options):
            real = [c for c in combo if c is not None]
            digits = layout.join_layouts([c.digits if c is not None else () for c in combo], s.extents)
            first = real[0]
            meshes = [c.mesh for c in real if c.mesh is not None]
            proposals.append(Proposal(
                s.tv, s.axis, digits, meshes[0] if meshes else None,
                max([c.priority for c in real]), _RESHAPE, expr, s.names, first.tv,
                direction_between(first.role, s.role), s.reduction,
            ))

    def _layout_facts(self, digits) -> tuple:
        """(mesh axes as a frozenset, layout.key) of a layout, remembered per
        layout object: the same decided layouts are proposed round after
        round (the entry keeps the object alive, so its id is not reused)."""
        known = self._layouts_seen.get(identity(digits))
        if known is None:
            known = self._layouts_seen[identity(digits)] = (
                digits, frozenset(layout.mesh_axes_of(digits)), layout.key(digits))
        return known[1], known[2]

    def _operand_open(self, slots, slot_entries) -> bool:
        """Whether an operand axis is still open and may yet be decided
        (slot_entries: each slot's TensorEntry)."""
        for i in range(len(slots)):  # (an index loop: compiled, no tuple per slot)
            s = slots[i]
            if s.role is _OPERAND:
                t = slot_entries[i]
                if t.decided[s.axis] is None and not self._closed(t):
                    return True
        return False

    def _pending_options(self, f, ops, slots):
        """Layouts for a pending sum over contraction factor f: only once every
        operand on f has decided (or cannot change), plus an explicit
        'replicated' when an operand cannot take the proposed mesh axes.
        None: an operand on f is still open (see Engine._held_back)."""
        options = list(ops)
        for s in slots:
            if s.role is not _OPERAND or f not in s.factors:
                continue
            t = self.entry(s.tv)
            d = t.decided[s.axis]
            if d is None and not self.releasing and not self._closed(t):
                return None
            if d is not None and d.digits:
                continue
            used = self.used(t, False)
            if not used:
                continue  # (no mesh axis taken: every opinion fits)
            for o in ops:
                if not used.isdisjoint(layout.mesh_axes_of(o.digits)):
                    prio = _decided_priority(t.decided, self.level)
                    options.append(Opinion((), t.tv, min(prio, self.level), _OPERAND, t.mesh, False, False))
                    break
        return options

    def _refresh(self, exprs, by_factor: bool = False) -> None:
        """Re-derives the proposals of these proposing exprs (by_factor: see
        _expr_proposals); each has its ExprEntry from the level's first
        refresh (_all_entries)."""
        expr_entries = self.expr_entries
        self._refresh_entries([expr_entries[e] for e in exprs], by_factor)

    def _refresh_entries(self, entries: list, by_factor: bool = False) -> None:
        """Re-derives the proposals of the exprs of these ExprEntry."""
        # The tensors whose proposals change, each listed once, in the order
        # met (about the program's order, and so the order of the records in
        # memory; invalidating is order-free)
        touched = []
        self._refreshes += 1
        stamp = self._refreshes
        for r in entries:
            e = r.expr
            old = r.proposals
            if old:
                for p in old:  # (per proposal, not per tensor: both steps repeat harmlessly)
                    t = self.entry(p.tv)
                    if t.refreshed != stamp:
                        t.refreshed = stamp
                        touched.append(t)
                    if t.by_expr is not None:
                        t.by_expr.pop(e, None)
            new = self._expr_proposals(r, by_factor)
            r.proposals = new
            for p in new:
                t = self.entry(p.tv)
                if t.refreshed != stamp:
                    t.refreshed = stamp
                    touched.append(t)
                per_expr = t.by_expr
                if per_expr is None:
                    per_expr = t.by_expr = {}
                props = per_expr.get(e)
                if props is None:
                    per_expr[e] = [p]
                else:
                    props.append(p)
        for t in touched:
            self._invalidate(t)
            if t.by_expr is not None and not t.by_expr:  # (by_expr holds one proposal at least, or is None)
                t.by_expr = None

    def _invalidate(self, t: TensorEntry) -> None:
        t.classified = None
        if not t.stale:
            t.stale = True
            self._stale.append(t)

    # -- classification ---------------------------------------------------------------------------
    def valid(self, t: TensorEntry) -> list:
        """The tensor's proposals that still fit it, merged into one Choice per
        layout (axis, layout key and mesh), in the order first proposed."""
        by_expr = t.by_expr
        if not by_expr:
            return []
        merged = []
        keys = []  # each merged choice's layout key (a tensor has a few choices: found by a scan, no tuple hashed)
        used_it, used_red = self.used(t, False), self.used(t, True)
        decided, own_mesh = t.decided, t.mesh or t.home
        for props in by_expr.values():
            for p in props:
                if decided[p.axis] is not None:
                    continue
                if own_mesh is not None and p.mesh is not None and p.mesh is not own_mesh and p.mesh != own_mesh:
                    continue
                used = used_red if p.reduction else used_it
                digits = p.digits
                if not used or used.isdisjoint(p.mesh_axes):  # (most tensors: no mesh axis used yet)
                    key = p.key
                else:
                    # keep the outer part that still fits (Shardy's longest compatible prefix)
                    digits = layout.keep_outer(digits, used, p.mesh.axis_sizes())
                    if not digits:
                        continue
                    key = layout.key(digits)
                m = None
                for j in range(len(merged)):
                    c = merged[j]
                    if c.axis == p.axis and (c.mesh is p.mesh or c.mesh == p.mesh) and keys[j] == key:
                        m = c
                        break
                if m is None:
                    m = new_choice(p.axis, digits, p.mesh, p.priority, p.stage, p.reduction,
                                   p.mesh_axes if digits is p.digits else None)
                    merged.append(m)
                    keys.append(key)
                elif p.priority < m.priority or p.stage < m.stage:
                    m.priority = min(m.priority, p.priority)
                    m.stage = min(m.stage, p.stage)
                m.sources.append(p)
        return merged

    def classify(self, tv):
        """(easy, competing): tv's choices that nothing competes with, and the rest."""
        classified = self._classified(self.entry(tv))
        return classified[0], classified[1]

    def current_choices(self, tv) -> list:
        """valid() as of now, kept with the classification (both change
        only when tv's proposals or decisions do); callers must not change it."""
        return self._classified(self.entry(tv))[2]

    def _classified(self, t: TensorEntry) -> tuple:
        """(easy, competing, valid) choices of the tensor, kept until its
        proposals or decisions change (_invalidate)."""
        classified = t.classified
        if classified is None:
            if t.by_expr is None:  # (most tensors, most of the time: nothing to make, nothing to free)
                classified = t.classified = _NOTHING_CLASSIFIED
                return classified
            valid = self.valid(t)
            easy, competing = [], []
            for m in valid:
                if _competes(m, valid):
                    competing.append(m)
                else:
                    easy.append(m)
            classified = t.classified = (easy, competing, valid)
        return classified

    # -- applying decisions ---------------------------------------------------------------------------
    def _apply(self, items: list, reason="") -> None:
        """Decides [(TensorEntry, Choice)], spreads them and refreshes."""
        spreading = []
        for t, m in items:
            if t.decided[m.axis] is not None:
                continue
            self._decide(t, m, reason)
            if m.digits and self.classes.ends_of(t.tv, m.axis, t.number):
                spreading.append((t, m.axis))
        if spreading:
            self._spread(spreading)
        self._after_change()

    def _decide(self, t: TensorEntry, m: Choice, reason) -> None:
        key = self._layout_facts(m.digits)[1]
        decision = new_decision(t.tv, m.axis, m.digits, propagated_by(m), m.priority, STAGE_TEXT[m.stage], reason,
                                m.mesh_axes, key)
        self._record(t, m.mesh, decision)

    def _record(self, t: TensorEntry, mesh, decision: Decision) -> None:
        """Apply and log a decision on one of t's axes (decision.axis)."""
        tv = t.tv
        axis = decision.axis
        if t.mesh is None and mesh is not None:
            t.mesh = mesh
        t.decided[axis] = decision
        if not t.changed_axes:
            self._changed.append(t)
        t.changed_axes |= _axis_bit(axis)
        if t.reduction_flags[axis]:
            t.used_reduction = None
        else:
            t.used_iteration = None
        self.log.record(decision)
        if t.classified is not None or t.by_expr is not None:
            self._invalidate(t)

    def _spread(self, frontier: list) -> None:
        """Carry decisions along their pass-through classes' links, a link
        layer at a time, as proposals would (same stage, sources and log),
        without recomputing any expr's proposals. An axis takes the layout
        when nothing competes with it there (its other proposals, the other
        layouts arriving in this layer, its tensor's other axes); otherwise
        the layout becomes an ordinary proposal for the axis and the wave
        stops there, for the conflict to be resolved like any other.
        `frontier`: [(TensorEntry, axis)] just decided. Every decision is
        recorded (_record), so _after_change finds the tensors it reached."""
        classes = self.classes
        while frontier:
            # TensorEntry -> its one arrival (axis, Decision, mesh, (source tv,), End), or a list of them
            arriving: dict = {}
            for origin, axis in frontier:
                tv = origin.tv
                d = origin.decided[axis]
                mesh = origin.mesh
                alone = origin.as_source
                if alone is None:
                    alone = origin.as_source = (tv,)
                for end in classes.ends_of(tv, axis, origin.number):
                    t = self.by_number[end.number]
                    if t.decided[end.axis] is not None:
                        continue
                    own = t.mesh or t.home
                    if own is not None and own is not mesh and own != mesh:  # (identity first: the common case)
                        continue
                    arrival = (end.axis, d, mesh, alone, end)
                    known = arriving.get(t)
                    if known is None:
                        arriving[t] = arrival  # (one arrival: the common case, no list or dict to make)
                    elif type(known) is tuple:
                        arriving[t] = [known, arrival]
                    else:
                        known.append(arrival)
            frontier = []
            # (one tensor, one axis: the common case, no sort to call)
            for t in (_in_number_order(list(arriving)) if len(arriving) > 1 else arriving):  # (nothing adds to it here)
                arrivals = arriving[t]
                if type(arrivals) is tuple:
                    axis, d, mesh, alone, end = arrivals
                    if t.by_expr is None:
                        used = self.used(t, False)
                        if not used or used.isdisjoint(d.mesh_axes):  # (_uncontested, for one arrival)
                            self._take(t, axis, d, mesh, propagated_through(end.direction, end.expr, end.names, alone),
                                       d.priority)
                            frontier.append((t, axis))
                            continue
                    per_axis = {axis: [(d, mesh, alone, end)]}
                else:
                    per_axis = {}
                    for axis, d, mesh, alone, end in arrivals:
                        offers = per_axis.get(axis)
                        if offers is None:
                            per_axis[axis] = [(d, mesh, alone, end)]
                        else:
                            offers.append((d, mesh, alone, end))
                if t.by_expr is not None or not self._uncontested(t, per_axis):
                    frontier += self._offer(t, per_axis)
                    continue
                for axis in (sorted(per_axis) if len(per_axis) > 1 else per_axis):  # (nothing adds to it here)
                    offers = per_axis[axis]
                    d, mesh, alone, end = offers[0]
                    if len(offers) == 1:  # (no list to build, no min to call)
                        source = propagated_through(end.direction, end.expr, end.names, alone)
                        priority = d.priority
                    else:
                        source = propagated_through(end.direction, end.expr, end.names, [o[2][0] for o in offers])
                        priority = _lowest_priority(offers)
                    self._take(t, axis, d, mesh, source, priority)
                    frontier.append((t, axis))

    def _take(self, t: TensorEntry, axis: int, d: Decision, mesh, source, priority) -> None:
        """t's axis takes the layout of the decision d that spread to it."""
        self._record(t, mesh, new_decision(t.tv, axis, d.digits, source, priority, _PASS_THROUGH_TEXT, "",
                                           d.mesh_axes, d.key))

    def _uncontested(self, t: TensorEntry, per_axis: dict) -> bool:
        """One layout arrives per axis, and the mesh axes they use are free
        on the tensor and distinct."""
        used = self.used(t, False)
        taken = []  # the mesh axes each arriving layout takes (disjoint so far: no union to make)
        for offers in per_axis.values():
            d, mesh = offers[0][0], offers[0][1]
            mesh_axes, key = d.mesh_axes, d.key
            for j in range(1, len(offers)):  # (an index loop: no slice to copy)
                o = offers[j]
                other = o[0]
                if (o[1] is not mesh and o[1] != mesh) or other.key != key:
                    return False
            if used and not used.isdisjoint(mesh_axes):  # (most targets have no axis decided yet)
                return False
            for j in range(len(taken)):
                if not mesh_axes.isdisjoint(taken[j]):
                    return False
            taken.append(mesh_axes)
        return True

    def _offer(self, t: TensorEntry, per_axis: dict) -> list:
        """The arriving layouts as proposals beside the tensor's others,
        classified as any proposals are: the easy choices they make up are
        decided, the rest stay proposals. Returns the axes decided, as
        [(TensorEntry, axis)]."""
        arriving = []
        for axis in sorted(per_axis):
            for d, mesh, alone, end in per_axis[axis]:
                arriving.append(new_proposal(t.tv, axis, d.digits, mesh, d.priority, _PASS_THROUGH, end.expr, end.names,
                                             alone[0], end.direction, False, d.mesh_axes, d.key))
        if t.by_expr is None:
            t.by_expr = {}
        t.by_expr.setdefault(_CLASS, []).extend(arriving)
        self._invalidate(t)
        easy = self._classified(t)[0]
        taken = [m for m in easy if _offered_in(m, arriving)]
        for m in taken:
            self._decide(t, m, "")
        return [(t, m.axis) for m in taken]

    def _apply_easy(self, items: list) -> None:
        """Easy choices apply as they are, except that a pending sum competes
        with summing nothing (the contraction's operands gathered instead)."""
        pending = [(t, m) for t, m in items if m.reduction and m.digits]
        self._apply([(t, m) for t, m in items if not (m.reduction and m.digits)])
        for t, m in pending:
            if t.decided[m.axis] is None:
                choices, reason = self.resolver.weigh_partial_sum(t.tv, m)
                self._apply([(t, c) for c in choices], reason)

    def _after_change(self) -> None:
        """Re-derives the proposals of the exprs adjacent to the tensors
        decided since the last call (_record lists each once), visited in
        number order (every rank of a job must build the same plan)."""
        decided, self._changed = self._changed, []
        listing = self._refreshes + 1  # (the refresh below)
        by_position = self.by_position
        entries = []
        # (no tensor to invalidate here: _record did, where a decided tensor
        # had a classification or proposals; one with neither classifies as
        # nothing whatever it decides)
        for t in _in_number_order(decided):
            at = t.adjacent_at
            for k in range(len(at)):  # (an index loop: compiled, positions as C integers)
                # (None: a class's internal expr, whose axes hear of each other through their class;
                # the level's first refresh made every other one's entry)
                r = by_position[at[k]]
                if r is not None and r.listed != listing:
                    r.listed = listing
                    entries.append(r)
        self._refresh_entries(entries, self._refresh_by_factor)
        for t in decided:
            t.changed_axes = 0

    # -- the end ------------------------------------------------------------------------------------
    def _finish(self) -> None:
        meshes = {}
        # one record for every axis nothing reached (decisions are never changed once made)
        unreached = new_decision(None, None, (), _UNREACHED, self.level, _ANNOTATION_TEXT, "", _NO_MESH_AXES, ())
        # Each tensor's decisions are read once, in one sweep (at 10k exprs a
        # second sweep over the records finds none of them in the caches).
        layouts_of = []  # per entry, in the entries' order
        in_order = self.in_order
        for i in range(len(in_order)):  # (an index loop: compiled, the records typed)
            t = in_order[i]
            decided = t.decided
            layouts = []
            for k in range(len(decided)):  # (an index loop: compiled, no tuple per axis)
                d = decided[k]
                if d is None:
                    decided[k] = unreached
                    layouts.append(())
                else:
                    layouts.append(d.digits)
            layouts_of.append(layouts)
            meshes[t.tv] = t.mesh
        self.p.fill_meshes(meshes, self.frozen, self.home)
        state = self.p.state
        i = 0
        for tv in meshes:  # (the keys alone, in the entries' order: the records are done with)
            mesh = meshes[tv]
            layouts = layouts_of[i]
            i += 1
            if mesh is None and any(layouts):
                raise NvShardError(f"{tv.short_name()} is sharded but has no mesh")
            state[tv] = new_state(mesh, layouts)


_CLASS = "pass-through class"  # TensorEntry.by_expr's key for proposals a class's spread left open


def _expr_structure(expr, rule) -> tuple:
    """(axis_factors, the kind of each factor, whether a factor is a
    contraction): fixed per expr, cached with its rule."""
    cached = rule.cache.get("engine_structure")
    if cached is None:
        kinds = [f.kind for f in rule.factors]
        cached = rule.cache["engine_structure"] = (axis_factors(expr, rule), kinds, FactorKind.SUM in kinds)
    return cached


def _axis_bit(axis: int) -> int:
    """Axis's bit in TensorEntry.changed_axes: every bit past the 62nd axis
    (a word's bits run out; then every axis counts as changed, and a refresh
    re-derives all it would have kept, the reference behaviour)."""
    one = 1  # (compiled, a word: a literal 1 shifted is a C int)
    return one << axis if axis < 62 else -1


def _in_number_order(entries: list) -> list:
    """entries (TensorEntry, numbers distinct) sorted by number, in place:
    the few a step decides by insertion (compiled, C comparisons of typed
    numbers), many by list.sort."""
    n = len(entries)
    if n > 16:
        entries.sort(key=_NUMBER)
        return entries
    for i in range(1, n):
        t = entries[i]
        j = i - 1
        while j >= 0:
            before = entries[j]
            if before.number < t.number:
                break
            entries[j + 1] = before
            j -= 1
        entries[j + 1] = t
    return entries


def _none_in(factors: tuple, crossed: set) -> bool:
    """crossed.isdisjoint(factors), by C set lookups (a factor or two)."""
    for f in factors:
        if f in crossed:
            return False
    return True


def _lowest_priority(offers: list):
    """The lowest priority among the decisions offered ((Decision, ...) each):
    a typed loop, min() is a call through Python's protocol."""
    best = offers[0][0].priority
    for j in range(1, len(offers)):  # (an index loop: no slice to copy)
        d = offers[j][0]
        if d.priority < best:
            best = d.priority
    return best


def _decided_priority(decided: list, default):
    """The largest priority among the decided axes (default: none decided)."""
    found = False
    prio = default
    for d in decided:  # (a loop: compiled, d is typed only in a loop)
        if d is not None and (not found or d.priority > prio):
            prio = d.priority
            found = True
    return prio


def _competes(m, choices) -> bool:
    """Whether another of the choices competes with m."""
    for o in choices:
        if o is not m and compete(m, o):
            return True
    return False


def _offered_in(m, proposals: list) -> bool:
    """Whether one of the proposals is among the choice's sources."""
    for p in m.sources:
        if p in proposals:
            return True
    return False


def _kept_with_fusion(program: Program, name: str, make, *args):
    """make(*args), kept with the program's fusion (Fusion.kept) while the
    program's exprs are still the fusion's, as they are when propagation
    starts; made afresh otherwise."""
    fusion = program.fusion
    if program.exprs == fusion.exprs:
        return fusion.kept(name, make, *args)
    return make(*args)


def _graph_structure(program: Program) -> tuple:
    """([(tensor, its reduction flags, its adjacent exprs, (its depth, its
    structural key), its adjacent exprs' positions in the program)] in the
    program's order, depth, structural key): the fusion's structure alone.
    A list, not dicts: the engine reads it once per plan, in order (_seed)."""
    depth, canon = _structure(program)
    adjacent = _adjacency(program)
    position = {e: i for i, e in enumerate(program.exprs)}
    # equal flag lists are one list (read only): big fusions keep one per tensor
    shared: dict = {}
    tensors = []
    for tv in program.state:
        flags = tuple([id_.is_reduction() for id_ in tv.logical])
        known = shared.get(flags)
        if known is None:
            known = shared[flags] = list(flags)
        exprs = adjacent[tv]
        tensors.append((tv, known, exprs, (depth.get(tv, 0), canon.get(tv, 0)), [position[e] for e in exprs]))
    return tensors, depth, canon


def _pass_through_classes(program: Program, frozen: set, home: dict) -> PassThroughClasses:
    """The program's pass-through classes. They follow from the fusion's
    structure, its annotations (which tensors are frozen, each one's stage
    mesh) and its rules (which concrete sizes may change): the last ones
    made are kept with the fusion (read only) and serve the next plan whose
    annotations and rules are the same. Only the rules of ops that read
    concrete sizes can differ between plans (an expr's other rule is made
    once): those are the ones compared."""
    sized = _kept_with_fusion(program, "exprs with sized rules", _exprs_with_sized_rules, program)
    rules = [program.rule(e) for e in sized]
    last = _kept_with_fusion(program, "pass-through classes", list)  # [(frozen, home, rules, classes)] once made
    if last:
        kept_frozen, kept_home, kept_rules, classes = last[0]
        if kept_frozen == frozen and (kept_home is home or kept_home == home) and _same_objects(kept_rules, rules):
            return classes
    classes = PassThroughClasses(program, frozen, home)
    last[:] = [(set(frozen), home, rules, classes)]  # (home is read only: _stage_meshes)
    return classes


def _exprs_with_sized_rules(program: Program) -> list:
    """The exprs whose rule depends on concrete sizes (Op.rule_needs_sizes)."""
    return [e for e in program.exprs if e.tv_outputs and e.op.rule_needs_sizes]


def _same_objects(a: list, b: list) -> bool:
    """Whether the lists hold the same objects, in order."""
    if len(a) != len(b):
        return False
    for i in range(len(a)):
        if a[i] is not b[i]:
            return False
    return True


def _adjacency(program: Program) -> dict:
    """Per tensor, the exprs with results that touch it: its producer, then
    its consumers in program order (once per read). One pass: a producer
    comes before its consumers in the program."""
    adjacent = {tv: [] for tv in program.state}
    for e in program.exprs:
        if e.tv_outputs:
            for o in e.tv_outputs:
                adjacent[o].append(e)
            for t in e.tv_inputs:
                adjacent[t].append(e)
    return adjacent


def _stage_meshes(program: Program) -> dict:
    """The mesh of each computed tensor's pipeline stage (_derive_stage_meshes),
    read only. They follow from the fusion's structure and its tensors'
    meshes alone: the last ones derived are kept with the fusion and serve
    the next plan whose tensors all still have the same mesh objects."""
    last = _kept_with_fusion(program, "stage meshes", list)  # [(tensors, their meshes, home)] once derived
    if last:
        tensors, meshes, home = last[0]
        if _meshes_unchanged(tensors, meshes):
            return home
    home = _derive_stage_meshes(program)
    tensors = list(program.state)
    last[:] = [(tensors, _meshes_of(tensors), home)]
    return home


def _meshes_of(tensors: list) -> list:
    """Each tensor's mesh object, in order (None: not placed)."""
    meshes = []
    for tv in tensors:  # (a loop: compiled, tv is typed only in a loop)
        meshes.append(tv.mesh)
    return meshes


def _meshes_unchanged(tensors: list, meshes: list) -> bool:
    """Whether each tensor still has the mesh object listed for it."""
    for i in range(len(tensors)):  # (an index loop: compiled, a field read per tensor)
        tv = tensors[i]
        if tv.mesh is not meshes[i]:
            return False
    return True


def _derive_stage_meshes(program: Program) -> dict:
    """The mesh of each computed tensor's pipeline stage: the one mesh the
    user placed its nearest placed producers on (none when they disagree or
    nothing upstream is placed). A tensor stays in its stage: a consumer
    placed on another mesh is a stage cut, so shardings do not pull the
    tensor over to it; the data crosses at the cut."""
    home = {}
    for e in program.exprs:
        only = _one_mesh(e.tv_inputs, home)
        if only is not None:
            for o in e.tv_outputs:
                if o.mesh is None:
                    home[o] = only
    return home


def _one_mesh(tensors: list, home: dict):
    """The one mesh the tensors are placed (or at home) on; None when they
    disagree or none is."""
    only = None
    for t in tensors:
        mesh = t.mesh if t.mesh is not None else home.get(t)
        if mesh is None or mesh is only:
            continue
        if only is not None and mesh != only:
            return None
        only = mesh
    return only


def _structure(program: Program):
    """Depth from the inputs and a structural key per tensor: orders conflicts
    independently of the order ops were defined in. The key is a 64-bit hash
    of the op names and positions upstream, mixed with integer arithmetic
    (no text is formatted; the same on every rank and every run)."""
    depth, canon = {}, {}
    for position, tv in enumerate(program.inputs):
        if isinstance(tv, TensorView):
            depth[tv] = 0
            canon[tv] = _mix(_INPUT, position)
    op_codes: dict = {}
    for e in program.exprs:
        op = e.op
        code = op_codes.get(op)
        if code is None:
            code = op_codes[op] = zlib.crc32(op.name.encode())
        h = code
        d = 0
        for t in e.tv_inputs:
            k = depth.get(t, 0)
            if k > d:
                d = k
            h = _mix(h, canon.get(t, _UNKNOWN))
        d += 1
        i = 0
        for o in e.tv_outputs:
            depth[o] = d
            canon[o] = _mix(h, i)
            i += 1
    return depth, canon


_MASK = 0xFFFFFFFFFFFFFFFF
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's
_INPUT, _UNKNOWN = 0x696E707574, 0x3F  # (any fixed values)


def _mix(h, x):
    """splitmix64's finalizer over h ^ x: every bit of both moves every bit
    of the result (mod 2**64, so compiled and interpreted agree)."""
    z = ((h ^ x) + _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK
    return z ^ (z >> 31)
