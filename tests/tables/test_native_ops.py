"""Native table ops against a Python dict reference: every op, dtype, execution mode, bad input."""

import gc
import threading

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import CPUS
from tfra_dynamic_embedding.tables import native
from tfra_dynamic_embedding.tables import native_slots

pytestmark = pytest.mark.skipif(not native.is_available(),
                                reason=f"native op library not built: {native.load_error()}")

KEY_DTYPES = [tf.int32, tf.int64, tf.string]
VALUE_DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]


def keys_of(key_dtype, ids):
    ids = np.asarray(ids, np.int64)
    if key_dtype == tf.string:
        return tf.constant([f"key-{i}" for i in ids], tf.string, shape=[len(ids)])
    return tf.constant(ids, key_dtype)


def ids_of(keys):
    keys = keys.numpy()
    if keys.dtype == object:
        return np.array([int(k.decode().split("-", 1)[1]) for k in keys], np.int64)
    return keys.astype(np.int64)


def to_np(t):
    return tf.cast(t, tf.float64).numpy()


def table(key_dtype=tf.int64, value_dtype=tf.float32, dim=3, **kw):
    return native.NativeKVTable(key_dtype, value_dtype, dim, "t", **kw)


def content(t):
    keys, values = t.export()
    return dict(zip(ids_of(keys).tolist(), map(tuple, to_np(values))))


@pytest.mark.parametrize("key_dtype", KEY_DTYPES)
@pytest.mark.parametrize("value_dtype", VALUE_DTYPES)
def test_every_op_matches_dict(key_dtype, value_dtype):
    rng = np.random.default_rng(7)
    dim = 5
    t = table(key_dtype, value_dtype, dim, num_shards=4)
    ref = {}
    # Small integers are exact in every value dtype, so sums compare exactly.
    for _ in range(6):
        ids = rng.integers(0, 60, size=40)  # with duplicates: the last row wins
        rows = rng.integers(-8, 9, size=(40, dim)).astype(np.float64)
        t.insert(keys_of(key_dtype, ids), tf.constant(rows, value_dtype))
        for i, r in zip(ids, rows):
            ref[int(i)] = tuple(r)

        ids = rng.integers(0, 80, size=30)  # duplicates sum; missing keys start from the delta
        deltas = rng.integers(-3, 4, size=(30, dim)).astype(np.float64)
        t.accum(keys_of(key_dtype, ids), tf.constant(deltas, value_dtype))
        for i, d in zip(ids, deltas):
            ref[int(i)] = tuple(np.asarray(ref.get(int(i), np.zeros(dim))) + d)

        ids = rng.integers(0, 100, size=10)
        removed = int(t.remove(keys_of(key_dtype, ids)))
        assert removed == len({int(i) for i in ids} & set(ref))
        for i in ids:
            ref.pop(int(i), None)

        assert int(t.size()) == len(ref)
        probe = rng.integers(0, 100, size=50)
        defaults = rng.integers(-9, 9, size=(50, dim)).astype(np.float64)
        rows, exists = t.lookup_with_exists(keys_of(key_dtype, probe),
                                            tf.constant(defaults, value_dtype))
        want = np.array([ref.get(int(i), defaults[j]) for j, i in enumerate(probe)])
        np.testing.assert_array_equal(to_np(rows), want)
        np.testing.assert_array_equal(exists.numpy(), [int(i) in ref for i in probe])
        one = t.lookup(keys_of(key_dtype, probe), tf.constant([-1.0] * dim, value_dtype))
        want = np.array([ref.get(int(i), [-1.0] * dim) for i in probe])
        np.testing.assert_array_equal(to_np(one), want)
        assert content(t) == ref

    # import_ replaces the content; clear empties it.
    ids = np.arange(1000, 1020)
    rows = np.arange(20 * dim, dtype=np.float64).reshape(20, dim) % 7
    t.import_(keys_of(key_dtype, ids), tf.constant(rows, value_dtype))
    assert content(t) == {int(i): tuple(r) for i, r in zip(ids, rows)}
    t.clear()
    assert int(t.size()) == 0
    assert content(t) == {}
    t.insert(keys_of(key_dtype, [3]), tf.ones([1, dim], value_dtype))  # usable after clear
    assert content(t) == {3: (1.0,) * dim}


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string])
def test_large_batches_keep_batch_order(key_dtype):
    # Batches of >= 16384 keys are partitioned by several threads; duplicates must still apply
    # in batch order (the last insert wins, accum deltas add up).
    rng = np.random.default_rng(3)
    n, dim = 40_000, 2
    ids = rng.integers(0, 5000, size=n)            # ~8 copies of every key
    rows = np.stack([np.arange(n), -np.arange(n)], axis=1).astype(np.float64)
    t = table(key_dtype, tf.float64, dim)
    t.insert(keys_of(key_dtype, ids), tf.constant(rows))
    last = {int(i): tuple(r) for i, r in zip(ids, rows)}
    assert content(t) == last
    t.accum(keys_of(key_dtype, ids), tf.ones([n, dim], tf.float64))
    counts = np.bincount(ids, minlength=5000)
    assert content(t) == {i: (r[0] + counts[i], r[1] + counts[i]) for i, r in last.items()}
    probe = rng.integers(0, 10_000, size=n)
    got, exists = t.lookup_with_exists(keys_of(key_dtype, probe), tf.zeros([n, dim], tf.float64))
    np.testing.assert_array_equal(exists.numpy(), probe < 5000)
    np.testing.assert_array_equal(to_np(got)[:, 0], [last[int(i)][0] + counts[i] if i < 5000
                                                     else 0.0 for i in probe])


@pytest.mark.parametrize("key_dtype", KEY_DTYPES)
def test_large_read_only_batches_equal_small_ones(key_dtype):
    # Read-only batches of >= 16384 keys visit the keys in batch order with every shard locked;
    # smaller ones are bucketed by shard. Both must give the same rows and presence, for finds
    # with one default row or a row per key and for fused lookup-or-init draws (seeded normal
    # and uniform: the same rows in any batch).
    rng = np.random.default_rng(5)
    dim = 20
    t = table(key_dtype, tf.float32, dim)
    held = rng.integers(0, 50_000, size=6000)
    t.insert(keys_of(key_dtype, held), tf.constant(rng.standard_normal((6000, dim)), tf.float32))
    probe = np.concatenate([held, held[:3000], rng.integers(50_000, 60_000, size=9000), held[:500]])
    rng.shuffle(probe)
    keys = keys_of(key_dtype, probe)
    per_key = tf.constant(rng.standard_normal((len(probe), dim)), tf.float32)

    def in_small_batches(fn):
        parts = [fn(i, min(i + 2000, len(probe))) for i in range(0, len(probe), 2000)]
        return [np.concatenate([p[j].numpy() for p in parts]) for j in range(2)]

    cases = {
        "one default": (lambda lo, hi: t.lookup_with_exists(keys[lo:hi], tf.fill([dim], -3.0))),
        "per key": (lambda lo, hi: t.lookup_with_exists(keys[lo:hi], per_key[lo:hi])),
        "seeded": (lambda lo, hi: t.lookup_or_init(
            keys[lo:hi], native.NativeInitializer("normal", 0.0, 1.0, seed=4))),
        "uniform": (lambda lo, hi: t.lookup_or_init(
            keys[lo:hi], native.NativeInitializer("uniform", -1.0, 1.0, seed=4))),
    }
    for name, fn in cases.items():
        whole = [x.numpy() for x in fn(0, len(probe))]
        small = in_small_batches(fn)
        np.testing.assert_array_equal(whole[1], small[1], err_msg=name)
        np.testing.assert_array_equal(whole[0], small[0], err_msg=name)
        np.testing.assert_array_equal(whole[1], np.isin(probe, held), err_msg=name)
    assert int(t.size()) == len(np.unique(held))


def test_empty_batches():
    t = table(dim=2)
    empty = tf.zeros([0], tf.int64)
    t.insert(empty, tf.zeros([0, 2]))
    t.accum(empty, tf.zeros([0, 2]))
    assert int(t.remove(empty)) == 0
    rows, exists = t.lookup_with_exists(empty, tf.zeros([2]))
    assert rows.shape == (0, 2) and exists.shape == (0,)
    rows, exists = t.find_or_insert(empty, lambda keys: tf.zeros(tf.stack([tf.size(keys), 2])))
    assert rows.shape == (0, 2)
    keys, values = t.export()
    assert keys.shape == (0,) and values.shape == (0, 2)
    assert int(t.size()) == 0


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string])
def test_growth_with_removals_keeps_every_key(key_dtype):
    # Many inserts and removals through index growth and tombstone rebuilds; the index is
    # rebuilt from the slab's live rows, so freed and reused rows must never reappear.
    t = table(key_dtype, dim=2, num_shards=2)
    ref = {}
    rng = np.random.default_rng(1)
    for step in range(12):
        ids = rng.integers(0, 40000, size=8000)
        t.insert(keys_of(key_dtype, ids), tf.constant(np.stack([ids, ids + step], 1), tf.float32))
        for i in ids:
            ref[int(i)] = (float(i), float(i + step))
        gone = rng.integers(0, 40000, size=6000)
        t.remove(keys_of(key_dtype, gone))
        for i in gone:
            ref.pop(int(i), None)
    assert int(t.size()) == len(ref)
    assert content(t) == ref
    probe = np.arange(40000)
    _, exists = t.lookup_with_exists(keys_of(key_dtype, probe), tf.zeros([2]))
    np.testing.assert_array_equal(exists.numpy(), [int(i) in ref for i in probe])


def test_find_or_insert_draws_only_for_distinct_missing_keys():
    t = table(dim=2)
    t.insert(tf.constant([1, 2], tf.int64), tf.constant([[1.0, 1.0], [2.0, 2.0]]))
    drawn = []

    def make_rows(keys):
        drawn.append(sorted(keys.numpy().tolist()))
        n = tf.size(keys)
        return tf.reshape(tf.range(2 * n, dtype=tf.float32) + 10.0, tf.stack([n, 2]))

    rows, exists = t.find_or_insert(tf.constant([1, 5, 2, 6, 5, 6, 6], tf.int64), make_rows)
    assert drawn == [[5, 6]]  # keys 5 and 6, each once
    np.testing.assert_array_equal(exists.numpy(), [1, 0, 1, 0, 0, 0, 0])
    r = rows.numpy()
    np.testing.assert_array_equal(r[[0, 2]], [[1, 1], [2, 2]])
    np.testing.assert_array_equal(r[1], r[4])  # a repeated missing key gets one row
    np.testing.assert_array_equal(r[3], r[5])
    assert sorted(map(tuple, r[[1, 3]])) == [(10.0, 11.0), (12.0, 13.0)]
    assert content(t) == {1: (1, 1), 2: (2, 2), 5: tuple(r[1]), 6: tuple(r[3])}
    drawn.clear()
    rows2, exists2 = t.find_or_insert(tf.constant([5, 6], tf.int64), make_rows)
    assert drawn == [[]] and exists2.numpy().all()
    np.testing.assert_array_equal(rows2.numpy(), r[[1, 3]])


def test_fused_find_or_insert_reports_state_before_the_op():
    t = table(dim=2)
    t.insert(tf.constant([1], tf.int64), tf.ones([1, 2]))
    init = native.NativeInitializer("uniform", 0.0, 1.0, seed=5)
    rows, exists = t.find_or_insert(tf.constant([5, 1, 5, 6], tf.int64), init)
    np.testing.assert_array_equal(exists.numpy(), [False, True, False, False])
    r = rows.numpy()
    np.testing.assert_array_equal(r[0], r[2])
    np.testing.assert_array_equal(r[1], [1, 1])
    assert int(t.size()) == 3


def test_lookup_or_init_never_inserts():
    t = table(dim=2)
    t.insert(tf.constant([1], tf.int64), tf.constant([[5.0, 5.0]]))
    rows, exists = t.lookup_or_init(tf.constant([1, 4, 4], tf.int64),
                                    lambda keys: tf.fill(tf.stack([tf.size(keys), 2]), 7.0))
    np.testing.assert_array_equal(rows.numpy(), [[5, 5], [7, 7], [7, 7]])
    np.testing.assert_array_equal(exists.numpy(), [True, False, False])
    assert int(t.size()) == 1


@pytest.mark.parametrize("value_dtype", VALUE_DTYPES)
def test_native_initializers(value_dtype):
    n, dim = 4000, 16
    keys = tf.range(n, dtype=tf.int64)
    cases = {
        "constant": (native.NativeInitializer("constant", 0.5), None),
        "uniform": (native.NativeInitializer("uniform", -2.0, 1.0, seed=3), (-0.5, np.sqrt(0.75))),
        "normal": (native.NativeInitializer("normal", 1.0, 0.5, seed=3), (1.0, 0.5)),
        "truncated": (native.NativeInitializer("truncated_normal", 0.0, 2.0, seed=3), (0.0, 1.76)),
    }
    for name, (init, moments) in cases.items():
        t = table(tf.int64, value_dtype, dim)
        peek, exists = t.lookup_or_init(keys, init)
        assert not exists.numpy().any() and int(t.size()) == 0, name
        rows, exists = t.find_or_insert(keys, init)
        assert not exists.numpy().any() and int(t.size()) == n, name
        # The initial row is a function of (seed, key): peeking and inserting agree.
        np.testing.assert_array_equal(to_np(peek), to_np(rows), err_msg=name)
        r = to_np(rows)
        if moments is None:
            np.testing.assert_array_equal(r, 0.5)
            continue
        mean, std = moments
        assert abs(r.mean() - mean) < 0.03 and abs(r.std() - std) < 0.03, (name, r.mean(), r.std())
        # Rows differ across keys and within a row (16-bit floats have few distinct values).
        wide = value_dtype.size >= 4
        assert len(np.unique(r[:, 0])) > (n * 0.9 if wide else 100)
        assert len(np.unique(r[0])) >= (dim if wide else dim // 2)
        if name == "uniform":
            assert r.min() >= -2.0 and r.max() <= 1.0
        if name == "truncated":
            assert np.abs(r).max() <= 4.0 + 0.02
    a = table().lookup_or_init(keys[:50], native.NativeInitializer("normal", 0, 1, seed=1))[0]
    b = table().lookup_or_init(keys[:50], native.NativeInitializer("normal", 0, 1, seed=2))[0]
    assert not np.allclose(a.numpy(), b.numpy())


def test_tf_function_and_v1_graph():
    t = table(tf.string, tf.float64, 2)
    init = native.NativeInitializer("constant", 1.0)

    @tf.function
    def step(keys):
        rows, _ = t.find_or_insert(keys, init)
        t.accum(keys, tf.ones_like(rows))
        return t.lookup(keys, tf.zeros([2], tf.float64))

    np.testing.assert_array_equal(step(tf.constant(["a", "b"])).numpy(), [[2, 2], [2, 2]])
    np.testing.assert_array_equal(step(tf.constant(["a", "c"])).numpy(), [[3, 3], [2, 2]])
    assert int(t.size()) == 3

    with tf.Graph().as_default():
        g = native.NativeKVTable(tf.int32, tf.bfloat16, 2, "graph_table")
        keys = tf.compat.v1.placeholder(tf.int32, [None])
        rows, _ = g.find_or_insert(keys, lambda k: tf.fill(tf.stack([tf.size(k), 2]),
                                                           tf.constant(4.0, tf.bfloat16)))
        with tf.control_dependencies([rows]):
            acc = g.accum(keys, tf.ones(tf.stack([tf.size(keys), 2]), tf.bfloat16))
        with tf.control_dependencies([acc]):
            out = g.lookup(keys, tf.zeros([2], tf.bfloat16))
        size = g.size()
        with tf.compat.v1.Session() as sess:
            got = sess.run(out, {keys: [1, 2]})
            np.testing.assert_array_equal(got.astype(np.float64), [[5, 5], [5, 5]])
            got = sess.run(out, {keys: [1]})  # the table lives across runs of the session
            np.testing.assert_array_equal(got.astype(np.float64), [[6, 6]])
            assert sess.run(size) == 2


def test_placement_and_shared_names():
    t = native.NativeKVTable(tf.int64, tf.float32, 2, "placed", device=CPUS[2])
    assert t.resource_handle.device.endswith("CPU:2")
    t.insert(tf.constant([1], tf.int64), tf.ones([1, 2]))
    # Two objects with one shared name on one device address one table ...
    a = native.NativeKVTable(tf.int64, tf.float32, 2, "s", device=CPUS[1], shared_name="shared_x")
    b = native.NativeKVTable(tf.int64, tf.float32, 2, "s", device=CPUS[1], shared_name="shared_x")
    a.insert(tf.constant([7], tf.int64), tf.ones([1, 2]))
    assert int(b.size()) == 1
    # ... and a different dim under that name is refused.
    with pytest.raises(tf.errors.InvalidArgumentError, match="shared_name 'shared_x'"):
        native.NativeKVTable(tf.int64, tf.float32, 3, "s", device=CPUS[1], shared_name="shared_x")


def test_eager_table_is_destroyed_with_its_object():
    t = table()
    t.insert(tf.constant([1], tf.int64), tf.ones([1, 3]))
    handle = t.resource_handle
    gen = native.ops()
    assert int(gen.tfra_de_size(handle)) == 1
    del t
    gc.collect()
    with pytest.raises(tf.errors.NotFoundError):
        gen.tfra_de_size(handle)


def test_metadata_stamps_freqs_and_evict():
    t = table(dim=1)
    t.set_step(10)
    t.insert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 1]))
    t.set_step(20)
    t.accum(tf.constant([2, 2, 4], tf.int64), tf.ones([3, 1]))
    t.find_or_insert(tf.constant([3, 5], tf.int64), native.NativeInitializer("constant", 0.0))
    keys, values, stamps, freqs = t.export_with_meta()
    meta = {int(k): (int(s), int(f)) for k, s, f in zip(keys.numpy(), stamps.numpy(), freqs.numpy())}
    # Writes bump freq and restamp; find_or_insert of an existing key reads only.
    assert meta == {1: (10, 1), 2: (20, 3), 3: (10, 1), 4: (20, 1), 5: (20, 1)}
    assert dict(zip(keys.numpy().tolist(), values.numpy()[:, 0])) == {1: 1, 2: 3, 3: 1, 4: 1, 5: 0}
    # Metadata travels through import and is used by evict.
    u = table(dim=1)
    u.import_with_meta(keys, values, stamps, freqs)
    assert int(u.evict(min_stamp=15)) == 2      # keys 1, 3
    assert int(u.evict(min_freq=2)) == 2        # keys 4, 5
    assert content(u) == {2: (3.0,)}
    t.set_step(-1)  # back to wall-clock seconds
    t.insert(tf.constant([9], tf.int64), tf.ones([1, 1]))
    _, _, stamps, _ = t.export_with_meta()
    assert stamps.numpy().max() > 1_600_000_000


@pytest.mark.parametrize("key_dtype", KEY_DTYPES)
@pytest.mark.parametrize("order", ["lru", "lfu"])
def test_bound_evicts_in_the_write_lowest_score_first(key_dtype, order):
    t = table(key_dtype, dim=1, num_shards=1)   # one shard: the order is global
    for i in range(20):   # key i: stamp i + 1
        t.set_step(i + 1)
        t.insert(keys_of(key_dtype, [i]), tf.fill([1, 1], float(i)))
    t.set_step(30)
    t.insert(keys_of(key_dtype, [0, 1]), tf.ones([2, 1]))   # LRU: newest; LFU: 2 writes
    t.set_bound(20, 0, order)
    t.set_step(31)
    t.insert(keys_of(key_dtype, [2, 100, 101, 102]), tf.ones([4, 1]))
    held = set(content(t))
    assert len(held) == 20 and {2, 100, 101, 102} <= held   # key 2: in the batch, kept
    gone = set(range(20)) - held
    assert gone == {3, 4, 5}   # the lowest scores: oldest stamps, 1 write each
    t.set_bound(0, 0, order)   # no bound
    t.insert(keys_of(key_dtype, [500]), tf.ones([1, 1]))
    assert int(t.size()) == 21


def test_bound_keeps_rows_of_the_current_stamp_and_evicts_extra_rows():
    t = table(dim=1, num_shards=1)
    t.set_step(1)
    t.insert(tf.constant(np.arange(5), tf.int64), tf.zeros([5, 1]))
    t.set_bound(5, 2, "lru")
    # Every row was written at this stamp (by this step, or one running beside it): none
    # goes, the table is over the bound until a later stamp's write.
    t.insert(tf.constant(np.arange(5, 10), tf.int64), tf.zeros([5, 1]))
    assert int(t.size()) == 10
    t.set_step(2)
    t.insert(tf.constant([10], tf.int64), tf.zeros([1, 1]))   # 6 over + 2 extra go
    assert int(t.size()) == 3 and 10 in content(t)


@pytest.mark.parametrize("order", ["lru", "lfu"])
def test_bound_holds_when_writers_steps_interleave(order):
    """Writers whose steps run back and forth (asynchronous workers setting the table's step):
    a write behind the others may evict rows of later stamps, after every older row, so the
    table keeps its bound; a shard found without a row to evict at one stamp is looked at
    again once a write at another stamp has touched it."""
    t = table(dim=1, num_shards=1)
    t.set_step(1)
    for _ in range(3):   # key 0: three writes
        t.insert(tf.constant([0], tf.int64), tf.zeros([1, 1]))
    t.insert(tf.constant([1], tf.int64), tf.zeros([1, 1]))
    t.set_step(5)
    t.insert(tf.constant([2, 3], tf.int64), tf.zeros([2, 1]))
    t.set_bound(4, 0, order)
    t.set_step(3)   # behind the writer of keys 2 and 3
    t.insert(tf.constant([10, 11, 12], tf.int64), tf.ones([3, 1]))
    # Keys 0 and 1 (stamp 1) go first, then one of the rows of stamp 5: under LFU too, though
    # key 0 has more writes than they do.
    assert int(t.size()) == 4 and {10, 11, 12} <= set(content(t))
    assert len({2, 3} & set(content(t))) == 1
    t.set_step(5)
    t.insert(tf.constant([20], tf.int64), tf.ones([1, 1]))   # evicts a row of stamp 3
    assert int(t.size()) == 4 and 20 in content(t)
    # Every row at stamp 5: a write there has none to evict and keeps its key (over the bound
    # until a later write; the shard is marked as having no row for stamp 5).
    t.insert(tf.constant([21, 22], tf.int64), tf.ones([2, 1]))
    t.insert(tf.constant([23], tf.int64), tf.ones([1, 1]))
    assert int(t.size()) > 4
    t.set_step(4)   # a late writer at stamp 4 evicts rows of stamp 5, and its row ...
    t.insert(tf.constant([30], tf.int64), tf.ones([1, 1]))
    assert int(t.size()) == 4 and 30 in content(t)
    t.set_step(5)   # ... is one a write at stamp 5 may evict, despite the shard's mark
    t.insert(tf.constant([31], tf.int64), tf.ones([1, 1]))
    held = set(content(t))
    assert int(t.size()) == 4 and 31 in held and 30 not in held


def _poll_size_while(t, writer, writers=4):
    """Runs `writer(k)` for k < `writers` in threads while a reader thread polls `t.size()`;
    asserts that no writer raised and returns the polled sizes."""
    polled, errors, done = [], [], threading.Event()

    def guarded(k):
        try:
            writer(k)
        except Exception as e:   # pylint: disable=broad-except
            errors.append(e)

    def reader():
        while not done.is_set():
            polled.append(int(t.size()))

    poller = threading.Thread(target=reader)
    poller.start()
    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(writers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    done.set()
    poller.join(60)
    assert not errors and polled
    return polled


def _write_new_keys_with_a_poller(t, rounds, step_of):
    """Four writer threads each insert `rounds` batches of 25 new keys (writer k's keys from
    10**6 (k + 1)), setting `t.set_step(step_of(k, j))` before batch j when it is not None,
    while a reader thread polls `t.size()`. Asserts the bound of 1,000 keys held throughout
    and the export's keys are unique; returns the exported keys."""
    sizes = []

    def writer(k):
        for j in range(rounds):
            step = step_of(k, j)
            if step is not None:
                t.set_step(step)
            ids = np.arange(10**6 * (k + 1) + 25 * j, 10**6 * (k + 1) + 25 * j + 25)
            t.insert(tf.constant(ids, tf.int64), tf.ones([25, 4]))
            sizes.append(int(t.size()))

    polled = _poll_size_while(t, writer)
    assert len(sizes) == 4 * rounds
    assert max(sizes) <= 1000 and max(polled) <= 1000 and int(t.size()) <= 1000
    keys = t.export()[0].numpy()
    assert len(np.unique(keys)) == len(keys) == int(t.size())
    return keys


def _full_bounded_table(num_shards):
    """1,000 keys written at step 1, bounded at 1,000 (LRU, no extra rows)."""
    t = table(dim=4, num_shards=num_shards)
    t.set_step(1)
    t.insert(tf.constant(np.arange(1000), tf.int64), tf.zeros([1000, 4]))
    t.set_bound(1000, 0, "lru")
    return t


def test_bound_holds_under_writers_at_far_apart_steps():
    """Four writers, each setting the table's step from its own range (50 steps apart), with
    a reader polling the size: whoever writes at the lowest step finds every row left newer
    than its step once the old rows are gone (before rows of later stamps could go: up to
    146 keys over a 1,000-key bound, in every round)."""
    for _ in range(4):   # 10,000 new keys a round
        _write_new_keys_with_a_poller(_full_bounded_table(1024), 100,
                                      lambda k, j: 2 + j + 50 * k)


def test_bound_holds_under_concurrent_writers():
    """Writers in threads, each adding new keys, and a reader polling the size: the table never
    passes the bound, also as `size()` sees it while keys move between shards. (A sum of the
    shards' sizes read under way counted a key evicted in one shard and added in another twice:
    such rounds showed a size over the bound in a quarter to a third of them.)"""
    for _ in range(30):
        t = _full_bounded_table(4096)   # ~1 row a shard: most evictions are in other shards
        t.set_step(2)
        # 600 new keys in all: old rows to evict stay in shards no writer holds.
        keys = _write_new_keys_with_a_poller(t, 6, lambda k, j: None)
        new = [10**6 * (k + 1) + np.arange(150) for k in range(4)]
        assert np.isin(np.concatenate(new), keys).all()   # old rows made room, never new ones


def _keys_by_shard(n):
    """Keys 0..n-1 of a 2-shard table split by the shard that holds them (an export's cursor
    is shard << 32 | row, so a chunk from cursor 1 << 32 holds shard 1's keys)."""
    t = table(dim=1, num_shards=2)
    t.insert(tf.constant(np.arange(n), tf.int64), tf.zeros([n, 1]))
    second = np.sort(t.export_chunk(1 << 32, n, with_values=False)[0].numpy())
    return np.setdiff1d(np.arange(n), second), second


@pytest.mark.parametrize("accum", [False, True])
def test_bound_holds_when_the_rows_to_evict_lie_in_a_shard_other_writers_hold(accum):
    """Every old row sits in shard 0, so a writer adding a key to shard 1 must evict there while
    other writers hold shard 0 to write their own keys: it waits for that lock without holding
    its own, and never adds its key over the bound (before, it added it: a size over the bound
    was polled in 6 of 50 rounds). With `accum` every writer writes the same keys, so a writer
    that waited may find its key added meanwhile: it then adds to that row."""
    first, second = _keys_by_shard(20000)
    old = first[:1000]

    def batch(w, j):   # writer w's j-th batch: 12 new keys in each shard
        at = (j if accum else w * 8 + j) * 12
        return np.concatenate([first[1000 + at:1000 + at + 12], second[at:at + 12]])

    for _ in range(40):
        t = table(dim=4, num_shards=2)
        t.set_step(1)
        t.insert(tf.constant(old, tf.int64), tf.zeros([1000, 4]))
        t.set_bound(1000, 0, "lru")
        t.set_step(2)

        def writer(w, t=t):
            for j in range(8):
                ids = tf.constant(batch(w, j), tf.int64)
                (t.accum if accum else t.insert)(ids, tf.ones([24, 4]))

        polled = _poll_size_while(t, writer)
        assert max(polled) <= 1000 and int(t.size()) <= 1000
        held = content(t)
        new = np.concatenate([batch(w, j) for w in range(4) for j in range(8)])
        # Old rows made the room (a writer that found its key added gives its place back,
        # so a few more may have gone).
        assert len(held) == int(t.size()) and set(new.tolist()) <= set(held)
        if accum:   # each of the 4 writers added 1 to every column of each new key
            assert {held[k] for k in new.tolist()} == {(4.0,) * 4}


def test_import_without_clear_extends():
    t = table(dim=1)
    t.insert(tf.constant([1, 2], tf.int64), tf.constant([[1.0], [2.0]]))
    t.import_with_meta(tf.constant([2, 3], tf.int64), tf.constant([[5.0], [6.0]]), clear=False)
    assert content(t) == {1: (1.0,), 2: (5.0,), 3: (6.0,)}


def test_export_chunks_cover_table_once():
    t = table(tf.string, tf.float32, 2, num_shards=8)
    ids = np.arange(1000)
    t.insert(keys_of(tf.string, ids), tf.constant(np.stack([ids, -ids], 1), tf.float32))
    seen = []
    for keys, values, stamps, freqs in t.export_chunks(97):
        assert 0 < keys.shape[0] <= 97 and values.shape == (keys.shape[0], 2)
        assert stamps.shape == freqs.shape == keys.shape
        k = ids_of(keys)
        np.testing.assert_array_equal(values.numpy()[:, 0], k)
        seen.extend(k.tolist())
    assert sorted(seen) == ids.tolist()
    with pytest.raises(tf.errors.InvalidArgumentError, match="cursor"):
        t.export_chunk(tf.constant(99 << 32, tf.int64), 10)


def test_export_chunk_without_values_gives_the_same_keys_and_metadata():
    t = table(tf.int64, tf.float32, 4, num_shards=4)
    ids = np.arange(500, dtype=np.int64)
    t.insert(tf.constant(ids), tf.ones([500, 4]))
    t.insert(tf.constant(ids[:100]), tf.ones([100, 4]))   # counts 2 for the first 100
    cursor, cursor_meta = 0, 0
    while cursor >= 0:
        keys, values, stamps, freqs, cursor = t.export_chunk(cursor, 64)
        keys2, no_values, stamps2, freqs2, cursor_meta = t.export_chunk(cursor_meta, 64,
                                                                        with_values=False)
        assert values.shape == (keys.shape[0], 4) and no_values.shape == (keys.shape[0], 0)
        for a, b in ((keys, keys2), (stamps, stamps2), (freqs, freqs2), (cursor, cursor_meta)):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        np.testing.assert_array_equal(freqs.numpy(), np.where(keys.numpy() < 100, 2, 1))
        cursor = int(cursor)
    whole = t.export_chunk(0, -1, with_values=False)
    assert whole[1].shape == (500, 0) and sorted(whole[0].numpy()) == ids.tolist()


def _parts(t):
    return {name: int(v) for name, v in t.memory_parts().items()}


def test_memory_bytes_counts_records_index_free_rows_and_long_string_keys():
    n, dim = 5000, 16
    t = table(tf.int64, tf.float32, dim, num_shards=1)
    assert int(t.memory_bytes()) == 0
    assert _parts(t) == {"records": 0, "rows": 0, "index": 0, "other": 0}
    t.insert(keys_of(tf.int64, np.arange(n)), tf.zeros([n, dim]))
    record = 8 + 8 + 4 * dim      # key, stamp and count, row
    slots = 1 << int(np.ceil(np.log2(n / 0.875)))   # the index's power-of-2 size at <= 7/8 load
    full = int(t.memory_bytes())
    assert n * record + 4 * slots <= full <= 1.05 * n * record + 4 * slots
    parts = _parts(t)
    assert parts["index"] == 4 * slots and n <= parts["rows"] <= 1.05 * n
    assert parts["records"] == parts["rows"] * record
    assert sum(parts[k] for k in ("records", "index", "other")) == full
    t.remove(keys_of(tf.int64, np.arange(n // 10)))   # a few: rows wait on the free list
    assert int(t.memory_bytes()) >= full + 4 * (n // 10)
    removed = _parts(t)
    assert removed["rows"] == parts["rows"] and removed["other"] >= parts["other"] + 4 * (n // 10)
    t.remove(keys_of(tf.int64, np.arange(n // 10, n // 2)))   # half: the rows go back
    half = _parts(t)
    assert half["rows"] == n - n // 2 and half["records"] == half["rows"] * record
    assert tf.function(lambda: t.memory_parts()["rows"])().numpy() == half["rows"]  # graph too
    t.clear()
    assert int(t.memory_bytes()) < full // 10
    # Keys longer than the record's inline bytes are held on the heap, and counted.
    short, long_ = (table(tf.string, tf.float32, 2, num_shards=1) for _ in range(2))
    short.insert(tf.constant([f"{i:05d}" for i in range(300)]), tf.zeros([300, 2]))
    long_.insert(tf.constant([f"{i:05d}" + "x" * 95 for i in range(300)]), tf.zeros([300, 2]))
    assert int(long_.memory_bytes()) - int(short.memory_bytes()) == 300 * 100
    assert _parts(long_)["other"] - _parts(short)["other"] == 300 * 100
    # A slot's columns widen the table's records and are counted there, not in the slot view.
    base = table(tf.int64, tf.float32, dim, num_shards=1)
    base.insert(keys_of(tf.int64, np.arange(n)), tf.zeros([n, dim]))
    slot = native_slots.NativeSlotView(base, fill=0.0, name="t/slot")
    slot.insert(keys_of(tf.int64, np.arange(n)), tf.ones([n, dim]))
    assert int(slot.memory_bytes()) == 0 and set(_parts(slot).values()) == {0}
    assert int(base.memory_bytes()) >= n * (record + 4 * dim)


def test_writes_of_held_keys_make_no_rows():
    """Rows are faulted in ahead only for keys a write adds: rewriting the keys a table holds
    (training's steady state) leaves its rows as they were."""
    n, dim = 16384, 16
    t = table(tf.int64, tf.float32, dim)   # 64 shards: 256 keys each per write
    keys = tf.constant(np.arange(n) * 7919, tf.int64)
    t.insert(keys, tf.zeros([n, dim]))
    made = _parts(t)["rows"]
    assert n <= made <= n + 64 * (16384 // (8 + 8 + 4 * dim) + 1)
    for _ in range(5):
        t.insert(keys, tf.ones([n, dim]))
        t.accum(keys, tf.ones([n, dim]))
    assert _parts(t)["rows"] == made and int(t.size()) == n


def test_bound_under_an_endless_stream_keeps_rows_and_index_near_the_bound():
    """A bounded table fed new keys step after step: each write over the bound evicts a chunk
    (`extra_rows`), and the shard it comes from is the writer's own only while that holds
    its share of the bound (else the largest one's): so the shards' sizes cannot drift
    apart, which left every shard holding the rows and index of the largest size it ever
    had (the rows made grew without limit: 1.37 x the bound after 300 of these steps). A
    bounded table's index grows to a load of 0.7, not by doubling (1.64 slots a key here)."""
    bound, batch = 20000, 1024
    t = table(tf.int64, tf.float32, 16)
    t.set_bound(bound, bound // 20, "lru")
    for step in range(240):
        t.set_step(step + 1)
        keys = np.arange(step * batch, (step + 1) * batch, dtype=np.int64) * 2654435761
        t.insert(tf.constant(keys), tf.zeros([batch, 16]))
        assert int(t.size()) <= bound
        if step == 59:
            filled = _parts(t)
    end = _parts(t)
    assert end["rows"] <= 1.12 * bound, end
    assert end["index"] <= 1.1 * filled["index"], (filled, end)
    assert end["index"] <= 4 * 1.55 * bound, end   # 4-byte slots, a load of 0.7 or more


def test_bounded_index_of_any_group_count_finds_every_key_under_churn():
    """A bounded table's index grows to sizes that are not powers of two: inserts, removals
    (tombstones) and rebuilds keep every key findable, checked against a dict."""
    rng = np.random.default_rng(3)
    t = table(tf.int64, tf.float32, 2, num_shards=1)
    t.set_bound(1 << 20, 0, "lru")   # bounded, never reached
    held, sizes = {}, set()
    for step in range(60):
        new = rng.integers(0, 1 << 40, size=400)
        t.insert(tf.constant(new), tf.constant(np.stack([new % 97, new % 89], 1), tf.float32))
        held.update({int(k): (k % 97, k % 89) for k in new})
        gone = rng.choice(sorted(held), size=150, replace=False)
        t.remove(tf.constant(gone))
        for k in gone:
            del held[int(k)]
        sizes.add(_parts(t)["index"] // 4)
    assert any(n & (n - 1) for n in sizes), sizes   # some index was not a power of two
    assert content(t) == {k: tuple(map(float, v)) for k, v in held.items()}
    probe = np.concatenate([np.array(sorted(held)[:500]), rng.integers(1 << 41, 1 << 42, 500)])
    found = t.contains(tf.constant(probe)).numpy()
    assert found.tolist() == [int(k) in held for k in probe]


def _meta(t):
    keys, values, stamps, freqs = t.export_with_meta()
    return {k: (tuple(v), int(s), int(f)) for k, v, s, f in
            zip(ids_of(keys).tolist(), to_np(values), stamps.numpy(), freqs.numpy())}


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string])
def test_removals_give_rows_back_and_moved_rows_keep_key_values_and_metadata(key_dtype):
    """Once a quarter of a shard's rows are free, its top rows move into the free ones and the
    rest go back: the rows a table holds follow its size down. Each moved record keeps its
    key (long string keys live on the heap: the pointer moves with it), row and metadata."""
    rng = np.random.default_rng(11)
    n, dim = 12000, 4
    ids = rng.permutation(n).astype(np.int64) * 1000003
    if key_dtype == tf.string:   # long keys: held off the record
        keys = tf.constant(["x" * 40 + f"key-{i}" for i in ids])
    else:
        keys = tf.constant(ids)
    t = table(key_dtype, tf.float32, dim, num_shards=4)
    values = tf.constant(np.stack([ids % 101, ids % 7, -(ids % 13), ids % 5], 1), tf.float32)
    for step in range(3):   # counts 1-3 and stamps per key
        t.set_step(step + 1)
        t.insert(keys[: n // (step + 1)], values[: n // (step + 1)])
    before = _meta(t)
    assert _parts(t)["rows"] >= n
    gone = rng.choice(n, size=n * 7 // 10, replace=False)
    assert int(t.remove(tf.gather(keys, gone))) == len(gone)
    kept = sorted(set(range(n)) - set(gone.tolist()))
    want = {k: v for k, v in before.items() if k not in set(ids[gone].tolist())}
    parts = _parts(t)
    assert len(kept) <= parts["rows"] <= len(kept) * 1.05 + 4, parts
    assert _meta(t) == want
    # The table goes on as usual: new keys, rewrites, lookups, a clear.
    t.set_step(9)
    t.insert(tf.gather(keys, gone[:1000]), tf.gather(values, gone[:1000]))
    t.accum(tf.gather(keys, kept[:500]), tf.ones([500, dim]))
    after = _meta(t)
    assert len(after) == len(kept) + 1000
    for i in kept[:500]:
        k = int(ids[i])
        assert after[k][0] == tuple(np.asarray(before[k][0]) + 1) and after[k][1:] == (9, before[k][2] + 1)
    found = t.lookup(tf.gather(keys, kept), tf.zeros([len(kept), dim]))
    np.testing.assert_array_equal(found.numpy()[:, 0], (ids[kept] % 101) + (np.arange(len(kept)) < 500))
    t.clear()
    assert int(t.size()) == 0 and _parts(t)["rows"] == 0


def test_a_chunked_export_open_across_removals_sees_every_kept_key_once():
    """Compaction moves rows from a shard's top into free rows: behind an open chunked
    export's cursor, that would hide them from it. No shard compacts while a chunked export
    begun at cursor 0 is open; the next removal after its last chunk does."""
    n = 20000
    ids = np.arange(n, dtype=np.int64) * 7919
    t = table(tf.int64, tf.float32, 2, num_shards=2)
    t.insert(tf.constant(ids), tf.constant(np.stack([ids % 3, ids % 5], 1), tf.float32))
    rows = _parts(t)["rows"]
    rng = np.random.default_rng(5)
    gone = rng.choice(ids, size=n * 3 // 5, replace=False)
    seen, cursor, chunks = [], 0, 0
    while cursor >= 0:
        keys, _, _, _, cursor = t.export_chunk(cursor, 1500, with_values=False)
        seen.extend(keys.numpy().tolist())
        cursor = int(cursor)
        chunks += 1
        if chunks == 3:   # mid-scan: most rows go, the shards' tops among them
            t.remove(tf.constant(gone))
            assert _parts(t)["rows"] == rows   # not compacted: the export is open
    kept = np.setdiff1d(ids, gone)
    assert np.isin(kept, seen).all() and len(seen) == len(set(seen))
    t.remove(tf.constant(kept[:100]))   # the export has ended: the shards compact now
    assert _parts(t)["rows"] <= (len(kept) - 100) * 1.05 + 2
    assert sorted(t.export()[0].numpy().tolist()) == kept[100:].tolist()


def test_a_bounded_shard_gives_back_rows_only_above_its_share_of_the_bound():
    """Under a bound a shard keeps the rows of its share (it fills them again after an
    eviction sweep, without rows moving back and forth); above its share, a removal gives
    the excess back: a lowered bound, or a shard the sweeps' chance left larger."""
    bound, dim = 40000, 2
    t = table(tf.int64, tf.float32, dim, num_shards=8)
    t.set_bound(bound, 0, "lru")
    ids = np.arange(bound, dtype=np.int64) * 2654435761
    t.insert(tf.constant(ids), tf.zeros([bound, dim]))
    full = _parts(t)["rows"]
    assert int(t.size()) == bound and full >= bound
    t.remove(tf.constant(ids[:2000]))   # 5%: every shard is near its share, rows stay
    assert _parts(t)["rows"] == full
    t.set_bound(bound // 4, 0, "lru")
    t.remove(tf.constant(ids[2000: bound * 3 // 4]))
    assert int(t.size()) == bound // 4
    assert _parts(t)["rows"] <= bound // 4 * 1.1, _parts(t)
    assert sorted(t.export()[0].numpy().tolist()) == sorted(ids[bound * 3 // 4:].tolist())


def test_removed_rows_pages_go_back_to_the_os():
    """Rows given back by a compaction return their pages: the process's RSS falls."""
    def rss_mib():
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    n, dim = 300000, 32
    t = table(tf.int64, tf.float32, dim, num_shards=4)
    ids = np.arange(n, dtype=np.int64) * 7919
    t.insert(tf.constant(ids), tf.ones([n, dim]))
    gone = tf.constant(ids[: n * 3 // 4])
    held = _parts(t)["records"] / 2 ** 20
    before = rss_mib()
    t.remove(gone)
    released = held - _parts(t)["records"] / 2 ** 20
    assert released >= 0.7 * held
    assert before - rss_mib() >= 0.8 * released, (before, rss_mib(), released)


def test_bad_input_is_an_error_not_a_crash():
    t = table(dim=3)
    gen = native.ops()
    h = t.resource_handle
    with pytest.raises(tf.errors.InvalidArgumentError, match="keys must be a 1-D"):
        gen.tfra_de_insert(h, tf.zeros([2, 2], tf.int64), tf.zeros([2, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Expected shape \[2, 3\] for values"):
        t.insert(tf.constant([1, 2], tf.int64), tf.zeros([2, 4]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Expected shape \[2, 3\] for deltas"):
        t.accum(tf.constant([1, 2], tf.int64), tf.zeros([3, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="default_values must have shape"):
        t.lookup(tf.constant([1, 2], tf.int64), tf.zeros([3, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="default_values must have shape"):
        t.lookup(tf.constant([1, 2], tf.int64), tf.zeros([2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="op built for"):
        gen.tfra_de_find(h, tf.constant([1], tf.int32), tf.zeros([3]), dim=3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="op built for"):
        gen.tfra_de_find(h, tf.constant([1], tf.int64), tf.zeros([4]), dim=4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="stamps must have shape"):
        t.import_with_meta(tf.constant([1], tf.int64), tf.zeros([1, 3]), stamps=[1, 2])
    with pytest.raises(TypeError, match="keys must be int64"):
        t.insert(tf.constant(["a"]), tf.zeros([1, 3]))
    with pytest.raises(TypeError, match="key_dtype"):
        table(tf.float32)
    with pytest.raises(TypeError, match="value_dtype"):
        table(tf.int64, tf.int32)
    with pytest.raises(ValueError, match="dim must be >= 1; got 0"):
        table(dim=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dim must be in"):
        gen.tfra_de_table(key_dtype=tf.int64, value_dtype=tf.float32, dim=1 << 30,
                          shared_name="too_wide")
    assert int(t.size()) == 0  # nothing was half-applied


def test_saved_model_round_trip(tmp_path):
    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = table(tf.int64, tf.float32, 2)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
        def serve(self, keys):
            return self.table.lookup(keys, tf.fill([2], -1.0))

    m = Model()
    m.table.insert(tf.constant([1, 2], tf.int64), tf.constant([[1.0, 2.0], [3.0, 4.0]]))
    tf.saved_model.save(m, str(tmp_path / "m"))
    loaded = tf.saved_model.load(str(tmp_path / "m"))
    # The table is recreated empty (the Variable, not the table, checkpoints rows).
    np.testing.assert_array_equal(loaded.serve(tf.constant([1, 9], tf.int64)).numpy(),
                                  [[-1, -1], [-1, -1]])
    np.testing.assert_array_equal(m.serve(tf.constant([1, 9], tf.int64)).numpy(),
                                  [[1, 2], [-1, -1]])
