"""Conflict costs are remembered by their question (conflicts.py): a conflict
met again in another layer must cost, and be explained, exactly as when it
is priced afresh."""

import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition, models
from nvshard.preseg import engine
from nvshard.preseg.conflicts import ConflictResolver

P = nvfuser.ParallelType


def _mlp_stack(layers: list, t=64, h=16, d=4):
    """Residual sequence-parallel MLP blocks, x = x + down(gelu(up(x))), one
    per (weights' dtype, weights sharded?) in `layers`. Alike layers meet
    the same conflicts; unlike ones meet conflicts alike in shape but not in
    dtypes or shardings, which must not share answers."""
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([t, h], dtype=DataType.Float, contiguity=True)
        shapes = [[t, h]]
        annotated = [(x, 0)]
        for dtype, sharded in layers:
            up_w = fd.define_tensor([4 * h, h], dtype=dtype, contiguity=True)
            down_w = fd.define_tensor([h, 4 * h], dtype=dtype, contiguity=True)
            shapes += [[4 * h, h], [h, 4 * h]]
            for w, axis in ((up_w, 0), (down_w, 1)):
                w.set_device_mesh(mesh)
                if sharded:
                    annotated.append((w, axis))
            up = fd.ops.linear(fd.ops.cast(x, dtype), up_w)
            down = fd.ops.linear(models.gelu_tanh(fd, up), down_w)
            x = fd.ops.add(fd.ops.cast(down, DataType.Float), x)
        for tv, axis in annotated:
            tv.set_device_mesh(mesh)
            tv.outer_split(axis, d)
            tv.axis(axis).parallelize(P.mesh_x)
        fd.add_output(x)
    return fd, shapes


def _explained(fd, shapes) -> str:
    plan = nvfuser.propagate_shardings(fd, shapes)
    return plan.log.text() + "\n" + plan.report()


def _asked_and_explained(monkeypatch, fd, shapes, remember: bool):
    asked = []

    # A subclass, not a patched method: compiled, ConflictResolver is an
    # extension type (its methods cannot be replaced, only overridden).
    class Asking(ConflictResolver):
        def _question(self, tv, kind, lists):
            key, tensors, sharing = ConflictResolver._question(self, tv, kind, lists)
            asked.append(key)
            return (key if remember else object()), tensors, sharing

    monkeypatch.setattr(engine, "ConflictResolver", Asking)
    return asked, _explained(fd, shapes)


def test_a_repeated_conflict_costs_what_a_fresh_one_does(monkeypatch):
    fd, shapes = _mlp_stack([(DataType.Float, True)] * 4)
    asked, remembered = _asked_and_explained(monkeypatch, fd, shapes, remember=True)
    # 4 layers x 3 conflicts, 3 distinct questions: 9 answered from memory
    assert len(asked) == 12 and len(set(asked)) == 3
    assert remembered.count("conflict at") == 12 and "allgather" in remembered
    assert remembered == _asked_and_explained(monkeypatch, fd, shapes, remember=False)[1]


def test_conflicts_alike_in_shape_only_are_priced_apart(monkeypatch):
    """Layers alike but for a dtype or their weights' sharding: a question
    that left the tensors' signatures out would answer a bf16 layer with an
    f32 layer's costs (tried: this test fails)."""
    f32, bf16 = DataType.Float, DataType.BFloat16
    fd, shapes = _mlp_stack([(f32, True), (bf16, True), (f32, False), (f32, True), (bf16, True), (f32, False),
                             (f32, True)])
    asked, remembered = _asked_and_explained(monkeypatch, fd, shapes, remember=True)
    assert len(set(asked)) < len(asked)
    assert remembered == _asked_and_explained(monkeypatch, fd, shapes, remember=False)[1]


def test_remembered_signatures_are_numel_models():
    """The cost model reads each shared extent once per plan for its
    signatures; they must equal NumelModel.signature's (both key the reshard
    plans every plan shares), for concrete and symbolic sizes, broadcast
    axes (the triangle update's mask and norms) and reduction axes alike."""
    from nvshard.models import Direction
    from nvshard.preseg.cost import CostModel
    from nvshard.preseg.pipeline import _sizes
    from nvshard.preseg.program import Program
    from nvshard.preseg.reshard import NumelModel

    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(4).reshape(1, 2, 2))
    with FusionDefinition() as triangle:
        inputs, _ = models.triangle_update(triangle, Direction.OUTGOING, 16, DataType.Float)
        models.annotate_triangle(inputs, mesh, 1, 2)
    cases = [(triangle, models.triangle_shapes(2, 8, 16)),
             _mlp_stack([(DataType.BFloat16, True), (DataType.Float, False)])]
    checked = set()
    for fd, shapes in cases:
        for sizes in (_sizes(fd.fusion, shapes, None), None):
            program = Program(fd.fusion, sizes)
            numel = CostModel(program, sizes).numel
            for tv in program.state:
                assert numel.signature(tv) == NumelModel.signature(numel, tv), tv.short_name()
                checked |= {(id_.is_broadcast(), id_.is_reduction(), sizes is None) for id_ in tv.logical}
    assert checked == {(b, r, s) for b in (False, True) for r in (False, True) for s in (False, True)} - \
        {(True, True, False), (True, True, True)}


def test_tensors_of_one_shape_share_signatures_in_every_plan():
    """Signatures are built once per shape (cost._shape_number: item size,
    canonical extents, kinds of axis), and the shapes are kept with the
    fusion from plan to plan. Under every set of sizes, two tensors must get
    the same signature number exactly when their signatures are equal: the
    triangle update's b, i, j are symbolic, so i == j in one plan and not in
    the next, and with no sizes at all they are estimates."""
    from nvshard.preseg.cost import CostModel
    from nvshard.preseg.pipeline import _sizes
    from nvshard.preseg.program import Program
    from nvshard.preseg.reshard import NumelModel

    fd, _ = _triangle()
    kept = None
    for shapes in (models.triangle_shapes(2, 8, 16), models.triangle_shapes(2, 4, 16), None):
        sizes = None if shapes is None else _sizes(fd.fusion, shapes, None)
        program = Program(fd.fusion, sizes)
        numel = CostModel(program, sizes).numel
        kept = kept or numel._shapes
        assert numel._shapes is kept  # the same shapes, kept with the fusion
        tensors = list(program.state)
        fresh = [NumelModel.signature(numel, tv) for tv in tensors]
        numbers = [numel.signature_number(tv) for tv in tensors]
        for a in range(len(tensors)):
            for b in range(len(tensors)):
                assert (numbers[a] == numbers[b]) == (fresh[a] == fresh[b]), (tensors[a], tensors[b], shapes)
    by_tensor, table = kept
    assert len(by_tensor) == len(tensors) and len(table) < len(tensors) / 2


def _triangle():
    from nvshard.models import Direction

    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(4).reshape(1, 2, 2))
    with FusionDefinition() as fd:
        inputs, _ = models.triangle_update(fd, Direction.OUTGOING, 16, DataType.Float)
        models.annotate_triangle(inputs, mesh, 1, 2)
    return fd, models.triangle_shapes(2, 8, 16)


def test_reshard_plan_keys_number_what_they_read():
    """plan_key names a signature and each layout by a number: two keys are
    equal exactly when (signature, src.key(), dst.key()) are, over every
    pair of states the triangle update's plan holds, on each tensor."""
    from nvshard.preseg.pipeline import _sizes
    from nvshard.preseg.program import Program, TvState
    from nvshard.preseg.reshard import NumelModel, plan_key

    fd, shapes = _triangle()
    plan = nvfuser.propagate_shardings(fd, shapes)
    states = list({s.key(): s for s in plan.program.state.values()}.values())
    states += [TvState(s.mesh, [None if k % 2 else d for k, d in enumerate(s.layouts)]) for s in states]
    numel = NumelModel(lambda tv, k: 8.0)
    tensors = list(Program(fd.fusion, _sizes(fd.fusion, shapes, None)).state)
    full = {}
    for tv in tensors:
        for a in states:
            for b in states:
                if len(a.layouts) == len(b.layouts) == len(tv.logical):
                    full.setdefault((numel.signature(tv), a.key(), b.key()), set()).add(plan_key(tv, a, b, numel))
    assert len(full) > 100
    assert all(len(keys) == 1 for keys in full.values())  # equal full keys, one numbered key
    assert len({k for keys in full.values() for k in keys}) == len(full)  # and no two full keys share one


def test_reshard_plans_forgotten_mid_plan_plan_the_same(monkeypatch):
    """With the process's shared reshard plans forgotten every few plans (and
    the numbers their keys are made of), the plans and logs are unchanged:
    a key made of old numbers never meets a new one (tried without the
    generation check, this test fails)."""
    from nvshard.preseg import reshard

    cases = [_triangle(), _mlp_stack([(DataType.Float, True), (DataType.BFloat16, True), (DataType.Float, False)])]
    expected = [_explained(fd, shapes) for fd, shapes in cases]
    monkeypatch.setattr(reshard, "_SHARED_PLANS_LIMIT", 3)
    before = reshard._numbers_generation
    assert [_explained(fd, shapes) for fd, shapes in cases] == expected
    assert reshard._numbers_generation > before + 3


def test_question_numbers_name_what_they_stand_for():
    """The cost model's questions name layouts and signatures by numbers:
    two layouts (or tensors) share a number exactly when their keys (or
    signatures) are equal, whether or not they are one object; replicated
    is -1."""
    from nvshard.multidevice import layout
    from nvshard.preseg.cost import CostModel
    from nvshard.preseg.pipeline import _sizes
    from nvshard.preseg.program import Program

    fd, shapes = _triangle()
    plan = nvfuser.propagate_shardings(fd, shapes)
    program = Program(fd.fusion, _sizes(fd.fusion, shapes, None))
    model = CostModel(program, program.sizes)
    layouts = [d for s in plan.program.state.values() for d in s.layouts]
    copies = [tuple(list(d)) for d in layouts if d]  # equal layouts, other objects
    assert all(copy is not d for copy, d in zip(copies, [d for d in layouts if d]))
    layouts += copies
    by_key = {}
    for d in layouts:
        if d:
            by_key.setdefault(layout.key(d), set()).add(model.layout_number(d))
        else:
            assert model.layout_number(d) == -1
    assert len(by_key) > 2 and all(len(numbers) == 1 for numbers in by_key.values())
    assert len({n for numbers in by_key.values() for n in numbers}) == len(by_key)
    # the cost model's signatures and the element-count model's (which the
    # cost model's numbers are made of, and the decomposition reads), each
    # numbered one to one with its signatures
    for signature, number in ((model.signature, model.signature_number),
                              (model.numel.signature, model.numel.signature_number)):
        by_signature = {}
        for tv in program.state:
            by_signature.setdefault(signature(tv), set()).add(number(tv))
        assert len(by_signature) > 2 and all(len(numbers) == 1 for numbers in by_signature.values())
        assert len({n for numbers in by_signature.values() for n in numbers}) == len(by_signature)


def test_a_kept_cost_is_renamed_onto_other_tensors():
    """A cost kept for a question names its steps' tensors by place; renamed
    onto another layer's tensors it describes their moves, notes included."""
    from nvshard.preseg.cost import Cost
    from nvshard.preseg.reshard import Step

    fd, _ = _mlp_stack([(DataType.Float, True), (DataType.Float, True)])
    a, b, c, d = fd.fusion.tvs()[1:5]
    gather = Step("allgather", "x", 0, None, None, None, 1024.0)
    cost = Cost(0.0, 2048.0, False, [(b, "", gather), (a, "", gather)]).scaled(0.5, "shared by 2 consumers")
    kept = cost.unnamed([a, b])
    assert [(place, note) for place, note, _ in kept.steps] == [(1, "(shared by 2 consumers)"),
                                                                (0, "(shared by 2 consumers)")]

    def described(first, second) -> str:
        return (f"1.00 KiB: allgather {first.short_name()} (shared by 2 consumers) over DIDx 1.00 KiB; "
                f"allgather {second.short_name()} (shared by 2 consumers) over DIDx 1.00 KiB")

    assert cost.describe() == described(b, a)
    assert kept.renamed([c, d]).describe() == described(d, c)


def test_remembered_completions_cost_what_fresh_ones_do(monkeypatch):
    """The cost model remembers each completion's cost and each expr's
    operand plans (cost.py): on the triangle update the conflict after the
    pending sum's weighing asks about completions the weighing priced.
    Remembered or priced afresh, the plan and its explanation are the same,
    and the remembered answers were used."""
    from nvshard.preseg import pipeline
    from nvshard.preseg.cost import CostModel

    asked = []

    class Fresh(CostModel):  # (an extension type's cpdef methods are overridden, not patched)
        def _completion_cost(self, expr, actuals, outs, shared, operands, alternatives):
            asked.append((operands, tuple([outs[o].key() for o in expr.tv_outputs])))
            return self._run_cost(expr, actuals, outs, shared, None)

    fd, shapes = _triangle()
    remembered = _explained(fd, shapes)
    monkeypatch.setattr(pipeline, "CostModel", Fresh)
    fd, shapes = _triangle()
    assert _explained(fd, shapes) == remembered
    assert "pending sum" in remembered
    # a completion asked twice (same expr, operands and results): a remembered answer served one
    assert len(asked) > len(set(asked))


def _two_projections(d=4, h=16, n=32):
    """x (tokens symbolic) projected twice, alike in shape: by an input
    weight w (static extents: a weight under symbolic sizes) and by relu(v),
    which is not one; each result reshaped. The two conflicts' structures
    agree but for the weight."""
    mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, h], dtype=DataType.Float, contiguity=True)
        w = fd.define_tensor([n, h], dtype=DataType.Float, contiguity=True)
        v = fd.define_tensor([n, h], dtype=DataType.Float, contiguity=True)
        for a, weight in ((fd.ops.relu(x), w), (fd.ops.neg(x), fd.ops.relu(v))):
            fd.add_output(fd.ops.relu(fd.ops.reshape(fd.ops.linear(a, weight), new_shape=[-1, 4])))
        for tv in (x, w, v):
            tv.set_device_mesh(mesh)
            tv.outer_split(0, d)
            tv.axis(0).parallelize(P.mesh_x)
    return fd, [[64, h], [n, h], [n, h]]


def test_kept_neighbourhoods_name_this_plans_signatures(monkeypatch):
    """A conflict's question names its neighbourhood's structure from what
    is kept with the fusion (places, shapes, the rules that never change)
    and the rest per plan (weights and annotated sums, rules that read
    sizes). Replanning one fusion at concrete and symbolic sizes, any two
    conflicts of a plan whose neighbourhood parts are equal must have
    equal signatures and rules place by place (the weight flag kept from
    the first plan fails this: under symbolic sizes the two projections'
    parts would be equal, their signatures not)."""
    from nvshard.preseg.projection import question_head

    seen = []  # per plan: [(neighbourhood part, signatures, rule heads)]

    class Watching(ConflictResolver):
        def _neighbourhood(self, tv):
            known = ConflictResolver._neighbourhood(self, tv)
            tensors, part, _ = known
            rules = [question_head(e, self.engine.p.rule(e)) for e in self.engine.entries[tv].adjacent]
            seen[-1].append((part, [self.cost.signature(t) for t in tensors], rules))
            return known

    monkeypatch.setattr(engine, "ConflictResolver", Watching)
    fd, shapes = _two_projections()
    alike = 0
    for sizes in (shapes, None, shapes, None):
        seen.append([])
        nvfuser.propagate_shardings(fd, sizes)
        for i, (part, signatures, rules) in enumerate(seen[-1]):
            for other, other_signatures, other_rules in seen[-1][i + 1:]:
                if part == other:
                    alike += 1
                    assert (signatures, rules) == (other_signatures, other_rules)
    assert [len(plan) for plan in seen] == [2, 2, 2, 2]
    assert alike == 2  # the concrete plans' two conflicts; the symbolic plans' differ by the weight
