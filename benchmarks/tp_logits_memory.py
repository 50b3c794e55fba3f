"""What the vocabulary split saves: peak memory of one training step's logits, tensor 2.

    python benchmarks/tp_logits_memory.py [--vocab 65536] [--tokens 1024]

zerotrain's GPT with a large vocabulary and a thin body (width 64, 1 block), so the step's
peak is the logits: [tokens, vocab] fp32, their float copy, log-softmax and gradient. Two
jobs of 2 ranks (gloo), tensor 2 each: `vocab_parallel_lm_head: false` (embedding and head
whole on both ranks) and the default (split by the vocabulary, the loss under torch's
loss_parallel). Each rank resets its peak RSS (VmHWM) after a warm-up step and reports how
far one more forward + backward + step raised it above the RSS it started from.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402  (paths, process and RSS helpers)


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import zerotrain
    from zerotrain.models.gpt import GPT, GPTConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = GPT(GPTConfig(vocab_size=args.vocab, n_positions=args.tokens, n_embd=64, n_layer=1, n_head=4))
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
              "tensor_parallel": {"autotp_size": 2, "vocab_parallel_lm_head": args.split == "vocab"}}
    engine, *_ = zerotrain.initialize(model=net, config=config)
    x = torch.randint(0, args.vocab, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    for step in range(2):
        if step == 1:
            common.reset_peak_rss()
            start = common.status_kib("VmRSS")
        loss = engine(x, labels=x)
        engine.backward(loss)
        engine.step()
    mine = torch.tensor([common.status_kib("VmHWM") - start], dtype=torch.int64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"peak_kib": int(mine), "loss": float(loss)}))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=65536)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--split", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.split:
        worker(args)
        return 0
    logits_mib = args.tokens * args.vocab * 4 / 2**20
    print(f"GPT width 64, 1 block, vocabulary {args.vocab}, {args.tokens} tokens a step: the whole logits are "
          f"{logits_mib:.0f} MiB fp32; tensor parallel 2, gloo")
    env = common.venv_env(Path(sys.prefix))
    env["PYTHONPATH"] = str(common.SRC) + os.pathsep + env.get("PYTHONPATH", "")
    got = {}
    with tempfile.TemporaryDirectory(prefix="tp_logits-") as tmp:
        for split in ("whole", "vocab"):
            out = Path(tmp) / f"{split}.json"
            r = common.run_quiet([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", 2, "--master_port",
                                 common.free_port(), __file__, "--split", split, "--out", out, "--vocab", args.vocab,
                                 "--tokens", args.tokens], env=env, timeout=900)
            if r.returncode != 0 or not out.exists():
                print(f"{split}: FAILED\n" + (r.stdout + r.stderr)[-3000:])
                return 1
            got[split] = json.loads(out.read_text())
            print(f"  {split:5s}  step peak above its start {got[split]['peak_kib'] / 1024:7.0f} MiB/rank (max), "
                  f"loss {got[split]['loss']:.6f}")
    print(f"vocabulary split / whole: step peak {got['vocab']['peak_kib'] / got['whole']['peak_kib']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
