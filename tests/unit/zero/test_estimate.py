"""estimate_memory (zerotrain's own per-rank accounting), DeepSpeed's estimator formulas
(spec section 6, worked by hand here), size parsing and the `zerotrain estimate` command."""

from __future__ import annotations

import pytest

import zerotrain
from zerotrain.cli import main
from zerotrain.commands.estimate import parse_count
from zerotrain.errors import ConfigError
from zerotrain.zero.estimate import deepspeed_estimate, estimate_memory, human_bytes, total_bytes

P = 16 * 64 * 1000  # divisible by every padding unit used below: no rounding


def per_param(est: dict, place: str = "device", n: int = P) -> dict:
    return {c: est[c][place] / n for c in est}


# ---- DeepSpeed's formulas -------------------------------------------------------------------

@pytest.mark.parametrize("offload, n, k, cpu, gpu", [
    (True, 8, 1, 48_000_000_000, 2_000_000_000),          # cpu = P*max(4*8, 16)*1.5, gpu = 2P
    (True, 1, 1, 24_000_000_000, 2_000_000_000),          # max(4, 16) = 16
    (False, 8, 1, 48_000_000_000, 4_250_000_000),         # cpu = 4P*8*1.5, gpu = 2P + 18P/8
    (False, 4, 2, 24_000_000_000, 4_250_000_000),         # cpu counts n per node only
])
def test_deepspeed_zero2(offload, n, k, cpu, gpu):
    assert deepspeed_estimate(10**9, 0, n, k, 2, offload, False, True) == (cpu, gpu)


@pytest.mark.parametrize("opt, par, zero_init, cpu, gpu", [
    (True, True, True, 13_500_000_000, 400_000_000),        # P*18*(1/2)*1.5; 4L
    (True, True, False, 24_000_000_000, 400_000_000),       # P*max(4*4, 9)*1.5
    (True, False, True, 12_000_000_000, 650_000_000),       # P*16/2*1.5; 4L + 2P/8
    (True, False, False, 24_000_000_000, 650_000_000),      # P*max(16, 8)*1.5
    (False, False, True, 2_400_000_000, 2_650_000_000),     # 4L*4*1.5; 4L + 18P/8
    (False, False, False, 24_000_000_000, 2_650_000_000),   # 4P*4*1.5
])
def test_deepspeed_zero3(opt, par, zero_init, cpu, gpu):
    # P = 1e9, L = 1e8, 4 GPUs per node, 2 nodes
    assert deepspeed_estimate(10**9, 10**8, 4, 2, 3, opt, par, zero_init) == (cpu, gpu)


def test_deepspeed_truncates_and_buffer_factor():
    # 18*5/4 = 22.5 -> 22; cpu 4*5*4*1.5 = 120
    assert deepspeed_estimate(5, 0, 4, 1, 2, False, False, True) == (120, 10 + 22)
    assert deepspeed_estimate(10**9, 0, 8, 1, 2, True, False, True, additional_buffer_factor=1.0) \
        == (32_000_000_000, 2_000_000_000)


@pytest.mark.parametrize("stage", [0, 1])
def test_deepspeed_has_no_stage_0_1_estimator(stage):
    with pytest.raises(ValueError, match="no model-state memory estimator"):
        deepspeed_estimate(10**9, 0, 8, 1, stage, False, False, True)


def test_deepspeed_param_offload_alone_is_not_estimated():
    with pytest.raises(ValueError, match="not estimate"):
        deepspeed_estimate(10**9, 10**8, 8, 1, 3, False, True, True)


# ---- zerotrain's accounting -----------------------------------------------------------------

@pytest.mark.parametrize("stage, dtype, expected", [
    (0, "fp32", {"params": 4, "grads": 4, "master_params": 0, "optimizer_states": 8}),
    (0, "bf16", {"params": 2, "grads": 2, "master_params": 4, "optimizer_states": 8}),
    (1, "fp32", {"params": 4, "grads": 4, "master_params": 0, "optimizer_states": 8}),
    (1, "bf16", {"params": 2, "grads": 2, "master_params": 4, "optimizer_states": 8}),
    (2, "fp32", {"params": 4, "grads": 4, "master_params": 0, "optimizer_states": 8}),
    (2, "bf16", {"params": 2, "grads": 2, "master_params": 4, "optimizer_states": 8}),
    (3, "fp16", {"params": 2, "grads": 2, "master_params": 4, "optimizer_states": 8}),
    (3, "fp32", {"params": 4, "grads": 4, "master_params": 0, "optimizer_states": 8}),
])
def test_bytes_per_param_on_one_rank(stage, dtype, expected):
    est = estimate_memory(P, 1, stage, dtype=dtype)
    assert per_param(est) == expected
    assert total_bytes(est, "host") == total_bytes(est, "nvme") == 0


@pytest.mark.parametrize("stage, expected", [
    (0, {"params": 2, "grads": 2, "master_params": 4, "optimizer_states": 8}),
    (1, {"params": 2, "grads": 2, "master_params": 4 / 64, "optimizer_states": 8 / 64}),
    (2, {"params": 2, "grads": 2 / 64, "master_params": 4 / 64, "optimizer_states": 8 / 64}),
    (3, {"params": 2 / 64, "grads": 2 / 64, "master_params": 4 / 64, "optimizer_states": 8 / 64}),
])
def test_what_each_stage_partitions(stage, expected):
    """bf16 with Adam at the ZeRO paper's numbers: 16P, 4P + 12P/N, 2P + 14P/N, 16P/N."""
    assert per_param(estimate_memory(P, 64, stage, dtype="bf16")) == expected


@pytest.mark.parametrize("stage, grads", [(0, 2 + 4), (1, 2 + 4), (2, 4 / 64), (3, 4 / 64)])
def test_fp32_accumulation_keeps_a_wide_gradient_copy(stage, grads):
    assert per_param(estimate_memory(P, 64, stage, dtype="bf16", accumulation="fp32"))["grads"] == grads


def test_padding_is_counted():
    # stages 0-2: one buffer padded to world_size * 16 elements; stage 3: 1/N rounded to 16
    assert estimate_memory(1, 4, 0, dtype="fp32")["params"]["device"] == 4 * 64
    assert estimate_memory(1, 4, 2, dtype="fp32")["optimizer_states"]["device"] == 8 * 16
    assert estimate_memory(1000, 4, 3, dtype="fp32")["params"]["device"] == 4 * 256


@pytest.mark.parametrize("optimizer, nbytes", [("sgd", 0), ("momentum", 4), ("adam", 8), ("AdamW", 8)])
def test_optimizer_state_bytes(optimizer, nbytes):
    assert estimate_memory(P, 1, 0, dtype="fp32", optimizer=optimizer)["optimizer_states"]["device"] == nbytes * P


def test_offload_moves_masters_grads_and_state():
    n = P // 8
    cpu = estimate_memory(P, 8, 2, dtype="bf16", offload_optimizer="cpu")
    assert per_param(cpu, "host", n) == {"params": 0, "grads": 2, "master_params": 4, "optimizer_states": 8}
    assert per_param(cpu, "device", n) == {"params": 16, "grads": 0, "master_params": 0, "optimizer_states": 0}
    nvme = estimate_memory(P, 8, 2, dtype="bf16", offload_optimizer="nvme")
    # ZeRO-Infinity: masters in files with their optimizer state; only the bf16 gradient shard stays
    assert per_param(nvme, "host", n) == {"params": 0, "grads": 2, "master_params": 0, "optimizer_states": 0}
    assert nvme["optimizer_states"]["nvme"] == 8 * n and nvme["master_params"]["nvme"] == 4 * n
    # fp32 training needs a separate master copy once the optimizer steps elsewhere
    assert estimate_memory(P, 8, 1, dtype="fp32", offload_optimizer="cpu")["master_params"]["host"] == 4 * n
    params = estimate_memory(P, 8, 3, dtype="bf16", offload_optimizer="cpu", offload_param="cpu")
    assert params["params"] == {"device": 0, "host": 2 * n, "nvme": 0}
    assert estimate_memory(P, 8, 3, offload_optimizer="nvme", offload_param="nvme")["params"]["nvme"] == 2 * n


def test_compute_on_host_needs_no_fp32_master_copy():
    n = P // 8
    on_host = estimate_memory(P, 8, 2, dtype="fp32", offload_optimizer="cpu", compute_on_host=True)
    assert on_host["master_params"] == {"device": 0, "host": 0, "nvme": 0}
    assert on_host["grads"]["host"] == 4 * n and on_host["optimizer_states"]["host"] == 8 * n
    # half precision keeps its fp32 masters anyway; stage 3 params on nvme need a resident master
    assert estimate_memory(P, 8, 2, offload_optimizer="cpu", compute_on_host=True)["master_params"]["host"] == 4 * n
    nvme = estimate_memory(P, 8, 3, dtype="fp32", offload_optimizer="nvme", offload_param="nvme", compute_on_host=True)
    assert nvme["master_params"] == {"device": 0, "host": 0, "nvme": 4 * n}


def test_largest_layer_is_stage3_working_set():
    assert estimate_memory(P, 8, 3, largest_layer_params=1000)["params"]["device"] == 2 * P // 8 + 2000
    assert estimate_memory(P, 8, 2, largest_layer_params=1000) == estimate_memory(P, 8, 2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(stage=0, offload_optimizer="cpu"), "stage 1, 2 or 3"),
    (dict(stage=2, offload_param="cpu"), "stage 3"),
    (dict(stage=4), "stage must be"),
    (dict(stage=1, dtype="fp8"), "dtype must be"),
    (dict(stage=1, optimizer="shampoo"), "optimizer must be"),
    (dict(stage=1, offload_optimizer="gpu"), "offload_optimizer must be"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        estimate_memory(P, 8, **kwargs)


def test_exported_at_top_level():
    assert zerotrain.estimate_memory is estimate_memory and "estimate_memory" in zerotrain.__all__


# ---- parsing and the command ----------------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ("7B", 7 * 10**9), ("350M", 350 * 10**6), ("1.5e9", 1_500_000_000), ("125k", 125_000),
    ("0.5B", 500_000_000), ("2T", 2 * 10**12), ("1000", 1000), (" 7b ", 7 * 10**9), ("1.3G", 1_300_000_000),
])
def test_parse_count(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["7x", "", "-1", "B", "0", "1e30", "7 B B", "1,000"])
def test_parse_count_rejects(text):
    with pytest.raises(ConfigError):
        parse_count(text, "--params")


def test_parse_count_zero_when_allowed():
    assert parse_count("0", allow_zero=True) == 0


def test_human_bytes():
    assert human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.50 KiB"
    assert human_bytes(3 * 2**30) == "3.00 GiB"


def test_cli_prints_every_stage_with_deepspeed_beside(capsys):
    assert main(["estimate", "--params", "7B", "--world-size", "64"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    rows = [ln for ln in lines if ln[:1].isdigit()]
    assert [r.split()[0] for r in rows] == ["0", "1", "1", "1", "2", "2", "2", "3", "3", "3", "3"]
    ours = estimate_memory(7 * 10**9, 64, 3, dtype="bf16")
    assert human_bytes(total_bytes(ours)) in rows[7]
    # DeepSpeed stage 2 without offload: 2P + int(18P/64) per GPU, 4P*8*1.5 per node
    _, gpu = deepspeed_estimate(7 * 10**9, 0, 8, 8, 2, False, False, True)
    assert gpu == 14_000_000_000 + 1_968_750_000
    assert human_bytes(gpu) in rows[4] and human_bytes(4 * 7 * 10**9 * 8 * 1.5) in rows[4]
    assert "n/a" in rows[0] and "8 per node x 8 nodes" in lines[0]


def test_cli_options(capsys):
    args = ["estimate", "--params", "350M", "--world-size", "4", "--largest-layer", "50M",
            "--dtype", "fp32", "--optimizer", "sgd", "--gpus-per-node", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "fp32, sgd" in out and "2 per node x 2 nodes" in out and "50,000,000" in out
    rows = [ln.split("  ") for ln in out.splitlines() if ln[:1].isdigit()]
    rows = [[c.strip() for c in r if c.strip()] for r in rows]
    stage3 = [r for r in rows if r[0] == "3" and r[1] == "none"][0]
    # every option reaches the figures: dtype, optimizer and largest layer in ours,
    # gpus per node in DeepSpeed's (its per-node CPU figure counts 2 ranks a node)
    ours = estimate_memory(350 * 10**6, 4, 3, dtype="fp32", optimizer="sgd", largest_layer_params=50 * 10**6)
    assert stage3[2] == human_bytes(total_bytes(ours, "device"))
    default = estimate_memory(350 * 10**6, 4, 3)
    assert total_bytes(ours, "device") != total_bytes(default, "device")
    cpu, gpu = deepspeed_estimate(350 * 10**6, 50 * 10**6, 2, 2, 3, False, False, True)
    assert stage3[6:] == [human_bytes(gpu), human_bytes(cpu)]
    assert deepspeed_estimate(350 * 10**6, 50 * 10**6, 4, 1, 3, False, False, True)[0] != cpu
    assert deepspeed_estimate(350 * 10**6, 0, 2, 2, 3, False, False, True)[1] != gpu


@pytest.mark.parametrize("args, message", [
    (["--params", "7x", "--world-size", "64"], "--params '7x'"),
    (["--params", "7B", "--world-size", "0"], "--world-size"),
    (["--params", "7B", "--world-size", "12"], "whole number of nodes"),
    (["--params", "7B", "--world-size", "8", "--dtype", "fp8"], "dtype must be"),
    (["--params", "7B", "--world-size", "8", "--optimizer", "shampoo"], "optimizer must be"),
    (["--params", "1B", "--world-size", "8", "--largest-layer", "2B"], "larger than --params"),
])
def test_cli_bad_input_exits_2_with_one_line(capsys, args, message):
    assert main(["estimate"] + args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("zerotrain: error:") and message in err[0]
