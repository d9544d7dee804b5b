"""`tfra-de serve` (inference/serve.py): a sharded export served by separate processes -- sparse
shards as TF Serving gRPC PredictionServices (2 replicas each), the main shard behind TF
Serving's REST API. Predictions equal the single-process model; a dead replica is skipped, a dead
shard gives HTTP 503 naming it in bounded time, a restarted shard is used again. Every process is
killed by pid at the end."""

import os
import re
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import requests
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.inference.lines import wait_for_line
from tfra_dynamic_embedding import inference
from tfra_dynamic_embedding.distributed.cluster import free_port
from tfra_dynamic_embedding.inference import grpc_shards, serve

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
    """`tfra-de serve` as a subprocess, its shard processes' pids parsed from its output."""

    def __init__(self, export_dir, log_path):
        self.port = free_port()
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                [sys.executable, "-m", "tfra_dynamic_embedding.cli", "serve", export_dir,
                 "--port", str(self.port), "--replicas", "2", "--timeout", "2",
                 "--model-name", "m"], stdout=log, stderr=subprocess.STDOUT, env=ENV)
        deadline = time.monotonic() + 180
        while serve.READY not in self.log():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log()[-3000:]
            time.sleep(0.1)
        self.replicas = {(m[0], int(m[1])): (m[2], int(m[3])) for m in re.findall(
            r"(shard_\d+) replica (\d+) at (\S+) \(pid (\d+)\)", self.log())}
        self.url = f"http://localhost:{self.port}/v1/models/m:predict"

    def log(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def predict(self, request):
        return requests.post(self.url, json={"instances": _instances(request)}, timeout=60)


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
        served.proc.send_signal(signal.SIGTERM)
        try:
            served.proc.wait(30)
        except subprocess.TimeoutExpired:
            served.proc.kill()
            served.proc.wait()
        for proc in extra:
            proc.kill()
            proc.wait()
    # The serve process took its shard processes down with it.
    time.sleep(0.5)
    for _, pid in served.replicas.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
