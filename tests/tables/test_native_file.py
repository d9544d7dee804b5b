"""Native per-shard files: round trips, corrupt and truncated files, saving under concurrent writes."""

import os
import threading

import numpy as np
import pytest
import tensorflow as tf

from tfra_dynamic_embedding.tables import native

pytestmark = pytest.mark.skipif(not native.is_available(),
                                reason=f"native op library not built: {native.load_error()}")


def snapshot(t):
    keys, values, stamps, freqs = t.export_with_meta()
    keys = [k.decode() if isinstance(k, bytes) else int(k) for k in keys.numpy()]
    values = tf.cast(values, tf.float64).numpy()
    return {k: (tuple(v), int(s), int(f))
            for k, v, s, f in zip(keys, values, stamps.numpy(), freqs.numpy())}


def filled(key_dtype=tf.int64, value_dtype=tf.float32, dim=4, n=300, seed=0):
    t = native.NativeKVTable(key_dtype, value_dtype, dim, "f", num_shards=8)
    rng = np.random.default_rng(seed)
    ids = rng.choice(10**9, size=n, replace=False)
    keys = ([f"feature/{i}" * (1 + i % 4) for i in ids] if key_dtype == tf.string else ids)
    t.set_step(7)
    t.insert(tf.constant(keys, key_dtype), tf.constant(rng.integers(-50, 50, (n, dim)), value_dtype))
    t.set_step(9)
    t.accum(tf.constant(keys[: n // 3], key_dtype), tf.ones([n // 3, dim], value_dtype))
    return t


@pytest.mark.parametrize("key_dtype,value_dtype", [
    (tf.int64, tf.float32), (tf.int32, tf.float16), (tf.string, tf.bfloat16), (tf.string, tf.float64)])
def test_round_trip_keeps_rows_and_metadata(tmp_path, key_dtype, value_dtype):
    t = filled(key_dtype, value_dtype)
    path = str(tmp_path / "shard0")
    t.save_to(path)
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]  # temp file renamed away
    u = native.NativeKVTable(key_dtype, value_dtype, 4, "g", num_shards=3)
    u.insert(tf.constant(["zzz"] if key_dtype == tf.string else [5], key_dtype),
             tf.ones([1, 4], value_dtype))
    assert int(u.load_from(path)) == 300  # loading replaces the old content
    assert snapshot(u) == snapshot(t)


def test_empty_and_multi_block_tables(tmp_path):
    empty = native.NativeKVTable(tf.int64, tf.float32, 3, "e")
    empty.save_to(str(tmp_path / "empty"))
    u = native.NativeKVTable(tf.int64, tf.float32, 3, "u")
    u.insert(tf.constant([1], tf.int64), tf.ones([1, 3]))
    assert int(u.load_from(str(tmp_path / "empty"))) == 0 and int(u.size()) == 0
    big = filled(dim=64, n=20000)  # ~5 MB: several 1 MB blocks per file
    big.save_to(str(tmp_path / "big"))
    assert os.path.getsize(tmp_path / "big") > 20000 * 64 * 4
    u = native.NativeKVTable(tf.int64, tf.float32, 64, "u64")
    u.load_from(str(tmp_path / "big"))
    assert snapshot(u) == snapshot(big)


def test_truncated_and_corrupt_files_leave_table_unchanged(tmp_path):
    t = filled(n=2000, dim=8)
    path = tmp_path / "good"
    t.save_to(str(path))
    data = path.read_bytes()
    u = native.NativeKVTable(tf.int64, tf.float32, 8, "u")
    u.insert(tf.constant([1, 2], tf.int64), tf.ones([2, 8]))
    before = snapshot(u)
    rng = np.random.default_rng(3)
    bad = tmp_path / "bad"
    cuts = [0, 10, 63, 64, 70, len(data) // 2, len(data) - 21, len(data) - 1]
    for cut in cuts:
        bad.write_bytes(data[:cut])
        with pytest.raises(tf.errors.DataLossError):
            u.load_from(str(bad))
        assert snapshot(u) == before, cut
    flips = sorted(set(rng.integers(0, len(data), 40).tolist()) | {5, 30, 70, len(data) - 3})
    for pos in flips:
        corrupt = bytearray(data)
        corrupt[pos] ^= 0x10
        bad.write_bytes(bytes(corrupt))
        with pytest.raises((tf.errors.DataLossError, tf.errors.InvalidArgumentError)):
            u.load_from(str(bad))
        assert snapshot(u) == before, pos
    bad.write_bytes(data + b"x")
    with pytest.raises(tf.errors.DataLossError, match="after the footer"):
        u.load_from(str(bad))
    assert snapshot(u) == before


def test_mismatched_and_missing_files(tmp_path):
    t = filled(dim=4)
    t.save_to(str(tmp_path / "dim4"))
    wrong_dim = native.NativeKVTable(tf.int64, tf.float32, 5, "w")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"int64 keys -> float\[4\]"):
        wrong_dim.load_from(str(tmp_path / "dim4"))
    wrong_type = native.NativeKVTable(tf.int64, tf.float64, 4, "w2")
    with pytest.raises(tf.errors.InvalidArgumentError, match="double"):
        wrong_type.load_from(str(tmp_path / "dim4"))
    with pytest.raises(tf.errors.NotFoundError):
        wrong_type.load_from(str(tmp_path / "nope"))
    (tmp_path / "junk").write_bytes(b"not a table file at all" * 10)
    with pytest.raises(tf.errors.DataLossError, match="bad magic"):
        wrong_type.load_from(str(tmp_path / "junk"))
    # A missing directory is created (as TFRA's kernels do; a generation directory of a
    # multi-shard save is named only when the op runs).
    t.save_to(str(tmp_path / "no_such_dir" / "sub" / "x"))
    copy = native.NativeKVTable(tf.int64, tf.float32, 4, "copy")
    copy.load_from(str(tmp_path / "no_such_dir" / "sub" / "x"))
    assert snapshot(copy) == snapshot(t)
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(tf.errors.OpError):
        t.save_to(str(tmp_path / "file" / "x"))  # a directory that cannot be made
    with pytest.raises(tf.errors.InvalidArgumentError, match="path must not be empty"):
        t.save_to("")


def test_save_while_other_threads_write(tmp_path):
    # Rows are a function of their key, so every row in the file must be consistent, and every
    # key present before the save began (and never removed) must be in the file.
    dim = 16
    t = native.NativeKVTable(tf.int64, tf.float32, dim, "busy", num_shards=16)
    base = np.arange(50000, dtype=np.int64)

    def rows(ids):
        return tf.constant(np.repeat(ids[:, None].astype(np.float32), dim, 1))

    t.insert(tf.constant(base), rows(base))
    stop = threading.Event()
    errors = []

    def writer(w):
        rng = np.random.default_rng(w)
        try:
            while not stop.is_set():
                ids = rng.integers(100000, 200000, 2000)
                t.insert(tf.constant(ids), rows(ids))
                t.remove(tf.constant(rng.integers(100000, 200000, 500)))
        except Exception as error:  # pylint: disable=broad-except
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for th in threads:
        th.start()
    try:
        for i in range(3):
            t.save_to(str(tmp_path / f"s{i}"))
    finally:
        stop.set()
        for th in threads:
            th.join()
    assert not errors
    for i in range(3):
        u = native.NativeKVTable(tf.int64, tf.float32, dim, f"u{i}")
        u.load_from(str(tmp_path / f"s{i}"))
        keys, values = u.export()
        keys, values = keys.numpy(), values.numpy()
        np.testing.assert_array_equal(values, np.repeat(keys[:, None].astype(np.float32), dim, 1))
        assert set(base.tolist()) <= set(keys.tolist())
        assert len(set(keys.tolist())) == len(keys)
