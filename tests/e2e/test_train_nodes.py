"""Two nodes of one process each, simulated on this machine (two `zerotrain train --nnodes 2`
launchers meeting at a static rendezvous on 127.0.0.1), ~15 s a launch:

    node-local   each node its own output_dir (checkpoint.use_node_local_storage): train,
                 checkpoint, resume bit-identical; a node missing the checkpoint to resume stops
                 the job with one line naming it (nodes told different --nnodes: test_trainer_launch.py)
    shared       one output_dir for both: Ctrl-C on node 0 stops both ranks at one step, exit
                 130, one line naming the checkpoint and the command, which resumes bit-identical
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from e2e_helpers import env, metrics, text_file

from zerotrain.comm.launch import free_port

STEPS, SAVE = 160, 40
ARGS = ["--model_config", "gpt-tiny", "--train_file", "train.txt", "--block_size", "32", "--max_steps", str(STEPS),
        "--save_steps", str(SAVE), "--learning_rate", "2e-3", "--validation_split_percentage", "0",
        "--cache_dir", "cache", "--disable_tqdm", "--logging_steps", "1", "--per_device_train_batch_size", "4",
        "--report_to", "none", "--nproc_per_node", "1", "--master_addr", "127.0.0.1"]


def start(tmp_path, node: int, *extra: str, port: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "zerotrain", "train", *ARGS, "--nnodes", "2", "--node_rank", str(node),
            "--master_port", str(port), *extra]
    return subprocess.Popen(argv, cwd=tmp_path, env=env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def both(tmp_path, extra0: list, extra1: list) -> list[tuple[int, str, str]]:
    port = free_port()
    jobs = [start(tmp_path, 0, *extra0, port=port), start(tmp_path, 1, *extra1, port=port)]
    return [finish(job) for job in jobs]


def finish(job: subprocess.Popen, timeout: int = 300) -> tuple[int, str, str]:
    out, err = job.communicate(timeout=timeout)
    return job.returncode, out, err


def ok(results):
    for code, out, err in results:
        assert code == 0, f"exit {code}\n{out[-2000:]}\n{err[-2000:]}"


def losses(run_dir) -> list:
    return [(r["step"], r["loss"]) for r in metrics(run_dir) if "loss" in r]


def files(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, node-local: each node writes its checkpoints under its own folder."""
    tmp_path = tmp_path_factory.mktemp("nodes")
    text_file(tmp_path / "train.txt", 600)
    (tmp_path / "local.json").write_text(json.dumps({"checkpoint": {"use_node_local_storage": True},
                                                     "zero_optimization": {"stage": 1}}))
    ok(both(tmp_path, ["--output_dir", "n0", "--deepspeed", "local.json"],
            ["--output_dir", "n1", "--deepspeed", "local.json"]))
    return tmp_path, losses(tmp_path / "n0")


def test_node_local_checkpoints_resume_bit_identical_and_a_node_without_one_is_named(reference):
    tmp_path, ref = reference
    assert [s for s, _ in ref] == list(range(1, STEPS + 1))
    for node in (0, 1):  # every node's folder is whole on its own: its rank's files and the shared ones
        folder = tmp_path / f"n{node}" / f"checkpoint-{SAVE}"
        names = set(json.loads((folder / "manifest.json").read_text())["files"])
        assert {"model_states.pt", f"optim_rank{node}.pt", f"rng_rank{node}.pt", "model.safetensors"} <= names
        assert f"optim_rank{1 - node}.pt" not in names
    assert not (tmp_path / "n1" / "metrics.jsonl").exists()  # logs and the final model are rank 0's

    ok(both(tmp_path, ["--output_dir", "n0", "--deepspeed", "local.json", "--resume_from_checkpoint", f"n0/checkpoint-{SAVE}"],
            ["--output_dir", "n1", "--deepspeed", "local.json", "--resume_from_checkpoint", f"n1/checkpoint-{SAVE}"]))
    assert losses(tmp_path / "n0") == ref

    # node 1 lost its newest checkpoint: the job stops before training, naming node 1
    (tmp_path / "n1" / "latest").write_text(f"checkpoint-{STEPS - SAVE}")
    before = files(tmp_path / "n0")
    results = both(tmp_path, ["--output_dir", "n0", "--deepspeed", "local.json", "--resume_from_checkpoint", "latest"],
                   ["--output_dir", "n1", "--deepspeed", "local.json", "--resume_from_checkpoint", "latest"])
    for code, out, err in results:
        assert code == 2 and err.strip().splitlines() == [
            f"zerotrain: error: the nodes disagree about the checkpoint to resume: node 1 (rank 1) finds "
            f"checkpoint-{STEPS - SAVE} in its save_dir, node 0 (rank 0) finds checkpoint-{STEPS}; give every node the "
            "same checkpoint (with node-local storage: its folder and latest), or resume from a tag every node has"], err
        assert "Traceback" not in out + err
    assert files(tmp_path / "n0") == before


def test_shared_output_dir_ctrl_c_stops_every_rank_and_the_named_command_resumes(reference):
    tmp_path, ref = reference
    port = free_port()
    (tmp_path / "shared.json").write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    jobs = [start(tmp_path, node, "--output_dir", "shared", "--deepspeed", "shared.json", port=port) for node in (0, 1)]
    deadline = time.time() + 240
    while not any(r.get("step", 0) >= 10 for r in metrics_or_none(tmp_path / "shared")) and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(jobs[0].pid, signal.SIGINT)  # Ctrl-C in node 0's terminal
    results = [finish(job, 120) for job in jobs]
    assert [code for code, _, _ in results] == [130, 130], results
    lines = results[0][2].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zerotrain: interrupted by SIGINT at step "), lines
    assert results[1][2].strip() == "" and not any("Traceback" in out + err for _, out, err in results)
    step = int(lines[0].split("at step ")[1].split()[0])
    assert 10 <= step < STEPS, "the job finished before Ctrl-C reached it"
    assert f": saved shared/checkpoint-{step}; resume with: " in lines[0]
    assert lines[0].endswith("--resume_from_checkpoint latest (on every node, each with its own --node_rank)")

    command = shlex.split(lines[0].split("; resume with: ")[1].split(" (on every node")[0])
    node1 = [a if a != "0" or command[i - 1] != "--node_rank" else "1" for i, a in enumerate(command)]
    port = free_port()
    jobs = [subprocess.Popen([*argv, "--master_port", str(port)], cwd=tmp_path, env=env(tmp_path),  # a fresh port
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv in (command, node1)]
    ok([finish(job) for job in jobs])
    assert losses(tmp_path / "shared") == ref


def metrics_or_none(run_dir) -> list:
    return metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
