"""nvFuser's current propagation, for comparison (NVSHARD_PROPAGATION=legacy).

One forward sweep in definition order: each expr copies device splits to
its results from its operands in a fixed order (the op rule's
legacy_reference_order: linear takes weight, bias, input; matmul the second
operand first; otherwise most-sharded operand first); the first source to
claim a mesh axis wins, and annotated tensors never change. Then one
backward sweep copies mesh axes a result has and its operand lacks. Mesh
axes on reduction axes (pending sums) do not count as claimed. An axis
that merges factors (a reshape's [h, d] -> [h*d]) takes the outermost
factor's split when only that one is sharded. Broadcast axes are never
sharded (their rules name no factor).
"""

from __future__ import annotations

from ..multidevice import layout
from .program import Program, TvState


class LegacyPropagation:
    def __init__(self, program: Program, log):
        self.p = program
        self.log = log
        self.user = {tv for tv in program.state if tv.mesh is not None}

    def _claimed(self, tv) -> set:
        state = self.p.state[tv]
        return state.used(tv)

    def _copy(self, expr, ref, target, direction: str) -> None:
        """Copy ref's device splits onto target through the expr's factors,
        one mesh axis at a time, skipping mesh axes target already has."""
        rule = self.p.rule(expr)
        ref_axes = self._axes(expr, ref, rule)
        tgt_axes = self._axes(expr, target, rule)
        ref_state, tgt_state = self.p.state[ref], self.p.state[target]
        if ref_state.mesh is None:
            return
        if tgt_state.mesh is None:
            tgt_state.mesh = ref_state.mesh
        if tgt_state.mesh != ref_state.mesh:
            return
        sizes = ref_state.mesh.axis_sizes()
        by_factor = {}
        for k, factors in ref_axes:
            digits = ref_state.layouts[k]
            if not digits:
                continue
            per = layout.split_layout(digits, [rule.factors[f].extent for f in factors], sizes)
            for f, d in zip(factors, per or []):
                if d:
                    by_factor[f] = d
        claimed = self._claimed(target)
        for k, factors in tgt_axes:
            if factors[0] not in by_factor or tgt_state.layouts[k]:
                continue
            if len(factors) == 1:
                digits = by_factor[factors[0]]
            elif not any(f in by_factor for f in factors[1:]):
                # an axis merging factors (a reshape [.., h, d] -> [.., h*d]) takes the
                # outermost factor's device split, as nvFuser's transform replay does
                digits = layout.join_layouts([by_factor[factors[0]]] + [()] * (len(factors) - 1),
                                             [rule.factors[f].extent for f in factors])
            else:
                continue
            is_red = target.logical[k].is_reduction()
            if not is_red and set(layout.mesh_axes_of(digits)) & claimed:
                continue
            if is_red and set(layout.mesh_axes_of(digits)) & set(tgt_state.pending(target)):
                continue
            tgt_state.layouts[k] = digits
            if not is_red:
                claimed |= set(layout.mesh_axes_of(digits))
            self.log.decide(target, k, digits, f"legacy {direction} copy through {expr.op.name} from {ref.short_name()}",
                            0, "legacy")

    @staticmethod
    def _axes(expr, tv, rule):
        if tv in expr.tv_outputs:
            return [(k, f) for k, f in enumerate(rule.results[expr.tv_outputs.index(tv)]) if f]
        i = expr.tv_inputs.index(tv)
        return [(k, f) for k, f in zip(tv.non_reduction_axes(), rule.operands[i]) if f]

    def _num_device_axes(self, tv) -> int:
        return len(self._claimed(tv))

    def run(self) -> None:
        # This pass changes states in place: each tensor gets its own first
        # (the program shares one replicated state among unplaced tensors).
        for tv, state in self.p.state.items():
            self.p.state[tv] = TvState(state.mesh, list(state.layouts))
        for expr in self.p.exprs:
            if not expr.tv_outputs:
                continue
            order = expr.op.legacy_reference_order(expr)
            refs = [expr.tv_inputs[i] for i in order if i < len(expr.tv_inputs)] if order else sorted(
                expr.tv_inputs, key=lambda t: -self._num_device_axes(t))
            for ref in refs:
                for out in expr.tv_outputs:
                    if out not in self.user:
                        self._copy(expr, ref, out, "forward")
        for expr in reversed(self.p.exprs):
            if not expr.tv_outputs:
                continue
            ref = sorted(expr.tv_outputs, key=lambda t: -self._num_device_axes(t))[0]
            for inp in expr.tv_inputs:
                if inp in self.user or inp in self.p.input_set:
                    continue
                self._copy(expr, ref, inp, "backward")
        mesh_of = {tv: state.mesh for tv, state in self.p.state.items()}
        self.p.fill_meshes(mesh_of, self.user | self.p.input_set)
        for tv, mesh in mesh_of.items():
            self.p.state[tv].mesh = mesh
