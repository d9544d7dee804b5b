"""`tfra-de serve` (inference/serve.py): a sharded export served by separate processes -- sparse
shards as TF Serving gRPC PredictionServices (2 replicas each), the main shard behind TF
Serving's REST API. Predictions equal the single-process model; a dead replica is skipped, a dead
shard gives HTTP 503 naming it in bounded time, a restarted shard is used again. Every process is
killed by pid at the end."""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import grpc
import keras
import numpy as np
import pytest
import requests
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.inference.lines import wait_for_line
from tfra_dynamic_embedding import inference
from tfra_dynamic_embedding.distributed.cluster import free_port
from tfra_dynamic_embedding.inference import grpc_shards, request_checks, rest, serve

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
    p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p))
DIM = 3


def _model():
    """user (int64) + tags (string, mean of 2) + x (dense) -> Dense -> sigmoid; 40 users and 30
    tags with random rows, every other id of a request unseen (zero rows)."""
    user = keras.Input(shape=(), dtype="int64", name="user")
    tags = keras.Input(shape=(2,), dtype="string", name="tags")
    x = keras.Input(shape=(2,), name="x")
    user_emb = de.keras.layers.Embedding(DIM, initializer=0.0, name="user_emb")
    tag_emb = de.keras.layers.Embedding(DIM, key_dtype=tf.string, pooling="mean",
                                        initializer=0.0, name="tag_emb")
    hidden = keras.layers.Concatenate()([user_emb(user), tag_emb(tags), x])
    model = keras.Model({"user": user, "tags": tags, "x": x},
                        keras.layers.Dense(1, activation="sigmoid", name="out")(hidden))
    rng = np.random.default_rng(3)
    user_emb.params.upsert(tf.range(40, dtype=tf.int64) * 7,
                           rng.normal(size=(40, DIM)).astype(np.float32))
    tag_emb.params.upsert(tf.constant([f"t{i}" for i in range(30)]),
                          rng.normal(size=(30, DIM)).astype(np.float32))
    return model


def _request(rng, rows):
    return {"user": rng.integers(0, 80, rows) * 7,
            "tags": np.array([[f"t{a}", f"t{b}"] for a, b in rng.integers(0, 60, (rows, 2))]),
            "x": rng.normal(size=(rows, 2)).astype(np.float32)}


def _instances(request):
    rows = len(request["user"])
    return [{"user": int(request["user"][i]), "tags": request["tags"][i].tolist(),
             "x": request["x"][i].tolist()} for i in range(rows)]


class Served:
    """`tfra-de serve` as a subprocess, its shard processes' pids parsed from its output;
    `close()` stops it (SIGTERM, then SIGKILL by pid) -- also when the start fails. Not
    supervised: these tests restart shards themselves (the supervisor: test_serve_ops.py)."""

    def __init__(self, export_dir, log_path, timeout=2.0, extra=()):
        self.port = free_port()
        self.log_path = log_path
        self.replicas = {}
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                [sys.executable, "-m", "tfra_dynamic_embedding.cli", "serve", export_dir,
                 "--port", str(self.port), "--replicas", "2", "--timeout", str(timeout),
                 "--model-name", "m", "--no-supervise", *extra], stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=ENV)
        try:
            deadline = time.monotonic() + 180
            while serve.READY not in self.log():
                assert self.proc.poll() is None and time.monotonic() < deadline, \
                    self.log()[-3000:]
                time.sleep(0.1)
        except BaseException:
            self.close()
            raise
        self.replicas = {(m[0], int(m[1])): (m[2], int(m[3])) for m in re.findall(
            r"(shard_\d+) replica (\d+) at (\S+) \(pid (\d+)\)", self.log())}
        self.url = f"http://localhost:{self.port}/v1/models/m:predict"

    def log(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def predict(self, request):
        return requests.post(self.url, json={"instances": _instances(request)}, timeout=60)

    def close(self):
        """SIGTERM (the serve process takes its shard processes down), SIGKILL after 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model = _model()
    work = tmp_path_factory.mktemp("serve")
    plan = inference.plan_for_model(model, 2)
    export_dir = str(work / "export")
    inference.export_sharded(model, plan, export_dir)
    return model, export_dir, work


def test_serve_predicts_like_the_model_and_survives_shard_failures(setup):
    model, export_dir, work = setup
    served, extra = Served(export_dir, str(work / "serve.log")), []
    try:
        assert sorted(served.replicas) == [(f"shard_{s}", r) for s in range(2) for r in range(2)]
        rng = np.random.default_rng(0)
        request = _request(rng, 16)
        expected = model({k: tf.constant(v) for k, v in request.items()}).numpy().ravel()
        reply = served.predict(request)
        assert reply.status_code == 200, reply.text
        got = np.array(reply.json()["predictions"]).ravel()
        assert np.max(np.abs(got - expected)) <= 1e-6

        # One replica of shard_0 dies: the other answers.
        address, pid = served.replicas[("shard_0", 0)]
        os.kill(pid, signal.SIGKILL)
        for _ in range(3):
            reply = served.predict(request)
            assert reply.status_code == 200, reply.text
            assert np.max(np.abs(np.array(reply.json()["predictions"]).ravel() - expected)) <= 1e-6

        # Both replicas of shard_1 die: 503 naming shard_1, in bounded time.
        dead = [served.replicas[("shard_1", r)] for r in range(2)]
        for _, pid in dead:
            os.kill(pid, signal.SIGKILL)
        began = time.monotonic()
        reply = served.predict(request)
        assert reply.status_code == 503, reply.text
        assert "shard 'shard_1'" in reply.json()["error"]
        assert time.monotonic() - began < 15

        # shard_1 restarted at its address: used again.
        for address, _ in dead[:1]:
            extra.append(subprocess.Popen(  # pylint: disable=consider-using-with
                serve.shard_server_argv(os.path.join(export_dir, "shard_1"), address),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV))
            wait_for_line(extra[-1], grpc_shards.READY, timeout=90)
        # Found again within seconds (the client retries a set-aside replica after 1 s and
        # reconnects at most a second apart): 503 until then, never a hang.
        deadline = time.monotonic() + 15
        reply = served.predict(request)
        while reply.status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.5)
            reply = served.predict(request)
        assert reply.status_code == 200, reply.text
        assert np.max(np.abs(np.array(reply.json()["predictions"]).ravel() - expected)) <= 1e-6
    finally:
        served.close()
        for proc in extra:
            proc.kill()
            proc.wait(30)
    # The serve process took its shard processes down with it.
    time.sleep(0.5)
    for _, pid in served.replicas.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# -- under load: 16 concurrent clients, a replica killed and restarted -------------------------------

CLIENTS = 16
TIMEOUT = 10.0   # the served --timeout: every request, failover included, must answer within it


def _jobs(model, seed, count):
    """`count` (request, the Keras model's predictions) pairs of 1-12 rows each."""
    rng = np.random.default_rng(seed)
    jobs = []
    for _ in range(count):
        request = _request(rng, int(rng.integers(1, 13)))
        expected = model({k: tf.constant(v) for k, v in request.items()}).numpy().ravel()
        jobs.append((request, expected))
    return jobs


def _hammer(served, jobs, when=None, at=None, limit=180.0):
    """Sends `jobs` from CLIENTS threads at once, in a closed loop (all threads released
    together); calls `when()` once `at` requests have been answered. Returns one (HTTP status,
    max |served - expected| or the error text, seconds) per job."""
    results, lock, ids = [None] * len(jobs), threading.Lock(), iter(range(len(jobs)))
    start = threading.Barrier(CLIENTS + 1)

    def client():
        start.wait(60)
        while True:
            with lock:
                index = next(ids, None)
            if index is None:
                return
            request, expected = jobs[index]
            began = time.monotonic()
            try:
                reply = served.predict(request)
                outcome = (float(np.max(np.abs(np.array(reply.json()["predictions"]).ravel()
                                                - expected)))
                           if reply.status_code == 200 else reply.text)
                results[index] = (reply.status_code, outcome, time.monotonic() - began)
            except (requests.RequestException, ValueError) as error:
                results[index] = (None, repr(error), time.monotonic() - began)

    # Daemon threads: a failed assertion here never leaves the test process hanging on them (and
    # every request has its own 60 s timeout).
    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    start.wait(60)
    deadline = time.monotonic() + limit
    while any(thread.is_alive() for thread in threads):
        assert time.monotonic() < deadline, f"requests still running after {limit:.0f} s"
        if when is not None and sum(r is not None for r in results) >= at:
            when()
            when = None
        time.sleep(0.01)
    return results


def _assert_all_right(results, served, what):
    wrong = [(i, r) for i, r in enumerate(results) if r is None or r[0] != 200 or r[1] > 1e-6]
    assert not wrong, f"{what}: {len(wrong)} of {len(results)} wrong, e.g. {wrong[:3]}"
    slowest = max(r[2] for r in results)
    assert slowest < TIMEOUT, f"{what}: a request took {slowest:.1f} s"
    assert served.proc.poll() is None, f"{what}: serve exited:\n{served.log()[-3000:]}"


def _assert_gone(pids, seconds=10.0):
    deadline = time.monotonic() + seconds
    for pid in pids:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, f"process {pid} still running"
            time.sleep(0.1)


def test_16_concurrent_clients_and_a_killed_replica(setup):
    """A fresh server's very first requests come from 16 threads at once; then one replica of
    shard_0 is SIGKILLed under that load (every request still answers, exactly, within the
    timeout), restarted at its address, and serves again (its twin killed in turn)."""
    model, export_dir, work = setup
    first, during, after = (_jobs(model, seed, count)
                            for seed, count in ((1, 4 * CLIENTS), (2, 10 * CLIENTS),
                                                (3, 4 * CLIENTS)))
    served, extra = Served(export_dir, str(work / "load.log"), timeout=TIMEOUT), []
    try:
        _assert_all_right(_hammer(served, first), served, "first requests")

        address, pid = served.replicas[("shard_0", 0)]
        killed = []
        results = _hammer(served, during, at=len(during) // 4,
                          when=lambda: killed.append(os.kill(pid, signal.SIGKILL)))
        assert killed, "the replica was not killed during the load"
        _assert_all_right(results, served, "replica shard_0/0 killed under load")

        extra.append(subprocess.Popen(  # pylint: disable=consider-using-with
            serve.shard_server_argv(os.path.join(export_dir, "shard_0"), address),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, env=ENV))
        wait_for_line(extra[-1], grpc_shards.READY, timeout=90)
        os.kill(served.replicas[("shard_0", 1)][1], signal.SIGKILL)   # only the restarted one left
        _assert_all_right(_hammer(served, after), served, "restarted shard_0/0 alone")
    finally:
        served.close()
        for proc in extra:
            proc.kill()
            proc.wait(30)
    _assert_gone([pid for _, pid in served.replicas.values()])


def test_a_stock_tf_serving_client_calls_a_shard_of_the_export(setup):
    """A shard process of `tfra-de serve` answers TF Serving's own client: model name
    `shard_<i>`, signature serving_default, the routed inputs; the same sums as the shard
    SavedModel in process."""
    from tensorflow_serving.apis import predict_pb2  # pylint: disable=import-outside-toplevel
    from tensorflow_serving.apis import prediction_service_pb2_grpc  # pylint: disable=import-outside-toplevel
    _, export_dir, _ = setup
    local = inference.load_sharded(export_dir)
    routed = inference.route(local.manifest, _request(np.random.default_rng(4), 6))
    procs = {}
    try:
        for shard in routed.shard_inputs:
            address = f"localhost:{free_port()}"
            procs[shard] = (address, subprocess.Popen(  # pylint: disable=consider-using-with
                serve.shard_server_argv(os.path.join(export_dir, shard), address),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                text=True, env=ENV))
        for shard, (address, proc) in procs.items():
            wait_for_line(proc, grpc_shards.READY, timeout=90)
            inputs = routed.shard_inputs[shard]
            request = predict_pb2.PredictRequest()
            request.model_spec.name = shard
            request.model_spec.signature_name = "serving_default"
            for key, value in inputs.items():
                request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
            with grpc.insecure_channel(address) as channel:
                reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
                    request, timeout=30)
            expected = local.call_shard(shard, inputs)
            assert sorted(reply.outputs) == sorted(expected)
            for key, value in expected.items():
                np.testing.assert_array_equal(tf.make_ndarray(reply.outputs[key]), value)
    finally:
        for _, proc in procs.values():
            proc.kill()
            proc.wait(30)


# -- strict requests, metadata, versions, a plain SavedModel ----------------------------------------


class _Doubler(tf.Module):
    """A plain SavedModel with the request signature of `_model`: prediction = 10 * sum(x)."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="user"),
                                  tf.TensorSpec([None, 2], tf.string, name="tags"),
                                  tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, user, tags, x):
        del user, tags
        return {"prediction": tf.reduce_sum(x, axis=1, keepdims=True) * 10.0}


def test_strict_requests_metadata_and_a_new_version_without_restart(setup):
    """Version 1 (a sharded export) serves; bad requests are 400s before any shard is called;
    metadata is TF Serving's SignatureDefMap; a plain SavedModel copied in as version 2 is served
    within seconds, no restart: answers change to its predictions and version 1's shard
    processes are gone."""
    model, export_dir, work = setup
    root = work / "versions"
    root.mkdir()
    shutil.copytree(export_dir, root / "1")
    served = Served(str(root), str(work / "versions.log"), extra=("--version-poll-seconds", "1"))
    base = f"http://localhost:{served.port}/v1/models/m"
    try:
        rng = np.random.default_rng(5)
        request = _request(rng, 4)
        expected = model({k: tf.constant(v) for k, v in request.items()}).numpy().ravel()
        reply = served.predict(request)
        assert reply.status_code == 200, reply.text
        assert np.max(np.abs(np.array(reply.json()["predictions"]).ravel() - expected)) <= 1e-6

        good = _instances(request)[0]
        bad = [({**good, "user": 1.5}, "input 'user': JSON Value: 1.5 Type: Number is not of "
                                       "expected type: int64"),
               ({**good, "user": 2 ** 63}, "is not of expected type: int64 (out of its range"),
               ({**good, "tags": [1, 2]}, "input 'tags': JSON Value: 1 Type: Number is not of "
                                          "expected type: string"),
               ({**good, "tags": ["t1"]}, "input 'tags': got shape [1,1]"),
               ({**good, "extra": 1}, "input tensor alias not found in signature: extra. "
                                      "Inputs expected to be in the set {tags,user,x}.")]
        for instance, message in bad:
            reply = requests.post(served.url, json={"instances": [instance]}, timeout=60)
            assert reply.status_code == 400, reply.text
            assert message in reply.json()["error"]
        reply = requests.post(served.url, json={"instances": [good], "signature_name": "nosuch"},
                              timeout=60)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"] == ("Serving signature name: \"nosuch\" not found in "
                                         "signature def (model 'm' has {serving_default})")
        # (That no shard is called for them is test_rest's: its predictor counts its calls.)
        meta = requests.get(f"{base}/metadata", timeout=60).json()
        signature = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert {k: v["dtype"] for k, v in signature["inputs"].items()} == {
            "user": "DT_INT64", "tags": "DT_STRING", "x": "DT_FLOAT"}
        assert signature["inputs"]["tags"]["tensor_shape"] == {
            "dim": [{"size": "-1", "name": ""}, {"size": "2", "name": ""}], "unknown_rank": False}
        assert signature["method_name"] == "tensorflow/serving/predict"
        assert sorted(signature["outputs"]) == ["prediction"]

        # Version 2: a plain SavedModel, written aside and renamed in (complete when seen).
        doubler = _Doubler()
        tf.saved_model.save(doubler, str(work / "v2"),
                            signatures={"serving_default": doubler.serve.get_concrete_function()})
        doubled = 10.0 * request["x"].sum(axis=1)
        # 4 clients keep sending through the switch: every answer is version 1's or version 2's.
        answers, stop = [], threading.Event()

        def client():
            while not stop.is_set():
                reply = served.predict(request)
                answers.append((reply.status_code, reply.text if reply.status_code != 200 else
                                np.array(reply.json()["predictions"]).ravel()))

        clients = [threading.Thread(target=client, daemon=True) for _ in range(4)]
        for thread in clients:
            thread.start()
        os.rename(work / "v2", root / "2")
        deadline = time.monotonic() + 60
        try:
            while True:
                reply = served.predict(request)
                assert reply.status_code == 200, reply.text
                got = np.array(reply.json()["predictions"]).ravel()
                if np.max(np.abs(got - doubled)) <= 1e-4:
                    break
                assert time.monotonic() < deadline, served.log()[-3000:]
                time.sleep(0.2)
            time.sleep(2)   # version 1 retires (its shards stop) while the clients still send
        finally:
            stop.set()
            for thread in clients:
                thread.join(60)
        failed = [a for a in answers if a[0] != 200]
        assert not failed, failed[:3]
        old = sum(np.max(np.abs(a[1] - expected)) <= 1e-6 for a in answers)
        new = sum(np.max(np.abs(a[1] - doubled)) <= 1e-4 for a in answers)
        assert old + new == len(answers) and old > 0 and new > 0, (old, new, len(answers))
        status = requests.get(base, timeout=60).json()["model_version_status"]
        assert [(s["version"], s["state"]) for s in status] == [("2", "AVAILABLE"), ("1", "END")]
        reply = requests.post(f"{base}/versions/1:predict",
                              json={"instances": _instances(request)}, timeout=60)
        assert reply.status_code == 404, reply.text
        assert "Servable not found for request: Specific(m, 1)" in reply.json()["error"]
        _assert_gone([pid for _, pid in served.replicas.values()])
    finally:
        served.close()
    _assert_gone([pid for _, pid in served.replicas.values()])


def test_a_plain_saved_model_directory_is_version_1_served_in_process(tmp_path):
    """`tfra-de serve SAVED_MODEL_DIR`: no manifest, no shards: the SavedModel itself is
    version 1, its signatures read from saved_model.pb, run in this process."""
    module = _Doubler()
    tf.saved_model.save(module, str(tmp_path),
                        signatures={"serving_default": module.serve.get_concrete_function()})
    assert serve.model_versions(str(tmp_path)) == {1: str(tmp_path)}
    servable = serve.load_version(1, str(tmp_path), argparse.Namespace())
    signature = servable.signatures["serving_default"]
    assert {k: (v.dtype, v.shape) for k, v in signature.inputs.items()} == {
        "user": ("int64", (None,)), "tags": ("string", (None, 2)), "x": ("float32", (None, 2))}
    checked = request_checks.check_predict(
        {"instances": [{"user": 1, "tags": ["a", "b"], "x": [0.5, 2]}]}, servable.signatures)
    outputs = servable.run(checked.signature_name, checked.inputs)
    np.testing.assert_allclose(outputs["prediction"], [[25.0]])


def test_classify_and_regress_signatures_of_a_plain_saved_model(tmp_path):
    """A TF1-style SavedModel with classify and regress signatures (serialized tf.Examples in):
    :classify / :regress bodies become its examples; TF Serving's results come back."""
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
        serialized = tf.compat.v1.placeholder(tf.string, [None], name="tf_example")
        age = tf.io.parse_example(
            serialized, {"age": tf.io.FixedLenFeature([1], tf.float32)})["age"]
        scores = tf.concat([1.0 - age / 100.0, age / 100.0], axis=1)
        classes = tf.tile(tf.constant([["young", "old"]]), [tf.shape(scores)[0], 1])
        builder = tf.compat.v1.saved_model.Builder(str(tmp_path / "m"))
        builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
            "serving_default": tf.compat.v1.saved_model.classification_signature_def(
                serialized, classes, scores),
            "twice": tf.compat.v1.saved_model.regression_signature_def(serialized, age * 2.0)})
        builder.save()
    servable = serve.load_version(1, str(tmp_path / "m"), argparse.Namespace())
    body = {"examples": [{"age": 20.0}, {"age": 70.0}]}
    for signature_name, method, expected in (
            ("serving_default", "classify",
             [[["young", 0.8], ["old", 0.2]], [["young", 0.3], ["old", 0.7]]]),
            ("twice", "regress", [40.0, 140.0])):
        signature = servable.signatures[signature_name]
        assert signature.method_name == f"tensorflow/serving/{method}"
        inputs = {"inputs": request_checks.check_examples(body, signature, method)}
        results = rest.format_results(servable.run(signature_name, inputs), method)["results"]
        if method == "classify":
            assert [[c for c, _ in row] for row in results] == [["young", "old"]] * 2
            results = [[s for _, s in row] for row in results]
            expected = [[s for _, s in row] for row in expected]
        np.testing.assert_allclose(results, expected, rtol=1e-6)


def test_version_polling_serves_the_newest_and_rolls_back_when_it_is_removed(tmp_path):
    """TF Serving's "latest" policy, with a stand-in loader: a new version directory is served and
    the older retired; removing the served one's directory serves the newest left again; a
    version that fails to load is listed with its error and never tried again."""
    loads = []

    def load(version, path):
        loads.append(version)
        if os.path.exists(os.path.join(path, "broken")):
            raise ValueError("cannot load")
        return rest.Servable(version, None, lambda _s, inputs, v=version: {"v": v})

    def make(version, broken=False):
        os.makedirs(tmp_path / str(version))
        if broken:
            (tmp_path / str(version) / "broken").write_text("")
        (tmp_path / str(version) / "saved_model.pb").write_text("")

    make(1)
    versions = rest.Versions([load(1, str(tmp_path / "1"))])
    stop = threading.Event()
    poller = threading.Thread(target=serve.poll_versions,
                              args=(str(tmp_path), versions, load, 0.05, stop), daemon=True)
    poller.start()

    def served_soon(version):
        deadline = time.monotonic() + 20
        while sorted(versions.loaded()) != [version]:
            assert time.monotonic() < deadline, (sorted(versions.loaded()), versions.status())
            time.sleep(0.02)

    try:
        make(2)
        served_soon(2)
        shutil.rmtree(tmp_path / "2")                  # a rollback: version 1 again
        served_soon(1)
        make(3, broken=True)
        deadline = time.monotonic() + 20
        while not versions.failed(3):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
        assert sorted(versions.loaded()) == [1] and loads.count(3) == 1
        assert [r for r in versions.status() if r["version"] == "3"][0]["status"][
            "error_message"] == "ValueError: cannot load"
    finally:
        stop.set()
        poller.join(10)
    assert loads == [1, 2, 1, 3]
