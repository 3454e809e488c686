"""Shardy and GSPMD columns for tools/bench_comm.py: the benchmark's programs
written in JAX, compiled for CPU host devices with each partitioner, and the
collectives of the partitioned HLO turned into bytes received per device.

    bench_jax.available() -> bool
    bench_jax.measure(jax_key, mesh_shape, sizes) -> {"shardy": entry, "gspmd": entry}
    bench_jax.time_passes(jax_key, mesh_shape, sizes, repeats) -> seconds of the
        partitioners' passes (tools/bench_propagation.py; see _time_passes)

An entry is {"bytes": float, "collectives": {kind: count}, ...} or
{"error": "..."}. jax is optional: without it available() is False and
bench_comm.py leaves the columns out.

JAX runs in a worker subprocess (this file with --worker), started once and
fed one JSON request per line: XLA_FLAGS must give the host platform 8
devices before jax starts its CPU backend, and bench_comm.py has imported
torch long before. One program by hand, with its collectives:

    .venv/bin/python tools/bench_comm.py --jax-demo "triangle outgoing 0 1x2x2" [--hlo]

`tools/bench_jax.py --quick` checks the HLO reader on a module with known
bytes and the pass timer reader on a known log and, with jax, runs one small
program through both partitioners (bytes and pass times).

Programs (same math, dtypes and sizes as nvshard/models.py):
  triangle update    f32; z_in/mask [b->z, i->y, j->x], weights replicated; the
                     batched matmul of the fusion with its operand order
  triangle attention f32; same input shardings; sdpfa_fwd with bias and mask
                     as explicit float math (scores, -inf mask, logsumexp)
  MLP                f32; 1-D mesh (x): inp replicated (TP) or t->x (SP),
                     up_w 4h->x, down_w 4h->x; 2x2 mesh (y, x): inp t->y (TP) or
                     t->(y, x) (SP), weights on x, replicated over y
  transformer layer  bf16 as upstream's test_transformer_forward; 1-D mesh:
                     inp replicated (TP) or s->x (SP); 2x2: inp b->y (SP: also
                     s->x); qkv_w/qkv_b/up_w/up_b out-features->x,
                     proj_w/down_w in-features->x, layer norm weights and
                     proj_b/down_b replicated. Dropout masks come from jax.random
                     with a constant key (threefry, partitionable: no
                     communication), sdpfa_fwd's dropout and causal mask as
                     explicit math with bf16 matmul operands.
  stacks             a last key element N: N triangle blocks (each adding its
                     update to z), N residual MLP blocks or N transformer
                     layers (the last output only), each feeding the next, as
                     tools/bench_propagation.py builds them.
Only the inputs are annotated (jax.jit in_shardings); the outputs are left to
the partitioner (out_shardings unspecified), as nvshard's fusion outputs are
When the partitioner then shards an output
differently from nvshard default (its plan is read in the parent process), the
entry says so ("output_differs": bench_comm prints "†") and also carries
"pinned_outputs": the same compile with out_shardings = nvshard default's.

Which HLO: the module right after the SPMD partitioner (and its cleanup: DCE,
CSE), dumped per compile (xla_dump_hlo_pass_re=spmd-partitioning): per-device
shapes in the program's own dtypes. The final CPU executable
(compiled.as_text()) is counted too ("compiled" in the entry) but is not the
headline: XLA's CPU pipeline promotes bf16 all-reduces and all-gathers to f32
(all-reduce-promotion, float-normalization-bf16), which doubles the
transformer's bytes, and may combine collectives; neither is a partitioning
decision and neither happens on GPU.

Bytes, per collective and per device of each replica group (d = group size,
sizes of the per-device buffers):
  all-gather          (d-1) * operand          (= out - in)
  reduce-scatter      (d-1)/d * operand        (= in - out)
  all-reduce          2(d-1)/d * operand
  all-to-all          (d-1)/d * operand(s)
  collective-permute  operand, to each target
Replica groups in all three printed forms: {{0,1},{2,3}}, iota [G,S]<=[dims]T(p)
and Shardy's mesh['a'=2,'b'=2](, device_ids=(...))? {'b'} (sub-axes 'b':(1)2
too). Async pairs count at their -start; collectives inside called computations
(async wrappers, while bodies, conditionals) count once per call site; a
combined (tuple) collective counts once per tensor operand; groups of one
device move nothing and are left out. The figure is the most any device
receives. "bytes_rs_equivalent" also counts each all-reduce whose only users
are dynamic-slices of a 1/d block as the reduce-scatter it amounts to (XLA's
GPU pipeline makes that rewrite, reduce-scatter-creator; the CPU one does not).
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import subprocess
import sys
import tempfile
import time
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
N_HOST_DEVICES = 8
REQUEST_TIMEOUT_S = 600.0

# -- the parent side ----------------------------------------------------------------------------


# Worker kinds: "comm" for bytes; "passes" logs XLA's pass timers (VLOG 1 of
# hlo_pass_pipeline.cc, INFO level), which only environment variables read at
# start-up can switch on, so it gets a process of its own.
_WORKER_ENV = {"comm": {}, "passes": {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "hlo_pass_pipeline=1"}}


class _Worker:
    def __init__(self, kind: str = "comm"):
        env = dict(os.environ)
        flags = env.get("XLA_FLAGS", "")
        flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", flags)
        env["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={N_HOST_DEVICES}").strip()
        env["JAX_PLATFORMS"] = "cpu"
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.update(_WORKER_ENV[kind])
        self.log = tempfile.TemporaryFile(mode="w+b")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)

    def ask(self, request: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        line = b""
        fd = self.proc.stdout.fileno()
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise TimeoutError(f"jax worker took more than {timeout:.0f} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise RuntimeError("jax worker exited: " + self.log_tail())
            line += chunk
        return json.loads(line.decode())

    def log_tail(self, n: int = 2000) -> str:
        try:
            self.log.seek(0)
            return self.log.read().decode(errors="replace")[-n:]
        except Exception:  # noqa: BLE001
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                self.proc.kill()
                self.proc.wait()


_workers: dict = {}
_available: dict = {}
_devices = 0


def _get_worker(kind: str = "comm") -> _Worker:
    if kind not in _workers or not _workers[kind].alive():
        _workers[kind] = _Worker(kind)
    return _workers[kind]


def available(kind: str = "comm") -> bool:
    """jax importable and the CPU host devices usable (asks the worker once)."""
    global _devices
    if kind in _available:
        return _available[kind]
    import importlib.util

    try:
        found = importlib.util.find_spec("jax") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        _available[kind] = False
        return False
    try:
        reply = _get_worker(kind).ask({"op": "ping"}, timeout=120)
        _devices = int(reply.get("devices", 0))
        _available[kind] = _devices >= 1 and "error" not in reply
    except Exception:  # noqa: BLE001
        _available[kind] = False
    if not _available[kind]:
        close(kind)
    return _available[kind]


def measure(jax_key, mesh_shape, sizes, nvshard_outputs=None, hlo: bool = False) -> dict:
    """{"shardy": entry, "gspmd": entry} for one program on one mesh.
    `nvshard_outputs`: the fusion outputs' shardings under nvshard default, as
    PartitionSpec-like lists (per dimension, mesh axis names outer first), in
    the JAX port's output order; entries then say whether the partitioner's
    outputs differ. `hlo`: also return the partitioned HLO text."""
    if not available():
        err = {"error": "jax not available"}
        return {"shardy": err, "gspmd": dict(err)}
    request = {"op": "measure", "key": list(jax_key), "mesh": list(mesh_shape), "sizes": sizes,
               "nvshard_outputs": nvshard_outputs, "hlo": hlo}
    try:
        reply = _get_worker().ask(request)
    except Exception as e:  # noqa: BLE001
        err = {"error": f"{type(e).__name__}: {e}"}
        return {"shardy": err, "gspmd": dict(err)}
    if "error" in reply and "shardy" not in reply:
        return {"shardy": {"error": reply["error"]}, "gspmd": {"error": reply["error"]}}
    return {"shardy": reply["shardy"], "gspmd": reply["gspmd"]}


def time_passes(jax_key, mesh_shape, sizes, repeats: int = 3) -> dict:
    """Seconds of the partitioners' passes on one program (bench_propagation.py):
    {"gspmd": {"propagation_s", "partitioning_s", "prop_partition_s", "compile_s"},
     "shardy": {"propagation_s", "xla_pass_s", "partitioning_s", "prop_partition_s", "compile_s"}}
    or {"error": "..."}. How: _time_passes."""
    if not available("passes"):
        return {"error": "jax not available"}
    request = {"op": "time_passes", "key": list(jax_key), "mesh": list(mesh_shape), "sizes": sizes,
               "repeats": repeats}
    try:
        return _get_worker("passes").ask(request)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def close(kind: Optional[str] = None) -> None:
    for k in [kind] if kind else list(_workers):
        w = _workers.pop(k, None)
        if w is not None:
            w.close()


import atexit  # noqa: E402

atexit.register(close)

# -- HLO text: collectives and bytes (plain Python, no jax needed) ------------------------------

DTYPE_BYTES = {"pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2,
               "s32": 4, "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8,
               "c128": 16, "token": 0, "tf32": 4}
KINDS = {"all-gather": "allgather", "all-gather-start": "allgather", "reduce-scatter": "reduce_scatter",
         "all-reduce": "allreduce", "all-reduce-start": "allreduce", "all-to-all": "all_to_all",
         "ragged-all-to-all": "all_to_all", "collective-permute": "collective_permute",
         "collective-permute-start": "collective_permute"}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z0-9]*)?)\[([0-9,]*)\]")
_COMP_HEAD = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_CALLS = re.compile(r"\b(calls|to_apply|body|condition|branch_computations|called_computations)="
                    r"(\{[^}]*\}|%?[\w.\-]+)")


def _dtype_bytes(name: str) -> float:
    if name in DTYPE_BYTES:
        return DTYPE_BYTES[name]
    if name.startswith("f8") or name.startswith("f4") or name.startswith("f6"):
        return 1  # fp8 (and sub-byte floats rounded up)
    raise ValueError(f"unknown HLO element type {name!r}")


def shape_bytes(shape: str) -> float:
    """Bytes of an HLO shape string, tuples summed (layouts ignored)."""
    total = 0.0
    for dtype, dims in _ARRAY.findall(shape):
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += n * _dtype_bytes(dtype)
    return total


def _balanced(text: str, start: int) -> int:
    """Index just past the bracket group opening at text[start]."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    for i in range(start, len(text)):
        ch = text[i]
        if ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
    raise ValueError(f"unbalanced brackets in {text[start:start + 80]!r}")


def _split_top(text: str) -> list:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def parse_instruction(rest: str):
    """'SHAPE opcode(operands), attrs' -> (shape, opcode, [operand texts], attrs)."""
    rest = rest.strip()
    if rest.startswith("("):
        end = _balanced(rest, 0)
    else:
        m = re.match(r"\S+", rest)
        end = m.end()
    shape = rest[:end]
    tail = rest[end:].lstrip()
    m = re.match(r"([\w\-]+)\(", tail)
    if not m:
        return shape, tail.split(" ")[0], [], ""
    opcode = m.group(1)
    close = _balanced(tail, m.end() - 1)
    operands = _split_top(tail[m.end():close - 1])
    return shape, opcode, operands, tail[close:]


def _iota_transposed(dims: list, perm: list) -> list:
    """iota(prod(dims)).reshape(dims).transpose(perm), flattened."""
    n = math.prod(dims)
    strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    tdims = [dims[p] for p in perm]
    flat = []
    for idx in range(n):
        rem, coords = idx, []
        for d in reversed(tdims):
            coords.append(rem % d)
            rem //= d
        coords.reverse()
        flat.append(sum(coords[k] * strides[perm[k]] for k in range(len(perm))))
    return flat


def parse_groups(attrs: str, n_devices: int) -> list:
    """replica_groups as lists of device ids ({{0,1},{2,3}}, {} = all, iota
    [G,S]<=[dims]T(perm), or Shardy's mesh-axes form)."""
    m = re.search(r"replica_groups=", attrs)
    if not m:
        return [list(range(n_devices))]
    text = attrs[m.end():]
    if text.startswith("mesh[") or text.startswith("maximal_mesh["):
        return _mesh_axes_groups(text)
    if text.startswith("{"):
        body = text[:_balanced(text, 0)]
        groups = [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([0-9,\s]*)\}", body[1:-1])]
        groups = [g for g in groups if g]
        return groups or [list(range(n_devices))]
    m = re.match(r"\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", text)
    if not m:
        raise ValueError(f"cannot read replica_groups {text[:60]!r}")
    gshape = [int(x) for x in m.group(1).split(",")]
    dims = [int(x) for x in m.group(2).split(",")]
    perm = [int(x) for x in m.group(3).split(",")] if m.group(3) else list(range(len(dims)))
    flat = _iota_transposed(dims, perm)  # reshaped to gshape: one group a row
    n = len(flat)
    size = gshape[-1]
    return [flat[i:i + size] for i in range(0, n, size)]


def _mesh_axes_groups(text: str) -> list:
    """Shardy's mesh-axes form: mesh['a'=2,'b'=2](, device_ids=(...))? {'b'} or
    {'a':(1)2}: the groups are the devices that differ only in the named axes
    (or sub-axes: (pre-size)size of an axis)."""
    if text.startswith("maximal_mesh["):
        return []
    close = _balanced(text, 4)
    axes = [(name, int(size)) for name, size in re.findall(r"'?([^',=\[\]]+)'?\s*=\s*(\d+)", text[5:close - 1])]
    rest = text[close:]
    n = math.prod(size for _, size in axes)
    ids = list(range(n))
    m = re.match(r"\s*,\s*device_ids=\(", rest)
    if m:
        end = _balanced(rest, m.end() - 1)
        body = rest[m.end():end - 1].strip()
        io = re.fullmatch(r"\[([0-9,]+)\](?:T\(([0-9,]+)\))?", body)
        if io and math.prod(int(x) for x in io.group(1).split(",")) == n:
            # an iota tile assignment: iota(dims).transpose(perm)
            dims = [int(x) for x in io.group(1).split(",")]
            perm = [int(x) for x in io.group(2).split(",")] if io.group(2) else list(range(len(dims)))
            ids = _iota_transposed(dims, perm)
        else:
            ids = [int(x) for x in re.findall(r"\d+", body)]
        if len(ids) != n:
            raise ValueError(f"cannot read mesh device ids {body!r}")
        rest = rest[end:]
    m = re.match(r"\s*\{", rest)
    if not m:
        raise ValueError(f"cannot read mesh replica groups {text[:120]!r}")
    body = rest[m.end() - 1:_balanced(rest, m.end() - 1)][1:-1]
    names = [a for a, _ in axes]
    refs = []  # (axis index, pre_size or None, size)
    for ref in _split_top(body):
        r = re.match(r"'?([^':]+)'?(?::\((\d+)\)(\d+))?$", ref.strip())
        if not r:
            raise ValueError(f"cannot read mesh axis {ref!r}")
        refs.append((names.index(r.group(1)), int(r.group(2)) if r.group(2) else None,
                     int(r.group(3)) if r.group(3) else None))
    groups: dict = {}
    for flat in range(n):
        coords, rem = [], flat
        for _, size in reversed(axes):
            coords.append(rem % size)
            rem //= size
        coords.reverse()
        key = list(coords)
        for axis, pre, size in refs:
            full = axes[axis][1]
            if pre is None:
                key[axis] = -1
            else:
                inner = full // (pre * size)
                digit = (coords[axis] // inner) % size
                key[axis] = key[axis] - digit * inner if key[axis] >= 0 else key[axis]
        groups.setdefault(tuple(key), []).append(ids[flat])
    return list(groups.values())


def parse_pairs(attrs: str) -> list:
    m = re.search(r"source_target_pairs=\{", attrs)
    if not m:
        return []
    body = attrs[m.end() - 1:_balanced(attrs, m.end() - 1)]
    return [(int(a), int(b)) for a, b in re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", body)]


def parse_module(text: str):
    """{computation: [(name, shape, opcode, operands, attrs)]}, entry name."""
    comps, entry, cur = {}, None, None
    for line in text.splitlines():
        if cur is None:
            m = _COMP_HEAD.match(line)
            if m:
                cur = m.group(2)
                comps[cur] = []
                if m.group(1):
                    entry = cur
            continue
        if line.strip() == "}":
            cur = None
            continue
        m = _INSTR.match(line)
        if m:
            try:
                shape, opcode, operands, attrs = parse_instruction(m.group(2))
            except ValueError:
                continue
            comps[cur].append((m.group(1), shape, opcode, operands, attrs))
    return comps, entry


def collectives(text: str, n_devices: int) -> dict:
    """Bytes received per device and collective counts of an HLO module
    (partitioned: per-device shapes).

    Also "bytes_rs_equivalent": the same with every all-reduce whose users are
    all dynamic-slices of one 1/d block counted as the reduce-scatter it
    amounts to (XLA's GPU pipeline rewrites that pattern into a reduce-scatter,
    its CPU pipeline does not)."""
    comps, entry = parse_module(text)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    # Call multiplicities, from the entry down.
    mult = {entry: 1}
    order = [entry]
    notes = []
    seen = set()
    while order:
        name = order.pop(0)
        if name in seen:
            continue
        seen.add(name)
        for _, _, opcode, _, attrs in comps.get(name, []):
            if opcode == "while":
                notes.append("a while loop: its collectives counted once (trip count unknown)")
            if opcode in ("async-update", "async-done"):
                continue  # the same wrapped computation as its async-start: count it once
            for _, target in _CALLS.findall(attrs):
                for callee in re.findall(r"%?([\w.\-]+)", target.strip("{}")):
                    if callee in comps:
                        mult[callee] = mult.get(callee, 0) + mult[name]
                        order.append(callee)
    per_device = [0.0] * n_devices
    per_device_rs = [0.0] * n_devices
    counts: dict = {}
    counts_rs: dict = {}
    ops: dict = {}
    detail = []
    for comp, instrs in comps.items():
        k = mult.get(comp, 0)
        if not k:
            continue
        shapes = {name: shape for name, shape, *_ in instrs}
        users: dict = {}
        for name, shape, opcode, operands, attrs in instrs:
            for op in operands:
                refs = re.findall(r"%([\w.\-]+)", op)
                if refs:
                    users.setdefault(refs[-1], []).append((opcode, shape))
        for name, shape, opcode, operands, attrs in instrs:
            kind = KINDS.get(opcode)
            if kind is None:
                continue
            sizes = []
            for op in operands:
                refs = re.findall(r"%([\w.\-]+)", op)
                if refs and refs[-1] in shapes:
                    sizes.append(shape_bytes(shapes[refs[-1]]))
                elif _ARRAY.search(op):
                    sizes.append(shape_bytes(op))
                else:
                    raise ValueError(f"operand {op!r} of {name} has no known shape")
            if opcode == "collective-permute-start" or opcode == "collective-permute":
                sizes = sizes[:1]  # in-place permutes carry output/index operands too
            size = sum(sizes)
            as_rs = False
            if kind == "collective_permute":
                pairs = parse_pairs(attrs)
                received = {t: size for s, t in pairs if s != t}
                d = 2 if received else 1
                groups = []
            else:
                groups = parse_groups(attrs, n_devices)
                d = max(len(g) for g in groups) if groups else 1
                if d <= 1:
                    continue
                factor = {"allgather": d - 1, "reduce_scatter": (d - 1) / d, "allreduce": 2 * (d - 1) / d,
                          "all_to_all": (d - 1) / d}[kind]
                received = {dev: factor * size for g in groups if len(g) > 1 for dev in g}
                if opcode == "all-reduce" and len(sizes) == 1:
                    us = users.get(name, [])
                    as_rs = bool(us) and all(op == "dynamic-slice" and abs(shape_bytes(sh) * d - size) < 0.5
                                             for op, sh in us)
            if not received:
                continue
            for dev, b in received.items():
                if dev < n_devices:
                    per_device[dev] += k * b
                    per_device_rs[dev] += k * (b / 2 if as_rs else b)  # 2(d-1)/d -> (d-1)/d
            n_tensors = len(sizes) if kind != "all_to_all" else 1
            counts[kind] = counts.get(kind, 0) + k * n_tensors
            kind_rs = "reduce_scatter" if as_rs else kind
            counts_rs[kind_rs] = counts_rs.get(kind_rs, 0) + k * n_tensors
            ops[opcode] = ops.get(opcode, 0) + k
            detail.append(dict(op=opcode, name=name, shape=shape, operand_bytes=size, group_size=d,
                               groups=groups if len(groups) <= 8 else f"{len(groups)} groups",
                               mib_per_device=max(received.values()) / (1 << 20),
                               **({"then_dynamic_slice": True} if as_rs else {})))
    out = dict(bytes=max(per_device) if per_device else 0.0, collectives=counts, hlo_ops=ops,
               bytes_rs_equivalent=max(per_device_rs) if per_device_rs else 0.0,
               collectives_rs_equivalent=counts_rs, detail=detail)
    if notes:
        out["notes"] = sorted(set(notes))
    return out


# XLA's pass timers (hlo_pass_pipeline.cc at VLOG 1): "HLO pass NAME" when a
# pass starts, "HLO pass: NAME time: ... (N us)" when it ends, and the HLO
# verifier's runs in between as "Invariant checker ..." / "... done ...".
_LOG_CLOCK = re.compile(r"^[IWEF]\d{4} (\d\d):(\d\d):(\d\d(?:\.\d+)?)\s")
_PASS_START = re.compile(r"\]\s+HLO pass ([\w.\-]+)\s*$")
_PASS_END = re.compile(r"\]\s+HLO pass: ([\w.\-]+) time: .*?\((\d+) us\)")


def pass_seconds(log: str) -> dict:
    """{pass: seconds} from XLA's pass timers, summed over a pass's runs, less
    the verifier runs inside each: XLA checks the module after each pass that
    changed it, which is no part of the pass's own work."""
    out: dict = {}
    verified = 0.0  # verifier seconds so far
    check_from = None
    started: dict = {}
    for line in log.splitlines():
        clock = _LOG_CLOCK.match(line)
        if not clock:
            continue
        t = int(clock.group(1)) * 3600 + int(clock.group(2)) * 60 + float(clock.group(3))
        if "Invariant checker done" in line:
            if check_from is not None:
                verified += (t - check_from) % 86400  # past midnight
                check_from = None
        elif "Invariant checker" in line:
            check_from = t
        elif (m := _PASS_END.search(line)):
            inner = verified - started.pop(m.group(1), verified)
            out[m.group(1)] = out.get(m.group(1), 0.0) + max(0.0, int(m.group(2)) / 1e6 - inner)
        elif (m := _PASS_START.search(line)):
            started[m.group(1)] = verified
    return out


# -- the worker side (jax) ----------------------------------------------------------------------


def _programs():
    """Builders: key -> (fn, [ShapeDtypeStruct], [PartitionSpec], axis names)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    f32, bf16 = jnp.float32, jnp.bfloat16

    def linear(x, w, b=None):
        # nvFuser's linear: x @ w.T (+ b), result in the input dtype. The dot
        # itself yields that dtype (XLA accumulates in float), so partial sums
        # are reduced in the dtype nvFuser's linear output has (bf16 in the
        # transformer), not in float.
        y = jnp.matmul(x, w.T)
        return y if b is None else y + b

    def layer_norm(x, w, b):
        io = x.dtype
        x = x.astype(f32)
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + 1e-5)
        return (y * w + b).astype(io)

    def gating(z, w_p, z_in, w_g):
        io = z.dtype
        p = linear(z, w_p)
        g = jax.nn.sigmoid(linear(z_in, w_g))
        return (p * g).astype(io)

    def gelu_tanh(x):
        x = x.astype(f32)
        x3 = x * x * x
        inner = 0.797885 * (x + 0.044715 * x3)
        return 0.5 * x * (1.0 + jnp.tanh(inner))

    def triangle(direction, swap, s, names, layers=0):
        """layers = 0: one block (models.triangle_update); N: N blocks each
        adding its update to z (bench_propagation.py's triangle stack)."""
        b, n, c = s["b"], s["n"], s["c"]
        dt = f32

        def block(z_in, w_norm_in, b_norm_in, w_p_in, w_g_in, w_norm_out, b_norm_out, w_p_out, w_g_out, mask):
            z_in = layer_norm(z_in, w_norm_in, b_norm_in)
            z = gating(z_in, w_p_in, z_in, w_g_in)
            z = jnp.where(mask[..., None], z, jnp.zeros((), z.dtype))
            a, bb = z[..., :c], z[..., c:]
            if direction == "outgoing":
                a = jnp.transpose(a, (0, 3, 1, 2))  # [b, c, i, k]
                bb = jnp.transpose(bb, (0, 3, 2, 1))  # [b, c, k, j]
            else:
                a = jnp.transpose(a, (0, 3, 2, 1))
                bb = jnp.transpose(bb, (0, 3, 1, 2))
            if swap:
                z = jnp.matmul(jnp.transpose(bb, (0, 1, 3, 2)), jnp.transpose(a, (0, 1, 3, 2)))  # [b, c, j, i]
                z = jnp.transpose(z, (0, 3, 2, 1))
            else:
                z = jnp.matmul(a, bb)  # [b, c, i, j]
                z = jnp.transpose(z, (0, 2, 3, 1))
            z = layer_norm(z, w_norm_out, b_norm_out)
            return gating(z, w_p_out, z_in, w_g_out)

        S = jax.ShapeDtypeStruct
        weights = [S((c,), dt), S((c,), dt), S((2 * c, c), dt), S((2 * c, c), dt), S((c,), dt), S((c,), dt),
                   S((c, c), dt), S((c, c), dt)]
        z, y, x = names
        if not layers:
            args = [S((b, n, n, c), dt)] + weights + [S((b, n, n), jnp.bool_)]
            return block, args, [P(z, y, x, None)] + [P()] * 8 + [P(z, y, x)]

        def stack(z, mask, *ws):
            for i in range(layers):
                z = z + block(z, *ws[8 * i:8 * i + 8], mask)
            return z

        args = [S((b, n, n, c), dt), S((b, n, n), jnp.bool_)] + weights * layers
        return stack, args, [P(z, y, x, None), P(z, y, x)] + [P()] * (8 * layers)

    def attention(direction, s, names):
        b, n, c, ch, h = s["b"], s["n"], s["c"], s["c_hidden"], s["heads"]
        hc = h * ch
        dt = f32

        def fn(z_in, w_q, w_k, w_b, mask, w_v, w_g, w_o):
            if direction == "incoming":
                z_in = jnp.transpose(z_in, (0, 2, 1, 3))
                mask = jnp.transpose(mask, (0, 2, 1))

            def heads(t):  # [b, i, j, h*c] -> [b, i, h, j, c]
                return jnp.transpose(t.reshape(b, n, n, h, -1), (0, 1, 3, 2, 4))

            q_h = heads(linear(z_in, w_q))
            k_h = heads(linear(z_in, w_k))
            b_h = jnp.transpose(linear(z_in, w_b), (0, 3, 1, 2))[:, None]  # [b, 1, h, j, k]
            m = mask[:, :, None, None, :]  # [b, i, 1, 1, k]
            v_h = heads(linear(z_in, w_v))
            scores = jnp.matmul(q_h, jnp.swapaxes(k_h, -1, -2), preferred_element_type=f32) / math.sqrt(ch)
            scores = scores + b_h
            scores = jnp.where(m, scores, -jnp.inf)
            lse = jax.nn.logsumexp(scores, axis=-1, keepdims=True)
            probs = jnp.exp(scores - lse)
            o_h = jnp.matmul(probs.astype(dt), v_h, preferred_element_type=f32).astype(dt)
            g_h = heads(jax.nn.sigmoid(linear(z_in, w_g)))
            o_h = (o_h * g_h).astype(dt)
            o = jnp.transpose(o_h, (0, 1, 3, 2, 4)).reshape(b, n, n, hc)
            z_out = linear(o, w_o)
            if direction == "incoming":
                z_out = jnp.transpose(z_out, (0, 2, 1, 3))
            return z_out

        S = jax.ShapeDtypeStruct
        args = [S((b, n, n, c), dt), S((hc, c), dt), S((hc, c), dt), S((h, c), dt), S((b, n, n), jnp.bool_),
                S((hc, c), dt), S((hc, c), dt), S((c, hc), dt)]
        z, y, x = names
        specs = [P(z, y, x, None), P(), P(), P(), P(z, y, x), P(), P(), P()]
        return fn, args, specs

    def mlp(sp, t, h, names, layers=1):
        """`layers` residual blocks, each output the next block's input."""
        dt = f32

        def fn(inp, *ws):
            for i in range(layers):
                y = linear(inp, ws[2 * i])
                g = gelu_tanh(y).astype(dt)
                o = linear(g, ws[2 * i + 1])
                inp = (o + inp).astype(dt)
            return inp

        S = jax.ShapeDtypeStruct
        args = [S((t, h), dt)] + [S((4 * h, h), dt), S((h, 4 * h), dt)] * layers
        tp = names[-1]
        if len(names) == 1:  # annotate_mlp
            inp = P(tp, None) if sp else P()
        else:  # annotate_mlp_2d
            dp = names[-2]
            inp = P((dp, tp), None) if sp else P(dp, None)
        return fn, args, [inp] + [P(tp, None), P(None, tp)] * layers

    def transformer(sp, s, names, layers=0):
        """layers = 0: one layer with all the fusion's outputs; N: N layers,
        each output the next one's input, the last output only
        (bench_propagation.py's transformer stack)."""
        b, sq, heads, e = s["b"], s["s"], s["heads"], s["e"]
        dh = e // heads
        p_drop = 0.1

        def ln(x, w, bias):  # x float [b, s, e]
            mean = jnp.mean(x, axis=2)
            var = jnp.mean(jnp.square(x - mean[..., None]), axis=2)
            rstd = jax.lax.rsqrt(var + 1e-5)[..., None]  # [b, s, 1] as the fusion's
            y = (x - mean[..., None]) * rstd
            y = y * w.astype(f32) + bias.astype(f32)
            return y.astype(bf16), mean, rstd

        def dropout(x, key, shape):
            mask = jax.random.uniform(key, shape, dtype=bf16) < (1.0 - p_drop)
            return x.astype(f32) * mask.astype(f32) * (1.0 / (1.0 - p_drop)), mask

        def sdpa(q, k, v, key):  # [b, h, s, d] bf16, causal, dropout
            scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2), preferred_element_type=f32) / math.sqrt(dh)
            causal = jnp.tril(jnp.ones((sq, sq), jnp.bool_))
            scores = jnp.where(causal, scores, -jnp.inf)
            lse = jax.nn.logsumexp(scores, axis=-1)
            probs = jnp.exp(scores - lse[..., None])
            keep = jax.random.uniform(key, probs.shape, dtype=f32) >= p_drop
            probs = probs * keep / (1.0 - p_drop)
            out = jnp.matmul(probs.astype(bf16), v, preferred_element_type=f32).astype(bf16)
            return out, lse

        def fn(inp, ln0_w, ln0_b, qkv_w, qkv_b, proj_w, proj_b, ln1_w, ln1_b, up_w, up_b, down_w, down_b, key=None):
            k_attn, k_mha, k_mlp = jax.random.split(jax.random.key(0) if key is None else key, 3)
            x = inp.astype(f32)
            ln0, ln0_mean, ln0_rstd = ln(x, ln0_w, ln0_b)
            qkv = linear(ln0, qkv_w, qkv_b)
            qkv_h = qkv.reshape(b, sq, heads, 3 * dh)
            q, k, v = (jnp.transpose(qkv_h[..., i * dh:(i + 1) * dh], (0, 2, 1, 3)) for i in range(3))
            sdpa_out, lse = sdpa(q, k, v, k_attn)
            attn = jnp.transpose(sdpa_out, (0, 2, 1, 3)).reshape(b, sq, e)
            proj = linear(attn, proj_w, proj_b)
            dropped, mha_mask = dropout(proj, k_mha, (b, sq, e))
            resid = x + dropped
            ln1, ln1_mean, ln1_rstd = ln(resid, ln1_w, ln1_b)
            up = linear(ln1, up_w, up_b)
            g = gelu_tanh(up).astype(bf16)
            down = linear(g, down_w, down_b)
            dropped2, mlp_mask = dropout(down, k_mlp, (b, sq, e))
            out = (resid + dropped2).astype(bf16)
            # the fusion's outputs, less sdpa's philox seed/offset (scalars)
            return (ln0_mean, ln0_rstd, qkv, sdpa_out, lse, proj, mha_mask, ln1_mean, ln1_rstd, up, mlp_mask,
                    out)

        S = jax.ShapeDtypeStruct
        shapes = [(b, sq, e), (e,), (e,), (3 * e, e), (3 * e,), (e, e), (e,), (e,), (e,), (4 * e, e), (4 * e,),
                  (e, 4 * e), (e,)]
        tp = names[-1]
        if len(names) == 1:  # annotate_transformer
            inp = P(None, tp, None) if sp else P()
        else:  # annotate_transformer_2d
            dp = names[-2]
            inp = P(dp, tp, None) if sp else P(dp, None, None)
        col, row, rep = P(tp, None), P(None, tp), P()
        specs = [rep, rep, col, P(tp), row, rep, rep, rep, col, P(tp), row, rep]
        if not layers:
            return fn, [S(shape, bf16) for shape in shapes], [inp] + specs

        def stack(x, *ws):
            for i in range(layers):
                x = fn(x, *ws[12 * i:12 * i + 12], key=jax.random.fold_in(jax.random.key(0), i))[-1]
            return x

        return stack, [S(shape, bf16) for shape in shapes[:1] + shapes[1:] * layers], [inp] + specs * layers

    def build(key, sizes, names):
        # An optional last element stacks that many blocks (tools/bench_propagation.py).
        kind = key[0]
        if kind == "triangle":
            return triangle(key[1], bool(key[2]), sizes["TRI"], names, *[int(k) for k in key[3:4]])
        if kind == "attention":
            return attention(key[1], sizes["ATTN"], names)
        if kind == "mlp":
            return mlp(bool(key[1]), int(key[2]), int(key[3]), names, *[int(k) for k in key[4:5]])
        if kind == "transformer":
            return transformer(bool(key[1]), sizes["TF"], names, *[int(k) for k in key[2:3]])
        raise ValueError(f"unknown program {key!r}")

    return build


def _axis_names(key, mesh_shape) -> tuple:
    if key[0] in ("triangle", "attention"):
        if len(mesh_shape) != 3:
            raise ValueError(f"triangle programs need a 3-D (dp, cp, cp) mesh, got {mesh_shape}")
        return ("z", "y", "x")
    return ("y", "x")[-len(mesh_shape):] if len(mesh_shape) <= 2 else None


def _spec_text(sharding) -> str:
    spec = getattr(sharding, "spec", None)
    if spec is not None:
        return str(tuple(spec))
    return str(sharding)


def _compile(key, mesh_shape, sizes, shardy: bool, want_hlo: bool = False, expected_outputs=None,
             pin_outputs: bool = False) -> dict:
    """Compile one program with one partitioner; count the collectives of the
    module right after SPMD partitioning (per-device shapes, the program's
    dtypes), and, for reference, of the final CPU executable."""
    import shutil
    import tempfile

    import jax
    from jax.sharding import NamedSharding

    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        mesh, fn, args, specs = _mesh_and_program(key, mesh_shape, sizes)
    except _TooFewDevices as e:
        return dict(error=str(e))
    n = mesh.size
    expected = None
    if expected_outputs is not None:
        from jax.sharding import PartitionSpec as P

        expected = [NamedSharding(mesh, P(*[tuple(a) if len(a) > 1 else (a[0] if a else None) for a in dims]))
                    for dims in expected_outputs]
    kwargs = {}
    if pin_outputs:
        if expected is None:
            return dict(error="no nvshard output shardings to pin to")
        kwargs["out_shardings"] = tuple(expected) if len(expected) > 1 else expected[0]
    jitted = jax.jit(fn, in_shardings=tuple(NamedSharding(mesh, s) for s in specs), **kwargs)
    dump = tempfile.mkdtemp(prefix="bench_jax_")
    try:
        t0 = time.perf_counter()
        lowered = jitted.lower(*args)
        compiled = lowered.compile(compiler_options={"xla_dump_to": dump,
                                                     "xla_dump_hlo_pass_re": "spmd-partitioning"})
        compile_s = time.perf_counter() - t0
        final_text = compiled.as_text()
        after = sorted(f for f in os.listdir(dump) if "after_spmd-partitioning" in f and f.endswith(".txt"))
        partitioned = open(os.path.join(dump, after[-1])).read() if after else None
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    final = collectives(final_text, n)
    if partitioned is not None:
        entry = collectives(partitioned, n)
        entry["hlo_stage"] = "after spmd-partitioning"
    else:
        entry = dict(final)
        entry["hlo_stage"] = "compiled (no dump of the partitioned module)"
    entry["compiled"] = {k: final[k] for k in ("bytes", "collectives", "bytes_rs_equivalent")}
    entry["compile_s"] = compile_s
    outs = compiled.output_shardings
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    entry["output_shardings"] = [_spec_text(s) for s in outs]
    if expected is not None:
        out_avals = jax.eval_shape(fn, *args)
        out_avals = out_avals if isinstance(out_avals, (list, tuple)) else [out_avals]
        if len(expected) != len(outs):
            entry["output_compare"] = f"{len(outs)} JAX outputs, {len(expected)} nvshard outputs"
        else:
            differ = [i for i, (got, want, aval) in enumerate(zip(outs, expected, out_avals))
                      if not got.is_equivalent_to(want, len(aval.shape))]
            entry["output_differs"] = bool(differ)
            if differ:
                entry["outputs_differing"] = differ
                entry["nvshard_output_shardings"] = [_spec_text(s) for s in expected]
    entry["input_shardings"] = [str(tuple(s)) for s in specs]
    entry["partitioner"] = "shardy" if shardy else "gspmd"
    entry["jax"] = jax.__version__
    if want_hlo:
        entry["hlo"] = partitioned or final_text
        entry["hlo_compiled"] = final_text
    return entry


class _TooFewDevices(Exception):
    pass


def _mesh_and_program(key, mesh_shape, sizes) -> tuple:
    """(jax Mesh over the first host devices, fn, argument shapes, input specs)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    names = _axis_names(key, mesh_shape)
    n = math.prod(mesh_shape)
    devices = jax.devices("cpu")
    if len(devices) < n:
        raise _TooFewDevices(f"mesh {mesh_shape} needs {n} devices, jax has {len(devices)}")
    mesh = Mesh(np.array(devices[:n]).reshape(mesh_shape), names)
    return (mesh, *_programs()(key, sizes, names))


def _compile_logged(lowered) -> tuple:
    """(compile wall seconds, pass_seconds) of one compile, XLA's log read from fd 2."""
    import jax

    jax.clear_caches()  # else jax hands back what it compiled before
    with tempfile.TemporaryFile() as log:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            t0 = time.perf_counter()
            # Any option (this one at its default) makes jax compile again
            # rather than reuse the lowering's executable.
            lowered.compile(compiler_options={"xla_embed_ir_in_executable": False})
            wall = time.perf_counter() - t0
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        return wall, pass_seconds(log.read().decode(errors="replace"))


def _time_passes(key, mesh_shape, sizes, repeats: int) -> dict:
    """GSPMD: its passes' timers over `repeats` compiles (min of each).
    Shardy: sdy-propagation-pipeline run here, without the MLIR verifier as
    XLA's Shardy pass runs it, on the module JAX lowers (CPU time, min of
    `repeats`); and one compile for its XLA pass (import, propagation,
    export, HLO conversions) and the partitioner after it."""
    import jax
    from jax.sharding import NamedSharding
    from jaxlib.mlir import ir, passmanager

    try:
        mesh, fn, args, specs = _mesh_and_program(key, mesh_shape, sizes)
    except _TooFewDevices as e:
        return dict(error=str(e))
    out = dict(jax=jax.__version__, repeats=repeats)
    for col, shardy, prop_pass in (("gspmd", False, "sharding-propagation"), ("shardy", True, "shardy-xla")):
        jax.config.update("jax_use_shardy_partitioner", shardy)
        lowered = jax.jit(fn, in_shardings=tuple(NamedSharding(mesh, s) for s in specs)).lower(*args)
        entry = {}
        if shardy:
            text = lowered.as_text()
            cpu = []
            with lowered.compiler_ir("stablehlo").context:
                for _ in range(repeats):
                    module = ir.Module.parse(text)
                    pm = passmanager.PassManager.parse("builtin.module(sdy-propagation-pipeline)")
                    pm.enable_verifier(False)
                    t0 = time.process_time()
                    pm.run(module.operation)
                    cpu.append(time.process_time() - t0)
            entry["propagation_s"] = min(cpu)
        runs = [_compile_logged(lowered) for _ in range(1 if shardy else repeats)]
        missing = {prop_pass, "spmd-partitioning"} - set(runs[0][1])
        if missing:
            entry["error"] = f"no timer for {sorted(missing)} in XLA's log"
            out[col] = entry
            continue
        entry["compile_s"] = min(wall for wall, _ in runs)
        entry["xla_pass_s" if shardy else "propagation_s"] = min(p[prop_pass] for _, p in runs)
        entry["partitioning_s"] = min(p["spmd-partitioning"] for _, p in runs)
        entry["prop_partition_s"] = min(p[prop_pass] + p["spmd-partitioning"] for _, p in runs)
        out[col] = entry
    return out


def _serve(request: dict) -> dict:
    import jax

    if request.get("op") == "ping":
        return dict(devices=len(jax.devices("cpu")), jax=jax.__version__)
    if request.get("op") == "time_passes":
        return _time_passes(tuple(request["key"]), tuple(request["mesh"]), request["sizes"],
                            int(request.get("repeats", 3)))
    key, mesh, sizes = tuple(request["key"]), tuple(request["mesh"]), request["sizes"]
    expected = request.get("nvshard_outputs")
    out = {}
    for col, shardy in (("shardy", True), ("gspmd", False)):
        try:
            entry = _compile(key, mesh, sizes, shardy, request.get("hlo", False), expected)
            if entry.get("output_differs"):
                # Also with the outputs pinned to nvshard default's shardings.
                try:
                    pinned = _compile(key, mesh, sizes, shardy, False, expected, pin_outputs=True)
                    entry["pinned_outputs"] = {k: pinned[k] for k in ("bytes", "collectives", "bytes_rs_equivalent",
                                                                    "collectives_rs_equivalent")
                                               } if "error" not in pinned else pinned
                except Exception as e:  # noqa: BLE001
                    entry["pinned_outputs"] = dict(error=f"{type(e).__name__}: {str(e)[:500]}")
            out[col] = entry
        except Exception as e:  # noqa: BLE001
            out[col] = dict(error=f"{type(e).__name__}: {str(e)[:500]}")
    return out


def _worker_main() -> int:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={N_HOST_DEVICES}").strip()
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    try:
        import jax  # noqa: F401
    except Exception as e:  # noqa: BLE001
        out.write(json.dumps(dict(error=f"cannot import jax: {e}")) + "\n")
        out.flush()
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = _serve(json.loads(line))
        except Exception as e:  # noqa: BLE001
            reply = dict(error=f"{type(e).__name__}: {e}")
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


def describe(reply: dict, expected, want_hlo: bool = False) -> str:
    """A measure() reply, one collective a line (bench_comm.py --jax-demo prints it)."""
    lines = [f"nvshard default outputs: {expected}"]
    for col in ("shardy", "gspmd"):
        e = reply[col]
        if "error" in e:
            lines.append(f"{col} error {e['error']}")
            continue
        c = e["compiled"]
        lines.append(f"{col}: {e['bytes'] / (1 << 20):.3f} MiB {e['collectives']} (compile {e['compile_s']:.2f} s); "
                     f"AR+DS as RS {e['bytes_rs_equivalent'] / (1 << 20):.3f} MiB {e['collectives_rs_equivalent']}; "
                     f"final CPU HLO {c['bytes'] / (1 << 20):.3f} MiB {c['collectives']}")
        for d in e["detail"]:
            lines.append(f"   {d['op']:<20} {d['shape']:<40} d={d['group_size']} {d['mib_per_device']:.3f} MiB "
                         f"groups={d['groups']}{' then dynamic-slice' if d.get('then_dynamic_slice') else ''}")
        lines.append(f"   outputs: {e['output_shardings']} differ from nvshard's: {e.get('output_differs')} "
                     f"{e.get('outputs_differing', '')}")
        if "pinned_outputs" in e:
            p = e["pinned_outputs"]
            lines.append("   outputs pinned to nvshard's: " + (f"{p['bytes'] / (1 << 20):.3f} MiB {p['collectives']}"
                                                               if "bytes" in p else str(p)))
        if want_hlo:
            lines.append(e["hlo"])
    return "\n".join(lines)


# A partitioned module with one collective of each kind, and what each device receives.
_SELF_CHECK_HLO = """HloModule check, entry_computation_layout={(f32[4,8]{1,0})->f32[8,8]{1,0}}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (p: f32[4,8]) -> f32[8,8] {
  %p = f32[4,8]{1,0} parameter(0)
  %ag = f32[8,8]{1,0} all-gather(f32[4,8]{1,0} %p), replica_groups={{0,1},{2,3}}, dimensions={0}
  %ar = f32[8,8]{1,0} all-reduce(f32[8,8]{1,0} %ag), replica_groups=[1,4]<=[4], to_apply=%add
  %rs = f32[2,8]{1,0} reduce-scatter(f32[8,8]{1,0} %ar), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
  %a2a = f32[2,8]{1,0} all-to-all(f32[2,8]{1,0} %rs), replica_groups={{0,1},{2,3}}, dimensions={1}
  ROOT %cp = f32[8,8]{1,0} collective-permute(f32[8,8]{1,0} %ar), source_target_pairs={{0,1},{1,0},{2,3},{3,2}}
}
"""
# allgather 1 * 128 B; allreduce 2*3/4 * 256 B; reduce-scatter 3/4 * 256 B; all-to-all 1/2 * 64 B; permute 256 B
_SELF_CHECK_BYTES = 128 + 384 + 192 + 32 + 256


# A pass that runs 11.01 ms across midnight, 6 ms of it verifying.
_SELF_CHECK_LOG = """I1203 23:59:59.990000   9 hlo_pass_pipeline.cc:181]   HLO pass sharding-propagation
I1203 23:59:59.995000   9 hlo_pass_pipeline.cc:86]     Invariant checker hlo-verifier
I1204 00:00:00.001000   9 hlo_pass_pipeline.cc:89]     Invariant checker done hlo-verifier
I1204 00:00:00.001010   9 hlo_pass_pipeline.cc:176] HLO pass: sharding-propagation time: 11 ms (11010 us) (x)
"""


def self_check() -> None:
    """The HLO reader against a module whose bytes are known, and the pass
    timer reader against a known log (no jax needed)."""
    got = collectives(_SELF_CHECK_HLO, 4)
    want_counts = {"allgather": 1, "allreduce": 1, "reduce_scatter": 1, "all_to_all": 1, "collective_permute": 1}
    if got["bytes"] != _SELF_CHECK_BYTES or got["collectives"] != want_counts:
        raise AssertionError(f"HLO reader: {got['bytes']} B {got['collectives']}, expected "
                             f"{_SELF_CHECK_BYTES} B {want_counts}")
    timers = pass_seconds(_SELF_CHECK_LOG)
    if set(timers) != {"sharding-propagation"} or abs(timers["sharding-propagation"] - 0.00501) > 1e-6:
        raise AssertionError(f"pass timer reader: {timers}, expected sharding-propagation 5.01 ms")


QUICK_SIZES = dict(TRI=dict(b=2, n=8, c=8), ATTN=dict(b=2, n=8, c=8, c_hidden=4, heads=2), MLP_H=16,
                   TF=dict(b=2, s=16, heads=4, e=32))


def _quick() -> int:
    """CI's smoke run: the readers' self-checks; with jax, one small program
    through both partitioners, for bytes and for pass times."""
    self_check()
    print(f"HLO reader: {_SELF_CHECK_BYTES} B per device on the self-check module, as expected; "
          "pass timer reader as expected")
    if not available():
        print("jax not installed: partitioners not run")
        return 0
    key = ("triangle", "outgoing", False)
    reply = measure(key, (1, 2, 2), QUICK_SIZES)
    print(describe(reply, None))
    times = time_passes(key, (1, 2, 2), QUICK_SIZES, repeats=1)
    print("pass times:", json.dumps(times))
    failed = "error" in times or any("error" in times[col] for col in ("shardy", "gspmd"))
    return 1 if failed or any("error" in reply[col] for col in ("shardy", "gspmd")) else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.exit(_worker_main())
    if len(sys.argv) > 1 and sys.argv[1] == "--quick":
        sys.exit(_quick())
    print(__doc__)
