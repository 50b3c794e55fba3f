"""Launching: torchrun's multi-node options, nodes that disagree on their count, the resume
command an interrupted run prints. (The 2-node runs themselves: tests/e2e/test_train_nodes.py.)"""

from __future__ import annotations

import argparse

import pytest

from zerotrain.comm import ParallelState
from zerotrain.commands.train import _rendezvous
from zerotrain.errors import ConfigError
from zerotrain.trainer.loop.interrupt import resume_command
from zerotrain.trainer.preflight import check_nodes


def options(**given):
    names = ("nnodes", "node_rank", "master_addr", "master_port", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
             "max_restarts")
    return argparse.Namespace(**{n: given.get(n) for n in names})


def test_multi_node_options_go_to_torchrun_as_given():
    assert _rendezvous(options()) == ([], 1)
    assert _rendezvous(options(max_restarts=2)) == (["--standalone", "--max_restarts=2"], 1)
    assert _rendezvous(options(nnodes="2", node_rank=1, master_addr="10.0.0.1", master_port=29500)) == (
        ["--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "--master_port=29500"], 2)
    assert _rendezvous(options(nnodes="1:4", rdzv_backend="c10d", rdzv_endpoint="h:1", rdzv_id="job"))[1] == 4


@pytest.mark.parametrize("given, message", [
    ({"nnodes": "2"}, "--nnodes 2 needs a meeting point: --master_addr HOST --master_port PORT"),
    ({"nnodes": "2", "master_addr": "h"}, "--nnodes 2 with --master_addr needs --node_rank (0 to 1)"),
    ({"nnodes": "2", "master_addr": "h", "node_rank": 2}, "node_rank: should be 0 to 1 for --nnodes 2, got 2"),
    ({"nnodes": "two"}, "nnodes: should be a count like 2, or MIN:MAX like 1:4, got 'two'"),
])
def test_bad_launch_options_are_one_line(given, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        _rendezvous(options(**given))


class Gathered:
    """A comm whose all_gather_object answers what each rank would say."""

    def __init__(self, answers, node_of):
        self.answers, self.state = answers, ParallelState(rank=0, world_size=len(answers), local_world_size=1)
        self.node_of = node_of

    def all_gather_object(self, obj):
        return [(a, n) for a, n in zip(self.answers, self.node_of)]


def test_nodes_started_with_another_node_count_are_named():
    check_nodes(Gathered(["2", "2"], [0, 1]))
    check_nodes(Gathered([None, None], [0, 1]))  # launched by torchrun itself: torchrun checked
    with pytest.raises(ConfigError) as err:
        check_nodes(Gathered(["2", "3"], [0, 1]))
    assert str(err.value) == ("node 1 (rank 1) was started with --nnodes 3, but 2 nodes met at the rendezvous; "
                              "start every node with --nnodes 2 (or the count you mean, on all of them)")


def test_the_resume_command_is_the_launch_command_continuing_the_run():
    argv = ["zerotrain", "train", "run.yaml", "--overwrite_output_dir", "--output_dir", "out",
            "--resume_from_checkpoint", "out/checkpoint-5", "--seed=3", "--overwrite_output_dir=true"]
    assert resume_command(argv) == ("zerotrain train run.yaml --output_dir out --seed=3 "
                                    "--resume_from_checkpoint latest")
    assert resume_command(["zerotrain", "train", "--output_dir", "my run"], resume=False) == \
        "zerotrain train --output_dir 'my run' --overwrite_output_dir"
