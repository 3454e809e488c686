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
            from ..preseg.pipeline import dump_enabled
            from . import propagate_read
            from .reader import read_fusion

            read = read_fusion(self.fusion)
            shapes = global_shapes(read, inputs)
            if dump_enabled("pre_segmenter_logging"):
                print("nvshard.nvfuser: nvshard's sharding propagation, before nvFuser's pre-segmenter", flush=True)
            self.nvshard_plan = propagate_read(read, shapes)
        return _original(self, inputs, *args, **kwargs)

    nvf.FusionDefinition.execute = execute


def disable() -> None:
    global _original
    if _original is None:
        return
    from .reader import real_module

    real_module().FusionDefinition.execute = _original
    _original = None


def global_shapes(read, inputs) -> list:
    """GLOBAL shapes of the fusion inputs from this rank's local shards, by
    the meshes and device splits the reader replayed (as nvshard's own
    execute recovers them; None for a tensor whose mesh leaves this rank out)."""
    from ..runtime.executor import global_input_shapes

    shapes, _ = global_input_shapes(read.fd.fusion, list(inputs), _this_rank(read))
    return shapes


def _this_rank(read) -> int:
    """Real nvFuser's rank of this process. Its Communicator starts on first
    use, so it is asked only when some input has a mesh (otherwise no
    input's global shape depends on the rank)."""
    if all(getattr(v, "mesh", None) is None for v in read.fd.fusion.inputs()):
        return 0
    from .reader import real_module

    return real_module().multidevice.Communicator.instance().rank()


if os.environ.get("NVSHARD_NVFUSER", "") not in ("", "0"):
    enable()
