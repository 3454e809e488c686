"""The `nvshard` command: look at what the pre-segmenter does to a fusion
defined in a Python file.

The file defines, at module level:
  fd            a FusionDefinition (built with `with FusionDefinition() as fd:`), annotations included
  input_shapes  optional: the GLOBAL shapes of fd.fusion.inputs(), in order (a value for a scalar
                input); without it nvshard plans with symbolic sizes (other names: --fusion, --shapes)
"""

from __future__ import annotations

import argparse
import os
import runpy
import statistics
import sys
import time

EXAMPLE = """\
example file, mlp.py:

    import torch
    import nvshard
    from nvshard import DataType, FusionDefinition, ParallelType

    d = 4
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, 1024], dtype=DataType.Float)
        up_w = fd.define_tensor([4096, 1024], dtype=DataType.Float)
        out = fd.ops.relu(fd.ops.linear(inp, up_w))
        fd.add_output(out)
        mesh = nvshard.multidevice.DeviceMesh(torch.arange(d))
        for tv in (inp, up_w):
            tv.set_device_mesh(mesh)
        inp.outer_split(0, d)                            # tokens on DIDx (sequence parallel)
        inp.axis(0).parallelize(ParallelType.mesh_x)
        up_w.outer_split(0, d)                           # rows of the weight on DIDx (tensor parallel)
        up_w.axis(0).parallelize(ParallelType.mesh_x)
    input_shapes = [[8192, 1024], [4096, 1024]]          # the conflict is settled by bytes

then:
    nvshard explain mlp.py                  the planned program, every decision and why, the communications
    nvshard explain mlp.py --show T2        ... and which device holds which block of T2
    nvshard render mlp.py -o mlp.svg        the plan as a graph (SVG or PNG; needs Graphviz's dot)
    nvshard bench mlp.py --repeat 20        planning time; with --execute, every rank simulated on random inputs
"""


class CliError(Exception):
    pass


def load(path: str, fusion_name: str = "fd", shapes_name: str = "input_shapes", symbolic: bool = False):
    """(fd, input_shapes or None, the file's namespace) from a Python file."""
    from .frontend.fusion_definition import FusionDefinition

    if not os.path.isfile(path):
        raise CliError(f"{path}: no such file")
    namespace = runpy.run_path(path, run_name="__nvshard__")
    fd = namespace.get(fusion_name)
    if not isinstance(fd, FusionDefinition):
        found = [k for k, v in namespace.items() if isinstance(v, FusionDefinition)]
        hint = f"; it has {', '.join(found)} (use --fusion NAME)" if found else ""
        raise CliError(f"{path} defines no FusionDefinition named {fusion_name!r}{hint}")
    shapes = None if symbolic else namespace.get(shapes_name)
    if shapes is not None and len(shapes) != len(fd.fusion.inputs()):
        raise CliError(f"{path}: {shapes_name} has {len(shapes)} entries but the fusion has "
                       f"{len(fd.fusion.inputs())} inputs")
    return fd, shapes, namespace


def find_tensor(plan, name: str):
    for tv in plan.program.state:
        if tv.short_name() == name:
            return tv
    names = ", ".join(tv.short_name() for tv in plan.program.state)
    raise CliError(f"no TensorView {name} in the plan (it has {names})")


def cmd_explain(args) -> int:
    from .api import propagate_shardings

    fd, shapes, _ = load(args.file, args.fusion, args.shapes, args.symbolic)
    plan = propagate_shardings(fd, shapes)
    sizes = "symbolic sizes" if shapes is None else f"input shapes {shapes}"
    print(f"# {args.file}: {plan.mode} propagation, {sizes}\n")
    print("## program after the pre-segmenter\n")
    print(plan.program.print_math())
    tvs = [find_tensor(plan, args.tensor)] if args.tensor else list(plan.propagated)
    print("## decisions\n")
    for tv in tvs:
        for line in plan.explain(tv):
            print(line)
    print("\n## " + plan.report())
    for name in args.show or []:
        from .visualize.sharding_view import visualize_sharding

        print()
        visualize_sharding(plan, find_tensor(plan, name))
    return 0


def cmd_render(args) -> int:
    from .api import propagate_shardings

    fd, shapes, _ = load(args.file, args.fusion, args.shapes, args.symbolic)
    plan = propagate_shardings(fd, shapes)
    if args.dot:
        sys.stdout.write(plan.to_dot())
        return 0
    out = args.output or os.path.splitext(os.path.basename(args.file))[0] + ".svg"
    plan.render(out)
    print(f"wrote {out}: {len(plan.program.state)} tensors, {len(plan.communications)} communications")
    return 0


def _random_inputs(fd, shapes, namespace):
    import torch

    from .ir.nodes import Scalar

    if namespace.get("inputs") is not None:
        return list(namespace["inputs"])
    gen = torch.Generator().manual_seed(0)
    out = []
    for v, shape in zip(fd.fusion.inputs(), shapes):
        if isinstance(v, Scalar):
            if shape is None:
                raise CliError(f"scalar input {v} has no value: give one in input_shapes, or define `inputs`")
            out.append(shape)
            continue
        dtype = v.dtype().torch_dtype
        if dtype == torch.bool:
            out.append(torch.rand(shape, generator=gen) > 0.5)
        elif dtype.is_floating_point:
            out.append(torch.randn(shape, generator=gen).to(dtype))
        else:
            out.append(torch.randint(-8, 8, shape, generator=gen).to(dtype))
    return out


def cmd_bench(args) -> int:
    from tqdm import tqdm

    from .api import propagate_shardings, simulate
    from .multidevice.collectives import format_bytes

    fd, shapes, namespace = load(args.file, args.fusion, args.shapes, args.symbolic)
    times = []
    for _ in tqdm(range(args.repeat), desc="planning", disable=None, leave=False):
        start = time.perf_counter()
        plan = propagate_shardings(fd, shapes)
        times.append(time.perf_counter() - start)
    exprs = len(fd.fusion.exprs)
    print(f"plan: median {statistics.median(times) * 1e3:.2f} ms over {args.repeat} runs "
          f"(min {min(times) * 1e3:.2f} ms), {exprs} exprs, {len(plan.communications)} communications")
    if plan.bytes_per_device is not None:
        print(f"bytes received per device (plan): {format_bytes(plan.bytes_per_device)}")
    if args.execute:
        if shapes is None:
            raise CliError("--execute needs input_shapes (or `inputs`) in the file")
        inputs = _random_inputs(fd, shapes, namespace)
        start = time.perf_counter()
        sim = simulate(fd, inputs)
        elapsed = time.perf_counter() - start
        ranks = len(sim.outputs)
        print(f"simulated {ranks} ranks in {elapsed:.3f} s; bytes received per device (measured): "
              f"{format_bytes(sim.bytes_per_device)}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nvshard", description=__doc__, epilog=EXAMPLE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{explain,render,bench}")

    def command(name, help_, func):
        c = sub.add_parser(name, help=help_, description=help_, epilog=EXAMPLE,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        c.add_argument("file", help="Python file defining the fusion")
        c.add_argument("--fusion", default="fd", help="name of the FusionDefinition in the file (default: fd)")
        c.add_argument("--shapes", default="input_shapes",
                       help="name of the list of global input shapes in the file (default: input_shapes)")
        c.add_argument("--symbolic", action="store_true", help="plan with symbolic sizes even if shapes are given")
        c.set_defaults(func=func)
        return c

    c = command("explain", "print the program after the pre-segmenter, every decision and why, the communications",
                cmd_explain)
    c.add_argument("--tensor", metavar="T12", help="only the decisions about this TensorView")
    c.add_argument("--show", metavar="T12", action="append",
                   help="also draw which device holds which block of this TensorView (1-D/2-D; repeatable)")
    c = command("render", "draw the plan as a graph (graphviz)", cmd_render)
    c.add_argument("-o", "--output", help="output file, .svg or .png (default: FILE's name with .svg)")
    c.add_argument("--dot", action="store_true", help="print the DOT source instead (no Graphviz needed)")
    c = command("bench", "time planning (and, with --execute, a simulated run of every rank)", cmd_bench)
    c.add_argument("--repeat", type=int, default=10, help="plannings to time (default 10)")
    c.add_argument("--execute", action="store_true", help="also simulate every rank on random inputs")
    return p


def main(argv=None) -> int:
    from .ir.nodes import NvShardError

    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (CliError, NvShardError) as e:
        print(f"nvshard {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
