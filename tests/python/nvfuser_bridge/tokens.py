"""nvshard's decided shardings in the token form real_run.tv_tokens reads
from nvFuser's dump: per TensorView, its mesh and its loop domain as device
tokens (kind + mesh axis, e.g. "ix", "rx"), any other loop axis as "."."""

from __future__ import annotations


def state_tokens(tv, state) -> list:
    tokens = []
    for id_, digits in zip(tv.logical, state.layouts):
        if not digits or id_.is_broadcast():
            tokens.append(".")
            continue
        tokens += [id_.iter_type.value + d if isinstance(d, str) else "." for d in digits]
        if isinstance(digits[-1], str) and isinstance(digits[0], str):
            tokens.append(".")  # an outer split's remainder of extent 1 (the layout drops it)
    mesh = str(state.mesh) if state.mesh is not None else None
    return [mesh, " ".join(tokens)]


def plan_tokens(bridge_plan) -> dict:
    """{TensorView number (str): tokens} for the TensorViews nvshard decided
    (annotated ones as the user wrote them)."""
    out = {}
    for number, (_, tv) in bridge_plan.read.pairs.items():
        out[str(number)] = state_tokens(tv, bridge_plan.plan.propagated[tv])
    return out
