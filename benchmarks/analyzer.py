"""The data analyzer on a million samples, and its files against DeepSpeed's own.

    python benchmarks/analyzer.py [--samples 1000000] [--threads 2] [--ds-venv PATH] [--work DIR]

1. Data: the text files under /usr/share/doc (gzip ones unpacked, non-UTF-8 ones skipped,
   the first 24 MB in path order), one document each, tokenized by a byte-level BPE of 8192
   symbols learnt from its first 4 MB (trainer/data/tokenizer.py's train_bpe), an end-of-text
   token after each document (the stream is kept in --work). Sample i is the 512-token window
   starting at token (i * 7919) mod (T - 512) of that stream (a shifted repeat of the real
   text), cut after the first paragraph break ("\n\n") or end of text at or past position
   64 + (31 i mod 448): 1M samples of 65 to 512 tokens, written as Megatron's mmap .idx/.bin
   (uint16).
2. The analysis, in a child process (its wall time and peak RSS, VmHWM): total_vocab_freq,
   then seqlen and vocab_rarity, with DataAnalyzer over IndexedTokens, --threads map
   processes, batches of 8192.
3. With DeepSpeed in --ds-venv (default benchmarks/.ds-venv): DeepSpeed's MMapIndexedDataset
   reads every file of step 2 (rows, dtypes, contents compared with ours); DeepSpeed's
   DataAnalyzer analyses the first --ds-samples samples (seqlen and vocab_rarity, its map then
   reduce), and zerotrain's reader, analyzer and curriculum sampler read its files.

Results: docs/results/analyzer/results.json and README.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "src")]

import numpy as np  # noqa: E402

from common import DS_VENV, REPO, say, status_kib, venv_env  # noqa: E402

WINDOW, MIN_CUT, STRIDE, VOCAB = 512, 64, 7919, 8192
OUT = REPO / "docs" / "results" / "analyzer"


# ---- 1. data ----------------------------------------------------------------------------------
def doc_texts(limit: int) -> list[str]:
    texts, total = [], 0
    for path in sorted(Path("/usr/share/doc").rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        try:
            raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        if text.strip():
            texts.append(text)
            total += len(raw)
            if total >= limit:
                break
    return texts


def token_stream(cache: Path) -> tuple[np.ndarray, int, int, dict]:
    """(tokens, end-of-text id, paragraph-break id, facts), tokenized once and kept in `cache`."""
    if cache.with_suffix(".json").is_file():
        facts = json.loads(cache.with_suffix(".json").read_text())
        return np.load(cache.with_suffix(".npy")), facts["eos"], facts["break"], facts
    from zerotrain.trainer.data.tokenizer import train_bpe

    texts = doc_texts(24 << 20)
    head, size = [], 0
    for t in texts:
        head.append(t)
        size += len(t)
        if size > 4 << 20:
            break
    tokenizer = train_bpe(head, VOCAB)
    eos, brk = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("\u010a\u010a")  # "\n\n", byte-level
    ids = tokenizer(texts)["input_ids"]
    stream = np.concatenate([np.append(np.asarray(r, dtype=np.uint16), np.uint16(eos)) for r in ids])
    facts = {"documents": len(texts), "text_bytes": sum(len(t.encode()) for t in texts), "stream_tokens": len(stream),
             "vocab": len(tokenizer), "eos": eos, "break": brk}
    np.save(cache.with_suffix(".npy"), stream)
    cache.with_suffix(".json").write_text(json.dumps(facts))
    return stream, eos, brk, facts


def make_data(prefix: str, samples: int, cache: Path) -> dict:
    from zerotrain.data.indexed import write_index

    started = time.perf_counter()
    stream, eos, brk, facts = token_stream(cache)
    starts_all = (np.arange(samples, dtype=np.int64) * STRIDE) % (len(stream) - WINDOW)
    sizes = np.empty(samples, dtype=np.int64)
    with open(prefix + ".bin", "wb") as f:
        for lo in range(0, samples, 16384):
            starts = starts_all[lo:lo + 16384]
            windows = stream[starts[:, None] + np.arange(WINDOW)]
            # cut after the first paragraph break or end of text at or past a position that varies by sample
            ends = (windows == eos) | (windows == brk)
            ends &= np.arange(WINDOW) >= (MIN_CUT + (np.arange(lo, lo + len(starts)) * 31) % (WINDOW - MIN_CUT))[:, None]
            lengths = np.where(ends.any(axis=1), ends.argmax(axis=1) + 1, WINDOW)
            sizes[lo:lo + len(starts)] = lengths
            f.write(windows[np.arange(WINDOW) < lengths[:, None]].tobytes())
    write_index(prefix, sizes, np.uint16)
    return {**{k: v for k, v in facts.items() if k not in ("eos", "break")}, "samples": samples,
            "tokens": int(sizes.sum()), "full_512": int((sizes == WINDOW).sum()), "median_length": int(np.median(sizes)),
            "seconds": round(time.perf_counter() - started, 1)}


# ---- 2. the analysis (child process) ----------------------------------------------------------
def analyse(tokens: str, save_path: str, threads: int, vocab: int, samples: int | None = None) -> dict:
    from zerotrain.data_efficiency import DataAnalyzer, metrics
    from zerotrain.data_efficiency.tokens import IndexedTokens

    dataset = IndexedTokens(tokens)
    if samples is not None:
        dataset = Prefix(dataset, samples)
    common = dict(batch_size=8192, num_threads=threads, save_path=save_path, progress=samples is None)
    t0 = time.perf_counter()
    DataAnalyzer(dataset, metric_names=["total_vocab_freq"], metric_functions=[metrics.total_vocab_freq(vocab)],
                 metric_types=["accumulate_value_over_samples"], metric_dtypes=[np.int64], **common).run_map_reduce()
    t1 = time.perf_counter()
    freq = metrics.read_vocab_freq(save_path)
    DataAnalyzer(dataset, metric_names=["seqlen", "vocab_rarity"],
                 metric_functions=[metrics.seqlen, metrics.vocab_rarity(freq)],
                 metric_types=["single_value_per_sample"] * 2, metric_dtypes=[np.int64] * 2, **common).run_map_reduce()
    t2 = time.perf_counter()
    return {"freq_seconds": round(t1 - t0, 1), "metrics_seconds": round(t2 - t1, 1),
            "total_seconds": round(t2 - t0, 1), "peak_rss_mib": round(status_kib("VmHWM") / 1024, 1)}


class Prefix:
    """The first n samples of a token dataset."""

    def __init__(self, dataset, n: int):
        self.dataset, self.n = dataset, n

    def __len__(self):
        return self.n

    def get_batch(self, indices):
        return self.dataset.get_batch(indices)


# ---- 3. DeepSpeed ----------------------------------------------------------------------------
DS_SCRIPT = r'''
import json, sys, time
import numpy as np, torch
from deepspeed.runtime.data_pipeline.data_sampling.indexed_dataset import MMapIndexedDataset
from deepspeed.runtime.data_pipeline.data_sampling.data_analyzer import DataAnalyzer

mode, args = sys.argv[1], json.loads(sys.argv[2])
if mode == "read":  # DeepSpeed's reader on zerotrain's files
    out = {}
    for prefix in args["prefixes"]:
        d = MMapIndexedDataset(prefix, skip_warmup=True)
        flat = np.concatenate([d[i] for i in range(len(d))])
        out[prefix] = {"rows": len(d), "dtype": str(np.dtype(d.dtype)), "sizes_sum": int(d.sizes.sum()),
                       "checksum": int(flat.astype(np.int64).sum()), "first": d[0].tolist()[:4], "last": d[len(d) - 1].tolist()[:4]}
    print(json.dumps(out))
else:  # DeepSpeed's analyzer on the first n samples
    tokens = MMapIndexedDataset(args["tokens"], skip_warmup=True)

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return args["n"]
        def __getitem__(self, i):
            return i, torch.from_numpy(tokens[i].astype(np.int64))

    def pad(items):  # Megatron's batch: text, padding_mask and each sample's index
        width = max(len(r) for _, r in items)
        ids = torch.zeros(len(items), width, dtype=torch.long)
        mask = torch.zeros(len(items), width, dtype=torch.long)
        for k, (_, r) in enumerate(items):
            ids[k, :len(r)], mask[k, :len(r)] = r, 1
        # without "index", DeepSpeed numbers a dict batch's samples by len(batch), its key count
        return {"text": ids, "padding_mask": mask, "index": torch.tensor([[i] for i, _ in items])}

    def freq_fn(data):  # Megatron-DeepSpeed's total_vocab_freq (BERT form: masked)
        return torch.bincount(data["text"].view(-1), minlength=args["vocab"], weights=data["padding_mask"].view(-1)).long()

    common = dict(num_workers=1, worker_id=0, num_threads=2, batch_size=1000, save_path=args["save"], collate_fn=pad)
    t0 = time.time()
    a = DataAnalyzer(Rows(), metric_names=["total_vocab_freq"], metric_functions=[freq_fn],
                     metric_types=["accumulate_value_over_samples"], metric_dtypes=[torch.int64], **common)
    a.run_map(); a.run_reduce()
    counts = MMapIndexedDataset(args["save"] + "/total_vocab_freq/total_vocab_freq_metric_value", skip_warmup=True)
    freq = np.copy(counts[0])  # while counts is alive: its __del__ closes the map under any view
    freq[freq == 0] = 1
    table = torch.tensor(-np.log(freq / freq.sum()), dtype=torch.double)
    seqlen = lambda data: torch.count_nonzero(data["padding_mask"], dim=1).long()
    rarity = lambda data: torch.sum(data["padding_mask"] * table[data["text"]], dim=1).long()
    a = DataAnalyzer(Rows(), metric_names=["seqlen", "vocab_rarity"], metric_functions=[seqlen, rarity],
                     metric_types=["single_value_per_sample"] * 2, metric_dtypes=[torch.int64] * 2, **common)
    a.run_map(); a.run_reduce()
    print(json.dumps({"seconds": round(time.time() - t0, 1)}))
'''


def ds_run(python: Path, mode: str, args: dict) -> dict:
    env = venv_env(python.parent.parent)
    env["PYTHONWARNINGS"] = "ignore"
    r = subprocess.run([str(python), "-c", DS_SCRIPT, mode, json.dumps(args)], env=env, capture_output=True,
                       text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"DeepSpeed {mode} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


FILES = ("sample_to_metric", "index_to_metric", "index_to_sample", "index_to_sample_percentile_merged")


def our_view(prefix: str) -> dict:
    from zerotrain.data.indexed import IndexedFile

    f = IndexedFile(prefix)
    return {"rows": len(f), "dtype": str(f.dtype), "sizes_sum": int(f.sizes.sum()),
            "checksum": int(f.concatenated().astype(np.int64).sum()), "first": f[0].tolist()[:4],
            "last": f[len(f) - 1].tolist()[:4]}


def same_files(a: str, b: str) -> bool:
    """Equal dtype, row sizes and contents (the document index aside: DeepSpeed's merges add entries)."""
    from zerotrain.data.indexed import IndexedFile

    x, y = IndexedFile(a), IndexedFile(b)
    return x.dtype == y.dtype and np.array_equal(x.sizes, y.sizes) and np.array_equal(x.concatenated(), y.concatenated())


def deepspeed_checks(python: Path, work: Path, tokens: str, ours: str, vocab: int, n: int) -> dict:
    from zerotrain.config import load_config
    from zerotrain.data.curriculum_sampler import CurriculumSampler

    prefixes = [f"{ours}/{m}/{m}_{f}" for m in ("seqlen", "vocab_rarity") for f in FILES]
    prefixes.append(f"{ours}/total_vocab_freq/total_vocab_freq_metric_value")
    theirs = ds_run(python, "read", {"prefixes": prefixes})
    read_back = {p: theirs[p] == our_view(p) for p in prefixes}
    say(f"DeepSpeed's MMapIndexedDataset reads our {len(prefixes)} files as we do: {all(read_back.values())}")
    ds_save, small = str(work / "ds_analysis"), str(work / "zt_small")
    ds = ds_run(python, "analyze", {"tokens": tokens, "n": n, "vocab": vocab, "save": ds_save})
    analyse(tokens, small, 2, vocab, samples=n)
    names = [f"{m}/{m}_{f}" for m in ("seqlen", "vocab_rarity") for f in FILES]
    names.append("total_vocab_freq/total_vocab_freq_metric_value")
    equal = {name: same_files(f"{ds_save}/{name}", f"{small}/{name}") for name in names}
    say(f"DeepSpeed's analyzer on {n} samples ({ds['seconds']} s): our analyzer's files equal: {all(equal.values())}")
    block = {"enabled": True, "data_cluster_path": str(work / "clusters"), "curriculum_metrics": {
        "vocab_rarity": {"index_to_sample_path": f"{ds_save}/vocab_rarity/vocab_rarity_index_to_sample_percentile_merged",
                         "index_to_metric_path": f"{ds_save}/vocab_rarity/vocab_rarity_index_to_metric",
                         "difficulty_type": "percentile", "clustering_type": "schedule_based", "min_difficulty": 1,
                         "max_difficulty": 100, "schedule_type": "fixed_root",
                         "schedule_config": {"total_curriculum_step": 50, "difficulty_step": 1, "root_degree": 2}},
        "seqlen": {"index_to_sample_path": f"{ds_save}/seqlen/seqlen_index_to_sample",
                   "index_to_metric_path": f"{ds_save}/seqlen/seqlen_index_to_metric", "difficulty_type": "value",
                   "clustering_type": "schedule_based", "min_difficulty": 128, "max_difficulty": 512,
                   "schedule_type": "fixed_linear",
                   "schedule_config": {"total_curriculum_step": 50, "difficulty_step": 8}}}}
    de = load_config({"train_batch_size": 64, "data_efficiency": {"enabled": True, "data_sampling": {
        "enabled": True, "curriculum_learning": block}}}, world_size=1).data_efficiency
    sampler, drawn = CurriculumSampler(de, n, 64, 0, 1, 1, write_clusters=False), []
    for batch, _ in zip(sampler, range(20)):
        drawn += batch
    return {"deepspeed_reads_ours": read_back, "deepspeed_analysis_seconds": ds["seconds"], "ds_samples": n,
            "ours_equal_deepspeeds": equal, "sampler_on_deepspeed_files": {
                "batches": 20, "samples": len(drawn), "difficulties": sampler.current_difficulties}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ds-venv", type=Path, default=DS_VENV)
    parser.add_argument("--ds-samples", type=int, default=5000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/zerotrain-analyzer-bench"))
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--report-only", action="store_true", help="rewrite README.md from results.json")
    parser.add_argument("--deepspeed-only", action="store_true",
                        help="keep results.json's million-sample run and --work's files; redo the DeepSpeed checks")
    args = parser.parse_args()
    if args.report_only:
        write_report(json.loads((OUT / "results.json").read_text()))
        return
    if args.deepspeed_only:  # the million-sample run kept; DeepSpeed's checks again
        result = json.loads((OUT / "results.json").read_text())
        result["deepspeed"] = deepspeed_checks(args.ds_venv / "bin" / "python", args.work, str(args.work / "tokens"),
                                               str(args.work / "analysis"), result["data"]["vocab"], args.ds_samples)
        (OUT / "results.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        write_report(result)
        return
    if args.child:
        tokens, save, threads, vocab = args.child
        print(json.dumps(analyse(tokens, save, int(threads), int(vocab))))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    tokens, save = str(args.work / "tokens"), str(args.work / "analysis")
    say(f"data: {args.samples} samples from /usr/share/doc ...")
    data = make_data(tokens, args.samples, args.work / "stream")
    say(f"data: {json.dumps(data)}")
    r = subprocess.run([sys.executable, __file__, "--child", tokens, save, str(args.threads), str(data["vocab"])],
                       stdout=subprocess.PIPE, text=True, check=True)
    analysis = json.loads(r.stdout.strip().splitlines()[-1])
    say(f"analysis: {json.dumps(analysis)}")
    result = {"command": " ".join(["python", "benchmarks/analyzer.py", *sys.argv[1:]]), "machine_cpus": os.cpu_count(),
              "load_average_at_start": os.getloadavg()[0], "data": data, "threads": args.threads,
              "analysis": analysis}
    python = args.ds_venv / "bin" / "python"
    if python.is_file():
        result["deepspeed"] = deepspeed_checks(python, args.work, tokens, save, data["vocab"], args.ds_samples)
    else:
        say(f"no DeepSpeed at {python}: the comparison with DeepSpeed's files is skipped")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    write_report(result)
    say(f"wrote {OUT / 'results.json'} and README.md")


def write_report(r: dict) -> None:
    """docs/results/analyzer/README.md: the table of results.json."""
    d, a = r["data"], r["analysis"]
    rows = [
        ("samples (tokens)", f"{d['samples']:,} ({d['tokens']:,}; {d['full_512']:,} of 512, median {d['median_length']})"),
        ("text", f"{d['documents']} files of /usr/share/doc, {d['text_bytes'] / 2**20:.1f} MiB, {d['stream_tokens']:,} "
                 f"tokens (BPE of {d['vocab']})"),
        ("map processes, batch", f"{r['threads']}, 8192"),
        ("total_vocab_freq pass", f"{a['freq_seconds']} s"),
        ("seqlen + vocab_rarity pass", f"{a['metrics_seconds']} s"),
        ("analysis wall time", f"{a['total_seconds']} s ({a['total_seconds'] / 60:.1f} min; target 10 min)"),
        ("peak RSS of the analysis process (VmHWM)", f"{a['peak_rss_mib']} MiB"),
        ("machine", f"{r['machine_cpus']} CPUs, load average {r['load_average_at_start']:.1f} at the start "
                    "(shared with other jobs)"),
    ]
    ds = r.get("deepspeed")
    if ds:
        rows += [
            ("DeepSpeed's MMapIndexedDataset reads our 9 files as we do (rows, dtype, contents)",
             "yes" if all(ds["deepspeed_reads_ours"].values()) else f"no: {ds['deepspeed_reads_ours']}"),
            (f"DeepSpeed's DataAnalyzer on the first {ds['ds_samples']:,} samples ({ds['deepspeed_analysis_seconds']} s): "
             "our files equal its 9 (dtype, rows, contents)",
             "yes" if all(ds["ours_equal_deepspeeds"].values()) else f"no: {ds['ours_equal_deepspeeds']}"),
            ("our curriculum sampler on DeepSpeed's files (vocab_rarity percentile + seqlen value, schedule_based)",
             f"{ds['sampler_on_deepspeed_files']['samples']} samples in {ds['sampler_on_deepspeed_files']['batches']} "
             f"batches, difficulties {ds['sampler_on_deepspeed_files']['difficulties']}"),
        ]
    lines = ["# The data analyzer on a million samples", "",
             f"`{r['command']}` ([benchmarks/analyzer.py](../../../benchmarks/analyzer.py) says how the data is made); "
             "raw numbers in [results.json](results.json).", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    (OUT / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
