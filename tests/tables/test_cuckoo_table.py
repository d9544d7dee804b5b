"""de.CuckooHashTable: TFRA's standalone table API over both backends, checked against dicts."""

import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tfra_dynamic_embedding.tables import builtin, native


def make(kv_creator, default=(0.0, 0.0), **kw):
    return de.CuckooHashTable(tf.int64, tf.float32, default_value=list(default),
                              kv_creator=kv_creator, **kw)


def test_default_backend_is_native_when_built():
    table = de.CuckooHashTable(tf.int64, tf.float32, default_value=[0.0])
    expected = native.NativeKVTable if native.is_available() else builtin.BuiltinKVTable
    assert isinstance(table.kv_table, expected)
    # Integer values are not a native dtype: the built-in table holds them.
    ints = de.CuckooHashTable(tf.string, tf.int64, default_value=-1)
    assert isinstance(ints.kv_table, builtin.BuiltinKVTable)


def test_insert_lookup_any_key_shape(kv_creator):
    table = make(kv_creator, default=(-1.0, -2.0))
    table.insert(tf.constant([[1, 2], [3, 4]], tf.int64),
                 tf.reshape(tf.range(8, dtype=tf.float32), [2, 2, 2]))
    assert int(table.size()) == 4
    keys = tf.constant([[[4], [9]], [[1], [2]]], tf.int64)  # shape [2, 2, 1]
    values, exists = table.lookup(keys, return_exists=True)
    assert values.shape == (2, 2, 1, 2) and exists.shape == (2, 2, 1)
    np.testing.assert_array_equal(values.numpy().reshape(4, 2),
                                  [[6, 7], [-1, -2], [0, 1], [2, 3]])
    np.testing.assert_array_equal(exists.numpy().ravel(), [True, False, True, True])
    # Per-key defaults, shaped as the result.
    dyn = tf.fill([2, 2, 1, 2], 5.0)
    np.testing.assert_array_equal(table.lookup(keys, dynamic_default_values=dyn).numpy()[0, 1, 0],
                                  [5.0, 5.0])


def test_scalar_int_values_with_string_keys():
    table = de.CuckooHashTable(tf.string, tf.int64, default_value=-1)
    table.insert(tf.constant(["brain", "salad"]), tf.constant([0, 1], tf.int64))
    out, exists = table.lookup(tf.constant(["salad", "tank", "brain"]), return_exists=True)
    np.testing.assert_array_equal(out.numpy(), [1, -1, 0])
    np.testing.assert_array_equal(exists.numpy(), [True, False, True])
    keys, values = table.export()
    assert dict(zip(keys.numpy().tolist(), values.numpy().tolist())) == {b"brain": 0, b"salad": 1}


def test_accum_is_optimistic(kv_creator):
    table = make(kv_creator)
    table.insert(tf.constant([1, 2], tf.int64), [[1.0, 1.0], [2.0, 2.0]])
    # key 1: believed present and present -> add; key 2: believed absent but present -> left;
    # key 3: believed absent and absent -> insert; key 4: believed present but absent -> left.
    table.accum(tf.constant([1, 2, 3, 4], tf.int64),
                tf.constant([[10.0, 10.0], [20.0, 20.0], [30.0, 30.0], [40.0, 40.0]]),
                tf.constant([True, False, False, True]))
    keys, values = table.export()
    got = {int(k): v.tolist() for k, v in zip(keys.numpy(), values.numpy())}
    assert got == {1: [11.0, 11.0], 2: [2.0, 2.0], 3: [30.0, 30.0]}


def test_values_and_exists_must_have_the_keys_shape(kv_creator):
    table = de.CuckooHashTable(tf.int64, tf.float32, default_value=[0.0, 0.0, 0.0],
                               kv_creator=kv_creator)
    with pytest.raises(ValueError, match=r"values must have shape keys.shape \+ value shape"):
        table.insert(tf.constant([3], tf.int64), [1.0, 2.0, 3.0])   # [3], not [1, 3]
    with pytest.raises(ValueError, match="exists must have the shape of keys"):
        table.accum(tf.constant([1, 2], tf.int64), tf.ones([2, 3]), [True])

    @tf.function(input_signature=[tf.TensorSpec(None, tf.int64), tf.TensorSpec(None, tf.float32)])
    def insert(keys, values):
        table.insert(keys, values)

    with pytest.raises(tf.errors.InvalidArgumentError, match="values must have shape"):
        insert(tf.constant([4, 5], tf.int64), tf.ones([3, 2]))   # 6 values, 2 rows of 3
    assert int(table.size()) == 0
    insert(tf.constant([4, 5], tf.int64), tf.ones([2, 3]))
    assert int(table.size()) == 2


def test_remove_clear_size(kv_creator):
    table = make(kv_creator)
    table.insert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2]))
    table.remove(tf.constant([[2], [7]], tf.int64))
    assert sorted(table.export()[0].numpy().tolist()) == [1, 3]
    table.clear()
    assert int(table.size()) == 0


def test_inside_tf_function(kv_creator):
    table = make(kv_creator)

    @tf.function
    def step(k, v):
        table.insert(k, v)
        return table.lookup(k * 10, return_exists=True)

    values, exists = step(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
    assert not exists.numpy().any() and values.numpy().sum() == 0
    assert int(table.size()) == 2


def test_tf2_checkpoint_round_trip(kv_creator, tmp_path):
    table = make(kv_creator)
    table.insert(tf.constant([5, 6], tf.int64), [[1.0, 2.0], [3.0, 4.0]])
    path = tf.train.Checkpoint(table=table).save(str(tmp_path / "ckpt"))
    fresh = make(kv_creator)
    fresh.insert(tf.constant([99], tf.int64), [[9.0, 9.0]])  # replaced by the restore
    tf.train.Checkpoint(table=fresh).restore(path).assert_consumed()
    keys, values = fresh.export()
    assert {int(k): v.tolist() for k, v in zip(keys.numpy(), values.numpy())} == \
        {5: [1.0, 2.0], 6: [3.0, 4.0]}


def test_v1_saver_round_trip(kv_creator, tmp_path):
    path = str(tmp_path / "v1")
    with tf.Graph().as_default():
        a = make(kv_creator, name="ta")
        b = make(kv_creator, name="ta")  # same name: still two distinct saveables
        ops = [a.insert(tf.constant([1], tf.int64), [[1.0, 1.0]]),
               b.insert(tf.constant([2], tf.int64), [[2.0, 2.0]])]
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(ops)
            saver.save(sess, path)
    with tf.Graph().as_default():
        a = make(kv_creator, name="ta")
        b = make(kv_creator, name="ta")
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, path)
            ka, kb = sess.run([a.export()[0], b.export()[0]])
    assert ka.tolist() == [1] and kb.tolist() == [2]


def test_file_system_round_trip_and_env_dir(kv_creator, tmp_path, monkeypatch):
    table = make(kv_creator, name="emb")
    table.insert(tf.constant([7, 8], tf.int64), [[7.0, 7.0], [8.0, 8.0]])
    table.save_to_file_system(str(tmp_path / "a"))
    monkeypatch.setenv("TFRA_SAVED_KV", str(tmp_path / "b"))
    table.save_to_file_system(str(tmp_path / "ignored"), file_name="other")
    assert not os.path.exists(tmp_path / "ignored")
    monkeypatch.delenv("TFRA_SAVED_KV")
    for directory, name in ((tmp_path / "a", None), (tmp_path / "b", "other")):
        fresh = make(kv_creator, name="emb")
        fresh.insert(tf.constant([1], tf.int64), [[1.0, 1.0]])
        fresh.load_from_file_system(str(directory), file_name=name)
        assert sorted(fresh.export()[0].numpy().tolist()) == [7, 8]
        np.testing.assert_array_equal(fresh.lookup(tf.constant([8], tf.int64)).numpy(), [[8, 8]])


def test_bad_input_names_the_argument(kv_creator):
    table = make(kv_creator)
    with pytest.raises(TypeError, match="keys must be int64"):
        table.lookup(tf.constant(["x"]))
    with pytest.raises(TypeError, match="config"):
        de.CuckooHashTable(tf.int64, tf.float32, [0.0], config={"size": 3})
    with pytest.raises(ValueError, match="default_value"):
        de.CuckooHashTable(tf.int64, tf.float32, tf.zeros([0]))
    with pytest.raises(ValueError, match="append_to_file"):
        table.save_to_file_system("/tmp/x", append_to_file=True)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        table.insert(tf.constant([1, 2], tf.int64), tf.ones([3, 2]))  # 2 keys, 3 rows
    assert int(table.size()) == 0
