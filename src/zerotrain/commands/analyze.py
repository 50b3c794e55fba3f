"""`zerotrain analyze [OPTIONS_FILE] --save_path DIR [--metrics seqlen vocab_rarity]`: each
training sample's difficulty, for the curriculum by any metric (data_efficiency).

    zerotrain analyze run.yaml --save_path analysis        the data options of `zerotrain train`
    torchrun --nproc_per_node 4 -m zerotrain analyze ...    each rank maps a quarter, rank 0 reduces

The training set is built exactly as `zerotrain train` builds it from the same options (the
files, tokenizer, block_size, split and seed, through the same cache), so sample i here is
sample i there. vocab_rarity first counts total_vocab_freq over the data, then sums each
sample's -log p(token) (data_efficiency/metrics.py). The files under save_path/<metric>/ are
DeepSpeed's (data_efficiency/analyzer.py); the command ends by naming the paths to give the
config's curriculum_metrics.
"""

from __future__ import annotations

import argparse
import os
import time

from ..errors import ConfigError
from ..trainer import args as targs
from .train import add_options

METRICS = ("seqlen", "vocab_rarity", "seqlen_vocab_rarity", "total_vocab_freq")
_OWN = ("save_path", "metrics", "batch_size", "num_threads")
# the model options that decide the training set (its tokenizer, the default block size, the task)
_MODEL = ("model_name_or_path", "model_revision", "trust_remote_code", "model_config", "tokenizer_name_or_path",
          "task")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("options_file", nargs="?", help="YAML or JSON file of `zerotrain train` options (the data "
                                                        "and model ones are read; the command line overrides them)")
    own = parser.add_argument_group("analysis")
    own.add_argument("--save_path", required=True, help="Folder for the index files (one sub-folder per metric)")
    own.add_argument("--metrics", nargs="+", default=["seqlen", "vocab_rarity"], choices=METRICS, metavar="METRIC",
                     help=f"What to measure per sample: {', '.join(METRICS)} (default: seqlen vocab_rarity)")
    own.add_argument("--batch_size", type=int, default=1024, help="Samples read per step (default: 1024)")
    own.add_argument("--num_threads", type=int, default=1,
                     help="Processes that map this rank's share of the data (default: 1)")
    add_options(parser.add_argument_group("model (the tokenizer)"), targs.ModelArguments, only=_MODEL)
    add_options(parser.add_argument_group("data"), targs.DataArguments)
    add_options(parser.add_argument_group("training"), targs.TrainingArguments, only=("seed",))


def options(args: argparse.Namespace) -> tuple[object, list[str]]:
    """The run's Options from the file and the command line, and the options given that do not
    decide the training set (named in a notice; unknown names are left to the option parser)."""
    from ..trainer.plan import Options

    values = targs.read_options_file(args.options_file) if args.options_file else {}
    values.update({k: v for k, v in vars(args).items() if k not in ("command", "options_file", "foreign", *_OWN)})
    aliases = targs.aliases()
    deciding = {*_MODEL, *targs.fields_of(targs.DataArguments), "seed"}
    known = {name for cls in targs.ALL for name in targs.fields_of(cls)}
    unused = sorted(k for k in values if aliases.get(k, k) in known and aliases.get(k, k) not in deciding)
    for key in unused:
        del values[key]
    values["output_dir"] = args.save_path  # stands in for the run folder, which nothing here reads
    return Options.parse(values), unused


def run(args: argparse.Namespace) -> int:
    from ..comm import Comm, init_parallel, shutdown
    from ..trainer.data.prepare import prepare
    from ..trainer.data.tokenizer import load_tokenizer
    from ..trainer.model.build import positions_hint

    if args.batch_size < 1 or args.num_threads < 1:
        raise ConfigError(f"batch_size and num_threads: should be positive, got {args.batch_size} and "
                          f"{args.num_threads}")
    parsed, unused = options(args)
    model, data = parsed.model, parsed.data
    comm = Comm(init_parallel())
    rank0 = comm.rank == 0
    if rank0:
        why = "no effect on the analysis (only the data, tokenizer and seed options decide the training set)"
        for line in [*parsed.notices] + ([f"{', '.join(unused)}: {why}"] if unused else []):
            print(f"zerotrain: notice: {line}", flush=True)
    tokenizer = load_tokenizer(model.tokenizer_name_or_path, model.model_name_or_path, model.model_revision,
                               model.trust_remote_code)
    positions = positions_hint(model.model_name_or_path, model.model_config, model.model_revision)
    prepared = prepare(model, data, parsed.training.seed, tokenizer, positions, comm)
    if prepared.train is None:
        raise ConfigError("analyze reads the training set: pass --train_file (or --task_name with --data_dir)")
    started = time.perf_counter()
    written = analyze(prepared.train, args.metrics, args.save_path, len(tokenizer), prepared.block_size,
                      args.batch_size, args.num_threads, progress=rank0)
    if rank0:
        print(f"analyzed {len(prepared.train)} training samples in {time.perf_counter() - started:.1f} s; "
              f"files under {args.save_path}", flush=True)
        for line in written:
            print(line, flush=True)
    shutdown()
    return 0


def analyze(train, names, save_path: str, vocab_size: int, block_size: int, batch_size: int, num_threads: int,
            progress: bool = True) -> list[str]:
    """Run the analyzer over a tokenized training set (a HF dataset with input_ids); the lines
    naming each metric's files for the config."""
    import numpy as np

    from ..data.indexed import IndexedFile
    from ..data_efficiency import DataAnalyzer, metrics
    from ..data_efficiency.tokens import ArrowTokens

    dataset = ArrowTokens(train)
    common = dict(batch_size=batch_size, num_threads=num_threads, save_path=save_path, progress=progress)
    rarity = {"vocab_rarity", "seqlen_vocab_rarity"} & set(names)
    if rarity or "total_vocab_freq" in names:
        DataAnalyzer(dataset, metric_names=["total_vocab_freq"], metric_functions=[metrics.total_vocab_freq(vocab_size)],
                     metric_types=["accumulate_value_over_samples"], metric_dtypes=[np.int64], **common).run_map_reduce()
    per_sample = [n for n in names if n != "total_vocab_freq"]
    if per_sample:
        freq = metrics.read_vocab_freq(save_path) if rarity else None
        functions = {"seqlen": lambda: metrics.seqlen, "vocab_rarity": lambda: metrics.vocab_rarity(freq),
                     "seqlen_vocab_rarity": lambda: metrics.seqlen_vocab_rarity(freq, block_size)}
        DataAnalyzer(dataset, metric_names=per_sample, metric_functions=[functions[n]() for n in per_sample],
                     metric_types=["single_value_per_sample"] * len(per_sample), metric_dtypes=[np.int64] * len(per_sample),
                     **common).run_map_reduce()
    lines = []
    for name in per_sample:
        prefix = os.path.join(save_path, name, name)
        levels = IndexedFile(f"{prefix}_index_to_metric").concatenated()
        lines.append(f"{name}: {len(levels)} values from {levels[0]} to {levels[-1]}; curriculum_metrics.{name}: "
                     f"index_to_sample_path {prefix}_index_to_sample (value) or "
                     f"{prefix}_index_to_sample_percentile_merged (percentile), "
                     f"index_to_metric_path {prefix}_index_to_metric")
    if "total_vocab_freq" in names:
        lines.append(f"total_vocab_freq: {os.path.join(save_path, 'total_vocab_freq', 'total_vocab_freq_metric_value')}")
    return lines
