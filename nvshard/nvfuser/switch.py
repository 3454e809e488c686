"""The drop-in switch: `nvshard.nvfuser.enable()` (or NVSHARD_NVFUSER=1 and
`import nvshard.nvfuser`) makes every real `FusionDefinition.execute` run
nvshard's propagation on the fusion first, with the global input shapes
read from the arguments, and write the shardings back. Real nvFuser's own
pre-segmenter then leaves every written TensorView as it is (it never
changes a TensorView that has a mesh). The plan is kept as
`fd.nvshard_plan`.
"""

from __future__ import annotations

import os

_original = None


def enabled() -> bool:
    return _original is not None


def enable() -> None:
    global _original
    if _original is not None:
        return
    from .reader import real_module

    nvf = real_module()
    _original = nvf.FusionDefinition.execute

    def execute(self, inputs, *args, **kwargs):
        if getattr(self, "nvshard_plan", None) is None:  # once per FusionDefinition
            from . import propagate

            shapes = _global_shapes(self, inputs)
            from ..preseg.pipeline import dump_enabled

            if dump_enabled("pre_segmenter_logging"):
                print("nvshard.nvfuser: nvshard's sharding propagation, before nvFuser's pre-segmenter", flush=True)
            self.nvshard_plan = propagate(self, shapes)
        return _original(self, inputs, *args, **kwargs)

    nvf.FusionDefinition.execute = execute


def disable() -> None:
    global _original
    if _original is None:
        return
    from .reader import real_module

    real_module().FusionDefinition.execute = _original
    _original = None


def _device_factors(real_tv) -> list:
    """Per logical axis of an input, how many devices split it (1 if none)."""
    from .reader import _SPLIT_TEXT, _parse_id, id_number, parse_mesh

    logical = real_tv.get_logical_domain()
    factors = [1] * len(logical)
    devices = parse_mesh(str(real_tv))
    if devices is None:
        return factors
    index = {id_number(i): k for k, i in enumerate(logical)}
    for loop_id in real_tv.get_loop_domain():
        _, parallel, _, _ = _parse_id(str(loop_id))
        if not parallel.startswith("deviceIdx"):
            continue
        root = loop_id
        split = root.definition()
        while split is not None and _SPLIT_TEXT.match(str(split)):
            root = split.input(0)
            split = root.definition()
        k = index.get(id_number(root))
        if k is not None:
            factors[k] *= int(devices.shape[{"x": -1, "y": -2, "z": -3}[parallel[-1]]])
    return factors


def local_shape(real_tv, global_shape) -> list:
    return [g // f for g, f in zip(global_shape, _device_factors(real_tv))]


def _global_shapes(fd, inputs) -> list:
    """GLOBAL input shapes: each local shard times its device splits."""
    import torch

    shapes = []
    for v, t in zip(fd.fusion.inputs(), inputs):
        if isinstance(t, torch.Tensor):
            shapes.append([n * f for n, f in zip(t.shape, _device_factors(v))])
        else:
            shapes.append(t)
    return shapes


if os.environ.get("NVSHARD_NVFUSER", "") not in ("", "0"):
    enable()
