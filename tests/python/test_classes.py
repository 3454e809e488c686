"""Pass-through classes (nvshard/preseg/classes.py): which axes are grouped,
that a class takes a sharding in one spread with no expr proposing inside
it, that a spread stops where another sharding competes, and that on
random programs the spread decides what proposals alone would."""

import torch
from hypothesis import HealthCheck, given, settings

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition
from nvshard.preseg.cost import CostModel
from nvshard.preseg.engine import Engine
from nvshard.preseg.log import DecisionLog
from nvshard.preseg.pipeline import _sizes, build_plan
from nvshard.preseg.program import Program

from fusion_strategies import FusionCase, fusions

PT = nvfuser.ParallelType


def _mesh(n):
    return nvfuser.multidevice.DeviceMesh(torch.arange(n))


def _shard(tv, axis, mesh, parallel_type=PT.mesh_x):
    tv.set_device_mesh(mesh)
    tv.outer_split(axis, mesh.size)
    tv.axis(axis).parallelize(parallel_type)


def _engine(fd, shapes):
    sizes = _sizes(fd.fusion, shapes, None)
    program = Program(fd.fusion, sizes)
    engine = Engine(program, CostModel(program, sizes), DecisionLog())
    engine.run()
    return engine


def _chain(length):
    """x (annotated) -> relu -> neg -> ... -> linear(W) -> add 1."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 16], dtype=DataType.Float)
        w = fd.define_tensor([4, 16], dtype=DataType.Float)
        chain = [x]
        for i in range(length):
            chain.append((fd.ops.relu if i % 2 == 0 else fd.ops.neg)(chain[-1]))
        out = fd.ops.linear(chain[-1], w)
        after = fd.ops.add(out, 1.0)
        fd.add_output(after)
        _shard(x, 0, _mesh(2))
    return fd, chain, out, after


def test_pass_through_axes_form_one_class_and_contractions_separate_them():
    fd, chain, out, after = _chain(4)
    classes = _engine(fd, [[8, 16], [4, 16]]).classes
    rows = {classes.class_of(tv, 0) for tv in chain[1:]}
    columns = {classes.class_of(tv, 1) for tv in chain[1:]}
    assert len(rows) == 1 and len(columns) == 1 and rows != columns
    # the annotated input is a source, not a member
    assert chain[0] not in classes.links and classes.of(chain[0], 0) is None
    # linear contracts: its result's axes start a class of their own
    assert classes.class_of(out, 0) == classes.class_of(after, 0)
    assert classes.class_of(out, 0) not in rows
    assert classes.count() == (4, 12)  # chain rows, chain columns, out/after rows, out/after columns


def test_an_axis_ends_are_its_links_ends_in_link_order():
    """ends_of, which the spread walks, is every link's ends of the axis,
    made once: the middle of the chain has a link on each side."""
    fd, chain, out, after = _chain(4)
    classes = _engine(fd, [[8, 16], [4, 16]]).classes
    middle = chain[2]
    for axis in (0, 1):
        links = classes.of(middle, axis)
        assert len(links) == 2
        ends = classes.ends_of(middle, axis)
        assert ends == [end for link in links for end in link.ends(middle)]
        assert [(end.tv, end.axis) for end in ends] == [(chain[1], axis), (chain[3], axis)]
        assert classes.ends_of(middle, axis) is ends


def test_links_are_made_once_per_rule_and_follow_a_new_annotation():
    """A second plan with the same annotations and rules reuses the classes;
    an expr's links are its rule's structure, reused even when the classes
    are made anew. Annotating a tensor inside a class later makes it a
    source there, never a member (the links of the exprs around it are
    made for that plan)."""
    fd, chain, out, after = _chain(4)
    shapes = [[8, 16], [4, 16]]
    first, second = _engine(fd, shapes).classes, _engine(fd, shapes).classes
    assert second is first
    _shard(chain[2], 1, _mesh(2))
    third = _engine(fd, shapes).classes
    assert third is not first
    assert [id(link) for link in third.of(chain[4], 0)] == [id(link) for link in first.of(chain[4], 0)]
    assert chain[2] not in third.links
    # the chain splits at the annotated tensor: chain[1] is left alone, chain[3:] one class
    assert third.of(chain[1], 0) is None
    assert third.class_of(chain[3], 0) == third.class_of(chain[4], 0)
    assert first.count() == (4, 12) and third.count() == (4, 8)


def test_the_engine_keeps_the_fusion_structure_until_the_fusion_grows():
    """Adjacency, depth, structural keys and the program's producers and
    consumers are the fusion's structure: a second plan reuses them, and a
    fusion that grew gets them anew."""
    fd, chain, out, after = _chain(2)
    shapes = [[8, 16], [4, 16]]
    first, second = _engine(fd, shapes), _engine(fd, shapes)
    assert second.tensor_structure is first.tensor_structure and second.canon is first.canon
    assert second.p.consumers is first.p.consumers  # (the program's index, as long as its exprs are the fusion's)
    extra = fd.fusion.add_expr(fd.fusion.exprs[-1].op, list(fd.fusion.exprs[-1].inputs), [after.fusion.new_tv(
        after.dtype(), [after.fusion.new_id(i.extent()) for i in after.logical])])
    grown = _engine(fd, shapes)
    assert grown.tensor_structure is not first.tensor_structure
    # (it reads what the last expr reads)
    assert grown.entries[out].adjacent == first.entries[out].adjacent + [extra]
    assert grown.p.consumers[out] == first.p.consumers[out] + [extra]


def test_a_class_takes_its_sharding_in_one_spread():
    fd, chain, out, after = _chain(6)
    engine = _engine(fd, [[8, 16], [4, 16]])
    for tv in chain[1:]:
        assert [d.digits != () for d in engine.entries[tv].decided] == [True, False]
    # only the expr where the annotation enters the class ever proposed
    inside = [engine.p.producer[tv] for tv in chain[2:]] + [engine.p.producer[after]]
    assert all(e in engine.classes.internal for e in inside)
    assert engine.p.producer[chain[1]] not in engine.classes.internal
    assert not any(e in engine.proposals for e in inside)
    # the log still says which expr carried each decision, and from where
    for previous, tv in zip(chain[1:], chain[2:]):
        text = engine.log.explain(tv)[0]
        assert f"forward through {engine.p.producer[tv].op.name}" in text and f"from {previous.short_name()}" in text
        assert "stage pass-through" in text


def test_a_spread_stops_where_another_sharding_competes():
    """Two classes bring the same mesh axis to two axes of one tensor: the
    tensor is a conflict resolved by bytes, and what follows it takes the
    winner, not whichever wave came first."""
    with FusionDefinition() as fd:
        a = fd.define_tensor([8, 16], dtype=DataType.Float)
        b = fd.define_tensor([8, 16], dtype=DataType.Float)
        ra, rb = fd.ops.relu(a), fd.ops.relu(b)
        c = fd.ops.add(ra, rb)
        d = fd.ops.neg(c)
        fd.add_output(d)
        mesh = _mesh(2)
        _shard(a, 0, mesh)
        _shard(b, 1, mesh)
    plan = nvfuser.propagate_shardings(fd, [[8, 16], [8, 16]])
    assert plan.mesh_axes(ra) == [["x"], []] and plan.mesh_axes(rb) == [[], ["x"]]
    assert len(plan.conflicts(c)) == 1
    assert plan.mesh_axes(d) == plan.mesh_axes(c) and plan.mesh_axes(c) in ([["x"], []], [[], ["x"]])
    # one operand of the add is resharded (a 16x8 float shard arrives whole
    # as 8x16 needs: an all-to-all of half the local block), nothing else moves
    assert [c.kind for c in plan.communications] == ["all_to_all"]


# -- against propagation by proposals alone ------------------------------------------------------


def _state(case: FusionCase, spread_classes: bool) -> list:
    fd, _ = case.build()
    sizes = _sizes(fd.fusion, case.input_shapes(), None)
    program = Program(fd.fusion, sizes)
    Engine(program, CostModel(program, sizes), DecisionLog(), spread_classes).run()
    return [program.state[tv].key() for tv in fd.fusion.tvs()]


@settings(max_examples=300, derandomize=True, deadline=None, database=None, print_blob=False,
          suppress_health_check=list(HealthCheck))
@given(fusions(max_ops=10, meshes_max=2))
def test_class_spread_decides_as_proposals_do(case: FusionCase):
    """Spreading along classes is a shortcut, not a new policy: on random
    programs every tensor ends with the sharding proposals alone give it.
    (tools/plan_census.py compares 3,000 more, by bytes.)"""
    assert _state(case, True) == _state(case, False)


def _reshaped():
    """x (annotated) -> relu -> reshape [-1, 4] -> neg -> relu: how the
    reshape splits axes, and so its rule, depends on the concrete sizes."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        y = fd.ops.reshape(fd.ops.relu(x), new_shape=[-1, 4])
        fd.add_output(fd.ops.relu(fd.ops.neg(y)))
        _shard(x, 0, _mesh(2))
    return fd


def test_replanning_a_fusion_at_other_shapes_matches_a_fresh_definition():
    """What is kept between plans (with each rule, with the fusion) is kept
    by what it depends on: plans of one fusion at alternating shapes equal
    those of a fresh definition at each shape, logs and communications included."""
    def planned(fd, shapes):
        plan = build_plan(fd.fusion, shapes, None, "default")
        return plan.log.text(), [str(e) for e in plan.program.exprs]

    order = ([[4, 4]], [[4, 8]], [[4, 4]], [[16, 4]], [[4, 8]])  # (at [4, 4] the reshape keeps both axes whole)
    fd = _reshaped()
    again = [planned(fd, shapes) for shapes in order]
    fresh = [planned(_reshaped(), shapes) for shapes in order]
    assert again == fresh
    assert len({log for log, _ in fresh}) == 2  # the shapes do change the plan
