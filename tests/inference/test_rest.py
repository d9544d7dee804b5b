"""TF Serving's REST predict schema (inference/rest.py) over a real aiohttp server on loopback,
in front of a numpy predictor; status codes for bad requests, other models and dead shards."""

import asyncio
import base64
import threading

import numpy as np
import pytest
import requests
from aiohttp import web

from tfra_dynamic_embedding.distributed.cluster import free_port
from tfra_dynamic_embedding.inference import rest


def predict(inputs):
    if "fail" in inputs:
        raise rest.Unavailable("shard 'shard_1' did not answer")
    dense = np.asarray(inputs["dense"], np.float32)
    return {"score": dense.sum(axis=1), "tag": np.char.add(inputs["name"].astype(np.bytes_),
                                                          b"!")}


def single(inputs):
    return {"y": np.asarray(inputs["inputs"], np.float64) * 2}


@pytest.fixture(scope="module")
def url():
    """Two apps on one loopback server run by a thread with its own event loop."""
    loop = asyncio.new_event_loop()
    port = free_port()
    started = threading.Event()
    runners = []

    def run():
        asyncio.set_event_loop(loop)
        app = web.Application()
        app.add_subapp("/a/", rest.make_app("dlrm", predict))
        app.add_subapp("/b/", rest.make_app("double", single))
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "localhost", port).start())
        runners.append(runner)
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(30)
    yield f"http://localhost:{port}"
    asyncio.run_coroutine_threadsafe(runners[0].cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)


def test_row_format_with_several_outputs(url):
    body = {"instances": [{"dense": [1, 2], "name": "a"},
                          {"dense": [3, 4.5], "name": {"b64": base64.b64encode(b"b").decode()}}]}
    reply = requests.post(f"{url}/a/v1/models/dlrm:predict", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"predictions": [{"score": 3.0, "tag": "a!"},
                                            {"score": 7.5, "tag": "b!"}]}


def test_columnar_format_and_a_single_output(url):
    reply = requests.post(f"{url}/b/v1/models/double:predict",
                          json={"inputs": [[1, 2], [3, 4]]}, timeout=30)
    assert reply.json() == {"outputs": [[2, 4], [6, 8]]}
    reply = requests.post(f"{url}/b/v1/models/double:predict", json={"instances": [1, 2.5]},
                          timeout=30)
    assert reply.json() == {"predictions": [2, 5]}
    reply = requests.post(f"{url}/a/v1/models/dlrm:predict",
                          json={"inputs": {"dense": [[1, 1]], "name": ["x"]}}, timeout=30)
    assert reply.json() == {"outputs": {"score": [2.0], "tag": ["x!"]}}


def test_status(url):
    reply = requests.get(f"{url}/a/v1/models/dlrm", timeout=30)
    assert reply.json()["model_version_status"][0]["state"] == "AVAILABLE"


@pytest.mark.parametrize("path, body, status, message", [
    ("a/v1/models/other:predict", {"instances": [1]}, 404, "no model 'other'"),
    ("a/v1/models/dlrm:predict", "{not json", 400, "bad request body"),
    ("a/v1/models/dlrm:predict", {"rows": []}, 400, "exactly one of 'instances'"),
    ("a/v1/models/dlrm:predict", {"instances": []}, 400, "non-empty list"),
    ("a/v1/models/dlrm:predict", {"instances": [{"dense": [1]}, {"name": "x"}]}, 400,
     "same inputs"),
    ("a/v1/models/dlrm:predict", {"instances": [{"dense": [1, 2]}]}, 400, "'name'"),
    ("a/v1/models/dlrm:predict", {"instances": [{"fail": 1}]}, 503, "shard 'shard_1'"),
])
def test_errors(url, path, body, status, message):
    if isinstance(body, str):
        reply = requests.post(f"{url}/{path}", data=body, timeout=30)
    else:
        reply = requests.post(f"{url}/{path}", json=body, timeout=30)
    assert reply.status_code == status, reply.text
    assert message in reply.json()["error"]


def test_concurrent_requests_are_answered(url):
    def one(i):
        return requests.post(f"{url}/b/v1/models/double:predict", json={"instances": [i]},
                             timeout=30).json()["predictions"][0]

    results = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, one(i)))
               for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: 2 * i for i in range(16)}
