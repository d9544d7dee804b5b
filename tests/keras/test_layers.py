"""de.keras.layers.Embedding: lookups, model.fit, saving, serving, and the tf_keras variant."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _filled_layer(dim=3, pooling=None, vocab=20, **kwargs):
    layer = de.keras.layers.Embedding(dim, pooling=pooling, initializer=0.0, **kwargs)
    table = np.arange(vocab * dim, dtype=np.float32).reshape(vocab, dim) / 10
    layer.params.upsert(tf.range(vocab, dtype=tf.int64), table)
    return layer, table


@pytest.mark.parametrize("shape", [[5], [2, 3], [2, 2, 2]])
def test_dense_ids_of_any_shape(shape):
    layer, table = _filled_layer()
    ids = np.random.default_rng(0).integers(0, 20, size=shape)
    np.testing.assert_allclose(layer(tf.constant(ids, tf.int64)).numpy(), table[ids], rtol=1e-6)
    # int32 ids are cast to the int64 key dtype
    np.testing.assert_allclose(layer(tf.constant(ids, tf.int32)).numpy(), table[ids], rtol=1e-6)


@pytest.mark.parametrize("pooling", ["sum", "mean", "sqrtn"])
def test_pooling_on_dense_ragged_and_sparse_ids(pooling):
    layer, table = _filled_layer(pooling=pooling)
    scale = {"sum": lambda n: 1.0, "mean": lambda n: n, "sqrtn": np.sqrt}[pooling]
    rows = [[1, 2, 3], [4, 4], [7]]
    want = np.stack([table[r].sum(0) / scale(len(r)) for r in rows])
    ragged = tf.ragged.constant(rows, dtype=tf.int64)
    np.testing.assert_allclose(layer(ragged).numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(layer(ragged.to_sparse()).numpy(), want, rtol=1e-6)
    dense = tf.constant([[1, 2, 3], [4, 4, 7]], tf.int64)
    want_dense = np.stack([table[r].sum(0) / scale(3) for r in [[1, 2, 3], [4, 4, 7]]])
    np.testing.assert_allclose(layer(dense).numpy(), want_dense, rtol=1e-6)


def test_string_ids_and_bad_pooling():
    layer = de.keras.layers.Embedding(2, key_dtype=tf.string, initializer=1.5)
    out = layer(tf.constant([["a", "b"], ["c", "a"]]))
    np.testing.assert_array_equal(out.numpy(), np.full([2, 2, 2], 1.5))
    with pytest.raises(ValueError, match="pooling.*'max'"):
        de.keras.layers.Embedding(2, pooling="max")
    # A fraction is not a size (int() would drop it); "8" and 8.0 are TFRA's convertible ints.
    with pytest.raises(ValueError, match="embedding_size must be a whole number; got 2.5"):
        de.keras.layers.Embedding(2.5)
    with pytest.raises(ValueError, match="nslots must be a whole number; got 3.5"):
        de.keras.layers.FieldWiseEmbedding(2, 3.5, slot_map_fn=lambda x: x % 3)
    assert de.keras.layers.Embedding("8", name="str_size").embedding_size == 8
    assert de.keras.layers.Embedding(8.0, name="float_size").embedding_size == 8


def _ctr_data(n=1024, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50, size=(n, 2))
    # learnable by a sum of per-id terms (an XOR of the two ids' properties is not)
    labels = ((ids[:, 0] % 2 == 1) | (ids[:, 1] % 3 == 0)).astype(np.float32)[:, None]
    return ids, labels


def _model(layer):
    inputs = tf.keras.Input(shape=(2,), dtype=tf.int64)
    hidden = tf.keras.layers.Flatten()(layer(inputs))
    # a probability, so that binary cross-entropy is well defined (raw outputs were clipped)
    out = tf.keras.layers.Dense(1, kernel_initializer="ones", activation="sigmoid",
                                name="head")(hidden)
    return tf.keras.Model(inputs, out)


def test_fit_equals_dense_keras_embedding():
    ids, labels = _ctr_data(512)
    start = np.random.default_rng(1).normal(size=(50, 4)).astype(np.float32) * 0.1
    de_layer = de.keras.layers.Embedding(4, initializer=0.0, name="de_emb")
    de_layer.params.upsert(tf.range(50, dtype=tf.int64), start)
    dense_layer = tf.keras.layers.Embedding(50, 4, name="dense_emb",
                                            embeddings_initializer=tf.constant_initializer(start))
    models = []
    for layer, opt in [(de_layer, de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))),
                       (dense_layer, tf.keras.optimizers.SGD(0.1))]:
        model = _model(layer)
        model.compile(optimizer=opt, loss="mse")
        model.fit(ids, labels, batch_size=64, epochs=2, shuffle=False, verbose=0)
        models.append(model)
    got = de_layer.params.lookup(tf.range(50, dtype=tf.int64)).numpy()
    want = dense_layer.embeddings.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(models[0].get_layer("head").kernel.numpy(),
                               models[1].get_layer("head").kernel.numpy(), rtol=1e-5)


def test_fit_save_load_and_continue(tmp_path):
    ids, labels = _ctr_data()
    layer = de.keras.layers.Embedding(
        4, name="emb", initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=1))
    model = _model(layer)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)),
                  loss="binary_crossentropy")
    assert int(layer.params.size()) == 0
    untrained = model.evaluate(ids, labels, verbose=0)
    first = model.fit(ids, labels, batch_size=128, epochs=3, verbose=0).history["loss"]
    assert first[-1] < first[0]
    assert int(layer.params.size()) == len(np.unique(ids))  # one row per distinct id seen
    before = model.predict(ids[:32], verbose=0)
    assert int(layer.params.size()) == len(np.unique(ids))  # predict inserts nothing

    path = str(tmp_path / "model.weights.h5")
    model.save_weights(path)
    fresh_layer = de.keras.layers.Embedding(4, name="emb")
    fresh = _model(fresh_layer)
    fresh.load_weights(path)
    np.testing.assert_allclose(fresh.predict(ids[:32], verbose=0), before, rtol=1e-6)
    assert int(fresh_layer.params.size()) == len(np.unique(ids))

    # A second fit continues from the trained values, not from fresh rows.
    fresh.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.01)),
                  loss="binary_crossentropy")
    trained = model.evaluate(ids, labels, verbose=0)
    np.testing.assert_allclose(fresh.evaluate(ids, labels, verbose=0), trained, rtol=1e-5)
    assert trained < untrained
    fresh.fit(ids, labels, batch_size=128, epochs=1, verbose=0)
    assert fresh.evaluate(ids, labels, verbose=0) < untrained


def test_checkpoint_with_optimizer_and_stock_tf_serving(tmp_path):
    ids, labels = _ctr_data()
    layer = de.keras.layers.Embedding(4, name="emb", kv_creator=de.BuiltinKVCreator())
    model = _model(layer)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(0.1)),
                  loss="binary_crossentropy")
    model.fit(ids, labels, batch_size=128, epochs=1, verbose=0)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(
        str(tmp_path / "ckpt"))
    want = model.predict(ids[:16], verbose=0)

    restored = _model(de.keras.layers.Embedding(4, name="emb"))
    tf.train.Checkpoint(model=restored).restore(path).expect_partial()
    np.testing.assert_allclose(restored.predict(ids[:16], verbose=0), want, rtol=1e-6)

    export_dir = str(tmp_path / "serving")
    serve = tf.function(lambda x: {"score": model(x, training=False)},
                        input_signature=[tf.TensorSpec([None, 2], tf.int64)])
    tf.saved_model.save(model, export_dir, signatures={"serving_default": serve})
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        import tensorflow as tf
        fn = tf.saved_model.load({export_dir!r}).signatures["serving_default"]
        out = fn(x=tf.constant({ids[:16].tolist()}, tf.int64))["score"].numpy()
        assert "tfra_dynamic_embedding" not in sys.modules
        np.save({str(tmp_path / 'served.npy')!r}, out)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=""),
                            cwd=str(tmp_path), timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "served.npy"), want, rtol=1e-6)


@pytest.mark.parametrize("backend", ["native", "builtin"])
def test_keras_export_serves_the_trained_rows(tmp_path, backend):
    """Keras 3's `model.export()` keeps only the resources it finds under the model; the tables
    bring their variable along, so the SavedModel serves the trained rows (not fresh ones)."""
    ids, labels = _ctr_data()
    creator = de.BuiltinKVCreator() if backend == "builtin" else de.NativeKVCreator()
    layer = de.keras.layers.Embedding(4, name="emb", kv_creator=creator)
    model = _model(layer)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)),
                  loss="binary_crossentropy")
    model.fit(ids, labels, batch_size=128, epochs=1, verbose=0)
    want = model.predict(ids[:16], verbose=0)

    export_dir = str(tmp_path / "export")
    # Keras' own export (native tables stay native; the default serves stock copies:
    # tests/inference/test_export_command.py).
    model.export(export_dir, verbose=False,
                 **({} if backend == "builtin" else {"stock_tables": False}))
    served = tf.saved_model.load(export_dir).signatures["serving_default"]
    got = list(served(tf.constant(ids[:16], tf.int64)).values())[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # The rows are saved once, and the optimizer's slots (Adam's m and v) not at all.
    saved = dict(tf.train.list_variables(os.path.join(export_dir, "variables", "variables")))
    keys = [name for name in saved if name.endswith("/keys")]
    assert len(keys) == 1, sorted(saved)
    assert saved[keys[0]] == [len(np.unique(ids))]


def test_tf_keras_variant_trains_and_saves(tmp_path):
    """Under TF_USE_LEGACY_KERAS=1 the layer is a tf_keras layer and fits with tf_keras."""
    script = textwrap.dedent(f"""
        import numpy as np
        import tensorflow as tf
        import tf_keras
        import tensorflow_recommenders_addons.dynamic_embedding as de
        assert isinstance(de.keras.layers.Embedding(2), tf_keras.layers.Layer)
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 40, size=(512, 2))
        labels = (ids[:, :1] % 2).astype(np.float32)
        for opt in [tf_keras.optimizers.legacy.Adam(0.05), tf_keras.optimizers.Adam(0.05)]:
            layer = de.keras.layers.Embedding(4, name="emb")
            inputs = tf_keras.Input(shape=(2,), dtype=tf.int64)
            out = tf_keras.layers.Dense(1)(tf_keras.layers.Flatten()(layer(inputs)))
            model = tf_keras.Model(inputs, out)
            model.compile(optimizer=de.DynamicEmbeddingOptimizer(opt), loss="mse")
            loss = model.fit(ids, labels, batch_size=64, epochs=3, verbose=0).history["loss"]
            assert loss[-1] < loss[0], loss
            assert int(layer.params.size()) == len(np.unique(ids))
            want = model.predict(ids[:8], verbose=0)
            ckpt = tf.train.Checkpoint(model=model).save({str(tmp_path / "ck")!r})
            layer2 = de.keras.layers.Embedding(4, name="emb")
            inputs2 = tf_keras.Input(shape=(2,), dtype=tf.int64)
            model2 = tf_keras.Model(inputs2, tf_keras.layers.Dense(1)(
                tf_keras.layers.Flatten()(layer2(inputs2))))
            tf.train.Checkpoint(model=model2).restore(ckpt).expect_partial()
            np.testing.assert_allclose(model2.predict(ids[:8], verbose=0), want, rtol=1e-6)
        print("OK")
    """)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, timeout=600, check=False)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


@pytest.mark.parametrize("optimizer", ["SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Ftrl",
                                       "Adamax", "Nadam", "Lion"])
def test_fit_with_every_keras3_optimizer(optimizer):
    ids, labels = _ctr_data(512, seed=2)
    layer = de.keras.layers.Embedding(
        4, name="emb", initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=3))
    model = _model(layer)
    learning_rate = 0.005 if optimizer == "Lion" else 0.05
    opt = getattr(tf.keras.optimizers, optimizer)(learning_rate)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(opt), loss="binary_crossentropy")
    before = model.evaluate(ids, labels, verbose=0)
    model.fit(ids, labels, batch_size=64, epochs=3, verbose=0)
    assert model.evaluate(ids, labels, verbose=0) < before
    assert int(layer.params.size()) == len(np.unique(ids))
    slots = layer.params.get_slot_variables(model.optimizer)
    assert all(int(s.size()) == len(np.unique(ids)) for s in slots)
