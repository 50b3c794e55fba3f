"""The job's ranks as a named grid on a torch DeviceMesh: pipe x data x sequence x tensor.

    rank = ((pipe * data_size + data) * sequence_size + sequence) * tensor_size + tensor

tensor varies fastest: the order of DeepSpeed's PipeModelDataParallelTopology (and
PipeDataParallelTopology when the tensor size is 1), so a DeepSpeed script's rank arithmetic
carries over; the sequence ranks of one data index are neighbours, as in DeepSpeed's
sequence-data groups (rank = data x S + sequence). The sequence dimension joins the DeviceMesh
only when it has more than one rank: a one-rank dimension would add a process group per rank
for nothing, and its Comm is alone either way. Each named dimension
has its process group from the DeviceMesh; `comm(dim)` wraps it in a Comm whose rank and
size are the group's (a one-rank dimension gives a Comm that is alone, so its collectives
are no-ops). DTensor tensor parallelism (parallel/tensor/dtensor.py) splits layers over
`sub_mesh("tensor")`.
"""

from __future__ import annotations

import functools
import itertools

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ..errors import ConfigError
from .collectives import Comm, ParallelState

DIMS = ("pipe", "data", "sequence", "tensor")


class ParallelMesh:
    def __init__(self, state: ParallelState, pipe: int = 1, tensor: int = 1, sequence: int = 1):
        world = state.world_size
        for name, size in (("pipeline", pipe), ("tensor", tensor), ("sequence", sequence)):
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ConfigError(f"the {name} parallel size should be a positive integer, got {size!r}")
        model = pipe * sequence * tensor
        if world % model:
            named = (("pipeline", pipe), ("sequence", sequence), ("tensor", tensor))
            sizes = " x ".join(f"{name} size {size}" for name, size in named if size > 1 or name != "sequence")
            raise ConfigError(f"the world size {world} is not divisible by {sizes}; launch a multiple of {model} "
                              "processes or change the sizes")
        self.state = state
        self.sizes = {"pipe": pipe, "data": world // model, "sequence": sequence, "tensor": tensor}
        self.mesh_dims = tuple(d for d in DIMS if d != "sequence" or sequence > 1)
        self.device_mesh = None
        if world > 1:
            shape = tuple(self.sizes[d] for d in self.mesh_dims)
            self.device_mesh = init_device_mesh(state.device.type, shape, mesh_dim_names=self.mesh_dims)
        self.coords = self.coord_of(state.rank)

    def size(self, dim: str) -> int:
        return self.sizes[dim]

    def coord(self, dim: str) -> int:
        return self.coords[dim]

    def coord_of(self, rank: int) -> dict[str, int]:
        out = {}
        for dim in reversed(DIMS):  # the last dimension varies fastest
            rank, out[dim] = divmod(rank, self.sizes[dim])
        return {d: out[d] for d in DIMS}

    def rank_of(self, pipe: int | None = None, data: int | None = None, tensor: int | None = None,
                sequence: int | None = None) -> int:
        """The global rank at these coordinates (missing ones: this rank's)."""
        given = {"pipe": pipe, "data": data, "sequence": sequence, "tensor": tensor}
        rank = 0
        for dim in DIMS:
            rank = rank * self.sizes[dim] + (given[dim] if given[dim] is not None else self.coords[dim])
        return rank

    def ranks_along(self, *dims: str) -> list[int]:
        """The global ranks that share this rank's coordinates in every dimension but `dims`."""
        ranges = [range(self.sizes[d]) if d in dims else [self.coords[d]] for d in DIMS]
        return sorted(self.rank_of(**dict(zip(DIMS, c))) for c in itertools.product(*ranges))

    def group(self, dim: str):
        """The process group of one dimension (None in a one-process job, or for a one-rank
        dimension the DeviceMesh leaves out)."""
        return None if self.device_mesh is None or dim not in self.mesh_dims else self.device_mesh.get_group(dim)

    def sub_mesh(self, dim: str):
        """The one-dimensional DeviceMesh of `dim` (what DTensor layers are split over)."""
        if self.device_mesh is None:
            raise ValueError("a one-process job has no DeviceMesh")
        return self.device_mesh[dim]

    @functools.cache
    def comm(self, *dims: str) -> Comm:
        """A Comm over the ranks that differ from this one only in `dims` (one dimension: its
        DeviceMesh group; several: a group made for them, by every rank at once)."""
        wide = [d for d in dims if self.sizes[d] > 1]
        if len(wide) <= 1:  # the others have one rank: the same ranks as one dimension's group
            return Comm.subgroup(self.state, self.group(wide[0] if wide else dims[0]))
        lists = self._all_lists(dims)
        mine = None
        for ranks in lists:  # every rank creates every group, in the same order
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if self.state.rank in ranks:
                mine = group
        return Comm.subgroup(self.state, mine)

    def _all_lists(self, dims: tuple[str, ...]) -> list[list[int]]:
        fixed = [d for d in DIMS if d not in dims]
        out = []
        for values in itertools.product(*(range(self.sizes[d]) for d in fixed)):
            at = dict(zip(fixed, values))
            ranges = [range(self.sizes[d]) if d in dims else [at[d]] for d in DIMS]
            out.append(sorted(self.rank_of(**dict(zip(DIMS, c))) for c in itertools.product(*ranges)))
        return out


def subgroup_comms(state: ParallelState, rank_lists: list[list[int]]) -> list[Comm | None]:
    """One Comm per rank list that holds this rank (None for the others). Every rank must call
    this with the same lists in the same order (torch creates groups collectively)."""
    out = []
    for ranks in rank_lists:
        group = dist.new_group(sorted(ranks)) if len(ranks) > 1 else None
        out.append(Comm.subgroup(state, group) if state.rank in ranks else None)
    return out
