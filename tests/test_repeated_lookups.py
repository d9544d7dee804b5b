"""Several lookups of one variable under one name in one step (a name reused in a loss, a layer
shared by two features) train like the dense model: every lookup's gradient reaches its rows."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tensorflow_recommenders_addons.dynamic_embedding as de

DIM = 3
A_IDS = [1, 2, 3, 2]
B_IDS = [3, 4]          # 3 is in both lookups: its gradients add up


def _optimizers(family):
    if family == "tf_keras_legacy":
        return tf_keras.optimizers.legacy.Adagrad(0.3), tf_keras.optimizers.legacy.Adagrad(0.3)
    if family == "keras3":
        return tf.keras.optimizers.SGD(0.2), tf.keras.optimizers.SGD(0.2)
    return (tf.compat.v1.train.GradientDescentOptimizer(0.2),
            tf.compat.v1.train.GradientDescentOptimizer(0.2))


@pytest.mark.parametrize("family", ["tf_keras_legacy", "keras3", "v1"])
@pytest.mark.parametrize("use_function", [False, True])
def test_two_lookups_under_one_name_match_the_dense_model(family, use_function):
    init = np.linspace(-1.0, 1.0, 5 * DIM, dtype=np.float32).reshape(5, DIM)
    var = de.Variable(dim=DIM, devices=["/CPU:0", "/CPU:1"], name=f"same_{family}_{use_function}")
    var.upsert(tf.range(5, dtype=tf.int64), init)
    dense = tf.Variable(init)
    opt, dense_opt = _optimizers(family)
    opt = de.DynamicEmbeddingOptimizer(opt)
    a, b = tf.constant(A_IDS, tf.int64), tf.constant(B_IDS, tf.int64)
    weights_a = tf.constant([[1.0], [2.0], [3.0], [4.0]])

    def loss_of(rows_a, rows_b):
        return tf.reduce_sum(tf.square(rows_a) * weights_a) + 5.0 * tf.reduce_sum(rows_b)

    def step():
        with tf.GradientTape(persistent=True) as tape:
            loss = loss_of(de.embedding_lookup(var, a, name="shared"),
                           de.embedding_lookup(var, b, name="shared"))
            dense_loss = loss_of(tf.gather(dense, a), tf.gather(dense, b))
        wrappers = list(var.trainable_store.values())
        opt.apply_gradients(zip(tape.gradient(loss, wrappers), wrappers))
        dense_opt.apply_gradients([(tape.gradient(dense_loss, dense), dense)])

    if use_function:
        step = tf.function(step)
    for _ in range(3):
        step()
    assert len(var.trainable_store) == 1
    np.testing.assert_allclose(var.lookup(tf.range(5, dtype=tf.int64)).numpy(),
                               dense.numpy(), rtol=1e-5, atol=1e-6)


def test_a_new_step_replaces_the_rows_held():
    var = de.Variable(dim=1, initializer=0.0, name="steps")
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1.0))
    for ids in ([1, 2], [7]):
        with tf.GradientTape() as tape:
            emb, wrapper = de.embedding_lookup(var, tf.constant(ids, tf.int64), name="l",
                                               return_trainable=True)
            loss = tf.reduce_sum(emb)
        opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
        np.testing.assert_array_equal(np.sort(wrapper.batch_ids().numpy()), ids)
    np.testing.assert_array_equal(var.lookup(tf.constant([1, 2, 7], tf.int64)).numpy(),
                                  [[-1.0], [-1.0], [-1.0]])


def test_eager_lookups_outside_a_tape_do_not_pile_up():
    # Without a recording tape (inspection, return_trainable=True), a lookup replaces the rows
    # held: the wrapper does not grow across calls that no optimizer step ends.
    var = de.Variable(dim=2, initializer=1.0, name="no_pile")
    for ids in ([1, 2], [3], [4, 5, 6]):
        _, wrapper = de.embedding_lookup(var, tf.constant(ids, tf.int64), name="look",
                                         return_trainable=True)
        np.testing.assert_array_equal(np.sort(wrapper.batch_ids().numpy()), ids)
