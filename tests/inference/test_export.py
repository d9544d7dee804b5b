"""Sharded export for scale-out inference (issue 20, item 1): main + sparse-shard SavedModels.

A trained DLRM and a functional Keras model (int64 and string keys, all combiners) are exported
under plans of several strategies and shard counts (tables split row-wise among them), served by
the in-process reference router and compared with the single-process model.
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tfra_dynamic_embedding import inference, placement
from tfra_dynamic_embedding.demo import dlrm
from tfra_dynamic_embedding.inference import manifest as manifest_lib
from tfra_dynamic_embedding.inference import routing

TOL = 1e-6
NUM_CATEGORICAL = 4
DIM = 4
# DLRM tables: C1 ~256 keys x 16 B (4 KiB), the others ~20 keys (320 B): shards of 3 KiB (2 shards)
# or 2.5 KiB (4 shards) force capacity-aware strategies to split C1 row-wise.
MEMORY = {1: None, 2: "3KiB", 4: "2560B"}


def _dlrm_batch(rng, rows, big=10 ** 12, small=10):
    ids = np.concatenate([rng.integers(-big, big, size=(rows, 1)),
                          rng.integers(-small, small, size=(rows, NUM_CATEGORICAL - 1))], axis=1)
    return {"dense": rng.normal(size=(rows, 3)).astype(np.float32), "ids": ids.astype(np.int64)}


@pytest.fixture(name="trained_dlrm", scope="module")
def fixture_trained_dlrm():
    rng = np.random.default_rng(7)
    model = dlrm.DLRM(num_dense=3, num_categorical=NUM_CATEGORICAL, embedding_dim=DIM,
                      bottom=(8,), top=(8,))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01)),
                  loss="binary_crossentropy")
    train = _dlrm_batch(rng, 256)
    model.fit(train, rng.integers(0, 2, size=(256, 1)).astype(np.float32), batch_size=64,
              epochs=1, verbose=0)
    # The single-process export's model: the same tables in stock hash tables, unseen ids -> 0.
    reference = model.clone(kv_creator=de.BuiltinKVCreator(), initializer=0.0)
    dlrm.build(reference)
    for source, target in zip(model.embeddings, reference.embeddings):
        target.params.upsert(*source.params.export())
    for source, target in zip(model.dense_layers(), reference.dense_layers()):
        target.set_weights(source.get_weights())
    trained = {k: v[:64] for k, v in train.items()}
    unseen = _dlrm_batch(rng, 48)
    unseen["ids"][::2] += 3 * 10 ** 12          # never trained (some rows mix both kinds)
    unseen["ids"][1::4, 1:] = train["ids"][1:48:4, 1:]
    return model, reference, {"trained": trained, "unseen": unseen}


def _functional_model(initializer=0.0):
    user = keras.Input(shape=(), dtype="int64", name="user")
    tags = keras.Input(shape=(3,), dtype="string", name="tags")
    items = keras.Input(shape=(2,), dtype="int64", name="items")
    x = keras.Input(shape=(2,), name="x")
    e_user = de.keras.layers.Embedding(DIM, initializer=initializer, name="user_emb")(user)
    e_tags = de.keras.layers.Embedding(DIM, key_dtype=tf.string, pooling="mean",
                                       initializer=initializer, name="tag_emb")(tags)
    e_items = de.keras.layers.Embedding(DIM, pooling="sqrtn", initializer=initializer,
                                        name="item_emb")(items)
    hidden = keras.layers.Dense(8, activation="relu")(
        keras.layers.Concatenate()([e_user, e_tags, e_items, x]))
    out = keras.layers.Dense(1, activation="sigmoid")(hidden)
    return keras.Model({"user": user, "tags": tags, "items": items, "x": x}, out)


def _tensors(batch):
    return {k: tf.constant(v) for k, v in batch.items()}


def _functional_batch(rng, rows, offset=0):
    words = np.array([f"w{i + offset}".encode() for i in range(30)])
    return {"user": rng.integers(-50, 50, size=(rows,)).astype(np.int64) + offset,
            "tags": words[rng.integers(0, 30, size=(rows, 3))],
            "items": rng.integers(0, 40, size=(rows, 2)).astype(np.int64) + offset,
            "x": rng.normal(size=(rows, 2)).astype(np.float32)}


@pytest.fixture(name="trained_functional", scope="module")
def fixture_trained_functional():
    rng = np.random.default_rng(3)
    # Zero initial rows: unseen ids embed as zeros in the trained model too (the export's rule).
    model = _functional_model(initializer=0.0)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)),
                  loss="binary_crossentropy")
    train = _functional_batch(rng, 128)
    labels = rng.integers(0, 2, size=(128, 1)).astype(np.float32)
    model.fit(tf.data.Dataset.from_tensor_slices((_tensors(train), labels)).batch(32), epochs=1,
              verbose=0)
    unseen = _functional_batch(rng, 24, offset=1000)
    unseen["tags"][:, 0] = train["tags"][:24, 1]    # cells mixing trained and unseen ids
    unseen["items"][::2, 1] = train["items"][:24:2, 0]
    unseen["user"][::3] = train["user"][:24:3]
    return model, {"trained": {k: v[:40] for k, v in train.items()}, "unseen": unseen}


def _check_shard_rows(sharded, model_tables):
    """Every shard holds exactly the keys of its pieces: key rule, counts, no key twice."""
    manifest = sharded.manifest
    for feature in manifest.features:
        keys = model_tables[feature.name]
        slices = manifest_lib.slice_of(keys, len(feature.pieces), feature.key_dtype)
        total = 0
        for piece in feature.pieces:
            held = sharded.table_keys(piece.shard)[piece.key]
            expected = keys[slices == piece.index]
            assert sorted(held.tolist()) == sorted(expected.tolist()), piece.key
            assert sharded.table_sizes(piece.shard)[piece.key] == piece.num_keys == len(expected)
            total += len(held)
        assert total == len(keys)


def _export_and_compare(model, plan, export_dir, batches, reference):
    manifest = inference.export_sharded(model, plan, export_dir)
    assert sorted(os.listdir(export_dir)) == sorted(
        ["main", "manifest.json"] + list(manifest.shards))
    for feature in manifest.features:
        assert [p.device for p in feature.pieces] == plan.devices_for(feature.table)
    sharded = inference.load_sharded(export_dir)
    for name, batch in batches.items():
        before = dict(sharded.calls)
        served = sharded.predict(batch)["prediction"]
        expected = reference(batch)
        assert served.shape == expected.shape
        diff = float(np.max(np.abs(served - expected)))
        assert diff <= TOL, (name, plan.strategy, diff)
        # One call per shard (and one of main) per request.
        assert all(sharded.calls[k] == before[k] + 1 for k in before)
    return manifest, sharded


@pytest.mark.parametrize("num_shards", [1, 2, 4])
@pytest.mark.parametrize("strategy", ["capacity-balanced", "lookup-greedy"])
def test_dlrm_sharded_equals_single_process(trained_dlrm, tmp_path, strategy, num_shards):
    model, reference, batches = trained_dlrm
    plan = inference.plan_for_model(model, num_shards, strategy, memory=MEMORY[num_shards])
    assert plan.strategy == strategy
    manifest, sharded = _export_and_compare(model, plan, str(tmp_path / "export"), batches,
                                            lambda b: reference(b).numpy())
    if num_shards > 1:   # the memory limit split the big table row-wise over shards
        assert len(manifest.feature("C1").pieces) >= 2
        assert len({p.shard for p in manifest.feature("C1").pieces}) >= 2
    assert len(manifest.shards) == len({d for f in manifest.features for d in
                                        plan.devices_for(f.table)})
    np.testing.assert_allclose(sharded.predict(batches["trained"])["prediction"],
                               model(batches["trained"]).numpy(), atol=TOL, rtol=0)
    tables = {layer.name: layer.params.export()[0].numpy() for layer in model.embeddings}
    _check_shard_rows(sharded, tables)


def _hand_plan(tables, devices, assignment, strategy="by-hand"):
    task = placement.Task(tables, placement.types.make_devices(devices,
                                                               template="/job:sparse/task:{i}"))
    return placement.Plan(task, assignment, strategy=strategy)


def test_dlrm_every_table_split(trained_dlrm, tmp_path):
    model, reference, batches = trained_dlrm
    specs = [placement.TableSpec(layer.params.name, 300, DIM) for layer in model.embeddings]
    d = [f"/job:sparse/task:{i}" for i in range(4)]
    plan = _hand_plan(specs, 4, {"C1": d, "C2": [d[2], d[0]], "C3": [d[1], d[3], d[0]],
                                 "C4": [d[3]]})
    manifest, sharded = _export_and_compare(model, plan, str(tmp_path / "export"), batches,
                                            lambda b: reference(b).numpy())
    assert [len(f.pieces) for f in manifest.features] == [4, 2, 3, 1]
    _check_shard_rows(sharded, {layer.name: layer.params.export()[0].numpy()
                                for layer in model.embeddings})


@pytest.mark.parametrize("num_shards,strategy", [(1, "size-greedy"), (2, "lookup-greedy"),
                                                 (4, "capacity-balanced")])
def test_functional_sharded_equals_model(trained_functional, tmp_path, num_shards, strategy):
    model, batches = trained_functional
    plan = inference.plan_for_model(model, num_shards, strategy)
    manifest, sharded = _export_and_compare(model, plan, str(tmp_path / "export"), batches,
                                            lambda b: model(_tensors(b)).numpy())
    assert {f.name: (f.key_dtype, f.combiner) for f in manifest.features} == {
        "user_emb": ("int64", None), "tag_emb": ("string", "mean"),
        "item_emb": ("int64", "sqrtn")}
    assert sorted(manifest.main_inputs) == ["x"]
    _check_shard_rows(sharded, {layer.name: layer.params.export()[0].numpy()
                                for layer in model.layers
                                if isinstance(layer, de.keras.layers.Embedding)})


def test_functional_string_table_split(trained_functional, tmp_path):
    model, batches = trained_functional
    specs = [placement.TableSpec(name, 100, DIM) for name in ("user_emb", "tag_emb", "item_emb")]
    d = [f"/job:sparse/task:{i}" for i in range(3)]
    plan = _hand_plan(specs, 3, {"user_emb": [d[1], d[2]], "tag_emb": d, "item_emb": [d[0]]})
    manifest, sharded = _export_and_compare(model, plan, str(tmp_path / "export"), batches,
                                            lambda b: model(_tensors(b)).numpy())
    assert all(p.num_keys > 0 for p in manifest.feature("tag_emb").pieces)
    # The pooled rows of unseen ids are zeros: a request of unseen ids pools to zeros.
    unseen = {k: v.copy() for k, v in batches["unseen"].items()}
    unseen["tags"] = np.full_like(unseen["tags"], b"never-seen")
    unseen["user"] = unseen["user"] + 10 ** 9
    _, pooled = sharded.pooled(unseen)
    assert not pooled["tag_emb"].any() and not pooled["user_emb"].any()


def test_row_split_rule_is_the_training_partitioner():
    ints = np.array([-7, -1, 0, 1, 5, 2 ** 62, -(2 ** 63)], np.int64)
    strings = np.array([b"", b"a", b"user:17", "é".encode()])
    for n in (1, 2, 3, 5):
        np.testing.assert_array_equal(manifest_lib.slice_of(ints, n, "int64"),
                                      de.default_partition_fn(tf.constant(ints), n).numpy())
        np.testing.assert_array_equal(manifest_lib.slice_of(strings, n, "string"),
                                      de.default_partition_fn(tf.constant(strings), n).numpy())


def test_routing_groups_ids_per_shard():
    piece = manifest_lib.Piece
    feature = manifest_lib.Feature(
        "f", "t", "ids", None, "mean", "int64", "float32", 2,
        [piece("t0_t_s0", 0, 2, "shard_0", "/a"), piece("t0_t_s1", 1, 2, "shard_1", "/b")])
    manifest = manifest_lib.Manifest([feature], {}, ["prediction"],
                                     {"shard_0": "/a", "shard_1": "/b"})
    routed = routing.route(manifest, {"ids": np.array([[4, 5, -3], [6, 8, 1]])})
    shard_0 = routed.shard_inputs["shard_0"]
    np.testing.assert_array_equal(shard_0["t0_t_s0_ids"], [4, 6, 8])
    np.testing.assert_array_equal(shard_0["t0_t_s0_segments"], [0, 1, 1])
    assert shard_0["t0_t_s0_num_segments"] == 2
    np.testing.assert_array_equal(routed.shard_inputs["shard_1"]["t0_t_s1_ids"], [5, -3, 1])
    pooled = routing.combine(manifest, routed, {
        "shard_0": {"t0_t_s0": np.array([[1.0, 2.0], [3.0, 3.0]], np.float32)},
        "shard_1": {"t0_t_s1": np.array([[2.0, 4.0], [0.0, 3.0]], np.float32)}})
    np.testing.assert_allclose(pooled["f"], [[1.0, 2.0], [1.0, 2.0]])


_FRESH = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    out = {}
    for name in sys.argv[2].split(","):
        inputs = np.load(f"{sys.argv[1]}/{name}.npz", allow_pickle=False)
        loaded = tf.saved_model.load(f"{sys.argv[1]}/{name}")
        result = loaded.signatures["serving_default"](**{k: tf.constant(inputs[k])
                                                        for k in inputs.files})
        out[name] = {k: v.numpy().tolist() for k, v in result.items()}
        sizes = loaded.signatures.get("table_sizes")
        if sizes is not None:
            out[name + ":sizes"] = {k: int(v) for k, v in sizes().items()}
    leaked = [m for m in sys.modules if m.startswith(("tfra_dynamic_embedding",
                                                      "tensorflow_recommenders_addons"))]
    print(json.dumps({"out": out, "leaked": leaked}))
""")


def _serve_fresh(export_dir, sharded, request):
    """Runs main and every shard in a new Python with plain TensorFlow (never this package)."""
    routed, pooled = sharded.pooled(request)
    calls = dict(routed.shard_inputs)
    calls["main"] = routing.main_inputs(sharded.manifest, routed, pooled)
    for name, inputs in calls.items():
        np.savez(os.path.join(export_dir, f"{name}.npz"), **inputs)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH="")
    result = subprocess.run([sys.executable, "-c", _FRESH, export_dir, ",".join(calls)],
                            capture_output=True, text=True, env=env, cwd="/", timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["leaked"] == []
    for name, inputs in calls.items():
        expected = (sharded.call_main(inputs) if name == "main"
                    else sharded.call_shard(name, inputs))
        for key, value in expected.items():
            np.testing.assert_allclose(np.asarray(answer["out"][name][key]), value, atol=0)
        if name != "main":
            assert answer["out"][name + ":sizes"] == sharded.table_sizes(name)
    return answer


@pytest.mark.parametrize("which", ["dlrm", "functional"])
def test_savedmodels_load_in_plain_tensorflow(trained_dlrm, trained_functional, tmp_path,
                                              which):
    if which == "dlrm":
        model, batch = trained_dlrm[0], trained_dlrm[2]["unseen"]
        plan = inference.plan_for_model(model, 4, "capacity-balanced", memory=MEMORY[4])
    else:
        model, batch = trained_functional[0], trained_functional[1]["unseen"]
        specs = [placement.TableSpec(n, 100, DIM) for n in ("user_emb", "tag_emb", "item_emb")]
        d = ["/job:sparse/task:0", "/job:sparse/task:1"]
        plan = _hand_plan(specs, 2, {"user_emb": [d[1]], "tag_emb": d, "item_emb": [d[0]]})
    export_dir = str(tmp_path / "export")
    inference.export_sharded(model, plan, export_dir)
    answer = _serve_fresh(export_dir, inference.load_sharded(export_dir), batch)
    assert len(answer["out"]) >= 3


# -- bad input -------------------------------------------------------------------------------
def test_bad_arguments_are_named(trained_dlrm, tmp_path):
    model = trained_dlrm[0]
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        inference.plan_for_model(model, 2, "nope")
    specs = [placement.TableSpec(f"C{i + 1}", 10, DIM) for i in range(NUM_CATEGORICAL - 1)]
    partial = _hand_plan(specs, 1, {s.name: ["/job:sparse/task:0"] for s in specs})
    with pytest.raises(ValueError, match="plan does not place the table 'C4'"):
        inference.export_sharded(model, partial, str(tmp_path / "a"))
    wrong_dim = _hand_plan([placement.TableSpec(f"C{i + 1}", 10, DIM + 1)
                            for i in range(NUM_CATEGORICAL)], 1,
                           {f"C{i + 1}": ["/job:sparse/task:0"] for i in range(NUM_CATEGORICAL)})
    with pytest.raises(ValueError, match="dim 5 but layer 'C1' has dim 4"):
        inference.export_sharded(model, wrong_dim, str(tmp_path / "b"))
    with pytest.raises(TypeError, match="plan must be a placement.Plan"):
        inference.export_sharded(model, {"C1": "/job:sparse/task:0"}, str(tmp_path / "c"))
    plan = inference.plan_for_model(model, 1)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="export_dir .* is not empty"):
        inference.export_sharded(model, plan, str(tmp_path / "full"))
    assert not os.path.exists(tmp_path / "a")   # nothing written for a rejected plan
    with pytest.raises(ValueError, match="has no manifest.json"):
        inference.load_sharded(str(tmp_path / "full"))


class TwoTower(keras.Model):
    """A subclassed model as TFRA users write them: dict features, tables looked up in call."""

    def __init__(self, initializer=0.0, keras_name="keras"):
        super().__init__()
        self.user = de.keras.layers.Embedding(DIM, initializer=initializer, name="user_emb",
                                              keras=keras_name)
        self.genres = de.keras.layers.Embedding(DIM, pooling="mean", initializer=initializer,
                                                name="genre_emb", keras=keras_name)
        self.slots = de.keras.layers.Embedding(DIM, key_dtype=tf.string, initializer=initializer,
                                               name="slot_emb", keras=keras_name)
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(1, activation="sigmoid")

    def call(self, features, training=False):
        user = self.user(features["user_id"])                       # [B, d]
        genres = self.genres(tf.cast(features["genres"], tf.int64))  # int32 ids, pooled
        slot = self.slots(features["slots"][:, -1])                  # last column only
        x = tf.concat([user, genres, slot, features["age"]], axis=1)
        return self.out(self.hidden(x))


TWO_TOWER_SIGNATURE = {
    "user_id": tf.TensorSpec([None], tf.int64, name="user_id"),
    "genres": tf.TensorSpec([None, 3], tf.int32, name="genres"),
    "slots": tf.TensorSpec([None, 2], tf.string, name="slots"),
    "age": tf.TensorSpec([None, 1], tf.float32, name="age"),
}


def _two_tower_batch(rng, rows, offset=0):
    words = np.array([f"s{i + offset}".encode() for i in range(12)])
    return {"user_id": rng.integers(0, 60, size=(rows,)).astype(np.int64) + offset,
            "genres": rng.integers(0, 20, size=(rows, 3)).astype(np.int32) + offset,
            "slots": words[rng.integers(0, 12, size=(rows, 2))],
            "age": rng.normal(size=(rows, 1)).astype(np.float32)}


@pytest.mark.parametrize("num_shards", [1, 3])
def test_subclassed_model_sharded_equals_model(tmp_path, num_shards):
    rng = np.random.default_rng(11)
    model = TwoTower()
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)),
                  loss="binary_crossentropy")
    train = _two_tower_batch(rng, 96)
    model.fit(tf.data.Dataset.from_tensor_slices(
        (_tensors(train), rng.integers(0, 2, size=(96, 1)).astype(np.float32))).batch(32),
        epochs=1, verbose=0)
    with pytest.raises(ValueError, match="no known request signature; pass input_signature"):
        inference.plan_for_model(model, num_shards)
    plan = inference.plan_for_model(model, num_shards, "size-greedy",
                                    input_signature=TWO_TOWER_SIGNATURE)
    unseen = _two_tower_batch(rng, 20, offset=500)
    unseen["user_id"][::2] = train["user_id"][:20:2]
    manifest, _ = inference.export_sharded(
        model, plan, str(tmp_path / "export"), input_signature=TWO_TOWER_SIGNATURE), None
    sharded = inference.load_sharded(str(tmp_path / "export"))
    for batch in ({k: v[:32] for k, v in train.items()}, unseen):
        served = sharded.predict(batch)["prediction"]
        assert float(np.max(np.abs(served - model(_tensors(batch)).numpy()))) <= TOL
    by_name = {f.name: f for f in manifest.features}
    assert (by_name["user_emb"].input, by_name["user_emb"].column) == ("user_id", None)
    assert (by_name["genre_emb"].input, by_name["genre_emb"].combiner) == ("genres", "mean")
    assert (by_name["slot_emb"].input, by_name["slot_emb"].column) == ("slots", 1)
    assert list(manifest.main_inputs) == ["age"] and manifest.model == "TwoTower"


def test_tf_keras_subclassed_model_uses_its_recorded_spec(tmp_path):
    import tf_keras  # pylint: disable=import-outside-toplevel

    class Tower(tf_keras.Model):
        def __init__(self):
            super().__init__()
            self.emb = de.keras.layers.Embedding(DIM, pooling="sum", initializer=0.0,
                                                 name="ids_emb", keras="tf_keras")
            self.dense = tf_keras.layers.Dense(1)

        def call(self, ids):
            return self.dense(self.emb(ids))

    model = Tower()
    ids = np.array([[1, 2], [29, 300], [7, 7]], np.int64)
    model(tf.constant(ids))       # records the call's spec
    keys = np.arange(0, 30, dtype=np.int64)
    model.emb.params.upsert(tf.constant(keys), tf.constant(
        np.random.default_rng(2).normal(size=(30, DIM)).astype(np.float32)))
    plan = inference.plan_for_model(model, 2, "size-greedy")
    manifest = inference.export_sharded(model, plan, str(tmp_path / "export"))
    (name,) = manifest.request_inputs     # the name tf_keras recorded for the call's input
    assert manifest.request_inputs[name]["shape"] == [None, 2]
    assert manifest.model == "Tower" and manifest.main_inputs == {}
    served = inference.load_sharded(str(tmp_path / "export")).predict({name: ids})["prediction"]
    assert float(np.max(np.abs(served - model(tf.constant(ids)).numpy()))) <= TOL


def test_unsupported_models_are_named():
    ids = keras.Input(shape=(2,), dtype="int64", name="ids")
    shifted = keras.layers.Lambda(lambda t: t + 1)(ids)
    pooled = de.keras.layers.Embedding(DIM, pooling="sum", name="shifted_emb")(shifted)
    model = keras.Model(ids, keras.layers.Dense(1)(pooled))
    with pytest.raises(ValueError, match="layer 'shifted_emb' looks up ids computed inside the "
                                         "model .op .* of type AddV2"):
        inference.plan_for_model(model, 1)

    shared = de.keras.layers.Embedding(DIM, name="shared_emb")
    a = keras.Input(shape=(), dtype="int64", name="a")
    b = keras.Input(shape=(), dtype="int64", name="b")
    model = keras.Model([a, b], keras.layers.Add()([shared(a), shared(b)]))
    with pytest.raises(ValueError, match="layer .shared_emb. is called 2 times"):
        inference.plan_for_model(model, 1)

    class Hashing(keras.Model):
        def __init__(self):
            super().__init__()
            self.emb = de.keras.layers.Embedding(DIM, name="hashed_emb")

        def call(self, words):
            return self.emb(tf.strings.to_hash_bucket_fast(words, 100))

    with pytest.raises(ValueError, match="layer 'hashed_emb' looks up ids computed inside"):
        inference.plan_for_model(Hashing(), 1,
                                 input_signature=tf.TensorSpec([None], tf.string, name="w"))

    class Squashed(keras.Model):
        def __init__(self):
            super().__init__()
            self.emb = de.keras.layers.SquashedEmbedding(DIM, name="squashed")

        def call(self, ids):
            return self.emb(ids)

    with pytest.raises(ValueError, match="layer 'squashed': SquashedEmbedding"):
        inference.plan_for_model(Squashed(), 1,
                                 input_signature=tf.TensorSpec([None, 2], tf.int64))

    no_tables = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="calls no de.keras.layers.Embedding layer"):
        inference.plan_for_model(no_tables, 1)


DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                   "docs", "serving.md")


@pytest.mark.skipif(not os.path.exists(DOC), reason="docs/ is not in this test's runfiles")
def test_docs_example_prints_what_it_says(capsys, tmp_path):
    import re  # pylint: disable=import-outside-toplevel
    with open(DOC, encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    # The exporting example; the page's other Python block (TF Serving's client on a running
    # shard) is what test_serve.py's stock-client test runs.
    blocks = [block for block in blocks if "/tmp/inference_example" in block]
    assert len(blocks) == 1
    code = blocks[0].replace("/tmp/inference_example", str(tmp_path / "example"))
    exec(compile(code, "docs/serving.md", "exec"), {})  # pylint: disable=exec-used
    assert capsys.readouterr().out.split() == ["True"]


def test_ids_input_that_also_feeds_dense_layers(tmp_path):
    ids = keras.Input(shape=(2,), dtype="int64", name="ids")
    pooled = de.keras.layers.Embedding(DIM, pooling="sum", initializer=0.0, name="ids_emb")(ids)
    as_float = keras.layers.Lambda(lambda t: tf.cast(t, "float32"), output_shape=(2,))(ids)
    model = keras.Model(ids, keras.layers.Dense(1)(
        keras.layers.Concatenate()([pooled, as_float])))
    layer = model.get_layer("ids_emb")
    keys = np.arange(-5, 15, dtype=np.int64)
    layer.params.upsert(tf.constant(keys), tf.constant(
        np.random.default_rng(0).normal(size=(len(keys), DIM)).astype(np.float32)))
    plan = _hand_plan([placement.TableSpec("ids_emb", 20, DIM)], 2,
                      {"ids_emb": ["/job:sparse/task:1", "/job:sparse/task:0"]})
    batch = {"ids": np.array([[1, 2], [-5, 40], [99, 100]], np.int64)}
    manifest, _ = _export_and_compare(model, plan, str(tmp_path / "export"), {"mixed": batch},
                                      lambda b: model(tf.constant(b["ids"])).numpy())
    assert list(manifest.main_inputs) == ["ids"]


def test_dlrm_concat_without_dense_inputs(tmp_path):
    model = dlrm.DLRM(num_dense=0, num_categorical=2, embedding_dim=DIM, top=(8,),
                      interaction="concat", initializer=0.0)
    dlrm.build(model)
    rng = np.random.default_rng(1)
    for layer in model.embeddings:
        keys = np.arange(-8, 8, dtype=np.int64)
        layer.params.upsert(tf.constant(keys),
                            tf.constant(rng.normal(size=(16, DIM)).astype(np.float32)))
    plan = inference.plan_for_model(model, 2, "size-greedy")
    batch = {"ids": np.array([[1, -3], [7, 100], [-8, 2]], np.int64)}
    manifest, _ = _export_and_compare(model, plan, str(tmp_path / "export"), {"mixed": batch},
                                      lambda b: model(b).numpy())
    assert manifest.main_inputs == {} and manifest.model == "DLRM"


def test_keys_at_the_dtype_edges_and_reserved_values(tmp_path):
    """A shard's index reserves values its piece does not hold: held edge keys and requests for
    the reserved values themselves still get the right rows (zeros for the unheld)."""
    low = np.iinfo(np.int64).min
    ids = keras.Input(shape=(), dtype="int64", name="ids")
    words = keras.Input(shape=(), dtype="string", name="words")
    e_ids = de.keras.layers.Embedding(DIM, initializer=0.0, name="ids_emb")(ids)
    e_words = de.keras.layers.Embedding(DIM, key_dtype=tf.string, initializer=0.0,
                                        name="words_emb")(words)
    model = keras.Model({"ids": ids, "words": words}, keras.layers.Concatenate()([e_ids, e_words]))
    rng = np.random.default_rng(5)
    held_ids = np.array([low, low + 1, low + 3, 5, np.iinfo(np.int64).max], np.int64)
    held_words = np.array([b"", b"a", b"\x00tfra-de reserved\x00"], object)
    for name, keys in (("ids_emb", held_ids), ("words_emb", held_words)):
        model.get_layer(name).params.upsert(tf.constant(keys), tf.constant(
            rng.normal(size=(len(keys), DIM)).astype(np.float32)))
    batch = {"ids": np.array([low, low + 1, low + 2, low + 3, low + 4, low + 5, 5, 6,
                              np.iinfo(np.int64).max], np.int64)}
    batch["words"] = np.array([b"", b"a", b"\x00tfra-de reserved\x00",
                               b"\x00tfra-de reserved\x00\x00", b"b", b"", b"a", b"\x00",
                               b"\x00tfra-de reserved\x00\x00\x00"], object)
    plan = inference.plan_for_model(model, 1)
    inference.export_sharded(model, plan, str(tmp_path / "export"))
    sharded = inference.load_sharded(str(tmp_path / "export"))
    served = sharded.predict(batch)["prediction"]
    expected = model({k: tf.constant(v) for k, v in batch.items()}).numpy()
    magnitude = np.abs(expected).sum(axis=1)
    assert magnitude[[0, 2, 3, 5, 8]].min() > 0 and magnitude[4] == 0   # held / none held
    np.testing.assert_array_equal(served, expected)
    assert sorted(sharded.table_keys("shard_0")[
        [f.pieces[0].key for f in sharded.manifest.features if f.name == "ids_emb"][0]]
                  .tolist()) == sorted(held_ids.tolist())
