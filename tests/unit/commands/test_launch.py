"""zerotrain launch: the `deepspeed` launcher's choice of hosts and slots, and the per-host
torchrun commands it prints for a hostfile of several hosts (the local start is in
tests/e2e/test_launch_deepspeed_script.py)."""

import pytest

from zerotrain.cli import main
from zerotrain.commands.launch import read_hostfile, resources
from zerotrain.errors import ConfigError

HOSTS = {"a": 4, "b": 4, "c": 2}


def test_hostfile_lines_and_mistakes(tmp_path):
    good = tmp_path / "hostfile"
    good.write_text("# the cluster\na slots=4\nb slots=2  # small\n\n")
    assert read_hostfile(str(good)) == {"a": 4, "b": 2}
    assert read_hostfile(str(tmp_path / "none")) is None
    bad = tmp_path / "bad"
    bad.write_text("a slots=4\na slots=2\n")
    with pytest.raises(ConfigError, match="line 2: host a is listed twice"):
        read_hostfile(str(bad))


@pytest.mark.parametrize("kwargs, expected", [
    ({}, {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3], "c": [0, 1]}),
    ({"include": "a:1,3@c"}, {"a": [1, 3], "c": [0, 1]}),
    ({"exclude": "a:0@b"}, {"a": [1, 2, 3], "c": [0, 1]}),
    ({"num_nodes": 2, "num_gpus": 2}, {"a": [0, 1], "b": [0, 1]}),
])
def test_resources_follow_the_launchers_rules(kwargs, expected):
    assert resources(HOSTS, **kwargs) == expected


@pytest.mark.parametrize("kwargs, message", [
    ({"include": "a", "exclude": "b"}, "cannot both"),
    ({"include": "z:0"}, "host 'z' is not in the hostfile"),
    ({"include": "c:5"}, "c has no slot 5"),
    ({"num_nodes": 4}, "only 3 hosts"),
    ({"num_gpus": 3}, "c has 2 slots"),
])
def test_impossible_choices_are_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        resources(HOSTS, **kwargs)


def test_several_hosts_print_one_torchrun_command_each(tmp_path, capsys):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=4\nb slots=4\n")
    code = main(["launch", "--hostfile", str(hostfile), "--num_gpus", "2", "--master_port", "6000", "train.py",
                 "--deepspeed", "--deepspeed_config", "ds.json"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and len(lines) == 3
    for rank, (line, host) in enumerate(zip(lines[1:], "ab")):
        assert line.startswith(f"ssh {host} ") and "CUDA_VISIBLE_DEVICES=0,1" in line
        assert f"--nnodes 2 --node_rank {rank} --nproc_per_node 2 --master_addr a --master_port 6000" in line
        assert line.rstrip("'").endswith("-m zerotrain.commands.launch_rank train.py --deepspeed --deepspeed_config "
                                          "ds.json")


def test_refused_launcher_options_name_the_way(capsys):
    assert main(["launch", "--autotuning", "run", "train.py"]) == 2
    assert "zerotrain launch --autotuning: autotuning is not built" in capsys.readouterr().err


def _started(monkeypatch, argv) -> dict:
    """What launch hands to torchrun, without starting it."""
    import torch

    import zerotrain.comm.launch as launcher

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # ranks as asked, whatever GPUs are here
    seen = {}

    def run_ranks(module, args, nproc, quiet=False, rendezvous=None):
        seen.update(module=module, args=args, nproc=nproc, rendezvous=rendezvous)
        return 0, None

    monkeypatch.setattr(launcher, "run_ranks", run_ranks)
    for name in ("ZEROTRAIN_LAUNCH_LOCAL_RANK", "ZEROTRAIN_LAUNCH_MODULE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    assert main(["launch", *argv]) == 0
    return seen


def test_one_node_starts_the_script_through_the_rank_shim(monkeypatch):
    import os

    seen = _started(monkeypatch, ["--num_gpus", "3", "--no_local_rank", "--master_addr", "10.0.0.1",
                                  "--master_port", "7000", "train.py", "--lr", "1"])
    assert seen["module"] == "zerotrain.commands.launch_rank" and seen["nproc"] == 3
    assert seen["args"] == ["train.py", "--lr", "1"]
    assert seen["rendezvous"] == ["--nnodes", "1", "--node_rank", "0", "--master_addr", "10.0.0.1",
                                  "--master_port", "7000"]
    assert os.environ["ZEROTRAIN_LAUNCH_LOCAL_RANK"] == "0"


def test_no_ssh_starts_this_nodes_part_of_the_hostfile(monkeypatch, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=4\nb slots=2\n")
    seen = _started(monkeypatch, ["--hostfile", str(hostfile), "--no_ssh", "--node_rank", "1", "train.py"])
    assert seen["nproc"] == 2
    assert seen["rendezvous"] == ["--nnodes", "2", "--node_rank", "1", "--master_addr", "a", "--master_port", "29500"]
