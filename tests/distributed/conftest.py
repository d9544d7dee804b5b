"""Fixtures of the multi-process tests: clusters that are always torn down."""

import pytest

from tfra_dynamic_embedding.distributed.local import LocalCluster


@pytest.fixture
def make_cluster(tmp_path):
    """`make_cluster(ps=2, worker=1, chief=1, servers=("ps",))` -> a started LocalCluster whose
    logs go under the test's tmp_path; every process is killed when the test ends."""
    clusters = []

    def make(servers=("ps", "worker"), **job_sizes):
        log_dir = tmp_path / f"cluster{len(clusters)}"
        log_dir.mkdir()
        cluster = LocalCluster(servers=servers, log_dir=str(log_dir), **job_sizes)
        clusters.append(cluster)
        return cluster.start()

    yield make
    for cluster in clusters:
        cluster.close()
