"""Live deltas (inference/live_deltas.py): the exports of online training (online/delta.py)
applied to served shards in place. After a full export and deltas that change, add and remove
rows, the shards predict as the trained model does; a bad export stops the following and the
shard keeps serving; `tfra-de serve --watch` picks a new delta up while serving. Every process is
killed by pid at the end."""

import os
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
from tfra_dynamic_embedding import inference
from tfra_dynamic_embedding import placement
from tfra_dynamic_embedding.distributed.cluster import free_port
from tfra_dynamic_embedding.inference import live_deltas, serve
from tfra_dynamic_embedding.online import delta

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIM = 3


def _model(name):
    """user (int64) + tags (string, mean of 2) + x -> Dense; 40 users, 30 tags with rows."""
    user = keras.Input(shape=(), dtype="int64", name="user")
    tags = keras.Input(shape=(2,), dtype="string", name="tags")
    x = keras.Input(shape=(2,), name="x")
    user_emb = de.keras.layers.Embedding(DIM, initializer=0.0, name=f"{name}_user")
    tag_emb = de.keras.layers.Embedding(DIM, key_dtype=tf.string, pooling="mean",
                                        initializer=0.0, name=f"{name}_tag")
    hidden = keras.layers.Concatenate()([user_emb(user), tag_emb(tags), x])
    model = keras.Model({"user": user, "tags": tags, "x": x},
                        keras.layers.Dense(1, name="out")(hidden))
    rng = np.random.default_rng(3)
    user_emb.params.upsert(tf.range(40, dtype=tf.int64) * 7,
                           rng.normal(size=(40, DIM)).astype(np.float32))
    tag_emb.params.upsert(tf.constant([f"t{i}" for i in range(30)]),
                          rng.normal(size=(30, DIM)).astype(np.float32))
    return model, user_emb.params, tag_emb.params


def _split_plan(users, tags):
    """users split over 2 shards, tags over 3 (pieces of both on each)."""
    specs = [placement.TableSpec(v.name, 100, DIM) for v in (users, tags)]
    task = placement.Task(specs, placement.types.make_devices(
        3, template="/job:sparse/task:{i}"))
    d = [f"/job:sparse/task:{i}" for i in range(3)]
    return placement.Plan(task, {users.name: [d[1], d[0]], tags.name: d}, strategy="by-hand")


def _request(seed, rows=64):
    rng = np.random.default_rng(seed)
    return {"user": rng.integers(0, 60, rows) * 7,
            "tags": np.array([[f"t{a}", f"t{b}"] for a, b in rng.integers(0, 40, (rows, 2))]),
            "x": rng.normal(size=(rows, 2)).astype(np.float32)}


def _expected(model, request):
    return model({k: tf.constant(v) for k, v in request.items()}).numpy()


def _predicted(sharded, request):
    (value,) = sharded.predict(request).values()
    return value


def _train(users, tags, seed):
    """Changes rows of held ids, adds ids, removes ids: what online training does."""
    rng = np.random.default_rng(seed)
    users.upsert(tf.constant([0, 7, 14, 40 * 7 + seed * 7], tf.int64),
                 tf.constant(rng.normal(size=(4, DIM)).astype(np.float32)))
    users.remove(tf.constant([21 + 7 * seed], tf.int64))
    tags.upsert(tf.constant(["t1", f"t{30 + seed}"]),
                tf.constant(rng.normal(size=(2, DIM)).astype(np.float32)))
    tags.remove(tf.constant([f"t{2 + seed}"]))


@pytest.fixture
def exported(tmp_path):
    model, users, tags = _model(f"live{len(os.listdir(tmp_path.parent))}")
    export_dir = str(tmp_path / "export")
    inference.export_sharded(model, _split_plan(users, tags), export_dir)
    return model, users, tags, export_dir, str(tmp_path / "deltas")


def _followers(sharded, directory):
    return {shard: live_deltas.DeltaFollower(sharded._loaded[shard],  # pylint: disable=protected-access
                                             sharded.manifest, shard, directory)
            for shard in sharded.manifest.shards}


def test_full_export_and_deltas_make_the_shards_predict_as_the_model(exported):
    model, users, tags, export_dir, directory = exported
    before = _request(1)
    sharded = inference.load_sharded(export_dir)
    np.testing.assert_allclose(_predicted(sharded, before), _expected(model, before),
                               rtol=1e-6, atol=1e-6)
    _train(users, tags, 1)                   # after the sharded export, before the full one
    exporter = delta.DeltaExporter([users, tags], directory)
    exporter.export()                        # 000000, full: replaces what the shards hold
    _train(users, tags, 2)
    info = exporter.export()                 # 000001
    assert (info.full, info.upserts, info.removals) == (False, 6, 2)
    followers = _followers(sharded, directory)
    stale = _predicted(sharded, _request(2))
    for follower in followers.values():
        assert [a.sequence for a in follower.catch_up()] == [0, 1]
        assert follower.catch_up() == [] and follower.error is None
    for seed in (2, 3):
        request = _request(seed)
        np.testing.assert_allclose(_predicted(sharded, request), _expected(model, request),
                                   rtol=1e-6, atol=1e-6)
    assert not np.allclose(stale, _predicted(sharded, _request(2)))
    # Every piece holds exactly its slice of the trained tables: removed ids are gone.
    held = {}
    for shard in sharded.manifest.shards:
        for key, keys in sharded.table_keys(shard).items():
            held[key] = sorted(keys.tolist())
    for feature in sharded.manifest.features:
        keys = (users if feature.table == users.name else tags).export()[0].numpy()
        for piece in feature.pieces:
            mine = inference.slice_of(keys, piece.num_slices, feature.key_dtype) == piece.index
            assert held[piece.key] == sorted(keys[mine].tolist()), piece.key
    every = sum((v for v in held.values()), [])
    assert 28 not in every and 35 not in every and b"t3" not in every   # removed by training


def test_a_bad_export_stops_the_following_and_the_shard_keeps_serving(exported):
    model, users, tags, export_dir, directory = exported
    exporter = delta.DeltaExporter([users, tags], directory)
    exporter.export()
    _train(users, tags, 1)
    exporter.export()
    broken = os.path.join(directory, "000002")
    os.makedirs(broken)
    with open(os.path.join(broken, f"{users.name}.shard0.tfrecord"), "wb") as f:
        f.write(b"not a TFRecord file")
    with open(os.path.join(broken, delta.DONE), "w", encoding="utf-8") as f:
        f.write("complete\n")
    lines = []
    sharded = inference.load_sharded(export_dir)
    follower = live_deltas.DeltaFollower(sharded._loaded["shard_0"], sharded.manifest,  # pylint: disable=protected-access
                                         "shard_0", directory, log=lines.append)
    assert [a.sequence for a in follower.catch_up()] == [0, 1]
    assert follower.sequence == 1 and "000002" in follower.error
    assert any("stopped at" in line and "000002" in line for line in lines)
    assert follower.catch_up() == [] and follower.sequence == 1    # stays stopped
    for other in set(sharded.manifest.shards) - {"shard_0"}:
        live_deltas.DeltaFollower(sharded._loaded[other], sharded.manifest, other,  # pylint: disable=protected-access
                                  directory).catch_up()
    request = _request(4)
    np.testing.assert_allclose(_predicted(sharded, request), _expected(model, request),
                               rtol=1e-6, atol=1e-6)


def test_bad_arguments_are_named(exported, tmp_path):
    _, _, _, export_dir, directory = exported
    sharded = inference.load_sharded(export_dir)
    loaded = sharded._loaded["shard_0"]  # pylint: disable=protected-access
    with pytest.raises(ValueError, match="poll_seconds"):
        live_deltas.DeltaFollower(loaded, sharded.manifest, "shard_0", directory, poll_seconds=0)
    with pytest.raises(ValueError, match="shard_9"):
        live_deltas.DeltaFollower(loaded, sharded.manifest, "shard_9", directory)
    plain = tf.Module()
    plain.f = tf.function(lambda: tf.constant(1), input_signature=[])
    tf.saved_model.save(plain, str(tmp_path / "old"), signatures={"serving_default": plain.f})
    with pytest.raises(ValueError, match="apply_delta.*export it again"):
        live_deltas.DeltaFollower(tf.saved_model.load(str(tmp_path / "old")),
                                  sharded.manifest, "shard_0", directory)


def _instances(request):
    return [{"user": int(request["user"][i]), "tags": request["tags"][i].tolist(),
             "x": request["x"][i].tolist()} for i in range(len(request["user"]))]


def test_serve_watch_applies_a_new_delta_while_serving(exported, tmp_path):
    model, users, tags, export_dir, directory = exported
    exporter = delta.DeltaExporter([users, tags], directory)
    exporter.export()
    _train(users, tags, 1)
    exporter.export()                        # replayed by every shard before it answers
    port = free_port()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
        p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p))
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-m", "tfra_dynamic_embedding.cli", "serve", export_dir,
             "--port", str(port), "--model-name", "m", "--watch", directory,
             "--poll-seconds", "0.2", "--log-dir", str(tmp_path / "logs")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    url = f"http://localhost:{port}/v1/models/m:predict"
    try:
        deadline = time.monotonic() + 180
        while serve.READY not in log_path.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, \
                log_path.read_text(errors="replace")[-3000:]
            time.sleep(0.1)

        def served(request):
            answer = requests.post(url, json={"instances": _instances(request)}, timeout=60)
            assert answer.status_code == 200, answer.text
            return np.array(answer.json()["predictions"], np.float32).reshape(-1, 1)

        request = _request(5)
        np.testing.assert_allclose(served(request), _expected(model, request), atol=1e-5)
        _train(users, tags, 2)
        exporter.export()                    # 000002, while serving
        done_at = time.monotonic()
        while not np.allclose(served(request), _expected(model, request), atol=1e-5):
            assert time.monotonic() - done_at < 30, "the delta was not applied within 30 s"
            time.sleep(0.1)
        logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").iterdir())
        assert logs.count("applied delta") == 2 * 3 and "stopped" not in logs
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
