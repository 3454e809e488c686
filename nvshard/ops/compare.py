"""Comparisons ge, gt, le, eq, ne (lt is with the other binary ops in
pointwise.py): elementwise, bool results, the pointwise rule."""

from __future__ import annotations

import torch

from .pointwise import BinaryOp
from .registry import frontend, register

_COMPARISONS = [
    ("ge", torch.ge, ">="),
    ("gt", torch.gt, ">"),
    ("le", torch.le, "<="),
    ("eq", torch.eq, "=="),
    ("ne", torch.ne, "!="),
]

for _name, _fn, _printed in _COMPARISONS:
    _spec = register(BinaryOp(_name, _fn, _printed, inline=True, bool_result=True))
    frontend(_name)(_spec.define)
