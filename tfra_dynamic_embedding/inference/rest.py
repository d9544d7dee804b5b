"""TensorFlow Serving's REST predict API (aiohttp) in front of any predict function.

    POST /v1/models/<name>:predict   {"instances": [{input: value, ...}, ...]}   (row format)
                                     {"inputs": {input: [values per example]}}  (columnar format)
    GET  /v1/models/<name>           the model's status, as TF Serving answers it

Row requests are answered `{"predictions": [...]}`, columnar ones `{"outputs": ...}`; with one
output its values stand alone, with several they are keyed by name -- TF Serving's rules. String
values may be sent as `{"b64": "..."}`. Errors come back as `{"error": message}`: 400 for a bad
request, 404 for another model name, 503 when a shard behind the predictor did not answer.

`aiohttp.web.run_app(make_app("dlrm", predict), port=8501)` serves it; `tfra-de serve` does
so for a sharded export: docs/serving.md, "Serving in separate processes".

Example:
    >>> predict = lambda inputs: {"prediction": inputs["x"] * 2}   # {input: array} -> {output}
    >>> app = make_app("dlrm", predict)
    >>> sorted({route.resource.canonical for route in app.router.routes()})
    ['/v1/models/{name}', '/v1/models/{name}:predict']
    >>> inputs, row_format = parse_request({"instances": [{"x": 1.0}, {"x": 2.5}]})
    >>> format_response(predict(inputs), row_format)
    {'predictions': [2.0, 5.0]}
    >>> format_response(predict(parse_request({"inputs": {"x": [1, 2]}})[0]), False)
    {'outputs': [2, 4]}
"""

import asyncio
import base64
import concurrent.futures
import json

import numpy as np
from aiohttp import web

# Error types a predictor raises for a request it cannot answer (a 400), besides ValueError.
_BAD_REQUEST_ERRORS = (ValueError, KeyError, TypeError)


class Unavailable(Exception):
    """Raised by a predictor when what it depends on (a shard) did not answer: HTTP 503."""


def make_app(name, predict, max_workers=8, unavailable=(Unavailable,), bad_request=(),
             model_status=None):
    """An aiohttp Application serving `predict` as model `name` (see the module docstring).

    Args:
      name: the model name in the URL.
      predict: {input name: np.ndarray} -> {output name: array}; runs in a thread pool of
        `max_workers` (so that requests are served concurrently).
      unavailable: exception types of `predict` answered with 503.
      bad_request: further exception types answered with 400 (besides ValueError, KeyError,
        TypeError).
      model_status: () -> (state, error code, message) of `GET /v1/models/<name>` (default
        always ("AVAILABLE", "OK", "")); any other state is answered with 503 (readiness).
    """
    pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="predict")
    unavailable, bad_request = tuple(unavailable), _BAD_REQUEST_ERRORS + tuple(bad_request)

    async def status(request):
        if request.match_info["name"] != name:
            return _error(404, f"no model {request.match_info['name']!r}; this server has "
                               f"{name!r}")
        state, code, message = model_status() if model_status else ("AVAILABLE", "OK", "")
        return web.json_response({"model_version_status": [{
            "version": "1", "state": state,
            "status": {"error_code": code, "error_message": message}}]},
            status=200 if state == "AVAILABLE" else 503)

    async def predict_handler(request):
        if request.match_info["name"] != name:
            return _error(404, f"no model {request.match_info['name']!r}; this server has "
                               f"{name!r}")
        try:
            body = json.loads(await request.text())
            inputs, row_format = parse_request(body)
        except (ValueError, TypeError) as error:   # json.JSONDecodeError is a ValueError
            return _error(400, f"bad request body: {error}")
        loop = asyncio.get_running_loop()
        try:
            outputs = await loop.run_in_executor(pool, predict, inputs)
        except unavailable as error:
            return _error(503, str(error))
        except bad_request as error:
            return _error(400, str(error))
        return web.json_response(format_response(outputs, row_format))

    app = web.Application()
    app.router.add_get("/v1/models/{name}", status)
    app.router.add_post("/v1/models/{name}:predict", predict_handler)

    async def close_pool(_app):
        pool.shutdown(wait=False)

    app.on_cleanup.append(close_pool)
    return app


def parse_request(body):
    """({input name: np.ndarray}, row_format) of a TF Serving predict body."""
    if not isinstance(body, dict) or ("instances" in body) == ("inputs" in body):
        raise ValueError("the body must be a JSON object with exactly one of 'instances' "
                         "(row format) or 'inputs' (columnar format)")
    if "instances" in body:
        instances = body["instances"]
        if not isinstance(instances, list) or not instances:
            raise ValueError("'instances' must be a non-empty list")
        if all(isinstance(i, dict) for i in instances):
            names = set(instances[0])
            if any(set(i) != names for i in instances):
                raise ValueError("every instance must name the same inputs")
            return {n: _array([_decode(i[n]) for i in instances]) for n in sorted(names)}, True
        if any(isinstance(i, dict) for i in instances):
            raise ValueError("'instances' must be all objects or all values")
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


def _decode(value):
    """`{"b64": ...}` -> bytes, recursively through lists."""
    if isinstance(value, dict):
        if set(value) != {"b64"}:
            raise ValueError(f"an object value must be {{'b64': ...}}; got keys {sorted(value)}")
        return base64.b64decode(value["b64"])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _array(values):
    array = np.asarray(values)
    if array.dtype == object:
        raise ValueError("inputs must be rectangular lists of numbers or strings")
    return array


def _listed(array):
    if array.dtype.kind == "S":
        return np.char.decode(array, "utf-8", errors="replace").tolist()
    return array.tolist()


def _error(status, message):
    return web.json_response({"error": message}, status=status)
