"""DeviceMesh: an N-D arrangement of device ids (N <= 3).

Mesh axis names follow nvFuser: "x" (ParallelType.mesh_x, DIDx) is the last
dimension of the device tensor, "y" the second to last, "z" the third to last.
"""

from __future__ import annotations

import itertools
from typing import Optional

import torch

from ..errors import NvShardError
from . import layout


class DeviceMesh:
    def __init__(self, devices=None, shape=None):
        if devices is None:
            devices = []
        if isinstance(devices, torch.Tensor):
            tensor = devices.to(torch.int64)
        else:
            tensor = torch.tensor(list(devices), dtype=torch.int64)
        if shape is not None:
            tensor = tensor.reshape(shape)
        if tensor.dim() == 0:
            tensor = tensor.reshape(1)
        if not 1 <= tensor.dim() <= 3:
            raise NvShardError(f"DeviceMesh must be 1-D to 3-D, got shape {tuple(tensor.shape)}")
        flat = tensor.flatten().tolist()
        if len(set(flat)) != len(flat):
            dups = sorted({d for d in flat if flat.count(d) > 1})
            raise NvShardError(f"DeviceMesh devices contain duplicates: {dups} in {flat}")
        if any(d < 0 for d in flat):
            raise NvShardError(f"DeviceMesh device ids must be >= 0, got {flat}")
        self._devices = tensor
        self._flat = flat
        self._coords = {dev: idx for dev, idx in zip(flat, itertools.product(*[range(s) for s in tensor.shape]))}
        self._shape = tuple(int(s) for s in tensor.shape)
        self._groups: dict = {}
        self._text = None  # repr, made when first asked for (logs and orderings ask often)
        self._hash = hash((self._shape, tuple(flat)))
        names = layout.MESH_AXES[: tensor.dim()][::-1]
        self._names = names  # (the checks of every plan read them: kept, not sliced per read)
        self._sizes = {name: int(tensor.shape[i]) for i, name in enumerate(names)}  # read-only

    # -- nvfuser_direct API ----------------------------------------------------
    @property
    def size(self) -> int:
        return len(self._flat)

    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def devices(self) -> torch.Tensor:
        return self._devices

    @property
    def vector(self) -> list[int]:
        return list(self._flat)

    def shard_tensor(self, t: torch.Tensor, axis: int, rank: Optional[int] = None) -> torch.Tensor:
        """This rank's slice of `t` along `axis` (1-D meshes, like nvFuser): a
        view of `t`, so sharding a big tensor copies nothing."""
        from .communicator import Communicator

        if self.ndim != 1:
            raise NvShardError(f"{self}.shard_tensor(t, axis) needs a 1-D mesh; use multidevice.shard_tensor(t, tv)")
        rank = Communicator.instance().rank() if rank is None else rank
        if rank not in self._coords:
            raise NvShardError(f"rank {rank} is not in {self}")
        axis = axis % t.dim()
        if t.shape[axis] % self.size:
            raise NvShardError(f"axis {axis} of extent {t.shape[axis]} is not divisible by the mesh size {self.size}")
        return t.chunk(self.size, dim=axis)[self._coords[rank][0]]

    # -- axes by name ------------------------------------------------------------
    @property
    def axis_names(self) -> tuple:
        """Mesh axis names, outermost first: ("z", "y", "x") for a 3-D mesh."""
        return self._names

    def axis_size(self, name: str) -> int:
        return self._sizes[name]

    def axis_sizes(self) -> dict:
        return self._sizes

    def coords(self, device: int) -> Optional[dict]:
        idx = self._coords.get(device)
        if idx is None:
            return None
        return {name: idx[i] for i, name in enumerate(self.axis_names)}

    def has(self, device: int) -> bool:
        return device in self._coords

    def group(self, device: int, name: str) -> list[int]:
        """Devices that differ from `device` only along mesh axis `name`, in
        coordinate order."""
        idx = list(self._coords[device])
        dim = self.axis_names.index(name)
        group = []
        for c in range(self.shape[dim]):
            idx[dim] = c
            group.append(int(self._devices[tuple(idx)]))
        return group

    def groups(self, name: str) -> list[list[int]]:
        """The groups of devices that differ only along mesh axis `name`."""
        if name not in self._groups:
            seen = []
            for dev in self._flat:
                g = self.group(dev, name)
                if g not in seen:
                    seen.append(g)
            self._groups[name] = seen
        return [list(g) for g in self._groups[name]]

    # -- torch.distributed.DeviceMesh ------------------------------------------------
    @classmethod
    def from_torch(cls, torch_mesh) -> "DeviceMesh":
        """The same ranks in the same arrangement: torch mesh dim i is
        axis_names[i], so a torch mesh's last dim is mesh_x."""
        return cls(torch_mesh.mesh.cpu())

    def to_torch(self, device_type: str = "cpu", mesh_dim_names=None):
        """A torch DeviceMesh over the same ranks. Like any torch DeviceMesh it
        creates process groups: every rank of torch's default group calls it."""
        from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh

        return TorchDeviceMesh(device_type, self._devices, mesh_dim_names=mesh_dim_names)

    # -- identity ----------------------------------------------------------------
    def __eq__(self, other) -> bool:
        if self is other:
            return True
        return isinstance(other, DeviceMesh) and self._hash == other._hash and self._shape == other._shape \
            and self._flat == other._flat

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        if self._text is None:
            self._text = self._format()
        return self._text

    def _format(self) -> str:
        strides = list(self.shape)
        for i in range(len(strides) - 2, -1, -1):
            strides[i] *= strides[i + 1]
        out = "DeviceMesh"
        for i, dev in enumerate(self._flat):
            for s in strides:
                if i % s == 0:
                    out += "{"
            out += str(dev)
            if (i + 1) % strides[-1] != 0:
                out += " "
            for s in strides:
                if (i + 1) % s == 0:
                    out += "}"
        return out

    __str__ = __repr__
