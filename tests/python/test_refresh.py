"""The engine's refresh after a decision (nvshard/preseg/engine.py): an
adjacent expr re-derives only the proposals of targets on the factors the
decided axis carries, and the release re-derives only the exprs it held
back. Both are shortcuts, not new policies: on random programs the sharding
and the whole decision log equal a full re-derivation's (for the release,
random programs never hold back anything that matters: the matmul example
does, and tools/plan_census.py compares 3,000 programs)."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, NvShardError
from nvshard.preseg.cost import CostModel
from nvshard.preseg.engine import Engine, TensorEntry, _expr_structure, _in_number_order
from nvshard.preseg.log import DecisionLog
from nvshard.preseg.pipeline import _sizes
from nvshard.preseg.program import Program

from fusion_strategies import FusionCase, fusions

PT = nvfuser.ParallelType


class _CountingEngine(Engine):
    """Records (expr, tensor, axis) per target derivation."""

    def _target_proposals(self, i, s, expr, *rest):
        self.derived.append((expr, s.tv, s.axis))
        return super()._target_proposals(i, s, expr, *rest)

    def _held_back_exprs(self):
        exprs = super()._held_back_exprs()
        self.released.append(exprs)
        return exprs


class _ReleasingEveryContraction(_CountingEngine):
    """The reference for the release: it re-derives every expr with a
    contraction factor, held back or not."""

    def _held_back_exprs(self):
        exprs = [e for e in self.proposals if _expr_structure(e, self.p.rule(e))[2]]
        self.released.append(exprs)
        return exprs


def _run(fd, shapes, refresh_by_factor: bool, engine_class=_CountingEngine):
    """(every tensor's final sharding, the log text, (expr, tensor, axis) per
    target derivation, the exprs each release re-derived, every expr's last
    proposals)."""
    sizes = _sizes(fd.fusion, shapes, None)
    program = Program(fd.fusion, sizes)
    log = DecisionLog()
    engine = engine_class(program, CostModel(program, sizes), log, refresh_by_factor=refresh_by_factor)
    engine.derived, engine.released = [], []
    engine.run()
    proposals = [(repr(e), [(p.tv.number, p.axis, p.key, p.priority, p.stage, p.source.number, p.direction, p.reduction)
                            for p in props]) for e, props in engine.proposals.items()]
    return ([program.state[tv].key() for tv in fd.fusion.tvs()], log.text(), engine.derived, engine.released,
            proposals)


def _mlp(layers: int):
    """Residual MLP blocks, rows of x and the weights' hidden axis on one mesh axis."""
    t, h = 16, 8
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([t, h], dtype=DataType.Float)
        annotated, shapes = [(x, 0)], [[t, h]]
        for _ in range(layers):
            up = fd.define_tensor([4 * h, h], dtype=DataType.Float)
            down = fd.define_tensor([h, 4 * h], dtype=DataType.Float)
            annotated += [(up, 0), (down, 1)]
            shapes += [[4 * h, h], [h, 4 * h]]
            x = fd.ops.add(fd.ops.linear(fd.ops.relu(fd.ops.linear(x, up)), down), x)
        fd.add_output(x)
        for tv, axis in annotated:
            tv.set_device_mesh(mesh)
            tv.outer_split(axis, 2)
            tv.axis(axis).parallelize(PT.mesh_x)
    return fd, shapes


def test_a_decision_re_derives_only_the_targets_on_its_factors():
    """Two MLP blocks: each linear's target axes are derived together at
    first; later, a decision on a result's columns leaves the proposals for
    its rows standing. (A tensor whose mesh axes are all taken is no
    target on its iteration axes: see the next test.)"""
    fd, shapes = _mlp(2)
    by_factor, text, derived, released, _ = _run(fd, shapes, True)
    full, full_text, full_derived, _, _ = _run(fd, shapes, False)
    assert by_factor == full and text == full_text
    assert "conflict at" in text and "pending sum" in text
    # (the release re-derives nothing: every operand had decided before it)
    assert released == [[]]
    assert (len(derived), len(full_derived)) == (33, 35)
    # the first round derives everything in both
    assert derived[:22] == full_derived[:22]


def test_entries_by_number_are_the_entries_by_tensor():
    """The engine's hot paths find a tensor's entry by its number (a list
    index): every tensor's slot holds that tensor's entry, and two tensors
    with one number are refused by name rather than sharing an entry."""
    fd, shapes = _mlp(2)
    sizes = _sizes(fd.fusion, shapes, None)
    program = Program(fd.fusion, sizes)
    engine = Engine(program, CostModel(program, sizes), DecisionLog())
    assert len(engine.entries) == len(program.state) > 0
    for tv, entry in engine.entries.items():
        assert entry.tv is tv and engine.by_number[tv.number] is entry
    a, b = fd.fusion.tvs()[1:3]
    b.number = a.number
    program = Program(fd.fusion, sizes)
    with pytest.raises(NvShardError, match=f"{b.short_name()} shares its number with {a.short_name()}"):
        Engine(program, CostModel(program, sizes), DecisionLog())


def test_adjacent_positions_index_the_programs_own_exprs():
    """A refresh after a change finds each adjacent expr's entry by its
    position in the program, kept with the fusion's structure while the
    program's exprs are the fusion's (_kept_with_fusion). A program whose
    exprs are in another order gets a structure of its own: the positions
    index its exprs, and it plans as the fusion's order does."""
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(2))
    with FusionDefinition() as fd:
        x = fd.define_tensor([16, 8], dtype=DataType.Float)
        y = fd.define_tensor([16, 8], dtype=DataType.Float)
        fd.add_output(fd.ops.add(fd.ops.relu(x), fd.ops.neg(y)))
        x.set_device_mesh(mesh)
        x.outer_split(0, 2)
        x.axis(0).parallelize(PT.mesh_x)
    shapes = [[16, 8], [16, 8]]
    sizes = _sizes(fd.fusion, shapes, None)
    kept = Engine(Program(fd.fusion, sizes), CostModel(Program(fd.fusion, sizes), sizes), DecisionLog())
    program = Program(fd.fusion, sizes)
    first, second = program.exprs[0], program.exprs[1]
    assert (first.op.name, second.op.name) == ("relu", "neg")  # (independent: either order is valid)
    program.exprs[0], program.exprs[1] = second, first
    engine = Engine(program, CostModel(program, sizes), DecisionLog())
    assert engine.tensor_structure is not kept.tensor_structure
    for t in engine.in_order:
        assert [program.exprs[k] for k in t.adjacent_at] == t.adjacent
    engine.run()
    reference = Program(fd.fusion, sizes)
    Engine(reference, CostModel(reference, sizes), DecisionLog()).run()
    assert {tv: (s.mesh, s.layouts) for tv, s in program.state.items()} == \
        {tv: (s.mesh, s.layouts) for tv, s in reference.state.items()}


class _NotingClosedTargets(_CountingEngine):
    """Records the target derivations on an iteration axis of a tensor every
    mesh axis of whose mesh is already taken."""

    def _target_proposals(self, i, s, expr, *rest):
        if not s.reduction and self._closed(self.entries[s.tv]):
            self.closed_targets.append((expr, s.tv, s.axis))
        return super()._target_proposals(i, s, expr, *rest)


def test_a_tensor_with_every_mesh_axis_taken_is_no_target_on_its_iteration_axes():
    """Two MLP blocks on a 1-D mesh: once a linear's result has its rows on
    the mesh axis, a weight's opinion on its columns could only propose a
    layout no device can hold (it would need the same mesh axis): the
    engine derives no proposal there (tools/plan_census.py: all 3,074
    plans and logs as when it did)."""
    fd, shapes = _mlp(2)
    for refresh_by_factor in (True, False):
        sizes = _sizes(fd.fusion, shapes, None)
        program = Program(fd.fusion, sizes)
        engine = _NotingClosedTargets(program, CostModel(program, sizes), DecisionLog(),
                                      refresh_by_factor=refresh_by_factor)
        engine.derived, engine.released, engine.closed_targets = [], [], []
        engine.run()
        assert engine.closed_targets == []
        assert engine.derived  # (targets were derived: the check above saw them)


def test_the_release_re_derives_the_contraction_it_held_back():
    """r = a @ relu(c) on a 2x2 mesh, a's k and c's n annotated on DIDx: the
    pending sum over k waits for relu(c)'s k axis, which can never take DIDx
    (its n axis holds it) and stays open. The release re-derives the matmul
    (nothing else) and its pending sum on DIDx wins on bytes, as when every
    contraction is re-derived; without the release, a would be gathered."""
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(4).reshape(2, 2))
    with FusionDefinition() as fd:
        a = fd.define_tensor([64, 16], dtype=DataType.Float)
        c = fd.define_tensor([16, 8], dtype=DataType.Float)
        r = fd.ops.matmul(a, fd.ops.relu(c))
        fd.add_output(r)
        for tv in (a, c):
            tv.set_device_mesh(mesh)
            tv.outer_split(1, 2)
            tv.axis(1).parallelize(PT.mesh_x)
    shapes = [[64, 16], [16, 8]]
    state, text, _, released, proposals = _run(fd, shapes, True)
    matmul = fd.fusion.exprs[-1]
    assert matmul.op.name == "matmul" and released == [[matmul]]
    assert "T3 pending sum on reduction axis 2 <- DIDx: forward through matmul (factor k) from T0" in text
    reference = _run(fd, shapes, True, _ReleasingEveryContraction)
    assert (state, text, proposals) == (reference[0], reference[1], reference[4])


@settings(max_examples=200, derandomize=True, deadline=None, database=None, print_blob=False,
          suppress_health_check=list(HealthCheck))
@given(fusions(max_ops=10, meshes_max=2))
def test_refresh_by_factor_decides_and_logs_as_a_full_refresh(case: FusionCase):
    fd, _ = case.build()
    shapes = case.input_shapes()
    by_factor, text, _, _, _ = _run(fd, shapes, True)
    full, full_text, _, _, _ = _run(fd, shapes, False)
    assert by_factor == full
    assert text == full_text


@given(st.lists(st.integers(0, 10**6), unique=True, max_size=40))
def test_decided_tensors_are_visited_in_number_order(numbers):
    """_after_change visits the tensors a step decided in number order (every
    rank must refresh alike): by insertion up to 16 of them, by list.sort past."""
    entries = []
    for n in numbers:
        t = TensorEntry.__new__(TensorEntry)
        t.number = n
        entries.append(t)
    assert [t.number for t in _in_number_order(entries)] == sorted(numbers)

