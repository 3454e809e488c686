"""One place per op: its frontend call, sharding rule, torch evaluation and
printed form.

A sharding rule is a factor mapping in the spirit of Shardy's
OpShardingRule: each axis of each tensor operand and result names the
factors it is made of (outer first; a broadcast axis names none). Factors
have a kind:

  PASS        the factor flows through: shard it anywhere, no communication
  SUM         a contraction: sharding it leaves partial sums on the result's
              reduction axis, resolved later by reduce-scatter or allreduce
  REPLICATED  the op needs the whole factor on each device (a sliced or
              concatenated axis, the normalized axis of var_mean, attention's
              key length)

The propagation engine, the decomposition pass and the cost model read
rules only; none of them knows op names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..ir.sizes import Size


class FactorKind(enum.Enum):
    PASS = "pass"
    SUM = "sum"
    REPLICATED = "replicated"


@dataclass(slots=True, init=False)
class Factor:
    name: str
    extent: Size
    kind: FactorKind

    def __init__(self, name: str, extent: Size, kind: FactorKind):
        # (written out: compiled, the generated __init__ would still run as
        # interpreted Python, and every rule of a new fusion makes a few)
        self.name = name
        self.extent = extent
        self.kind = kind


@dataclass(slots=True, init=False)
class ShardingRule:
    factors: list[Factor]
    operands: list[list[tuple]]  # per TensorView input
    results: list[list[tuple]]  # per TensorView output
    cache: dict = field(repr=False, compare=False)  # what passes derive from it

    def __init__(self, factors=None, operands=None, results=None, cache=None):
        # (written out: every expr of a new fusion makes one, and the generated
        # __init__ with default factories costs several times as much)
        self.factors = [] if factors is None else factors
        self.operands = [] if operands is None else operands
        self.results = [] if results is None else results
        self.cache = {} if cache is None else cache

    def add_factor(self, name: str, extent, kind: FactorKind = FactorKind.PASS) -> int:
        self.factors.append(Factor(name, Size.of(extent), kind))
        return len(self.factors) - 1

    def describe(self) -> str:
        """Einsum-like text, e.g. `b i k, n k -> b i n {k: sum}`."""
        names = [f.name for f in self.factors]
        text = f"{_tensors_text(self.operands, names)} -> {_tensors_text(self.results, names)}"
        special = [f"{f.name}: {f.kind.value}" for f in self.factors if f.kind is not _PASS]
        if special:
            text += " {" + ", ".join(special) + "}"
        return text


_PASS = FactorKind.PASS  # (an Enum class's attribute read is slow on Python 3.11)


def _tensors_text(tensors: list, names: list) -> str:
    """ShardingRule.describe's text of one side: tensors by ", ", axes by " "."""
    out = []
    for axes in tensors:
        words = []
        for factors in axes:
            if not factors:
                words.append("1")
            elif len(factors) == 1:
                words.append(names[factors[0]])
            else:
                words.append("(" + " ".join([names[f] for f in factors]) + ")")
        out.append(" ".join(words) or "scalar")
    return ", ".join(out)


class OpSpec:
    """An op kind. Subclasses or instances fill in the hooks below."""

    name: str = "?"
    is_communication = False
    rule_needs_sizes = False  # rule(expr, sizes) when concrete sizes change the rule
    # evaluate() computes each block of a pass-through axis from the same block
    # of its operands and asks ctx nothing about shapes: it may run in chunks
    # along a stream-parallel axis (runtime/streams.py)
    chunkable = False
    # whether check_sizes checks anything: set for each subclass, true where
    # it overrides check_sizes (a plan asks only those ops' exprs)
    checks_sizes = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.checks_sizes = cls.check_sizes is not OpSpec.check_sizes

    def __init__(self, name: str, *, rule=None, evaluate=None, format=None, legacy_reference_order=None):
        self.name = name
        if rule is not None:
            self.rule = rule
        if evaluate is not None:
            self.evaluate = evaluate
        if format is not None:
            self.format = format
        if legacy_reference_order is not None:
            self.legacy_reference_order = legacy_reference_order

    def rule(self, expr) -> ShardingRule:
        raise NotImplementedError(self.name)

    def evaluate(self, expr, args: list, ctx) -> list:
        raise NotImplementedError(self.name)

    def format(self, expr) -> str:
        raise NotImplementedError(self.name)

    def rule_sizes_key(self, expr, sizes):
        """For rule_needs_sizes ops: what of `sizes` the rule depends on."""
        return tuple([tuple(sizes.global_shape(t)) for t in expr.tv_inputs + expr.tv_outputs])

    def check_sizes(self, expr, sizes) -> None:
        """Checks only concrete sizes allow (e.g. a reshape's element count);
        raise NvShardError. Called once input shapes are known."""

    def legacy_reference_order(self, expr) -> Optional[list]:
        """Which operands nvFuser's legacy pass copies shardings from first
        (indices into the TensorView inputs); None sorts by device axes."""
        return None

    def __repr__(self) -> str:
        return f"OpSpec({self.name})"


OPS: dict[str, OpSpec] = {}
FRONTEND: dict[str, Callable] = {}


def register(spec: OpSpec) -> OpSpec:
    OPS[spec.name] = spec
    return spec


def frontend(name: str):
    """Expose a function as `fd.ops.<name>`."""

    def wrap(fn):
        FRONTEND[name] = fn
        return fn

    return wrap
