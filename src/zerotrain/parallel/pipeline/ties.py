"""Tied layers across stages: one TiedLayerSpec key used on several stages (an embedding on
the first and the output projection on the last).

Each stage that uses the key builds its own copy; the copies start as the first holder's
(broadcast at setup) and stay equal because before every optimizer step their gradients are
summed over the stages that hold them (one all-reduce per tied weight, within a pipeline,
before the data-parallel reduction), so every copy takes the very same step. The global norm
counts the weight once, on its first holder (parallel/norm.py leaves the other copies out).
"""

from __future__ import annotations

from ...comm.mesh import subgroup_comms


def holder_of(stage: int, pipe_size: int, placement: str) -> int:
    """The pipe rank that runs pipeline stage `stage`."""
    if placement == "v" and stage >= pipe_size:
        return 2 * pipe_size - 1 - stage
    return stage % pipe_size


class Ties:
    def __init__(self, module, mesh):
        lists, owners = [], []
        P = mesh.size("pipe")
        for key, stages in module.tie_keys().items():
            holders = sorted({holder_of(s, P, module.placement) for s in stages})
            if len(holders) < 2:
                continue  # one rank holds every use: autograd already sums them
            for d in range(mesh.size("data")):
                for t in range(mesh.size("tensor")):
                    lists.append([mesh.rank_of(pipe=h, data=d, tensor=t) for h in holders])
                    owners.append((key, holders[0]))
        comms = subgroup_comms(mesh.state, lists)  # every rank creates every group, in order
        me = mesh.coord("pipe")
        self.groups = [(comm, module.tied_weights(key), first == me)
                       for comm, (key, first) in zip(comms, owners) if comm is not None]

    def uncounted(self) -> list:
        """Tied copies another rank counts in the norm."""
        return [p for _, params, first in self.groups if not first for p in params]

    def sync_weights(self) -> None:
        for comm, params, _ in self.groups:
            for p in params:
                comm.broadcast(p.data, src=0)

    def reduce_grads(self) -> None:
        for comm, params, _ in self.groups:
            for p in params:
                comm.all_reduce(p.grad)
