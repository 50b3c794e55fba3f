"""Checkpoint folders: atomic publication, manifests, corruption and unsafe-pickle detection."""

import json
import os
import pickle

import pytest
import torch

from zerotrain.checkpoint import (
    CheckpointWriter,
    list_complete_tags,
    load_file,
    resolve_checkpoint,
    validate_tag,
    verify_checkpoint,
)
from zerotrain.errors import CheckpointError, ConfigError


def no_barrier():
    pass


def write(save_dir, tag, **files):
    with CheckpointWriter(save_dir, tag, is_main=True, barrier=no_barrier) as writer:
        for name, obj in files.items():
            writer.save(name, obj)
    return save_dir / tag


class Boom(Exception):
    pass


def test_round_trip(tmp_path):
    state = {"w": torch.arange(6.0).reshape(2, 3), "step": 3, "name": "x", "lr": [0.1, 0.2]}
    folder = write(tmp_path, "global_step3", model_states=state)
    assert (tmp_path / "latest").read_text() == "global_step3"
    assert resolve_checkpoint(tmp_path) == folder
    verify_checkpoint(folder)
    loaded = load_file(folder, "model_states")
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 3 and loaded["name"] == "x"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model_states"}
    assert manifest["files"]["model_states"]["size"] == (folder / "model_states").stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step3", "latest"]


def test_barrier_called_around_the_write(tmp_path):
    calls = []
    with CheckpointWriter(tmp_path, "t1", is_main=True, barrier=lambda: calls.append(1)) as w:
        assert len(calls) == 1
        w.save("a.pt", 1)
    assert len(calls) == 4  # staging made; files written; every writer published; latest moved


def test_overwriting_a_tag_keeps_it_loadable(tmp_path):
    write(tmp_path, "global_step5", model=torch.zeros(3), extra=1)
    folder = write(tmp_path, "global_step5", model=torch.ones(3))
    verify_checkpoint(folder)
    assert torch.equal(load_file(resolve_checkpoint(tmp_path), "model"), torch.ones(3))
    assert not (folder / "extra").exists()  # the old folder was replaced, not merged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step5", "latest"]


def test_exception_inside_writer_leaves_previous_checkpoint(tmp_path):
    write(tmp_path, "global_step1", model=torch.zeros(2))
    with pytest.raises(Boom):
        with CheckpointWriter(tmp_path, "global_step1", True, no_barrier) as writer:
            writer.save("model", torch.ones(2))
            raise Boom()
    with pytest.raises(Boom):
        with CheckpointWriter(tmp_path, "global_step2", True, no_barrier) as writer:
            writer.save("model", torch.ones(2))
            raise Boom()
    assert (tmp_path / "latest").read_text() == "global_step1"
    assert not (tmp_path / "global_step2").exists()
    folder = resolve_checkpoint(tmp_path)
    verify_checkpoint(folder)
    assert torch.equal(load_file(folder, "model"), torch.zeros(2))
    # the stale staging folder is cleaned by the next write of that tag
    write(tmp_path, "global_step2", model=torch.ones(2))
    assert not (tmp_path / ".global_step2.staging").exists()
    assert resolve_checkpoint(tmp_path).name == "global_step2"


def test_interrupted_replacement_falls_back_to_the_complete_copy(tmp_path):
    folder = write(tmp_path, "global_step7", model=torch.zeros(2))
    os.rename(folder, tmp_path / ".global_step7.old")  # crash between the two renames
    found = resolve_checkpoint(tmp_path)
    assert found.name == ".global_step7.old"
    verify_checkpoint(found)
    write(tmp_path, "global_step7", model=torch.ones(2))  # next save recovers the layout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step7", "latest"]
    assert torch.equal(load_file(resolve_checkpoint(tmp_path), "model"), torch.ones(2))


def test_truncated_file_is_detected_naming_it(tmp_path):
    folder = write(tmp_path, "global_step5", model_states=torch.randn(100), optim=torch.zeros(4))
    target = folder / "model_states"
    size = target.stat().st_size
    target.write_bytes(target.read_bytes()[:123])
    with pytest.raises(CheckpointError) as err:
        verify_checkpoint(folder)
    assert str(err.value) == (f"global_step5/model_states: size 123 != {size} in manifest; "
                              "the checkpoint is truncated or corrupted")
    with pytest.raises(CheckpointError, match="global_step5/model_states: cannot be read"):
        load_file(folder, "model_states")
    assert list_complete_tags(tmp_path) == []


def test_flipped_byte_is_detected_naming_it(tmp_path):
    folder = write(tmp_path, "global_step5", model_states=torch.randn(100))
    data = bytearray((folder / "model_states").read_bytes())
    data[len(data) // 2] ^= 0x01
    (folder / "model_states").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="global_step5/model_states: sha256 differs"):
        verify_checkpoint(folder)


def test_missing_file_and_manifest(tmp_path):
    folder = write(tmp_path, "global_step5", a=1, b=2)
    (folder / "b").unlink()
    with pytest.raises(CheckpointError, match="global_step5/b: missing"):
        verify_checkpoint(folder)
    (folder / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="no manifest.json"):
        verify_checkpoint(folder)


class Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("via_torch", [True, False])
def test_malicious_pickle_is_refused(tmp_path, via_torch):
    marker = tmp_path / "pwned"
    folder = write(tmp_path, "global_step1", model=torch.zeros(1))
    if via_torch:
        torch.save({"w": Planted(marker)}, folder / "evil")
    else:
        (folder / "evil").write_bytes(pickle.dumps(Planted(marker), protocol=2))
        # the payload is live: an unsafe loader would run it
        pickle.loads(pickle.dumps(Planted(tmp_path / "proof"), protocol=2))
        assert (tmp_path / "proof").exists()
    with pytest.raises(CheckpointError, match="evil: refused to load; the file contains "
                                              "non-tensor code objects"):
        load_file(folder, "evil")
    assert not marker.exists()


@pytest.mark.parametrize("tag", ["../../x", "/abs", "a/b", "a\\b", ".", "..", "", ".hidden",
                                 "latest", "x\0y", " padded", "a\rb", "x" * 241])
def test_bad_tags_refused(tag, tmp_path):
    with pytest.raises(ConfigError, match="is not a plain folder name; use something like "
                                          "global_step100"):
        validate_tag(tag)
    with pytest.raises(ConfigError):
        CheckpointWriter(tmp_path, tag, True, no_barrier)


def test_tag_message_and_non_string():
    with pytest.raises(ConfigError) as err:
        validate_tag("../../x")
    assert str(err.value) == ("tag '../../x' is not a plain folder name; "
                              "use something like global_step100")
    with pytest.raises(ConfigError):
        validate_tag(10)
    assert validate_tag("global_step10") == "global_step10"


def test_bad_file_names_refused(tmp_path):
    with CheckpointWriter(tmp_path, "t", True, no_barrier) as writer:
        for name in ("manifest.json", "../x", "a.tmp", ".hidden"):
            with pytest.raises(ConfigError):
                writer.save(name, 1)


def test_resolve_with_and_without_latest(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist; pass the save_dir"):
        resolve_checkpoint(tmp_path / "nowhere")
    write(tmp_path, "global_step1", a=1)
    write(tmp_path, "global_step2", a=2)
    assert resolve_checkpoint(tmp_path).name == "global_step2"
    assert resolve_checkpoint(tmp_path, "global_step1").name == "global_step1"
    (tmp_path / "latest").unlink()
    with pytest.raises(CheckpointError) as err:
        resolve_checkpoint(tmp_path)
    assert "latest does not exist" in str(err.value)
    assert "pass a tag (available: global_step1, global_step2)" in str(err.value)
    assert resolve_checkpoint(tmp_path, "global_step1").name == "global_step1"
    with pytest.raises(CheckpointError, match="available tags in .*: global_step1, global_step2"):
        resolve_checkpoint(tmp_path, "global_step9")
    with pytest.raises(ConfigError):
        resolve_checkpoint(tmp_path, "../global_step1")
    (tmp_path / "latest").write_text("../etc")
    with pytest.raises(CheckpointError, match="latest is corrupted"):
        resolve_checkpoint(tmp_path)


def test_list_complete_tags_newest_first_and_verified(tmp_path):
    assert list_complete_tags(tmp_path / "nowhere") == []
    for step in (1, 2, 3):
        folder = write(tmp_path, f"global_step{step}", model=torch.full((4,), float(step)))
        os.utime(folder / "manifest.json", ns=(step * 10**9, step * 10**9))
    (tmp_path / "not_a_checkpoint").mkdir()
    assert list_complete_tags(tmp_path) == ["global_step3", "global_step2", "global_step1"]
    (tmp_path / "global_step3" / "model").write_bytes(b"junk")
    assert list_complete_tags(tmp_path) == ["global_step2", "global_step1"]


def test_non_main_rank_only_writes_its_files(tmp_path):
    # rank 0 and rank 1 interleaved in one process: rank 1 writes into rank 0's staging
    main = CheckpointWriter(tmp_path, "global_step4", True, no_barrier)
    other = CheckpointWriter(tmp_path, "global_step4", False, no_barrier)
    main.__enter__()
    other.__enter__()
    other.save("rank1.pt", torch.ones(1))
    main.save("rank0.pt", torch.zeros(1))
    other.__exit__(None, None, None)
    assert not (tmp_path / "global_step4").exists()  # only rank 0 publishes
    main.__exit__(None, None, None)
    folder = resolve_checkpoint(tmp_path)
    verify_checkpoint(folder)
    assert sorted(json.loads((folder / "manifest.json").read_text())["files"]) == \
        ["rank0.pt", "rank1.pt"]


def test_save_latest_false_and_missing_ok(tmp_path):
    assert resolve_checkpoint(tmp_path / "nowhere", missing_ok=True) is None
    assert resolve_checkpoint(tmp_path, missing_ok=True) is None
    with CheckpointWriter(tmp_path, "global_step1", True, no_barrier, save_latest=False) as w:
        w.save("a", 1)
    assert not (tmp_path / "latest").exists()
    assert resolve_checkpoint(tmp_path, missing_ok=True) is None
    with pytest.raises(CheckpointError, match="available tags"):
        resolve_checkpoint(tmp_path, "global_step2", missing_ok=True)  # a named tag must exist
    write(tmp_path, "global_step2", a=2)
    with CheckpointWriter(tmp_path, "global_step3", True, no_barrier, save_latest=False) as w:
        w.save("a", 3)
    assert resolve_checkpoint(tmp_path, missing_ok=True).name == "global_step2"


# ---- hostile files found by harness/fuzz_inputs.py, and leftovers of killed saves ---------
def test_latest_that_is_not_text_or_names_an_impossible_tag(tmp_path):
    write(tmp_path, "a", x=1)
    (tmp_path / "latest").write_bytes(b"\xff\xfe")
    with pytest.raises(CheckpointError, match="latest is corrupted"):
        resolve_checkpoint(tmp_path)
    (tmp_path / "latest").write_text("x" * 300)
    with pytest.raises(CheckpointError, match="latest is corrupted"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(ConfigError):
        validate_tag("x" * 300)


@pytest.mark.parametrize("manifest", [
    "[" * 5000 + "]" * 5000,
    json.dumps({"format": "zerotrain-checkpoint", "files": {"x": {"size": float("inf"), "sha256": "0"}}}),
])
def test_hostile_manifest_is_a_checkpoint_error(tmp_path, manifest):
    folder = write(tmp_path, "a", x=1)
    fmt = json.loads((folder / "manifest.json").read_text())["format"]
    (folder / "manifest.json").write_text(manifest.replace("zerotrain-checkpoint", fmt))
    with pytest.raises(CheckpointError, match="manifest.json"):
        verify_checkpoint(folder)


def test_a_save_clears_what_killed_saves_of_other_tags_left(tmp_path):
    write(tmp_path, "a", x=1)
    (tmp_path / ".b.staging").mkdir()  # killed while writing: garbage
    (tmp_path / ".b.staging" / "x").write_bytes(b"partial")
    newer = write(tmp_path, "tmp", x=4)
    write(tmp_path, "c", x=3)
    os.rename(tmp_path / "c", tmp_path / ".c.old")  # killed between the two renames of c
    os.rename(newer, tmp_path / ".c.staging")
    write(tmp_path, "d", x=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "c", "d", "latest"]
    assert load_file(tmp_path / "c", "x") == 4  # the newer, complete copy of c won
    verify_checkpoint(tmp_path / "c")
