"""Eight threads of mixed ops on one native table, for a bounded time."""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tfra_dynamic_embedding.tables import native

pytestmark = pytest.mark.skipif(not native.is_available(),
                                reason=f"native op library not built: {native.load_error()}")

THREADS = 8
SECONDS = 2.0
DIM = 4


def run_threads(target):
    errors = []
    deadline = time.monotonic() + SECONDS

    def guarded(w):
        try:
            target(w, deadline)
        except Exception as error:  # pylint: disable=broad-except
            errors.append((w, error))

    threads = [threading.Thread(target=guarded, args=(w,)) for w in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def test_disjoint_ranges_equal_serial_replay():
    # Each thread owns a key range, so its own dict is the exact expected content of that range
    # at every moment: checked after every op, and the final table is the union of the dicts.
    t = native.NativeKVTable(tf.int64, tf.float64, DIM, "disjoint", num_shards=8)
    refs = [dict() for _ in range(THREADS)]
    zero = native.NativeInitializer("constant", 0.0)
    ops_done = [0] * THREADS

    def work(w, deadline):
        rng = np.random.default_rng(w)
        ref = refs[w]
        lo = w * 1_000_000
        while time.monotonic() < deadline:
            ids = lo + rng.integers(0, 400, size=int(rng.integers(1, 64)))
            keys = tf.constant(ids, tf.int64)
            op = rng.integers(0, 5)
            if op == 0:
                rows = rng.integers(-20, 20, (len(ids), DIM)).astype(np.float64)
                t.insert(keys, rows)
                for i, r in zip(ids, rows):
                    ref[int(i)] = r
            elif op == 1:
                deltas = rng.integers(-3, 4, (len(ids), DIM)).astype(np.float64)
                t.accum(keys, deltas)
                for i, d in zip(ids, deltas):
                    ref[int(i)] = ref.get(int(i), np.zeros(DIM)) + d
            elif op == 2:
                removed = int(t.remove(keys))
                assert removed == len({int(i) for i in ids} & set(ref))
                for i in ids:
                    ref.pop(int(i), None)
            elif op == 3:
                rows, exists = t.find_or_insert(keys, zero)
                want_exists = [int(i) in ref for i in ids]
                np.testing.assert_array_equal(exists.numpy(), want_exists)
                for i in ids:
                    ref.setdefault(int(i), np.zeros(DIM))
                np.testing.assert_array_equal(rows.numpy(), [ref[int(i)] for i in ids])
            else:
                rows, exists = t.lookup_with_exists(keys, tf.fill([DIM], tf.constant(-99.0, tf.float64)))
                want = [ref.get(int(i), np.full(DIM, -99.0)) for i in ids]
                np.testing.assert_array_equal(rows.numpy(), want)
            ops_done[w] += 1

    run_threads(work)
    assert min(ops_done) > 10
    expected = {k: tuple(v) for ref in refs for k, v in ref.items()}
    keys, values = t.export()
    got = dict(zip(keys.numpy().tolist(), map(tuple, values.numpy())))
    assert got == expected
    assert int(t.size()) == len(expected)


def test_shared_keys_lose_no_key_and_no_update():
    # Threads 0-3 add 1 to shared keys (with duplicates in a batch) and find_or_insert them;
    # threads 4-7 churn other keys with insert/remove and read the shared ones. Every accum must
    # land: a shared key's final value is exactly the number of times it was accumulated.
    t = native.NativeKVTable(tf.int64, tf.float32, DIM, "shared", num_shards=4)
    shared = np.arange(300, dtype=np.int64)
    counts = [np.zeros(len(shared), np.int64) for _ in range(THREADS)]
    zero = native.NativeInitializer("constant", 0.0)

    def work(w, deadline):
        rng = np.random.default_rng(100 + w)
        while time.monotonic() < deadline:
            if w < 4:
                ids = rng.choice(shared, size=int(rng.integers(1, 200)))
                if rng.integers(0, 3) == 0:
                    t.find_or_insert(tf.constant(ids), zero)
                else:
                    t.accum(tf.constant(ids), tf.ones([len(ids), DIM]))
                    np.add.at(counts[w], ids, 1)
            else:
                churn = 10_000 + rng.integers(0, 5000, size=int(rng.integers(1, 300)))
                t.insert(tf.constant(churn), np.repeat(churn[:, None], DIM, 1).astype(np.float32))
                t.remove(tf.constant(10_000 + rng.integers(0, 5000, size=100)))
                # >= 16384 keys: the read takes every shard's lock (in-order path) while the
                # other threads write.
                rows, _ = t.lookup_with_exists(tf.constant(np.tile(shared, 56)), tf.zeros([DIM]))
                rows = rows.numpy()
                assert (rows >= 0).all() and (rows == rows[:, :1]).all()
                rows, exists = t.lookup_with_exists(tf.constant(churn), tf.zeros([DIM]))
                present = rows.numpy()[exists.numpy()]
                np.testing.assert_array_equal(present[:, 0], churn[exists.numpy()])

    run_threads(work)
    total = sum(counts)
    touched = total > 0
    rows, exists = t.lookup_with_exists(tf.constant(shared), tf.fill([DIM], -1.0))
    assert exists.numpy()[touched].all()
    np.testing.assert_array_equal(rows.numpy()[touched], np.repeat(total[touched, None], DIM, 1))
    keys, values = t.export()
    assert int(t.size()) == keys.shape[0] == len(set(keys.numpy().tolist()))
    churned = keys.numpy() >= 10_000
    np.testing.assert_array_equal(values.numpy()[churned][:, 0], keys.numpy()[churned])
