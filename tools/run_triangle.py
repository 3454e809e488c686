"""The main job: the AlphaFold3 outgoing triangle update, sharded over a
(dp, 2, 2) mesh with only z_in and mask annotated, run under mpirun:

    NVFUSER_DUMP=pre_segmenter_logging mpirun -np 4 python tools/run_triangle.py

Prints the pre-segmenter dump (rank 0), then checks every rank's output
against the unsharded torch reference and the bytes each rank received
against the plan. Exits non-zero on a mismatch. --quick (CI's smoke run):
b=1 per dp group, 8 tokens, 16 channels.
"""

import argparse
import os
import sys
import time

import torch

import nvshard as nvfuser  # noqa: E402
from nvshard import DataType, FusionDefinition  # noqa: E402
from nvshard.models import Direction, annotate_triangle, triangle_reference, triangle_update  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--direction", choices=["outgoing", "incoming"], default="outgoing")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--propagation", choices=["default", "legacy"], default=None)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.tokens, args.channels = 1, 8, 16

    comm = nvfuser.multidevice.Communicator.instance()
    d = comm.size()
    if d % 4:
        print(f"run with a multiple of 4 processes (got {d}): mpirun -np 4 ...", file=sys.stderr)
        return 2
    dp, cp = d // 4, 2
    direction = Direction(args.direction)
    with FusionDefinition() as fd:
        inputs, matmul_out = triangle_update(fd, direction, args.channels, DataType.Float)
        mesh = nvfuser.multidevice.DeviceMesh(torch.arange(d).reshape(dp, cp, cp))
        annotate_triangle(inputs, mesh, dp, cp)
    if args.propagation:
        os.environ["NVSHARD_PROPAGATION"] = args.propagation

    torch.manual_seed(0)
    b, n, c = args.batch * dp, args.tokens, args.channels
    full = [torch.randn(b, n, n, c), torch.randn(c), torch.randn(c), torch.randn(2 * c, c) / c ** 0.5,
            torch.randn(2 * c, c) / c ** 0.5, torch.randn(c), torch.randn(c), torch.randn(c, c) / c ** 0.5,
            torch.randn(c, c) / c ** 0.5, torch.rand(b, n, n) > 0.2]
    local = [nvfuser.multidevice.shard_tensor(t, tv) for t, tv in zip(full, fd.fusion.inputs())]
    start = time.perf_counter()
    (out,) = fd.execute(local)
    elapsed = time.perf_counter() - start

    plan = fd._executor.last_plan
    measured = fd._executor.last_backend.received[comm.rank()]
    expected = nvfuser.api.shard_by_plan(plan, fd.fusion.outputs()[0], triangle_reference(direction, *full),
                                         comm.rank())
    error = (out - expected).abs().max().item()
    ok = error < 1e-3 and measured == plan.bytes_received(comm.rank())
    other = "legacy" if plan.mode != "legacy" else "default"
    shapes = [list(t.shape) for t in full]
    other_bytes = nvfuser.propagate_shardings(fd, shapes, propagation=other).bytes_received(comm.rank())
    print(f"[rank {comm.rank()}] {direction.value} triangle update, mesh {mesh}: matmul output sharded "
          f"{plan.mesh_axes(matmul_out)} pending {plan.partial_axes(matmul_out)}; "
          f"max |error| vs unsharded reference {error:.2e}; received {measured / 2**20:.2f} MiB "
          f"(plan {plan.bytes_received(comm.rank()) / 2**20:.2f} MiB, {other} propagation "
          f"{other_bytes / 2**20:.2f} MiB); first execute {elapsed:.2f} s "
          f"{'OK' if ok else 'MISMATCH'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
