"""The engine's refresh after a decision (nvshard/preseg/engine.py): an
adjacent expr re-derives only the proposals of targets on the factors the
decided axis carries, and that is a shortcut, not a new policy: on random
programs the sharding and the whole decision log equal a full re-derivation's."""

import torch
from hypothesis import HealthCheck, given, settings

import nvshard as nvfuser
from nvshard import DataType, FusionDefinition
from nvshard.preseg.cost import CostModel
from nvshard.preseg.engine import Engine
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


def _run(fd, shapes, refresh_by_factor: bool):
    """(every tensor's final sharding, the log text, (expr, tensor, axis) per target derivation)."""
    sizes = _sizes(fd.fusion, shapes, None)
    program = Program(fd.fusion, sizes)
    log = DecisionLog()
    engine = _CountingEngine(program, CostModel(program, sizes), log, refresh_by_factor=refresh_by_factor)
    engine.derived = []
    engine.run()
    return [program.state[tv].key() for tv in fd.fusion.tvs()], log.text(), engine.derived


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
    """Two MLP blocks: each linear's three target axes (rows, columns, the
    pending sum) are derived together at first; later, a decision on a
    result's columns leaves the proposals for its rows standing."""
    fd, shapes = _mlp(2)
    by_factor, text, derived = _run(fd, shapes, True)
    full, full_text, full_derived = _run(fd, shapes, False)
    assert by_factor == full and text == full_text
    assert "conflict at" in text and "pending sum" in text
    # (the release re-derives only the contractions: the pointwise exprs' proposals never read it)
    assert (len(derived), len(full_derived)) == (47, 62)
    # the first round derives everything in both
    assert derived[:22] == full_derived[:22]


@settings(max_examples=200, derandomize=True, deadline=None, database=None, print_blob=False,
          suppress_health_check=list(HealthCheck))
@given(fusions(max_ops=10, meshes_max=2))
def test_refresh_by_factor_decides_and_logs_as_a_full_refresh(case: FusionCase):
    fd, _ = case.build()
    shapes = case.input_shapes()
    by_factor, text, _ = _run(fd, shapes, True)
    full, full_text, _ = _run(fd, shapes, False)
    assert by_factor == full
    assert text == full_text
