"""Sparse shards over gRPC with TF Serving's API: a process serving one shard SavedModel as a
`tensorflow.serving.PredictionService`, and the main shard's client calling its replicas.

    python -m tfra_dynamic_embedding.inference.grpc_shards --saved-model EXPORT/shard_0 \\
        --address localhost:8500        # model name: the directory's name, "shard_0"

The server answers `PredictionService.Predict` (and `GetModelMetadata`, signature_def only) and
`ModelService.GetModelStatus` with the messages of the `tensorflow-serving-api` package: the
request's `model_spec.name` must be the shard's model name, `model_spec.signature_name` picks the
signature (empty: "serving_default"), inputs and outputs are TensorProtos. The SavedModel is
loaded with stock `tf.saved_model.load` (no op of this package), so a stock TF Serving serving
`shard_<i>` under the model name `shard_<i>` can take the place of any replica.

The client keeps one gRPC channel per replica (keepalive pings, reconnect backoff capped so that
a restarted replica is found within seconds) and gives every call a deadline of `timeout`
seconds. Calls go round-robin over the replicas; a call that fails with UNAVAILABLE or
DEADLINE_EXCEEDED is re-issued on the next replica not yet tried, and the failed replica is set
aside: requests skip it (unless every other one failed too) until a GetModelStatus probe finds it
answering; a probe goes out beside the first request `retry_after` seconds or more after the
failure (or after the last failed probe), so no request waits on it. A replica that refused the
connection may be back already while its channel still waits out its reconnect backoff: when
every replica failed, those that failed with UNAVAILABLE are tried once more, waiting for their
channel to reconnect (gRPC's wait_for_ready) for at most one backoff. When no replica answers,
`result()` raises `tf.errors.UnavailableError` naming the shard and its addresses -- after at
most `timeout` seconds plus one backoff per replica. `call` only issues the RPC, so calls to several shards are in
flight together; one client serves any number of threads. `check()` probes every replica at once
(the health monitor's round, inference/health.py); an `observer` sees each call's outcome and
latency (inference/metrics.py).

Example (a SavedModel served in this process, called through a client of its one replica):
    >>> import tempfile
    >>> import numpy as np, tensorflow as tf
    >>> module = tf.Module()
    >>> module.twice = tf.function(lambda ids: {"twice": 2 * ids},
    ...                            input_signature=[tf.TensorSpec([None], tf.int64)])
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = os.path.join(folder.name, "shard_0")
    >>> tf.saved_model.save(module, path, signatures={"serving_default": module.twice})
    >>> server = start_server(path, "localhost:0")          # port 0: any free port
    >>> server.model_name
    'shard_0'
    >>> client = ShardClient("shard_0", [f"localhost:{server.port}"], timeout=10)
    >>> pending = client.call("serving_default", {"ids": np.array([1, 5])})   # in flight
    >>> pending.result()
    {'twice': array([ 2, 10])}
    >>> client.close(); _ = server.stop(None).wait(); folder.cleanup()
"""

import argparse
import concurrent.futures
import os
import sys
import threading
import time

import grpc

from tfra_dynamic_embedding.inference import tensor_protos

READY = "tfra-de shard ready"
SERVING_SIGNATURE = "serving_default"
MODEL_VERSION = 1
# Codes that say "this replica did not answer", as opposed to an answer that is an error.
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_CODES = {code.value[0]: code for code in grpc.StatusCode}
# Shard requests and answers can exceed gRPC's default 4 MiB (a large request's partial pools):
# no size limit on either side, as TF Serving's own server.
_UNLIMITED = (("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1))
# The server lets clients ping idle connections every 10 s (gRPC's default answers pings more
# frequent than every 5 min without calls with GOAWAY); a busy port must fail the start, not be
# shared with another server (gRPC sets SO_REUSEPORT by default).
SERVER_OPTIONS = _UNLIMITED + (
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.so_reuseport", 0),
)


# -- the shard server ------------------------------------------------------------------------------

def servicer_bases():
    """The gRPC servicer classes of TF Serving's PredictionService and ModelService."""
    from tensorflow_serving.apis import model_service_pb2_grpc  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=import-outside-toplevel
    return (prediction_service_pb2_grpc.PredictionServiceServicer,
            model_service_pb2_grpc.ModelServiceServicer)


def make_servicer(saved_model_dir, model_name, version=MODEL_VERSION):
    """A servicer of PredictionService and ModelService for the SavedModel in `saved_model_dir`
    (loaded here with `tf.saved_model.load`), answering for `model_name` at `version`;
    `add_to_server` registers it (`start_server` does both: the module docstring's example)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=import-outside-toplevel
    if not model_name:
        raise ValueError(f"model_name must be a non-empty string; got {model_name!r}")
    loaded = tf.saved_model.load(saved_model_dir)
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    servicer = function_servicer(
        model_name, {name: (function, function.structured_input_signature[1])
                     for name, function in loaded.signatures.items()},
        saved.meta_graphs[0].signature_def, version)
    servicer.model = loaded   # it owns the tables the functions read
    return servicer


def function_servicer(model_name, signatures, signature_defs, version=MODEL_VERSION,
                      status=None):
    """A servicer of PredictionService and ModelService for any functions: `make_servicer`'s
    for a SavedModel, the main model's gRPC front (inference/grpc_front.py) for the sharded one.

    Args:
      signatures: {signature name: (function, {input: tf.TensorSpec})}; function(**inputs)
        returns {output: tensor or array}. It may raise tf.errors.OpError (answered with its
        code: TensorFlow's codes are gRPC's) or ValueError / KeyError / TypeError
        (INVALID_ARGUMENT).
      signature_defs: {name: SignatureDef} answered by GetModelMetadata.
      version: the version answered, or a function of no arguments returning it (the newest
        of a server whose versions change).
      status: () -> (state name, error code name, message) for GetModelStatus, e.g.
        ("AVAILABLE", "OK", ""); None: always available.

    Usage: `make_servicer` above (a SavedModel's signatures); `grpc_front.make_servicer` (the
    sharded model's predict, `{"serving_default": (lambda **inputs: predict(inputs), specs)}`).
    """
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.apis import get_model_metadata_pb2  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.apis import get_model_status_pb2  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.apis import predict_pb2  # pylint: disable=import-outside-toplevel
    if not model_name:
        raise ValueError(f"model_name must be a non-empty string; got {model_name!r}")

    served_version = version if callable(version) else (lambda: version)

    class Servicer(*servicer_bases()):
        """Predict / GetModelMetadata / GetModelStatus of a set of signatures."""

        def _check_model(self, spec, context):
            version = served_version()
            if spec.name != model_name:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              f"model_spec.name {spec.name!r} not served here; this server "
                              f"serves {model_name!r}")
            if spec.HasField("version") and spec.version.value != version:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              f"model_spec.version {spec.version.value} of {model_name!r} not "
                              f"served here; this server serves version {version}")
            if spec.version_label:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              f"model_spec.version_label {spec.version_label!r}: this server "
                              f"has no version labels")

        def Predict(self, request, context):  # pylint: disable=invalid-name
            self._check_model(request.model_spec, context)
            name = request.model_spec.signature_name or SERVING_SIGNATURE
            if name not in signatures:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"model_spec.signature_name {name!r} not found; {model_name!r} "
                              f"has {sorted(signatures)}")
            function, specs = signatures[name]
            inputs = {}
            for key, proto in request.inputs.items():
                if key not in specs:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"input {key!r} is not an input of signature {name!r}; it "
                                  f"takes {sorted(specs)}")
                spec = specs[key]
                if proto.dtype != spec.dtype.as_datatype_enum:
                    got = tf.dtypes.as_dtype(proto.dtype).name if proto.dtype else "invalid"
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"input {key!r} of signature {name!r} must be "
                                  f"{spec.dtype.name}; got {got}")
                try:
                    value = tensor_protos.to_array(proto)
                except (ValueError, TypeError) as error:   # e.g. content of the wrong length
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"input {key!r} of signature {name!r} is not a valid "
                                  f"TensorProto: {error}")
                if not spec.shape.is_compatible_with(value.shape):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"input {key!r} of signature {name!r} must have shape "
                                  f"{spec.shape}; got {list(value.shape)}")
                inputs[key] = value
            missing = sorted(set(specs) - set(inputs))
            if missing:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"signature {name!r} lacks inputs {missing}")
            try:
                outputs = function(**inputs)
            except tf.errors.OpError as error:
                context.abort(_CODES.get(error.error_code, grpc.StatusCode.UNKNOWN),
                              f"signature {name!r} of {model_name!r}: {error.message}")
            except (ValueError, KeyError, TypeError) as error:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"signature {name!r} of {model_name!r}: {error}")
            keys = list(request.output_filter) or sorted(outputs)
            unknown = sorted(set(keys) - set(outputs))
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"output_filter names {unknown}, not outputs of signature {name!r} "
                              f"(it has {sorted(outputs)})")
            response = predict_pb2.PredictResponse()
            _fill_spec(response.model_spec, model_name, served_version(), name)
            for key in keys:
                tensor_protos.fill(response.outputs[key], np.asarray(outputs[key]))
            return response

        def GetModelMetadata(self, request, context):  # pylint: disable=invalid-name
            self._check_model(request.model_spec, context)
            fields = list(request.metadata_field)
            if fields != ["signature_def"]:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"metadata_field must be ['signature_def'] (the only metadata "
                              f"served); got {fields}")
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            _fill_spec(response.model_spec, model_name, served_version(), "")
            defs = get_model_metadata_pb2.SignatureDefMap()
            for key, signature_def in signature_defs.items():
                defs.signature_def[key].CopyFrom(signature_def)
            response.metadata["signature_def"].Pack(defs)
            return response

        def GetModelStatus(self, request, context):  # pylint: disable=invalid-name
            self._check_model(request.model_spec, context)
            state, code, message = status() if status else ("AVAILABLE", "OK", "")
            response = get_model_status_pb2.GetModelStatusResponse()
            version_status = response.model_version_status.add()
            version_status.version = served_version()
            version_status.state = get_model_status_pb2.ModelVersionStatus.State.Value(state)
            version_status.status.error_code = grpc.StatusCode[code].value[0]
            version_status.status.error_message = message
            return response

    return Servicer()


def _fill_spec(spec, model_name, version, signature_name):
    spec.name = model_name
    spec.version.value = version
    if signature_name:
        spec.signature_name = signature_name


def add_to_server(servicer, server):
    """Registers a `make_servicer` result as PredictionService and ModelService on `server`."""
    from tensorflow_serving.apis import model_service_pb2_grpc  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=import-outside-toplevel
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(servicer, server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(servicer, server)


def start_server(saved_model_dir, address, model_name=None, threads=8, start=True):
    """A started gRPC server serving the SavedModel in `saved_model_dir` at `address`
    ("host:port"; port 0 picks a free one: `server.port`); the model name defaults to the
    directory's name (e.g. "shard_0"): `server.model_name`. `start=False`: bound, not yet
    answering (`server.start()` does)."""
    model_name = model_name or os.path.basename(os.path.normpath(saved_model_dir))
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer; got {threads!r}")
    servicer = make_servicer(saved_model_dir, model_name)
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(threads, "shard"),
                         options=SERVER_OPTIONS)
    add_to_server(servicer, server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as error:   # grpcio >= 1.50 raises; older versions return 0
        raise ValueError(f"address {address!r}: cannot listen there ({error})") from error
    if not port:
        raise ValueError(f"address {address!r}: cannot listen there")
    if start:
        server.start()
    server.port = port
    server.model_name = model_name
    server.servicer = servicer   # keeps the loaded SavedModel alive with the server
    return server


def serve(saved_model_dir, address, model_name=None, threads=8, parent_pid=None, watch=None,
          poll_seconds=1.0):
    """Serves until SIGTERM/SIGINT (or until process `parent_pid` is gone); with `watch`, a
    delta directory followed every `poll_seconds` (`live_deltas.follow_shard`), caught up with
    before the first request is answered."""
    from tfra_dynamic_embedding.distributed import server as server_lib  # pylint: disable=import-outside-toplevel
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    server_lib.exit_on_stop_signals(parent_pid)
    server = start_server(saved_model_dir, address, model_name, threads, start=not watch)
    if watch:
        from tfra_dynamic_embedding.inference import live_deltas  # pylint: disable=import-outside-toplevel
        server.follower = live_deltas.follow_shard(
            server.servicer.model, saved_model_dir, watch, poll_seconds,
            log=lambda line: print(line, flush=True))
        server.start()
    print(f"{READY}: {saved_model_dir} as model {server.model_name!r} at {address} "
          f"(PredictionService, ModelService)", flush=True)
    while True:
        time.sleep(0.2)  # short: the handler of a stop signal runs when this thread wakes


# -- the client ------------------------------------------------------------------------------------

def reconnect_backoff_ms(retry_after):
    """The longest wait between a replica channel's reconnect attempts."""
    return max(500, int(retry_after * 1000))


def channel_options(retry_after):
    """Options of a replica's channel: no message size limit; keepalive pings every 30 s (also
    idle: a replica whose host vanished without closing the connection is noticed between
    requests); reconnect attempts at most `retry_after` seconds apart (at least 0.5 s; gRPC's
    default backs off to 2 minutes, which would keep a restarted replica out that long)."""
    backoff_ms = reconnect_backoff_ms(retry_after)
    return _UNLIMITED + (
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", min(backoff_ms, 1000)),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
    )


class ShardClient:
    """Calls one shard's signatures on its replicas, round-robin (see the module docstring).

    Args:
      name: the shard's name, used in errors; also the model name sent, unless `model_name`.
      addresses: "host:port" of each replica.
      timeout: seconds one replica may take to answer a call (the call's gRPC deadline).
      retry_after: seconds after a failure before a replica set aside is probed again.
      model_name: `model_spec.name` of the requests (default: `name`).
      observer: optional; `observer.shard_call(name, code name, seconds)` is called once per
        call when it ends ("OK" or the code that failed it; seconds from issue to the last
        replica's answer) and `observer.replica_failed(name, address, code name)` per replica
        that did not answer (e.g. inference/metrics.py's `ServingMetrics`).

    Usage: the module docstring's example; `RemoteShardedModel` (serve.py) holds one per shard.
    """

    def __init__(self, name, addresses, timeout=5.0, retry_after=1.0, model_name=None,
                 observer=None):
        from tensorflow_serving.apis import model_service_pb2_grpc  # pylint: disable=import-outside-toplevel
        from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=import-outside-toplevel
        if isinstance(addresses, str) or not addresses or not all(
                isinstance(a, str) and a for a in addresses):
            raise ValueError(f"addresses of shard {name!r} must be a non-empty list of "
                             f"'host:port'; got {addresses!r}")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be > 0 seconds; got {timeout!r}")
        if not (isinstance(retry_after, (int, float)) and retry_after >= 0):
            raise ValueError(f"retry_after must be >= 0 seconds; got {retry_after!r}")
        self.name = name
        self.model_name = model_name or name
        self.addresses = list(addresses)
        self.timeout = float(timeout)
        self.retry_after = float(retry_after)
        self.observer = observer
        self.calls = [0] * len(self.addresses)   # answered calls per replica
        options = channel_options(self.retry_after)
        self._channels = [grpc.insecure_channel(a, options=options) for a in self.addresses]
        self._predict = [prediction_service_pb2_grpc.PredictionServiceStub(c).Predict
                         for c in self._channels]
        self._status = [model_service_pb2_grpc.ModelServiceStub(c).GetModelStatus
                        for c in self._channels]
        self._failed_at = [None] * len(self.addresses)   # None: in rotation
        self._probing = [False] * len(self.addresses)
        self._next = 0
        # Re-entrant: a probe's done-callback may run at once in the thread that added it.
        self._lock = threading.RLock()

    def call(self, signature, inputs):
        """Issues `signature` with `inputs` ({input name: array}) on the next replica in
        rotation and returns a `PendingCall`; its `result()` waits."""
        from tensorflow_serving.apis import predict_pb2  # pylint: disable=import-outside-toplevel
        request = predict_pb2.PredictRequest()
        request.model_spec.name = self.model_name
        request.model_spec.signature_name = signature
        for key, value in inputs.items():
            tensor_protos.fill(request.inputs[key], value)
        return PendingCall(self, request)

    def predict(self, signature, inputs):
        """{output name: np.ndarray} of `signature` on `inputs`: `call(...).result()`."""
        return self.call(signature, inputs).result()

    def close(self):
        """Closes the channels (a call in flight fails with CANCELLED)."""
        for channel in self._channels:
            channel.close()

    def check(self, timeout=1.0):
        """Sends GetModelStatus to every replica at once and waits for the answers: the gRPC
        code name of each ("OK" when it answered). An answer -- even an error: the replica is
        reachable -- puts a replica set aside back in rotation; UNAVAILABLE sets it aside (a
        health monitor's probe: inference/health.py)."""
        from tensorflow_serving.apis import get_model_status_pb2  # pylint: disable=import-outside-toplevel
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = self.model_name
        futures = [status.future(request, timeout=timeout) for status in self._status]
        codes = []
        for index, future in enumerate(futures):
            try:
                future.result()
                code = grpc.StatusCode.OK
            except grpc.RpcError as error:
                code = error.code()
            codes.append(code.name)
            with self._lock:
                if code not in RETRYABLE:
                    self._failed_at[index] = None
                elif code == grpc.StatusCode.UNAVAILABLE and self._failed_at[index] is None:
                    self._failed_at[index] = time.monotonic()
        return codes

    # -- replica bookkeeping (PendingCall's side) ---------------------------------------------
    def order(self, tried):
        """Replica indices to try, not in `tried`: round-robin over those in rotation, then the
        ones set aside (never skipped entirely: better a slow answer than none)."""
        with self._lock:
            n = len(self.addresses)
            if not tried:
                start, self._next = self._next, (self._next + 1) % n
            else:
                start = (tried[-1] + 1) % n
            now = time.monotonic()
            ring = [i for i in ((start + k) % n for k in range(n)) if i not in tried]
            for i in ring:
                if (self._failed_at[i] is not None and not self._probing[i]
                        and now - self._failed_at[i] >= self.retry_after):
                    self._probe(i)
            live = [i for i in ring if self._failed_at[i] is None]
            return live + [i for i in ring if self._failed_at[i] is not None]

    def issue(self, index, request, reconnect=False):
        """The gRPC future of `request` on replica `index`, with the client's deadline; with
        `reconnect`, the call waits for the channel to connect, for one reconnect backoff and
        a second at most (within the deadline)."""
        if not reconnect:
            return self._predict[index].future(request, timeout=self.timeout)
        wait = reconnect_backoff_ms(self.retry_after) / 1000 + 1.0
        return self._predict[index].future(request, timeout=min(self.timeout, wait),
                                           wait_for_ready=True)

    def answered(self, index):
        with self._lock:
            self.calls[index] += 1
            self._failed_at[index] = None

    def set_aside(self, index):
        with self._lock:
            self._failed_at[index] = time.monotonic()

    def _probe(self, index):
        """Sends GetModelStatus to replica `index` (lock held); its answer puts the replica back
        in rotation, a failure keeps it aside another `retry_after`."""
        from tensorflow_serving.apis import get_model_status_pb2  # pylint: disable=import-outside-toplevel
        self._probing[index] = True
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = self.model_name
        future = self._status[index].future(request, timeout=self.timeout)
        future.add_done_callback(lambda done: self._probed(index, done))

    def _probed(self, index, future):
        # Any answer, even an error (e.g. a server without ModelService), means the replica is
        # reachable: Predict on it tells the rest.
        with self._lock:
            self._probing[index] = False
            self._failed_at[index] = (time.monotonic() if future.code() in RETRYABLE
                                      else None)


class PendingCall:
    """An issued shard call; `result()` waits for it (see `ShardClient`)."""

    def __init__(self, shard, request):
        self._shard, self._request = shard, request
        self._tried, self._errors = [], []
        self._refused = []         # failed UNAVAILABLE: to try again, waiting to reconnect
        self._reconnected = set()  # tried so
        self._outputs = None
        self._began = time.monotonic()
        self._ended = None         # when the last issued replica call completed
        self._current = self._next()

    def _next(self):
        """(replica index, future) of the next replica to try, or None when all were tried."""
        for index in self._shard.order(self._tried):
            self._tried.append(index)
            return index, self._timed(self._shard.issue(index, self._request))
        if self._refused:
            index = self._refused.pop(0)
            self._reconnected.add(index)
            return index, self._timed(self._shard.issue(index, self._request, reconnect=True))
        return None

    def _timed(self, future):
        # The call's latency ends when its replica answers, not when `result()` is reached
        # (which waits on other shards' calls first).
        if self._shard.observer is not None:
            future.add_done_callback(lambda _done: setattr(self, "_ended", time.monotonic()))
        return future

    def _observe(self, code):
        if self._shard.observer is not None:
            self._shard.observer.shard_call(self._shard.name, code,
                                            (self._ended or time.monotonic()) - self._began)

    def result(self):
        """{output name: np.ndarray}; raises `tf.errors.UnavailableError` naming the shard and
        its addresses when no replica answered, or the shard's error as the matching
        `tf.errors.OpError` (InvalidArgumentError for a bad input)."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        shard = self._shard
        if self._outputs is not None:
            return self._outputs
        while self._current is not None:
            index, future = self._current
            try:
                response = future.result()
            except grpc.RpcError as error:
                code, details = error.code(), error.details()
                if code not in RETRYABLE:
                    self._observe(code.name)
                    raise _op_error(code, f"shard {shard.name!r} ({shard.addresses[index]}) "
                                          f"failed {self._request.model_spec.signature_name!r}: "
                                          f"{details}") from None
                shard.set_aside(index)
                if shard.observer is not None:
                    shard.observer.replica_failed(shard.name, shard.addresses[index], code.name)
                self._errors.append(f"{shard.addresses[index]}: {code.name} {details}")
                if code == grpc.StatusCode.UNAVAILABLE and index not in self._reconnected:
                    self._refused.append(index)
                self._current = self._next()
                continue
            shard.answered(index)
            self._observe("OK")
            self._current = None
            self._outputs = {key: tensor_protos.to_array(value)
                             for key, value in response.outputs.items()}
            return self._outputs
        self._observe("UNAVAILABLE")
        raise tf.errors.UnavailableError(
            None, None, f"shard {shard.name!r} did not answer "
            f"{self._request.model_spec.signature_name!r} on any replica "
            f"({', '.join(shard.addresses)}) within {shard.timeout:g} s each: "
            f"{'; '.join(self._errors) or 'no replica'}")


def _op_error(code, message):
    """The `tf.errors.OpError` subclass of gRPC status `code` (TensorFlow's error codes are
    gRPC's), so that callers tell a bad input (InvalidArgumentError) from the rest."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    types = {grpc.StatusCode.INVALID_ARGUMENT: tf.errors.InvalidArgumentError,
             grpc.StatusCode.NOT_FOUND: tf.errors.NotFoundError,
             grpc.StatusCode.FAILED_PRECONDITION: tf.errors.FailedPreconditionError,
             grpc.StatusCode.OUT_OF_RANGE: tf.errors.OutOfRangeError,
             grpc.StatusCode.RESOURCE_EXHAUSTED: tf.errors.ResourceExhaustedError,
             grpc.StatusCode.UNIMPLEMENTED: tf.errors.UnimplementedError,
             grpc.StatusCode.CANCELLED: tf.errors.CancelledError,
             grpc.StatusCode.INTERNAL: tf.errors.InternalError}
    return types.get(code, tf.errors.UnknownError)(None, None, message)


def main(argv=None):
    """`python -m tfra_dynamic_embedding.inference.grpc_shards --saved-model DIR --address
    HOST:PORT [--model-name NAME]`."""
    parser = argparse.ArgumentParser(
        prog="python -m tfra_dynamic_embedding.inference.grpc_shards",
        description="Serve a shard SavedModel as TF Serving's gRPC PredictionService.")
    parser.add_argument("--saved-model", required=True, metavar="DIR")
    parser.add_argument("--address", required=True, metavar="HOST:PORT")
    parser.add_argument("--model-name", default=None,
                        help="model_spec.name answered (default: the directory's name)")
    parser.add_argument("--threads", type=int, default=8, help="requests served at once")
    parser.add_argument("--parent-pid", type=int, metavar="PID",
                        help="exit when process PID is gone")
    parser.add_argument("--watch", metavar="DIR", default=None,
                        help="apply the delta exports of online training in DIR in place "
                             "(inference/live_deltas.py; the shard's export needs its "
                             "manifest.json in the parent directory)")
    parser.add_argument("--poll-seconds", type=float, default=1.0,
                        help="how often --watch looks for new exports (default 1)")
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.saved_model, "saved_model.pb")):
        print(f"error: --saved-model {args.saved_model!r} is not a SavedModel directory "
              f"(no saved_model.pb)", file=sys.stderr)
        return 2
    serve(args.saved_model, args.address, args.model_name, args.threads, args.parent_pid,
          args.watch, args.poll_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
