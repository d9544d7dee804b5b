"""Restrict policies: status kept by training, eviction of the stalest / rarest keys."""

import time

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de

DIM = 4


def _variable(name, policy, devices=None):
    return de.Variable(dim=DIM, name=name, initializer=tf.random_normal_initializer(seed=1),
                       devices=devices, restrict_policy=policy)


def _train(var, opt, batches, use_function=False):
    def step(ids):
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(var, ids, return_trainable=True)
            loss = tf.reduce_sum(rows ** 2)
        opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])

    run = tf.function(step, reduce_retracing=True) if use_function else step
    for ids in batches:
        run(tf.constant(ids, tf.int64))


def _keys(var):
    keys, _ = var.export()
    return sorted(keys.numpy().tolist())


def test_frequency_policy_evicts_the_rarest_keys_from_variable_status_and_slots():
    var = _variable("freq_emb", de.FrequencyRestrictPolicy)
    policy = var.restrict_policy
    assert isinstance(policy, de.FrequencyRestrictPolicy) and policy.var is var
    assert policy.status.value_dtype == tf.int32 and policy.status.dim == 1
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
    common, rare = list(range(10)), list(range(100, 110))
    _train(var, opt, [common, common + rare, common + [0, 0]], use_function=True)
    counts = dict(zip(*[x.numpy().ravel().tolist() for x in policy.status.export()]))
    assert counts == {**{k: 3 for k in common}, **{k: 1 for k in rare}}   # repeats count once
    assert len(policy.params_in_slots) == 2           # Adam's m and v tables
    assert all(_keys(s) == common + rare for s in policy.params_in_slots)
    rows_before = dict(zip(*[x.numpy().tolist() for x in var.export()]))

    var.restrict(15, trigger=25)                      # 20 keys <= trigger: nothing happens
    assert int(var.size()) == 20
    var.restrict(12)                                  # the 8 rarest of the 10 rare ones go
    kept = _keys(var)
    assert len(kept) == 12 and set(common) <= set(kept)
    assert _keys(policy.status) == kept
    assert all(_keys(s) == kept for s in policy.params_in_slots)
    rows_after = dict(zip(*[x.numpy().tolist() for x in var.export()]))
    assert all(rows_after[k] == rows_before[k] for k in kept)    # survivors are untouched


def test_timestamp_policy_evicts_the_oldest_keys_per_shard():
    var = _variable("stamp_emb", de.TimestampRestrictPolicy, devices=["/CPU:0", "/CPU:1"])
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))
    old, new = list(range(20)), list(range(1000, 1020))
    _train(var, opt, [old])
    time.sleep(1.1)                                   # the status has a resolution of 1 s
    _train(var, opt, [new])
    stamps = dict(zip(*[x.numpy().ravel().tolist() for x in var.restrict_policy.status.export()]))
    assert min(stamps[k] for k in new) > max(stamps[k] for k in old)
    assert abs(max(stamps.values()) - time.time()) < 60
    var.restrict(20)                                  # 10 per shard, the newest there
    kept = _keys(var)
    assert int(var.size(0)) == 10 and int(var.size(1)) == 10
    shard_of = {k: int(s) for k, s in zip(
        new + old, de.default_partition_fn(tf.constant(new + old, tf.int64), 2).numpy())}
    for shard in (0, 1):
        mine = [k for k in kept if shard_of[k] == shard]
        newest = sorted((k for k in new + old if shard_of[k] == shard),
                        key=lambda k: -stamps[k])[:10]
        assert sorted(mine) == sorted(newest)
    assert _keys(var.restrict_policy.status) == kept


def test_restrict_in_a_graph_and_bad_arguments():
    graph = tf.Graph()
    with graph.as_default():
        var = de.get_variable("graph_emb", dim=DIM, restrict_policy=de.FrequencyRestrictPolicy)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows = de.embedding_lookup(var, ids)
        loss = tf.reduce_sum(rows ** 2)
        train = de.DynamicEmbeddingOptimizer(
            tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(loss)
        restrict = var.restrict(3)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch in ([1, 2, 3, 4, 5], [1, 2, 3], [1, 2]):
                sess.run(train, {ids: batch})
            assert sess.run(var.size()) == 5
            sess.run(restrict)
            keys = sess.run(var.export()[0])
            assert sorted(keys.tolist()) == [1, 2, 3]
    var = _variable("plain_emb", de.FrequencyRestrictPolicy)
    with pytest.raises(TypeError, match="residue"):
        var.restrict(2.5)
    with pytest.raises(ValueError, match="residue"):
        var.restrict(-1)
    with pytest.raises(TypeError, match="trigger"):
        var.restrict(2, trigger="3")
    with pytest.raises(TypeError, match="restrict_policy must be a de.RestrictPolicy"):
        de.Variable(dim=2, name="bad", restrict_policy="timestamp")
    no_policy = de.Variable(dim=2, name="free")
    assert no_policy.restrict_policy is None
    no_policy.upsert(tf.constant([1], tf.int64), tf.ones([1, 2]))
    no_policy.restrict(0)
    assert int(no_policy.size()) == 1
    with pytest.raises(ValueError, match="needs the built-in backend"):
        de.Variable(dim=1, value_dtype=tf.int32, kv_creator=de.NativeKVCreator())
    np.testing.assert_array_equal(
        de.Variable(dim=1, value_dtype=tf.int32).lookup(tf.constant([7], tf.int64)).numpy(),
        [[0]])


def test_status_is_checkpointed_with_the_variable(tmp_path):
    var = _variable("ckpt_emb", de.FrequencyRestrictPolicy)
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))
    _train(var, opt, [[1, 2, 3], [1, 2], [1]])
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
    fresh = _variable("ckpt_emb_restored", de.FrequencyRestrictPolicy)
    tf.train.Checkpoint(emb=fresh).restore(path).assert_existing_objects_matched()
    counts = dict(zip(*[x.numpy().ravel().tolist() for x in fresh.restrict_policy.status.export()]))
    assert counts == {1: 3, 2: 2, 3: 1}
    fresh.restrict(1)
    assert _keys(fresh) == [1]


def test_keras_layer_passes_the_policy_and_model_fit_updates_the_status():
    layer = de.keras.layers.Embedding(DIM, name="restricted_layer",
                                      restrict_policy=de.FrequencyRestrictPolicy)
    inputs = tf.keras.Input(shape=(2,), dtype=tf.int64)
    outputs = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(layer(inputs)))
    model = tf.keras.Model(inputs, outputs)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.01)),
                  loss="mse")
    ids = np.array([[1, 2], [1, 3], [1, 2]], np.int64)
    model.fit(ids, np.ones([3, 1], np.float32), batch_size=3, epochs=2, verbose=0)
    policy = layer.params.restrict_policy
    counts = dict(zip(*[x.numpy().ravel().tolist() for x in policy.status.export()]))
    assert counts == {1: 2, 2: 2, 3: 2}                # one update per step and trained id
    layer.params.restrict(0)
    assert int(layer.params.size()) == 0 and int(policy.status.size()) == 0
