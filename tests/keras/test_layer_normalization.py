"""de.keras.layers.LayerNormalization: Keras' layer for inputs of run-time shape and ragged
inputs, in Keras 3 and tf_keras models."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tensorflow_recommenders_addons.dynamic_embedding as de

KERASES = {"keras": keras, "tf_keras": tf_keras}


def _normalized(x, epsilon):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + epsilon)


@pytest.mark.parametrize("package", sorted(KERASES))
def test_dynamic_shapes_and_ragged_rows_against_numpy(package):
    k = KERASES[package]
    layer = de.keras.layers.LayerNormalization(keras=package)
    assert isinstance(layer, k.layers.LayerNormalization)
    inputs = k.Input(shape=(None, 10), dtype="float32")   # the sequence length is unknown
    model = k.Model(inputs, layer(inputs))
    x = np.random.default_rng(0).normal(size=(2, 5, 10)).astype(np.float32)
    np.testing.assert_allclose(model.predict(x, verbose=0), _normalized(x, layer.epsilon),
                               atol=1e-5)
    rows = [[[1.0, 2.0, 3.0], [4.0, 5.0, 9.0]], [[0.0, 1.0, 5.0]]]
    ragged = tf.ragged.constant(rows, ragged_rank=1)
    out = de.keras.layers.LayerNormalization(keras=package)(ragged)
    assert isinstance(out, tf.RaggedTensor)
    np.testing.assert_array_equal(out.row_lengths().numpy(), [2, 1])
    for got, want in zip(out.to_list(), rows):   # padding never enters a row's statistics
        np.testing.assert_allclose(got, _normalized(np.array(want), layer.epsilon), atol=1e-5)


@pytest.mark.parametrize("package", sorted(KERASES))
def test_trains_and_round_trips_its_config(package):
    k = KERASES[package]
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    inputs = k.Input(shape=(6,))
    norm = de.keras.layers.LayerNormalization(keras=package, epsilon=1e-4)
    model = k.Model(inputs, k.layers.Dense(1)(norm(inputs)))
    model.compile(optimizer="adam", loss="mse")
    before = [w.copy() for w in norm.get_weights()]
    model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    assert all(np.abs(b - a).sum() > 0 for b, a in zip(before, norm.get_weights()))
    again = de.keras.layers.LayerNormalization.from_config(norm.get_config())
    assert isinstance(again, k.layers.LayerNormalization) and again.epsilon == 1e-4
