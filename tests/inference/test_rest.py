"""TF Serving's REST API (inference/rest.py, inference/request_checks.py) over a real aiohttp
server on loopback, in front of numpy predictors with signatures: good requests answered as the
predictor computes them, a table of bad requests refused with TF Serving's status codes and
messages (JSON) before the predictor runs, metadata, versions."""

import asyncio
import base64
import threading

import numpy as np
import pytest
import requests
import tensorflow as tf
from aiohttp import web

from tfra_dynamic_embedding.distributed.cluster import free_port
from tfra_dynamic_embedding.inference import request_checks, rest
from tfra_dynamic_embedding.inference.request_checks import Signature, TensorSpec

CALLS = []   # every predictor call: (version, signature name); bad requests must add none


def dlrm(inputs, version=1, signature="serving_default"):
    CALLS.append((version, signature))
    if signature in ("labels", "price"):   # serialized tf.Examples with a float feature "age"
        examples = [tf.train.Example.FromString(e) for e in inputs["inputs"]]
        ages = np.array([e.features.feature["age"].float_list.value[0] for e in examples])
        if signature == "price":
            return {"outputs": (ages * version)[:, None]}
        return {"classes": np.array([[b"young", b"old"]] * len(ages), dtype=object),
                "scores": np.stack([1 - ages / 100, ages / 100], axis=1)}
    if inputs["name"].size and inputs["name"][0] == b"fail":
        raise rest.Unavailable("shard 'shard_1' did not answer")
    if inputs["name"].size and inputs["name"][0] == b"crash":
        raise RuntimeError("the predictor broke")
    score = inputs["dense"].sum(axis=1) + inputs["ids"].sum(axis=1) * version
    return {"score": score, "tag": np.array([n + b"!" for n in inputs["name"]], dtype=object)}


def _signatures():
    inputs = {"dense": TensorSpec("float32", (None, 2), "serving_default_dense:0"),
              "ids": TensorSpec("int64", (None, 3), "serving_default_ids:0"),
              "name": TensorSpec("string", (None,), "serving_default_name:0")}
    outputs = {"score": TensorSpec("float32", (None,), "StatefulPartitionedCall:0"),
               "tag": TensorSpec("string", (None,), "StatefulPartitionedCall:1")}
    return {"serving_default": Signature(inputs, outputs),
            "other": Signature(dict(inputs), dict(outputs)),
            "labels": Signature({"inputs": TensorSpec("string", (None,), "input:0")},
                                {"classes": TensorSpec("string", (None, 2), "classes:0"),
                                 "scores": TensorSpec("float32", (None, 2), "scores:0")},
                                "tensorflow/serving/classify"),
            "price": Signature({"inputs": TensorSpec("string", (None,), "input:0")},
                               {"outputs": TensorSpec("float32", (None, 1), "outputs:0")},
                               "tensorflow/serving/regress")}


def _servable(version):
    return rest.Servable(version, _signatures(),
                         lambda signature, inputs: dlrm(inputs, version, signature))


@pytest.fixture(scope="module")
def urls():
    """Apps on loopback ports, served by a thread with its own event loop: "dlrm" (versions 1
    and 2, strict), "small" (a 10 KiB body limit), "bare" (a function without signatures)."""
    loop, started, runners, ports = asyncio.new_event_loop(), threading.Event(), [], {}
    apps = {"dlrm": lambda: rest.make_app("dlrm", versions=rest.Versions(
                [_servable(1), _servable(2)])),
            "small": lambda: rest.make_app("dlrm", dlrm, signatures=_signatures(),
                                           max_body_mb=0.01),
            "bare": lambda: rest.make_app(
                "double", lambda inputs: {"y": np.asarray(inputs["inputs"], np.float64) * 2})}

    def run():
        asyncio.set_event_loop(loop)
        for key, make in apps.items():
            runner = web.AppRunner(make())
            loop.run_until_complete(runner.setup())
            ports[key] = free_port()
            loop.run_until_complete(web.TCPSite(runner, "localhost", ports[key]).start())
            runners.append(runner)
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(30)
    yield {key: f"http://localhost:{port}" for key, port in ports.items()}
    for runner in runners:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)


def _row(dense=(1, 2), ids=(1, 2, 3), name="a", **extra):
    as_list = lambda v: list(v) if isinstance(v, (list, tuple)) else v  # noqa: E731
    return {"dense": as_list(dense), "ids": as_list(ids), "name": name, **extra}


def test_row_format_with_several_outputs(urls):
    body = {"instances": [_row(), _row((3, 4.5), (0, 0, 7),
                                       {"b64": base64.b64encode(b"b").decode()})]}
    reply = requests.post(f"{urls['dlrm']}/v1/models/dlrm:predict", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    # The newest version (2) answers: ids count twice.
    assert reply.json() == {"predictions": [{"score": 15.0, "tag": "a!"},
                                            {"score": 21.5, "tag": "b!"}]}


def test_columnar_format_signature_name_and_versions(urls):
    body = {"inputs": {"dense": [[1, 1]], "ids": [[1, 1, 1]], "name": ["x"]},
            "signature_name": "other"}
    CALLS.clear()
    reply = requests.post(f"{urls['dlrm']}/v1/models/dlrm/versions/1:predict", json=body,
                          timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"outputs": {"score": [5.0], "tag": ["x!"]}}
    assert CALLS == [(1, "other")]
    reply = requests.post(f"{urls['dlrm']}/v1/models/dlrm/versions/2:predict", json=body,
                          timeout=30)
    assert reply.json() == {"outputs": {"score": [8.0], "tag": ["x!"]}}


def test_a_function_without_signatures_is_served_unchecked(urls):
    reply = requests.post(f"{urls['bare']}/v1/models/double:predict",
                          json={"inputs": [[1, 2], [3, 4]]}, timeout=30)
    assert reply.json() == {"outputs": [[2, 4], [6, 8]]}
    reply = requests.post(f"{urls['bare']}/v1/models/double:predict",
                          json={"instances": [1, 2.5]}, timeout=30)
    assert reply.json() == {"predictions": [2, 5]}


def test_classify_and_regress_where_the_signature_fits(urls):
    body = {"examples": [{"age": 20.0}, {"age": 60.5, "name": "x"}], "context": {"k": [1, 2]},
            "signature_name": "labels"}
    reply = requests.post(f"{urls['dlrm']}/v1/models/dlrm:classify", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"results": [[["young", 0.8], ["old", 0.2]],
                                        [["young", 0.395], ["old", 0.605]]]}
    body["signature_name"] = "price"
    reply = requests.post(f"{urls['dlrm']}/v1/models/dlrm/versions/2:regress", json=body,
                          timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"results": [40.0, 121.0]}


def test_status_lists_the_versions(urls):
    reply = requests.get(f"{urls['dlrm']}/v1/models/dlrm", timeout=30)
    assert reply.json() == {"model_version_status": [
        {"version": v, "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        for v in ("2", "1")]}
    reply = requests.get(f"{urls['dlrm']}/v1/models/dlrm/versions/1", timeout=30)
    assert [s["version"] for s in reply.json()["model_version_status"]] == ["1"]
    for path, message in (("dlrm/versions/7", "Specific(dlrm, 7)"), ("other", "Latest(other)"),
                          ("other/metadata", "Latest(other)"),
                          ("dlrm/versions/7/metadata", "Specific(dlrm, 7)")):
        reply = requests.get(f"{urls['dlrm']}/v1/models/{path}", timeout=30)
        assert reply.status_code == 404, reply.text
        assert f"Servable not found for request: {message}" in reply.json()["error"]


def test_metadata_is_tf_servings_signature_def_map(urls):
    reply = requests.get(f"{urls['dlrm']}/v1/models/dlrm/versions/1/metadata", timeout=30)
    assert reply.status_code == 200, reply.text
    meta = reply.json()
    assert meta["model_spec"] == {"name": "dlrm", "signature_name": "", "version": "1"}
    defs = meta["metadata"]["signature_def"]["signature_def"]
    assert sorted(defs) == ["labels", "other", "price", "serving_default"]
    assert defs["serving_default"]["method_name"] == "tensorflow/serving/predict"
    assert defs["labels"]["method_name"] == "tensorflow/serving/classify"
    assert defs["serving_default"]["inputs"]["ids"] == {
        "dtype": "DT_INT64", "name": "serving_default_ids:0", "tensor_shape": {
            "dim": [{"size": "-1", "name": ""}, {"size": "3", "name": ""}],
            "unknown_rank": False}}
    assert defs["serving_default"]["outputs"]["tag"]["dtype"] == "DT_STRING"
    assert defs["serving_default"]["inputs"]["dense"]["dtype"] == "DT_FLOAT"
    latest = requests.get(f"{urls['dlrm']}/v1/models/dlrm/metadata", timeout=30).json()
    assert latest["model_spec"]["version"] == "2"


B64_B = base64.b64encode(b"b").decode()
PREDICT = "v1/models/dlrm:predict"
BAD = [
    # (name, path, body (a str is sent as it is), status, text the error must contain)
    ("float for int64", PREDICT, {"instances": [_row(ids=(1.5, 2, 3))]}, 400,
     "input 'ids': JSON Value: 1.5 Type: Number is not of expected type: int64"),
    ("integral float for int64", PREDICT, {"instances": [_row(ids=(1.0, 2, 3))]}, 400,
     "JSON Value: 1.0 Type: Number is not of expected type: int64"),
    ("bool for int64", PREDICT, {"instances": [_row(ids=(True, 2, 3))]}, 400,
     "input 'ids': JSON Value: true Type: True is not of expected type: int64"),
    ("string for int64", PREDICT, {"instances": [_row(ids=("1", 2, 3))]}, 400,
     "JSON Value: \"1\" Type: String is not of expected type: int64"),
    ("null for int64", PREDICT, {"instances": [_row(ids=(None, 2, 3))]}, 400,
     "JSON Value: null Type: Null is not of expected type: int64"),
    ("2^63 for int64", PREDICT, {"instances": [_row(ids=(2 ** 63, 2, 3))]}, 400,
     "JSON Value: 9223372036854775808 Type: Number is not of expected type: int64 (out of its "
     "range [-9223372036854775808, 9223372036854775807])"),
    ("1e30 for int64", PREDICT, {"instances": [_row(ids=(1e30, 2, 3))]}, 400,
     "JSON Value: 1e+30 Type: Number is not of expected type: int64"),
    ("string for float32", PREDICT, {"instances": [_row(dense=("1", 2))]}, 400,
     "input 'dense': JSON Value: \"1\" Type: String is not of expected type: float32"),
    ("bool for float32", PREDICT, {"instances": [_row(dense=(False, 2))]}, 400,
     "JSON Value: false Type: False is not of expected type: float32"),
    ("1e300 for float32", PREDICT, {"instances": [_row(dense=(1e300, 2))]}, 400,
     "input 'dense': Cannot convert JSON value: 1e+300 to float without loss of precision."),
    ("2^24+1 for float32", PREDICT, {"instances": [_row(dense=(2 ** 24 + 1, 2))]}, 400,
     "Cannot convert JSON value: 16777217 to float without loss of precision."),
    ("number for string", PREDICT, {"instances": [_row(name=5)]}, 400,
     "input 'name': JSON Value: 5 Type: Number is not of expected type: string"),
    ("bad base64", PREDICT, {"instances": [_row(name={"b64": "%%%"})]}, 400,
     "input 'name': Unable to base64 decode \"%%%\""),
    ("b64 object of a number", PREDICT, {"instances": [_row(name={"b64": 1})]}, 400,
     "input 'name': JSON Value: {\"b64\": 1} not formatted correctly for base64 data"),
    ("b64 for int64", PREDICT, {"instances": [_row(ids=({"b64": B64_B}, 2, 3))]}, 400,
     "Type: Object is not of expected type: int64"),
    ("unknown input", PREDICT, {"instances": [_row(extra=1)]}, 400,
     "item 0 of 'instances': input tensor alias not found in signature: extra. Inputs expected "
     "to be in the set {dense,ids,name}."),
    ("unknown input, columnar", PREDICT,
     {"inputs": {"dense": [[1, 2]], "ids": [[1, 2, 3]], "name": ["a"], "nope": [1]}}, 400,
     "input tensor alias not found in signature: nope. Inputs expected to be in the set "
     "{dense,ids,name}."),
    ("missing input", PREDICT, {"instances": [{"dense": [1, 2], "ids": [1, 2, 3]}]}, 400,
     "Request inputs do not match required inputs for model `dlrm`. Send extra: {}. Missing "
     "but required: {name}."),
    ("missing input in one instance", PREDICT,
     {"instances": [_row(), {"dense": [1, 2], "name": "a"}]}, 400,
     "item 1 of 'instances': Request inputs do not match required inputs for model `dlrm`. "
     "Send extra: {}. Missing but required: {ids}."),
    ("2 columns where 3", PREDICT, {"instances": [_row(ids=(1, 2))]}, 400,
     "input 'ids': got shape [1,2] (the batch of 'instances', then the instance's value); the "
     "signature expects int64 of shape [-1,3]"),
    ("wrong rank", PREDICT, {"instances": [_row(ids=7)]}, 400,
     "input 'ids': got shape [1] (the batch of 'instances', then the instance's value); the "
     "signature expects int64 of shape [-1,3]"),
    ("wrong rank, columnar", PREDICT,
     {"inputs": {"dense": [[1, 2]], "ids": [[[1, 2, 3]]], "name": ["a"]}}, 400,
     "input 'ids': got shape [1,1,3]; the signature expects int64 of shape [-1,3]"),
    ("ragged instances", PREDICT, {"instances": [_row(), _row(ids=[1, 2, 3, 4])]}, 400,
     "input 'ids': Encountered list at unexpected size: 4 at level: 1 expected size: 3"),
    ("list where a scalar", PREDICT, {"instances": [_row(name=["a"])]}, 400,
     "input 'name': got shape [1,1]"),
    ("values for a signature of several inputs", PREDICT, {"instances": [1, 2]}, 400,
     "every item of 'instances' must be an object naming the inputs {dense,ids,name}"),
    ("objects and values mixed", PREDICT, {"instances": [_row(), 2]}, 400,
     "item 1 of 'instances' is 2"),
    ("empty instances", PREDICT, {"instances": []}, 400, "'instances' must be a non-empty list"),
    ("instances and inputs", PREDICT, {"instances": [_row()], "inputs": {}}, 400,
     "exactly one of 'instances'"),
    ("no instances nor inputs", PREDICT, {"rows": []}, 400, "exactly one of 'instances'"),
    ("body not an object", PREDICT, [1, 2], 400, "JSON Value: [1, 2] is not a JSON object"),
    ("nosuch signature", PREDICT, {"instances": [_row()], "signature_name": "nosuch"}, 400,
     "Serving signature name: \"nosuch\" not found in signature def (model 'dlrm' has "
     "{labels,other,price,serving_default})"),
    ("signature_name not a string", PREDICT, {"instances": [_row()], "signature_name": 3},
     400, "JSON Value: 3 not formatted correctly. 'signature_name' key must be a string value."),
    ("non-JSON", PREDICT, "{not json", 400, "JSON Parse error: "),
    ("unknown model", "v1/models/other:predict", {"instances": [_row()]}, 404,
     "Servable not found for request: Latest(other) (this server serves model 'dlrm')"),
    ("unknown version", "v1/models/dlrm/versions/7:predict", {"instances": [_row()]}, 404,
     "Servable not found for request: Specific(dlrm, 7) (this server serves model 'dlrm' "
     "versions [1, 2])"),
    ("version not a number", "v1/models/dlrm/versions/x:predict", {"instances": [_row()]}, 404,
     "Malformed request: POST /v1/models/dlrm/versions/x:predict"),
    ("unknown method", "v1/models/dlrm:explain", {"instances": [_row()]}, 404,
     "Malformed request: POST /v1/models/dlrm:explain: the methods are "
     "['classify', 'predict', 'regress']"),
    ("unknown path", "v2/models/dlrm:predict", {"instances": [_row()]}, 404,
     "Malformed request: POST /v2/models/dlrm:predict"),
    ("regress on a predict signature", "v1/models/dlrm:regress", {"examples": [{}]}, 400,
     "Expected regress signature method_name to be tensorflow/serving/regress. Was: "
     "tensorflow/serving/predict (signature 'serving_default' of model 'dlrm')"),
    ("classify on a predict signature", "v1/models/dlrm:classify",
     {"examples": [{}], "signature_name": "other"}, 400,
     "Expected classify signature method_name to be tensorflow/serving/classify. Was: "
     "tensorflow/serving/predict (signature 'other' of model 'dlrm')"),
    ("classify without examples", "v1/models/dlrm:classify",
     {"instances": [{}], "signature_name": "labels"}, 400,
     ":classify takes a JSON object whose 'examples' is a non-empty list of objects"),
    ("classify with a bool feature", "v1/models/dlrm:classify",
     {"examples": [{"age": True}], "signature_name": "labels"}, 400,
     "feature 'age': JSON Value: true must be integers, decimals or strings"),
    ("classify with mixed kinds", "v1/models/dlrm:classify",
     {"examples": [{"age": [1, "a"]}], "signature_name": "labels"}, 400,
     "one kind per feature"),
    ("regress on a classify signature", "v1/models/dlrm:regress",
     {"examples": [{"age": 1.0}], "signature_name": "labels"}, 400,
     "Expected regress signature method_name to be tensorflow/serving/regress. Was: "
     "tensorflow/serving/classify"),
    ("predict on a classify signature", PREDICT,
     {"instances": ["a"], "signature_name": "labels"}, 400,
     "Expected predict signature method_name to be tensorflow/serving/predict. Was: "
     "tensorflow/serving/classify"),
]


@pytest.mark.parametrize("path, body, status, message", [row[1:] for row in BAD],
                         ids=[row[0] for row in BAD])
def test_bad_requests_are_refused_before_the_predictor_runs(urls, path, body, status, message):
    CALLS.clear()
    if isinstance(body, str):
        reply = requests.post(f"{urls['dlrm']}/{path}", data=body, timeout=30)
    else:
        reply = requests.post(f"{urls['dlrm']}/{path}", json=body, timeout=30)
    assert reply.status_code == status, reply.text
    assert reply.headers["Content-Type"].startswith("application/json")
    assert message in reply.json()["error"], reply.json()["error"]
    assert not CALLS


def test_wrong_http_method_body_too_big_a_dead_shard_and_a_broken_predictor(urls):
    reply = requests.get(f"{urls['dlrm']}/v1/models/dlrm:predict", timeout=30)
    assert reply.status_code == 405, reply.text
    assert reply.json() == {"error": "Method GET not allowed on /v1/models/dlrm:predict"}
    assert reply.headers["Allow"] == "POST"

    CALLS.clear()
    big = {"instances": [_row(name="x" * 20000)]}
    reply = requests.post(f"{urls['small']}/{PREDICT}", json=big, timeout=30)
    assert reply.status_code == 413, reply.text
    assert "Maximum request body size 10485 exceeded" in reply.json()["error"]
    assert "--max-body-mb is 0.01" in reply.json()["error"]
    assert not CALLS
    reply = requests.post(f"{urls['small']}/{PREDICT}", json={"instances": [_row()]}, timeout=30)
    assert reply.status_code == 200, reply.text

    reply = requests.post(f"{urls['dlrm']}/{PREDICT}", json={"instances": [_row(name="fail")]},
                          timeout=30)
    assert reply.status_code == 503, reply.text
    assert reply.json() == {"error": "shard 'shard_1' did not answer"}
    reply = requests.post(f"{urls['dlrm']}/{PREDICT}", json={"instances": [_row(name="crash")]},
                          timeout=30)
    assert reply.status_code == 500, reply.text
    assert reply.json() == {"error": "RuntimeError: the predictor broke"}


def test_model_status_sets_the_newest_versions_state():
    """`model_status` (e.g. shard health) is the newest version's state; not AVAILABLE: 503."""
    health = [("AVAILABLE", "OK", "")]

    async def check():
        app = rest.make_app("dlrm", versions=rest.Versions([_servable(1), _servable(2)]),
                            model_status=lambda: health[0])
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "localhost", port).start()
        loop = asyncio.get_running_loop()
        try:
            replies = []
            for state in (("AVAILABLE", "OK", ""), ("UNAVAILABLE", "UNAVAILABLE",
                                                      "shard 'shard_1' has no live replica")):
                health[0] = state
                replies.append(await loop.run_in_executor(None, lambda: requests.get(
                    f"http://localhost:{port}/v1/models/dlrm", timeout=30)))
            return replies
        finally:
            await runner.cleanup()

    ready, unready = asyncio.run(check())
    assert ready.status_code == 200, ready.text
    assert unready.status_code == 503, unready.text
    assert unready.json()["model_version_status"] == [
        {"version": "2", "state": "UNAVAILABLE", "status": {
            "error_code": "UNAVAILABLE", "error_message": "shard 'shard_1' has no live replica"}},
        {"version": "1", "state": "AVAILABLE",
         "status": {"error_code": "OK", "error_message": ""}}]


def test_a_retired_version_is_not_found_and_listed_as_ended():
    versions = rest.Versions([_servable(1), _servable(2)])
    closed = []
    versions.add(rest.Servable(3, None, lambda s, i: i, close=lambda: closed.append(3)))
    versions.retire(3)
    versions.retire(4, error="could not load: no saved_model.pb")
    assert closed == [3] and sorted(versions.loaded()) == [1, 2]
    assert versions.status() == [
        {"version": "4", "state": "END",
         "status": {"error_code": "UNKNOWN", "error_message": "could not load: no saved_model.pb"}},
        {"version": "3", "state": "END", "status": {"error_code": "OK", "error_message": ""}},
        {"version": "2", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}},
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]


def test_a_retired_version_closes_once_its_requests_are_done():
    closed = []
    versions = rest.Versions([rest.Servable(1, None, None, close=lambda: closed.append(1)),
                              _servable(2)])
    held = versions.acquire(1)
    retiring = threading.Thread(target=versions.retire, args=(1,))
    retiring.start()
    retiring.join(0.5)
    # No longer served, but not closed while a request holds it.
    assert retiring.is_alive() and not closed and versions.acquire(1) is None
    versions.release(held)
    retiring.join(30)
    assert closed == [1] and versions.acquire().version == 2


def test_concurrent_requests_are_answered(urls):
    def one(i):
        return requests.post(f"{urls['dlrm']}/v1/models/dlrm/versions/1:predict",
                             json={"instances": [_row(ids=(i, 0, 0))]},
                             timeout=30).json()["predictions"][0]["score"]

    results = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, one(i)))
               for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: 3.0 + i for i in range(16)}


@pytest.mark.parametrize("dtype, value, expected", [
    ("int32", [[2 ** 31 - 1, -2 ** 31]], "ok"),
    ("int32", [[2 ** 31, 0]], "(out of its range [-2147483648, 2147483647])"),
    ("uint64", [[2 ** 64 - 1, 0]], "ok"),
    ("uint64", [[-1, 0]], "JSON Value: -1 Type: Number is not of expected type: uint64"),
    ("int64", [[2 ** 70, 0]], "JSON Value: 1180591620717411303424 Type: Number"),
    ("float32", [[2 ** 24 - 1, -0.5]], "ok"),
    ("float32", [[2 ** 24, 0]], "Cannot convert JSON value: 16777216 to float"),
    ("float32", [[float("nan"), 3.4e38]], "ok"),
    ("float32", [[3.5e38, 0]], "Cannot convert JSON value: 3.5e+38 to float"),
    ("float64", [[2 ** 53 + 1, 0]], "to double without loss of precision"),
    ("bool", [[True, False]], "ok"),
    ("bool", [[1, False]], "JSON Value: 1 Type: Number is not of expected type: bool"),
])
def test_dtype_edges(dtype, value, expected, monkeypatch):
    """The edges of every dtype's range, through the one-type-at-a-time path and the
    value-by-value one: both give the same array or the same refusal."""
    spec = TensorSpec(dtype, (None, 2))
    for path in ("fast", "slow"):
        if path == "slow":
            monkeypatch.setattr(request_checks, "_fast_array", lambda *args: None)
        if expected != "ok":
            with pytest.raises(request_checks.BadRequest) as error:
                request_checks.to_array(value, spec, "v")
            assert expected in str(error.value)
            continue
        array = request_checks.to_array(value, spec, "v")
        assert array.dtype == np.dtype(dtype) and array.shape == (1, 2)
        np.testing.assert_array_equal(array, np.array(value, dtype=dtype))
