import pytest

from world import WorldPool


@pytest.fixture(scope="session")
def world2():
    pool = WorldPool(2)
    yield pool
    pool.close()
