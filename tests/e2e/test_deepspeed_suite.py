"""harness/deepspeed_suite.py runs DeepSpeed's own tests against zerotrain (outside make test,
it takes an hour). Here it runs on a stand-in checkout whose one test file (our own) uses the
shim the way DeepSpeed's tests do, so the copying, the name mapping and every rule of the
classification are exercised in a few seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parents[2] / "harness" / "deepspeed_suite.py"

_TESTS = '''
import pytest
import torch

import deepspeed
import zerotrain
from deepspeed.moe.layer import MoE
from deepspeed.runtime.lr_schedules import WARMUP_LR, WarmupLR
from deepspeed.utils.made_up_helpers import made_up_helper


def test_names_are_zerotrains():
    import importlib.util

    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    assert importlib.util.find_spec("zt_suite_pytest_probe")  # the suite's own pytest folder comes first
    assert PipelineModule is zerotrain.pipe.PipelineModule
    assert PipeModelDataParallelTopology is zerotrain.pipe.PipeModelDataParallelTopology
    assert deepspeed.runtime.zero.unwrap_model_for_generation is zerotrain.zero.unwrap_model_for_generation
    assert deepspeed.initialize is zerotrain.initialize
    assert WarmupLR is zerotrain.schedules.WarmupLR and WARMUP_LR == "WarmupLR"
    assert deepspeed.zero.Init is zerotrain.zero.Init
    assert deepspeed.accelerator.get_accelerator().device_name() == "cpu"


def test_a_feature_zerotrain_does_not_claim():
    MoE(hidden_size=4, expert=torch.nn.Linear(4, 4))


def test_a_name_zerotrain_lacks():
    made_up_helper()


def test_a_plain_failure():
    assert 1 == 2


def test_a_skip():
    pytest.skip("needs CUDA")


def test_a_key_zerotrain_refuses():
    zerotrain.initialize(model=torch.nn.Linear(2, 2), config={"train_batch_size": 1, "amp": {"enabled": True}})


def test_a_block_built_with_a_key_zerotrain_refuses():
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig
    DeepSpeedZeroOffloadOptimizerConfig(ratio=0.3)


def test_a_constant_of_a_feature_zerotrain_does_not_claim_as_a_size():
    from deepspeed.runtime.swap_tensor import MIN_SWAPPABLE_BYTES
    torch.empty(2, MIN_SWAPPABLE_BYTES)


def test_a_rank_stopped_on_a_feature_zerotrain_does_not_claim():
    # as DeepSpeed's ranks: one raises for the placeholder, the other fails waiting for it
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", "from deepspeed.checkpoint.ds_to_universal import main; main()"])
    raise RuntimeError("Connection reset by peer")


def test_a_private_name_of_a_feature_zerotrain_does_not_claim():
    from deepspeed.checkpoint.ds_to_universal import _merge_tp_slices
    _merge_tp_slices()
'''


def test_suite_copies_maps_and_classifies(tmp_path):
    source = tmp_path / "DeepSpeed"
    (source / "tests" / "unit" / "runtime").mkdir(parents=True)
    (source / "tests" / "unit" / "__init__.py").write_text("")
    (source / "tests" / "unit" / "runtime" / "test_pld.py").write_text(_TESTS)
    (source / "tests" / "unit" / "runtime" / "test_not_in_the_suite.py").write_text("def test_x():\n    pass\n")
    out = tmp_path / "results.json"
    own_pytest = tmp_path / "suite-pytest"  # stands for the pytest<8.4 the script installs there
    (own_pytest / "pytest-8.3.5.dist-info").mkdir(parents=True)
    (own_pytest / "zt_suite_pytest_probe.py").write_text("")
    proc = subprocess.run([sys.executable, str(_SCRIPT), str(source), "--json", str(out),
                           "--suite-pytest", str(own_pytest)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # unlisted failures
    results = {r["test"].split("::")[-1]: (r["category"], r["reason"]) for r in json.loads(out.read_text())}
    assert set(results) == {"test_names_are_zerotrains", "test_a_feature_zerotrain_does_not_claim",
                            "test_a_name_zerotrain_lacks", "test_a_plain_failure", "test_a_skip",
                            "test_a_key_zerotrain_refuses", "test_a_block_built_with_a_key_zerotrain_refuses",
                            "test_a_constant_of_a_feature_zerotrain_does_not_claim_as_a_size",
                            "test_a_rank_stopped_on_a_feature_zerotrain_does_not_claim",
                            "test_a_private_name_of_a_feature_zerotrain_does_not_claim"}
    assert results["test_names_are_zerotrains"][0] == "passed"
    assert results["test_a_feature_zerotrain_does_not_claim"] == ("n/a", "not claimed: mixture of experts "
                                                                  "(deepspeed.moe.layer.MoE)")
    assert results["test_a_name_zerotrain_lacks"] == ("failed", "zerotrain lacks "
                                                      "deepspeed.utils.made_up_helpers.made_up_helper")
    assert results["test_a_plain_failure"][0] == "failed" and "assert 1 == 2" in results["test_a_plain_failure"][1]
    assert results["test_a_skip"] == ("n/a", "skipped by the test: Skipped: needs CUDA")
    assert results["test_a_key_zerotrain_refuses"] == ("n/a", "not claimed: zerotrain refuses 'amp' by name")
    assert results["test_a_block_built_with_a_key_zerotrain_refuses"] == (
        "n/a", "not claimed: zerotrain refuses 'zero_optimization.offload_optimizer.ratio' by name")
    assert results["test_a_constant_of_a_feature_zerotrain_does_not_claim_as_a_size"] == (
        "n/a", "not claimed: DeepSpeed's async I/O swapper (deepspeed.runtime.swap_tensor.MIN_SWAPPABLE_BYTES)")
    assert results["test_a_rank_stopped_on_a_feature_zerotrain_does_not_claim"] == (
        "n/a", "not claimed: DeepSpeed's universal-checkpoint format and converters "
               "(deepspeed.checkpoint.ds_to_universal.main, on a rank that another one waited for)")
    assert results["test_a_private_name_of_a_feature_zerotrain_does_not_claim"] == (
        "n/a", "not claimed: DeepSpeed's universal-checkpoint format and converters "
               "(deepspeed.checkpoint.ds_to_universal._merge_tp_slices)")
    assert "runtime/test_pld.py" in proc.stdout and "passed    1  failed    2" in proc.stdout
    again = subprocess.run([sys.executable, str(_SCRIPT), "--reclassify", str(out)], capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 1 and "passed    1  failed    2 (listed   0)  n/a    7" in again.stdout
    # a later run of some tests replaces those tests only
    rerun = tmp_path / "rerun.json"
    entries = [e for e in json.loads(out.read_text()) if e["test"].endswith("test_a_plain_failure")]
    entries[0].update(record={"nodeid": entries[0]["test"], "outcome": "passed"}, k="test_a_plain_failure")
    rerun.write_text(json.dumps(entries))
    merged = subprocess.run([sys.executable, str(_SCRIPT), "--reclassify", str(out), str(rerun)],
                            capture_output=True, text=True, timeout=60)
    assert "passed    2  failed    1 (listed   0)  n/a    7" in merged.stdout, merged.stdout
    del entries[0]["k"]  # the same entry from a run of the whole file: it is the file now
    rerun.write_text(json.dumps(entries))
    whole = subprocess.run([sys.executable, str(_SCRIPT), "--reclassify", str(out), str(rerun)],
                           capture_output=True, text=True, timeout=60)
    assert "passed    1  failed    0 (listed   0)  n/a    0" in whole.stdout, whole.stdout


def test_a_hung_test_is_listed_only_by_a_difference_naming_it(tmp_path):
    # a pytest.raises that did not raise leaves no record: the test id alone decides
    listed = "unit/runtime/test_ds_initialize.py::TestOptimizerImplementation::test[fp16-fp32-None]"
    other = "unit/runtime/test_ds_initialize.py::TestOptimizerImplementation::test[fp16-fp16-zero1]"
    runs = tmp_path / "hung.json"
    runs.write_text(json.dumps([{"file": "runtime/test_ds_initialize.py", "test": n, "category": "failed",
                                 "reason": "", "record": {"nodeid": n, "outcome": "hung"}} for n in (listed, other)]))
    out = tmp_path / "again.json"
    proc = subprocess.run([sys.executable, str(_SCRIPT), "--reclassify", str(runs), "--json", str(out)],
                          capture_output=True, text=True, timeout=60)
    results = {r["test"]: r["category"] for r in json.loads(out.read_text())}
    assert results == {listed: "listed", other: "failed"}, proc.stdout
