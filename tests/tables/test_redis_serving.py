"""Serving from the Redis that training writes (docs/redis.md, "Serving from Redis"): a SavedModel
of a Redis-backed de.Variable holds no rows; a process that loads it reads them in Redis, so an id
trained after the export is served without a new export. The config file is resolved when the
SavedModel is loaded. Checked against a real redis-server, the serving side in a process of its
own (stock `tf.saved_model.load`), every served value against an in-memory native twin trained
alike."""

import json
import os
import select
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests import redis_server
from tfra_dynamic_embedding.tables import native
from tfra_dynamic_embedding.tables import redis as redis_tables

pytestmark = pytest.mark.skipif(
    not os.environ.get("CI") and not (redis_tables.is_available() and native.is_available()),
    reason="Redis or native op library not built (`make ops` with libhiredis-dev installed)")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPLY_TIMEOUT_S = 120.0

# The serving process: loads the SavedModel, then answers one JSON line of ids per request with
# the model's predictions (one JSON line), until stdin closes.
SERVER = r"""
import json, sys
import tensorflow as tf
import tensorflow_recommenders_addons.dynamic_embedding  # noqa: F401  (registers the ops)
model = tf.saved_model.load(sys.argv[1])
print(json.dumps("ready"), flush=True)
for line in sys.stdin:
    ids = tf.constant(json.loads(line), tf.int64)
    print(json.dumps(model.serve(ids).numpy().tolist()), flush=True)
"""


def write_config(path, port, tag):
    with open(path, "w") as f:
        json.dump({"redis_connection_mode": 2, "redis_host_ip": ["127.0.0.1"],
                   "redis_host_port": [port], "model_tag_runtime": tag,
                   "redis_connect_timeout": 2000, "redis_socket_timeout": 5000}, f)
    return path


class Model(tf.Module):
    """prediction(id) = <embedding(id), w>: the dense weight is fixed, so a served prediction
    changes only with the rows."""

    def __init__(self, var):
        super().__init__()
        self.var = var
        self.w = tf.Variable(tf.linspace(-1.0, 1.0, var.dim), trainable=False)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def serve(self, ids):
        return tf.reduce_sum(self.var.lookup(ids) * self.w, axis=-1)


def make_variable(name, kv_creator):
    # (de.Variable, not de.get_variable: a second variable of the same name, the same Redis
    # hash under another config, must not be the first one again.)
    return de.Variable(name=name, dim=4, kv_creator=kv_creator,
                       initializer=tf.keras.initializers.RandomNormal(0.0, 0.1, seed=5))


def train(models, ids, steps=3):
    """Adam steps on the same batches for every model (Redis-backed and native twin)."""
    labels = tf.constant(np.linspace(-1, 1, len(ids)), tf.float32)
    for model, opt in models:
        for _ in range(steps):
            with tf.GradientTape() as tape:
                emb = de.embedding_lookup(model.var, tf.constant(ids, tf.int64))
                loss = tf.reduce_mean((tf.reduce_sum(emb * model.w, -1) - labels) ** 2)
            grads = tape.gradient(loss, tape.watched_variables())
            opt.apply_gradients(zip(grads, tape.watched_variables()))


class Server:
    """The serving process (killed by pid when done)."""

    def __init__(self, export_dir, env=None):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, export_dir], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", **(env or {})))
        assert self._read() == "ready"

    def _read(self):
        ready, _, _ = select.select([self.proc.stdout], [], [], REPLY_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise AssertionError(f"the serving process did not answer: {self.proc.stderr.read()}")
        return json.loads(line)

    def predict(self, ids):
        self.proc.stdin.write(json.dumps([int(i) for i in ids]) + "\n")
        self.proc.stdin.flush()
        return np.array(self._read(), np.float32)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()


@pytest.fixture(scope="module")
def server():
    redis_server.require_redis()
    with redis_server.StandaloneRedis() as redis:
        yield redis


def test_served_predictions_follow_training_without_a_new_export(server, tmp_path):
    config = write_config(tmp_path / "redis.json", server.port, "serve1")
    creator = de.RedisTableCreator(de.RedisTableConfig(redis_config_abs_dir=str(config)))
    red, nat = Model(make_variable("serve_emb", creator)), Model(make_variable("serve_emb_n", None))
    red.var.clear()
    models = [(red, de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05))),
              (nat, de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)))]
    first, later = [1, 2, 3, 4], [3, 4, 50, 60]      # 50, 60: first trained after the export
    train(models, first)
    export_dir = str(tmp_path / "model")
    tf.saved_model.save(red, export_dir)
    rows_at_export = red.var.lookup(tf.constant(first, tf.int64)).numpy()
    query = np.array(first + [50, 60, 777], np.int64)   # 777: never trained (initializer row)
    serving = Server(export_dir)
    try:
        before = serving.predict(query)
        np.testing.assert_array_equal(before, nat.serve(tf.constant(query)).numpy())
        train(models, later)
        after = serving.predict(query)
        # The same loaded model now serves the rows trained after it was exported ...
        np.testing.assert_array_equal(after, nat.serve(tf.constant(query)).numpy())
        assert not np.array_equal(after[2:6], before[2:6])
        np.testing.assert_array_equal(after[:2], before[:2])    # rows not trained since
        # ... and loading it wrote nothing over them (the SavedModel holds no rows).
        assert not np.array_equal(red.var.lookup(tf.constant([3, 4], tf.int64)).numpy(),
                                  rows_at_export[2:])
    finally:
        serving.close()


def test_config_is_resolved_when_the_saved_model_is_loaded(server, tmp_path):
    """The export's config names one server and tag; at load TFRA_REDIS_CONFIG_PATH names
    another server and tag, whose rows are served."""
    config = write_config(tmp_path / "train.json", server.port, "serve_a")
    var = make_variable("moved_emb", de.RedisTableCreator(
        de.RedisTableConfig(redis_config_abs_dir=str(config))))
    var.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 4]))
    export_dir = str(tmp_path / "model")
    tf.saved_model.save(Model(var), export_dir)
    with redis_server.StandaloneRedis() as other:
        elsewhere = write_config(tmp_path / "serve.json", other.port, "serve_b")
        other_var = make_variable("moved_emb", de.RedisTableCreator(
            de.RedisTableConfig(redis_config_abs_dir=str(elsewhere))))
        rows = tf.constant([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
        other_var.upsert(tf.constant([1, 2], tf.int64), rows)
        serving = Server(export_dir, env={"TFRA_REDIS_CONFIG_PATH": str(elsewhere)})
        try:
            got = serving.predict([1, 2])
        finally:
            serving.close()
        w = tf.linspace(-1.0, 1.0, 4)
        np.testing.assert_allclose(got, tf.reduce_sum(rows * w, -1).numpy(), rtol=1e-6)
