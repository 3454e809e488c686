"""One rank of a test program, bridged by nvshard, executed by REAL nvFuser
on GPUs (NCCL), compared with the same program run unsharded on this
rank's GPU. Launched by test_real_nvfuser.py under `mpirun -np 4`; prints
"[rank r] OK" when this rank's output shards equal the reference's.
"""

from __future__ import annotations

import os
import sys

# nvFuser's Communicator reads RANK/WORLD_SIZE/LOCAL_RANK; with the Open MPI /
# PMIx variables left in place it takes another start-up path, so hand the
# rank over and drop those before nvfuser_direct is imported.
_RANK_VARS = {"RANK": "OMPI_COMM_WORLD_RANK", "WORLD_SIZE": "OMPI_COMM_WORLD_SIZE",
              "LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_WORLD_SIZE": "OMPI_COMM_WORLD_LOCAL_SIZE"}
for name, ompi in _RANK_VARS.items():
    if ompi in os.environ:
        os.environ[name] = os.environ[ompi]
for name in [k for k in os.environ if k.startswith(("OMPI_", "PMIX_"))]:
    del os.environ[name]
os.environ.setdefault("NVFUSER_MASTER_ADDR", "localhost")
os.environ.setdefault("NVFUSER_MASTER_PORT", "29542")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import nvfuser_direct as nvf  # noqa: E402
import nvshard.nvfuser as bridge  # noqa: E402
import programs  # noqa: E402
from nvshard.api import shard_by_plan  # noqa: E402
from nvshard.multidevice import shard_tensor  # noqa: E402

_TORCH = {"DataType.BFloat16": torch.bfloat16, "DataType.Float": torch.float32, "DataType.Bool": torch.bool}
# outputs that do not depend on random numbers (nvFuser's dropout differs between shardings)
_COMPARED = {"transformer_tp": [0, 1, 2], "transformer_sp": [0, 1, 2]}


def main(program: str) -> None:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    device = torch.device("cuda", local_rank)
    torch.manual_seed(0)
    fd, _, shapes = programs.build(nvf, program, gpu_sizes=True)
    plan = bridge.propagate(fd, shapes)
    full = []
    for v, shape in zip(fd.fusion.inputs(), shapes):
        dtype = _TORCH[str(v.dtype())]
        if dtype == torch.bool:
            full.append(torch.rand(shape) > 0.3)
        else:
            scale = shape[-1] ** -0.5 if len(shape) == 2 else 1.0  # keep the matmuls' outputs O(1)
            full.append((torch.randn(shape) * scale).to(dtype))
    local = []
    for v, t in zip(fd.fusion.inputs(), full):
        tv = plan.nvshard_tv(v)
        local.append((shard_tensor(t, tv, rank) if tv.mesh is not None else t).to(device))
    outs = fd.execute(local)

    reference_fd, _, _ = programs.build(nvf, program, annotate=False, gpu_sizes=True)
    reference = reference_fd.execute([t.to(device) for t in full])
    for i in _COMPARED.get(program, range(len(outs))):
        out_tv = plan.nvshard_tv(fd.fusion.outputs()[i])
        expected = shard_by_plan(plan.plan, out_tv, reference[i].cpu(), rank)
        tol = 5e-2 if outs[i].dtype == torch.bfloat16 else 1e-3
        torch.testing.assert_close(outs[i].cpu().float(), expected.float(), atol=tol, rtol=tol,
                                   msg=lambda m: f"[rank {rank}] {program} output {i}: {m}")
    print(f"[rank {rank}] {program} OK", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
