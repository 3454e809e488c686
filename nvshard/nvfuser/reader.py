"""Read a real nvfuser_direct Fusion into nvshard's IR.

The real bindings expose no expression list, op names, parallel types or
meshes, so the reader takes the fusion's program text from
`nvfuser_direct.translate_fusion` (one `fd.ops.X` call per expression,
variables named after the IR: `tv44` is `T44`) and runs it against an
nvshard FusionDefinition, then reads every TensorView's mesh and device
splits from the real objects: `str(tv)` ends with `(DeviceMesh{...})` when
it has a mesh, and each loop IterDomain leads back to its logical axis
through `definition()` (a Split, printed "Outer split: iS0{i0} by factor 2
-> ...").
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import torch

from ..frontend.fusion_definition import FusionDefinition
from ..ir.dtypes import DataType
from ..ir.nodes import IterDomain, NvShardError, ParallelType, Scalar, TensorView
from ..multidevice.mesh import DeviceMesh

_TV_NAME = re.compile(r"^T(\d+)_")
_ID_TEXT = re.compile(r"^([ibrn])(.*?)(\d+)\{(.*)\}(rf)?$")
_SPLIT_TEXT = re.compile(r"^(Outer|Inner) split: \S+ by factor (\d+) ->")
_MESH_TEXT = re.compile(r"\(DeviceMesh(\{.*\})\)$")
_SCALAR_PREFIX = {DataType.Double: "d", DataType.Float: "f", DataType.Bool: "b", DataType.Int: "i"}
_PARALLEL = {"deviceIdx.x": ParallelType.mesh_x, "deviceIdx.y": ParallelType.mesh_y,
             "deviceIdx.z": ParallelType.mesh_z, "S": ParallelType.Serial}


def real_module():
    try:
        import nvfuser_direct
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise NvShardError(f"nvshard.nvfuser needs the real nvFuser (module nvfuser_direct): {e}") from None
    return nvfuser_direct


def tv_number(real_tv) -> int:
    m = _TV_NAME.match(str(real_tv))
    if m is None:
        raise NvShardError(f"cannot read a TensorView name from {str(real_tv)!r}")
    return int(m.group(1))


def id_number(real_id) -> int:
    return int(_parse_id(str(real_id))[2])


def _parse_id(text: str):
    m = _ID_TEXT.match(text)
    if m is None:
        raise NvShardError(f"cannot read the IterDomain {text!r}")
    return m.group(1), m.group(2), int(m.group(3)), m.group(4)


def parse_mesh(text: str):
    """The device tensor of `(DeviceMesh{{0 1}{2 3}})` at the end of str(tv), or None."""
    m = _MESH_TEXT.search(text)
    if m is None:
        return None
    nested = m.group(1).replace("{", "[").replace("}", "]")
    nested = re.sub(r"(\d)\s+(?=\d)", r"\1,", nested).replace("][", "],[")
    return torch.tensor(ast.literal_eval(nested), dtype=torch.int64)


@dataclass
class ReadFusion:
    """A real fusion read into nvshard: `fd` is the nvshard FusionDefinition;
    `pairs` maps each TensorView number to (real TensorView, nvshard TensorView)."""

    real_fusion: object
    fd: FusionDefinition
    source: str
    pairs: dict = field(default_factory=dict)
    definition_text: dict = field(default_factory=dict)  # TensorView number -> the statement that defines it

    def annotated(self, number: int) -> bool:
        return parse_mesh(str(self.pairs[number][0])) is not None

    def nvshard_tv(self, real_tv) -> TensorView:
        return self.pairs[tv_number(real_tv)][1]


def read_fusion(real_fusion) -> ReadFusion:
    nvf = real_module()
    source = nvf.translate_fusion(real_fusion)
    try:
        func = ast.parse(source).body[0]
    except SyntaxError as e:
        raise NvShardError(f"translate_fusion produced text nvshard cannot parse: {e}") from None
    real_tvs = {}
    for v in real_fusion.vals():
        if isinstance(v, nvf.TensorView):
            real_tvs[tv_number(v)] = v
    fd = FusionDefinition()
    result = ReadFusion(real_fusion, fd, source)
    with fd:
        names = {"fd": fd, "DataType": DataType}
        for statement in func.body:
            text = ast.unparse(statement)
            try:
                exec(compile(ast.Module([statement], type_ignores=[]), "<translate_fusion>", "exec"), names)
            except AttributeError as e:
                missing = re.search(r"no op '(\w+)'", str(e))
                what = f"nvshard has no op {missing.group(1)!r}" if missing else str(e)
                raise NvShardError(f"cannot read `{text}`: {what}") from None
            except (NvShardError, TypeError, ValueError, KeyError, IndexError) as e:
                raise NvShardError(f"cannot read `{text}`: {e}") from None
            for target in _assigned_names(statement):
                if target.startswith("tv"):
                    result.definition_text[int(target[2:])] = text
        for name, value in names.items():
            if re.fullmatch(r"c\d+", name) and isinstance(value, Scalar) and value.definition is not None:
                value.name = _SCALAR_PREFIX.get(value.dtype(), "i") + name[1:]  # nvFuser's name: c65 is d65
            if re.fullmatch(r"tv\d+", name) and isinstance(value, TensorView):
                number = int(name[2:])
                if number not in real_tvs:
                    raise NvShardError(f"translate_fusion names {name}, but the fusion has no T{number}")
                result.pairs[number] = (real_tvs[number], value)
        for number, real_tv in real_tvs.items():
            if number not in result.pairs:
                raise NvShardError(f"T{number} of the fusion does not appear in translate_fusion's program")
        max_id = 0
        for number, (real_tv, tv) in sorted(result.pairs.items()):
            _check_logical(result, number, real_tv, tv)
            by_number = _apply_annotation(result, number, real_tv, tv)
            # nvFuser's names, so nvshard's log and printMath name what the user sees
            tv.number = number
            tv.printed_memory = str(real_tv).split("_")[1]
            texts = {id_number(i): str(i) for i in list(real_tv.get_logical_domain()) + list(real_tv.get_loop_domain())}
            for n, id_ in by_number.items():
                id_.number = n
                if n in texts:
                    id_.printed_extent = _parse_id(texts[n])[3]
                    id_.printed_suffix = "rf" if texts[n].endswith("rf") else ""
                max_id = max(max_id, n)
        fd.fusion._tv_counter = max(result.pairs, default=-1) + 1
        fd.fusion._id_counter = max_id + 1
    return result


def _assigned_names(statement) -> list:
    if not isinstance(statement, ast.Assign):
        return []
    names = []
    for target in statement.targets:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.append(node.id)
    return names


def _where(result: ReadFusion, number: int) -> str:
    text = result.definition_text.get(number)
    return f"T{number} (`{text}`)" if text else f"T{number}"


def _check_logical(result, number, real_tv, tv) -> None:
    """Same logical axes, reduction and broadcast axes in the same places."""
    real_kinds = "".join(_parse_id(str(i))[0] for i in real_tv.get_logical_domain())
    kinds = "".join(i.iter_type.value for i in tv.logical)
    if real_kinds != kinds:
        raise NvShardError(
            f"{_where(result, number)}: nvFuser's logical domain has axis kinds {real_kinds!r} "
            f"(i iteration, b broadcast, r reduction) but nvshard's op built {kinds!r}"
        )


def _apply_annotation(result, number, real_tv, tv) -> None:
    """Replay the real TensorView's mesh, device splits and loop order on tv."""
    text = str(real_tv)
    devices = parse_mesh(text)
    logical = real_tv.get_logical_domain()
    by_number: dict[int, IterDomain] = {id_number(r): s for r, s in zip(logical, tv.logical)}
    loop = real_tv.get_loop_domain()
    # An op may build its result's loop domain from other axes than the logical
    # ones (scatter: the index's); nvshard's op builds the same, so such loop
    # IterDomains pair up by position. nvshard shards logical axes only.
    built = [id_ for id_ in tv.loop if all(id_ is not l for l in tv.logical)]
    if built:
        real_built = [r for r in loop if id_number(r) not in by_number and r.definition() is None]
        if len(real_built) != len(built):
            raise NvShardError(f"{_where(result, number)}: its op builds {len(built)} loop axes from other axes "
                               f"than its logical ones, nvFuser's loop domain has {len(real_built)} ({text})")
        for r, id_ in zip(real_built, built):
            by_number[id_number(r)] = id_
    if devices is None:
        for r in loop:
            if id_number(r) not in by_number or _parse_id(str(r))[1] not in ("S", ""):
                raise NvShardError(f"{_where(result, number)}: it is scheduled ({text}) but has no device mesh")
        return by_number
    tv.set_device_mesh(DeviceMesh(devices))

    def replay(real_id) -> None:
        n = id_number(real_id)
        if n in by_number:
            return
        split = real_id.definition()
        if split is None:
            raise NvShardError(f"{_where(result, number)}: loop IterDomain {real_id} has no definition")
        m = _SPLIT_TEXT.match(str(split))
        if m is None:
            raise NvShardError(
                f"{_where(result, number)}: nvshard reads device splits only; loop IterDomain {real_id} comes from "
                f"`{str(split).strip()}`"
            )
        source = split.input(0)
        replay(source)
        parent = by_number[id_number(source)]
        pos = tv.loop.index(parent)
        factor = int(m.group(2))
        if m.group(1) == "Outer":
            tv.outer_split(pos, factor)
        else:
            tv.inner_split(pos, factor)
        by_number[id_number(split.outer())] = tv.loop[pos]
        by_number[id_number(split.inner())] = tv.loop[pos + 1]

    for r in loop:
        replay(r)
    order = []
    for r in loop:
        kind, parallel, n, _ = _parse_id(str(r))
        if parallel not in _PARALLEL:
            raise NvShardError(f"{_where(result, number)}: loop IterDomain {r} is parallelized on {parallel}; "
                               f"nvshard reads device (deviceIdx.*) and serial axes only")
        id_ = by_number[n]
        if _PARALLEL[parallel] is not ParallelType.Serial:
            id_.parallelize(_PARALLEL[parallel])
        order.append(id_)
    if len(order) != len(tv.loop) or set(map(id, order)) != set(map(id, tv.loop)):
        raise NvShardError(f"{_where(result, number)}: its loop domain does not cover its splits ({text})")
    tv.loop = order
    return by_number
