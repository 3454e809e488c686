"""DecomposeReshardings: every producer/consumer sharding mismatch becomes
explicit communication exprs, one mesh axis at a time.

For each expr, the sharding of its results decides how it computes
(projection.plan_compute). Operands laid out differently are resharded first;
results that come out differently (partial sums, a local block to keep)
are resharded after, the last step writing the original result.
"""

from __future__ import annotations

from ..ir.nodes import Expr, TensorView
from ..multidevice import layout
from ..ops.communication import COMMUNICATIONS
from .program import Program, TvState
from .projection import annotated_sum, pass_through_axes, plan_compute, question_head_number, resolved, same_state
from .cost import reshard_bytes
from .reshard import LastNumbered, NumelModel, layout_number, plan_reshard


class DecomposeReshardingsPass:
    name = "DecomposeReshardingsPass"

    def __init__(self, numel: NumelModel, weigh_alternatives: bool = True):
        self.numel = numel
        # False: every expr computes as its results say (nvFuser's way, for legacy mode)
        self.weigh_alternatives = weigh_alternatives

    def run(self, program: Program) -> None:
        _Rewrite(program, self.numel, self.weigh_alternatives).run()


class _Rewrite:
    """One run of the pass over a program. (Its helpers are methods, not
    closures: compiled, closures that call each other form a cycle, which
    would hold every reshard signature until the collector ran.)"""

    __slots__ = ("program", "numel", "weigh_alternatives", "exprs", "resharded", "plans", "layout_keys", "codes",
                 "layout_key_numbers", "meshes")

    def __init__(self, program: Program, numel: NumelModel, weigh_alternatives: bool):
        self.program = program
        self.numel = numel
        self.weigh_alternatives = weigh_alternatives
        self.exprs: list = []
        self.resharded: dict = {}  # (tv, the target state's numbers) -> the tensor holding tv in that layout
        self.plans: dict = {}  # ComputePlan by question: stacked layers compute alike
        # A question names each tensor's signature, each mesh and each layout
        # by a small number (the first time one is seen), so that hashing and
        # comparing a question reads a few ints, not nested tuples.
        self.layout_key_numbers: dict = {}  # a layout key -> its number
        self.codes: dict = {}  # tv -> (its state, its code in that state) (_tensor_code)
        self.layout_keys: dict = {}  # id(layout) -> (layout, its number) (reshard.layout_number)
        self.meshes = LastNumbered({})  # a mesh -> its number

    def run(self) -> None:
        program, exprs = self.program, self.exprs
        for expr in program.exprs:
            if not expr.tv_outputs or self._in_place(expr):
                exprs.append(expr)
                continue
            compute = self._compute_plan(expr, [program.state[o] for o in expr.tv_outputs],
                                         [program.state[v] for v in expr.tv_inputs])
            operands = iter(compute.operands)
            inputs = [self._reshard(v, next(operands)) if isinstance(v, TensorView) else v for v in expr.inputs]
            outputs, after = [], []
            for i, out in enumerate(expr.tv_outputs):
                produced = compute.results[i]
                final = resolved(out, program.state[out])
                steps = [] if same_state(produced, final) else plan_reshard(out, produced, final, self.numel)
                program.state[out] = final
                if not steps:
                    outputs.append(out)
                    continue
                partial = program.new_tv_like(out, produced)
                outputs.append(partial)
                after.append((partial, steps, out))
            if inputs == expr.inputs and outputs == expr.outputs:
                exprs.append(expr)
            else:
                exprs.append(expr.rewired(inputs, outputs))
            for partial, steps, out in after:
                self._emit(partial, steps, into=out)
        program.exprs = exprs
        program.index()

    def _emit(self, tv: TensorView, steps: list, into: TensorView = None) -> TensorView:
        program = self.program
        cur = tv
        for n, step in enumerate(steps):
            last = n == len(steps) - 1
            nxt = into if (last and into is not None) else program.new_tv_like(tv, step.after)
            program.state[nxt] = step.after
            self.exprs.append(_communication(step, cur, nxt))
            cur = nxt
        return cur

    def _in_place(self, expr) -> bool:
        """Whether expr computes where its tensors already are, with nothing
        to ask plan_compute: its factors pass through (projection.
        pass_through_axes), its tensors share one mesh, and every factor
        has one layout on every axis that names it (the results' way, which
        plan_compute starts from), other axes whole. That way reshards
        nothing before or after the expr, so no alternative moves fewer
        bytes. (Most exprs of a big fusion: elementwise ops, broadcasts and
        permutes inside one sharding.)"""
        rule = self.program.rule(expr)
        axes = pass_through_axes(expr, rule)
        if axes is None:
            return False
        state = self.program.state
        outputs, inputs = expr.tv_outputs, expr.tv_inputs
        mesh = state[outputs[0]].mesh
        if mesh is None:
            return False
        per_factor = [None] * len(rule.factors)  # each factor's layout, as the results say (None: no result says)
        for i in range(len(outputs)):  # (index loops: compiled, the states typed)
            if not _agrees(state[outputs[i]], axes[1][i], mesh, per_factor, True):
                return False
        for i in range(len(inputs)):
            if not _agrees(state[inputs[i]], axes[0][i], mesh, per_factor, False):
                return False
        return True

    def _reshard(self, tv: TensorView, target: TvState) -> TensorView:
        state = self.program.state[tv]
        if same_state(state, target):
            return tv
        named = [tv]  # (tv, then the target state as questions name it: _add_state)
        self._add_state(named, target)
        key = tuple(named)
        resharded = self.resharded.get(key)
        if resharded is None:
            steps = plan_reshard(tv, state, target, self.numel)
            resharded = self.resharded[key] = self._emit(tv, steps) if steps else tv
        return resharded

    def _price(self, tv, src, dst) -> float:
        return reshard_bytes(tv, src, dst, self.numel)

    def _compute_plan(self, expr, results: list, operands: list):
        """plan_compute, kept by all it reads: the rule, which tensors are the
        same, their signatures, and the states (plans are never changed).
        The question is one flat tuple of ints (hashed and compared without
        a tuple per state): the head's number, then per operand and per
        result its code (_tensor_code)."""
        rule = self.program.rule(expr)
        question = [question_head_number(expr, rule)]
        inputs, outputs = expr.tv_inputs, expr.tv_outputs
        for i in range(len(operands)):  # (an index loop: compiled, no iterator)
            question.extend(self._tensor_code(inputs[i], operands[i]))
        for i in range(len(results)):
            question.extend(self._tensor_code(outputs[i], results[i]))
        key = tuple(question)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = plan_compute(expr, results, rule, operands,
                                                  self._price if self.weigh_alternatives else None)
        return plan

    def _tensor_code(self, tv, state: TvState) -> tuple:
        """What a question says of tv in `state`: what plan_compute reads of
        tv besides its state (its signature's number and whether it has an
        annotated pending sum, as one int), then the state's numbers
        (_add_state). Kept while tv's state is that object: a tensor is a
        result once and an operand of each consumer, mostly in the state it
        was produced in (projection.resolved returns that state itself)."""
        known = self.codes.get(tv)
        if known is not None and known[0] is state:
            return known[1]
        code = [2 * self.numel.signature_number(tv) + annotated_sum(tv)]
        self._add_state(code, state)
        known = self.codes[tv] = (state, tuple(code))
        return known[1]

    def _add_state(self, question: list, state: TvState) -> None:
        """Appends the state's mesh number, rank and each layout's number
        (-1: replicated) to a question."""
        mesh = state.mesh
        question.append(-1 if mesh is None else self.meshes.number(mesh))
        layouts = state.layouts
        question.append(len(layouts))
        for i in range(len(layouts)):
            question.append(layout_number(layouts[i], self.layout_keys, self.layout_key_numbers))


def _agrees(state: TvState, named: list, mesh, per_factor: list, result: bool) -> bool:
    """Whether a tensor's state is on `mesh`, whole on the axes that name no
    factor (named[k] < 0), and on every other axis in its factor's layout
    in per_factor. A result sets the layout of a factor no result has
    named yet; an operand's factor no result names must be whole."""
    if state.mesh is not mesh and state.mesh != mesh:
        return False
    layouts = state.layouts
    if len(layouts) != len(named):
        return False
    for k in range(len(named)):
        digits = layouts[k]
        if digits is None:
            return False  # (an open axis: propagation leaves none; asking decides)
        f = named[k]
        if f < 0:
            if digits:
                return False
            continue
        expected = per_factor[f]
        if expected is None:
            if result:
                per_factor[f] = digits
                continue
            expected = ()
        if not layout.same(digits, expected):
            return False
    return True


def _communication(step, src: TensorView, dst: TensorView) -> Expr:
    return Expr(COMMUNICATIONS[step.kind], [src], [dst], {"step": step})
