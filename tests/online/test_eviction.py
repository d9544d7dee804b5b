"""de.Eviction (issue 22): a capacity bound (LRU / LFU) and a time to live while training.

Checked against a Python model of the same rules on both backends: after every step the table
holds at most the bound, the step's keys, and only keys no less recent (LRU) / no rarer (LFU)
than every key it dropped; slots and status tables lose the same keys; checkpoints keep the
clock (and the built-in status).
"""

import os
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.online.training import keys_of, train_step

CPUS = ["/CPU:0", "/CPU:1"]




def _batches(rng, steps, universe, size):
    """Zipf-ish batches: a few hot ids touched often, many cold ones once."""
    for _ in range(steps):
        hot = rng.integers(0, 8, size=size // 3)
        cold = rng.integers(8, universe, size=size - size // 3)
        yield np.unique(np.concatenate([hot, cold])).astype(np.int64)


@pytest.mark.parametrize("order", ["lru", "lfu"])
@pytest.mark.parametrize("shards", [1, 2])
def test_bound_and_order_under_training(kv_creator, order, shards):
    cap = 30
    var = de.Variable(dim=2, initializer=0.0, kv_creator=kv_creator, devices=CPUS[:shards],
                      eviction=de.Eviction(max_size=cap, order=order, slack=0.0))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    step = train_step(var, opt)
    last, count, held = {}, {}, set()
    evicted_any = False
    for t, ids in enumerate(_batches(np.random.default_rng(1), 40, 200, 12), start=1):
        step(tf.constant(ids))
        now = keys_of(var)
        batch = set(ids.tolist())
        for key in batch:
            count[key] = count.get(key, 0) + 1 if key in held else 1
            last[key] = t
        gone = (held | batch) - now
        evicted_any |= bool(gone)
        assert len(now) <= cap and batch <= now, (t, len(now))
        assert len(now) >= min(cap - len(batch), len(held | batch)) - 0   # evicts no more
        if shards == 1 and gone:   # one shard: the order is global
            kept = now - batch
            if order == "lru":
                assert max(last[k] for k in gone) <= min(last[k] for k in kept), t
            else:
                rank = lambda k: (count[k], last[k])   # noqa: E731
                assert max(rank(k) for k in gone) <= min(rank(k) for k in kept), t
        for key in gone:
            count.pop(key, None)
        held = now
        for slot in var.get_slot_variables(opt):
            assert keys_of(slot) == now
    assert evicted_any


def test_per_shard_bound_splits_the_total(kv_creator):
    var = de.Variable(dim=1, initializer=0.0, kv_creator=kv_creator, devices=CPUS,
                      eviction=de.Eviction(max_size=9, slack=0.0))
    step = train_step(var, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))
    for start in range(0, 60, 6):
        step(tf.constant(np.arange(start, start + 6, dtype=np.int64)))
        keys = np.array(sorted(keys_of(var)))
        assert len(keys) <= 9
        # default_partition_fn: key % 2; shard 0 holds at most 5, shard 1 at most 4
        assert (keys % 2 == 0).sum() <= 5 and (keys % 2 == 1).sum() <= 4


def test_slack_evicts_ahead_so_scans_are_rare(kv_creator):
    var = de.Variable(dim=1, initializer=0.0, kv_creator=kv_creator,
                      eviction=de.Eviction(max_size=100, slack=0.2))
    step = train_step(var, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))
    sizes = []
    for start in range(0, 400, 10):
        step(tf.constant(np.arange(start, start + 10, dtype=np.int64)))
        sizes.append(int(var.size()))
    assert max(sizes) <= 100
    drops = [b for a, b in zip(sizes, sizes[1:]) if b < a]
    # A scan frees 20 keys beyond the need: at most one scan per 2 steps of 10 new keys.
    assert 0 < len(drops) <= len(sizes) // 2 and min(sizes[10:]) <= 80


def test_ttl_drops_keys_not_updated(kv_creator):
    ttl = 10
    var = de.Variable(dim=1, initializer=0.0, kv_creator=kv_creator, devices=CPUS,
                      eviction=de.Eviction(ttl_steps=ttl))
    step = train_step(var, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))
    last = {}
    for t in range(1, 41):
        ids = np.array([0, 100 + t], np.int64)   # key 0 every step, the other once
        step(tf.constant(ids))
        for key in ids.tolist():
            last[key] = t
        now = keys_of(var)
        assert all(t - last[k] < ttl + ttl // 10 for k in now), t   # none lives past 1.1 TTL
        if t % (ttl // 10) == 0:   # a sweep ran this step: exactly the fresh keys remain
            assert now == {k for k, s in last.items() if t - s < ttl}, t


def test_restrict_status_and_eviction_together(kv_creator):
    var = de.Variable(dim=1, initializer=0.0, kv_creator=kv_creator,
                      restrict_policy=de.FrequencyRestrictPolicy,
                      eviction=de.Eviction(max_size=10, slack=0.0))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.1))
    step = train_step(var, opt)
    for start in range(0, 50, 5):
        step(tf.constant(np.arange(start, start + 5, dtype=np.int64)))
    assert keys_of(var) == set(range(40, 50))
    assert keys_of(var.restrict_policy.status) == set(range(40, 50))
    for slot in var.get_slot_variables(opt):
        assert keys_of(slot) == set(range(40, 50))


def test_checkpoint_keeps_the_clock_and_the_bound(kv_creator, tmp_path):
    def make():
        var = de.Variable(dim=1, initializer=0.0, kv_creator=kv_creator, name="ckpt_var",
                          eviction=de.Eviction(max_size=12, ttl_steps=50, slack=0.0))
        return var, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1))

    var, opt = make()
    step = train_step(var, opt)
    for start in range(0, 30, 3):
        step(tf.constant(np.arange(start, start + 3, dtype=np.int64)))
    path = tf.train.Checkpoint(var=var).save(os.path.join(tmp_path, "ckpt"))
    state = var.eviction_state
    assert int(state.step) == 10
    restored, opt2 = make()
    tf.train.Checkpoint(var=restored).restore(path).assert_existing_objects_matched()
    assert int(restored.eviction_state.step) == 10
    assert keys_of(restored) == keys_of(var) == set(range(18, 30))
    if restored.eviction_state.status is not None:
        np.testing.assert_array_equal(
            restored.eviction_state.status.lookup(tf.constant([18, 29], tf.int64)).numpy(),
            [[7, 1], [10, 1]])
    step2 = train_step(restored, opt2)
    step2(tf.constant([100, 101, 102, 103], tf.int64))
    # The restored recency decides: the 4 oldest keys (18-21, from steps 7 and 8) went.
    assert keys_of(restored) == set(range(22, 30)) | {100, 101, 102, 103}
    assert int(restored.eviction_state.step) == 11
    # The sweep gave the restored rows back their stamps without touching their trained values.
    kept = tf.constant(np.arange(22, 30), tf.int64)
    trained = var.lookup(kept).numpy()
    assert np.all(trained != 0.0)
    np.testing.assert_array_equal(restored.lookup(kept).numpy(), trained)


def test_ttl_seconds_counts_from_the_saved_updates_after_a_restore(kv_creator, tmp_path):
    def make():
        return de.Variable(dim=1, initializer=0.0, kv_creator=kv_creator, name="ttl_s_var",
                           eviction=de.Eviction(ttl_seconds=2))

    var = make()
    train_step(var, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))(
        tf.constant([1, 2], tf.int64))
    path = tf.train.Checkpoint(var=var).save(os.path.join(tmp_path, "ckpt"))
    time.sleep(3.1)
    restored = make()   # its restore writes the rows now; their age is the saved one
    tf.train.Checkpoint(var=restored).restore(path).assert_existing_objects_matched()
    assert keys_of(restored) == {1, 2}
    train_step(restored, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))(
        tf.constant([9], tf.int64))
    assert keys_of(restored) == {9}


def test_graph_mode_session(kv_creator):
    with tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        var = de.get_variable("graph_var", dim=2, initializer=0.0, kv_creator=kv_creator,
                              eviction=de.Eviction(max_size=8, slack=0.0))
        rows = de.embedding_lookup(var, ids)
        loss = tf.reduce_sum(rows * rows + rows)
        train = de.DynamicEmbeddingOptimizer(
            tf.compat.v1.train.AdamOptimizer(0.1)).minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for start in range(0, 40, 4):
                sess.run(train, {ids: np.arange(start, start + 4)})
                assert sess.run(var.size()) <= 8
            keys, _ = sess.run(var.export())
            assert sorted(keys.tolist()) == list(range(32, 40))


def test_a_step_ends_back_under_the_bound_that_concurrent_writes_overran(kv_creator):
    """Asynchronous workers: each step makes room for its own new keys only, so keys written
    meanwhile by another step can take the table over the bound. The step's `trim`, run
    after its write-back, evicts that excess again, never the step's own keys."""
    var = de.Variable(dim=1, initializer=0.0, kv_creator=kv_creator,
                      eviction=de.Eviction(max_size=20, slack=0.0))
    step = train_step(var, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))
    step(tf.constant(np.arange(20, dtype=np.int64)))
    state = var.eviction_state
    state.trim(tf.constant(np.arange(20, dtype=np.int64)))   # within the bound: a no-op
    assert keys_of(var) == set(range(20))
    # Another step's 10 new keys land (as its write-back would) after this step made room.
    mine = np.arange(100, 110, dtype=np.int64)
    var.upsert(tf.constant(mine), tf.ones([10, 1]))
    assert int(var.size()) == 30
    state.trim(tf.constant(mine))
    kept = keys_of(var)
    assert len(kept) == 20 and set(mine.tolist()) <= kept
    assert len(kept & set(range(20))) == 10


def test_concurrent_steps_leave_the_table_within_the_bound(kv_creator):
    """Two threads train the same variable at once on their own new keys (steps overlap
    as asynchronous workers' do); once they are done, the table is within its bound."""
    cap = 200
    var = de.Variable(dim=4, initializer=0.0, kv_creator=kv_creator,
                      eviction=de.Eviction(max_size=cap, slack=0.0))
    step = train_step(var, de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.1)))
    step(tf.constant(np.arange(40, dtype=np.int64)))   # traced before the threads start
    errors = []

    def worker(offset):
        try:
            for i in range(30):
                start = offset + 40 * i
                step(tf.constant(np.arange(start, start + 40, dtype=np.int64)))
        except Exception as e:   # pylint: disable=broad-except
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(offset,)) for offset in (10**6, 2 * 10**6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads)
    assert 0 < int(var.size()) <= cap


def test_keras_layer_fit_stays_bounded(kv_creator):
    inputs = keras.Input(shape=(3,), dtype="int64")
    layer = de.keras.layers.Embedding(4, pooling="sum", kv_creator=kv_creator,
                                      eviction=de.Eviction(max_size=50, order="lfu"))
    model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01)),
                  loss="mse")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 1000, size=(512, 3)).astype(np.int64)
    model.fit(x, rng.normal(size=(512, 1)), batch_size=16, epochs=1, verbose=0)
    assert 0 < int(layer.params.size()) <= 50


def test_stringkeys_of(kv_creator):
    var = de.Variable(key_dtype=tf.string, dim=1, initializer=0.0, kv_creator=kv_creator,
                      eviction=de.Eviction(max_size=6, slack=0.0))
    step = train_step(var, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))
    for start in range(0, 20, 2):
        step(tf.constant([f"k{start}", f"k{start + 1}"]))
    assert keys_of(var) == {f"k{i}".encode() for i in range(14, 20)}


@pytest.mark.parametrize("shards", [1, 2])
def test_ttl_seconds_drops_keys_not_updated_for_that_long(kv_creator, shards):
    # Stamps are whole seconds: a key unused for more than ttl + 1 seconds goes at the next
    # step, one unused for less than ttl seconds stays.
    var = de.Variable(dim=1, initializer=0.0, kv_creator=kv_creator, devices=CPUS[:shards],
                      eviction=de.Eviction(ttl_seconds=2, max_size=100))
    step = train_step(var, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))
    # Traced before the clock matters: tracing a step for a new batch size took seconds on a
    # busy machine, and keys 1 and 2 timed out before the second step.
    step.get_concrete_function(tf.TensorSpec([None], tf.int64))
    step(tf.constant([1, 2, 3], tf.int64))
    time.sleep(0.3)
    step(tf.constant([3, 4], tf.int64))
    assert keys_of(var) == {1, 2, 3, 4}
    time.sleep(3.1)
    step(tf.constant([4, 5], tf.int64))      # 1, 2, 3 unused for > 3 s; 4 is in the step
    assert keys_of(var) == {4, 5}
    assert int(var.eviction_state.step) == 3


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="max_size must be None or a positive int; got 0"):
        de.Eviction(max_size=0)
    with pytest.raises(ValueError, match="needs max_size, ttl_steps or ttl_seconds"):
        de.Eviction()
    with pytest.raises(ValueError, match="ttl_steps or ttl_seconds, not both"):
        de.Eviction(ttl_steps=5, ttl_seconds=5)
    with pytest.raises(ValueError, match="ttl_seconds must be None or a positive int; got -1"):
        de.Eviction(ttl_seconds=-1)
    with pytest.raises(ValueError, match="order must be one of .'lru', 'lfu'.; got 'mru'"):
        de.Eviction(max_size=5, order="mru")
    with pytest.raises(ValueError, match="slack must be a number in .0, 1.; got 1.5"):
        de.Eviction(max_size=5, slack=1.5)
    with pytest.raises(ValueError, match="ttl_steps must be None or a positive int; got 2.5"):
        de.Eviction(ttl_steps=2.5)
    with pytest.raises(TypeError, match="eviction must be a de.Eviction; got 100"):
        de.Variable(dim=1, eviction=100)
