"""ZeRO-Infinity's swap files: what is wrong with nvme_path is one line before anything is
written, a disk that fills during the run is one line too, and folders of crashed runs go."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from zerotrain.errors import ConfigError, DiskFullError
from zerotrain.zero.offload.nvme_swap import _HOST, FileStore, check_nvme_path, copy_into, rank_folder


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


def _resident_share(path) -> float:
    """The share of the file's pages in the page cache (mincore over a read-only mapping)."""
    import ctypes
    import mmap

    import numpy as np

    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mm:
        view = np.frombuffer(mm, dtype=np.uint8)  # only for the mapping's address
        rc = libc.mincore(ctypes.c_void_p(view.ctypes.data), size, vec)
        del view  # the mapping closes only once nothing exports it
    assert rc == 0, os.strerror(ctypes.get_errno())
    return sum(v & 1 for v in vec) / pages


def test_will_need_brings_the_whole_range_into_the_page_cache(tmp_path):
    """Linux reads one read-ahead window per WILLNEED and drops the rest of the range: a range
    of several windows must still arrive whole, ahead of the read."""
    from zerotrain.zero.offload.nvme_swap import read_ahead_window

    folder = os.open(tmp_path, os.O_RDONLY)
    window = read_ahead_window(folder)  # the same disk as the file's
    os.close(folder)
    numel = window  # fp32 elements of 4 bytes: the file spans four windows
    (tmp_path / "swap").mkdir()
    store = FileStore(tmp_path / "swap" / "ahead.bin", numel, torch.float32)
    store.write_from(0, torch.arange(numel, dtype=torch.float32))
    os.fsync(store.fd)
    os.posix_fadvise(store.fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages leave the cache
    assert _resident_share(store.path) < 0.2, "the kernel kept the file cached: nothing to measure"
    store.will_need(0, numel)
    deadline = time.monotonic() + 20
    while (share := _resident_share(store.path)) < 0.99 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert share >= 0.99, f"{share:.0%} of the range arrived ({window >> 10} KiB windows)"
    out = torch.empty(numel)
    store.read_into(0, out)
    assert torch.equal(out, torch.arange(numel, dtype=torch.float32))
    store.close()
