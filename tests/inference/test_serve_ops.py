"""`tfra-de serve` operated (issue 60): TF Serving's gRPC API for the model (a stock client, the
same answers as REST and the model, errors as gRPC codes), Prometheus metrics counting exactly
the requests sent, an access log, readiness following the shards' health, a SIGKILLed replica
restarted by the supervisor, SIGTERM answering the requests in flight. One server for the
module (the SIGTERM test, last, stops it); every process is killed by pid at the end."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from tests.inference import test_serve as base
from tfra_dynamic_embedding import inference
from tfra_dynamic_embedding.distributed.cluster import free_port
from tfra_dynamic_embedding.inference import serve

TIMEOUT = 10.0


class Operated:
    """`tfra-de serve --replicas 2 --grpc-port P --access-log FILE` as a subprocess; shard pids
    read from its output (started and restarted ones); `close()` stops it by pid."""

    def __init__(self, export_dir, work):
        self.port, self.grpc_port = free_port(), free_port()
        self.log_path, self.access_path = str(work / "ops.log"), str(work / "access.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                [sys.executable, "-m", "tfra_dynamic_embedding.cli", "serve", export_dir,
                 "--port", str(self.port), "--grpc-port", str(self.grpc_port),
                 "--replicas", "2", "--timeout", str(TIMEOUT), "--model-name", "m",
                 "--access-log", self.access_path, "--access-log-max-rate", "0",
                 "--health-interval", "0.5"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=base.ENV)
        try:
            deadline = time.monotonic() + 180
            while serve.READY not in self.log():
                assert self.proc.poll() is None and time.monotonic() < deadline, \
                    self.log()[-3000:]
                time.sleep(0.1)
        except BaseException:
            self.close()
            raise
        self.base = f"http://localhost:{self.port}"
        self.channel = grpc.insecure_channel(f"localhost:{self.grpc_port}")
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)

    def log(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def pids(self):
        """{(shard, task): pid} of the replicas now (the latest start of each)."""
        pids = {}
        for m in re.finditer(r"(shard_\d+) replica (\d+) at \S+ \(pid (\d+)\)|"
                             r"/job:(shard_\d+)/task:(\d+) restarted at \S+ \(pid (\d+)\)",
                             self.log()):
            shard, task, pid = (m.group(1, 2, 3) if m.group(1) else m.group(4, 5, 6))
            pids[(shard, int(task))] = int(pid)
        return pids

    def all_pids(self):
        return [int(p) for p in re.findall(r"\(pid (\d+)\)", self.log())]

    def rest(self, request):
        return requests.post(f"{self.base}/v1/models/m:predict",
                             json={"instances": base._instances(request)}, timeout=60)  # pylint: disable=protected-access

    def grpc_predict(self, request, name="m", timeout=60):
        message = predict_pb2.PredictRequest()
        message.model_spec.name = name
        for key, value in request.items():
            message.inputs[key].CopyFrom(tf.make_tensor_proto(value))
        return self.stub.Predict(message, timeout=timeout)

    def status(self):
        return requests.get(f"{self.base}/v1/models/m", timeout=30)

    def grpc_status(self):
        message = get_model_status_pb2.GetModelStatusRequest()
        message.model_spec.name = "m"
        return self.models.GetModelStatus(message, timeout=30).model_version_status[0]

    def metrics(self):
        """{(metric sample name, frozenset of labels): value}."""
        text = requests.get(f"{self.base}/monitoring/prometheus/metrics", timeout=30).text
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def close(self):
        """SIGTERM, SIGKILL after 30 s; then every shard process it ever started, by pid."""
        if hasattr(self, "channel"):
            self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        for pid in self.all_pids():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    ours = b"grpc_shards" in f.read()
                if ours:
                    os.kill(pid, signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError):
                pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = base._model()  # pylint: disable=protected-access
    work = tmp_path_factory.mktemp("serve_ops")
    export_dir = str(work / "export")
    inference.export_sharded(model, inference.plan_for_model(model, 2), export_dir)
    server = Operated(export_dir, work)
    server.export_dir = export_dir
    try:
        yield model, server
    finally:
        server.close()


def _expected(model, request):
    return model({k: tf.constant(v) for k, v in request.items()}).numpy().ravel()


def test_a_stock_tf_serving_grpc_client_predicts_like_rest_and_the_model(served):
    model, server = served
    request = base._request(np.random.default_rng(5), 12)  # pylint: disable=protected-access
    expected = _expected(model, request)
    reply = server.grpc_predict(request)
    assert list(reply.outputs) and reply.model_spec.name == "m"
    got = tf.make_ndarray(next(iter(reply.outputs.values()))).ravel()
    # REST writes a float32 as its shortest decimal (as TF Serving): read back as float32, the
    # same number.
    rest = np.array(server.rest(request).json()["predictions"], np.float32).ravel()
    assert np.max(np.abs(got - expected)) <= 1e-6
    np.testing.assert_array_equal(got, rest)

    status = server.grpc_status()
    assert status.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    metadata = get_model_metadata_pb2.GetModelMetadataRequest()
    metadata.model_spec.name = "m"
    metadata.metadata_field.append("signature_def")
    defs = get_model_metadata_pb2.SignatureDefMap()
    server.stub.GetModelMetadata(metadata, timeout=30).metadata["signature_def"].Unpack(defs)
    assert sorted(defs.signature_def["serving_default"].inputs) == ["tags", "user", "x"]

    # Errors as gRPC codes: another model, a wrong dtype, a missing input.
    with pytest.raises(grpc.RpcError) as error:
        server.grpc_predict(request, name="other")
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as error:
        server.grpc_predict({**request, "x": request["x"].astype(np.float64)})
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'x'" in \
        error.value.details()
    with pytest.raises(grpc.RpcError) as error:
        server.grpc_predict({k: v for k, v in request.items() if k != "tags"})
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert requests.get(f"{server.base}/healthz", timeout=30).status_code == 200


def test_the_grpc_front_maps_errors_to_grpc_codes(served):
    """The front's servicer in this process over a predict function that fails as the sharded
    model does: a shard down -> UNAVAILABLE naming it; a bad value -> INVALID_ARGUMENT; and the
    status function's state reaches GetModelStatus."""
    from tfra_dynamic_embedding.inference import grpc_front  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.inference import manifest as manifest_lib  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.inference import rest  # pylint: disable=import-outside-toplevel
    _, server = served
    manifest = manifest_lib.Manifest.load(server.export_dir)
    failures = {"error": None}

    def run(signature, inputs):
        del signature, inputs
        raise failures["error"]

    versions = rest.Versions([rest.Servable(1, None, run, signature_defs={
        "serving_default": grpc_front.signature_def(server.export_dir, manifest)})])
    servicer = grpc_front.make_servicer(
        versions, "m",
        status=lambda: ("UNKNOWN", "UNAVAILABLE", "shard 'shard_1' has no live replica"))
    front = grpc_front.start(servicer, "localhost:0", threads=2)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    for key, value in base._request(np.random.default_rng(9), 2).items():  # pylint: disable=protected-access
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    try:
        with grpc.insecure_channel(f"localhost:{front.port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            for error, message, code in (
                    (tf.errors.UnavailableError, "shard 'shard_1' did not answer",
                     grpc.StatusCode.UNAVAILABLE),
                    (tf.errors.InvalidArgumentError, "bad ids", grpc.StatusCode.INVALID_ARGUMENT),
                    (ValueError, "main takes no inputs ['q']", grpc.StatusCode.INVALID_ARGUMENT)):
                failures["error"] = (error(None, None, message) if error is not ValueError
                                     else error(message))
                with pytest.raises(grpc.RpcError) as raised:
                    stub.Predict(request, timeout=30)
                assert raised.value.code() == code and message in raised.value.details()
            status_request = get_model_status_pb2.GetModelStatusRequest()
            status_request.model_spec.name = "m"
            status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
                status_request, timeout=30).model_version_status[0]
            assert status.state == get_model_status_pb2.ModelVersionStatus.UNKNOWN
            assert status.status.error_code == grpc.StatusCode.UNAVAILABLE.value[0]
            assert "shard_1" in status.status.error_message
    finally:
        front.stop(None).wait()


def _count(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_count_the_requests_sent_exactly(served):
    model, server = served
    del model
    rng = np.random.default_rng(6)
    before = server.metrics()
    sizes = [3, 5, 7]
    for rows in sizes:
        assert server.rest(base._request(rng, rows)).status_code == 200  # pylint: disable=protected-access
    bad = requests.post(f"{server.base}/v1/models/m:predict", json={"instances": []}, timeout=30)
    assert bad.status_code == 400
    assert requests.post(f"{server.base}/v1/models/zz:predict", json={"instances": [{}]},
                         timeout=30).status_code == 404
    for rows in (2, 4):
        server.grpc_predict(base._request(rng, rows))  # pylint: disable=protected-access
    with pytest.raises(grpc.RpcError):
        server.grpc_predict(base._request(rng, 2), name="zz")  # pylint: disable=protected-access
    after = server.metrics()

    def delta(name, **labels):
        return _count(after, name, **labels) - _count(before, name, **labels)

    requests_total = "tfra_de_requests_total"
    assert delta(requests_total, model="m", api="rest:predict", code="200") == 3
    assert delta(requests_total, model="m", api="rest:predict", code="400") == 1
    assert delta(requests_total, model="m", api="rest:predict", code="404") == 1
    assert delta(requests_total, model="m", api="grpc:Predict", code="OK") == 2
    assert delta(requests_total, model="m", api="grpc:Predict", code="NOT_FOUND") == 1
    assert delta("tfra_de_request_latency_seconds_count", model="m", api="rest:predict") == 5
    assert delta("tfra_de_rows_served_total", model="m") == sum(sizes) + 2 + 4
    # Every answered prediction called both shards once.
    for shard in ("shard_0", "shard_1"):
        assert delta("tfra_de_shard_calls_total", shard=shard, code="OK") == 5
        assert delta("tfra_de_shard_call_latency_seconds_count", shard=shard) == 5
        assert _count(after, "tfra_de_shard_live_replicas", shard=shard) == 2
    with open(server.access_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert sum(" POST /v1/models/m:predict 200 " in line for line in lines) >= 3
    assert any(" Predict m NOT_FOUND " in line for line in lines)


def _wait_for(what, predicate, seconds):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not after {seconds:.0f} s"
        time.sleep(0.1)


def test_the_supervisor_restarts_killed_replicas_and_status_follows_health(served):
    model, server = served
    request = base._request(np.random.default_rng(7), 6)  # pylint: disable=protected-access
    expected = _expected(model, request)
    pids = server.pids()

    # One replica of shard_0 SIGKILLed: restarted at its address (a new pid), status stays.
    os.kill(pids[("shard_0", 0)], signal.SIGKILL)
    _wait_for("shard_0/0 restarted", lambda: server.pids()[("shard_0", 0)] != pids[
        ("shard_0", 0)], 30)
    assert server.status().status_code == 200

    # Both replicas of shard_1 SIGKILLed: not AVAILABLE (REST 503, gRPC), naming shard_1 ...
    for task in range(2):
        os.kill(pids[("shard_1", task)], signal.SIGKILL)
    _wait_for("status not AVAILABLE", lambda: server.status().status_code == 503, 15)
    body = server.status().json()["model_version_status"][0]
    grpc_status = server.grpc_status()
    if body["state"] != "AVAILABLE":   # (the restarts may be back already)
        assert body["state"] == "UNKNOWN" and body["status"]["error_code"] == "UNAVAILABLE"
        assert "shard 'shard_1'" in body["status"]["error_message"]
    if grpc_status.state != get_model_status_pb2.ModelVersionStatus.AVAILABLE:
        assert grpc_status.status.error_code == grpc.StatusCode.UNAVAILABLE.value[0]
        assert "shard 'shard_1'" in grpc_status.status.error_message
    # ... and AVAILABLE again once the supervisor's restarts answer; they serve.
    _wait_for("status AVAILABLE again", lambda: server.status().status_code == 200, 120)
    _wait_for("gRPC status AVAILABLE", lambda: server.grpc_status().state ==
              get_model_status_pb2.ModelVersionStatus.AVAILABLE, 30)
    reply = server.rest(request)
    assert reply.status_code == 200, reply.text
    assert np.max(np.abs(np.array(reply.json()["predictions"]).ravel() - expected)) <= 1e-6
    now = server.pids()
    assert all(now[key] != pids[key] for key in (("shard_1", 0), ("shard_1", 1)))
    samples = server.metrics()
    assert _count(samples, "tfra_de_replica_restarts_total", shard="shard_1") == 2
    assert _count(samples, "tfra_de_replica_restarts_total", shard="shard_0") == 1


def test_sigterm_answers_the_requests_in_flight_then_exits_0(served):
    """Both replicas of shard_0 stopped (SIGSTOP): requests wait in flight; SIGTERM; the
    replicas resumed a moment later: every request in flight is answered, then serve exits 0
    and its shard processes are gone."""
    model, server = served
    rng = np.random.default_rng(8)
    jobs = [base._request(rng, 4) for _ in range(4)]  # pylint: disable=protected-access
    pids = server.pids()
    stopped = [pids[("shard_0", task)] for task in range(2)]
    results = [None] * (len(jobs) + 1)

    def rest(i):
        try:
            reply = server.rest(jobs[i])
            results[i] = (reply.status_code, np.array(reply.json()["predictions"]).ravel())
        except Exception as error:  # pylint: disable=broad-except
            results[i] = (None, repr(error))

    def grpc_call():
        try:
            reply = server.grpc_predict(jobs[0])
            results[-1] = ("OK", tf.make_ndarray(next(iter(reply.outputs.values()))).ravel())
        except grpc.RpcError as error:
            results[-1] = (error.code(), error.details())

    try:
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        threads = [threading.Thread(target=rest, args=(i,), daemon=True)
                   for i in range(len(jobs))] + [threading.Thread(target=grpc_call, daemon=True)]
        for thread in threads:
            thread.start()
        time.sleep(2.5)   # all in flight, waiting on shard_0
        assert all(r is None for r in results), results
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert server.proc.poll() is None, "serve exited with requests in flight"
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    for thread in threads:
        thread.join(60)
    for i, job in enumerate(jobs):
        assert results[i][0] == 200, results[i]
        assert np.max(np.abs(results[i][1] - _expected(model, job))) <= 1e-6
    assert results[-1][0] == "OK", results[-1]
    assert np.max(np.abs(results[-1][1] - _expected(model, jobs[0]))) <= 1e-6
    assert server.proc.wait(60) == 0, server.log()[-3000:]
    base._assert_gone(list(server.pids().values()))  # pylint: disable=protected-access
