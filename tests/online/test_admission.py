"""Admission filters (issue 22): new keys get rows only once admitted; the rest is not written.

Counts are checked exactly (CountAdmission), against the counter arithmetic of a counting Bloom
filter with room to spare (BloomAdmission), and statistically (ProbabilityAdmission); slots
follow the table; filter state survives a checkpoint.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.online.training import keys_of, train_step
from tfra_dynamic_embedding.online import admission as admission_lib




@pytest.mark.parametrize("make", [lambda k: de.CountAdmission(k),
                                  lambda k: de.BloomAdmission(k, memory_bytes=1 << 16)],
                         ids=["count", "bloom"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_keys_get_rows_in_their_kth_batch(kv_creator, make, k):
    var = de.Variable(dim=2, initializer=0.0, kv_creator=kv_creator, devices=["/CPU:0", "/CPU:1"],
                      admission=make(k))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    step = train_step(var, opt)
    rng = np.random.default_rng(4)
    seen = {}
    for _ in range(25):
        ids = np.unique(rng.integers(0, 40, size=8)).astype(np.int64)
        before = {}
        if keys_of(var):
            before = dict(zip(*[t.numpy().tolist() for t in var.export()]))
        step(tf.constant(ids))
        for key in ids.tolist():
            seen[key] = seen.get(key, 0) + 1
        held = keys_of(var)
        assert held == {key for key, n in seen.items() if n >= k}
        for slot in var.get_slot_variables(opt):
            assert keys_of(slot) == held
        rows = dict(zip(*[t.numpy().tolist() for t in var.export()]))
        for key in set(ids.tolist()) & held:   # a trained row moved off the initializer's 0
            assert rows[key] != [0.0, 0.0]
        for key in set(before) - set(ids.tolist()):
            assert rows[key] == before[key]


def test_not_admitted_keys_read_their_initializer_row(kv_creator):
    var = de.Variable(dim=3, initializer=0.5, kv_creator=kv_creator,
                      admission=de.CountAdmission(2))
    step = train_step(var, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(1.0)))
    step(tf.constant([7, 8], tf.int64))
    assert int(var.size()) == 0
    np.testing.assert_allclose(var.lookup(tf.constant([7], tf.int64)).numpy(), [[0.5] * 3])
    step(tf.constant([7], tf.int64))
    # SGD on rows*rows + rows from 0.5: 0.5 - (2 * 0.5 + 1) = -1.5
    np.testing.assert_allclose(var.lookup(tf.constant([7], tf.int64)).numpy(), [[-1.5] * 3])
    assert keys_of(var) == {7}


def test_probability_admission_rate(kv_creator):
    var = de.Variable(dim=1, initializer=0.0, kv_creator=kv_creator,
                      admission=de.ProbabilityAdmission(0.25, seed=3))
    step = train_step(var, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))
    for start in range(0, 4000, 400):
        step(tf.constant(np.arange(start, start + 400, dtype=np.int64)))
    # 4000 fresh keys, each admitted with p = 0.25: 1000 +- 5 sigma (sigma = 27.4)
    assert 860 < int(var.size()) < 1140
    # Held keys are always trained: training them all again adds no key and drops none.
    held = keys_of(var)
    step(tf.constant(sorted(held), tf.int64))
    assert keys_of(var) == held


def test_string_keys_bloom(kv_creator):
    var = de.Variable(key_dtype=tf.string, dim=1, initializer=0.0, kv_creator=kv_creator,
                      admission=de.BloomAdmission(2, memory_bytes=4096))
    step = train_step(var, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))
    step(tf.constant(["a", "b"]))
    step(tf.constant(["b", "c"]))
    assert keys_of(var) == {b"b"}


def test_filter_state_survives_a_checkpoint(kv_creator, tmp_path):
    def make():
        var = de.Variable(dim=1, initializer=0.0, kv_creator=kv_creator, name="adm",
                          admission=de.CountAdmission(3))
        bloom = de.Variable(dim=1, initializer=0.0, kv_creator=kv_creator, name="adm_bloom",
                            admission=de.BloomAdmission(3, memory_bytes=4096))
        return var, bloom

    var, bloom = make()
    for v in (var, bloom):
        step = train_step(v, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))
        step(tf.constant([1, 2], tf.int64))
        step(tf.constant([1], tf.int64))
    path = tf.train.Checkpoint(a=var, b=bloom).save(os.path.join(tmp_path, "ckpt"))
    var2, bloom2 = make()
    tf.train.Checkpoint(a=var2, b=bloom2).restore(path).assert_existing_objects_matched()
    for v in (var2, bloom2):
        assert int(v.size()) == 0
        step = train_step(v, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))
        step(tf.constant([1, 2], tf.int64))   # 1: third batch, admitted; 2: second, not yet
        assert keys_of(v) == {1}


def test_graph_mode_and_keras_layer(kv_creator):
    with tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        var = de.get_variable("graph_adm", dim=2, initializer=0.0, kv_creator=kv_creator,
                              admission=de.CountAdmission(2))
        rows = de.embedding_lookup(var, ids)
        train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(
            tf.reduce_sum(rows * rows + rows))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train, {ids: [1, 2, 3]})
            sess.run(train, {ids: [2, 3, 4]})
            keys, _ = sess.run(var.export())
            assert sorted(keys.tolist()) == [2, 3]

    inputs = keras.Input(shape=(2,), dtype="int64")
    layer = de.keras.layers.Embedding(4, pooling="sum", kv_creator=kv_creator,
                                      admission=de.CountAdmission(2))
    model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01)),
                  loss="mse")
    x = np.array([[1, 2], [3, 4], [1, 5], [6, 7]], np.int64)
    model.fit(x, np.zeros((4, 1)), batch_size=2, epochs=1, shuffle=False, verbose=0)
    assert keys_of(layer.params) == {1}


def test_bloom_false_admissions_match_the_estimate(kv_creator):
    """1000 keys seen once fill 4096 counters; 1000 fresh keys are then admitted at k = 2 only
    where all 3 of their counters are taken: about (1 - e^(-3000/4096))^3 = 14% of them."""
    var = de.Variable(dim=1, initializer=0.0, kv_creator=kv_creator,
                      admission=de.BloomAdmission(2, memory_bytes=4 * 4096, num_hashes=3))
    step = train_step(var, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))
    step(tf.constant(np.arange(1000, dtype=np.int64)))
    assert int(var.size()) == 0
    step(tf.constant(np.arange(10 ** 6, 10 ** 6 + 1000, dtype=np.int64)))
    estimate = admission_lib.expected_false_admissions(1000, 4 * 4096, 3)
    assert abs(estimate - 0.1398) < 1e-3
    assert abs(int(var.size()) - 1000 * estimate) < 45   # ~4 sigma of a binomial(1000, 0.14)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="k .the batches a key needs. must be a positive int; "
                                         "got 0"):
        de.CountAdmission(0)
    with pytest.raises(ValueError, match="memory_bytes must be an int >= 4; got 2"):
        de.BloomAdmission(2, memory_bytes=2)
    with pytest.raises(ValueError, match="num_hashes must be an int in .1, 8.; got 9"):
        de.BloomAdmission(2, num_hashes=9)
    with pytest.raises(ValueError, match="p must be a probability in .0, 1.; got 0"):
        de.ProbabilityAdmission(0)
    with pytest.raises(TypeError, match="admission must be a de.CountAdmission.*got 3"):
        de.Variable(dim=1, admission=3)
