"""PropagateShardings: give every TensorView a mesh and a sharding.

The default engine is in engine.py; `legacy` reproduces nvFuser's pass (one
forward sweep preferring weights, one backward sweep) for comparison.
"""

from __future__ import annotations

from .cost import CostModel
from .engine import Engine
from .legacy import LegacyPropagation
from .log import DecisionLog
from .program import Program


class PropagateShardingsPass:
    name = "PropagateShardingsPass"

    def __init__(self, cost: CostModel, mode: str = "default"):
        if mode not in ("default", "legacy"):
            raise ValueError(f"unknown propagation mode {mode!r}; expected 'default' or 'legacy'")
        self.cost = cost
        self.mode = mode
        self.log = DecisionLog()

    def run(self, program: Program) -> None:
        if self.mode == "legacy":
            LegacyPropagation(program, self.log).run()
        else:
            Engine(program, self.cost, self.log).run()
