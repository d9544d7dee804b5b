"""TF Serving's gRPC API for the main model of `tfra-de serve` (`--grpc-port`): the model's own
inputs in, its outputs out, the shards called behind it -- so a stock TF Serving client works
unchanged against the sharded model.

    PredictionService.Predict           signature "serving_default" (or empty), the model's
                                        request inputs as TensorProtos (checked: name, dtype,
                                        shape), its outputs back
    PredictionService.GetModelMetadata  signature_def: the request inputs and main's outputs
    ModelService.GetModelStatus         AVAILABLE, or not while a shard has no live replica

Errors are gRPC codes: INVALID_ARGUMENT for a bad input, UNAVAILABLE when a shard did not
answer, NOT_FOUND for another model name (or version). The servicer is
`grpc_shards.function_servicer` -- the shard servers' own -- over the newest loaded version
(`rest.Versions`): a newer version directory is answered over gRPC as over REST. A plain
SavedModel version is answered with its own signatures.

A stock TF Serving client against `tfra-de serve EXPORT --grpc-port 8500 --model-name dlrm`
(docs/serving.md, "Operating it"; tests/inference/test_serve_ops.py):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "dlrm"
    request.inputs["user"].CopyFrom(tf.make_tensor_proto(np.array([7, 14])))   # every input
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(
        "localhost:8500"))
    outputs = {k: tf.make_ndarray(v) for k, v in stub.Predict(request, timeout=5).outputs.items()}
"""

import collections.abc
import concurrent.futures
import os
import time

import grpc

from tfra_dynamic_embedding.inference import grpc_shards


def signature_def(export_dir, manifest):
    """The SignatureDef the front answers: main's `serving_default` (its outputs, method) with
    the request's inputs (`manifest.request_inputs`) in place of main's."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.inference import manifest as manifest_lib  # pylint: disable=import-outside-toplevel
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, manifest_lib.MAIN_DIR, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    main = saved.meta_graphs[0].signature_def[manifest_lib.SERVING_SIGNATURE]
    out = type(main)()
    out.CopyFrom(main)
    out.ClearField("inputs")
    for name, spec in input_specs(manifest).items():
        out.inputs[name].name = f"{name}:0"
        out.inputs[name].dtype = spec.dtype.as_datatype_enum
        out.inputs[name].tensor_shape.CopyFrom(tf.TensorShape(spec.shape).as_proto())
    return out


def input_specs(manifest):
    """{request input: tf.TensorSpec} of the model's requests."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if not manifest.request_inputs:
        raise ValueError("the export's manifest has no request_inputs (exported before the gRPC "
                         "front existed): export it again")
    return {name: tf.TensorSpec(spec["shape"], spec["dtype"], name=name)
            for name, spec in manifest.request_inputs.items()}


def saved_model_signature_defs(saved_model_dir):
    """{name: SignatureDef} of a plain SavedModel, its init op left out."""
    from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=import-outside-toplevel
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    return {name: definition for name, definition in saved.meta_graphs[0].signature_def.items()
            if not name.startswith("__")}


class _Newest(collections.abc.Mapping):
    """The newest loaded version's signatures, read at each use: {name: SignatureDef}, or with
    `callable_=True` {name: (function, {input: tf.TensorSpec})} as `function_servicer` takes
    them, the function running that version (held while it runs, as REST requests are)."""

    def __init__(self, versions, callable_=False):
        self._versions, self._callable = versions, callable_

    def _defs(self):
        loaded = self._versions.loaded()
        newest = loaded.get(max(loaded, default=None))
        return (newest.signature_defs or {}) if newest is not None else {}

    def __getitem__(self, name):
        definition = self._defs()[name]
        if not self._callable:
            return definition
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        specs = {key: tf.TensorSpec(tf.TensorShape(info.tensor_shape), tf.as_dtype(info.dtype),
                                    name=key)
                 for key, info in definition.inputs.items()}
        return (lambda **inputs: self._run(name, inputs)), specs

    def _run(self, name, inputs):
        servable = self._versions.acquire()
        if servable is None:
            raise ValueError("no version of the model is loaded")
        try:
            return servable.run(name, inputs)
        finally:
            self._versions.release(servable)

    def __iter__(self):
        return iter(self._defs())

    def __len__(self):
        return len(self._defs())


def make_servicer(versions, model_name, status=None, metrics=None, access_log=None):
    """The servicer of the newest version of `versions` (a `rest.Versions` whose Servables
    carry `signature_defs`) as `model_name`: requests checked against that version's
    signatures, run by it, answered with its number; `status` as `function_servicer` takes it;
    requests counted in `metrics` (ServingMetrics) and written to `access_log` (AccessLog)
    when given."""
    inner = grpc_shards.function_servicer(
        model_name, _Newest(versions, callable_=True), _Newest(versions),
        version=lambda: max(versions.loaded(), default=0), status=status)
    if metrics is None and access_log is None:
        return inner
    return _observed(inner, model_name, metrics, access_log)


def _observed(inner, model_name, metrics, access_log):
    """`inner` with every call counted and logged (the code read back from the context, which
    `context.abort` sets before raising)."""

    def observe(method, rows_of):
        call = getattr(inner, method)

        def observed(request, context):
            began, rows, code = time.monotonic(), 0, grpc.StatusCode.UNKNOWN
            try:
                response = call(request, context)
                code, rows = grpc.StatusCode.OK, rows_of(response)
                return response
            except Exception:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            finally:
                seconds = time.monotonic() - began
                if metrics is not None:
                    metrics.request(model_name, f"grpc:{method}", code.name, seconds)
                if access_log is not None:
                    access_log.write("grpc", f"{method} {model_name}", code.name, seconds, rows,
                                     context.peer())
        return observed

    class Observed(*grpc_shards.servicer_bases()):
        """The inner servicer's methods, observed."""
        Predict = staticmethod(observe("Predict", _rows))
        GetModelMetadata = staticmethod(observe("GetModelMetadata", lambda _: 0))
        GetModelStatus = staticmethod(observe("GetModelStatus", lambda _: 0))

    return Observed()


def _rows(response):
    for proto in response.outputs.values():
        return proto.tensor_shape.dim[0].size if proto.tensor_shape.dim else 1
    return 0


def start(servicer, address, threads=8):
    """A started gRPC server with `servicer` on `address` ("host:port"; port 0: any, see
    `server.port`)."""
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(threads, "grpc-front"),
                         options=grpc_shards.SERVER_OPTIONS)
    grpc_shards.add_to_server(servicer, server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as error:
        raise ValueError(f"--grpc-port: cannot listen at {address!r} ({error})") from error
    if not port:
        raise ValueError(f"--grpc-port: cannot listen at {address!r}")
    server.start()
    server.port = port
    return server
