"""The cheapest block sharding of every free tensor of a fusion, by exact search.

Used by the pre-segmenter's opt-in `propagation="search"` mode (see
SearchShardingsPass) and by tools/optimum.py (the benchmarks' optimum).

Formulation
-----------
One variable per TensorView: its sharding state on its mesh. Meshes are not
searched: each tensor keeps the mesh (pipeline stage) a base plan gave it
(default propagation's, or the fusion's single mesh). Fixed tensors:

  * unannotated fusion inputs (they arrive whole) take exactly their state;
  * annotated tensors and `pinned` ones keep the layout of every iteration
    axis; a reduction axis the annotation left open may still hold a
    pending sum (a sharded contraction may end in a reduce-scatter onto the
    annotated layout, as in default propagation).

Every other tensor ranges over all *block* states of its mesh:

  * each mesh axis of size > 1 either shards one iteration (non-broadcast)
    axis or none; several mesh axes on one axis are nested outer splits in
    any order (DIDy*DIDx and DIDx*DIDy are different states);
  * each mesh axis of size > 1 is pending (a partial sum) on at most one
    reduction axis, or not (also one sharding an iteration axis: compute
    with the contraction sharded, then reduce-scatter onto that axis);
  * a sharded extent must divide evenly.

With balanced=True every contraction (an expr whose rule has a summed or
kept-whole factor that two operands share: linear, matmul, attention) must
split its work over every mesh axis of size > 1 (some factor of it, a pending
sum included, on each): without it, bytes alone favour gathering all weights
and computing everything redundantly on every device.

Not searched: inner (cyclic) splits, mesh axes of size 1, meshes, sharded
broadcast axes.

Cost: what the DecomposeReshardings pass emits for an assignment, with
nvshard's own rules: an expr computes as its results' shardings say
(projection's factor layouts), each operand is resharded from its
producer's resolved state to the required state (plan_reshard; identical
reshards of one tensor are shared, as the pass caches them), and each
result from the produced state (partial sums) to its resolved state. The
objective is bytes received per device plus 2^-10 per collective, so that
among byte-optimal plans the one with fewest collectives wins.

Search
------
The cost is a sum of small factors over tensor states: a result term per
expr (over the results that decide its computation), and a consumer term
per tensor (over the tensor and the results of its consumers, because
shared reshards count once). The minimum is found exactly by min-sum
variable elimination (bucket elimination) over dense numpy tables, with a
greedy smallest-table elimination order; backtracking gives the states.
It is exact as long as every intermediate table fits `table_limit`
entries: the work is governed by the domain sizes (up to ~200 states for a
4-D tensor on three mesh axes, x8 with a pending axis) raised to the
induced width of the program's graph. When a consumer term of a tensor
with several consumers would exceed the limit, its shared-reshard discount
is dropped (each consumer pays for its own reshard; an upper bound) and the
result says so (`exact=False`), with a lower bound from a second solve in
which those consumers pay 1/k of their reshards each (sum over distinct >=
max >= mean); a tensor with more than MAX_SHARED_CONSUMERS consumer ops is
always treated so. When an elimination table exceeds the limit the search
raises SearchTooBig before allocating it.

`run()` puts the states found through the decomposition pass (which may
still let an expr compute on its operands' shards when that moves fewer
bytes), so `bytes_per_device` is what nvshard would execute.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..errors import NvShardError
from ..ir.nodes import TensorView
from ..ir.sizes import Size
from ..multidevice import layout
from ..multidevice.collectives import format_bytes
from ..ops.registry import FactorKind
from . import compute_sharding as cs
from .cost import CostModel
from .decompose_reshardings import DecomposeReshardingsPass
from .plan import Plan
from .program import Program, TvState
from .reshard import plan_reshard

COLLECTIVE_EPS = 2.0 ** -10
DEFAULT_TABLE_LIMIT = 12 * 10 ** 7  # float64 entries: ~1 GiB for the largest table
MAX_SHARED_CONSUMERS = 3  # consumers of one tensor whose shared reshards are modelled exactly


class SearchInfeasible(NvShardError):
    """No assignment of block states meets the constraints."""


class SearchTooBig(NvShardError):
    """The exact search would need a table larger than the limit."""


@dataclass
class SearchResult:
    bytes_per_device: float
    communications: list
    states: dict  # TensorView -> TvState
    plan: Plan
    objective: float  # bytes + COLLECTIVE_EPS * collectives, as the search saw it
    exact: bool
    stats: dict = field(default_factory=dict)
    lower_bound: float = 0.0  # bytes no block plan can beat (== objective's bytes when exact)


class _Factor:
    __slots__ = ("vars", "table")

    def __init__(self, vars_, table):
        self.vars = tuple(vars_)
        self.table = table


def is_contraction(expr, rule) -> bool:
    """An expr whose work grows with a factor two of its operands share and no
    result keeps (matmul's k, attention's key and head axes)."""
    seen: dict = {}
    for factors_per_axis in rule.operands:
        for f in {f for axis in factors_per_axis for f in axis}:
            seen[f] = seen.get(f, 0) + 1
    return any(n >= 2 and rule.factors[f].kind in (FactorKind.SUM, FactorKind.REPLICATED) for f, n in seen.items())


class BlockLayoutSearch:
    """program: a Program on concrete sizes whose `state` gives every tensor
    its mesh (annotated tensors their annotation); pinned: TensorView ->
    TvState for more tensors whose iteration layouts stay as given."""

    def __init__(self, program: Program, sizes, table_limit: int = DEFAULT_TABLE_LIMIT,
                 pinned: Optional[dict] = None, nested: bool = True, balanced: bool = False):
        if sizes is None:
            raise NvShardError("the sharding search needs concrete input shapes")
        self.program = program
        self.fusion = program.fusion
        self.sizes = sizes
        self.base = {tv: TvState(s.mesh, list(s.layouts)) for tv, s in program.state.items()}
        # the user's layouts, before any pass decided pending sums on their open reduction axes
        self.annotated = {tv: s for tv, s in Program(program.fusion, sizes).state.items() if tv.mesh is not None}
        self.pinned = dict(pinned or {})
        self.balanced = balanced
        self.nested = nested
        self.numel = CostModel(program, sizes).numel
        self.table_limit = table_limit
        self.exact = True
        self._reshard_cache: dict = {}
        self.stats: dict = {}

    # -- the cost of one reshard -------------------------------------------------------------
    def reshard_cost(self, tv, src: TvState, dst: TvState) -> float:
        skey, dkey = src.key(), dst.key()
        if skey == dkey:
            return 0.0
        key = (self.numel.signature(tv), skey, dkey)
        hit = self._reshard_cache.get(key)
        if hit is None:
            steps = plan_reshard(tv, src, dst, self.numel)
            hit = sum(s.bytes for s in steps) + COLLECTIVE_EPS * sum(
                1 for s in steps if s.kind != "slice" and s.group_size > 1)
            self._reshard_cache[key] = hit
        return hit

    # -- domains -----------------------------------------------------------------------------------
    def domain(self, tv) -> list:
        base = self.base[tv]
        if tv in self.program.input_set or base.mesh is None:
            return [base]
        if tv in self.pinned:
            return self._states(tv, base.mesh, cs.resolved(tv, self.pinned[tv]))
        if tv.mesh is not None:
            return self._states(tv, base.mesh, self.annotated[tv])
        return self._states(tv, base.mesh, None)

    def _states(self, tv, mesh, keep: Optional[TvState]) -> list:
        """Block states of tv on mesh; with `keep`, its iteration layouts and
        any pending sums on the reduction axes it leaves open."""
        sizes = mesh.axis_sizes()
        active = [m for m in mesh.axis_names if sizes[m] > 1]
        n = len(tv.logical)
        it = [k for k, i in enumerate(tv.logical) if not i.is_reduction() and not i.is_broadcast()]
        red = [k for k, i in enumerate(tv.logical) if i.is_reduction() and not i.is_broadcast()]
        if keep is not None:
            red = [k for k in red if not keep.layouts[k]]
        extents = {k: self.numel.extent(tv, k) for k in it + red}

        def assignments(axes, free):
            """Per axis an ordered tuple of mesh axes (each mesh axis on at most one axis)."""
            out = []
            for targets in itertools.product([None] + axes, repeat=len(free)):
                groups = {k: [m for m, t in zip(free, targets) if t == k] for k in axes}
                if not self.nested and any(len(g) > 1 for g in groups.values()):
                    continue
                ok = all(extents[k] % math.prod(sizes[m] for m in g) == 0 for k, g in groups.items() if g)
                if not ok:
                    continue
                for orders in itertools.product(*[list(itertools.permutations(g)) for g in groups.values()]):
                    out.append(dict(zip(groups, orders)))
            return out

        if keep is not None:
            iteration = [None]
        else:
            iteration = assignments(it, active)
        states = []
        for a in iteration:
            base_layouts = list(keep.layouts) if keep is not None else [()] * n
            if a is not None:
                for k, order in a.items():
                    if order:
                        base_layouts[k] = layout.block(order, Size(int(extents[k])), sizes)
            # a mesh axis on an iteration axis may also be pending (compute with the
            # contraction sharded, then reduce-scatter onto that axis); not twice pending
            pending_kept = {m for k, d in enumerate(base_layouts) if tv.logical[k].is_reduction()
                            for m in layout.mesh_axes_of(d)}
            free = [m for m in active if m not in pending_kept]
            pending = [{}] if not red or not free else [
                {k: tuple(m for m in free if m in set(g)) for k, g in p.items()}
                for p in assignments(red, free) if all(list(g) == sorted(g, key=free.index) for g in p.values())
            ]
            for p in pending:
                layouts = list(base_layouts)
                for k, order in p.items():
                    if order:
                        layouts[k] = layout.block(order, Size(int(extents[k])), sizes)
                states.append(TvState(mesh, layouts))
        return states

    # -- model construction ---------------------------------------------------------------------------
    @staticmethod
    def drivers(expr, rule) -> list:
        """Results whose layouts decide the expr's factor layouts (see
        projection.factor_layouts): a result counts when one of its axes
        has factors no earlier axis covered."""
        covered, out = set(), []
        for i, _ in enumerate(expr.tv_outputs):
            contributes = False
            for factors in rule.results[i]:
                if not factors or any(f in covered for f in factors):
                    continue
                covered.update(factors)
                contributes = True
            if contributes:
                out.append(i)
        return out

    def build(self):
        p = self.program
        tvs = list(p.state)
        self.var_of = {tv: i for i, tv in enumerate(tvs)}
        self.dom = [self.domain(tv) for tv in tvs]
        self.tvs = tvs
        factors: list[_Factor] = []
        self._extra: list[_Factor] = []
        self._relaxed: list = []  # (upper factors, lower-bound factors)
        comp_var, comp_states = {}, {}
        exprs = [e for e in p.exprs if e.tv_outputs]
        for e in exprs:
            rule = p.rule(e)  # the plan's rule: concrete sizes
            mesh = self.base[e.tv_outputs[0]].mesh  # the expr computes on its results' mesh
            drivers = self.drivers(e, rule)
            if len(drivers) == 1:
                v = self.var_of[e.tv_outputs[drivers[0]]]
                comp_var[e] = v
                combos = [(s,) for s in self.dom[v]]
            else:
                dvars = [self.var_of[e.tv_outputs[i]] for i in drivers]
                combos = list(itertools.product(*[self.dom[v] for v in dvars]))
                if len(combos) > self.table_limit:
                    raise SearchTooBig(f"the sharding search: {e.op.name} producing "
                                       f"{', '.join(o.short_name() for o in e.tv_outputs)} has {len(combos)} joint "
                                       f"result states (limit {self.table_limit})")
                v = len(self.dom)
                self.dom.append(combos)
                self.tvs.append(None)
                comp_var[e] = v
                for j, dv in enumerate(dvars):  # the joint variable agrees with each driver
                    index = {s.key(): n for n, s in enumerate(self.dom[dv])}
                    table = np.full((len(combos), len(self.dom[dv])), np.inf)
                    for c, combo in enumerate(combos):
                        table[c, index[combo[j].key()]] = 0.0
                    factors.append(_Factor((v, dv), table))
            # how the expr computes in each of its computation states
            fls = []
            for combo in combos:
                results = [None] * len(e.tv_outputs)
                for i, s in zip(drivers, combo):
                    results[i] = s
                fls.append(cs.factor_layouts(e, results, rule))
            comp_states[e] = (drivers, combos, fls, mesh)
            # result terms
            unary = np.zeros(len(combos))
            for i, out in enumerate(e.tv_outputs):
                produced = [cs.produced_state(e, i, fl, mesh, rule) for fl in fls]
                if i in drivers:
                    j = drivers.index(i)
                    for c, combo in enumerate(combos):
                        unary[c] += self.reshard_cost(out, produced[c], cs.resolved(out, combo[j]))
                else:
                    ov = self.var_of[out]
                    pk, pidx = _index([s.key() for s in produced])
                    pstates = {k: s for k, s in zip([s.key() for s in produced], produced)}
                    resolved = [cs.resolved(out, s) for s in self.dom[ov]]
                    rk, ridx = _index([s.key() for s in resolved])
                    rstates = {s.key(): s for s in resolved}
                    small = np.array([[self.reshard_cost(out, pstates[a], rstates[b]) for b in rk] for a in pk])
                    factors.append(_Factor((comp_var[e], ov), small[np.ix_(pidx, ridx)]))
            if self.balanced and mesh is not None and is_contraction(e, rule):
                # the op's work must be split over every mesh axis (no replicated compute)
                sizes = mesh.axis_sizes()
                need = {m for m in mesh.axis_names if sizes[m] > 1}
                for c, fl in enumerate(fls):
                    used = set()
                    for d in fl.values():
                        used.update(layout.mesh_axes_of(d))
                    if not need <= used:
                        unary[c] = np.inf
            factors.append(_Factor((comp_var[e],), unary))
        # consumer terms
        for tv in tvs:
            usages = [(e, i) for e in p.consumers.get(tv, []) if e.tv_outputs for i, t in enumerate(e.tv_inputs)
                      if t is tv]
            if not usages:
                continue
            factors.extend(self._consumer_factors(tv, usages, comp_var, comp_states))
        self.factors = factors + self._extra
        self.exprs = exprs

    def _consumer_factors(self, tv, usages, comp_var, comp_states) -> list:
        v = self.var_of[tv]
        src_states = [cs.resolved(tv, s) for s in self.dom[v]]
        skeys, sidx = _index([s.key() for s in src_states])
        sstate = {s.key(): s for s in src_states}
        # required states per usage, as indices into one list R
        rlist, rindex = [], {}
        req = []
        for e, i in usages:
            _, _, fls, mesh = comp_states[e]
            idx = []
            for fl in fls:
                r = cs.required_state(e, i, fl, mesh, self.program.rule(e))
                k = r.key()
                if k not in rindex:
                    rindex[k] = len(rlist)
                    rlist.append(r)
                idx.append(rindex[k])
            req.append(np.array(idx))
        C = np.array([[self.reshard_cost(tv, sstate[a], r) for r in rlist] for a in skeys])[sidx]  # [S, R]
        exprs = []
        for e, _ in usages:
            if comp_var[e] not in exprs:
                exprs.append(comp_var[e])
        # (variable, required-index array over its domain) per usage
        uses = [(comp_var[e], r) for (e, _), r in zip(usages, req)]
        if len(exprs) > 1:
            # Consumers' results often have more states than the operand layouts
            # they require: route each through a variable for its required state.
            routed, new_uses = [], []
            for c in exprs:
                mine = [r for x, r in uses if x == c]
                combined = list(zip(*[r.tolist() for r in mine]))
                keys, idx = _index(combined)
                if len(keys) < len(self.dom[c]):
                    rho = len(self.dom)
                    self.dom.append(keys)
                    self.tvs.append(None)
                    link = np.full((len(self.dom[c]), len(keys)), np.inf)
                    link[np.arange(len(idx)), idx] = 0.0
                    self._extra.append(_Factor((c, rho), link))
                    routed.append(rho)
                    for j in range(len(mine)):
                        new_uses.append((rho, np.array([k[j] for k in keys], dtype=np.int64)))
                else:
                    routed.append(c)
                    new_uses.extend((c, r) for r in mine)
            exprs, uses = routed, new_uses
        size = len(self.dom[v]) * math.prod(len(self.dom[c]) for c in exprs)
        if len(exprs) > MAX_SHARED_CONSUMERS or (len(exprs) > 1 and size > self.table_limit):
            # Too many consumers to share reshards exactly (one table over all of
            # them would make the elimination blow up): each consumer pays for its
            # own reshard (an upper bound); a second solve with each consumer's
            # share divided by their number gives a lower bound.
            self.exact = False
            upper = [self._consumer_table(v, [c], [(x, r) for x, r in uses if x == c], C) for c in exprs]
            lower = [_Factor(f.vars, f.table / len(exprs)) for f in upper]
            self._relaxed.append((upper, lower))
            return upper
        return [self._consumer_table(v, exprs, uses, C)]

    def _consumer_table(self, v, exprs, usages, C) -> _Factor:
        """sum over distinct required states r of C[s, r], as a table over (v, *exprs)."""
        ndim = 1 + len(exprs)
        table = np.zeros([len(self.dom[v])] + [len(self.dom[c]) for c in exprs])
        placed = []  # broadcastable required-index arrays of earlier usages
        for c, r in usages:
            shape = [1] * ndim
            shape[1 + exprs.index(c)] = len(r)
            ri = r.reshape(shape)
            term = np.take(C, ri.reshape(-1), axis=1).reshape([C.shape[0]] + shape[1:])
            fresh = np.ones([1] * ndim, dtype=bool)
            for earlier in placed:
                fresh = fresh & (ri != earlier)
            table = table + np.where(fresh, term, 0.0)
            placed.append(ri)
        return _Factor((v, *exprs), table)

    # -- min-sum variable elimination -----------------------------------------------------------
    def plan_elimination(self):
        """The greedy order (smallest table first) and its largest table, from
        the factor scopes alone."""
        dom = [len(d) for d in self.dom]
        nbr = {x: set() for x in range(len(dom))}
        for f in self.factors:
            for x in f.vars:
                nbr[x].update(y for y in f.vars if y != x)
        alive = set(range(len(dom)))
        order, largest = [], 1
        while alive:
            x = min(alive, key=lambda v: (dom[v] * math.prod(dom[y] for y in nbr[v]), v))
            size = dom[x] * math.prod(dom[y] for y in nbr[x])
            largest = max(largest, size)
            order.append(x)
            alive.discard(x)
            for y in nbr[x]:
                nbr[y].discard(x)
                nbr[y].update(z for z in nbr[x] if z != y)
            del nbr[x]
        return order, largest

    def solve(self, factors=None):
        order, largest = self.plan_elimination()
        if largest > self.table_limit:
            raise SearchTooBig(f"the sharding search would need a table of {largest} entries "
                               f"(limit {self.table_limit}; {len(self.program.state)} tensors)")
        dom = [len(d) for d in self.dom]
        factors = list(self.factors if factors is None else factors)
        by_var: dict = {}
        for f in factors:
            for x in f.vars:
                by_var.setdefault(x, []).append(f)
        alive = set(range(len(dom)))
        trace = []
        constant = 0.0
        max_table = 1
        for x in [x for x in alive if x not in by_var]:
            alive.discard(x)
            trace.append((x, (), np.zeros((), dtype=np.int64)))
        for x in order:
            if x not in alive:
                continue
            fs = by_var.pop(x)
            scope = [x] + sorted({y for f in fs for y in f.vars if y != x})
            max_table = max(max_table, math.prod(dom[y] for y in scope))
            table = np.zeros([dom[y] for y in scope])
            for f in fs:
                table = table + _expand(f, scope, dom)
                for y in f.vars:
                    if y != x:
                        by_var[y] = [g for g in by_var[y] if g is not f]
            arg = table.argmin(axis=0)
            low = table.min(axis=0)
            rest = tuple(scope[1:])
            trace.append((x, rest, arg))
            alive.discard(x)
            if rest:
                nf = _Factor(rest, low)
                for y in rest:
                    by_var[y].append(nf)
            else:
                constant += float(low)
        choice = {}
        for x, rest, arg in reversed(trace):
            choice[x] = int(arg[tuple(choice[y] for y in rest)]) if rest else int(arg)
        self.stats.update(max_table=max_table)
        return constant, choice

    # -- entry point ---------------------------------------------------------------------------------
    def run(self) -> SearchResult:
        t0 = time.perf_counter()
        self.build()
        t1 = time.perf_counter()
        objective, choice = self.solve()
        if math.isinf(objective):
            raise SearchInfeasible(
                "the sharding search found no block sharding that meets its constraints (with balanced=True "
                "every contraction split over every mesh axis; extents divisible; annotated and pinned layouts kept)")
        lower = objective
        if self._relaxed:
            swap = {id(f): g for upper, low in self._relaxed for f, g in zip(upper, low)}
            lower, _ = self.solve([swap.get(id(f), f) for f in self.factors])
        t2 = time.perf_counter()
        states = {tv: self.dom[self.var_of[tv]][choice[self.var_of[tv]]] for tv in self.program.state}
        plan = self.decompose(states)
        free = [len(d) for tv, d in zip(self.tvs, self.dom) if tv is not None and len(d) > 1]
        self.stats.update(tensors=len(self.program.state), free_tensors=len(free),
                          max_domain=max(free, default=1), states=sum(free),
                          build_s=t1 - t0, solve_s=t2 - t1, lower_bound=math.floor(lower))
        return SearchResult(plan.bytes_per_device, plan.communications, states, plan, objective, self.exact,
                            self.stats, math.floor(lower))

    def decompose(self, states: dict, mode: str = "search") -> Plan:
        """nvshard's decomposition pass on the given states: the plan nvshard would run."""
        return decompose_states(self.fusion, self.sizes, states, mode)


def decompose_states(fusion, sizes, states: dict, mode: str) -> Plan:
    """A Plan from given shardings of every tensor, through the decomposition pass."""
    program = Program(fusion, sizes)
    for tv, s in states.items():
        program.state[tv] = TvState(s.mesh, list(s.layouts))
    plan = Plan(fusion, program, sizes, mode)
    plan.propagated = {tv: TvState(s.mesh, list(s.layouts)) for tv, s in program.state.items()}
    DecomposeReshardingsPass(CostModel(program, sizes).numel).run(program)
    plan.record_communications()
    return plan


def _index(keys: list):
    """(distinct keys in first-seen order, index array)."""
    order, pos, idx = [], {}, []
    for k in keys:
        if k not in pos:
            pos[k] = len(order)
            order.append(k)
        idx.append(pos[k])
    return order, np.array(idx, dtype=np.int64)


def _expand(f: _Factor, scope: list, dom: list) -> np.ndarray:
    """f's table with its axes placed (and broadcast) in scope order."""
    order = sorted(range(len(f.vars)), key=lambda a: scope.index(f.vars[a]))
    t = np.transpose(f.table, order) if order != list(range(len(order))) else f.table
    shape = [dom[y] if y in f.vars else 1 for y in scope]
    return t.reshape(shape)


# -- the pre-segmenter's opt-in mode -------------------------------------------------------------

SEARCH_TABLE_LIMIT = 3 * 10 ** 7  # float64 entries (240 MB) for the largest elimination table


class SearchShardingsPass:
    """propagation="search": after default propagation, the exact block
    layout search over every tensor the user did not annotate.

    Annotated tensors keep their layouts (every priority: the search replaces
    the spreading of annotations, which priorities order, by cost), fusion
    inputs arrive as given, each tensor keeps the mesh (stage) default
    propagation put it on, and the fusion outputs keep the iteration layouts
    it gave them, so the result a caller receives is laid out as in default
    mode. Every contraction splits its work over every mesh axis
    (balanced). The search's plan replaces default propagation's only when
    its decomposition moves fewer bytes (then fewer collectives); when the
    search is too big (SEARCH_TABLE_LIMIT), infeasible or the sizes are
    symbolic, default propagation stands. The decision log says which, why,
    and what each plan costs."""

    name = "SearchShardingsPass"

    def __init__(self, cost: CostModel, log, table_limit: Optional[int] = None):
        self.cost = cost
        self.log = log
        self.table_limit = table_limit or SEARCH_TABLE_LIMIT
        self.outcome: dict = {}

    def _keep_default(self, why: str, **extra) -> None:
        self.outcome = dict(chosen="default", reason=why, **extra)
        self.log.note(None, f"search: default propagation kept: {why}")

    def run(self, program: Program) -> None:
        sizes = self.cost.sizes
        if sizes is None:
            return self._keep_default("the search needs concrete input shapes (fd.execute and "
                                      "propagate_shardings(fd, shapes) give them; definition-time plans are symbolic)")
        meshes = {s.mesh for s in program.state.values() if s.mesh is not None}
        if not meshes:
            return self._keep_default("no tensor has a mesh")
        nested = all(sum(1 for n in m.axis_sizes().values() if n > 1) <= 2 for m in meshes)
        default_states = dict(program.state)
        pinned = {o: program.state[o] for o in program.outputs
                  if isinstance(o, TensorView) and o.mesh is None and o not in program.input_set}
        t0 = time.perf_counter()
        try:
            search = BlockLayoutSearch(program, sizes, self.table_limit, pinned, nested, balanced=True)
            result = search.run()
        except (SearchTooBig, SearchInfeasible) as e:
            return self._keep_default(str(e), search_s=time.perf_counter() - t0)
        states = _keep_trivial_axes(result.states, default_states, search.domain)
        searched_plan = decompose_states(program.fusion, sizes, states, "search")
        default_plan = decompose_states(program.fusion, sizes, default_states, "default")
        seconds = time.perf_counter() - t0
        searched, searched_kinds = _figures(searched_plan)
        default, default_kinds = _figures(default_plan)
        figures = (f"searched plan {format_bytes(searched[0])} in {searched[1]} collectives "
                   f"({searched_kinds}), default propagation's {format_bytes(default[0])} in {default[1]} "
                   f"({default_kinds}); "
                   f"{result.stats['free_tensors']} tensors searched, {result.stats['states']} states, largest table "
                   f"{result.stats['max_table']}, {'exact' if result.exact else 'not proven optimal'}, {seconds:.2f} s")
        extra = dict(search_bytes=searched[0], default_bytes=default[0], search_collectives=searched[1],
                     default_collectives=default[1], exact=result.exact, search_s=seconds,
                     stats=dict(result.stats))
        if (round(searched[0]), searched[1]) >= (round(default[0]), default[1]):  # bytes to the byte
            return self._keep_default(f"it moves no fewer bytes: {figures}", **extra)
        self.outcome = dict(chosen="search", reason=figures, **extra)
        self.log.note(None, f"search: block layout search chosen: {figures}")
        for tv, state in states.items():
            before = default_states[tv]
            for k, digits in enumerate(state.layouts):
                if not layout.same(digits, before.layouts[k]):
                    was = layout.describe(before.layouts[k]) if before.layouts[k] else "replicated"
                    self.log.decide(tv, k, digits, f"search (was {was} under default propagation)",
                                    "-", "search")
            program.state[tv] = TvState(state.mesh, list(state.layouts))


def _figures(plan) -> tuple:
    """((bytes per device, collectives that move data), their kinds)."""
    moving = [c for c in plan.communications if not c.groups or max(len(g) for g in c.groups) > 1]
    return (plan.bytes_per_device, len(moving)), ", ".join(c.kind for c in moving) or "none"


def _keep_trivial_axes(states: dict, default_states: dict, domain) -> dict:
    """The search ignores mesh axes of size 1; where it leaves an axis whole
    that default propagation laid out on size-1 mesh axes only (DIDz of a
    1x2x2 mesh), keep that layout: it moves nothing and spares a collective
    over one device where the tensor meets annotated neighbours."""
    out = {}
    for tv, state in states.items():
        before = default_states[tv]
        if before.mesh is None or len(domain(tv)) <= 1:
            out[tv] = state
            continue
        sizes = before.mesh.axis_sizes()
        layouts = list(state.layouts)
        taken = {m for d in layouts for m in layout.mesh_axes_of(d)}
        for k, digits in enumerate(before.layouts):
            axes = layout.mesh_axes_of(digits)
            if (not layouts[k] and axes and not tv.logical[k].is_reduction()
                    and all(sizes[m] == 1 for m in axes) and not taken.intersection(axes)):
                layouts[k] = digits
                taken.update(axes)
        out[tv] = TvState(state.mesh, layouts)
    return out
