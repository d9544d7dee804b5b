"""de.keras layers under tf.distribute strategies of one process and mixed precision:
OneDeviceStrategy trains (in both Kerases); strategies of in-sync replicas are refused when a
trainable layer is made, with an error that names the strategy and what to use instead;
"mixed_float16" trains through Keras' LossScaleOptimizer. (ParameterServerStrategy: see
tests/distributed/test_ps_strategy.py.)"""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS


def _model(module, **layer_kwargs):
    inputs = module.Input(shape=(3,), dtype="int64")
    layer = de.keras.layers.Embedding(4, keras=module.__name__, initializer=0.1, name="emb",
                                      **layer_kwargs)
    out = module.layers.Dense(1)(module.layers.Flatten()(layer(inputs)))
    return module.Model(inputs, out), layer


@pytest.mark.parametrize("module", [keras, tf_keras], ids=["keras3", "tf_keras"])
def test_one_device_strategy_trains(module):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(128, 3))
    labels = (ids[:, :1] % 2).astype(np.float32)
    adam = module.optimizers.legacy.Adam if module is tf_keras else module.optimizers.Adam
    with tf.distribute.OneDeviceStrategy(CPUS[1]).scope():
        model, layer = _model(module)
        model.compile(optimizer=de.DynamicEmbeddingOptimizer(adam(0.05)), loss="mse")
    history = model.fit(ids, labels, batch_size=32, epochs=3, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert int(layer.params.size()) == len(np.unique(ids))


@pytest.mark.parametrize("module", [keras, tf_keras], ids=["keras3", "tf_keras"])
def test_mirrored_strategy_is_refused_with_a_clear_error(module):
    for devices in (CPUS[:2], CPUS[:1]):
        with tf.distribute.MirroredStrategy(devices).scope():
            with pytest.raises(NotImplementedError,
                               match="cannot be trained under MirroredStrategy.*"
                                     "ParameterServerStrategy"):
                _model(module)


def test_a_frozen_layer_predicts_under_mirrored_strategy():
    rows = tf.constant([[float(i)] * 4 for i in range(10)])
    with tf.distribute.MirroredStrategy(CPUS[:2]).scope():
        model, layer = _model(keras, trainable=False)
    layer.params.upsert(tf.range(10, dtype=tf.int64), rows)
    model.layers[-1].set_weights([np.ones([12, 1], np.float32), np.zeros([1], np.float32)])
    ids = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [0, 0, 0]])
    np.testing.assert_allclose(model.predict(ids, batch_size=4, verbose=0)[:, 0],
                               4.0 * ids.sum(1))


@pytest.mark.parametrize("module", [keras, tf_keras], ids=["keras3", "tf_keras"])
def test_mixed_precision_trains(module):
    """Under the "mixed_float16" policy Keras wraps the compiled optimizer in a
    LossScaleOptimizer, which calls the wrapped optimizer's `apply`: rows and slots still go
    through the tables."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(128, 3))
    labels = (ids[:, :1] % 2).astype(np.float32)
    adam = module.optimizers.legacy.Adam if module is tf_keras else module.optimizers.Adam
    module.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, layer = _model(module)
        model.compile(optimizer=de.DynamicEmbeddingOptimizer(adam(0.05)), loss="mse")
        assert "LossScaleOptimizer" in type(model.optimizer).__name__
        history = model.fit(ids, labels, batch_size=32, epochs=3, verbose=0)
    finally:
        module.mixed_precision.set_global_policy("float32")
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert int(layer.params.size()) == len(np.unique(ids))
    slots = model.optimizer.inner_optimizer.get_slot_variables(layer.params)
    assert slots and all(int(s.size()) == len(np.unique(ids)) for s in slots)
