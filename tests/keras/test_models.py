"""de.keras.models.save_model (TFRA's API): SavedModels of Keras 3 and tf_keras models."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A model's outputs computed by two graphs (predict, a SavedModel's signature, a reloaded model)
# differ by float32 rounding: outputs near zero need atol besides rtol (rtol=1e-6 alone failed
# on 2 of 16 outputs of ~0.03 in 4 of 10 runs). A wrong row moves outputs by >> 1e-5.


def _trained_model(backend="native", epochs=1, **layer_kwargs):
    model, layer, ids, labels = _model(backend, **layer_kwargs)
    model.fit(ids, labels, batch_size=64, epochs=epochs, verbose=0)
    return model, layer, ids, labels


def _model(backend="native", **layer_kwargs):
    """A compiled, untrained Keras 3 model over one Embedding layer, with its data."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 60, size=(512, 3))
    labels = (ids[:, :1] % 2).astype(np.float32)
    creator = de.BuiltinKVCreator() if backend == "builtin" else de.NativeKVCreator()
    layer = de.keras.layers.Embedding(4, name="emb", kv_creator=creator, **layer_kwargs)
    inputs = tf.keras.Input(shape=(3,), dtype=tf.int64)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(
        layer(inputs))))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)),
                  loss="mse")
    return model, layer, ids, labels


def _table(layer):
    """The layer's (keys, rows), sorted by key."""
    keys, rows = layer.params.export()
    order = np.argsort(keys.numpy())
    return keys.numpy()[order], rows.numpy()[order]


def _served(export_dir, ids):
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    return list(serve(tf.constant(ids, tf.int64)).values())[0].numpy()


def _saved_keys(export_dir):
    """Shapes of the `keys` tensors in the SavedModel's checkpoint (one per saved table)."""
    saved = tf.train.list_variables(os.path.join(export_dir, "variables", "variables"))
    return sorted(shape for name, shape in saved if name.endswith("/keys"))


def _run_tf_keras(script):
    """Runs `script` (source, dedented here) in a new process whose tf.keras is tf_keras; it
    must print OK."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                            text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("backend", ["native", "builtin"])
def test_keras3_model_serves_its_rows_with_and_without_the_optimizer(tmp_path, backend):
    model, layer, ids, _ = _trained_model(backend)
    want = model.predict(ids[:16], verbose=0)
    distinct = len(np.unique(ids))
    assert int(layer.params.size()) == distinct

    with_opt, without = str(tmp_path / "with"), str(tmp_path / "without")
    # The model as it is, as TFRA saves it (stock copies of the tables with stock_tables=True:
    # tests/inference/test_export_command.py).
    de.keras.models.save_model(model, with_opt)
    de.keras.models.save_model(model, without, include_optimizer=False)
    np.testing.assert_allclose(_served(with_opt, ids[:16]), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_served(without, ids[:16]), want, rtol=1e-5, atol=1e-6)
    assert _saved_keys(with_opt) == [[distinct]] * 3    # rows, Adam's m and v
    assert _saved_keys(without) == [[distinct]]         # rows only


def test_a_model_saved_again_after_training_serves_the_new_rows(tmp_path):
    """Online learning exports the same model again and again from one process."""
    model, _, ids, labels = _trained_model()
    first, second = str(tmp_path / "1"), str(tmp_path / "2")
    de.keras.models.save_model(model, first, include_optimizer=False)
    before = model.predict(ids[:16], verbose=0)
    model.fit(ids, labels, batch_size=64, epochs=1, verbose=0)
    after = model.predict(ids[:16], verbose=0)
    assert np.abs(after - before).max() > 1e-4
    de.keras.models.save_model(model, second, include_optimizer=False)
    tf.saved_model.save(model, str(tmp_path / "3"))     # and through TF itself
    np.testing.assert_allclose(_served(first, ids[:16]), before, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_served(second, ids[:16]), after, rtol=1e-5, atol=1e-6)


def test_bad_arguments(tmp_path):
    model, _, _, _ = _trained_model()
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(FileExistsError, match="overwrite"):
        de.keras.models.save_model(model, str(existing), overwrite=False)
    with pytest.raises(TypeError, match="options"):
        de.keras.models.save_model(model, str(tmp_path / "x"), options={"namespace": "TFRA"})
    with pytest.raises(TypeError, match="model"):
        de.keras.models.save_model(tf.Module(), str(tmp_path / "y"))

    class Subclassed(tf.keras.Model):
        def __init__(self):
            super().__init__()
            # Seeded: the SavedModel's stock ops draw the rows of ids the table does not hold
            # as the model's native kernel does (an unseeded draw has no stock-op form).
            self.emb = de.keras.layers.Embedding(
                2, name="sub_emb", initializer=tf.keras.initializers.RandomNormal(seed=3))

        def call(self, ids):
            return tf.reduce_sum(self.emb(ids), axis=1)

    sub = Subclassed()
    sub(tf.constant([[1, 2]], tf.int64))
    with pytest.raises(ValueError, match="signatures"):
        de.keras.models.save_model(sub, str(tmp_path / "z"), include_optimizer=False)
    # With a signature the subclassed model saves, and TFRA's namespace joins the options.
    options = tf.saved_model.SaveOptions(namespace_whitelist=["Mine"])
    serve = tf.function(lambda ids: {"sum": sub(ids)},
                        input_signature=[tf.TensorSpec([None, 2], tf.int64)])
    de.keras.models.save_model(sub, str(tmp_path / "z"), include_optimizer=False,
                               signatures={"serving_default": serve}, options=options)
    assert options.namespace_whitelist == ["Mine", "TFRA"]
    np.testing.assert_allclose(_served(str(tmp_path / "z"), [[1, 2]]),
                               sub(tf.constant([[1, 2]], tf.int64)).numpy(), rtol=1e-5, atol=1e-6)


def test_tf_keras_model_saves_and_loads_with_tf_keras(tmp_path):
    script = f"""
        import numpy as np
        import tensorflow as tf
        import tf_keras
        import tensorflow_recommenders_addons.dynamic_embedding as de
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 60, size=(512, 3))
        labels = (ids[:, :1] % 2).astype(np.float32)
        inputs = tf_keras.Input(shape=(3,), dtype=tf.int64)
        layer = de.keras.layers.Embedding(4, name="emb")
        model = tf_keras.Model(inputs, tf_keras.layers.Dense(1)(
            tf_keras.layers.Flatten()(layer(inputs))))
        model.compile(optimizer=de.DynamicEmbeddingOptimizer(
            tf_keras.optimizers.legacy.Adam(0.05)), loss="mse")
        model.fit(ids, labels, batch_size=64, epochs=1, verbose=0)
        want = model.predict(ids[:16], verbose=0)
        path = {str(tmp_path / "tf_keras")!r}
        de.keras.models.save_model(model, path)   # the model as it is (TFRA's default)
        serve = tf.saved_model.load(path).signatures["serving_default"]
        got = list(serve(tf.constant(ids[:16], tf.int64)).values())[0].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        loaded = tf_keras.models.load_model(path)
        np.testing.assert_allclose(loaded.predict(ids[:16], verbose=0), want, rtol=1e-5, atol=1e-6)
        # The legacy HDF5 format cannot hold the tables: it refuses instead of losing them.
        for save in (lambda p: model.save(p), lambda p: model.save_weights(p)):
            try:
                save({str(tmp_path / "legacy.h5")!r})
                raise AssertionError("a legacy .h5 save did not refuse")
            except ValueError as error:
                assert "legacy HDF5" in str(error) and "emb" in str(error), error
        model.save_weights({str(tmp_path / "model.weights.h5")!r})   # the new format holds them
        fresh_in = tf_keras.Input(shape=(3,), dtype=tf.int64)
        fresh = tf_keras.Model(fresh_in, tf_keras.layers.Dense(1)(tf_keras.layers.Flatten()(
            de.keras.layers.Embedding(4, name="emb")(fresh_in))))
        fresh.load_weights({str(tmp_path / "model.weights.h5")!r})
        np.testing.assert_allclose(fresh.predict(ids[:16], verbose=0), want, rtol=1e-5, atol=1e-6)
        # The optimizer comes back wrapped, so the loaded model trains on. (tf_keras restores
        # no optimizer state from a SavedModel, ours or its own: Adam starts over.)
        assert type(loaded.optimizer) is type(model.optimizer), type(loaded.optimizer).__mro__
        before = loaded.evaluate(ids, labels, verbose=0)
        loaded.fit(ids, labels, batch_size=64, epochs=2, verbose=0)
        assert loaded.evaluate(ids, labels, verbose=0) < before
        print("OK")
    """
    _run_tf_keras(script)


@pytest.mark.parametrize("backend", ["native", "builtin"])
def test_keras3_file_resumes_training_exactly(tmp_path, backend):
    """A `.keras` file loads without custom_objects, with the optimizer wrapped again and its
    slot tables restored: training on after loading equals training on without saving."""
    model, layer, ids, labels = _trained_model(backend)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = tf.keras.models.load_model(path)
    assert isinstance(loaded.optimizer, type(model.optimizer))
    assert int(loaded.get_layer("emb").params.size()) == int(layer.params.size())
    for m in (model, loaded):
        m.fit(ids, labels, batch_size=64, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(loaded.predict(ids[:32], verbose=0),
                               model.predict(ids[:32], verbose=0), rtol=1e-5, atol=1e-6)
    (keys, rows), (loaded_keys, loaded_rows) = _table(layer), _table(loaded.get_layer("emb"))
    np.testing.assert_array_equal(loaded_keys, keys)
    np.testing.assert_allclose(loaded_rows, rows, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["native", "builtin"])
def test_early_stopping_restores_the_tables_of_the_best_epoch(backend):
    """EarlyStopping(restore_best_weights=True) gives `get_weights()` of the best epoch back to
    `set_weights` at the end: the tables come back with the dense weights. (Mode "max" on a
    falling loss makes the first epoch the best.)"""
    model, layer, ids, labels = _model(backend)
    first = []
    record = tf.keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: first.append(
        (_table(layer), model.predict(ids[:32], verbose=0))) if epoch == 0 else None)
    stop = tf.keras.callbacks.EarlyStopping(monitor="loss", mode="max", patience=1,
                                            restore_best_weights=True)
    history = model.fit(ids, labels, batch_size=64, epochs=4, shuffle=False, verbose=0,
                        callbacks=[record, stop])
    assert len(history.history["loss"]) == 2          # stopped after the second epoch
    (keys, rows), predicted = first[0]
    got_keys, got_rows = _table(layer)
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got_rows, rows)
    np.testing.assert_array_equal(model.predict(ids[:32], verbose=0), predicted)


def test_set_weights_copies_the_tables_between_models():
    """`b.set_weights(a.get_weights())` makes b's tables a's (keys b had alone are gone), and
    the arrays keep the tables of when they were taken, as they keep the dense weights."""
    model, layer, ids, labels = _trained_model("native")
    other, other_layer, _, _ = _model("builtin")
    other.predict(ids[:4] + 1000, verbose=0)        # keys `model` has not
    weights = model.get_weights()
    want = model.predict(ids[:32], verbose=0)
    model.fit(ids, labels, batch_size=64, epochs=1, verbose=0)
    other.set_weights(weights)
    model.set_weights(weights)
    np.testing.assert_array_equal(_table(other_layer)[0], np.unique(ids))
    np.testing.assert_array_equal(_table(other_layer)[1], _table(layer)[1])
    for m in (other, model):
        np.testing.assert_allclose(m.predict(ids[:32], verbose=0), want, rtol=1e-5, atol=1e-6)


def test_tf_keras_saved_model_loads_in_a_new_process(tmp_path):
    """TFRA's demos save with `model.save(dir)` and load with `tf.keras.models.load_model(dir)`
    in another process, which imports the package but wraps no optimizer itself: the wrapped
    optimizer class is known to Keras from the import on (legacy and new tf_keras Adam apart)."""
    path, ids_file = str(tmp_path / "saved"), str(tmp_path / "ids.npy")
    _run_tf_keras(f"""
        import numpy as np
        import tensorflow as tf
        import tensorflow_recommenders_addons.dynamic_embedding as de
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 60, size=(512, 3))
        inputs = tf.keras.Input(shape=(3,), dtype=tf.int64)
        layer = de.keras.layers.Embedding(4, name="emb")
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(
            layer(inputs))))
        model.compile(optimizer=de.DynamicEmbeddingOptimizer(
            tf.keras.optimizers.legacy.Adam(0.05)), loss="mse")
        model.fit(ids, (ids[:, :1] % 2).astype(np.float32), batch_size=64, verbose=0)
        model.save({path!r}, options=tf.saved_model.SaveOptions(namespace_whitelist=["TFRA"]))
        np.save({ids_file!r}, np.concatenate([ids[:16], model.predict(ids[:16], verbose=0)], 1))
        print("OK")
    """)
    _run_tf_keras(f"""
        import numpy as np
        import tensorflow as tf
        import tensorflow_recommenders_addons.dynamic_embedding as de
        saved = np.load({ids_file!r})
        model = tf.keras.models.load_model({path!r})
        np.testing.assert_allclose(model.predict(saved[:, :3].astype(np.int64), verbose=0),
                                   saved[:, 3:], rtol=1e-5, atol=1e-6)
        assert isinstance(model.optimizer, tf.keras.optimizers.legacy.Adam)
        assert type(model.optimizer).__mro__[1].__name__ == "LegacyKerasMixin"
        new = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
        for opt in (model.optimizer, new):
            again = tf.keras.optimizers.deserialize(tf.keras.optimizers.serialize(opt),
                                                    use_legacy_optimizer=opt is not new)
            assert type(again) is type(opt), (type(again).__mro__, type(opt).__mro__)
        print("OK")
    """)


def test_best_weights_checkpoint_loads_into_a_fresh_model(tmp_path):
    """ModelCheckpoint(save_weights_only=True) then `load_weights` into a new compiled model
    (its optimizer not built yet: as Keras does for its own variables, the optimizer state is
    skipped with a warning, and the rows load)."""
    model, layer, ids, labels = _model()
    path = str(tmp_path / "best.weights.h5")
    model.fit(ids, labels, batch_size=64, epochs=2, verbose=0, validation_data=(ids, labels),
              callbacks=[tf.keras.callbacks.ModelCheckpoint(path, save_weights_only=True)])
    fresh, fresh_layer, _, _ = _model()
    with pytest.warns(UserWarning, match="Skipping variable loading for optimizer"):
        fresh.load_weights(path)
    np.testing.assert_array_equal(_table(fresh_layer)[1], _table(layer)[1])
    np.testing.assert_allclose(fresh.predict(ids[:32], verbose=0),
                               model.predict(ids[:32], verbose=0), rtol=1e-5, atol=1e-6)
    fresh.fit(ids, labels, batch_size=64, epochs=1, verbose=0)   # trains on from there


def test_tf_keras_early_stopping_restores_the_tables():
    """tf_keras' set_weights passes each array through np.asarray: the tables come back too."""
    script = """
        import numpy as np
        import tensorflow as tf
        import tf_keras
        import tensorflow_recommenders_addons.dynamic_embedding as de
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 60, size=(512, 3))
        labels = (ids[:, :1] % 2).astype(np.float32)
        inputs = tf_keras.Input(shape=(3,), dtype=tf.int64)
        layer = de.keras.layers.Embedding(4, name="emb")
        model = tf_keras.Model(inputs, tf_keras.layers.Dense(1)(
            tf_keras.layers.Flatten()(layer(inputs))))
        model.compile(optimizer=de.DynamicEmbeddingOptimizer(
            tf_keras.optimizers.legacy.Adam(0.05)), loss="mse")
        first = []
        def table():
            keys, rows = layer.params.export()
            return rows.numpy()[np.argsort(keys.numpy())]
        record = tf_keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: first.append(
            (table(), model.predict(ids[:32], verbose=0))) if epoch == 0 else None)
        stop = tf_keras.callbacks.EarlyStopping(monitor="loss", mode="max", patience=1,
                                                restore_best_weights=True)
        model.fit(ids, labels, batch_size=64, epochs=4, shuffle=False, verbose=0,
                  callbacks=[record, stop])
        np.testing.assert_array_equal(table(), first[0][0])
        np.testing.assert_array_equal(model.predict(ids[:32], verbose=0), first[0][1])
        print("OK")
    """
    _run_tf_keras(script)


def test_keras3_file_with_string_keys_resumes_training_exactly(tmp_path):
    """String keys (and their Adam slots) go into the `.keras` file as bytes plus lengths:
    Keras' H5 store takes numeric arrays only."""
    rng = np.random.default_rng(0)
    ids = tf.constant(np.array([[f"user-{i}" * (1 + i % 3) for i in row]
                                for row in rng.integers(0, 60, size=(256, 3))]))
    labels = rng.integers(0, 2, size=(256, 1)).astype(np.float32)
    inputs = tf.keras.Input(shape=(3,), dtype=tf.string)
    layer = de.keras.layers.Embedding(4, key_dtype=tf.string, name="emb")
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(
        layer(inputs))))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)),
                  loss="mse")
    model.fit(ids, labels, batch_size=64, epochs=1, verbose=0)
    path = str(tmp_path / "strings.keras")
    model.save(path)
    loaded = tf.keras.models.load_model(path)
    np.testing.assert_array_equal(_table(loaded.get_layer("emb"))[0], _table(layer)[0])
    for m in (model, loaded):
        m.fit(ids, labels, batch_size=64, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(loaded.predict(ids[:32], verbose=0),
                               model.predict(ids[:32], verbose=0), rtol=1e-5, atol=1e-6)


def test_keras3_sequential_without_input_trains():
    """A Sequential model built from its first batch gets float32 ids from Keras 3; they are
    cast to the key dtype, as Keras' own Embedding does."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 60, size=(256, 3))
    labels = (ids[:, :1] % 2).astype(np.float32)
    layer = de.keras.layers.Embedding(4, name="emb")
    model = tf.keras.Sequential([layer, tf.keras.layers.Flatten(), tf.keras.layers.Dense(1)])
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)),
                  loss="mse")
    history = model.fit(ids, labels, batch_size=32, epochs=3, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    np.testing.assert_array_equal(_table(layer)[0], np.unique(ids))


@pytest.mark.parametrize("feature,backend", [("eviction", "native"), ("eviction", "builtin"),
                                             ("admission", "native"), ("restrict", "native")])
def test_online_learning_state_does_not_stop_an_export(tmp_path, feature, backend):
    """Eviction, admission and restrict policies keep training state beside the rows; the
    SavedModels serve the rows (the eviction's row metadata stays out of them)."""
    extra = {"eviction": {"eviction": de.Eviction(max_size=50)},
             "admission": {"admission": de.CountAdmission(2)},
             "restrict": {"restrict_policy": de.TimestampRestrictPolicy}}[feature]
    # Zero rows for missing keys, so that keys evicted or not admitted serve deterministically.
    model, layer, ids, _ = _trained_model(backend, epochs=2,
                                          initializer=tf.keras.initializers.Zeros(), **extra)
    assert int(layer.params.size()) > 0
    want = model.predict(ids[:32], verbose=0)
    exported, saved = str(tmp_path / "export"), str(tmp_path / "saved")
    model.export(exported, verbose=False)
    de.keras.models.save_model(model, saved)
    for path in (exported, saved):
        np.testing.assert_allclose(_served(path, ids[:32]), want, rtol=1e-5, atol=1e-6)


def test_keras3_legacy_h5_refuses_a_model_with_tables(tmp_path):
    model, _, _, _ = _trained_model()
    with pytest.raises(ValueError, match=r"legacy HDF5 format .* layers \['emb'\]"):
        model.save(str(tmp_path / "model.h5"))



def test_a_serving_signature_traced_under_a_tape_exports_and_serves(tmp_path):
    """A serving signature whose trace went through the trainable wrappers (traced while a
    GradientTape recorded, or a training trace reused: TFRA's seq_and_dense demo makes its
    model's `call` a `@tf.function` and exports `serve.get_concrete_function(model, ...)`)
    captures the wrappers' ids too; the SavedModel keeps them and serves the trained rows."""
    model = _trained_model()[0]
    ids = np.random.default_rng(1).integers(0, 60, size=(16, 3))
    want = model.predict(ids, verbose=0)

    @tf.function
    def serve(x):
        return model(x)

    with tf.GradientTape():   # recording while tracing: the lookups go through wrappers
        signature = serve.get_concrete_function(tf.TensorSpec([None, 3], tf.int64))
    assert any(v.name.startswith("emb/") for v in signature.variables)   # a wrapper is captured
    path = str(tmp_path / "served")
    de.keras.models.save_model(model, path, include_optimizer=False,
                               signatures={"serving_default": signature})
    np.testing.assert_allclose(_served(path, ids), want, rtol=1e-5, atol=1e-6)
