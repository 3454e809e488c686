"""The optimal sharding of a small fusion, for benchmarking propagation.

    .venv/bin/python tools/optimum.py [--quick] [--direction incoming] [--mesh 1x2x2]

As a script: the optimum for the AlphaFold3 triangle update (only z_in and
mask annotated) next to nvshard's default plan; exits 1 if the optimum
costs more than nvshard's plan there (on this program nvshard's plan is
optimal, so that is a regression in one of them; on programs where exprs
may compute on their operands' shards it can happen, see the README). --quick (CI's
smoke run): b=2, n=8, c=8. tools/bench_comm.py calls optimum() on every row.

The search itself (formulation, cost, exactness) is nvshard's
`propagation="search"` engine, nvshard/preseg/search.py; this tool runs it
without the comparison with default propagation that the mode makes, so
that it reports the optimum even where it is worse than nvshard's plan
(e.g. under the balance constraint). Each tensor keeps the mesh default
propagation gives it (the search picks layouts, not pipeline stages).
"""

from __future__ import annotations

import math
from typing import Optional

from nvshard.preseg.cost import CostModel
from nvshard.preseg.pipeline import _sizes
from nvshard.preseg.program import Program
from nvshard.preseg.propagate_shardings import PropagateShardingsPass
from nvshard.preseg.search import (COLLECTIVE_EPS, DEFAULT_TABLE_LIMIT, BlockLayoutSearch,  # noqa: F401
                                   SearchInfeasible as Infeasible, SearchResult as Result,
                                   SearchTooBig as TooBig)
from nvshard.preseg.validate import validate_annotations


def optimum(fd_or_fusion, input_shapes, scalar_values=None, table_limit: int = DEFAULT_TABLE_LIMIT,
            fixed: Optional[dict] = None, nested: bool = True, balanced: bool = False) -> Result:
    """The cheapest block sharding of every unannotated tensor. `fixed` pins
    more tensors (TensorView -> TvState), e.g. the fusion outputs to the
    shardings a plan gives them, so that plans are compared for the same
    result layout (their reduction axes may still end in pending sums)."""
    fusion = getattr(fd_or_fusion, "fusion", fd_or_fusion)
    validate_annotations(fusion)
    sizes = _sizes(fusion, list(input_shapes), scalar_values or {})
    if sizes is None:
        raise ValueError("the optimum needs concrete input shapes")
    program = Program(fusion, sizes)
    PropagateShardingsPass(CostModel(program, sizes), "default").run(program)  # the meshes
    return BlockLayoutSearch(program, sizes, table_limit, fixed, nested, balanced).run()


def main(argv=None) -> int:
    import argparse
    import sys

    import torch

    import nvshard
    from nvshard import DataType, FusionDefinition, models

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--direction", choices=["outgoing", "incoming"], default="outgoing")
    parser.add_argument("--mesh", default="1x2x2", help="dp x cp x cp")
    parser.add_argument("--sizes", default="2,64,128", help="b,n,c")
    args = parser.parse_args(argv)
    b, n, c = (2, 8, 8) if args.quick else (int(x) for x in args.sizes.split(","))
    mesh_shape = tuple(int(x) for x in args.mesh.split("x"))
    direction = models.Direction(args.direction)
    with FusionDefinition() as fd:
        inputs, _ = models.triangle_update(fd, direction, c, DataType.Float)
        mesh = nvshard.multidevice.DeviceMesh(torch.arange(math.prod(mesh_shape)).reshape(mesh_shape))
        models.annotate_triangle(inputs, mesh, mesh_shape[0], mesh_shape[1])
    shapes = models.triangle_shapes(b, n, c)
    default = nvshard.propagate_shardings(fd, shapes)
    fixed = {o: default.propagated[o] for o in fd.fusion.outputs()}
    result = optimum(fd, shapes, fixed=fixed, nested=sum(s > 1 for s in mesh_shape) <= 2)
    kinds = ", ".join(c.kind for c in result.communications)
    print(f"triangle update {direction.value} b={b} n={n} c={c} on {args.mesh}: optimum {result.bytes_per_device:.0f} B "
          f"({kinds}; exact {result.exact}, {result.stats['states']} states, "
          f"{result.stats['build_s'] + result.stats['solve_s']:.2f} s); nvshard default {default.bytes_per_device:.0f} B")
    if result.bytes_per_device > default.bytes_per_device + 0.5:
        print("the optimum costs more than nvshard's plan: the search is wrong", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
