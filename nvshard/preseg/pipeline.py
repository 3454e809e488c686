"""The pre-segmenter: an ordered list of passes over a Program.

`build_plan` runs them for one set of input shapes (concrete when given;
symbolic at definition time) and returns the Plan the executor runs and
tests inspect. NVFUSER_DUMP=pre_segmenter_logging prints the program
before the passes and after each one, in nvFuser's format.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from typing import Optional

from ..ir.nodes import NvShardError, TensorView
from ..ir.size_evaluator import SizeEvaluator
from .cost import CostModel
from .decompose_reshardings import DecomposeReshardingsPass
from .plan import Plan
from .program import Program
from .propagate_shardings import PropagateShardingsPass
from .search import SearchShardingsPass
from .validate import validate_annotations

SEPARATOR = "=" * 40


def dump_enabled(option: str) -> bool:
    """NVFUSER_DUMP=<options>; in a multi-process job only rank
    $NVSHARD_DUMP_RANK (default 0, "all" for every rank) prints."""
    if option not in [o.strip() for o in os.environ.get("NVFUSER_DUMP", "").split(",")]:
        return False
    from ..multidevice.communicator import Communicator

    which = os.environ.get("NVSHARD_DUMP_RANK", "0")
    return which == "all" or Communicator.instance().rank() == int(which)


PROPAGATION_MODES = ("default", "legacy", "search")


def propagation_mode(explicit: Optional[str] = None) -> str:
    mode = explicit or os.environ.get("NVSHARD_PROPAGATION", "default")
    if mode not in PROPAGATION_MODES:
        source = "propagation" if explicit else "NVSHARD_PROPAGATION"
        raise NvShardError(f"{source}={mode!r} is not a propagation mode; expected one of "
                           f"{', '.join(repr(m) for m in PROPAGATION_MODES)}")
    return mode


def passes(cost: CostModel, mode: str) -> list:
    """The pass list, in order. "search" runs default propagation, then the
    exact block layout search (preseg/search.py) over the unannotated tensors."""
    propagate = PropagateShardingsPass(cost, "legacy" if mode == "legacy" else "default")
    search = [SearchShardingsPass(cost, propagate.log)] if mode == "search" else []
    return [propagate, *search,
            DecomposeReshardingsPass(cost.numel, weigh_alternatives=mode != "legacy")]


def build_plan(fusion, global_shapes=None, scalar_values=None, options=None) -> Plan:
    # Program and Plan building allocate as much as the passes do: the
    # collector stays off for all of it and scans what survives once, after.
    with _no_gc():
        return _build_plan(fusion, global_shapes, scalar_values, options)


def _build_plan(fusion, global_shapes, scalar_values, options) -> Plan:
    mode = propagation_mode(options)
    validate_annotations(fusion)
    sizes = _sizes(fusion, global_shapes, scalar_values)
    program = Program(fusion, sizes)
    cost = CostModel(program, sizes)
    pipeline = passes(cost, mode)
    dump = dump_enabled("pre_segmenter_logging")
    out = sys.stdout
    if dump:
        out.write("Fusion before PreSegmenter:\n" + program.print_math() + SEPARATOR + "\n")
    plan = Plan(fusion, program, sizes, mode)
    for p in pipeline:
        p.run(program)
        if isinstance(p, (PropagateShardingsPass, SearchShardingsPass)):
            plan.record_propagation(p.log)
            if sizes is not None:
                plan.check_divisibility()
        if isinstance(p, SearchShardingsPass):
            plan.search = p.outcome
        if isinstance(p, DecomposeReshardingsPass):
            plan.record_communications()
        if dump:
            out.write(f"Fusion after pass: {p.name}\n" + program.print_math())
            if isinstance(p, PropagateShardingsPass):
                out.write("Sharding decisions:\n" + (p.log.text() or "(no annotations)") + "\n")
            if isinstance(p, SearchShardingsPass):
                out.write("Search decisions:\n" + "\n".join(p.log.explain(None) + [
                    line for tv in program.state for line in p.log.explain(tv) if "; stage search" in line]) + "\n")
            if isinstance(p, DecomposeReshardingsPass):
                out.write(plan.report() + "\n")
            out.write(SEPARATOR + "\n")
    if dump:
        out.flush()
    return plan


@contextlib.contextmanager
def _no_gc():
    """Planning allocates many small objects and frees few: the cyclic
    collector would rescan them over and over (quadratic on big fusions)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _sizes(fusion, global_shapes, scalar_values) -> Optional[SizeEvaluator]:
    if global_shapes is None:
        # Definition time: sizes are concrete when every input extent is static.
        shapes = []
        for v in fusion.inputs():
            if not isinstance(v, TensorView):
                return None
            ids = [v.logical[i] for i in v.non_reduction_axes()]
            if not all(i.extent().is_static or i.is_broadcast() for i in ids):
                return None
            shapes.append([1 if i.is_broadcast() else i.extent().value for i in ids])
        global_shapes = shapes
    try:
        return SizeEvaluator(fusion, list(global_shapes), scalar_values)
    except NvShardError:
        raise
