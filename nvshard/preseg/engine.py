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
    fixed point.
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

import enum
import functools
import hashlib
import heapq
import itertools
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from ..ir.nodes import NvShardError, TensorView
from ..multidevice import layout
from ..ops.registry import FactorKind
from .cost import Cost, CostModel
from .log import DecisionLog
from .program import Program, TvState


@dataclass
class Decision:
    digits: tuple
    priority: int
    stage: int  # 0 for user annotations
    source: str


class _Entry(NamedTuple):
    tv: TensorView
    k: int  # logical axis
    factors: tuple
    role: str  # "operand" or "result"
    extents: list  # of the factors
    reduction: bool
    names: str  # factor names, for the log


@dataclass
class Proposal:
    tv: TensorView
    axis: int
    digits: tuple
    mesh: object
    priority: int
    stage: int
    expr: object
    factor: str
    source: Optional[TensorView]
    direction: str

    def key(self) -> tuple:
        return (self.axis, layout.key(self.digits), self.mesh)


@dataclass
class Merged:
    """Identical proposals from several sources, as one candidate."""

    axis: int
    digits: tuple
    mesh: object
    priority: int
    stage: int
    sources: list = field(default_factory=list)

    def mesh_axes(self) -> set:
        return set(layout.mesh_axes_of(self.digits))


class Engine:
    def __init__(self, program: Program, cost: CostModel, log: DecisionLog):
        self.p = program
        self.cost = cost
        self.log = log
        self.decided: dict[TensorView, list] = {}
        self.mesh: dict[TensorView, object] = {}
        self.frozen: set = set()
        self.level = 0
        self.releasing = False
        self.proposals: dict = {}  # expr -> [Proposal]
        self.by_target: dict = {}  # tv -> {expr: [Proposal]}
        self._classes: dict = {}  # tv -> (easy [Merged], conflicting [Merged])
        # Targets whose class must be recomputed, and indexes over the classes,
        # so each round touches only what changed (linear in program size).
        self._stale: set = set()
        self._easy_targets: dict = {}  # stage -> targets with easy proposals of that stage
        self._conflicted: set = set()
        self._conflict_heap: list = []
        self._heap_counter = 0
        self._adjacent = {tv: self._exprs_of(tv) for tv in program.state}
        self._used_cache: dict = {}
        self.depth, self.canon = _structure(program)
        self._seed()

    # -- setup ------------------------------------------------------------------------
    def _exprs_of(self, tv):
        exprs = list(self.p.consumers.get(tv, []))
        if tv in self.p.producer:
            exprs.insert(0, self.p.producer[tv])
        return [e for e in exprs if e.tv_outputs]

    def _seed(self) -> None:
        for tv, state in self.p.state.items():
            n = len(tv.logical)
            if tv.mesh is not None:
                prio = tv.sharding_priority or 0
                decided = []
                for k, id_ in enumerate(tv.logical):
                    digits = state.layouts[k]
                    if id_.is_reduction() and not digits:
                        decided.append(None)  # pending sums stay open
                    else:
                        decided.append(Decision(digits, prio, 0, f"annotation of {tv.short_name()}"))
                self.decided[tv] = decided
                self.mesh[tv] = tv.mesh
                self.frozen.add(tv)
            elif tv in self.p.input_set:
                # Unannotated inputs arrive whole on every device.
                self.decided[tv] = [Decision((), 0, 0, "unannotated input") for _ in range(n)]
                self.mesh[tv] = None
                self.frozen.add(tv)
            else:
                self.decided[tv] = [None] * n
                self.mesh[tv] = None

    # -- the main loop ----------------------------------------------------------------------
    def run(self) -> None:
        levels = sorted({d.priority for tv in self.frozen for d in self.decided[tv] if d is not None}) or [0]
        for level in levels:
            self.level = level
            self.releasing = False
            self._refresh(self._all_exprs())
            while True:
                easy = self._easy()
                if easy:
                    self._apply(easy)
                    continue
                target = self._next_conflict()
                if target is not None:
                    self._resolve(target)
                    continue
                if not self.releasing:
                    self.releasing = True
                    self._refresh(self._all_exprs())
                    continue
                break
        self._finish()

    def _all_exprs(self):
        return [e for e in self.p.exprs if e.tv_outputs]

    def _reclassify(self) -> None:
        stale, self._stale = self._stale, set()
        for tv in sorted(stale, key=_number):
            easy, conflicting = self._classify(tv)
            stages = {m.stage for m in easy}
            for stage, targets in self._easy_targets.items():
                if stage not in stages:
                    targets.discard(tv)
            for stage in stages:
                self._easy_targets.setdefault(stage, set()).add(tv)
            if conflicting:
                if tv not in self._conflicted:
                    self._conflicted.add(tv)
                    self._push_conflict(tv)
            else:
                self._conflicted.discard(tv)

    def _easy(self) -> list:
        """The easy proposals of the earliest stage that has any."""
        self._reclassify()
        for stage in sorted(self._easy_targets):
            targets = self._easy_targets[stage]
            if targets:
                # sorted: every rank of a job must build the same plan
                return [(tv, m) for tv in sorted(targets, key=_number)
                        for m in self._classify(tv)[0] if m.stage == stage]
        return []

    def _push_conflict(self, tv) -> None:
        heapq.heappush(self._conflict_heap, (self._conflict_order(tv), self._heap_counter, tv))
        self._heap_counter += 1

    def _next_conflict(self):
        """The conflicted tensor to resolve first: lowest priority number, then
        the shallowest, then a structural key (independent of op order)."""
        self._reclassify()
        while self._conflict_heap:
            key, _, tv = self._conflict_heap[0]
            if tv not in self._conflicted:
                heapq.heappop(self._conflict_heap)
                continue
            current = self._conflict_order(tv)
            if current != key:
                heapq.heappop(self._conflict_heap)
                self._push_conflict(tv)
                continue
            return tv
        return None

    # -- proposals ------------------------------------------------------------------------------
    def _closed(self, tv) -> bool:
        """No more decisions will reach this tensor's open axes."""
        if tv in self.frozen:
            return True
        mesh = self.mesh[tv]
        if mesh is None:
            return False
        used = self._used(tv, reduction=False)
        return set(mesh.axis_names) <= used

    def _used(self, tv, reduction: bool) -> set:
        """Mesh axes tv's decided iteration (or reduction) axes use; cached
        until tv's decisions change."""
        key = (tv, reduction)
        used = self._used_cache.get(key)
        if used is None:
            used = set()
            for id_, d in zip(tv.logical, self.decided[tv]):
                if d is not None and d.digits and id_.is_reduction() == reduction:
                    used.update(layout.mesh_axes_of(d.digits))
            self._used_cache[key] = used
        return used

    def _entries(self, expr) -> list:
        """Every tensor axis of expr that maps to factors (fixed structure,
        cached with the rule, so later plans of the fusion reuse it)."""
        rule = self.p.rule(expr)
        entries = rule.cache.get("engine_entries")
        if entries is None:
            entries = rule.cache["engine_entries"] = self._build_entries(expr)
        return entries

    def _build_entries(self, expr) -> list:
        rule = self.p.rule(expr)
        entries = []
        axes = [(tv, zip(tv.non_reduction_axes(), rule.operands[i]), "operand") for i, tv in enumerate(expr.tv_inputs)]
        axes += [(tv, enumerate(rule.results[i]), "result") for i, tv in enumerate(expr.tv_outputs)]
        for tv, pairs, role in axes:
            for k, factors in pairs:
                if factors:
                    entries.append(_Entry(tv, k, factors, role, [rule.factors[f].extent for f in factors],
                                          tv.logical[k].is_reduction(),
                                          " ".join(rule.factors[f].name for f in factors)))
        return entries

    def _expr_proposals(self, expr) -> list:
        decided = self.decided
        entries = self._entries(expr)
        targets = [e for e in entries
                   if decided[e.tv][e.k] is None and not (e.tv in self.frozen and not e.reduction)]
        if not targets:
            return []
        rule = self.p.rule(expr)
        opinions: dict = {}  # factor -> [(digits, tv, priority, role, mesh, compound)]
        for e in entries:
            d = decided[e.tv][e.k]
            if d is None or not d.digits or d.priority > self.level:
                continue
            mesh = self.mesh[e.tv]
            per = [d.digits] if len(e.factors) == 1 else layout.split_layout(d.digits, e.extents, mesh.axis_sizes())
            if per is None:
                self.log.note(e.tv, f"{e.tv.short_name()} axis {e.k}: {layout.describe(d.digits)} cannot cross "
                                    f"{expr.op.name} (a mesh axis would straddle two of its factors); not propagated")
                continue
            compound = len(e.factors) > 1
            for f, digits in zip(e.factors, per):
                if digits:
                    opinions.setdefault(f, []).append((digits, e.tv, d.priority, e.role, mesh, compound))
        if not opinions:
            return []
        proposals = []
        for e in targets:
            is_pending = e.reduction and e.role == "result"
            per_factor = []
            for f in e.factors:
                kind = rule.factors[f].kind
                ops = [] if kind is FactorKind.REPLICATED else [o for o in opinions.get(f, ()) if o[1] is not e.tv]
                if is_pending and kind is FactorKind.SUM:
                    ops = self._pending_options(expr, f, ops, entries)
                    if ops is None:
                        per_factor = None
                        break
                per_factor.append(ops)
            if per_factor is None or not any(per_factor):
                continue
            # a factor nobody has an opinion on stays whole in this proposal
            options = [o if o else [None] for o in per_factor]
            for combo in itertools.product(*options):
                real = [c for c in combo if c is not None]
                if len(combo) == 1:
                    digits = real[0][0]
                else:
                    digits = layout.join_layouts([c[0] if c is not None else () for c in combo], e.extents)
                first = real[0]
                stage = max(_crossing_stage(rule.factors[f].kind, len(e.factors) > 1 or (c is not None and c[5]))
                            for f, c in zip(e.factors, combo))
                proposals.append(Proposal(
                    e.tv, e.k, digits, next((c[4] for c in real if c[4] is not None), None),
                    max(c[2] for c in real), stage, expr, e.names, first[1], _direction(first[3], e.role),
                ))
        return proposals

    def _pending_options(self, expr, f, ops, entries):
        """Layouts for a pending sum over contraction factor f: only once every
        operand on f has decided (or cannot change), plus an explicit
        'replicated' when an operand cannot take the proposed mesh axes."""
        options = list(ops)
        for tv, k, factors, role, *_ in entries:
            if role != "operand" or f not in factors:
                continue
            d = self.decided[tv][k]
            if d is None and not self._closed(tv) and not self.releasing:
                return None
            if d is not None and d.digits:
                continue
            used = self._used(tv, reduction=False)
            for digits, *_ in ops:
                if used & set(layout.mesh_axes_of(digits)):
                    prio = max((x.priority for x in self.decided[tv] if x is not None), default=self.level)
                    options.append(((), tv, min(prio, self.level), "operand", self.mesh[tv], False))
                    break
        return options

    def _refresh(self, exprs) -> None:
        touched = set()
        for e in exprs:
            for p in self.proposals.get(e, []):
                touched.add(p.tv)
                self.by_target.get(p.tv, {}).pop(e, None)
            new = self._expr_proposals(e)
            self.proposals[e] = new
            for p in new:
                touched.add(p.tv)
                self.by_target.setdefault(p.tv, {}).setdefault(e, []).append(p)
        for tv in touched:
            self._invalidate(tv)
            if tv in self.by_target and not any(self.by_target[tv].values()):
                del self.by_target[tv]

    def _invalidate(self, tv) -> None:
        self._classes.pop(tv, None)
        self._stale.add(tv)

    # -- classification ---------------------------------------------------------------------------
    def _valid(self, tv) -> list:
        merged: dict = {}
        used_it, used_red = self._used(tv, False), self._used(tv, True)
        for props in self.by_target.get(tv, {}).values():
            for p in props:
                if self.decided[tv][p.axis] is not None:
                    continue
                if self.mesh[tv] is not None and p.mesh is not None and p.mesh != self.mesh[tv]:
                    continue
                used = used_red if tv.logical[p.axis].is_reduction() else used_it
                digits = p.digits
                if used & set(layout.mesh_axes_of(digits)):
                    # keep the outer part that still fits (Shardy's longest compatible prefix)
                    digits = layout.keep_outer(digits, used, p.mesh.axis_sizes())
                    if not digits:
                        continue
                key = (p.axis, layout.key(digits), p.mesh)
                m = merged.get(key)
                if m is None:
                    m = merged[key] = Merged(p.axis, digits, p.mesh, p.priority, p.stage)
                m.priority = min(m.priority, p.priority)
                m.stage = min(m.stage, p.stage)
                m.sources.append(p)
        return list(merged.values())

    def _conflict(self, tv, a: Merged, b: Merged) -> bool:
        if a.mesh is not None and b.mesh is not None and a.mesh != b.mesh:
            return True
        if a.axis == b.axis:
            return True  # different layouts for one axis (identical ones were merged)
        if tv.logical[a.axis].is_reduction() != tv.logical[b.axis].is_reduction():
            return False  # a mesh axis may be pending and scatter onto an axis
        return bool(a.mesh_axes() & b.mesh_axes())

    def _classify(self, tv):
        cached = self._classes.get(tv)
        if cached is not None:
            return cached
        valid = self._valid(tv)
        easy, conflicting = [], []
        for m in valid:
            if any(self._conflict(tv, m, o) for o in valid if o is not m):
                conflicting.append(m)
            else:
                easy.append(m)
        self._classes[tv] = (easy, conflicting)
        return easy, conflicting

    # -- applying decisions ---------------------------------------------------------------------------
    def _apply(self, items: list, reason: str = "") -> None:
        changed = set()
        for tv, m in items:
            if self.decided[tv][m.axis] is not None:
                continue
            if self.mesh[tv] is None and m.mesh is not None:
                self.mesh[tv] = m.mesh
            src = m.sources[0] if m.sources else None
            text = functools.partial(_source_text, m, src)  # formatted when the log is read
            self.decided[tv][m.axis] = Decision(m.digits, m.priority, m.stage, text)
            self._used_cache.pop((tv, tv.logical[m.axis].is_reduction()), None)
            self.log.decide(tv, m.axis, m.digits, text, m.priority, _stage_name(m.stage), reason)
            changed.add(tv)
        self._after_change(changed)

    def _after_change(self, changed) -> None:
        exprs: dict = {}
        for tv in sorted(changed, key=_number):
            self._invalidate(tv)
            for e in self._adjacent.get(tv, []):
                exprs[e] = None
        self._refresh(list(exprs))

    # -- conflicts ----------------------------------------------------------------------------------
    def _conflict_order(self, tv):
        _, conflicting = self._classify(tv)
        return (min(m.priority for m in conflicting), self.depth.get(tv, 0), self.canon.get(tv, ""), tv.number)

    def _candidates(self, tv) -> list:
        easy, conflicting = self._classify(tv)
        pool = easy + conflicting
        # A layout over several mesh axes may lose its inner ones to a competitor
        # and keep its outer ones: offer those prefixes too.
        for m in list(conflicting):
            axes = layout.mesh_axes_of(m.digits)
            for j in range(1, len(axes)):
                digits = layout.keep_outer(m.digits, set(axes[j:]), m.mesh.axis_sizes())
                if not any(o.axis == m.axis and layout.same(o.digits, digits) for o in pool):
                    pool.append(Merged(m.axis, digits, m.mesh, m.priority, m.stage, list(m.sources)))
        by_axis: dict = {}
        for m in pool:
            by_axis.setdefault(m.axis, []).append(m)
        axes = sorted(by_axis)
        candidates = []
        for combo in itertools.product(*[by_axis[a] + [None] for a in axes]):
            chosen = [m for m in combo if m is not None]
            if not chosen:
                continue
            if any(self._conflict(tv, a, b) for a, b in itertools.combinations(chosen, 2)):
                continue
            candidates.append(chosen)
        # keep maximal candidates only: adding a compatible proposal is free
        maximal = []
        for c in candidates:
            ids = {id(m) for m in c}
            if not any(ids < {id(m) for m in d} for d in candidates):
                maximal.append(c)
        return maximal, pool

    def _resolve(self, tv) -> None:
        candidates, pool = self._candidates(tv)
        scored = []
        for c in candidates:
            rejected = [m for m in pool if m not in c]
            reject_prio = min((m.priority for m in rejected), default=float("inf"))
            cost = self._candidate_cost(tv, c)
            # ties: keep a tensor like its producer (data flows forward), then outer axes first
            forward = sum(1 for m in c if any(p.direction == "forward" for p in m.sources))
            signature = tuple(sorted((m.axis, layout.key(m.digits), str(m.mesh)) for m in c))
            scored.append(((-reject_prio, cost.key(), -forward, signature), c, cost, reject_prio))
        scored.sort(key=lambda s: s[0])
        best = scored[0]
        reason = _why(best, scored[1] if len(scored) > 1 else None, self.cost.symbolic)
        self.log.conflict(tv, [(c, cost) for _, c, cost, _ in scored], best[1], reason)
        self._apply([(tv, m) for m in best[1]], reason)

    def _candidate_cost(self, tv, chosen: list) -> Cost:
        mesh = self.mesh[tv] or next((m.mesh for m in chosen if m.mesh is not None), None)
        override = {m.axis: m.digits for m in chosen}
        total = Cost(symbolic=self.cost.symbolic)
        for e in self._adjacent.get(tv, []):
            states, options = {}, {}
            for t in e.tv_inputs + e.tv_outputs:
                layouts = [d.digits if d is not None else None for d in self.decided[t]]
                t_mesh = self.mesh[t]
                if t is tv:
                    for a, digits in override.items():
                        layouts[a] = digits
                    t_mesh = mesh
                states[t] = TvState(t_mesh if t_mesh is not None else mesh, layouts)
            for o in e.tv_outputs:
                for k in range(len(o.logical)):
                    if states[o].layouts[k] is None:
                        options[(o, k)] = self._options(o, k, e, tv, chosen, states)
            total = total + self.cost.expr_cost(e, states, options)
        return total

    def _options(self, out, k, expr, tv, chosen, states) -> list:
        """Layouts an open result axis may end with: what the candidate implies
        through the expr (propagation would carry it), its own proposals that fit
        the candidate, or replicated."""
        opts = []
        if out is not tv:
            implied = self._implied(expr, out, k, tv, states)
            if implied is not None:
                opts.append(implied)
        for m in self._valid(out):
            if m.axis == k and not (out is tv and any(self._conflict(out, m, c) for c in chosen)):
                opts.append(m.digits)
        opts.append(())
        unique = []
        for o in opts:
            if not any(layout.same(o, u) for u in unique):
                unique.append(o)
        return unique

    def _implied(self, expr, out, k, tv, states):
        """The layout `tv`'s known axes give result axis k of `expr`."""
        rule = self.p.rule(expr)
        mesh = states[tv].mesh
        if mesh is None:
            return None
        if tv in expr.tv_inputs:
            axes = zip(tv.non_reduction_axes(), rule.operands[expr.tv_inputs.index(tv)])
        elif tv in expr.tv_outputs:
            axes = enumerate(rule.results[expr.tv_outputs.index(tv)])
        else:
            return None
        per_factor = {}
        for a, fs in axes:
            digits = states[tv].layouts[a]
            if not fs or not digits:
                continue
            per = layout.split_layout(digits, [rule.factors[f].extent for f in fs], mesh.axis_sizes())
            for f, d in zip(fs, per or []):
                if d and rule.factors[f].kind is not FactorKind.REPLICATED:
                    per_factor[f] = d
        factors = rule.results[expr.tv_outputs.index(out)][k]
        if not any(f in per_factor for f in factors):
            return None
        if out.logical[k].is_reduction() and any(rule.factors[f].kind is not FactorKind.SUM for f in factors):
            return None
        return layout.join_layouts([per_factor.get(f, ()) for f in factors], [rule.factors[f].extent for f in factors])

    # -- the end ------------------------------------------------------------------------------------
    def _finish(self) -> None:
        for tv in self.p.state:
            for k, d in enumerate(self.decided[tv]):
                if d is None:
                    self.decided[tv][k] = Decision((), self.level, 0, "nothing proposed: replicated")
        self.p.fill_meshes(self.mesh, self.frozen)
        for tv in self.p.state:
            mesh = self.mesh[tv]
            layouts = [d.digits for d in self.decided[tv]]
            if mesh is None and any(layouts):
                raise NvShardError(f"{tv.short_name()} is sharded but has no mesh")
            self.p.state[tv] = TvState(mesh, layouts)


def _number(tv) -> int:
    return tv.number


def _direction(src_role: str, dst_role: str) -> str:
    if src_role == "operand" and dst_role == "result":
        return "forward"
    if src_role == "result" and dst_role == "operand":
        return "backward"
    return "sideways"


class Stage(enum.IntEnum):
    """Easy proposals apply a stage at a time, by the factor they cross."""

    PASS_THROUGH = 1
    CONTRACTION = 2
    RESHAPE = 3


def _crossing_stage(kind: FactorKind, compound: bool) -> int:
    """Which stage a proposal belongs to, by the kind of factor it crosses:
    pass-through factors first, then contractions (pending sums), then
    factors a reshape splits or merges."""
    if compound:
        return int(Stage.RESHAPE)
    if kind is FactorKind.SUM:
        return int(Stage.CONTRACTION)
    return int(Stage.PASS_THROUGH)


def _stage_name(stage: int) -> str:
    return "annotation" if stage == 0 else Stage(stage).name.lower().replace("_", "-")


def _source_text(m: Merged, p: Optional[Proposal]) -> str:
    if p is None:
        return "conflict resolution"
    via = f"{p.direction} through {p.expr.op.name} (factor {p.factor})"
    names = sorted({s.source.short_name() for s in m.sources if s.source is not None},
                   key=lambda n: int(n[1:]))
    if names:
        via += " from " + ", ".join(names)
    return via


def _why(best, runner_up, symbolic: bool) -> str:
    if runner_up is None:
        return "only consistent choice"
    (bp, bc, bf, _), (rp, rc, rf, _) = best[0], runner_up[0]
    if bp != rp:
        return f"priority: the alternative drops a priority-{best[3] if best[3] != float('inf') else runner_up[3]} sharding"
    if bc != rc:
        if symbolic and bc[0] != rc[0]:
            return "heuristic: weights stay stationary (symbolic sizes)"
        return f"fewer bytes ({best[2].describe()} vs {runner_up[2].describe()})"
    if bf != rf:
        return f"tie on bytes ({best[2].describe()}): keep the producer's sharding"
    return "tie: outer axes first"


def _structure(program: Program):
    """Depth from the inputs and a structural key per tensor: orders conflicts
    independently of the order ops were defined in."""
    depth, canon = {}, {}
    for position, tv in enumerate(program.inputs):
        if isinstance(tv, TensorView):
            depth[tv] = 0
            canon[tv] = f"in{position}"
    for e in program.exprs:
        ins = [t for t in e.tv_inputs]
        d = 1 + max((depth.get(t, 0) for t in ins), default=0)
        base = e.op.name + "(" + ",".join(canon.get(t, "?") for t in ins) + ")"
        for i, o in enumerate(e.tv_outputs):
            depth[o] = d
            canon[o] = hashlib.sha1(f"{base}#{i}".encode()).hexdigest()[:16]
    return depth, canon
