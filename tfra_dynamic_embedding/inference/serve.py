"""`tfra-de serve MODEL_DIR`: a sharded export served by separate processes on loopback.

    tfra-de serve /tmp/sharded --port 8501 [--replicas 2] [--model-name dlrm]
    curl -d '{"instances": [{"dense": [...], "ids": [...]}]}' \\
         localhost:8501/v1/models/dlrm:predict

MODEL_DIR is a sharded export (manifest.json), a plain SavedModel (saved_model.pb: served in
this process as one model, no shards), or TF Serving's version layout: numbered directories
`MODEL_DIR/1/`, `MODEL_DIR/2/`, ... each either of those. The newest version is served; every
`--version-poll-seconds` the directory is read again and a newer complete version (its
manifest.json or saved_model.pb present) is loaded -- its shards started -- and served, then the
older one retired, without a restart. Requests are checked against the signature before any shard is
called (`inference/request_checks.py`).

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
        self.signatures = request_signatures(export_dir, self.manifest)

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


def request_signatures(export_dir, manifest):
    """{serving_default: request_checks.Signature} of a sharded export as clients call it: the
    trained model's inputs (`manifest.request_inputs`), main's outputs; None for a manifest that
    does not record its request inputs (requests then pass unchecked)."""
    from tfra_dynamic_embedding.inference import manifest as manifest_lib  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.inference import request_checks  # pylint: disable=import-outside-toplevel
    if not manifest.request_inputs:
        return None
    main = saved_model_signatures(os.path.join(export_dir, manifest_lib.MAIN_DIR))
    outputs = main[manifest_lib.SERVING_SIGNATURE].outputs
    inputs = {name: request_checks.TensorSpec(
        spec["dtype"], None if spec.get("shape") is None else tuple(spec["shape"]))
        for name, spec in manifest.request_inputs.items()}
    return {manifest_lib.SERVING_SIGNATURE: request_checks.Signature(inputs, outputs)}


def saved_model_signatures(saved_model_dir):
    """{name: request_checks.Signature} read from a SavedModel's saved_model.pb."""
    from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=import-outside-toplevel

    from tfra_dynamic_embedding.inference import request_checks  # pylint: disable=import-outside-toplevel
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    return {name: request_checks.Signature.from_signature_def(signature_def)
            for name, signature_def in saved.meta_graphs[0].signature_def.items()
            if not name.startswith("__")}   # __saved_model_init_op is no signature to call


def model_versions(model_dir):
    """{version: directory} of a model directory: its numbered subdirectories that are complete
    (a sharded export's manifest.json, written last, or a SavedModel's saved_model.pb); a
    directory that is itself one of those is version 1.

    Example:
        >>> import tempfile
        >>> root = tempfile.TemporaryDirectory()
        >>> for path in ("1/saved_model.pb", "2/manifest.json", "3/half_written",
        ...              "x/saved_model.pb"):
        ...     os.makedirs(os.path.dirname(os.path.join(root.name, path)), exist_ok=True)
        ...     open(os.path.join(root.name, path), "w").close()
        >>> {v: os.path.basename(d) for v, d in model_versions(root.name).items()}
        {1: '1', 2: '2'}
        >>> root.cleanup()
    """
    if _servable_kind(model_dir):
        return {1: model_dir}
    versions = {}
    for entry in sorted(os.listdir(model_dir)):
        path = os.path.join(model_dir, entry)
        if entry.isdigit() and os.path.isdir(path) and _servable_kind(path):
            versions[int(entry)] = path
    return versions


def _servable_kind(path):
    if os.path.isfile(os.path.join(path, "manifest.json")):
        return "sharded"
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return "saved_model"
    return None


def load_version(version, path, args, addresses=None, ops=None):
    """A `rest.Servable` of one version directory: a sharded export (its shard processes
    started here unless `addresses` are given; with `ops`, an `operate.Operations`, supervised,
    their health watched and their calls measured) or a plain SavedModel loaded in this
    process."""
    from tfra_dynamic_embedding.inference import grpc_front  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.inference import rest  # pylint: disable=import-outside-toplevel
    if _servable_kind(path) == "saved_model":
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        loaded = tf.saved_model.load(path)
        signatures = saved_model_signatures(path)

        def run(signature_name, inputs):
            function = loaded.signatures[signature_name]
            specs = signatures[signature_name].inputs
            outputs = function(**{k: tf.constant(v, dtype=specs[k].dtype)
                                  for k, v in inputs.items()})
            return {k: v.numpy() for k, v in outputs.items()}

        print(f"   version {version}: SavedModel {path} (in process)", flush=True)
        return rest.Servable(version, signatures, ops.counted(run) if ops else run,
                             close=lambda: None,
                             signature_defs=grpc_front.saved_model_signature_defs(path))
    cluster = watcher = model = None
    try:
        if addresses is None:
            log_dir = args.log_dir and (args.log_dir if path == args.export_dir else
                                        os.path.join(args.log_dir, str(version)))
            cluster = start_shards(path, args.replicas, log_dir, args.watch, args.poll_seconds)
            addresses = cluster.spec
            for (shard, task), proc in sorted(cluster.processes.items()):
                print(f"   {shard} replica {task} at {cluster.address(shard, task)} "
                      f"(pid {proc.pid})", flush=True)
        model = RemoteShardedModel(path, addresses, args.timeout,
                                   observer=ops.metrics if ops else None)
        if ops is not None:
            watcher = ops.watch(model, cluster, lambda shard, task: shard_server_argv(
                os.path.join(path, shard), cluster.address(shard, task), args.watch,
                args.poll_seconds))
    except BaseException:
        if model is not None:
            model.close()
        if cluster is not None:
            cluster.close()
        raise

    def close():
        if watcher is not None:
            watcher.stop()     # first: the supervisor must not restart the shards stopped next
        model.close()
        if cluster is not None:
            cluster.close()

    def run(_signature, inputs):
        return model.predict(inputs)

    print(f"   version {version}: sharded export {path}", flush=True)
    defs = ({"serving_default": grpc_front.signature_def(path, model.manifest)}
            if model.manifest.request_inputs else None)
    return rest.Servable(version, model.signatures, ops.counted(run) if ops else run,
                         close=close, status=watcher.status if watcher else None,
                         signature_defs=defs)


def poll_versions(model_dir, versions, load, seconds, stop):
    """Every `seconds` until `stop` is set: serves the newest complete version of `model_dir`
    (TF Serving's "latest" policy): a newer one is loaded (`load(version, path)` -> Servable) and
    the others retired; when the served version's directory is removed, the newest left is
    loaded again and served (a rollback). A version that fails to load is listed as END with its
    error and not tried again; with no version left on disk the served one stays."""
    while not stop.wait(seconds):
        try:
            found = model_versions(model_dir)
        except OSError as error:   # the directory moved away: keep serving what is loaded
            print(f"   cannot read {model_dir}: {error}", flush=True)
            continue
        newest = max(found, default=None)
        served = max(versions.loaded(), default=None)
        if newest is None or newest == served or versions.failed(newest):
            continue
        if newest not in versions.loaded():
            try:
                servable = load(newest, found[newest])
            except Exception as error:  # pylint: disable=broad-except
                versions.retire(newest, error=f"{type(error).__name__}: {error}")
                print(f"   version {newest} failed to load: {error}", flush=True)
                continue
            versions.add(servable)
        for version in sorted(versions.loaded()):
            if version != newest:
                versions.retire(version)
        print(f"   serving version {newest}" + (
            f" (version {served}'s directory is gone)" if served and served > newest else ""),
            flush=True)


def start_shards(export_dir, replicas=1, log_dir=None, watch=None, poll_seconds=1.0):
    """A started LocalCluster whose job `shard_<i>` has `replicas` shard-server processes per
    sparse shard of `export_dir` (killed by pid on its `close()`); with `watch`, each follows
    that delta directory (`live_deltas.py`)."""
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
                    os.path.join(export_dir, shard), cluster.address(shard, task), watch,
                    poll_seconds))
        for shard in shards:
            for task in range(replicas):
                cluster.wait_ready(shard, task, ready=grpc_shards.READY)
    except BaseException:
        cluster.close()
        raise
    return cluster


def shard_server_argv(saved_model_dir, address, watch=None, poll_seconds=1.0):
    """The command line of one shard-server process (exits when this process is gone); its
    model name is the directory's name, `shard_<i>`, which the main shard sends."""
    watching = ["--watch", watch, "--poll-seconds", str(poll_seconds)] if watch else []
    return [sys.executable, "-m", "tfra_dynamic_embedding.inference.grpc_shards",
            "--saved-model", saved_model_dir, "--address", address,
            "--parent-pid", str(os.getpid())] + watching


def add_parser(subparsers):
    """`tfra-de serve`: registers the subcommand (see tfra_dynamic_embedding/cli.py)."""
    parser = subparsers.add_parser(
        "serve", help="serve a sharded export: shard processes + a REST main server",
        description=__doc__.split("\n\n")[2])
    parser.add_argument("export_dir", metavar="MODEL_DIR",
                        help="a directory written by export_sharded, a plain SavedModel, or "
                             "numbered version directories of either (the newest served)")
    parser.add_argument("--port", type=int, default=8501, help="REST port (default 8501)")
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--model-name", default=None,
                        help="the model name in the URL (default: the export's model name)")
    parser.add_argument("--replicas", type=int, default=1, help="processes per sparse shard")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="seconds a shard replica may take to answer")
    parser.add_argument("--shards", metavar="JSON", default=None,
                        help="shards already running: {shard: [host:port, ...]} (none started)")
    parser.add_argument("--watch", metavar="DIR", default=None,
                        help="a DeltaExporter directory of online training: its full export "
                             "and deltas are applied to the shards in place as they appear")
    parser.add_argument("--poll-seconds", type=float, default=1.0,
                        help="how often --watch looks for new exports (default 1)")
    parser.add_argument("--log-dir", default=None,
                        help="keep the shard processes' logs here, made if missing (default: "
                             "a temporary directory, removed at exit)")
    parser.add_argument("--version-poll-seconds", type=float, default=5.0,
                        help="read MODEL_DIR for a newer version every this many seconds "
                             "(0: never; default 5)")
    parser.add_argument("--max-body-mb", type=float, default=None,
                        help="the largest request body accepted, in MiB (default 64; larger: "
                             "HTTP 413)")
    operate.add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def run(args):
    """Loads the newest version (starting its shards unless --shards), serves REST (and gRPC
    with --grpc-port) until SIGTERM/Ctrl-C, loading newer versions as they appear; then answers
    the requests in flight and stops the shards."""
    import threading  # pylint: disable=import-outside-toplevel
    if not os.path.isdir(args.export_dir):
        raise ValueError(f"MODEL_DIR {args.export_dir!r} is not a directory")
    found = model_versions(args.export_dir)
    if not found:
        raise ValueError(f"MODEL_DIR {args.export_dir!r} is neither a sharded export "
                         f"(manifest.json) nor a SavedModel (saved_model.pb), nor holds numbered "
                         f"version directories of those")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535; got {args.port}")
    if args.version_poll_seconds < 0:
        raise ValueError(f"--version-poll-seconds must be >= 0; got {args.version_poll_seconds}")
    if args.watch is not None and not os.path.isdir(args.watch):
        raise ValueError(f"--watch {args.watch!r} is not a directory")
    if not args.poll_seconds > 0:
        raise ValueError(f"--poll-seconds must be > 0; got {args.poll_seconds}")
    from tfra_dynamic_embedding.inference import rest  # pylint: disable=import-outside-toplevel
    max_body_mb = rest.DEFAULT_MAX_BODY_MB if args.max_body_mb is None else args.max_body_mb
    if max_body_mb <= 0:
        raise ValueError(f"--max-body-mb must be > 0; got {args.max_body_mb}")
    addresses = None
    if args.shards:
        try:
            addresses = json.loads(args.shards)
        except ValueError as error:
            raise ValueError(f"--shards must be a JSON object {{shard: [host:port, ...]}}; "
                             f"got {args.shards!r} ({error})") from None
        if not isinstance(addresses, dict):
            raise ValueError(f"--shards must be a JSON object {{shard: [host:port, ...]}}; "
                             f"got {args.shards!r}")
    newest = max(found)
    name = args.model_name or _model_name(found[newest])
    ops = operate.Operations(args, name)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # The shard processes start before this process imports TensorFlow: both load at once.
    try:
        versions = rest.Versions([load_version(newest, found[newest], args, addresses, ops)])
    except BaseException:
        ops.close()
        raise
    stop, poller = threading.Event(), None
    try:  # (from here on, the loaded versions are closed -- their shards stopped -- at exit)
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        from aiohttp import web  # pylint: disable=import-outside-toplevel

        app = rest.make_app(name, versions=versions, unavailable=(tf.errors.UnavailableError,),
                            bad_request=(tf.errors.InvalidArgumentError,),
                            max_body_mb=max_body_mb, model_status=versions.newest_status)
        ops.serve_rest(app)
        ops.start_grpc(versions)
        # --shards names one version's shards: a newer version would need its own.
        if args.version_poll_seconds > 0 and addresses is None:
            poller = threading.Thread(
                target=poll_versions, name="poll-versions", daemon=True,
                args=(args.export_dir, versions,
                      lambda version, path: load_version(version, path, args, ops=ops),
                      args.version_poll_seconds, stop))
            poller.start()
        url = f"http://{args.host}:{args.port}/v1/models/{name}:predict"
        # run_app calls `print` once the port is bound: the ready line means requests work.
        # SIGTERM: it stops listening, answers the requests in flight (for at most
        # --drain-timeout seconds) and returns; `ops` drains the gRPC front alongside.
        web.run_app(app, host=args.host, port=args.port, handle_signals=True,
                    shutdown_timeout=args.drain_timeout,
                    print=lambda _message: print(f"{READY}: {url}", flush=True))
    finally:
        stop.set()
        if poller is not None:
            poller.join(60)   # a load in progress finishes (or fails) before shutting down
        ops.close()         # the gRPC front drained before the versions' shards go
        versions.close()
    return 0


def _model_name(path):
    """The default model name: a sharded export's recorded model name, else "model"."""
    manifest_path = os.path.join(path, "manifest.json")
    if os.path.isfile(manifest_path):
        with open(manifest_path, encoding="utf-8") as f:
            return json.load(f).get("model") or "model"
    return "model"
