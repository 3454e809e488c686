"""The decomposition leaves a pass-through expr whose tensors agree factor by
factor as it is, without asking plan_compute
(decompose_reshardings._Rewrite._in_place). That shortcut must rewrite every
program exactly as asking would."""

import pytest
import torch

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition
from nvshard.models import (Direction, annotate_mlp, annotate_transformer, annotate_triangle, mlp, transformer_forward,
                            triangle_shapes, triangle_update)
from nvshard.preseg import pipeline
from nvshard.preseg.decompose_reshardings import _Rewrite
from nvshard.preseg.projection import pass_through_axes, plan_compute, resolved, same_state

P = nvfuser.ParallelType


def _mesh(*shape):
    return nvfuser.multidevice.DeviceMesh(torch.arange(torch.Size(shape).numel()).reshape(*shape))


def test_pass_through_axes_name_each_axis_factor():
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 16], dtype=DataType.Float, contiguity=True)
        y = fd.define_tensor([8, 16], dtype=DataType.Float, contiguity=True)
        bias = fd.define_tensor([16], dtype=DataType.Float, contiguity=True)
        w = fd.define_tensor([4, 16], dtype=DataType.Float, contiguity=True)
        s = fd.ops.add(x, y)
        b = fd.ops.add(fd.ops.tanh(s), fd.ops.broadcast_in_dim(bias, [8, 16], [1]))
        fd.add_output(fd.ops.linear(b, w))
        fd.add_output(fd.ops.sum(s, [1]))
        fd.add_output(fd.ops.reshape(s, [128]))
        fd.add_output(fd.ops.mul(s, s))
        fd.add_output(fd.ops.permute(s, [1, 0]))
        fd.add_output(fd.ops.slice(s, [0, 0], [4, 16]))
    got = [(e.op.name, pass_through_axes(e, e.rule())) for e in fd.fusion.exprs]
    assert got == [
        ("add", ([[0, 1], [0, 1]], [[0, 1]])),
        ("tanh", ([[0, 1]], [[0, 1]])),
        ("broadcast_in_dim", ([[0]], [[-1, 0]])),  # (the new axis is a broadcast: it names no factor)
        ("add", ([[0, 1], [-1, 1]], [[0, 1]])),
        ("linear", None),  # a contraction
        ("sum", None),  # a result with a reduction axis
        ("reshape", None),  # an axis made of two factors
        ("mul", ([[0, 1], [0, 1]], [[0, 1]])),  # one tensor read twice
        ("permute", ([[0, 1]], [[1, 0]])),
        ("slice", None),  # a replicated factor
    ]


class _Asking(_Rewrite):
    """Asks plan_compute about every expr the shortcut would skip, and
    counts the exprs it skips and the ones it does not."""

    def __init__(self, program, cost, shortcut: bool):
        _Rewrite.__init__(self, program, cost.numel, True)
        self.cost, self.shortcut, self.skipped, self.asked = cost, shortcut, 0, 0

    def _in_place(self, expr) -> bool:
        in_place = _Rewrite._in_place(self, expr)
        if not in_place:
            self.asked += 1
            return False
        self.skipped += 1
        state = self.program.state
        results = [state[o] for o in expr.tv_outputs]
        operands = [state[v] for v in expr.tv_inputs]
        compute = plan_compute(expr, results, self.program.rule(expr), operands, self.cost.price)
        for actual, required in zip(operands, compute.operands):
            assert same_state(actual, required), expr
        for out, result, produced in zip(expr.tv_outputs, results, compute.results):
            assert same_state(produced, resolved(out, result)), expr
        return in_place if self.shortcut else False


def _rewritten(fd, shapes, shortcut: bool):
    """(the program as the decomposition leaves it, printed; each tensor's
    state; how many exprs the shortcut skipped and how many it asked about)."""
    fusion = fd.fusion
    sizes = pipeline._sizes(fusion, shapes, None)
    program = pipeline.Program(fusion, sizes)
    cost = pipeline.CostModel(program, sizes)
    propagate = pipeline.passes(cost, "default")[0]
    propagate.run(program)
    rewrite = _Asking(program, cost, shortcut)
    rewrite.run()
    states = {tv.short_name(): state.key() for tv, state in program.state.items()}
    return program.print_math(), states, rewrite.skipped, rewrite.asked


def _triangle():
    with FusionDefinition() as fd:
        inputs, _ = triangle_update(fd, Direction.OUTGOING, 128, DataType.Float)
        annotate_triangle(inputs, _mesh(1, 2, 2), 1, 2)
    return fd, triangle_shapes(2, 64, 128)


def _mlp():
    with FusionDefinition() as fd:
        inputs, _ = mlp(fd, 64, 32)
        annotate_mlp(inputs, _mesh(4), sequence_parallel=True)
    return fd, None


def _transformer():
    with FusionDefinition() as fd:
        inputs, _ = transformer_forward(fd, 2, 64, 4, 128)
        annotate_transformer(inputs, _mesh(4), sequence_parallel=True)
    return fd, None


def _operands_apart():
    """Pass-through exprs whose operands are sharded on different axes, or
    sharded on an axis the result has as a broadcast: one of them is
    resharded before the op, or the result after it."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 16], dtype=DataType.Float, contiguity=True)
        y = fd.define_tensor([8, 16], dtype=DataType.Float, contiguity=True)
        z = fd.define_tensor([8, 16], dtype=DataType.Float, contiguity=True)
        bias = fd.define_tensor([16], dtype=DataType.Float, contiguity=True)
        t = fd.ops.permute(fd.ops.mul(fd.ops.add(x, y), z), [1, 0])
        fd.add_output(fd.ops.add(t, fd.ops.broadcast_in_dim(bias, [16, 8], [0])))
        for tv, axis in ((x, 0), (y, 1), (z, 1), (bias, 0)):
            tv.set_device_mesh(_mesh(2))
            tv.outer_split(axis, 2)
            tv.axis(axis).parallelize(P.mesh_x)
    return fd, [[8, 16]] * 3 + [[16]]


@pytest.mark.parametrize("program", [_triangle, _mlp, _transformer, _operands_apart],
                         ids=["triangle", "mlp", "transformer", "operands_apart"])
def test_skipping_in_place_exprs_rewrites_as_asking_does(program):
    asked_text, asked_states, _, _ = _rewritten(*program(), shortcut=False)
    text, states, skipped, asked = _rewritten(*program(), shortcut=True)
    assert skipped > 0 and asked > 0  # (both ways are exercised)
    assert states == asked_states
    assert text == asked_text
