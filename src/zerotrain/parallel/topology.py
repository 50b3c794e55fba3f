"""DeepSpeed's topology queries over zerotrain's mesh (comm/mesh.py).

`ProcessTopology(axes, dims)` maps named coordinates to ranks row-major (the last axis varies
fastest), as DeepSpeed's does; `PipeDataParallelTopology(num_pp, num_dp)` is axes
["pipe", "data"] and `PipeModelDataParallelTopology(num_pp, num_mp, num_dp)` is
["pipe", "data", "model"], the same order as the mesh's pipe x data x tensor. `Grid` answers
the `engine.grid` (and `mpu`) questions DeepSpeed scripts ask, with the mesh's groups.

    DeepSpeed's word     here
    stage / pipe         mesh "pipe"
    data                 mesh "data"
    slice / model        mesh "tensor" (DTensor tensor parallelism)
    model parallel group the ranks of one data index: pipe x tensor (overflow checks, the norm)
"""

from __future__ import annotations

import itertools
from collections import namedtuple


class ProcessTopology:
    def __init__(self, axes: list[str], dims: list[int]):
        self.axes, self.dims = list(axes), list(dims)
        self.ProcessCoord = namedtuple("ProcessCoord", self.axes)
        self.mapping = {self.ProcessCoord(*c): r
                        for r, c in enumerate(itertools.product(*(range(d) for d in self.dims)))}

    def get_rank(self, **coord) -> int:
        if set(coord) != set(self.axes):
            raise ValueError(f"get_rank() needs every axis of {self.axes}; use filter_match() for slices")
        return self.mapping[self.ProcessCoord(**coord)]

    def get_axis_names(self) -> list[str]:
        return self.axes

    def get_rank_repr(self, rank: int, omit_axes=("data", "pipe"), inner_sep: str = "_", outer_sep: str = "-") -> str:
        coord = self.get_coord(rank)
        return outer_sep.join(f"{a}{inner_sep}{getattr(coord, a):02d}" for a in self.axes if a not in omit_axes)

    def get_dim(self, axis: str) -> int:
        return self.dims[self.axes.index(axis)] if axis in self.axes else 0

    def get_coord(self, rank: int):
        for coord, r in self.mapping.items():
            if r == rank:
                return coord
        raise ValueError(f"rank {rank} not found in the topology")

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        """Rank lists that differ only in `axis` (one per combination of the other axes)."""
        if axis not in self.axes:
            return []
        others = [a for a in self.axes if a != axis]
        out = []
        for values in itertools.product(*(range(self.get_dim(a)) for a in others)):
            fixed = dict(zip(others, values))
            out.append([self.mapping[self.ProcessCoord(**fixed, **{axis: i})] for i in range(self.get_dim(axis))])
        return out

    def filter_match(self, **criteria) -> list[int]:
        return [r for c, r in self.mapping.items() if all(getattr(c, k) == v for k, v in criteria.items())]

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        return self.filter_match(**{axis: idx})

    def world_size(self) -> int:
        return len(self.mapping)

    def __str__(self) -> str:
        return str(self.mapping)


class PipeDataParallelTopology(ProcessTopology):
    def __init__(self, num_pp: int, num_dp: int):
        super().__init__(["pipe", "data"], [num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    def __init__(self, num_pp: int, num_mp: int, num_dp: int):
        super().__init__(["pipe", "data", "model"], [num_pp, num_dp, num_mp])


class Grid:
    """`engine.grid`: where this rank sits, and the groups of its dimensions."""

    def __init__(self, mesh):
        self.mesh = mesh
        self._topo = PipeModelDataParallelTopology(mesh.size("pipe"), mesh.size("tensor"), mesh.size("data")) \
            if mesh.size("tensor") > 1 else PipeDataParallelTopology(mesh.size("pipe"), mesh.size("data"))
        self.global_rank = mesh.state.rank
        self.world_size = mesh.state.world_size
        self.pipe_parallel_size = mesh.size("pipe")
        self.data_parallel_size = mesh.size("data")
        self.model_parallel_size = self.slice_parallel_size = mesh.size("tensor")
        self.stage_id = mesh.coord("pipe")
        self.data_parallel_id = mesh.coord("data")
        self.is_first_stage = self.stage_id == 0
        self.is_last_stage = self.stage_id == self.pipe_parallel_size - 1

    def topology(self) -> ProcessTopology:
        return self._topo

    def get_global_rank(self) -> int:
        return self.global_rank

    def get_stage_id(self) -> int:
        return self.stage_id

    def get_data_parallel_id(self) -> int:
        return self.data_parallel_id

    def stage_to_global(self, stage_id: int, **coords) -> int:
        """The global rank of `stage_id` at this rank's other coordinates (or those given)."""
        return self.mesh.rank_of(pipe=stage_id, data=coords.get("data"), tensor=coords.get("model"))

    # pipeline
    def get_pipe_parallel_rank(self) -> int:
        return self.stage_id

    def get_pipe_parallel_world_size(self) -> int:
        return self.pipe_parallel_size

    def get_pipe_parallel_group(self):
        return self.mesh.group("pipe")

    get_pipeline_model_parallel_rank = get_pipe_parallel_rank
    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size

    # data
    def get_data_parallel_rank(self) -> int:
        return self.data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel_size

    def get_data_parallel_group(self):
        return self.mesh.group("data")

    def get_data_parallel_group_ranks(self) -> list[int]:
        return self.mesh.ranks_along("data")

    # every kind of model parallelism: the ranks of one data index
    def get_model_parallel_rank(self) -> int:
        return self.mesh.ranks_along("pipe", "tensor").index(self.global_rank)

    def get_model_parallel_world_size(self) -> int:
        return self.pipe_parallel_size * self.model_parallel_size

    def get_model_parallel_group(self):
        return self.mesh.comm("pipe", "tensor").group

    # tensor slicing
    def get_slice_parallel_rank(self) -> int:
        return self.mesh.coord("tensor")

    def get_slice_parallel_world_size(self) -> int:
        return self.slice_parallel_size

    def get_slice_parallel_group(self):
        return self.mesh.group("tensor")

    get_tensor_model_parallel_rank = get_slice_parallel_rank
    get_tensor_model_parallel_world_size = get_slice_parallel_world_size
    get_tensor_model_parallel_group = get_slice_parallel_group
