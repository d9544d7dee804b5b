"""de.keras.layers in Keras 3 and in tf_keras models: which Keras a layer belongs to, `fit` equal to
a static-embedding twin, checkpoints and configs.

Here `tf.keras` is Keras 3 and `import tf_keras` gives tf_keras in the same process (the mixed
case); `test_legacy_keras_process` re-runs the twin checks in a child with TF_USE_LEGACY_KERAS=1,
where `tf.keras` is tf_keras (the variable must be set before TensorFlow's Keras loads).
"""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tensorflow_recommenders_addons.dynamic_embedding as de

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAYERS = de.keras.layers
VOCAB, DIM, SEEDED, UNSEEN = 40, 3, 20, 4   # ids >= VOCAB - UNSEEN never occur in sparse data


def _data(full_cover, repeats=True, steps=6):
    """Deterministic ids [n, 2], labels [n, 1] and batch size. `full_cover`: every batch holds
    every id once, so a dense optimizer touches exactly the rows a lazy one does (Adam).
    `repeats=False`: no id twice in a batch (Keras 3's Adagrad squares each repeat's gradient
    apart in a dense embedding, where de sums them first, as tf_keras does)."""
    rng = np.random.default_rng(11)
    if full_cover:
        ids = np.concatenate([rng.permutation(VOCAB).reshape(-1, 2) for _ in range(steps)])
        batch = VOCAB // 2
    elif not repeats:
        batch = 8
        ids = np.concatenate([rng.permutation(VOCAB - UNSEEN)[:2 * batch].reshape(-1, 2)
                              for _ in range(steps)])
    else:
        batch = 8
        ids = rng.integers(0, VOCAB - UNSEEN, size=(batch * steps, 2))
    labels = ((ids[:, 0] % 3 == 0) | (ids[:, 1] % 2 == 1)).astype(np.float32)[:, None]
    return ids, labels, batch


def _head_model(K, embedding):
    inputs = K.Input(shape=(2,), dtype="int64")
    hidden = K.layers.Flatten()(embedding(inputs))
    out = K.layers.Dense(1, activation="sigmoid", name="head",
                         kernel_initializer=K.initializers.RandomNormal(0.0, 0.5, seed=1))(hidden)
    return K.Model(inputs, out)


def check_fit_equals_static_twin(K, make_optimizer, initializer, full_cover=False, repeats=True,
                                 **layer_kwargs):
    """Fits a model of Keras `K` over a de Embedding and its twin over a plain `K` Embedding of
    VOCAB rows with the same start rows (ids < SEEDED: distinct rows written into the table,
    the others: the initializer's 0.125), each with its own `make_optimizer()`; asserts equal
    rows, head weights and predictions. Returns the de layer."""
    ids, labels, batch = _data(full_cover, repeats)
    start = np.full((VOCAB, DIM), 0.125, np.float32)
    start[:SEEDED] = np.random.default_rng(5).normal(0.0, 0.3, (SEEDED, DIM))
    layer = LAYERS.Embedding(DIM, initializer=initializer, name="de_emb", **layer_kwargs)
    assert isinstance(layer, K.layers.Layer) and isinstance(layer, LAYERS.Embedding)
    layer.params.upsert(tf.range(SEEDED, dtype=tf.int64), start[:SEEDED])
    twin = K.layers.Embedding(VOCAB, DIM, name="twin_emb")
    models = [_head_model(K, layer), _head_model(K, twin)]
    twin.set_weights([start])
    models[1].get_layer("head").set_weights(models[0].get_layer("head").get_weights())
    for model, opt in zip(models, [de.DynamicEmbeddingOptimizer(make_optimizer()),
                                   make_optimizer()]):
        model.compile(optimizer=opt, loss="mse")
        model.fit(ids, labels, batch_size=batch, epochs=3, shuffle=False, verbose=0)

    want = twin.get_weights()[0]
    seen = np.unique(ids)
    assert not np.allclose(want[seen], start[seen], atol=1e-3)   # the rows did train
    np.testing.assert_allclose(layer.params.lookup(tf.range(VOCAB, dtype=tf.int64)).numpy(),
                               want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(models[0].get_layer("head").get_weights()[0],
                               models[1].get_layer("head").get_weights()[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(models[0].predict(ids, verbose=0),
                               models[1].predict(ids, verbose=0), rtol=1e-5, atol=1e-5)
    # only optimizer steps insert: SEEDED written rows plus the other ids trained
    assert int(layer.params.size()) == len(set(seen) | set(range(SEEDED)))
    return layer


# name: (optimizer factory, data): Adam trains on batches holding every id (a dense Adam then
# updates the rows a lazy one does); the others on sparse batches (their updates are row-local).
SPARSE, FULL_COVER, NO_REPEATS = {}, {"full_cover": True}, {"repeats": False}
TF_KERAS_OPTIMIZERS = {
    "legacy_sgd": (lambda: tf_keras.optimizers.legacy.SGD(0.5), SPARSE),
    "legacy_adagrad": (lambda: tf_keras.optimizers.legacy.Adagrad(0.3), SPARSE),
    "legacy_adam": (lambda: tf_keras.optimizers.legacy.Adam(0.05), FULL_COVER),
    "sgd": (lambda: tf_keras.optimizers.SGD(0.5), SPARSE),
}
KERAS3_OPTIMIZERS = {
    "sgd": (lambda: keras.optimizers.SGD(0.5), SPARSE),
    "adagrad": (lambda: keras.optimizers.Adagrad(0.3), NO_REPEATS),
    "adam": (lambda: keras.optimizers.Adam(0.05), FULL_COVER),
}


@pytest.mark.parametrize("name", sorted(TF_KERAS_OPTIMIZERS))
def test_tf_keras_model_fit_equals_static_twin(name):
    """A tf_keras initializer makes the layer a tf_keras layer, though tf.keras is Keras 3."""
    make_optimizer, data = TF_KERAS_OPTIMIZERS[name]
    layer = check_fit_equals_static_twin(tf_keras, make_optimizer,
                                         initializer=tf_keras.initializers.Constant(0.125),
                                         **data)
    assert layer.keras == "tf_keras" and not isinstance(layer, keras.layers.Layer)


@pytest.mark.parametrize("name", sorted(KERAS3_OPTIMIZERS))
def test_keras3_model_fit_equals_static_twin(name):
    make_optimizer, data = KERAS3_OPTIMIZERS[name]
    layer = check_fit_equals_static_twin(keras, make_optimizer,
                                         initializer=keras.initializers.Constant(0.125), **data)
    assert layer.keras == "keras" and not isinstance(layer, tf_keras.layers.Layer)


def test_explicit_keras_argument_and_number_initializer():
    check_fit_equals_static_twin(tf_keras, TF_KERAS_OPTIMIZERS["legacy_adagrad"][0],
                                 initializer=0.125, keras=tf_keras)
    check_fit_equals_static_twin(keras, KERAS3_OPTIMIZERS["sgd"][0], initializer=0.125,
                                 keras="keras")


def _squash(**kwargs):
    return LAYERS.SquashedEmbedding(2, **dict(dict(initializer=1.0), **kwargs))


def _field(**kwargs):
    return LAYERS.FieldWiseEmbedding(2, 2, slot_map_fn=lambda x: x % 2,
                                     **dict(dict(initializer=1.0), **kwargs))


@pytest.mark.parametrize("make", [LAYERS.Embedding, _squash, _field],
                         ids=["Embedding", "SquashedEmbedding", "FieldWiseEmbedding"])
def test_which_keras_a_layer_belongs_to(make):
    logic_class = {LAYERS.Embedding: LAYERS.Embedding, _squash: LAYERS.SquashedEmbedding,
                   _field: LAYERS.FieldWiseEmbedding}[make]

    def args(**kwargs):
        return kwargs if make is not LAYERS.Embedding else dict(embedding_size=2, **kwargs)

    cases = [({}, keras),                                              # tf.keras is Keras 3
             ({"keras": "tf_keras"}, tf_keras), ({"keras": tf_keras}, tf_keras),
             ({"keras": tf.keras}, keras), ({"keras": "keras"}, keras),
             ({"dtype": tf_keras.mixed_precision.Policy("float32")}, tf_keras),
             ({"dtype": keras.DTypePolicy("float32")}, keras)]
    for kwargs, module in cases:
        layer = make(**args(**kwargs))
        other = tf_keras if module is keras else keras
        assert isinstance(layer, module.layers.Layer), kwargs
        assert not isinstance(layer, other.layers.Layer), kwargs
        assert isinstance(layer, logic_class) and isinstance(layer, LAYERS.Embedding)
        assert type(layer).__name__ == logic_class.__name__
        assert layer.keras == module.__name__
        # one class per (logic class, Keras): a second layer has the same type
        assert type(make(**args(**kwargs))) is type(layer)
        # the class a layer has builds layers of its Keras; another Keras contradicts it
        assert type(layer).from_config(layer.get_config()).keras == layer.keras
        with pytest.raises(ValueError, match=f"keras='{other.__name__}' contradicts"):
            type(layer)(**dict(layer.get_config(), keras=other.__name__))


def test_bad_keras_arguments_are_named():
    with pytest.raises(ValueError, match="keras must be .* got 'jax'"):
        LAYERS.Embedding(2, keras="jax")
    with pytest.raises(ValueError, match="keras must be .* got <module 'numpy'"):
        LAYERS.Embedding(2, keras=np)
    with pytest.raises(ValueError, match=r"mix Keras 3 and tf_keras objects \(keras: dtype; "
                                         r"tf_keras: initializer\)"):
        LAYERS.Embedding(2, initializer=tf_keras.initializers.Zeros(),
                         dtype=keras.DTypePolicy("float32"))
    # keras= settles a mix
    layer = LAYERS.Embedding(2, initializer=keras.initializers.Zeros(), keras="tf_keras")
    assert layer.keras == "tf_keras"


def test_layer_called_on_the_other_keras_inputs_says_what_to_do():
    keras3_layer = LAYERS.Embedding(2, name="k3")
    with pytest.raises(TypeError, match=r"'k3' is a Keras 3 layer but was called on a tf_keras "
                                        r"tensor .* keras='tf_keras' .*TF_USE_LEGACY_KERAS=1"):
        keras3_layer(tf_keras.Input(shape=(2,), dtype="int64"))
    tf_keras_layer = LAYERS.Embedding(2, keras="tf_keras", name="tfk")
    with pytest.raises(TypeError, match=r"'tfk' is a tf_keras layer but was called on a Keras 3 "
                                        r"tensor .* keras='keras'"):
        tf_keras_layer(keras.Input(shape=(2,), dtype="int64"))


@pytest.mark.parametrize("module", [keras, tf_keras], ids=["keras3", "tf_keras"])
@pytest.mark.parametrize("make", [LAYERS.Embedding, _squash, _field],
                         ids=["Embedding", "SquashedEmbedding", "FieldWiseEmbedding"])
def test_config_round_trip(module, make):
    kwargs = dict(keras=module.__name__, key_dtype=tf.int32, bp_v2=True, init_capacity=8,
                  initializer=module.initializers.Constant(0.25), name="cfg")
    if make is LAYERS.Embedding:
        kwargs.update(embedding_size=2, pooling="sqrtn")
    layer = make(**kwargs)
    config = layer.get_config()
    assert config["keras"] == module.__name__ and config["key_dtype"] == "int32"
    logic_class = type(layer).__mro__[1]
    for restored in [logic_class.from_config(config), type(layer).from_config(config)]:
        assert type(restored) is type(layer)
        assert restored.get_config() == config
        assert type(restored.params.initializer) is type(layer.params.initializer)
        ids = tf.constant([[1, 2], [3, 3]], tf.int32)
        np.testing.assert_array_equal(restored(ids).numpy(), layer(ids).numpy())


@pytest.mark.parametrize("module", [keras, tf_keras], ids=["keras3", "tf_keras"])
def test_functional_model_config_round_trip(module):
    layer = LAYERS.Embedding(3, pooling="mean", keras=module.__name__, initializer=0.5,
                             name="emb")
    inputs = module.Input(shape=(2,), dtype="int64")
    model = module.Model(inputs, module.layers.Dense(1, name="head")(layer(inputs)))
    ids = np.array([[1, 2], [5, 6]])
    # The layer classes are registered with each Keras: JSON needs no custom_objects (tf_keras
    # would otherwise build its own Embedding from the plain name).
    for clone in (module.Model.from_config(model.get_config(),
                                           custom_objects={"Embedding": LAYERS.Embedding}),
                  module.models.model_from_json(model.to_json())):
        assert isinstance(clone.get_layer("emb"), LAYERS.Embedding)
        assert clone.get_layer("emb").keras == module.__name__
        clone.get_layer("head").set_weights(model.get_layer("head").get_weights())
        np.testing.assert_allclose(clone.predict(ids, verbose=0), model.predict(ids, verbose=0))


def _trained_tf_keras_model(name="emb"):
    ids, labels, batch = _data(full_cover=False)
    layer = LAYERS.Embedding(DIM, initializer=tf_keras.initializers.RandomUniform(-0.1, 0.1),
                             name=name)
    model = _head_model(tf_keras, layer)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf_keras.optimizers.legacy.Adam(0.05)),
                  loss="mse")
    model.fit(ids, labels, batch_size=batch, epochs=2, verbose=0)
    return model, layer, ids


@pytest.mark.parametrize("how", ["save_weights_tf", "save_weights_h5", "checkpoint"])
def test_tf_keras_checkpoints_save_the_table(tmp_path, how):
    model, layer, ids = _trained_tf_keras_model()
    want = model.predict(ids, verbose=0)
    fresh_layer = LAYERS.Embedding(DIM, keras="tf_keras", name="emb")
    fresh = _head_model(tf_keras, fresh_layer)
    if how == "checkpoint":
        path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
        tf.train.Checkpoint(model=fresh).restore(path).expect_partial()
    else:
        path = str(tmp_path / ("model.weights.h5" if how == "save_weights_h5" else "weights"))
        model.save_weights(path)
        fresh.load_weights(path)
    assert int(fresh_layer.params.size()) == int(layer.params.size()) == len(np.unique(ids))
    np.testing.assert_allclose(fresh.predict(ids, verbose=0), want, rtol=1e-6)


def _run_child(script, timeout=540):
    """Runs `script` in a child Python with TF_USE_LEGACY_KERAS=1; returns (rc, out, err).
    The child is killed if it outlives `timeout` or the test."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_legacy_keras_process(tmp_path):
    """With TF_USE_LEGACY_KERAS=1 tf.keras is tf_keras: layers built with no Keras objects are
    tf_keras layers, fit equals the static twin, and save_weights / load_weights keep the table."""
    script = textwrap.dedent(f"""
        import numpy as np
        import tensorflow as tf
        import tf_keras
        assert tf.keras.layers.Layer is tf_keras.layers.Layer
        import tensorflow_recommenders_addons.dynamic_embedding as de
        from tests.keras import test_keras_flavors as t
        for layer in [de.keras.layers.Embedding(2), de.keras.layers.SquashedEmbedding(2),
                      de.keras.layers.FieldWiseEmbedding(2, 2, slot_map_fn=lambda x: x % 2)]:
            assert layer.keras == "tf_keras" and isinstance(layer, tf_keras.layers.Layer)
        for make, full_cover in [(tf.keras.optimizers.legacy.SGD, False),
                                 (tf.keras.optimizers.legacy.Adagrad, False),
                                 (tf.keras.optimizers.legacy.Adam, True)]:
            lr = 0.05 if full_cover else 0.3
            t.check_fit_equals_static_twin(tf.keras, lambda: make(lr), 0.125, full_cover)
        model, layer, ids = t._trained_tf_keras_model()
        model.save_weights({str(tmp_path / "weights")!r})
        fresh_layer = de.keras.layers.Embedding(t.DIM, name="emb")
        fresh = t._head_model(tf.keras, fresh_layer)
        fresh.load_weights({str(tmp_path / "weights")!r})
        assert int(fresh_layer.params.size()) == len(np.unique(ids))
        np.testing.assert_allclose(fresh.predict(ids, verbose=0), model.predict(ids, verbose=0),
                                   rtol=1e-6)
        print("OK")
    """)
    returncode, out, err = _run_child(script)
    assert returncode == 0 and "OK" in out, err[-4000:]
