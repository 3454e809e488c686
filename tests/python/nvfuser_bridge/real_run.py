"""Run one test program through REAL nvFuser's pre-segmenter on meta tensors
(no GPU needed: every pass runs, then launching fails on the missing CUDA
driver) and print a JSON summary as the last line. Run as a subprocess:
a failing real nvFuser call may abort the process.

    python real_run.py PROGRAM MODE [PROPAGATION]
    MODE: "alone" (real nvFuser only), "bridge" (nvshard.nvfuser.propagate first)
          or "switch" (nvshard.nvfuser.enable(), then fd.execute as users write it)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import programs  # noqa: E402

_SECTION = re.compile(r"^(Fusion before PreSegmenter:|Fusion after pass: (\w+))$")
TV_TEXT = re.compile(r"T(\d+)_[lg]_\w+\[([^\]]*)\]( \(DeviceMesh\{[{}\d ]*\}\))?")
_ID = re.compile(r"([ibrn])(deviceIdx\.[xyz]|[A-Za-z.]*?)\d+\{")

TORCH_DTYPES = {"DataType.BFloat16": torch.bfloat16, "DataType.Bool": torch.bool, "DataType.Float": torch.float32,
                "DataType.Half": torch.float16, "DataType.Double": torch.float64, "DataType.Int": torch.int64,
                "DataType.Int32": torch.int32}


def sections(dump: str) -> list:
    """[(pass name, text)] of the dump, "before" for the fusion before the passes."""
    out, name, lines = [], None, []
    for line in dump.splitlines():
        m = _SECTION.match(line)
        if m:
            if name is not None:
                out.append((name, "\n".join(lines)))
            name, lines = (m.group(2) or "before"), []
        elif name is not None:
            if line.startswith("====="):
                out.append((name, "\n".join(lines)))
                name, lines = None, []
            else:
                lines.append(line)
    return out


def tv_tokens(section: str) -> dict:
    """Per TensorView number: its mesh and its loop domain as tokens, a device
    id as kind + mesh axis ("ix", "rx"), any other id as "."."""
    result = {}
    for m in TV_TEXT.finditer(section):
        number = int(m.group(1))
        if number in result:
            continue
        tokens = []
        for kind, parallel in _ID.findall(m.group(2)):
            tokens.append(kind + parallel[-1] if parallel.startswith("deviceIdx") else ".")
        mesh = m.group(3).strip()[1:-1] if m.group(3) else None
        result[number] = [mesh, " ".join(tokens)]
    return result


def communications(section: str) -> list:
    """(kind, mesh axis) of each resharding Set / reduction in a section:
    an allgather drops a mesh axis from the iteration axes; a reduction whose
    result has rDIDa is a reduce-scatter when a also shards an iteration axis
    of the result, else an allreduce."""
    comms = []
    exprs = re.split(r"\n(?=T\d+_)", section)
    for text in exprs:
        tvs = list(TV_TEXT.finditer(text))
        if len(tvs) < 2:
            continue
        out, inp = tvs[0], tvs[1]
        body = text[out.end():]

        def axes(m, kind):
            return {p[-1] for k, p in _ID.findall(m.group(2)) if k == kind and p.startswith("deviceIdx")}

        if re.match(r"\s*=\s*Set\(", body):
            lost = axes(inp, "i") - axes(out, "i")
            gained = axes(out, "i") - axes(inp, "i")
            for a in sorted(lost):
                comms.append(["allgather", a])
            if lost and gained:
                comms.append(["all_to_all?", "".join(sorted(gained))])
        elif re.match(r"\s*=\s*reduction\(", body):
            for a in sorted(axes(out, "r")):
                comms.append(["reduce_scatter" if a in axes(out, "i") else "allreduce", a])
    return comms


def local_inputs(fd, shapes):
    """Meta tensors with each input's LOCAL shape on rank 0 (global / its device
    splits, as nvshard reads them)."""
    from nvshard.nvfuser import read_fusion
    from nvshard.runtime.executor import shard_divisors

    divisors = shard_divisors(read_fusion(fd.fusion).fd.fusion, 0)
    tensors = []
    for v, shape, divisor in zip(fd.fusion.inputs(), shapes, divisors):
        local = [extent // d for extent, d in zip(shape, divisor)]
        tensors.append(torch.empty(local, dtype=TORCH_DTYPES[str(v.dtype())], device="meta"))
    return tensors


def run(name: str, mode: str, propagation=None) -> dict:
    import nvfuser_direct as nvf

    fd, named, shapes = programs.build(nvf, name)
    summary = {"program": name, "mode": mode}
    if mode == "bridge":
        import nvshard.nvfuser as bridge

        plan = bridge.propagate(fd, shapes, propagation)
        summary["written"] = {w.number: tv_tokens(str(plan.read.pairs[w.number][0]))[w.number] for w in plan.writes}
        summary["nvshard_communications"] = [[c.kind, c.mesh_axis] for c in plan.communications]
        summary["nvshard_bytes"] = plan.bytes_per_device
    if mode == "switch":
        import nvshard.nvfuser as bridge

        bridge.enable()  # fd.execute reads global shapes from the local inputs
    os.environ["NVFUSER_DUMP"] = "pre_segmenter_logging"
    inputs = local_inputs(fd, shapes)
    # nvFuser prints the dump from C++ to fd 1: capture at the file-descriptor level
    dump = _capture_fd1(lambda: _execute(fd, inputs))
    error = dump[1]
    text = dump[0]
    if mode == "switch":
        summary["nvshard_log_at"] = text.find("Sharding decisions:")
        summary["nvshard_header_at"] = text.find("nvshard.nvfuser:")
        summary["real_first_pass_at"] = text.find("Fusion after pass: RemoveEmptyPass")
        plan = getattr(fd, "nvshard_plan", None)
        summary["written"] = {w.number: tv_tokens(str(plan.read.pairs[w.number][0]))[w.number]
                              for w in plan.writes} if plan else {}
        summary["nvshard_communications"] = [[c.kind, c.mesh_axis] for c in plan.communications] if plan else []
        summary["nvshard_bytes"] = plan.bytes_per_device if plan else None  # global shapes read from the shards
        # real nvFuser's sections follow nvshard's: keep those after nvshard's log
        text = text[text.find("Fusion before PreSegmenter:", max(summary["nvshard_log_at"], 0)):]
    secs = sections(text)
    summary["passes"] = [n for n, _ in secs]
    summary["error"] = error
    by_name, previous = {}, None
    for n, body in secs:
        if n == "PropagateShardingsPass" and n not in by_name:
            by_name["before propagation"] = previous  # after the passes that run before propagation
        by_name.setdefault(n, body)  # the first of each: real nvFuser's own sections
        previous = body
    if "PropagateShardingsPass" in by_name:
        summary["real_before"] = tv_tokens(by_name["before"])
        summary["real_before_propagation"] = tv_tokens(by_name["before propagation"])
        summary["real_propagated"] = tv_tokens(by_name["PropagateShardingsPass"])
    if "DecomposeReshardingsPass" in by_name:
        summary["real_communications"] = communications(by_name["DecomposeReshardingsPass"])
    return summary


def _execute(fd, inputs):
    fd.execute(inputs)


def _capture_fd1(fn):
    import tempfile

    sys.stdout.flush()
    saved = os.dup(1)
    error = None
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            with contextlib.redirect_stdout(sys.stdout):
                fn()
        except Exception as e:  # the expected end on a machine without a CUDA driver
            error = f"{type(e).__name__}: {e}"
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    return text, error


if __name__ == "__main__":
    args = sys.argv[1:]
    result = run(args[0], args[1], args[2] if len(args) > 2 else None)
    print(json.dumps(result))
