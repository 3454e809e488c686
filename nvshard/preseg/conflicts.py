"""Conflict resolution: which of a tensor's competing choices to apply.

A candidate is a maximal set of the tensor's choices that do not compete
(with the longest compatible prefix of multi-axis layouts offered too, as
Shardy does). Candidates are scored by, in order:

  1. the priority of what they drop (dropping a higher-priority sharding loses);
  2. the bytes the adjacent exprs would move (concrete sizes), or the
     weights-stationary heuristic (symbolic sizes; see cost.py): open
     neighbours may follow the candidate (propagation would carry it) or
     keep their own proposals;
  3. keep the producer's sharding (data flows forward);
  4. outer axes first (a deterministic last resort).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

try:
    import cython
except ImportError:  # Python without Cython: the class directives do nothing (native.PythonDirectives)
    from ..native import PythonDirectives as cython

from ..multidevice import layout
from ..ops.registry import FactorKind
from .cost import Cost
from .program import new_state
from .projection import join_axis, plan_compute, project, question_head_number, rule_text, tensor_axes
from .proposals import Choice, Direction, compete
from .reshard import LastNumbered, numbered

_FORWARD = Direction.FORWARD  # (an Enum class's attribute read is slow on Python 3.11)
_NOTHING_DROPPED = float("inf")  # a candidate's dropped priority when it leaves nothing out
_OPEN = -2  # an open axis in a question (-1: replicated; layouts are numbered from 0)
# what a question's choice lists are (_question): the candidates, or the choices they are made of
_LISTED, _POOL = 0, 1


@cython.no_gc
@cython.cclass
@dataclass
class Scored:
    """A conflict candidate and what decides its rank."""

    __slots__ = ("choices", "cost", "dropped_priority", "forward", "signature")

    choices: list  # [Choice]
    cost: Cost
    dropped_priority: float  # the best priority among the choices it leaves out (inf: none)
    forward: int  # choices that keep a producer's sharding
    signature: tuple  # outer axes first

    def key(self) -> tuple:
        return (-self.dropped_priority, self.cost.key(), -self.forward, self.signature)


def new_scored(choices: list, cost: Cost, dropped_priority, forward: int, signature: tuple) -> Scored:
    """Scored(...), its fields filled directly (see proposals.new_decision)."""
    s = Scored.__new__(Scored)
    s.choices, s.cost, s.dropped_priority, s.forward, s.signature = choices, cost, dropped_priority, forward, signature
    return s


class ConflictResolver:
    """Resolves one conflicted tensor at a time against the engine's current
    state (decisions, meshes and choices)."""

    __slots__ = ("engine", "cost", "_answers", "_neighbourhoods", "_places", "_numbers", "_meshes")

    def __init__(self, engine, places: dict):
        """places: where to keep what the fusion fixes of each tensor's
        neighbourhood (_placed: its tensors' places, the heads of the rules
        that never change, its tensors' shapes, its operands' other
        readers): the engine keeps it with the fusion."""
        self.engine = engine
        self.cost = engine.cost
        # question (_question) -> (candidates' costs unnamed, their rankings
        # (resolve), the candidates as places in the pool (kind _POOL))
        self._answers: dict = {}
        self._neighbourhoods: dict = {}  # tv -> its neighbourhood as this plan's questions name it (_neighbourhood)
        self._places: dict = places
        # questions name meshes, rule texts with places, and state keys by
        # numbers (in one table: the kinds of value never compare equal)
        self._numbers: dict = {}
        self._meshes = LastNumbered(self._numbers)

    def resolve(self, tv) -> tuple:
        """(the winning choices, why), logged with every candidate's cost."""
        candidates, pool, costs, rankings = self._priced_candidates(tv)
        # What ranks the candidates besides their costs and facts (both fixed
        # by the question): the best priority each leaves out, and how many of
        # its choices keep a producer's sharding. Stacked layers rank alike.
        standing = []
        for i in range(len(candidates)):  # (an index loop: compiled, no tuple per candidate)
            choices = candidates[i]
            # (a loop: min() with a default is a call with a keyword)
            dropped = _NOTHING_DROPPED
            for m in pool:
                if m.priority < dropped and m not in choices:
                    dropped = m.priority
            forward = 0
            for m in choices:
                if _forward(m):
                    forward += 1
            standing.append((dropped, forward))
        standing_key = tuple(standing)
        ranking = rankings.get(standing_key)
        if ranking is None:
            ranking = rankings[standing_key] = self._rank(candidates, costs, standing)
        order, template, quoted = ranking
        if quoted == 0:
            reason = template
        elif quoted == 1:
            reason = ByCost(template, costs[order[0]])
        else:
            reason = ByCost(template, costs[order[0]], costs[order[1]])
        ranked = []
        for i in order:
            ranked.append((candidates[i], costs[i]))
        best = candidates[order[0]]
        self.engine.log.conflict(tv, ranked, best, reason)
        return best, reason

    def _rank(self, candidates: list, costs: list, standing: list) -> tuple:
        """(the candidates' indices, best first; why: a text, or a template
        quoting the costs of the first `quoted` of them)."""
        scored = []
        for i in range(len(candidates)):
            choices = candidates[i]
            facts = [(m.axis, layout.key(m.digits), str(m.mesh)) for m in choices]
            dropped, forward = standing[i]
            scored.append(new_scored(choices, costs[i], dropped, forward, tuple(sorted(facts))))
        # each key made once (the index keeps equal keys in candidate order, as a stable sort would)
        ranked = []
        for i in range(len(scored)):  # (a loop: compiled, a comprehension's variable is untyped)
            candidate = scored[i]
            ranked.append((candidate.key(), i))
        ranked.sort()
        order = tuple([i for _, i in ranked])
        if len(scored) == 1:
            return order, "only consistent choice", 0
        template, quoted = _why(scored[order[0]], ranked[0][0], scored[order[1]], ranked[1][0], self.cost.symbolic)
        return order, template, quoted

    def weigh_partial_sum(self, tv, pending: Choice) -> tuple:
        """([choices], why) for a pending sum nothing competes with. It stays
        (the partial results are allreduced), unless summing nothing
        (gathering the contraction's operands instead) moves fewer bytes.
        An unannotated fusion output is never reduce-scattered onto an axis
        nothing shards: as in nvFuser, it comes back whole (the user who
        wants the shard annotates the output, and gets the reduce-scatter)."""
        whole = Choice(pending.axis, (), pending.mesh, pending.priority, pending.stage, True, list(pending.sources))
        options = [[pending], [whole]]
        costs = self._costs(tv, options)
        best = 0  # ties keep the partial sum
        for i in range(1, len(options)):
            if costs[i].key() < costs[best].key():
                best = i
        if best == 0:
            return options[0], ""
        reason = ByCost("fewer bytes ({} vs {})", costs[best], costs[0])
        order = [best] + [i for i in range(len(options)) if i != best]
        self.engine.log.conflict(tv, [(options[i], costs[i]) for i in order], options[best], reason)
        return options[best], reason

    def _priced_candidates(self, tv) -> tuple:
        """(tv's candidates, the pool of choices they are made of, each
        candidate's cost, the rankings kept with them). Stacked layers meet
        the same conflict over and over: what the costs depend on (the
        question) names tv's easy and competing choices, which fix the
        candidates, so an answer kept for the question holds the candidates
        too (as places in the pool), the costs with the tensors' names put
        back, and the candidates' rankings (resolve)."""
        easy, conflicting = self.engine.classify(tv)
        question, tensors, sharing = self._question(tv, _POOL, [easy, conflicting])
        pool = _pool(easy, conflicting)
        known = self._answers.get(question)
        if known is not None:
            candidates = []
            for places in known[2]:  # (a loop: compiled, a comprehension's variable is untyped)
                candidates.append([pool[i] for i in places])
            return candidates, pool, _renamed(known[0], tensors), known[1]
        candidates = _candidates(pool)
        costs = self._priced(tv, candidates, sharing)
        rankings = {}
        self._answers[question] = (_unnamed(costs, tensors), rankings, _pool_places(candidates, pool))
        return candidates, pool, costs, rankings

    def _costs(self, tv, candidates: list) -> list:
        """Each candidate's cost, kept by its question as _priced_candidates
        keeps them (these candidates are listed whole: no pool makes them)."""
        question, tensors, sharing = self._question(tv, _LISTED, candidates)
        known = self._answers.get(question)
        if known is not None:
            return _renamed(known[0], tensors)
        costs = self._priced(tv, candidates, sharing)
        self._answers[question] = (_unnamed(costs, tensors), None, None)
        return costs

    def _priced(self, tv, candidates: list, sharing: list) -> list:
        """Each candidate's cost, priced afresh (a question asked for the first time)."""
        around = self._around(tv, sharing)
        costs = []
        for c in candidates:
            costs.append(self._cost(tv, c, around))
        return costs

    def _question(self, tv, kind: int, lists: list) -> tuple:
        """(what the candidates' costs depend on, with tensors as places in
        the neighbourhood; the neighbourhood's tensors, tv first; per adjacent
        expr how its operands are shared): what the neighbourhood's structure
        fixes (_neighbourhood: per adjacent expr its rule and which places
        its tensors are, each place's signature); the choice lists, which
        are the candidates themselves (kind _LISTED) or tv's easy and
        competing choices, which fix them (kind _POOL: _pool, _candidates);
        each place's state; and per adjacent expr the choices of its open
        results (_options) and how its operands are shared (_sharing). One
        flat tuple of ints: meshes, layouts, signatures and texts by their
        numbers, and a count before every part whose length varies, so that
        two questions are equal exactly when what they say is."""
        engine, cost = self.engine, self.cost
        own = engine.entry(tv)
        tensors, fixed, operands = self._neighbourhood(tv)
        parts = list(fixed)
        parts.append(kind)
        parts.append(len(lists))
        for i in range(len(lists)):  # (an index loop: compiled, no iterator)
            self._add_choices(parts, lists[i])
        # every tensor's state, tv's first, in the neighbourhood's order (its
        # count is in the fixed part)
        for i in range(len(tensors)):
            self._add_state(parts, engine.entry(tensors[i]))
        sharing = []
        adjacent = own.adjacent
        for i in range(len(adjacent)):  # (an index loop: compiled, operands are read by position)
            e = adjacent[i]
            for o in e.tv_outputs:
                result = engine.entry(o)
                if _any_none(result.decided):
                    self._add_choices(parts, engine.current_choices(o))
                else:
                    parts.append(-1)  # (no count is negative)
            read = operands[i]
            shared = {}
            parts.append(len(read))
            for j in range(len(read)):
                t, at, position, readers = read[j]
                made, sharers = shared[t] = self._sharing(e, position, readers)
                parts.append(at)
                parts.append(len(made))
                if made:
                    parts.extend(sorted([numbered(self._numbers, k) for k in made]))
                parts.append(sharers)
            sharing.append(shared)
        return tuple(parts), tensors, sharing

    def _add_state(self, parts: list, entry) -> None:
        """Appends a tensor's state as decided so far: its mesh's number, its
        rank, and per axis its layout's number (-1: replicated, -2: open)."""
        parts.append(self._mesh_number(entry.mesh))
        decided = entry.decided
        parts.append(len(decided))
        for k in range(len(decided)):  # (an index loop: compiled, no iterator)
            d = decided[k]
            parts.append(_OPEN if d is None else self.cost.layout_number(d.digits))

    def _add_choices(self, parts: list, choices: list) -> None:
        """Appends how many choices there are, then per choice what a cost
        reads of it: its axis, its layout's number, its mesh's number and
        whether it is a pending sum (what compete() compares besides)."""
        cost = self.cost
        parts.append(len(choices))
        for i in range(len(choices)):  # (an index loop: compiled, no iterator)
            m = choices[i]
            parts.append(m.axis)
            parts.append(cost.layout_number(m.digits))
            parts.append(self._mesh_number(m.mesh))
            parts.append(1 if m.reduction else 0)

    def _mesh_number(self, mesh) -> int:
        """The mesh's number in this plan's questions (-1: none); equal meshes, one number."""
        return -1 if mesh is None else self._meshes.number(mesh)

    def _neighbourhood(self, tv) -> tuple:
        """(tv and the tensors of its adjacent exprs, in the order questions
        name them (a tensor's place is its index); the question's part its
        structure fixes:
        per adjacent expr its question head's number and its tensors'
        places, and each tensor's signature as its shape's number, then
        per tensor the rest of its signature (CostModel.signature_flags),
        as ints with their counts): fixed per tensor, kept. Shapes are
        numbered once per fusion, and tensors of equal shapes have equal
        signatures under any sizes: a question that names shapes is at
        most finer than one that names signatures. Only the rules of ops
        that read sizes and the flags are read per plan (_placed). Last, per
        adjacent expr, its operands as _placed keeps them."""
        known = self._neighbourhoods.get(tv)
        if known is None:
            engine, cost = self.engine, self.cost
            adjacent = engine.entry(tv).adjacent
            placed = self._places.get(tv)
            if placed is None:  # (the first plan of the fusion)
                placed = self._places[tv] = self._placed(tv, adjacent)
            tensors, fixed, sized, operands = placed
            per_plan = []
            for i in sized:  # (a rule that reads sizes may change with them: its head is read per plan)
                e = adjacent[i]
                per_plan.append(question_head_number(e, engine.p.rule(e)))
            for i in range(len(tensors)):
                per_plan.append(cost.signature_flags(tensors[i]))
            known = self._neighbourhoods[tv] = (tensors, fixed + tuple(per_plan), operands)
        return known

    def _placed(self, tv, adjacent: list) -> tuple:
        """What of tv's neighbourhood the fusion fixes, kept with it: (its
        tensors (a tensor's place is its index); per adjacent expr its
        question head's number (-1 where its rule reads sizes) and its
        tensors' places and per tensor its shape's number, as ints with
        their counts; the positions
        of the adjacent exprs whose rules read sizes; per adjacent expr its
        operands other than tv, each once: (operand, its place, its position
        in the expr, the other exprs that read it with their outputs, each
        with the operand's position in it), for _sharing)."""
        engine, cost = self.engine, self.cost
        consumers = engine.p._indexed()[1]
        tensors, place, fixed, sized, operands = [tv], {tv: 0}, [len(adjacent)], [], []
        for i in range(len(adjacent)):
            e = adjacent[i]
            ends = e.tv_inputs + e.tv_outputs
            for t in ends:
                if t not in place:
                    place[t] = len(tensors)
                    tensors.append(t)
            if e.op.rule_needs_sizes:
                sized.append(i)
                fixed.append(-1)
            else:  # (any other rule is made once and never changes)
                fixed.append(question_head_number(e, engine.p.rule(e)))
            fixed.extend([place[t] for t in ends])
            read, seen = [], {tv}
            for t in e.tv_inputs:
                if t not in seen:  # (an operand read twice is shared the same way)
                    seen.add(t)
                    # (once per read, as the program lists them)
                    readers = tuple([(other, _position(other.tv_inputs, t)) for other in consumers.get(t, [])
                                     if other is not e and other.tv_outputs])
                    read.append((t, place[t], _position(e.tv_inputs, t), readers))
            operands.append(tuple(read))
        fixed.append(len(tensors))
        for i in range(len(tensors)):
            fixed.append(cost.shape_number(tensors[i]))
        return tensors, tuple(fixed), tuple(sized), tuple(operands)

    def _around(self, tv, sharing: list) -> list:
        """What a candidate's cost depends on besides the candidate, per expr
        adjacent to tv (the same for every candidate): [(expr, the other
        tensors' (layouts, mesh), their sharing)]; `sharing`: per expr, as
        _question found it."""
        engine = self.engine
        around = []
        own = engine.entry(tv)
        adjacent = own.adjacent
        for i in range(len(adjacent)):  # (an index loop: compiled, no tuple per pair)
            e = adjacent[i]
            others = {}
            for t in e.tv_inputs + e.tv_outputs:
                if t is not tv and t not in others:
                    entry = engine.entry(t)
                    others[t] = (_layouts(entry), entry.mesh)
            around.append((e, others, sharing[i]))
        return around

    def _cost(self, tv, chosen: list, around: list) -> Cost:
        """Bytes the exprs around tv would move with `chosen` applied."""
        entry = self.engine.entry(tv)
        mesh = entry.mesh
        if not mesh:
            mesh = None
            for m in chosen:
                if m.mesh is not None:
                    mesh = m.mesh
                    break
        layouts = _layouts(entry)
        for m in chosen:
            layouts[m.axis] = m.digits
        own = new_state(mesh, layouts)
        total = Cost(symbolic=self.cost.symbolic)
        for e, others, shared in around:
            states, options = {tv: own}, {}
            for t, (t_layouts, t_mesh) in others.items():
                states[t] = new_state(t_mesh if t_mesh is not None else mesh, t_layouts)
            for o in e.tv_outputs:
                for k, digits in enumerate(states[o].layouts):
                    if digits is None:
                        options[(o, k)] = self._options(o, k, e, tv, chosen, states)
            total = total + self.cost.expr_cost(e, states, options, shared)
        return total

    def _sharing(self, expr, position: int, readers: tuple) -> tuple:
        """(layouts other consumers of an operand of expr already need it in,
        how many consumers would share a reshard of it): the consumers with
        the same rule that read it in the same place and are not decided
        yet, and expr. position: where expr reads it; readers: its other
        consumers with outputs, each with where it reads it (_placed)."""
        engine = self.engine
        made, sharers = set(), 1
        shape = None  # expr's rule as text (read only when another consumer reads the operand in its place)
        for other, at in readers:
            outs = [engine.entry(o) for o in other.tv_outputs]
            whole = True
            for entry in outs:
                if _any_none(entry.decided):
                    whole = False
                    break
            if whole:
                rule = engine.p.rule(other)
                results = [new_state(entry.mesh, [d.digits for d in entry.decided]) for entry in outs]
                compute = plan_compute(other, results, rule)
                made.add(compute.operands[at].key())
            elif at == position:
                if shape is None:
                    shape = rule_text(engine.p.rule(expr))
                if rule_text(engine.p.rule(other)) == shape:
                    sharers += 1
        return made, sharers

    def _options(self, out, k, expr, tv, chosen, states) -> list:
        """Layouts an open result axis may end with: what the candidate implies
        through the expr (propagation would carry it), its own choices that fit
        the candidate, or replicated."""
        opts = []
        if out is not tv:
            implied = self._implied(expr, out, k, tv, states)
            if implied is not None:
                opts.append(implied)
        for m in self.engine.current_choices(out):
            if m.axis != k:
                continue
            fits = True
            if out is tv:
                for c in chosen:
                    if compete(m, c):
                        fits = False
                        break
            if fits:
                opts.append(m.digits)
        opts.append(())
        unique = {}
        for o in opts:
            unique.setdefault(layout.key(o), o)
        return list(unique.values())

    def _implied(self, expr, out, k, tv, states):
        """The layout `tv`'s known axes give result axis k of `expr`."""
        rule = self.engine.p.rule(expr)
        mesh = states[tv].mesh
        pairs = tensor_axes(expr, tv, rule)
        if mesh is None or pairs is None:
            return None
        # only the layouts tv knows; open axes (None) carry nothing
        known = [d or () for d in states[tv].layouts]
        per_factor = project(pairs, known, rule, mesh.axis_sizes(), skip_replicated=True)
        factors = rule.results[expr.tv_outputs.index(out)][k]
        if not any(f in per_factor for f in factors):
            return None
        if out.logical[k].is_reduction() and any(rule.factors[f].kind is not FactorKind.SUM for f in factors):
            return None
        return join_axis([per_factor.get(f, ()) for f in factors], factors, rule)


def _pool(easy: list, conflicting: list) -> list:
    """The choices a conflicted tensor's candidates are made of: its easy and
    competing ones and, as a layout over several mesh axes may lose its inner
    ones to a competitor and keep its outer ones, those prefixes too."""
    pool = easy + conflicting
    for m in conflicting:
        if len(m.mesh_axes) < 2:
            continue  # (one mesh axis or none: no outer part to keep)
        axes = layout.mesh_axes_of(m.digits)
        for j in range(1, len(axes)):
            digits = layout.keep_outer(m.digits, set(axes[j:]), m.mesh.axis_sizes())
            if not _offered(pool, m.axis, digits):
                pool.append(Choice(m.axis, digits, m.mesh, m.priority, m.stage, m.reduction, list(m.sources)))
    return pool


def _candidates(pool: list) -> list:
    """The maximal sets of the pool's choices that take at most one choice
    per axis and of which no two compete, in itertools.product's order
    (axes in order, the last turning fastest, each axis's choices before
    none)."""
    by_axis: dict = {}
    for m in pool:
        by_axis.setdefault(m.axis, []).append(m)
    # an odometer over the axes, compiled, with no tuple per combination
    options = []
    for a in sorted(by_axis):
        opts = by_axis[a]
        opts.append(None)
        options.append(opts)
    n = len(options)
    at = [0] * n
    candidates = []
    while True:
        chosen = []
        for i in range(n):
            m = options[i][at[i]]
            if m is not None:
                chosen.append(m)
        if chosen and not _any_compete(chosen):
            candidates.append(chosen)
        i = n - 1
        while i >= 0:
            at[i] += 1
            if at[i] < len(options[i]):
                break
            at[i] = 0
            i -= 1
        if i < 0:
            break
    # keep maximal candidates only: adding a compatible choice is free
    return _maximal(candidates)


def _pool_places(candidates: list, pool: list) -> tuple:
    """Each candidate as the places of its choices in the pool (a question
    fixes the pool's choices, not the objects: another tensor's pool with an
    equal question rebuilds its candidates from these)."""
    places = []
    for c in candidates:
        places.append(tuple([_position(pool, m) for m in c]))
    return tuple(places)


def _unnamed(costs: list, tensors: list) -> list:
    """The costs with their tensors named by place in `tensors` (kept for a question)."""
    unnamed = []
    for cost in costs:  # (a loop: compiled, a comprehension's variable is untyped)
        unnamed.append(cost.unnamed(tensors))
    return unnamed


def _renamed(unnamed: list, tensors: list) -> list:
    """Kept costs with their places named by this neighbourhood's tensors."""
    costs = []
    for cost in unnamed:
        costs.append(cost.renamed(tensors))
    return costs


def _position(tensors: list, tv) -> int:
    """tensors.index(tv) (a loop by identity, as TensorViews and choices
    compare: compiled, a C loop rather than a method called through
    Python's protocol)."""
    for i in range(len(tensors)):
        if tensors[i] is tv:
            return i
    raise ValueError(f"{tv} is not among {tensors}")


def _layouts(entry) -> list:
    """A tensor's layouts as decided so far (None: an open axis)."""
    return [d.digits if d is not None else None for d in entry.decided]


def _any_none(values) -> bool:
    """Whether any of the values is None (an open axis)."""
    for v in values:
        if v is None:
            return True
    return False


def _maximal(candidates: list) -> list:
    """The candidates no other one contains."""
    maximal = []
    for i in range(len(candidates)):  # (index loops: compiled, no set of ids per candidate)
        c = candidates[i]
        contained = False
        for j in range(len(candidates)):
            if j != i and _within(c, candidates[j]):
                contained = True
                break
        if not contained:
            maximal.append(c)
    return maximal


def _within(c: list, other: list) -> bool:
    """Whether every choice of `c` is in `other` (the same objects), and
    `other` has more (a candidate holds each choice once)."""
    if len(c) >= len(other):
        return False
    for m in c:
        found = False
        for o in other:
            if o is m:
                found = True
                break
        if not found:
            return False
    return True


def _forward(m: Choice) -> bool:
    """Whether a choice keeps a producer's sharding (a source reaches it forward)."""
    for p in m.sources:
        if p.direction is _FORWARD:
            return True
    return False


def _offered(pool: list, axis: int, digits) -> bool:
    """Whether the pool already has `digits` on `axis`."""
    for o in pool:
        if o.axis == axis and layout.same(o.digits, digits):
            return True
    return False


def _any_compete(chosen: list) -> bool:
    """Whether two of the choices compete."""
    for i in range(len(chosen)):  # (index loops: compiled, no pair tuples)
        for j in range(i + 1, len(chosen)):
            if compete(chosen[i], chosen[j]):
                return True
    return False


@cython.no_gc
@cython.cclass
class ByCost:
    """A reason that quotes one or two costs, formatted when read (str()):
    big fusions resolve thousands of conflicts and their log is usually
    never printed. The costs quoted are never changed. (Two fields, not a
    tuple, and out of the collector's way: the plan's log keeps one per
    conflict.)"""

    __slots__ = ("template", "first", "second")

    def __init__(self, template: str, first: Cost, second: Optional[Cost] = None):
        self.template = template
        self.first = first
        self.second = second

    def __str__(self) -> str:
        if self.second is None:
            return self.template.format(self.first.describe())
        return self.template.format(self.first.describe(), self.second.describe())


def _why(best: Scored, best_key: tuple, runner_up: Scored, runner_up_key: tuple, symbolic: bool) -> tuple:
    """Why best ranks first (their keys given): (a text, 0), or (a template,
    how many costs it quotes: best's, then the runner-up's)."""
    bp, bc, bf, _ = best_key
    rp, rc, rf, _ = runner_up_key
    if bp != rp:
        dropped = best.dropped_priority if best.dropped_priority != _NOTHING_DROPPED else runner_up.dropped_priority
        return f"priority: the alternative drops a priority-{dropped} sharding", 0
    if bc != rc:
        if symbolic and bc[0] != rc[0]:
            return "heuristic: weights stay stationary (symbolic sizes)", 0
        return "fewer bytes ({} vs {})", 2
    if bf != rf:
        return "tie on bytes ({}): keep the producer's sharding", 1
    return "tie: outer axes first", 0
