"""Backend creators: TFRA's CuckooHashTableCreator name maps to the default backend."""

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tfra_dynamic_embedding.tables import default_kv_creator, native


def test_cuckoo_creator_is_the_default_backend():
    creator = de.CuckooHashTableCreator(config=de.CuckooHashTableConfig())
    var = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=3, name="cuckoo_var",
                      kv_creator=creator, devices=["/CPU:0", "/CPU:1"])
    assert isinstance(var.kv_creator, de.CuckooHashTableCreator)
    expected = type(default_kv_creator().create(tf.int64, tf.float32, 3, "probe"))
    assert all(type(t.kv_table) is expected for t in var.tables)         # noqa: E721
    if native.is_available():
        assert expected is native.NativeKVTable
    keys = tf.constant([1, 2, 5, 8], tf.int64)
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    var.upsert(keys, rows)
    np.testing.assert_array_equal(var.lookup(keys).numpy(), rows)
    assert int(var.size()) == 4
    assert isinstance(de.CuckooHashTableCreator().config, de.CuckooHashTableConfig)


def test_cuckoo_creator_rejects_what_it_cannot_honour():
    with pytest.raises(TypeError, match="config must be a de.CuckooHashTableConfig"):
        de.CuckooHashTableCreator(config={"init_capacity": 10})
    with pytest.raises(TypeError, match="saver must be None or a de.FileSystemSaver"):
        de.CuckooHashTableCreator(saver=object())


def test_native_creator_is_exported():
    assert de.NativeKVCreator is native.NativeKVCreator
    assert issubclass(de.CuckooHashTableCreator, de.KVCreator)
