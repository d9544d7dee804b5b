"""`tfra-de serve EXPORT_DIR`: a sharded export served by separate processes on loopback.

    tfra-de serve /tmp/sharded --port 8501 [--replicas 2] [--model-name dlrm]
    curl -d '{"instances": [{"dense": [...], "ids": [...]}]}' \\
         localhost:8501/v1/models/dlrm:predict

Every sparse shard (`shard_<i>/` of `export_sharded`) runs in `--replicas` processes of its own
(`inference/grpc_shards.py`: TF Serving's gRPC PredictionService, model name `shard_<i>`). This
process is the main shard: it loads `main/`, answers TF Serving's REST predict API
(`inference/rest.py`) and, per request, groups the ids per shard (`routing.route`), calls every
shard once over gRPC -- all calls in flight together -- sums the partial pools and runs main. A
replica that does not answer is skipped; a shard none of whose replicas answers fails the request
with HTTP 503 naming it within `--timeout` seconds per replica; a restarted replica is used
again. `--shards '{"shard_0": ["host:port", ...]}'` serves with shards already running elsewhere
(started with `python -m tfra_dynamic_embedding.inference.grpc_shards --saved-model DIR
--address HOST:PORT`, or a stock TF Serving serving `shard_<i>/` as model `shard_<i>`).

Operating it (inference/operate.py; docs/serving.md, "Operating it"): TF Serving's gRPC API for
the model with `--grpc-port`, readiness from the shards' health, Prometheus metrics, an access
log, shard processes restarted when they exit, SIGTERM answering the requests in flight.
"""

import json
import os
import sys

from tfra_dynamic_embedding.inference import operate

READY = "tfra-de serve ready"


class RemoteShardedModel:
    """Main shard in this process, sparse shards behind gRPC `ShardClient`s: `predict(request)`.
    Thread-safe: any number of threads may call `predict` at once.

    Args:
      export_dir: an `export_sharded` directory (its main/ and manifest.json are read here).
      shard_addresses: {shard name: ["host:port", ...]} (replicas) for every shard of it.
      timeout: seconds a replica may take to answer.
      observer: passed to every `ShardClient` (e.g. a metrics.ServingMetrics).

    Usage (shard processes from `start_shards`, `predict` as the trained model predicts, `close`):
    benchmarks/distributed_inference.py; docs/serving.md, "Serving in separate processes".
    """

    def __init__(self, export_dir, shard_addresses, timeout=5.0, observer=None):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        from tfra_dynamic_embedding.inference import manifest as manifest_lib  # pylint: disable=import-outside-toplevel
        from tfra_dynamic_embedding.inference import grpc_shards  # pylint: disable=import-outside-toplevel
        self.manifest = manifest_lib.Manifest.load(export_dir)
        missing = sorted(set(self.manifest.shards) - set(shard_addresses))
        if missing:
            raise ValueError(f"shard_addresses lacks shards {missing} of {export_dir}")
        self.shards = {name: grpc_shards.ShardClient(name, shard_addresses[name], timeout,
                                                     observer=observer)
                       for name in self.manifest.shards}
        self._main = tf.saved_model.load(os.path.join(export_dir, manifest_lib.MAIN_DIR))
        self._serve = self._main.signatures[manifest_lib.SERVING_SIGNATURE]
        self._main_specs = self._serve.structured_input_signature[1]
        self._signature = manifest_lib.SERVING_SIGNATURE

    def pooled(self, request):
        """(routed request, {feature: pooled rows}): one call per shard, all in flight at once."""
        from tfra_dynamic_embedding.inference import routing  # pylint: disable=import-outside-toplevel
        routed = routing.route(self.manifest, request)
        pending = {shard: self.shards[shard].call(self._signature, inputs)
                   for shard, inputs in routed.shard_inputs.items()}
        outputs = {shard: call.result() for shard, call in pending.items()}
        return routed, routing.combine(self.manifest, routed, outputs)

    def predict(self, request):
        """{output name: np.ndarray} for `request` ({input name: array}, the model's inputs)."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        from tfra_dynamic_embedding.inference import routing  # pylint: disable=import-outside-toplevel
        routed, pooled = self.pooled(request)
        inputs = routing.main_inputs(self.manifest, routed, pooled)
        unknown = sorted(set(inputs) - set(self._main_specs))
        if unknown:
            raise ValueError(f"main takes no inputs {unknown}")
        outputs = self._serve(**{name: tf.constant(value, dtype=self._main_specs[name].dtype)
                                 for name, value in inputs.items()})
        return {name: value.numpy() for name, value in outputs.items()}

    def close(self):
        """Closes the shards' channels."""
        for client in self.shards.values():
            client.close()


def start_shards(export_dir, replicas=1, log_dir=None):
    """A started LocalCluster whose job `shard_<i>` has `replicas` shard-server processes per
    sparse shard of `export_dir` (killed by pid on its `close()`)."""
    from tfra_dynamic_embedding.distributed.local import LocalCluster  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.inference import grpc_shards  # pylint: disable=import-outside-toplevel
    with open(os.path.join(export_dir, "manifest.json"), encoding="utf-8") as f:
        shards = list(json.load(f)["shards"])
    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be a positive integer; got {replicas!r}")
    cluster = LocalCluster(servers=(), log_dir=log_dir, **{s: replicas for s in shards})
    try:
        for shard in shards:
            for task in range(replicas):
                cluster.run(shard, task, shard_server_argv(
                    os.path.join(export_dir, shard), cluster.address(shard, task)))
        for shard in shards:
            for task in range(replicas):
                cluster.wait_ready(shard, task, ready=grpc_shards.READY)
    except BaseException:
        cluster.close()
        raise
    return cluster


def shard_server_argv(saved_model_dir, address):
    """The command line of one shard-server process (exits when this process is gone); its
    model name is the directory's name, `shard_<i>`, which the main shard sends."""
    return [sys.executable, "-m", "tfra_dynamic_embedding.inference.grpc_shards",
            "--saved-model", saved_model_dir, "--address", address,
            "--parent-pid", str(os.getpid())]


def add_parser(subparsers):
    """`tfra-de serve`: registers the subcommand (see tfra_dynamic_embedding/cli.py)."""
    parser = subparsers.add_parser(
        "serve", help="serve a sharded export: shard processes + a REST main server",
        description=__doc__.split("\n\n")[2])
    parser.add_argument("export_dir", help="a directory written by export_sharded")
    parser.add_argument("--port", type=int, default=8501, help="REST port (default 8501)")
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--model-name", default=None,
                        help="the model name in the URL (default: the export's model name)")
    parser.add_argument("--replicas", type=int, default=1, help="processes per sparse shard")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="seconds a shard replica may take to answer")
    parser.add_argument("--shards", metavar="JSON", default=None,
                        help="shards already running: {shard: [host:port, ...]} (none started)")
    parser.add_argument("--log-dir", default=None,
                        help="keep the shard processes' logs here, made if missing (default: "
                             "a temporary directory, removed at exit)")
    operate.add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def run(args):
    """Starts the shards (unless --shards) and serves REST (and gRPC with --grpc-port) until
    SIGTERM/Ctrl-C, then answers the requests in flight and stops the shards."""
    if not os.path.isfile(os.path.join(args.export_dir, "manifest.json")):
        raise ValueError(f"export_dir {args.export_dir!r} has no manifest.json: not a sharded "
                         f"export")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535; got {args.port}")
    cluster = None
    try:
        if args.shards:
            try:
                addresses = json.loads(args.shards)
            except ValueError as error:
                raise ValueError(f"--shards must be a JSON object {{shard: [host:port, ...]}}; "
                                 f"got {args.shards!r} ({error})") from None
            if not isinstance(addresses, dict):
                raise ValueError(f"--shards must be a JSON object {{shard: [host:port, ...]}}; "
                                 f"got {args.shards!r}")
        else:
            cluster = start_shards(args.export_dir, args.replicas, args.log_dir)
            addresses = cluster.spec
            for (shard, task), proc in sorted(cluster.processes.items()):
                print(f"   {shard} replica {task} at {cluster.address(shard, task)} "
                      f"(pid {proc.pid})", flush=True)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        from aiohttp import web  # pylint: disable=import-outside-toplevel

        from tfra_dynamic_embedding.inference import rest  # pylint: disable=import-outside-toplevel
        ops = operate.Operations(args, cluster, argv_of=lambda shard, task: shard_server_argv(
            os.path.join(args.export_dir, shard), cluster.address(shard, task)))
        model = None
        try:
            model = RemoteShardedModel(args.export_dir, addresses, args.timeout,
                                       observer=ops.metrics)
            name = args.model_name or model.manifest.model or "model"
            ops.start(model, name)
            app = rest.make_app(name, ops.predict, unavailable=(tf.errors.UnavailableError,),
                                bad_request=(tf.errors.InvalidArgumentError,),
                                model_status=ops.health.status)
            ops.serve_rest(app)
            url = f"http://{args.host}:{args.port}/v1/models/{name}:predict"
            # run_app calls `print` once the port is bound: the ready line means requests work.
            # SIGTERM: it stops listening, answers the requests in flight (for at most
            # --drain-timeout seconds) and returns; `ops` drains the gRPC front alongside.
            web.run_app(app, host=args.host, port=args.port, handle_signals=True,
                        shutdown_timeout=args.drain_timeout,
                        print=lambda _message: print(f"{READY}: {url}", flush=True))
        finally:
            ops.close()   # before the shards go: the supervisor must not restart them
            if model is not None:
                model.close()
    finally:
        if cluster is not None:
            cluster.close()
    return 0
