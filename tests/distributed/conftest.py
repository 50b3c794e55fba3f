import pytest

from world import WorldPool


@pytest.fixture(scope="session")
def world2():
    pool = WorldPool(2)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def world4():
    """4 ranks on however many cores: spawning costs ~15-19 s, so batch the cases per call."""
    pool = WorldPool(4)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def world8():
    """8 ranks (data 2 x pipeline 2 x tensor 2): one short test; the spawn alone is ~30-40 s here."""
    pool = WorldPool(8)
    yield pool
    pool.close()
