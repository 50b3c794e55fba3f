"""Which model files consolidation reads together: pipeline stages apart, each stage's tensor
ranks in numeric order (the joins themselves run on real worlds: test_tensor_parallel.py)."""

from zerotrain.checkpoint.consolidate import model_file_sets


def _folder(path, *prefixes):
    path.mkdir()
    for prefix in prefixes:
        (path / f"{prefix}model_states.pt").touch()
    return path


def test_plain_pipeline_tensor_and_both(tmp_path):
    assert model_file_sets(_folder(tmp_path / "plain", "")) == [[(None, "")]]
    assert model_file_sets(_folder(tmp_path / "pipe", "pipe_01-", "pipe_00-")) == [[(None, "pipe_00-")],
                                                                                  [(None, "pipe_01-")]]
    assert model_file_sets(_folder(tmp_path / "tp", "tp_01-", "tp_00-", "x-")) == [[(0, "tp_00-"), (1, "tp_01-")]]
    both = [f"pipe_0{s}-tp_{t:02d}-" for s in (1, 0) for t in (10, 2, 0, 1)]
    assert model_file_sets(_folder(tmp_path / "both", *both)) == [
        [(t, f"pipe_0{s}-tp_{t:02d}-") for t in (0, 1, 2, 10)] for s in (0, 1)]
