"""The optimal sharding of a small fusion, for benchmarking propagation.

Formulation
-----------
One variable per TensorView: its sharding state on the fusion's (single)
mesh. Annotated tensors and unannotated fusion inputs are fixed; every other
tensor ranges over all *block* states:

  * each mesh axis of size > 1 either shards one iteration (non-broadcast)
    axis or none; several mesh axes on one axis are nested outer splits in
    any order (DIDy*DIDx and DIDx*DIDy are different states);
  * each mesh axis of size > 1 is pending (a partial sum) on at most one
    reduction axis, or not;
  * a sharded extent must divide evenly.

With balanced=True, the FLOP-heavy ops (linear, matmul, grouped_mm,
attention) must split their work over every mesh axis of size
> 1 (some factor of theirs, a pending sum included, on each mesh axis):
without it, bytes alone favour gathering all weights and computing
everything redundantly on every device when activations are large.

Not searched: inner (cyclic) splits, mesh axes of size 1, several meshes,
sharded broadcast axes.

The cost of an assignment is exactly what nvshard's DecomposeReshardings
pass would emit for it, computed with nvshard's own rules: an expr computes
as its results' shardings say (compute_sharding.factor_layouts), each
operand is resharded from its producer's resolved state to the required
state (reshard.plan_reshard; identical reshards of one tensor are shared,
as the pass caches them), and each result from the produced state (partial
sums) to its resolved state. The objective is bytes received per device
(meshes are symmetric: every device receives the same) plus 2^-10 per
collective, so that among byte-optimal plans the one with fewest
collectives wins.

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
with several consumers would exceed the limit, its shared-reshard
discount is dropped (each consumer pays for its own reshard; an upper
bound) and the result says so (`exact=False`), with a lower bound from a
second solve in which those consumers pay 1/k of their reshards each
(sum over distinct >= max >= mean); a tensor with more than
MAX_SHARED_CONSUMERS consumer ops is always treated so; when an elimination table
exceeds it, the search raises TooBig.

The states found are then run through nvshard's decomposition pass, and
`bytes_per_device` / `communications` come from that plan, so the figure
reported is what nvshard would execute for those shardings.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from nvshard.multidevice import layout
from nvshard.ir.sizes import Size
from nvshard.preseg import compute_sharding as cs
from nvshard.preseg.cost import CostModel
from nvshard.preseg.decompose_reshardings import DecomposeReshardingsPass
from nvshard.preseg.pipeline import _sizes
from nvshard.preseg.plan import Plan
from nvshard.preseg.program import Program, TvState
from nvshard.preseg.reshard import plan_reshard
from nvshard.preseg.validate import validate_annotations

COLLECTIVE_EPS = 2.0 ** -10
HEAVY_OPS = {"linear", "matmul", "grouped_mm", "sdpfa_fwd", "sdpfa_bwd"}  # what balanced=True splits
DEFAULT_TABLE_LIMIT = 12 * 10 ** 7
MAX_SHARED_CONSUMERS = 3  # consumers of one tensor whose shared reshards are modelled exactly


_RESHARD_CACHE: dict = {}  # shared by searches: same tensor shapes, same plans


class TooBig(RuntimeError):
    """The exact search would need a table larger than the limit."""


@dataclass
class Result:
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


class OptimumSearch:
    def __init__(self, fusion, input_shapes, scalar_values=None, table_limit: int = DEFAULT_TABLE_LIMIT,
                 fixed: Optional[dict] = None, nested: bool = True, balanced: bool = False):
        validate_annotations(fusion)
        self.balanced = balanced
        self.fixed = dict(fixed or {})
        self.nested = nested
        self.fusion = fusion
        self.sizes = _sizes(fusion, list(input_shapes), scalar_values or {})
        if self.sizes is None:
            raise ValueError("the optimum needs concrete input shapes")
        self.program = Program(fusion, self.sizes)
        self.cost = CostModel(self.program, self.sizes)
        self.numel = self.cost.numel
        self.table_limit = table_limit
        meshes = {tv.mesh for tv in fusion.tvs() if tv.mesh is not None}
        if len(meshes) > 1:
            raise ValueError("the optimum search supports one mesh")
        self.mesh = next(iter(meshes), None)
        self.exact = True
        self._reshard_cache = _RESHARD_CACHE
        self.stats: dict = {}

    # -- the cost of one reshard -------------------------------------------------------------
    def _signature(self, tv):
        return (tv.dtype().itemsize,
                tuple((i.is_reduction(), i.is_broadcast(), self.numel.extent(tv, k)) for k, i in enumerate(tv.logical)))

    def reshard_cost(self, tv, src: TvState, dst: TvState) -> float:
        skey, dkey = src.key(), dst.key()
        if skey == dkey:
            return 0.0
        key = (self._signature(tv), skey, dkey)
        hit = self._reshard_cache.get(key)
        if hit is None:
            steps = plan_reshard(tv, src, dst, self.numel)
            hit = sum(s.bytes for s in steps) + COLLECTIVE_EPS * sum(
                1 for s in steps if s.kind != "slice" and s.group_size > 1)
            self._reshard_cache[key] = hit
        return hit

    # -- domains -----------------------------------------------------------------------------------
    def domain(self, tv) -> list:
        if tv in self.fixed:
            return [self.fixed[tv]]
        if tv.mesh is not None or tv in self.program.inputs or self.mesh is None:
            return [self.program.state[tv]]
        mesh = self.mesh
        sizes = mesh.axis_sizes()
        active = [m for m in mesh.axis_names if sizes[m] > 1]
        n = len(tv.logical)
        it = [k for k, i in enumerate(tv.logical) if not i.is_reduction() and not i.is_broadcast()]
        red = [k for k, i in enumerate(tv.logical) if i.is_reduction() and not i.is_broadcast()]
        extents = {k: self.numel.extent(tv, k) for k in it + red}

        def assignments(axes):
            """Per axis an ordered tuple of mesh axes (each mesh axis on at most one axis)."""
            out = []
            for targets in itertools.product([None] + axes, repeat=len(active)):
                groups = {k: [m for m, t in zip(active, targets) if t == k] for k in axes}
                if not self.nested and any(len(g) > 1 for g in groups.values()):
                    continue
                ok = all(extents[k] % math.prod(sizes[m] for m in g) == 0 for k, g in groups.items() if g)
                if not ok:
                    continue
                for orders in itertools.product(*[list(itertools.permutations(g)) for g in groups.values()]):
                    out.append(dict(zip(groups, orders)))
            return out

        iteration = assignments(it)
        pending = [{}] if not red else [
            {k: tuple(m for m in active if m in set(g)) for k, g in a.items()}
            for a in assignments(red) if all(list(g) == sorted(g, key=active.index) for g in a.values())
        ]
        states = []
        for a in iteration:
            for p in pending:
                layouts = [()] * n
                for k, order in list(a.items()) + list(p.items()):
                    if order:
                        layouts[k] = layout.block(order, Size(int(extents[k])), sizes)
                states.append(TvState(mesh, layouts))
        return states

    # -- model construction ---------------------------------------------------------------------------
    @staticmethod
    def drivers(expr, rule) -> list:
        """Results whose layouts decide the expr's factor layouts (see
        compute_sharding.factor_layouts): a result counts when one of its axes
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
            drivers = self.drivers(e, rule)
            if len(drivers) == 1:
                v = self.var_of[e.tv_outputs[drivers[0]]]
                comp_var[e] = v
                combos = [(s,) for s in self.dom[v]]
            else:
                dvars = [self.var_of[e.tv_outputs[i]] for i in drivers]
                combos = list(itertools.product(*[self.dom[v] for v in dvars]))
                if len(combos) > self.table_limit:
                    raise TooBig(f"{e.op.name}: {len(combos)} joint result states")
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
            comp_states[e] = (drivers, combos, fls)
            # result terms
            unary = np.zeros(len(combos))
            for i, out in enumerate(e.tv_outputs):
                produced = [cs.produced_state(e, i, fl, self.mesh, rule) for fl in fls]
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
            if self.balanced and e.op.name in HEAVY_OPS and self.mesh is not None:
                # the op's work must be split over every mesh axis (no replicated compute)
                sizes = self.mesh.axis_sizes()
                need = {m for m in self.mesh.axis_names if sizes[m] > 1}
                for c, fl in enumerate(fls):
                    used = set()
                    for d in fl.values():
                        used.update(layout.mesh_axes_of(d))
                    if not need <= used:
                        unary[c] = np.inf
            factors.append(_Factor((comp_var[e],), unary))
        # consumer terms
        for tv in tvs[: len(p.state)]:
            if tv is None:
                continue
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
            _, _, fls = comp_states[e]
            idx = []
            for fl in fls:
                r = cs.required_state(e, i, fl, self.mesh, self.program.rule(e))
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
            raise TooBig(f"elimination needs a table of {largest} entries (limit {self.table_limit})")
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
    def run(self) -> Result:
        t0 = time.perf_counter()
        self.build()
        t1 = time.perf_counter()
        objective, choice = self.solve()
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
                          build_s=t1 - t0, solve_s=t2 - t1, reshard_plans_cached=len(self._reshard_cache))
        self.stats.update(lower_bound=math.floor(lower))
        return Result(plan.bytes_per_device, plan.communications, states, plan, objective, self.exact, self.stats,
                      math.floor(lower))

    def decompose(self, states: dict) -> Plan:
        """nvshard's decomposition pass on the given states: the plan nvshard would run."""
        program = Program(self.fusion, self.sizes)
        for tv, s in states.items():
            program.state[tv] = TvState(s.mesh, list(s.layouts))
        plan = Plan(self.fusion, program, self.sizes, "optimum")
        plan.propagated = {tv: TvState(s.mesh, list(s.layouts)) for tv, s in program.state.items()}
        DecomposeReshardingsPass(CostModel(program, self.sizes).numel).run(program)
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


def optimum(fd_or_fusion, input_shapes, scalar_values=None, table_limit: int = DEFAULT_TABLE_LIMIT,
            fixed: Optional[dict] = None, nested: bool = True, balanced: bool = False) -> Result:
    """The cheapest block sharding of every unannotated tensor. `fixed` pins
    more tensors (TensorView -> TvState), e.g. the fusion outputs to the
    shardings a plan gives them, so that plans are compared for the same
    result layout."""
    fusion = getattr(fd_or_fusion, "fusion", fd_or_fusion)
    return OptimumSearch(fusion, input_shapes, scalar_values, table_limit, fixed, nested, balanced).run()
