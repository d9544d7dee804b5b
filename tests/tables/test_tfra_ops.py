"""TFRA's op names over the native table (cc/ops/de_tfra_ops.cc, de_tfra_data_flow.cc), op by
op, against a dict model and against tf.dynamic_partition / tf.dynamic_stitch: the semantics
TFRA's own kernels have, so graphs and SavedModels TFRA wrote behave the same here."""

import itertools
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tfra_dynamic_embedding.tables import native

pytestmark = pytest.mark.skipif(not native.is_available(),
                                reason=f"native op library not built: {native.load_error()}")

_names = itertools.count()


def _table(key_dtype=tf.int64, dim=3, value_dtype=tf.float32):
    return native.ops().tfra_cuckoo_hash_table_of_tensors(
        key_dtype=key_dtype, value_dtype=value_dtype, value_shape=[dim],
        shared_name=f"tfra_ops_test_{next(_names)}")


def _content(table, value_dtype=tf.float32):
    keys, values = native.ops().tfra_cuckoo_hash_table_export(table, Tkeys=tf.int64,
                                                              Tvalues=value_dtype)
    return {int(k): v.tolist() for k, v in zip(keys.numpy(), values.numpy())}


def test_insert_find_remove_size_clear_with_keys_of_any_shape():
    gen = native.ops()
    t = _table()
    keys = tf.constant([[1, 2], [3, 4]], tf.int64)
    rows = tf.reshape(tf.range(12, dtype=tf.float32), [2, 2, 3])
    gen.tfra_cuckoo_hash_table_insert(t, keys, rows)
    assert int(gen.tfra_cuckoo_hash_table_size(t)) == 4
    query = tf.constant([[4, 9], [1, 2]], tf.int64)
    found = gen.tfra_cuckoo_hash_table_find(t, query, tf.constant([-1.0, -2.0, -3.0]))
    assert found.shape == [2, 2, 3]
    np.testing.assert_array_equal(found.numpy(), [[[9, 10, 11], [-1, -2, -3]],
                                                  [[0, 1, 2], [3, 4, 5]]])
    per_key = -tf.ones([2, 2, 3]) * tf.constant([[[1.0], [2.0]], [[3.0], [4.0]]])
    values, exists = gen.tfra_cuckoo_hash_table_find_with_exists(t, query, per_key)
    np.testing.assert_array_equal(values.numpy()[0, 1], [-2, -2, -2])   # its own default row
    np.testing.assert_array_equal(exists.numpy(), [[True, False], [True, True]])
    assert int(gen.tfra_cuckoo_hash_table_size(t)) == 4                  # lookups insert nothing
    gen.tfra_cuckoo_hash_table_remove(t, tf.constant([2, 3, 77], tf.int64))
    assert _content(t) == {1: [0, 1, 2], 4: [9, 10, 11]}
    gen.tfra_cuckoo_hash_table_insert(t, tf.constant([4], tf.int64), tf.constant([[7.0, 7, 7]]))
    assert _content(t)[4] == [7, 7, 7]                                   # upsert
    gen.tfra_cuckoo_hash_table_clear(t, key_dtype=tf.int64, value_dtype=tf.float32)
    assert int(gen.tfra_cuckoo_hash_table_size(t)) == 0


def test_accum_adds_where_seen_inserts_where_unseen_and_skips_the_rest():
    gen = native.ops()
    t = _table(dim=2)
    gen.tfra_cuckoo_hash_table_insert(t, tf.constant([1, 2], tf.int64),
                                      tf.constant([[10.0, 10.0], [20.0, 20.0]]))
    # key 1: seen and present -> +delta; key 2: unseen but present (another writer) -> kept;
    # key 3: unseen and absent -> inserted; key 4: seen but absent (removed since) -> skipped.
    gen.tfra_cuckoo_hash_table_accum(t, tf.constant([1, 2, 3, 4], tf.int64),
                                     tf.constant([[1.0, 2.0], [5.0, 5.0], [3.0, 3.0], [4.0, 4.0]]),
                                     tf.constant([True, False, False, True]))
    assert _content(t) == {1: [11, 12], 2: [20, 20], 3: [3, 3]}


def test_import_replaces_the_content_and_export_returns_it():
    gen = native.ops()
    t = _table(dim=1)
    gen.tfra_cuckoo_hash_table_insert(t, tf.constant([5, 6], tf.int64), tf.constant([[5.0], [6.0]]))
    gen.tfra_cuckoo_hash_table_import(t, tf.constant([6, 7], tf.int64), tf.constant([[60.0], [70.0]]))
    assert _content(t) == {6: [60], 7: [70]}


def test_string_keys_and_double_rows():
    gen = native.ops()
    t = _table(key_dtype=tf.string, dim=2, value_dtype=tf.float64)
    gen.tfra_cuckoo_hash_table_insert(t, tf.constant(["a", "a long key beyond the inline size"]),
                                      tf.constant([[1.0, 2.0], [3.0, 4.0]], tf.float64))
    gen.tfra_cuckoo_hash_table_accum(t, tf.constant(["a", "b"]),
                                     tf.constant([[0.5, 0.5], [9.0, 9.0]], tf.float64),
                                     tf.constant([True, False]))
    found = gen.tfra_cuckoo_hash_table_find(
        t, tf.constant(["b", "a", "a long key beyond the inline size", "c"]),
        tf.constant([0.0, 0.0], tf.float64))
    np.testing.assert_array_equal(found.numpy(), [[9, 9], [1.5, 2.5], [3, 4], [0, 0]])


def test_bad_arguments_name_what_is_wrong():
    gen = native.ops()
    t = _table(dim=3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="value_shape must be"):
        gen.tfra_cuckoo_hash_table_of_tensors(key_dtype=tf.int64, value_dtype=tf.float32,
                                              value_shape=[2, 3], shared_name="tfra_ops_bad")
    with pytest.raises(tf.errors.InvalidArgumentError, match="op built for int64 -> double"):
        gen.tfra_cuckoo_hash_table_find(t, tf.constant([1], tf.int64),
                                        tf.constant([0.0, 0.0, 0.0], tf.float64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="default_value"):
        gen.tfra_cuckoo_hash_table_find(t, tf.constant([1, 2], tf.int64), tf.zeros([5]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="values"):
        gen.tfra_cuckoo_hash_table_insert(t, tf.constant([1, 2], tf.int64), tf.zeros([2, 2]))
    assert int(gen.tfra_cuckoo_hash_table_size(t)) == 0     # nothing written by a bad call


@pytest.mark.parametrize("data", [
    np.arange(24, dtype=np.int64).reshape(2, 3, 4),
    np.random.default_rng(0).normal(size=(2, 3, 2)).astype(np.float32),
    np.array([[b"a", b"b", b"c"], [b"d", b"e", b"f"]]),
    np.array([[True, False, True], [False, True, True]]),
])
def test_dynamic_partition_and_stitch_equal_tfs(data):
    gen = native.ops()
    partitions = tf.constant([[2, 0, 2], [1, 2, 0]], tf.int32)
    parts = gen.tfra_dynamic_partition(data, partitions, num_partitions=3)
    want = tf.dynamic_partition(data, partitions, 3)
    for got, ref in zip(parts, want):
        np.testing.assert_array_equal(got.numpy(), ref.numpy())
    indices = tf.dynamic_partition(tf.reshape(tf.range(6), [2, 3]), partitions, 3)
    for stitch in (gen.tfra_dynamic_stitch, gen.tfra_dynamic_stitch_fast,
                   gen.tfra_parallel_dynamic_stitch):
        merged = stitch(indices, parts)
        np.testing.assert_array_equal(merged.numpy(),
                                      tf.dynamic_stitch(indices, want).numpy())
    # Repeated indices: the later input wins, as tf.dynamic_stitch.
    repeated = [tf.constant([0, 1]), tf.constant([1])]
    rows = [tf.constant([[1.0], [2.0]]), tf.constant([[3.0]])]
    np.testing.assert_array_equal(gen.tfra_dynamic_stitch(repeated, rows).numpy(), [[1.0], [3.0]])


def test_dynamic_partition_and_stitch_reject_bad_indices():
    gen = native.ops()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"partitions\[1\] = 3"):
        gen.tfra_dynamic_partition(tf.constant([1.0, 2.0]), tf.constant([0, 3]), num_partitions=3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="negative"):
        gen.tfra_dynamic_stitch([tf.constant([0, -1])], [tf.constant([1.0, 2.0])])
    with pytest.raises(tf.errors.InvalidArgumentError, match="shape"):
        gen.tfra_dynamic_stitch([tf.constant([0, 1])], [tf.constant([1.0, 2.0, 3.0])])


FILES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "tfra_checkpoints")


def _load(t, directory, name, entire_dir=False, env=""):
    native.ops().tfra_cuckoo_hash_table_load_from_file_system(
        t, directory, name, key_dtype=tf.int64, value_dtype=tf.float32, dirpath_env=env,
        load_entire_dir=entire_dir, buffer_size=1024)


def _save(t, directory, name, append=False, env=""):
    native.ops().tfra_cuckoo_hash_table_save_to_file_system(
        t, directory, name, key_dtype=tf.int64, value_dtype=tf.float32, dirpath_env=env,
        append_to_file=append, buffer_size=1024)


def test_file_system_ops_read_and_write_tfras_files(tmp_path, monkeypatch):
    """The files TFRA 0.8.1's save_to_file_system wrote (two shards of keys 1..20, dim 4)."""
    with open(os.path.join(FILES, "files.json")) as f:
        saved = json.load(f)
    want = {int(k): v for k, v in zip(saved["keys"], saved["values"])}
    directory = os.path.join(FILES, "files")
    one = _table(dim=4)
    _load(one, directory, "user_mht_1of2_rank0_size1")
    shard = _content(one)
    assert 0 < len(shard) < 20 and all(np.allclose(v, want[k]) for k, v in shard.items())
    every = _table(dim=4)
    _load(every, directory, "user_mht_1of2_rank0_size1", entire_dir=True)
    got = _content(every)
    assert sorted(got) == sorted(want) and all(np.allclose(got[k], want[k]) for k in want)
    # Written back in TFRA's format: the same bytes per key, readable again; a load inserts.
    _save(every, str(tmp_path / "out"), "user_mht_1of1_rank0_size1")
    keys = np.fromfile(tmp_path / "out" / "user_mht_1of1_rank0_size1-keys", np.int64)
    rows = np.fromfile(tmp_path / "out" / "user_mht_1of1_rank0_size1-values", np.float32)
    assert {int(k): r.tolist() for k, r in zip(keys, rows.reshape(-1, 4))} == got
    again = _table(dim=4)
    native.ops().tfra_cuckoo_hash_table_insert(again, tf.constant([99], tf.int64),
                                                tf.constant([[9.0, 9, 9, 9]]))
    monkeypatch.setenv("TFRA_TEST_DIR", str(tmp_path / "out"))   # dirpath_env wins, as TFRA's
    _load(again, "/nonexistent", "user_mht_1of1_rank0_size1", env="TFRA_TEST_DIR")
    assert _content(again) == {**got, 99: [9, 9, 9, 9]}


def test_file_system_load_of_another_dim_or_missing_files_fails_and_changes_nothing(tmp_path):
    t = _table(dim=3)
    native.ops().tfra_cuckoo_hash_table_insert(t, tf.constant([5], tf.int64),
                                                tf.constant([[1.0, 2.0, 3.0]]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="-values"):
        _load(t, os.path.join(FILES, "files"), "user_mht_1of2_rank0_size1", entire_dir=True)
    with pytest.raises(tf.errors.NotFoundError):
        _load(t, str(tmp_path), "user_mht_1of2_rank0_size1")
    assert _content(t) == {5: [1, 2, 3]}


@pytest.mark.parametrize("value_dtype", [tf.int32, tf.int64])
def test_integer_rows_as_tfras_restrict_policies_keep(value_dtype):
    gen = native.ops()
    t = _table(dim=1, value_dtype=value_dtype)
    big = 2**40 if value_dtype == tf.int64 else 2**30   # exact, beyond a float's 24 bits
    gen.tfra_cuckoo_hash_table_insert(t, tf.constant([1, 2], tf.int64),
                                      tf.constant([[big + 1], [7]], value_dtype))
    gen.tfra_cuckoo_hash_table_accum(t, tf.constant([1, 3], tf.int64),
                                     tf.constant([[2], [5]], value_dtype),
                                     tf.constant([True, False]))
    assert _content(t, value_dtype) == {1: [big + 3], 2: [7], 3: [5]}
    found = gen.tfra_cuckoo_hash_table_find(t, tf.constant([3, 9], tf.int64),
                                            tf.constant([-1], value_dtype))
    assert found.numpy().tolist() == [[5], [-1]]
