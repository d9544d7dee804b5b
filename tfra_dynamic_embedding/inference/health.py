"""The main model's health from its shards': a thread probes every replica of every shard
(GetModelStatus, `ShardClient.check`) every `interval` seconds; the model is AVAILABLE while
every shard has a live replica, else not. A replica is dead when it refuses the probe
(UNAVAILABLE: no process, no route) or lets `timeouts` probes in a row pass their deadline (a
hung process) -- one slow answer on a busy machine does not flip readiness; any answer makes it
live again. Not available: state "UNKNOWN" (TF Serving's ModelVersionStatus has no
"unavailable" state), error code "UNAVAILABLE" and a message naming the shards without a live
replica. REST `GET /v1/models/M` and gRPC `GetModelStatus`
answer this (readiness); the probe also puts a replica that is back into rotation before any
request has to find it.

Example (no shards: always available):
    >>> monitor = HealthMonitor({})
    >>> monitor.status()
    ('AVAILABLE', 'OK', '')
"""

import threading


class HealthMonitor:
    """Probes `shards` ({name: ShardClient}) from a daemon thread once `start()`ed.

    Args:
      interval: seconds between probe rounds (also the probe's timeout, at least 0.5 s).
      metrics: optional ServingMetrics: live replicas per shard.
      timeouts: probes past their deadline in a row that make a replica dead.
    """

    def __init__(self, shards, interval=1.0, metrics=None, timeouts=3):
        self.shards = dict(shards)
        self.interval = float(interval)
        self.metrics = metrics
        self.timeouts = int(timeouts)
        self._late = {name: [0] * len(c.addresses) for name, c in self.shards.items()}
        # Until the first round the shards are taken as live: `tfra-de serve` starts them and
        # waits for each to print its ready line before serving.
        self.live = {name: list(range(len(c.addresses))) for name, c in self.shards.items()}
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        self.probe()
        self._thread = threading.Thread(target=self._run, name="health", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval + 5)

    def _run(self):
        while not self._stop.wait(self.interval):
            self.probe()

    def probe(self):
        """One round: every replica of every shard probed at once per shard."""
        for name, client in self.shards.items():
            try:
                codes = client.check(timeout=max(self.interval, 0.5))
            except ValueError:   # the client was closed under us (shutdown)
                return
            late = self._late[name]
            for i, code in enumerate(codes):
                late[i] = late[i] + 1 if code == "DEADLINE_EXCEEDED" else 0
            self.live[name] = [i for i, code in enumerate(codes)
                               if code != "UNAVAILABLE" and late[i] < self.timeouts]
            if self.metrics is not None:
                self.metrics.live_replicas(name, len(self.live[name]))

    def status(self):
        """(state, error code, message) as `grpc_shards.function_servicer` takes it."""
        down = sorted(name for name, live in self.live.items() if not live)
        if not down:
            return "AVAILABLE", "OK", ""
        return "UNKNOWN", "UNAVAILABLE", "; ".join(
            f"shard {name!r} has no live replica ({', '.join(self.shards[name].addresses)})"
            for name in down)
