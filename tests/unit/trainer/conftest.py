"""Every trainer test runs as one process, with its caches under tmp_path."""

import pytest


@pytest.fixture(autouse=True)
def _single_process(monkeypatch, tmp_path):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ZEROTRAIN_ERROR_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
