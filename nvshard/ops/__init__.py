"""Op definitions. Importing this package registers every op."""

from . import attention, matmul, pointwise, random, reduction, shape  # noqa: F401
from . import creation, embedding, expand, indexing, pad, sort, welford  # noqa: F401  (ops translate_fusion emits)
from .registry import FRONTEND, OPS, FactorKind, OpSpec, ShardingRule  # noqa: F401
