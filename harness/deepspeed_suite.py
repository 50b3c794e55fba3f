"""DeepSpeed's own unit tests, run against zerotrain: a yardstick for "bring your DeepSpeed script".

    python harness/deepspeed_suite.py DEEPSPEED_SOURCE [--ref REF] [--only SUBSTRING ...]
                                         [-k EXPR] [--file-timeout S] [--json OUT] [--keep]
                                         [--suite-pytest DIR]
    python harness/deepspeed_suite.py --reclassify RUN.json [LATER.json ...] [--json OUT]

DEEPSPEED_SOURCE is a DeepSpeed checkout (a folder with tests/unit) or a git directory of one
(bare or not: `git archive REF tests` is read from it, REF default HEAD), e.g. what the
`fetch` tool gives for github:deepspeedai/DeepSpeed, or `git clone --bare` makes.

At run time the test files below (SUITE) and what they need (tests/conftest.py,
tests/pytest.ini, the top-level files of tests/unit, the non-test files of each chosen
folder, the data files of tests/) are copied into a temporary folder; nothing of DeepSpeed's enters this repository.
They import `deepspeed`, which here is harness/deepspeed_shim/deepspeed: zerotrain's
objects under DeepSpeed's names, with no behaviour of its own (see its docstring). Each test
file runs in its own pytest process (DeepSpeed's harness exits the session when a test
hangs), on gloo, with DeepSpeed's DistributedTest spawning the ranks.

That pytest is one of its own: DeepSpeed's DistributedFixture registers through a pytest
internal that pytest 8.4 removed (DeepSpeed's requirements-dev.txt pins pytest<8.4), so on
first use `pip install --target harness/.suite-pytest "pytest>=8.3,<8.4"` puts one there
(git-ignored; --suite-pytest names another folder) and it goes first on the children's PYTHONPATH.

Each test counts as one of:
  passed
  failed          listed in DIFFERENCES (a deliberate difference, docs/migrating.md
                  "DeepSpeed's own tests") or not; the unlisted ones are printed
  not applicable  by the rules below, never by editing results:
                  1. the test skipped itself (it needs CUDA, a compiled DeepSpeed kernel, or
                     says the CPU accelerator cannot run it);
                  2. it used a DeepSpeed name under NOT_CLAIMED (a feature zerotrain does
                     not claim), which the shim's placeholder reported as NotInZerotrain;
                  3. zerotrain refused a config key of zerotrain.config.UNSUPPORTED_KEYS by
                     name (a DeepSpeed feature zerotrain does not implement);
                  4. DeepSpeed's harness could not set the test up: a test taking a
                     DistributedFixture fails in setup with FixtureLookupError before any
                     code runs (only under a pytest of 8.4 or later, see above).
A test that hangs, or a file that does not collect, counts as failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIM = ROOT / "harness" / "deepspeed_shim"
SUITE_PYTEST = ROOT / "harness" / ".suite-pytest"
PYTEST_PIN = "pytest>=8.3,<8.4"  # DeepSpeed's requirements-dev.txt: pytest<8.4 (DistributedFixture)

# Folders of tests/unit and the test files taken from each (glob patterns).
SUITE = [
    "runtime/test_lr_schedulers.py",
    "runtime/test_pld.py",
    "runtime/test_data_efficiency.py",
    "runtime/half_precision/test_dynamic_loss_scale.py",
    "runtime/test_ds_config_dict.py",
    "runtime/test_ds_config_model.py",
    "runtime/test_ds_initialize.py",
    "runtime/zero/test_*.py",
    "v1/zero/test_zero.py",  # runtime/zero/test_zero.py until DeepSpeed moved it (2025)
    "checkpoint/test_*.py",
]

# DeepSpeed names (prefixes) of features zerotrain does not claim -> why.
NOT_CLAIMED = {
    "deepspeed.moe": "mixture of experts",
    "deepspeed.ops": "DeepSpeed's compiled kernels (fused/CPU Adam, Lamb, async I/O)",
    "deepspeed.runtime.fp16.fused_optimizer": "DeepSpeed's optimizer wrapper classes",
    "deepspeed.runtime.fp16.unfused_optimizer": "DeepSpeed's optimizer wrapper classes",
    "deepspeed.runtime.bf16_optimizer": "DeepSpeed's optimizer wrapper classes",
    "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3": "DeepSpeed's optimizer wrapper classes",
    "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer": "DeepSpeed's optimizer wrapper classes",
    "deepspeed.runtime.zero.partition_parameters.ZeroParamStatus": "DeepSpeed's per-parameter partition state",
    "deepspeed.zero.MiCS_Init": "MiCS (hierarchical sharding)",
    "deepspeed.runtime.zero.mics": "MiCS (hierarchical sharding)",
    "deepspeed.checkpoint": "DeepSpeed's universal-checkpoint format and converters",
    "deepspeed.runtime.zero.tiling": "TiledLinear",
    # zerotrain's tensor_parallel block (autotp_size) shards with DTensor plans; DeepSpeed's
    # layer-injection modules (their shard-size helpers, replaced layer classes) are its own
    "deepspeed.module_inject": "DeepSpeed's AutoTP layer injection (zerotrain's tensor parallelism is DTensor's)",
    "deepspeed.runtime.tensor_parallel": "DeepSpeed's AutoTP layer injection (zerotrain's tensor parallelism is DTensor's)",
    "deepspeed.runtime.zero.leaf_module_config": "ZeRO-3 leaf modules",
    "deepspeed.utils.set_z3_leaf_modules": "ZeRO-3 leaf modules",
    "deepspeed.utils.get_z3_leaf_modules": "ZeRO-3 leaf modules",
    "deepspeed.utils.z3_leaf_module": "ZeRO-3 leaf modules",
    "deepspeed.utils.set_z3_leaf_modules_by_name": "ZeRO-3 leaf modules",
    "deepspeed.utils.set_z3_leaf_modules_by_suffix": "ZeRO-3 leaf modules",
    "deepspeed.utils.unset_z3_leaf_modules": "ZeRO-3 leaf modules",
    "deepspeed.runtime.zero.partition_parameters.CUDAQuantizer": "ZeRO++ (quantized weights and gradients, hpZ)",
    "deepspeed.runtime.swap_tensor": "DeepSpeed's async I/O swapper",
    "deepspeed.compression": "compression training",
    "deepspeed.runtime.zenflow": "ZenFlow",
    "deepspeed.runtime.torch_autocast": "torch_autocast config block",
    "deepspeed.runtime.checkpoint_engine": "pluggable checkpoint engines",
    "deepspeed.utils.groups": "expert and sequence parallel groups",
    **{f"deepspeed.utils.safe_{verb}_{scope}_{what}": "the tensor-fragment API (safe_get/set_full/local_*)"
       for verb in ("get", "set", "update") for scope in ("full", "local")
       for what in ("fp32_param", "grad", "optimizer_state", "grad_vectorized")},
}

# Failures that come from a deliberate difference: (regex on the test id, regex on the failure's
# text, the ranks' tracebacks included, why). Each is in docs/migrating.md, "DeepSpeed's own tests".
# A test that hung has no text: an entry with the failure pattern _HUNG lists it by its id alone.
_HUNG = "(no result)"  # the failure pattern of a test whose pytest.raises did not raise (nothing recorded)
_WRAPPER = ("DeepSpeedZeroOptimizer", "FP16_Optimizer", "FP16_UnfusedOptimizer", "BF16_Optimizer")
DIFFERENCES: list[tuple[str, str, str]] = [
    ("", r"has no attribute '(ds_\w+|all_gather_coalesced|partition_numel)'|hasattr\(\S+, \"ds_id\"\)"
         r"|ds_status|_orig_torch_empty|linear_bk",
     "DeepSpeed's per-parameter ZeRO-3 attributes (ds_id, ds_status, ds_tensor, ds_persist, ...): "
     "zerotrain keeps shards in its strategy, not on the parameter"),
    ("", r"isinstance\(.*?, (\w+\.)*(" + "|".join(_WRAPPER) + r")\w*\)|object has no attribute '(optimizer|fp16_groups|"
         r"single_partition_of_fp32_groups|bit16_groups|averaged_gradients|loss_scale_config|"
         r"nccl_start_alignment_factor|parallel_partitioned_\w+)'",
     "DeepSpeed's optimizer wrappers: zerotrain returns the torch optimizer itself (fp16 scale readable on it)"),
    ("", r"attribute '(tput_timer|sparse_tensor_module_names|_get_optimizer_ckpt_name|deepspeed_io|"
         r"_configure_train_batch_size|allreduce_gradients|_change_recovery_script_permissions)'",
     "DeepSpeed engine and config internals (throughput timer, sparse-gradient bookkeeping, file-name helpers, "
     "a separate gradient all-reduce: zerotrain reduces during backward)"),
    ("TestIncorectAllgatherBucketSize", _HUNG,
     "an odd allgather_bucket_size is fine: zerotrain needs no NCCL alignment of it (DeepSpeed asserts)"),
    ("test_ds_config_model", r"",
     "DeepSpeed's own pydantic base class (deprecated-field machinery); zerotrain's config has its own"),
    ("test_dynamic_loss_scale.py::.*(all|some)_overflow", r"",
     "fp16 uses the hysteresis algorithm at every stage: the first overflow of a run spends the hysteresis "
     "instead of halving the scale"),
    ("", r"initialize needs model=|first argument is args",
     "initialize without a model is a ConfigError naming the fix, not an AssertionError"),
    (r"TestNoOptim::test\[0\]", r"offload_param: parameter offload needs ZeRO stage 3",
     "offload_param below stage 3 is an error (DeepSpeed ignores it)"),
    ("", r"built under zerotrain.zero.Init\(\), which partitions parameters for ZeRO stage 3",
     "a model built under zero.Init with a config below stage 3 is an error (DeepSpeed trains it unsharded)"),
    ("TestNonPLDModel", r"ModelInterfaceError",
     "layer drop on a model that cannot take its arguments is refused at initialize (a TypeError subclass), "
     "not at the first forward"),
    ("test_invalid_gradient_allreduce_op", r"gradient_allreduce_op: should be 'mean' or 'sum'",
     "a bad value is a ConfigError naming the key, the values it takes and the one given, not DeepSpeed's wording"),
    ("test_sum_gradient_allreduce_rejects_zero3", r"DID NOT RAISE",
     "gradient_allreduce_op \"sum\" is built at every ZeRO stage, 3 included (DeepSpeed refuses it at stage 3)"),
    ("", r": unknown key",
     "keys zerotrain's schema does not know are errors with a did-you-mean (DeepSpeed keys newer than "
     "zerotrain's schema, e.g. Muon's ns_method)"),
    ("", r"'deepspeed>=[\d.]+' distribution was not found",
     "transformers' own DeepSpeed integration (HfDeepSpeedConfig) wants the deepspeed package installed; "
     "zerotrain.Trainer is zerotrain's HF-style trainer"),
    ("test_scattered_init_dist", r"",
     "a world of one process runs without a process group: zero.Init does not start one"),
    ("", r"get_model_ckpt_name_for_rank|mp_rank_\d+_model_states",
     "checkpoint file names: model_states.pt and optim_rank<r>.pt, not mp_rank_00_model_states.pt"),
    ("", r"ZeROOrderedDict|ensure_zero_ordered_dict|MultipleAllGatherHandles",
     "DeepSpeed's ZeRO-3 internals (its _parameters container, all-gather handles): zerotrain's hooks "
     "leave the module's own containers alone"),
    ("test_unwrap_model.py", r"has no attribute '(forward_hooks|backward_hooks|parameter_offload)'",
     "DeepSpeed's stage-3 optimizer keeps the module hooks in lists the test counts (forward_hooks); "
     "zerotrain's hooks are its strategy's, which stand aside inside unwrap_model_for_generation"),
    ("", r"tensor_parallel: \w+ has no tensor-parallel plan",
     "tensor_parallel (autotp_size) splits models that have a tensor-parallel plan (zerotrain's GPT and "
     "BERT, HF models with a base_model_tp_plan) with DTensor; DeepSpeed's AutoTP guesses one for any "
     "model of nn.Linear layers"),
    ("TestZero3LateModuleAttach", r"",
     "DeepSpeed's _parameters container (ZeROOrderedDict); a module attached after initialize runs "
     "unsharded, as there"),
    ("TestHookAttributeDelegation", r"",
     "DeepSpeed's per-module hook attributes (pre_bwd_fn, applied_pre_backward_ref_cnt); the model "
     "itself trains"),
    ("TestZeroGatheredParametersFree", r"should go back to be 0-sized",
     "a stage-3 parameter answers its whole shape and numel outside a gather (DeepSpeed: an empty tensor)"),
    (r"TestOptimizerImplementation::test\[(fp16-fp32|bf16-fp16|bf16-fp32|fp32-fp16)-None\]", _HUNG,
     "data_types.grad_accum_dtype is taken with every training dtype at every stage, 0 included "
     "(DeepSpeed's stage-0 paths raise NotImplementedError for these pairs)"),
    (r"TestStage2IgnoreUnusedParameters::test\[False\]", _HUNG,
     "ignore_unused_parameters: false has no effect (named): parameters without a gradient are always "
     "tolerated (DeepSpeed's stage 2 asserts)"),
    ("test_zero_config_overlapcomm", r"",
     "overlap_comm is on at every stage by default (DeepSpeed: stage 3 only)"),
    ("test_zero_offload_optimizer_config_pipeline", r"has no attribute 'pipeline'",
     "offload_optimizer.pipeline_read/_write have no effect (the NVMe swap always overlaps): no derived "
     "pipeline flag"),
    ("test_zero_leaf_module_", r"has no attribute '(classes|names|name_suffixes)'",
     "ZeRO-3 leaf modules are not built: zero_optimization.leaf_module is accepted whole with no "
     "effect (named), not parsed into DeepSpeed's sub-block"),
    ("test_zero_hpz_", r"_partition_param_sec",
     "ZeRO++ hpZ (secondary partitions) is not built (zero_hpz_partition_size has no effect, named); these "
     "tests call DeepSpeed's Init internals directly"),
    (r"TestZeroOffloadOptim::test\[True\]", r"got 'ZeRORuntimeException'",
     "zero_force_ds_cpu_optimizer has no effect (named): an offloaded step runs the client's torch "
     "optimizer on the host (DeepSpeed refuses one that is not its CPU Adam)"),
    ("TestCheckpointValidationTag::test_checkpoint_unique_tag", r"the ranks were given different tags",
     "ranks saving under different tags is always a ConfigError naming both (DeepSpeed: an AssertionError "
     "with tag_validation FAIL; WARN and IGNORE write the pieces into separate folders)"),
    ("test_elastic_checkpoint_is_deprecated_for_zero3", r"",
     "keys with no effect (elastic_checkpoint) are named in one notice at initialize, not warned about by "
     "the config class"),
    ("", r"deepspeed\.runtime\.engine\._checkpoint_parallel_metadata",
     "DeepSpeed's checkpoint-layout metadata, read by its universal-checkpoint converter (not claimed)"),
    ("", r"get_bfloat16_config",
     "DeepSpeed's config helper functions (get_bfloat16_config): zerotrain's config class reads bf16 "
     "and bfloat16"),
]


def _unsupported_keys(src: Path) -> dict[str, str | None]:
    """Every dotted config key zerotrain refuses by name (its `refused` fields, any spelling),
    with the reason its error gives (what a block built directly says without the key)."""
    sys.path.insert(0, str(src))
    from pydantic import BaseModel

    try:
        from zerotrain.config import REFUSED, ZeroTrainConfig
        from zerotrain.config.base import field_class, spellings
    except ImportError:  # an older zerotrain, whose config has no classes: one set of names
        from zerotrain.config import UNSUPPORTED_KEYS
        return dict.fromkeys(UNSUPPORTED_KEYS)

    found: dict[str, str | None] = {}

    def walk(model: type, prefix: str, seen: tuple) -> None:
        for name, info in model.model_fields.items():
            keys = [prefix + k for k in spellings(name, model)]
            if field_class(info).get("effect") == REFUSED:
                found.update(dict.fromkeys(keys, info.description))
            for sub in _models_in(info.annotation):
                if sub not in seen:
                    for k in keys:
                        walk(sub, k + ".", seen + (sub,))

    def _models_in(annotation) -> list:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for a in getattr(annotation, "__args__", ()) for m in _models_in(a)]

    walk(ZeroTrainConfig, "", (ZeroTrainConfig,))
    return found


# ---------------------------------------------------------------------------------- copying


def _extract(source: Path, ref: str | None, into: Path) -> str:
    """Put DeepSpeed's tests/ under `into`; returns a description of what was taken."""
    if (source / "tests" / "unit").is_dir() and ref is None:
        shutil.copytree(source / "tests", into / "tests", symlinks=True)
        return str(source)
    git_dir = source / ".git" if (source / ".git").exists() else source
    ref = ref or "HEAD"
    commit = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", ref], check=True,
                            capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", commit, "tests"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return f"{source} @ {ref} ({commit[:12]})"


def _select(all_tests: Path, work: Path) -> list[str]:
    """Copy the chosen test files and their helpers from all_tests (DeepSpeed's tests/) into work/tests."""
    unit_src, unit_dst = all_tests / "unit", work / "tests" / "unit"
    unit_dst.mkdir(parents=True)
    for name in ("conftest.py", "pytest.ini"):
        if (all_tests / name).is_file():
            shutil.copy2(all_tests / name, work / "tests" / name)
    for f in unit_src.iterdir():
        if f.is_file():
            shutil.copy2(f, unit_dst / f.name)
    for f in all_tests.rglob("*"):  # data the tests read (configs, vocabularies: ~1.6 MB)
        if f.is_file() and f.suffix != ".py":
            (work / "tests" / f.relative_to(all_tests)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, work / "tests" / f.relative_to(all_tests))
    chosen, helped = [], set()
    for pattern in SUITE:
        for f in sorted(unit_src.glob(pattern)):
            rel = f.relative_to(unit_src)
            dst = unit_dst / rel
            if dst.parent not in helped:
                helped.add(dst.parent)
                dst.parent.mkdir(parents=True, exist_ok=True)
                for helper in f.parent.iterdir():
                    if helper.is_file() and not helper.name.startswith("test_"):
                        shutil.copy2(helper, dst.parent / helper.name)
            shutil.copy2(f, dst)
            chosen.append(str(rel))
    return chosen


# ---------------------------------------------------------------------------------- running


def _events(results: Path) -> list[dict]:
    return [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []


def _pending(results: Path) -> list[str]:
    """Collected tests without a result yet, in the order pytest runs them."""
    events = _events(results)
    done = {e["nodeid"] for e in events if e["event"] == "result"}
    return [n for n in dict.fromkeys(e["nodeid"] for e in events if e["event"] == "collected") if n not in done]


def _run_file(work: Path, rel: str, args, results: Path, log: Path) -> float:
    """Run one file; a test that stalls (no result for --test-timeout + 30 s) is killed,
    counted as hung, and the file runs again without it and without what already has a result.
    DeepSpeed's harness waits forever when a rank hangs, and also when a rank fails a pytest
    check (a pytest.raises that did not raise is a BaseException, which kills the pool worker
    that ran it), so both end up here."""
    env = dict(os.environ)
    paths = [str(args.suite_pytest), str(work / "shim"), str(work / "tests"), str(work / "src")]
    env.update(PYTHONPATH=os.pathsep.join(paths),
               ZT_SUITE_RESULTS=str(results), OMP_NUM_THREADS="1", DS_UNITTEST_TIMEOUT=str(args.test_timeout),
               PYTHONWARNINGS="ignore")
    base = [sys.executable, "-m", "pytest", "-p", "zerotrain_suite_plugin", "-q", "-p", "no:cacheprovider",
            "-p", "no:randomly", f"unit/{rel}"] + (["-k", args.k] if args.k else [])
    start, skip = time.perf_counter(), []
    with open(log, "w") as out:
        while True:
            proc = subprocess.Popen(base + [a for n in skip for a in ("--deselect", n)], cwd=work / "tests",
                                    env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            seen, last_change, stalled = -1, time.monotonic(), False
            while proc.poll() is None:
                time.sleep(2)
                size = results.stat().st_size if results.exists() else 0
                if size != seen:
                    seen, last_change = size, time.monotonic()
                elif time.monotonic() - last_change > args.test_timeout + 30:
                    stalled = True
                    os.killpg(proc.pid, signal.SIGKILL)  # our own child's session, its ranks included
                    proc.wait()
            pending = _pending(results)
            if not pending or time.perf_counter() - start > args.file_timeout:
                break
            hung = pending[0]
            out.write(f"\n[deepspeed_suite] {hung}: {'no result, killed' if stalled else 'session ended'};"
                      " running the rest of the file again\n")
            with open(results, "a") as f:
                f.write(json.dumps({"event": "result", "nodeid": hung, "outcome": "hung"}) + "\n")
            skip = [e["nodeid"] for e in _events(results) if e["event"] == "result"]
    return time.perf_counter() - start


# ---------------------------------------------------------------------------------- classifying


# the placeholder's own error, torch naming the placeholder's type (a DeepSpeed constant used as a
# size), or a private name looked up on a module the shim made (mock.patch.object)
_ABSENT = re.compile(r"(deepspeed(?:\.\w+)+): no zerotrain counterpart|(?:of type '?|but got |<module '|, not ')"
                     r"(deepspeed(?:\.\w+)+)")


def _absent_reason(chain: list[dict]) -> tuple[str | None, str | None]:
    """The DeepSpeed name a placeholder raised for (and why it is not claimed, if it is not)."""
    for entry in chain:
        found = _ABSENT.search(entry["message"])
        name = entry.get("absent") or (found.group(1) or found.group(2) if found else None)
        if name:
            for prefix, why in NOT_CLAIMED.items():
                if name == prefix or name.startswith(prefix + "."):
                    return name, why
            return name, None
    return None, None


def _refused_key(chain: list[dict], unsupported: dict[str, str | None]) -> str | None:
    for entry in chain:
        for m in re.finditer(r"((?:\w+\.)*\w+): [^\n]*?; remove it", entry["message"]):
            if m.group(1) in unsupported:
                return m.group(1)
        # a config block built directly (DeepSpeedZeroOffloadOptimizerConfig(ratio=...)): pydantic's
        # error has zerotrain's reason but not the key
        for m in re.finditer(r"Value error, ([^\[]*?); remove it", entry["message"]):
            for key, why in unsupported.items():
                if why == m.group(1):
                    return key
    return None


_LAST_ERROR = re.compile(r"\b((?:\w+\.)*\w*(?:Error|Exception|Exit|NotInZerotrain)): ")


def _signature(chain: list[dict]) -> str:
    """The most telling line of a failure: a rank's last exception line when there is one."""
    for entry in chain:
        if entry["type"] == "RemoteTraceback":
            starts = [m.start() for m in _LAST_ERROR.finditer(entry["message"])]
            if starts:
                return entry["message"][starts[-1]:].strip(' "')[:240]
    first = chain[0] if chain else {"type": "?", "message": ""}
    return f"{first['type']}: {first['message']}"[:240]


def classify(record: dict, unsupported: dict[str, str | None]) -> tuple[str, str]:
    """(category, reason): category is passed, failed, listed or n/a."""
    outcome = record.get("outcome")
    if outcome == "passed":
        return "passed", ""
    if outcome == "skipped":
        return "n/a", "skipped by the test: " + str(record.get("reason", ""))[:160]
    chain = record.get("chain", [])
    if outcome == "hung":  # nothing was recorded: only a DIFFERENCES entry naming the test can list it
        reason = ("no result in time: a rank hung, or failed a pytest check (pytest.raises that "
                  "did not raise), which DeepSpeed's harness waits for forever")
        for test, failure, why in DIFFERENCES:
            if test and failure == _HUNG and re.search(test, record["nodeid"]):
                return "listed", f"{why} [hung]"
        return "failed", reason
    if record.get("phase") == "setup" and chain and chain[0]["type"] == "FixtureLookupError":
        return "n/a", "DeepSpeed's harness: its DistributedFixture does not register with pytest 8.4 or later"
    name, why = _absent_reason(chain)
    if why:
        return "n/a", f"not claimed: {why} ({name})"
    for other in record.get("absent", []):  # a rank stopped on it; another one failed first, waiting
        found, why = _absent_reason([{"message": "", "absent": other}])
        if why:
            return "n/a", f"not claimed: {why} ({found}, on a rank that another one waited for)"
    key = _refused_key(chain, unsupported)
    if key:
        return "n/a", f"not claimed: zerotrain refuses {key!r} by name"
    reason = f"zerotrain lacks {name}" if name else _signature(chain)
    text = " ".join(e["message"] for e in chain)  # the ranks' tracebacks included
    for test, failure, why in DIFFERENCES:
        if failure != _HUNG and re.search(test, record["nodeid"]) and re.search(failure, text):
            return "listed", f"{why} [{reason[:120]}]"
    return "failed", reason


def _records(results: Path, rel: str) -> list[dict]:
    collected, done, errors, absent = [], {}, [], []
    for rec in _events(results):
        if rec["event"] == "collected":  # (what the test files raised as they were imported is not a test's)
            collected.append(rec["nodeid"])
            absent = []
        elif rec["event"] == "absent":  # a placeholder raised, in any process (the ranks too)
            absent.append(rec["name"])
        elif rec["event"] == "result":  # of the test that ran since the previous result
            if absent:
                rec = dict(rec, absent=list(dict.fromkeys(absent)))
                absent = []
            done.setdefault(rec["nodeid"], rec)
        elif rec["event"] == "collect_error":
            errors.append(rec)
        elif rec["event"] == "collect_skip":  # the whole file skipped itself: one entry
            done[rec["nodeid"]] = dict(rec, outcome="skipped")
            collected.append(rec["nodeid"])
    out = [done.get(n, {"nodeid": n, "outcome": "hung"}) for n in dict.fromkeys(collected)]
    out += [{"nodeid": e["nodeid"] or f"unit/{rel}", "outcome": "failed",
             "chain": [{"type": "CollectError", "message": e["message"]}]} for e in errors]
    return out


# ---------------------------------------------------------------------------------- main


def _row(name: str, counts: collections.Counter, seconds: float | None = None) -> str:
    tail = f"   {seconds:6.0f} s" if seconds is not None else ""
    return (f"{name:58s} passed {counts['passed']:4d}  failed {counts['failed'] + counts['listed']:4d}"
            f" (listed {counts['listed']:3d})  n/a {counts['n/a']:4d}{tail}")


def _classified(file: str, records: list[dict], unsupported: dict[str, str | None], k: str | None = None) -> list[dict]:
    """Entries of the --json output; `k` is the run's -k (None: the whole file ran)."""
    out = []
    for rec in records:
        category, reason = classify(rec, unsupported)
        out.append({"file": file, "test": rec["nodeid"], "category": category, "reason": reason, "record": rec,
                    **({"k": k} if k else {})})
    return out


def _suite_pytest(folder: Path) -> Path:
    """A pytest that DeepSpeed's harness works under, installed into `folder` on first use."""
    if not any(folder.glob("pytest-8.3.*.dist-info")):
        print(f"installing {PYTEST_PIN} into {folder} (DeepSpeed's harness needs pytest<8.4)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(folder), PYTEST_PIN],
                       check=True)
    return folder


def _run(args, unsupported) -> list[dict]:
    args.suite_pytest = _suite_pytest(args.suite_pytest.resolve())
    work = Path(tempfile.mkdtemp(prefix="zt-deepspeed-suite-"))
    staging = work / "source"
    staging.mkdir()
    taken = _extract(args.source.resolve(), args.ref, staging)
    files = _select(staging / "tests", work)
    files = [f for f in files if not args.only or any(s in f for s in args.only)]
    (work / "logs").mkdir()
    # copies, so that edits made meanwhile cannot mix two versions into one run
    shutil.copytree(SHIM, work / "shim", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(args.zerotrain_src, work / "src", ignore=shutil.ignore_patterns("__pycache__"))
    print(f"DeepSpeed tests from {taken}; {len(files)} files; zerotrain from {args.zerotrain_src}; "
          f"work folder {work}", flush=True)
    everything = []
    try:
        for rel in files:
            stem = rel.replace("/", "__")
            results = work / "logs" / f"{stem}.jsonl"
            seconds = _run_file(work, rel, args, results, work / "logs" / f"{stem}.log")
            entries = _classified(rel, _records(results, rel), unsupported, args.k)
            everything += entries
            print(_row(rel, collections.Counter(e["category"] for e in entries), seconds), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return everything


def _report(everything: list[dict]) -> int:
    by_file: dict[str, collections.Counter] = {}
    for e in everything:
        by_file.setdefault(e["file"], collections.Counter())[e["category"]] += 1
    print()
    for file, counts in by_file.items():
        print(_row(file, counts))
    print(_row("total", collections.Counter(e["category"] for e in everything)))
    unlisted = [e for e in everything if e["category"] == "failed"]
    if unlisted:
        print(f"\n{len(unlisted)} failures not listed as deliberate differences:")
        for e in unlisted:
            print(f"  {e['test']}\n      {e['reason']}")
    for category, title in (("listed", "deliberate differences"), ("n/a", "not applicable")):
        reasons = collections.Counter(e["reason"].split(" [")[0] for e in everything if e["category"] == category)
        print(f"\n{title}, by reason:")
        for reason, n in reasons.most_common():
            print(f"  {n:4d}  {reason}")
    return 1 if unlisted else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=Path, nargs="?", help="DeepSpeed checkout or git directory")
    ap.add_argument("--ref", help="git ref to take the tests from (default HEAD)")
    ap.add_argument("--only", nargs="*", default=[], help="run only files whose path contains one of these")
    ap.add_argument("-k", help="pytest -k expression, passed to every file")
    ap.add_argument("--file-timeout", type=int, default=3600,
                    help="seconds per test file before what is left counts as hung (default 3600)")
    ap.add_argument("--test-timeout", type=int, default=120,
                    help="seconds a distributed test may take (DeepSpeed's DS_UNITTEST_TIMEOUT, default 120)")
    ap.add_argument("--zerotrain-src", type=Path, default=ROOT / "src",
                    help="the zerotrain source to test (default this checkout's src/)")
    ap.add_argument("--suite-pytest", type=Path, default=SUITE_PYTEST,
                    help=f"folder holding the pytest the tests run under ({PYTEST_PIN}; installed there "
                         "on first use; default harness/.suite-pytest)")
    ap.add_argument("--json", type=Path, help="write every test's record, category and reason here")
    ap.add_argument("--reclassify", type=Path, nargs="+", metavar="JSON",
                    help="run nothing: classify the records of earlier --json runs with today's rules "
                         "(a file in a later JSON replaces its results from the earlier ones; from a -k "
                         "run, only the tests it ran)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs under logs/)")
    args = ap.parse_args(argv)
    unsupported = _unsupported_keys(args.zerotrain_src)
    if args.reclassify:
        by_file: dict[str, dict[str, dict]] = {}  # file -> test id -> its latest entry
        for path in args.reclassify:
            entries = json.loads(path.read_text())
            for file in dict.fromkeys(e["file"] for e in entries):
                mine = {e["test"]: e for e in entries if e["file"] == file}
                if any("k" in e for e in mine.values()):  # a -k run: those tests only
                    by_file.setdefault(file, {}).update(mine)
                else:  # the whole file ran (test ids may differ between pytest versions)
                    by_file[file] = mine
        everything = [c for tests in by_file.values() for e in tests.values()
                      for c in _classified(e["file"], [e["record"]], unsupported, e.get("k"))]
    elif args.source is None:
        ap.error("give the DeepSpeed source (or --reclassify JSON)")
    else:
        everything = _run(args, unsupported)
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))
    return _report(everything)


if __name__ == "__main__":
    sys.exit(main())
