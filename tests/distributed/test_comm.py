"""Comm's flat all-gather and reduce-scatter on 4 real gloo ranks, in the default group and in
subgroups whose ranks are not the global ones (gloo runs them as one broadcast / reduce per
rank, straight into place)."""

from __future__ import annotations


def flat_collectives() -> dict:
    import torch
    import torch.distributed as dist

    from zerotrain.comm.collectives import Comm, ParallelState

    rank, world = dist.get_rank(), dist.get_world_size()
    # every rank creates every group, in the same order
    groups = {(0, 1, 2, 3): None, (1, 3): dist.new_group([1, 3]), (2, 0): dist.new_group([2, 0])}
    out = {}
    for members, group in groups.items():
        if rank not in members:
            continue
        ordered = sorted(members)
        me, n = ordered.index(rank), len(members)
        comm = Comm(ParallelState(rank=me, world_size=n), group)
        chunk = 3

        def values(r: int) -> torch.Tensor:  # what group rank r holds
            return torch.arange(chunk * n, dtype=torch.float32) * (ordered[r] + 1) + 0.5 * r

        for async_op in (False, True):
            # all-gather into a separate buffer
            gathered = torch.full((n * chunk,), -1.0)
            mine = values(me)[:chunk].clone()
            work = comm.all_gather(gathered, mine, async_op=async_op)
            if async_op:
                work.wait()
            expected = torch.cat([values(r)[:chunk] for r in range(n)])
            out[(members, "all_gather", async_op)] = bool(torch.equal(gathered, expected))
            # in place: this rank's input is its own chunk of the output
            buf = torch.zeros(n * chunk)
            buf[me * chunk : (me + 1) * chunk] = values(me)[:chunk]
            work = comm.all_gather(buf, buf[me * chunk : (me + 1) * chunk], async_op=async_op)
            if async_op:
                work.wait()
            out[(members, "all_gather_in_place", async_op)] = bool(torch.equal(buf, expected))
            # reduce-scatter: the sum over ranks of this rank's chunk
            result = torch.full((chunk,), -1.0)
            work = comm.reduce_scatter(result, values(me).clone(), async_op=async_op)
            if async_op:
                work.wait()
            total = sum(values(r) for r in range(n))
            out[(members, "reduce_scatter", async_op)] = bool(torch.equal(result, total[me * chunk : (me + 1) * chunk]))
    return out


def test_flat_collectives_in_the_world_and_in_subgroups(world4):
    results = world4.run(flat_collectives)
    for rank, checks in enumerate(results):
        # the world plus the one subgroup each rank is in
        assert len({members for members, _, _ in checks}) == 2, (rank, checks)
        failed = [key for key, ok in checks.items() if not ok]
        assert not failed, f"rank {rank}: {failed}"
