"""The parts of an operated `tfra-de serve` alone, without a model (inference/supervisor.py,
access_log.py, health.py, metrics.py): the supervisor's exponential backoff, the access log's
rate limit, health from the replicas' probes, metrics. The whole: test_serve_ops.py."""

import io
import re
import sys
import time

from tfra_dynamic_embedding.distributed.local import LocalCluster
from tfra_dynamic_embedding.inference import access_log, health, metrics, supervisor


def test_the_supervisor_backs_off_exponentially_up_to_its_cap():
    """A process that exits at once is restarted after 0.1, 0.2, 0.4, 0.4 s ... (cap 0.4)."""
    cluster = LocalCluster(servers=(), crasher=1)
    argv = lambda job, task: [sys.executable, "-c", "raise SystemExit(3)"]  # noqa: E731
    log, restarts = io.StringIO(), []
    watcher = None
    try:
        cluster.run("crasher", 0, argv("crasher", 0))
        watcher = supervisor.Supervisor(cluster, argv, initial_backoff=0.1, max_backoff=0.4,
                                        poll=0.02, log=log,
                                        on_restart=lambda *key: restarts.append(key)).start()
        deadline = time.monotonic() + 30
        while len(restarts) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if watcher is not None:
            watcher.stop()
        cluster.close()
    assert len(restarts) >= 4 and watcher.restarts[("crasher", 0)] == len(restarts)
    waits = [float(w) for w in re.findall(r"exited \(3\); restarting at \S+ in ([\d.]+) s",
                                          log.getvalue())]
    assert waits[:4] == [0.1, 0.2, 0.4, 0.4], log.getvalue()


def test_the_access_log_keeps_to_its_rate_and_counts_what_it_dropped():
    out = io.StringIO()
    log = access_log.AccessLog(out, max_rate=5)
    for _ in range(50):   # a burst: one second's worth (5) passes
        log.write("grpc", "Predict m", "OK", 0.001)
    assert out.getvalue().count("\n") == 5 and log.dropped == 45
    time.sleep(0.25)      # a token back
    log.write("rest", "GET /v1/models/m", 200, 0.002, peer="127.0.0.1")
    last = out.getvalue().splitlines()[-1]
    assert last.endswith("rest GET /v1/models/m 200 2.0ms peer=127.0.0.1 "
                         "(dropped 45 lines above 5/s)")
    unlimited = access_log.AccessLog(io.StringIO(), max_rate=0)
    for _ in range(500):
        unlimited.write("grpc", "Predict m", "OK", 0.001)
    assert unlimited.stream.getvalue().count("\n") == 500
    assert access_log.AccessLog.open("off") is None


class _Replicas:
    """A ShardClient's stand-in: `check()` answers the codes set by the test."""

    def __init__(self, *addresses):
        self.addresses = list(addresses)
        self.codes = ["OK"] * len(addresses)

    def check(self, timeout):
        del timeout
        return list(self.codes)


def test_health_follows_the_replicas_and_names_the_dead_shard():
    shards = {"shard_0": _Replicas("a:1", "a:2"), "shard_1": _Replicas("b:1")}
    counted = metrics.ServingMetrics()
    monitor = health.HealthMonitor(shards, interval=60, metrics=counted)
    monitor.probe()
    assert monitor.status() == ("AVAILABLE", "OK", "")
    shards["shard_0"].codes = ["UNAVAILABLE", "OK"]     # one replica left: still available
    monitor.probe()
    assert monitor.status()[0] == "AVAILABLE"
    shards["shard_1"].codes = ["DEADLINE_EXCEEDED"]     # slow: live until 3 probes in a row
    for _ in range(2):
        monitor.probe()
        assert monitor.status()[0] == "AVAILABLE"
    shards["shard_1"].codes = ["OK"]
    monitor.probe()
    shards["shard_1"].codes = ["DEADLINE_EXCEEDED"]
    for _ in range(2):
        monitor.probe()
    assert monitor.status()[0] == "AVAILABLE"           # the count started again
    monitor.probe()
    assert monitor.status()[0] == "UNKNOWN"             # hung: 3 in a row
    shards["shard_1"].codes = ["UNAVAILABLE"]
    monitor.probe()
    assert monitor.status() == ("UNKNOWN", "UNAVAILABLE",
                                "shard 'shard_1' has no live replica (b:1)")
    text = counted.exposition().decode()
    assert 'tfra_de_shard_live_replicas{shard="shard_0"} 1.0' in text
    assert 'tfra_de_shard_live_replicas{shard="shard_1"} 0.0' in text
    shards["shard_1"].codes = ["OK"]
    monitor.probe()
    assert monitor.status()[0] == "AVAILABLE"


def test_metrics_of_two_servers_in_one_process_stay_apart():
    first, second = metrics.ServingMetrics(), metrics.ServingMetrics()
    first.request("m", "grpc:Predict", "OK", 0.01)
    first.shard_call("shard_0", "UNAVAILABLE", 5.0)
    first.replica_failed("shard_0", "localhost:1", "DEADLINE_EXCEEDED")
    text = first.exposition().decode()
    assert 'tfra_de_shard_errors_total{code="UNAVAILABLE",shard="shard_0"} 1.0' in text
    assert ('tfra_de_replica_failures_total{address="localhost:1",code="DEADLINE_EXCEEDED",'
            'shard="shard_0"} 1.0') in text
    assert "tfra_de_requests_total{" not in second.exposition().decode()
