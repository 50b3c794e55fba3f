"""Fixtures of the engine tests."""

import logging

import pytest


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    # The engine reads torchrun's variables; a stray one would make it try to join a world.
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def zerotrain_log(caplog):
    logger = logging.getLogger("zerotrain")
    logger.addHandler(caplog.handler)  # initialize turns propagation off
    yield caplog
    logger.removeHandler(caplog.handler)

