"""ZeRO-Infinity's swap files: what is wrong with nvme_path is one line before anything is
written, a disk that fills during the run is one line too, and folders of crashed runs go."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from zerotrain.errors import ConfigError, DiskFullError
from zerotrain.zero.nvme_swap import _HOST, FileStore, check_nvme_path, copy_into, rank_folder


def test_a_missing_folder_is_named_and_not_created(tmp_path):
    missing = tmp_path / "no" / "such"
    with pytest.raises(ConfigError, match=r"nvme_path .*no/such.* does not exist; create it"):
        check_nvme_path(str(missing), 1, "fp32 masters")
    with pytest.raises(ConfigError, match="does not exist"):
        rank_folder(str(missing), 0)
    assert not (tmp_path / "no").exists()


def test_a_read_only_folder_is_named():
    assert not os.access("/proc/sys", os.W_OK), "this test needs a read-only folder at /proc/sys"
    with pytest.raises(ConfigError, match=r"nvme_path '/proc/sys' is not writable"):
        check_nvme_path("/proc/sys", 1, "fp32 masters")


def test_too_little_room_names_what_is_needed_and_what_is_free(tmp_path):
    with pytest.raises(ConfigError, match=r"needs 1,000,000,000,000,000,000 bytes \(fp32 masters\), [\d,]+ are free"):
        check_nvme_path(str(tmp_path), 10**18, "fp32 masters")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_disk_that_fills_during_the_run_is_one_line(tmp_path):
    store = FileStore(tmp_path / "f.bin", 8, torch.float32)
    full = os.open("/dev/full", os.O_WRONLY)  # every write: ENOSPC
    real, store.fd = store.fd, full
    try:
        with pytest.raises(DiskFullError, match=r"offload file .*f\.bin: the disk is full; free space"):
            store.write_from(0, torch.ones(8))
    finally:
        store.fd = real
        os.close(full)
    store.write_from(0, torch.arange(8.0))
    out = torch.empty(8)
    store.read_into(0, out)
    assert torch.equal(out, torch.arange(8.0))


def test_folders_of_dead_runs_are_cleared_and_nothing_else(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stale = tmp_path / f"zerotrain-{_HOST}-rank0-pid{dead}"
    live = tmp_path / f"zerotrain-{_HOST}-rank1-pid{os.getppid()}"
    other_host = tmp_path / f"zerotrain-elsewhere-rank0-pid{dead}"
    user = tmp_path / "my-data"
    for folder in (stale, live, other_host, user):
        folder.mkdir()
        (folder / "x.bin").write_bytes(b"1234")
    check_nvme_path(str(tmp_path), 1, "fp32 masters")
    assert not stale.exists()
    assert live.exists() and other_host.exists() and (user / "x.bin").read_bytes() == b"1234"


def test_a_store_goes_with_its_folder_and_copies_file_to_file(tmp_path):
    folder = rank_folder(str(tmp_path), 3)
    assert folder.name == f"zerotrain-{_HOST}-rank3-pid{os.getpid()}"
    a = FileStore(folder / "a.bin", 5, torch.bfloat16)
    a.write_from(0, torch.arange(5.0).bfloat16())
    a.copy_to(tmp_path / "copy.bin")
    b = FileStore(folder / "b.bin", 5, torch.bfloat16)

    class Raw:  # what a checkpoint hands back: a file and a loader
        path = tmp_path / "copy.bin"

        def load(self):
            raise AssertionError("a file is copied file to file, never loaded")

    copy_into(b, Raw())
    out = torch.empty(5, dtype=torch.bfloat16)
    b.read_into(0, out)
    assert torch.equal(out, torch.arange(5.0).bfloat16())
    a.close()
    b.close()
    assert not folder.exists()


@pytest.mark.parametrize("stage", [3])
def test_initialize_checks_the_disk_before_it_writes(tmp_path, stage):
    import zerotrain

    zero = {"stage": stage, "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path)}}
    if stage == 3:
        zero["offload_param"] = {"device": "nvme", "nvme_path": str(tmp_path / "params")}
    cfg = {"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, "zero_optimization": zero}
    with pytest.raises(ConfigError, match=r"params' does not exist"):
        zerotrain.initialize(model=torch.nn.Linear(64, 64), config=cfg)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "params").mkdir()
    engine, *_ = zerotrain.initialize(model=torch.nn.Linear(64, 64), config=cfg)
    assert any(tmp_path.glob(f"zerotrain-{_HOST}-rank0-pid{os.getpid()}/*"))
    assert any((tmp_path / "params").glob("zerotrain-*/*"))
    engine.destroy()
    del engine
    import gc

    gc.collect()
    assert [p.name for p in tmp_path.rglob("*")] == ["params"]  # the swap files go with the engine
