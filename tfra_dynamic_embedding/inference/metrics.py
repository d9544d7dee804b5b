"""Prometheus metrics of a `tfra-de serve` process (prometheus_client, a registry of its own),
exposed at TF Serving's path `GET /monitoring/prometheus/metrics`.

    tfra_de_requests_total{model, api, code}          requests answered, by front end and code
    tfra_de_request_latency_seconds{model, api}       end to end, arrival to answer (histogram)
    tfra_de_rows_served_total{model}                  rows (examples) of answered predictions
    tfra_de_shard_call_latency_seconds{shard}         one shard call, failover included
    tfra_de_shard_calls_total{shard, code}            shard calls by outcome ("OK", "UNAVAILABLE")
    tfra_de_shard_errors_total{shard, code}           shard calls that failed, by code
    tfra_de_replica_failures_total{shard, address, code}  replicas that did not answer a call
    tfra_de_shard_live_replicas{shard}                replicas answering the health probe
    tfra_de_replica_restarts_total{shard}             replicas restarted by the supervisor

`api` is "<front>:<method>": "rest:predict", "rest:status", "grpc:Predict",
"grpc:GetModelStatus", ...; `code` is the HTTP status for REST and the gRPC code name for gRPC.

Example:
    >>> metrics = ServingMetrics()
    >>> metrics.request("m", "rest:predict", 200, 0.012)
    >>> import numpy as np
    >>> predict = metrics.counting_rows("m", lambda inputs: {"y": 2 * inputs["x"]})
    >>> predict({"x": np.zeros(16)})["y"].shape
    (16,)
    >>> metrics.shard_call("shard_0", "OK", 0.004)
    >>> text = metrics.exposition().decode()
    >>> 'tfra_de_requests_total{api="rest:predict",code="200",model="m"} 1.0' in text
    True
    >>> 'tfra_de_rows_served_total{model="m"} 16.0' in text
    True
"""

import prometheus_client

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
PATH = "/monitoring/prometheus/metrics"
# Requests take milliseconds (a few shard calls) to seconds (a shard timing out): buckets from
# 1 ms to 10 s.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServingMetrics:
    """The serve process's metrics in their own `CollectorRegistry` (two instances in one
    process, e.g. tests, never collide). Thread-safe (prometheus_client's metrics are)."""

    def __init__(self):
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        new = dict(registry=self.registry)
        self._requests = prometheus_client.Counter(
            "tfra_de_requests", "Requests answered, by model, API and status code",
            ["model", "api", "code"], **new)
        self._latency = prometheus_client.Histogram(
            "tfra_de_request_latency_seconds", "End-to-end request latency",
            ["model", "api"], buckets=_BUCKETS, **new)
        self._rows = prometheus_client.Counter(
            "tfra_de_rows_served", "Rows (examples) of answered predictions", ["model"], **new)
        self._shard_latency = prometheus_client.Histogram(
            "tfra_de_shard_call_latency_seconds", "Latency of one shard call, failover included",
            ["shard"], buckets=_BUCKETS, **new)
        self._shard_calls = prometheus_client.Counter(
            "tfra_de_shard_calls", "Shard calls by outcome", ["shard", "code"], **new)
        self._shard_errors = prometheus_client.Counter(
            "tfra_de_shard_errors", "Shard calls that failed, by gRPC code", ["shard", "code"],
            **new)
        self._replica_failures = prometheus_client.Counter(
            "tfra_de_replica_failures", "Replicas that did not answer a call (failed over)",
            ["shard", "address", "code"], **new)
        self._live = prometheus_client.Gauge(
            "tfra_de_shard_live_replicas", "Replicas answering the health probe", ["shard"],
            **new)
        self._restarts = prometheus_client.Counter(
            "tfra_de_replica_restarts", "Replica processes restarted by the supervisor",
            ["shard"], **new)

    # -- front ends ----------------------------------------------------------------------------
    def request(self, model, api, code, seconds):
        """One answered request: `code` an HTTP status or a gRPC code name."""
        self._requests.labels(model, api, str(code)).inc()
        self._latency.labels(model, api).observe(seconds)

    def counting_rows(self, model, predict):
        """`predict` ({input: array} -> {output: array}) counting the rows it answers."""
        counter = self._rows.labels(model)

        def counted(inputs):
            outputs = predict(inputs)
            first = next(iter(outputs.values()), None)
            counter.inc(len(first) if getattr(first, "ndim", 0) else 1)
            return outputs
        return counted

    # -- ShardClient's observer (inference/grpc_shards.py) -------------------------------------
    def shard_call(self, shard, code, seconds):
        self._shard_calls.labels(shard, code).inc()
        self._shard_latency.labels(shard).observe(seconds)
        if code != "OK":
            self._shard_errors.labels(shard, code).inc()

    def replica_failed(self, shard, address, code):
        self._replica_failures.labels(shard, address, code).inc()

    # -- health monitor and supervisor ---------------------------------------------------------
    def live_replicas(self, shard, count):
        self._live.labels(shard).set(count)

    def restarted(self, shard):
        self._restarts.labels(shard).inc()

    def exposition(self):
        """The registry in Prometheus' text format (bytes; content type `CONTENT_TYPE`)."""
        return prometheus_client.generate_latest(self.registry)
