"""The operational side of `tfra-de serve`, in one place so that serve.py stays the model's:
its flags, and `Operations`, which holds the metrics, the access log, the health monitor, the
shard supervisor and the gRPC front for one serve process and starts / drains / stops them.

    tfra-de serve EXPORT --grpc-port 8500 --access-log /var/log/tfra.log \\
        --access-log-max-rate 100 --drain-timeout 30

Usage (serve.run): `ops = Operations(args, cluster, argv_of)`, the model made with
`observer=ops.metrics`, `ops.start(model, name)`, the REST app made with `ops.predict` and
`model_status=ops.health.status`, `ops.serve_rest(app)`, `web.run_app(...)`, `ops.close()`.
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
    """Metrics, access log, health, supervisor and gRPC front of one serve process.

    Args:
      args: `tfra-de serve`'s parsed flags (those of `add_arguments`, export_dir, host).
      cluster: the LocalCluster of the shard processes this process started, or None.
      argv_of: (shard, task) -> the command line restarting that replica (for the supervisor).
    """

    def __init__(self, args, cluster=None, argv_of=None):
        from tfra_dynamic_embedding.inference import access_log as access_log_lib  # pylint: disable=import-outside-toplevel
        from tfra_dynamic_embedding.inference import metrics as metrics_lib  # pylint: disable=import-outside-toplevel
        if args.grpc_port and not 0 < args.grpc_port < 65536:
            raise ValueError(f"--grpc-port must be in 1..65535 (0: off); got {args.grpc_port}")
        if args.health_interval <= 0 or args.drain_timeout < 0:
            raise ValueError("--health-interval must be > 0 and --drain-timeout >= 0")
        self.args = args
        self.cluster = cluster
        self.argv_of = argv_of
        self.metrics = metrics_lib.ServingMetrics() if args.metrics else None
        self.access_log = access_log_lib.AccessLog.open(args.access_log,
                                                        args.access_log_max_rate)
        self.health = None
        self.supervisor = None
        self.grpc_server = None
        self.predict = None
        self._name = None
        self._grpc_stopped = None

    def start(self, model, name):
        """Starts the supervisor (if this process started the shards), the health monitor and
        the gRPC front (with --grpc-port) for `model` (a RemoteShardedModel) as `name`."""
        # pylint: disable=import-outside-toplevel
        from tfra_dynamic_embedding.inference import grpc_front
        from tfra_dynamic_embedding.inference import health as health_lib
        from tfra_dynamic_embedding.inference import supervisor as supervisor_lib
        self._name = name
        self.predict = (self.metrics.counting_rows(name, model.predict) if self.metrics
                        else model.predict)
        if self.cluster is not None and self.args.supervise and self.argv_of is not None:
            restarted = None
            if self.metrics is not None:
                restarted = lambda shard, _task, _pid: self.metrics.restarted(shard)  # noqa: E731
            self.supervisor = supervisor_lib.Supervisor(
                self.cluster, self.argv_of, on_restart=restarted).start()
        self.health = health_lib.HealthMonitor(model.shards, self.args.health_interval,
                                               self.metrics).start()
        if self.args.grpc_port:
            servicer = grpc_front.make_servicer(
                self.predict, self.args.export_dir, model.manifest, name, self.health.status,
                self.metrics, self.access_log)
            self.grpc_server = grpc_front.start(servicer,
                                                f"{self.args.host}:{self.args.grpc_port}")
            print(f"   gRPC PredictionService / ModelService for {name!r} at "
                  f"{self.args.host}:{self.grpc_server.port}", flush=True)

    def serve_rest(self, app):
        """Adds /healthz, the metrics route and the request middleware to the REST `app`, and
        has its shutdown (SIGTERM) drain the gRPC front too."""
        from tfra_dynamic_embedding.inference import http_ops  # pylint: disable=import-outside-toplevel
        http_ops.instrument(app, self._name, self.metrics, self.access_log)

        async def drain_grpc(_app):
            # New RPCs are refused from now on; those in flight get --drain-timeout seconds.
            if self.grpc_server is not None:
                self._grpc_stopped = self.grpc_server.stop(self.args.drain_timeout)

        app.on_shutdown.append(drain_grpc)

    def close(self):
        """Waits for the gRPC front's drain, then stops the monitor and the supervisor (so that
        the shard processes can be killed) and closes the access log."""
        if self.grpc_server is not None:
            stopped = self._grpc_stopped or self.grpc_server.stop(self.args.drain_timeout)
            stopped.wait(self.args.drain_timeout + 5)
        if self.health is not None:
            self.health.stop()
        if self.supervisor is not None:
            self.supervisor.stop()
        if self.access_log is not None:
            self.access_log.close()
        sys.stdout.flush()
