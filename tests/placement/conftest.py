"""Fixtures of the placement tests. Logical devices come from tests/conftest.py (4 CPUs)."""

import pytest


@pytest.fixture(scope="session")
def small_pool():
    from tfra_dynamic_embedding.placement import workloads  # pylint: disable=import-outside-toplevel
    return workloads.generate_pool(96, seed=5, batch_size=4096, row_scale=1 / 16)
