import os

import torch

# One intra-op thread per process: on 2 cores, more threads only slow every rank down.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)
