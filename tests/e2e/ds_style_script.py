"""A training script in DeepSpeed's style, written for zerotrain's tests: the one changed line is
the import. It calls every helper the migration guide lists, trains a few steps on 2 ranks and
saves; each rank writes what it saw to OUT/rank<r>.json for the test to read."""

import argparse
import json
import os

import torch

import zerotrain as deepspeed  # was: import deepspeed
import zerotrain.comm as dist
from zerotrain import checkpointing
from zerotrain.accelerator import get_accelerator
from zerotrain.ops.adam import FusedAdam
from zerotrain.runtime.utils import see_memory_usage, set_random_seed
from zerotrain.utils import RepeatingLoader, log_dist, logger


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.hidden = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 16))
        self.out = torch.nn.Linear(16, 1)

    def forward(self, x, y):
        h = checkpointing.checkpoint(self.hidden, torch.relu(self.inp(x)))
        return torch.nn.functional.mse_loss(self.out(h).squeeze(-1), y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
    get_accelerator().set_device(args.local_rank)
    set_random_seed(1234)
    rank, world = dist.get_rank(), dist.get_world_size()

    model = Net()
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64))
    engine, optimizer, loader, _ = deepspeed.initialize(args=args, model=model, optimizer=FusedAdam(
        model.parameters(), lr=1e-2), training_data=data)
    batches = RepeatingLoader(loader)
    losses = []
    for step in range(args.steps * engine.gradient_accumulation_steps()):
        x, y = next(batches)
        loss = engine(x.to(engine.device), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        log_dist(f"micro-step {step} loss {loss.item():.4f}", ranks=[0])

    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    ranks = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(ranks, torch.tensor([float(rank)]))
    token = torch.tensor([42.0 if rank == 0 else 0.0])
    dist.broadcast(token, src=0)
    dist.barrier()
    engine.save_checkpoint(args.out, client_state={"steps": args.steps})
    see_memory_usage("after save", force=True)
    logger.info(dist.log_summary())
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "local_rank_arg": args.local_rank,
                   "local_rank": dist.get_local_rank(), "sum": total.item(),
                   "gathered": [t.item() for t in ranks], "token": token.item(), "losses": losses,
                   "global_steps": engine.global_steps, "checkpointing": checkpointing.is_configured(),
                   "device": get_accelerator().device_name(), "optimizer": type(optimizer).__name__}, f)


if __name__ == "__main__":
    main()
