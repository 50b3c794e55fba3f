"""One rank of a 2-rank training job in which rank `victim` dies or hangs before step 3.

Run by test_faults.py as two plain processes (no torchrun agent, so nothing but zerotrain
reports the fault). Prints "FAULT <time>" on the victim and "ERROR <time> <message>" on a
survivor that caught the DistributedFaultError.
"""

from __future__ import annotations

import os
import sys
import time

import torch

import zerotrain
from zerotrain.comm import init_parallel
from zerotrain.errors import DistributedFaultError

sys.path.insert(0, os.path.dirname(__file__))
from scenarios import base_config, global_batch, tiny_gpt  # noqa: E402


def main(mode: str, victim: int, timeout_s: float, stage: int) -> int:
    torch.set_num_threads(1)
    if os.environ.get("FAULT_JOB_OWN_GROUP"):  # a script that joins the world itself, then initialize()
        import datetime

        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    state = init_parallel(timeout_s=timeout_s)
    engine, *_ = zerotrain.initialize(model=tiny_gpt(), config=base_config(4, 2, zero_optimization={"stage": stage}))
    try:
        for step in range(6):
            if step == 3 and state.rank == victim:
                print(f"FAULT {time.time()}", flush=True)
                if mode == "die":
                    os._exit(3)
                time.sleep(120)  # hung: alive, never joins the next collective
            x = global_batch(step, 4)[state.rank * 2:(state.rank + 1) * 2]
            engine.backward(engine(x, labels=x))
            engine.step()
    except DistributedFaultError as e:
        print(f"ERROR {time.time()} {e.ranks} {e}", flush=True)
        os._exit(1)  # the process group cannot be left cleanly with a rank gone
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])))
