"""TFRA's HKV creator (`de.HkvHashTableCreator`): each shard of a trained variable holds at most
`max_capacity` keys, evicting by LRU or LFU; its settings are checked like TFRA's."""

import numpy as np
import pytest
import tensorflow as tf
import keras

import tensorflow_recommenders_addons.dynamic_embedding as de

from .training import keys_of, train_step

DEVICES = ["/CPU:0", "/CPU:1"]


def _hkv(max_capacity, strategy=de.HkvEvictStrategy.LRU, **kwargs):
    return de.HkvHashTableCreator(config=de.HkvHashTableConfig(
        init_capacity=max_capacity, max_capacity=max_capacity, max_hbm_for_values=0,
        evict_strategy=strategy, **kwargs))


def _shard_keys(var):
    return [set(t.export()[0].numpy().tolist()) for t in var.tables]


def test_lru_keeps_every_shard_within_max_capacity_evicting_the_least_recent():
    var = de.get_variable("hkv_lru", dim=2, devices=DEVICES, initializer=0.5,
                          kv_creator=_hkv(6))
    assert var.eviction_state.eviction.max_size == 12 and var.eviction_state.eviction.order == "lru"
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05))
    step = train_step(var, opt)
    written = []   # ids in the order of their last write
    for batch in np.arange(60, dtype=np.int64).reshape(10, 6):
        step(tf.constant(batch))
        written = [k for k in written if k not in batch] + batch.tolist()
        shards = _shard_keys(var)
        assert all(len(keys) <= 6 for keys in shards), shards
        # per shard, the most recently written keys stay (the partitioner is id % 2)
        for i, keys in enumerate(shards):
            mine = [k for k in written if k % 2 == i]
            assert keys == set(mine[-6:]), (i, keys, mine)
    # Adam's slots lose the evicted keys with the rows and carry no bound of their own
    slots = var.get_slot_variables(opt)
    assert len(slots) == 2
    for slot in slots:
        assert keys_of(slot) == keys_of(var) and slot.eviction_state is None


def test_lfu_keeps_the_most_often_written_keys():
    var = de.Variable(dim=1, initializer=0.0, kv_creator=_hkv(4, de.HkvEvictStrategy.LFU),
                      name="hkv_lfu")
    assert var.eviction_state.eviction.order == "lfu"
    step = train_step(var, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)))
    hot = np.array([1, 2, 3], np.int64)
    for _ in range(3):
        step(tf.constant(hot))
    for cold in range(10, 20):   # one new key each step, with the hot ones
        step(tf.constant(np.append(hot, cold)))
        assert int(var.size()) <= 4
        assert set(hot.tolist()) <= keys_of(var)
    assert keys_of(var) == {1, 2, 3, 19}


def test_epochlru_orders_as_lru_and_the_keras_layer_takes_the_creator():
    layer = de.keras.layers.Embedding(
        4, kv_creator=_hkv(5, de.HkvEvictStrategy.EPOCHLRU, step_per_epoch=100),
        name="hkv_layer")
    layer(tf.constant([[1, 2]], tf.int64))
    state = layer.params.eviction_state
    assert state.eviction.max_size == 5 and state.eviction.order == "lru"


def test_an_explicit_eviction_wins_and_untrained_variables_stay_unbounded():
    own = de.Eviction(max_size=100, order="lfu")
    var = de.Variable(dim=1, kv_creator=_hkv(3), eviction=own, name="hkv_own")
    assert var.eviction_state.eviction is own
    frozen = de.Variable(dim=1, kv_creator=_hkv(3), trainable=False, name="hkv_frozen")
    assert frozen.eviction_state is None
    frozen.upsert(tf.range(10, dtype=tf.int64), tf.zeros([10, 1]))
    assert int(frozen.size()) == 10
    plain = de.Variable(dim=1, kv_creator=de.CuckooHashTableCreator(), name="hkv_plain")
    assert plain.eviction_state is None


def test_settings_are_checked_like_tfra_and_kept():
    config = de.HkvHashTableConfig()
    assert (config.init_capacity, config.max_capacity, config.max_hbm_for_values) == (
        1024 * 1024, 1024 * 1024, 1024 ** 3)
    assert config.evict_strategy is de.HkvEvictStrategy.LRU and config.step_per_epoch == 0
    assert de.HkvHashTableCreator().config.max_capacity == 1024 * 1024
    assert [s.name for s in de.HkvEvictStrategy] == [
        "LRU", "LFU", "EPOCHLRU", "EPOCHLFU", "CUSTOMIZED"]
    assert _hkv(7, de.HkvEvictStrategy.LFU).get_config() == {
        "init_capacity": 7, "max_capacity": 7, "max_hbm_for_values": 0, "evict_strategy": 1,
        "step_per_epoch": 0, "reserved_key_start_bit": 0}
    for strategy in (de.HkvEvictStrategy.EPOCHLFU, de.HkvEvictStrategy.CUSTOMIZED, 4):
        with pytest.raises(ValueError, match="is not supported"):
            de.HkvHashTableConfig(evict_strategy=strategy)
    with pytest.raises(ValueError, match="evict_strategy must be a de.HkvEvictStrategy"):
        de.HkvHashTableConfig(evict_strategy=9)
    with pytest.raises(ValueError, match="step_per_epoch must be >= 1 with evict_strategy"):
        de.HkvHashTableConfig(evict_strategy=de.HkvEvictStrategy.EPOCHLRU)
    # TFRA code passes gen_scores_fn with any strategy and sets max_capacity below the default
    # init_capacity: the function is kept unused, and the capacity is the larger of the two.
    scores = de.HkvHashTableConfig(gen_scores_fn=len)
    assert scores.gen_scores_fn is len and scores.order == "lru"
    assert de.HkvHashTableConfig(init_capacity=10, max_capacity=5).max_capacity == 10
    assert de.HkvHashTableConfig(max_capacity=99999).max_capacity == 1024 * 1024
    for arg, value in (("max_capacity", 0), ("init_capacity", 1.5),
                       ("max_hbm_for_values", -1), ("max_capacity", True)):
        with pytest.raises(ValueError, match=f"{arg} must be an int"):
            de.HkvHashTableConfig(**{arg: value})
    with pytest.raises(TypeError, match="config must be a de.HkvHashTableConfig"):
        de.HkvHashTableCreator(config=de.CuckooHashTableConfig())
    with pytest.raises(TypeError, match="saver must be None or a de.FileSystemSaver"):
        de.HkvHashTableCreator(saver="files")
