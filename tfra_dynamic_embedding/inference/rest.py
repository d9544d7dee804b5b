"""TensorFlow Serving's REST API (aiohttp) in front of predict functions, checked strictly.

    POST /v1/models/<name>[/versions/<n>]:predict   {"instances": [{input: value, ...}, ...]}
                                                    or {"inputs": {input: [values]}};
                                                    optional "signature_name"
    POST /v1/models/<name>[/versions/<n>]:classify  / :regress (400 unless the signature's
                                                    method is classify / regress)
    GET  /v1/models/<name>[/versions/<n>]           version status, as TF Serving answers it
    GET  /v1/models/<name>[/versions/<n>]/metadata  the SignatureDefMap, as TF Serving prints it

Without a version the newest loaded one answers. Every request is checked against its
signature by `request_checks` before the predictor runs (a bad dtype, range, shape or name is a
400 naming the input: nothing is cast). Row requests are answered `{"predictions": [...]}`,
columnar ones `{"outputs": ...}`; with one output its values stand alone, with several they are
keyed by name -- TF Serving's rules. Every error is JSON `{"error": message}`: 400 bad request,
404 unknown model / version / path, 405 wrong method, 413 body over `max_body_mb`, 503 when a
shard behind the predictor did not answer, 500 for any other failure of the predictor.

`aiohttp.web.run_app(make_app("dlrm", predict, signatures=...), port=8501)` serves one
predictor; `tfra-de serve` serves a model directory (versions, sharded exports, plain
SavedModels): docs/serving.md, "Serving in separate processes".

Example:
    >>> from tfra_dynamic_embedding.inference.request_checks import Signature, TensorSpec
    >>> predict = lambda inputs: {"prediction": inputs["x"] * 2}   # {input: array} -> {output}
    >>> signatures = {"serving_default": Signature({"x": TensorSpec("float32", (None,))},
    ...                                            {"prediction": TensorSpec("float32", (None,))})}
    >>> app = make_app("dlrm", predict, signatures=signatures)
    >>> sorted({route.resource.canonical for route in app.router.routes()})[:2]
    ['/v1/models/{name}', '/v1/models/{name}/metadata']
    >>> format_response(predict({"x": np.array([1.0, 2.5])}), row_format=True)
    {'predictions': [2.0, 5.0]}
"""

import asyncio
import base64
import concurrent.futures
import dataclasses
import json
import threading
from typing import Callable, Optional

import numpy as np
from aiohttp import web

from tfra_dynamic_embedding.inference import request_checks
from tfra_dynamic_embedding.inference.request_checks import BadRequest

DEFAULT_MAX_BODY_MB = 64   # TF Serving sets no small limit; aiohttp's own is 1 MiB
# Error types a predictor raises for a request it cannot answer (a 400), besides ValueError.
_BAD_REQUEST_ERRORS = (ValueError, KeyError, TypeError)
# TensorFlow's DataType enum names where they are not DT_ + the dtype's name.
_DT_NAMES = {"float32": "DT_FLOAT", "float64": "DT_DOUBLE", "float16": "DT_HALF"}
_METHODS = {"predict": request_checks.PREDICT_METHOD,
            "classify": request_checks.CLASSIFY_METHOD,
            "regress": request_checks.REGRESS_METHOD}


class Unavailable(Exception):
    """Raised by a predictor when what it depends on (a shard) did not answer: HTTP 503."""


@dataclasses.dataclass
class Servable:
    """One loaded version of a model.

    `signatures`: {name: request_checks.Signature}, or None for a bare function whose inputs
    nobody knows (requests are then passed on unchecked); `run(signature_name, inputs)` ->
    {output: array}; `close()` releases it (shard processes, channels) once it is retired;
    `status()` its health (e.g. of its shards; None: AVAILABLE while loaded); `signature_defs`
    what the gRPC front answers for it (None: not served over gRPC).
    """

    version: int
    signatures: Optional[dict]
    run: Callable
    close: Optional[Callable] = None
    status: Optional[Callable] = None          # () -> (state, error code, message): health
    signature_defs: Optional[dict] = None      # {name: SignatureDef}, for the gRPC front


class Versions:
    """The versions a server answers for: loaded ones (AVAILABLE) and retired or failed ones
    (END, with the load error if any). Thread-safe: a poller loads and retires while requests
    run. A request holds its version (`acquire` / `release`) while it runs, and `retire` closes
    a version only once the requests that hold it are done -- as TF Serving drains a version
    before unloading it -- so that a version switch under load fails no request.

    Example:
        >>> versions = Versions([Servable(1, None, lambda name, inputs: inputs)])
        >>> versions.add(Servable(2, None, lambda name, inputs: inputs))
        >>> versions.retire(1)
        >>> sorted(versions.loaded()), versions.status()[1]["state"]
        ([2], 'END')
    """

    def __init__(self, servables=()):
        self._lock = threading.Condition()
        self._loaded = {s.version: s for s in servables}
        self._ended = {}   # version: error message ("" when retired in favour of a newer one)
        self._holders = {}   # version: requests running on it

    def acquire(self, version=None):
        """The Servable of `version` (None: the newest), held until `release`; None if not
        loaded."""
        with self._lock:
            if version is None:
                version = max(self._loaded, default=None)
            servable = self._loaded.get(version)
            if servable is not None:
                self._holders[version] = self._holders.get(version, 0) + 1
            return servable

    def release(self, servable):
        with self._lock:
            self._holders[servable.version] -= 1
            self._lock.notify_all()

    def loaded(self):
        """{version: Servable} (a snapshot)."""
        with self._lock:
            return dict(self._loaded)

    def add(self, servable):
        with self._lock:
            self._loaded[servable.version] = servable
            self._ended.pop(servable.version, None)

    def retire(self, version, error="", drain_seconds=60.0):
        """Stops serving `version` and closes it once no request holds it (at most
        `drain_seconds` later), or records that it failed to load (`error`)."""
        with self._lock:
            servable = self._loaded.pop(version, None)
            self._ended[version] = error
            self._lock.wait_for(lambda: not self._holders.get(version), drain_seconds)
        if servable is not None and servable.close is not None:
            servable.close()

    def newest_status(self):
        """(state, error code, message) of the newest loaded version (its `status`, else
        AVAILABLE), as `make_app`'s `model_status` takes it."""
        loaded = self.loaded()
        newest = loaded.get(max(loaded, default=None))
        if newest is None:
            return "UNKNOWN", "UNAVAILABLE", "no version is loaded"
        return newest.status() if newest.status is not None else ("AVAILABLE", "OK", "")

    def failed(self, version):
        """Whether `version` failed to load (it is not tried again)."""
        with self._lock:
            return bool(self._ended.get(version))

    def status(self, version=None):
        """TF Serving's `model_version_status` list, newest first (one version if given)."""
        with self._lock:
            rows = [(v, "AVAILABLE", "") for v in self._loaded]
            rows += [(v, "END", e) for v, e in self._ended.items()]
        return [{"version": str(v), "state": state,
                 "status": {"error_code": "UNKNOWN" if error else "OK", "error_message": error}}
                for v, state, error in sorted(rows, reverse=True)
                if version is None or v == version]

    def close(self):
        for version in sorted(self.loaded()):
            self.retire(version)


VERSIONS = web.AppKey("versions", Versions)   # app[VERSIONS]: what a make_app app serves


def make_app(name, predict=None, max_workers=8, unavailable=(Unavailable,), bad_request=(),
             signatures=None, versions=None, max_body_mb=DEFAULT_MAX_BODY_MB,
             model_status=None):
    """An aiohttp Application serving model `name` (see the module docstring).

    Args:
      name: the model name in the URL.
      predict: {input name: np.ndarray} -> {output name: array}, served as version 1 with
        `signatures` (which checks every request; None: requests pass unchecked). Or give
        `versions` instead.
      versions: a `Versions` (several versions, or versions loaded while serving).
      max_workers: threads running predictors (requests are served concurrently).
      unavailable: exception types of a predictor answered with 503.
      bad_request: further exception types answered with 400 (besides ValueError, KeyError,
        TypeError).
      max_body_mb: the largest request body accepted (413 above it).
      model_status: () -> (state, error code, message) of the newest loaded version in
        `GET /v1/models/<name>` (e.g. its shards' health; default: AVAILABLE while loaded);
        any state but AVAILABLE is answered with 503 (readiness).
    """
    if (predict is None) == (versions is None):
        raise ValueError("make_app takes exactly one of predict and versions")
    if versions is None:
        versions = Versions([Servable(1, signatures, lambda _signature, inputs: predict(inputs))])
    pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="predict")
    unavailable, bad_request = tuple(unavailable), _BAD_REQUEST_ERRORS + tuple(bad_request)

    def servable_for(request, hold=False):
        """The Servable a request's URL names (held: `versions.release` it); raises a 404
        naming what is served."""
        model, version = request.match_info["name"], request.match_info.get("version")
        version = None if version is None else int(version)
        servable = None
        if model == name:
            servable = (versions.acquire(version) if hold else
                        versions.loaded().get(version if version is not None else
                                              max(versions.loaded(), default=None)))
        if servable is None:
            wanted = f"Latest({model})" if version is None else f"Specific({model}, {version})"
            served = (f"model '{name}' versions {sorted(versions.loaded())}" if model == name
                      else f"model '{name}'")
            raise _Error(404, f"Servable not found for request: {wanted} (this server serves "
                              f"{served})")
        return servable

    async def status(request):
        if request.match_info["name"] != name:
            servable_for(request)   # raises the 404
        version = request.match_info.get("version")
        rows = versions.status(None if version is None else int(version))
        if not rows:
            servable_for(request)
        newest = str(max(versions.loaded(), default=-1))
        ready = True
        if model_status is not None:
            for row in rows:
                if row["version"] == newest:
                    state, code, message = model_status()
                    row.update(state=state, status={"error_code": code, "error_message": message})
                    ready = state == "AVAILABLE"
        return web.json_response({"model_version_status": rows}, status=200 if ready else 503)

    async def metadata(request):
        servable = servable_for(request)
        return web.json_response(metadata_json(name, servable))

    async def run(request):
        method = request.match_info["method"]
        if method not in _METHODS:
            raise _Error(404, f"Malformed request: POST {request.path}: the methods are "
                              f"{sorted(_METHODS)}")
        servable = servable_for(request, hold=True)
        held = [servable]   # emptied once the predictor thread has taken the hold over
        try:
            return await answer(request, method, servable, held)
        finally:
            if held:
                versions.release(servable)

    def run_held(servable, signature_name, inputs):
        """servable.run in a predictor thread, releasing the hold when it is done: a request
        cancelled meanwhile (client gone) must not let its version close under the thread."""
        try:
            return servable.run(signature_name, inputs)
        finally:
            versions.release(servable)

    async def answer(request, method, servable, held):
        body = await _json_body(request)
        if servable.signatures is None:   # a bare function: nothing to check against
            if method != "predict":
                raise _Error(400, f"model '{name}' has no signatures: only :predict is served")
            signature_name = body.get("signature_name", "") if isinstance(body, dict) else ""
            inputs, row_format = parse_request(body)
        else:
            signature_name, signature = request_checks.signature_named(
                body, servable.signatures, name)
            if signature.method_name != _METHODS[method]:
                raise _Error(400, f"Expected {method} signature method_name to be "
                                  f"{_METHODS[method]}. Was: {signature.method_name} "
                                  f"(signature '{signature_name}' of model '{name}')")
            if method == "predict":
                checked = request_checks.check_predict(body, servable.signatures, name)
                inputs, row_format = checked.inputs, checked.row_format
            else:   # classify / regress: the signature's one input takes serialized tf.Examples
                inputs = {next(iter(signature.inputs)): request_checks.check_examples(
                    body, signature, method)}
                row_format = None
        loop = asyncio.get_running_loop()
        held.clear()
        try:
            outputs = await loop.run_in_executor(pool, run_held, servable, signature_name, inputs)
        except unavailable as error:
            raise _Error(503, str(error)) from None
        except bad_request as error:
            raise _Error(400, str(error)) from None
        if method != "predict":
            return web.json_response(format_results(outputs, method))
        return web.json_response(format_response(outputs, row_format))

    app = web.Application(client_max_size=int(max_body_mb * 2 ** 20),
                          middlewares=[_json_errors(max_body_mb)])
    version = r"{version:\d+}"
    model = "{name:[^/:]+}"
    for prefix in (f"/v1/models/{model}", f"/v1/models/{model}/versions/{version}"):
        app.router.add_get(prefix, status)
        app.router.add_get(prefix + "/metadata", metadata)
        app.router.add_post(prefix + ":{method}", run)
    app[VERSIONS] = versions

    async def close_pool(_app):
        pool.shutdown(wait=False)

    app.on_cleanup.append(close_pool)
    return app


def metadata_json(name, servable):
    """TF Serving's GetModelMetadata answer in JSON: the SignatureDefMap of `servable`, laid out
    as protobuf's JSON mapping of the protos prints it (int64 sizes as strings, defaults shown)."""
    def tensor(spec):
        shape = ({"dim": [], "unknown_rank": True} if spec.shape is None else
                 {"dim": [{"size": str(-1 if d is None else d), "name": ""} for d in spec.shape],
                  "unknown_rank": False})
        return {"dtype": _DT_NAMES.get(spec.dtype, "DT_" + spec.dtype.upper()),
                "tensor_shape": shape, "name": spec.name}

    defs = {key: {"inputs": {k: tensor(v) for k, v in signature.inputs.items()},
                  "outputs": {k: tensor(v) for k, v in signature.outputs.items()},
                  "method_name": signature.method_name, "defaults": {}}
            for key, signature in (servable.signatures or {}).items()}
    return {"model_spec": {"name": name, "signature_name": "", "version": str(servable.version)},
            "metadata": {"signature_def": {"signature_def": defs}}}


class _Error(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _json_errors(max_body_mb):
    """Middleware: every error as JSON {"error": ...} -- aiohttp's own pages are plain text."""

    @web.middleware
    async def middleware(request, handler):
        try:
            return await handler(request)
        except _Error as error:
            return _error(error.status, str(error))
        except BadRequest as error:
            return _error(400, str(error))
        except web.HTTPRequestEntityTooLarge as error:
            return _error(413, f"{error.text} (the server's --max-body-mb is {max_body_mb})")
        except web.HTTPException as error:
            if error.status < 400:
                raise
            message = {404: f"Malformed request: {request.method} {request.path}",
                       405: f"Method {request.method} not allowed on {request.path}"}.get(
                           error.status, error.text or error.reason)
            response = _error(error.status, message)
            if "Allow" in error.headers:
                response.headers["Allow"] = error.headers["Allow"]
            return response
        except Exception as error:  # pylint: disable=broad-except
            # A predictor's own failure: still JSON (aiohttp's 500 page is plain text).
            return _error(500, f"{type(error).__name__}: {error}")

    return middleware


async def _json_body(request):
    try:
        return json.loads(await request.text())
    except ValueError as error:   # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _Error(400, f"JSON Parse error: {error}") from None


def parse_request(body):
    """({input name: np.ndarray}, row_format) of a predict body, unchecked (dtypes as numpy
    infers them): for a predictor without signatures only."""
    if not isinstance(body, dict) or ("instances" in body) == ("inputs" in body):
        raise BadRequest("the body must be a JSON object with exactly one of 'instances' "
                         "(row format) or 'inputs' (columnar format)")
    if "instances" in body:
        instances = body["instances"]
        if not isinstance(instances, list) or not instances:
            raise BadRequest("'instances' must be a non-empty list")
        if all(isinstance(i, dict) for i in instances):
            names = set(instances[0])
            if any(set(i) != names for i in instances):
                raise BadRequest("every instance must name the same inputs")
            return {n: _array([_decode(i[n]) for i in instances]) for n in sorted(names)}, True
        if any(isinstance(i, dict) for i in instances):
            raise BadRequest("'instances' must be all objects or all values")
        return {"inputs": _array([_decode(i) for i in instances])}, True
    inputs = body["inputs"]
    if isinstance(inputs, dict):
        return {n: _array(_decode(v)) for n, v in inputs.items()}, False
    return {"inputs": _array(_decode(inputs))}, False


def format_response(outputs, row_format):
    """TF Serving's response body for `outputs` ({name: array})."""
    outputs = {k: np.asarray(v) for k, v in outputs.items()}
    lists = {k: _listed(v) for k, v in outputs.items()}
    if not row_format:
        return {"outputs": next(iter(lists.values())) if len(lists) == 1 else lists}
    if len(lists) == 1:
        return {"predictions": next(iter(lists.values()))}
    rows = {len(v) for v in lists.values()}
    if len(rows) != 1:
        raise ValueError(f"outputs differ in their first dimension: "
                         f"{ {k: len(v) for k, v in lists.items()} }")
    return {"predictions": [{k: v[i] for k, v in lists.items()} for i in range(rows.pop())]}


def format_results(outputs, method):
    """TF Serving's :classify / :regress answer: `{"results": ...}`, per example a list of
    [label, score] (classify: the signature's "classes" and "scores", a missing one as "" / 0)
    or one value (regress: the signature's "outputs")."""
    outputs = {k: np.asarray(v) for k, v in outputs.items()}
    if method == "regress":
        if "outputs" not in outputs:
            raise BadRequest(f"a regress signature returns 'outputs'; this one returns "
                             f"{sorted(outputs)}")
        return {"results": outputs["outputs"].reshape(len(outputs["outputs"]), -1)[:, 0].tolist()}
    if "classes" not in outputs and "scores" not in outputs:
        raise BadRequest(f"a classify signature returns 'classes' and/or 'scores'; this one "
                         f"returns {sorted(outputs)}")
    reference = outputs.get("scores", outputs.get("classes"))
    rows, per_row = reference.shape[0], int(np.prod(reference.shape[1:], dtype=np.int64))
    classes = (np.asarray(_listed(outputs["classes"].reshape(rows, per_row)), dtype=object)
               if "classes" in outputs else np.full((rows, per_row), "", dtype=object))
    scores = (outputs["scores"].reshape(rows, per_row).tolist() if "scores" in outputs
              else [[0.0] * per_row] * rows)
    return {"results": [[[classes[r][c], scores[r][c]] for c in range(per_row)]
                        for r in range(rows)]}


def _decode(value):
    """`{"b64": ...}` -> bytes, recursively through lists."""
    if isinstance(value, dict):
        if set(value) != {"b64"}:
            raise BadRequest(f"an object value must be {{'b64': ...}}; got keys {sorted(value)}")
        return base64.b64decode(value["b64"])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _array(values):
    array = np.asarray(values)
    if array.dtype == object:
        raise BadRequest("inputs must be rectangular lists of numbers or strings")
    return array


def _listed(array):
    if array.dtype in (np.float16, np.float32):
        # As TF Serving writes them: the shortest decimal that reads back as the same float32
        # (0.8, not float64's 0.800000011920929).
        return array.astype(str).astype(np.float64).tolist()
    if array.dtype.kind == "S":
        return np.char.decode(array, "utf-8", errors="replace").tolist()
    if array.dtype == object:   # strings fed as they came (bytes objects)
        return np.vectorize(lambda b: b.decode("utf-8", errors="replace") if isinstance(
            b, bytes) else b, otypes=[object])(array).tolist() if array.size else array.tolist()
    return array.tolist()


def _error(status, message):
    return web.json_response({"error": message}, status=status)
