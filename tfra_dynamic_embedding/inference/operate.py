"""The operational side of `tfra-de serve`, in one place so that serve.py stays the model's:
its flags, and `Operations`, which holds the metrics, the access log, the health monitor, the
shard supervisor and the gRPC front for one serve process and starts / drains / stops them.

    tfra-de serve EXPORT --grpc-port 8500 --access-log /var/log/tfra.log \\
        --access-log-max-rate 100 --drain-timeout 30

Usage (serve.run): `ops = Operations(args, name)`; per version (serve.load_version) the model
made with `observer=ops.metrics`, its run `ops.counted(...)`, `ops.watch(model, cluster,
argv_of)` (stopped when the version is retired); `ops.serve_rest(app)`,
`ops.start_grpc(versions)`, `web.run_app(...)`, `ops.close()`.
"""

import sys


def add_arguments(parser):
    """Adds the flags of `Operations` to `tfra-de serve`'s parser."""
    parser.add_argument("--grpc-port", type=int, default=0,
                        help="TF Serving's gRPC API (PredictionService, ModelService) for the "
                             "model on this port (default 0: off; TF Serving uses 8500)")
    parser.add_argument("--no-metrics", dest="metrics", action="store_false",
                        help="no Prometheus metrics (on by default at "
                             "/monitoring/prometheus/metrics)")
    parser.add_argument("--access-log", default="-", metavar="FILE",
                        help="a line per request to FILE ('-': stderr, the default; 'off': none)")
    parser.add_argument("--access-log-max-rate", type=float, default=100.0, metavar="N",
                        help="at most N access-log lines per second, the rest dropped and "
                             "counted (default 100; 0: no limit)")
    parser.add_argument("--health-interval", type=float, default=1.0, metavar="SECONDS",
                        help="seconds between health probes of every shard replica")
    parser.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="on SIGTERM, seconds to answer the requests in flight")
    parser.add_argument("--no-supervise", dest="supervise", action="store_false",
                        help="do not restart shard processes that exit")


class Operations:
    """Metrics, access log and gRPC front of one serve process, and the supervisor and health
    monitor of each version's shards (`watch`).

    Args:
      args: `tfra-de serve`'s parsed flags (those of `add_arguments`, host).
      name: the model name served.
    """

    def __init__(self, args, name):
        from tfra_dynamic_embedding.inference import access_log as access_log_lib  # pylint: disable=import-outside-toplevel
        from tfra_dynamic_embedding.inference import metrics as metrics_lib  # pylint: disable=import-outside-toplevel
        if args.grpc_port and not 0 < args.grpc_port < 65536:
            raise ValueError(f"--grpc-port must be in 1..65535 (0: off); got {args.grpc_port}")
        if args.health_interval <= 0 or args.drain_timeout < 0:
            raise ValueError("--health-interval must be > 0 and --drain-timeout >= 0")
        self.args = args
        self.name = name
        self.metrics = metrics_lib.ServingMetrics() if args.metrics else None
        self.access_log = access_log_lib.AccessLog.open(args.access_log,
                                                        args.access_log_max_rate)
        self.grpc_server = None
        self._grpc_stopped = None

    def counted(self, run):
        """`run(signature, inputs)` counting the rows it answers in the metrics."""
        if self.metrics is None:
            return run
        counters = {}

        def counted(signature, inputs):
            if signature not in counters:
                counters[signature] = self.metrics.counting_rows(
                    self.name, lambda inputs, s=signature: run(s, inputs))
            return counters[signature](inputs)
        return counted

    def watch(self, model, cluster=None, argv_of=None):
        """Starts the supervisor of `cluster` (the shard processes this process started for
        `model`, a RemoteShardedModel; argv_of(shard, task) restarts one) unless --no-supervise,
        and the health monitor of `model`'s shards; returns a `Watcher`."""
        # pylint: disable=import-outside-toplevel
        from tfra_dynamic_embedding.inference import health as health_lib
        from tfra_dynamic_embedding.inference import supervisor as supervisor_lib
        supervisor = None
        if cluster is not None and self.args.supervise and argv_of is not None:
            restarted = None
            if self.metrics is not None:
                restarted = lambda shard, _task, _pid: self.metrics.restarted(shard)  # noqa: E731
            supervisor = supervisor_lib.Supervisor(cluster, argv_of,
                                                   on_restart=restarted).start()
        health = health_lib.HealthMonitor(model.shards, self.args.health_interval,
                                          self.metrics).start()
        return Watcher(health, supervisor)

    def start_grpc(self, versions):
        """Starts the gRPC front (with --grpc-port) serving the newest of `versions`."""
        from tfra_dynamic_embedding.inference import grpc_front  # pylint: disable=import-outside-toplevel
        if not self.args.grpc_port:
            return
        servicer = grpc_front.make_servicer(versions, self.name, versions.newest_status,
                                            self.metrics, self.access_log)
        self.grpc_server = grpc_front.start(servicer, f"{self.args.host}:{self.args.grpc_port}")
        print(f"   gRPC PredictionService / ModelService for {self.name!r} at "
              f"{self.args.host}:{self.grpc_server.port}", flush=True)

    def serve_rest(self, app):
        """Adds /healthz, the metrics route and the request middleware to the REST `app`, and
        has its shutdown (SIGTERM) drain the gRPC front too."""
        from tfra_dynamic_embedding.inference import http_ops  # pylint: disable=import-outside-toplevel
        http_ops.instrument(app, self.name, self.metrics, self.access_log)

        async def drain_grpc(_app):
            # New RPCs are refused from now on; those in flight get --drain-timeout seconds.
            if self.grpc_server is not None:
                self._grpc_stopped = self.grpc_server.stop(self.args.drain_timeout)

        app.on_shutdown.append(drain_grpc)

    def close(self):
        """Waits for the gRPC front's drain and closes the access log."""
        if self.grpc_server is not None:
            stopped = self._grpc_stopped or self.grpc_server.stop(self.args.drain_timeout)
            stopped.wait(self.args.drain_timeout + 5)
        if self.access_log is not None:
            self.access_log.close()
        sys.stdout.flush()


class Watcher:
    """The health monitor and the supervisor of one version's shards: `status()`, `stop()`."""

    def __init__(self, health, supervisor=None):
        self.health, self.supervisor = health, supervisor

    def status(self):
        return self.health.status()

    def stop(self):
        """Stops the monitor and the supervisor (so that the shard processes can be killed)."""
        self.health.stop()
        if self.supervisor is not None:
            self.supervisor.stop()
