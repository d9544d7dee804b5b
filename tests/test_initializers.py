"""Initial rows from every kind of `initializer`: keyed seeded draws, constants, VarianceScaling."""

import json
import math
import statistics
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS
from tfra_dynamic_embedding import initializers
from tfra_dynamic_embedding.tables import keyed_random, native

M64 = (1 << 64) - 1
ROW = [1.0, -2.0, 3.5, 0.25]


# -- an independent reference of the keyed draw: Python ints and the stdlib's inverse CDF -----

def _mix64(x):
    x &= M64
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    return x ^ (x >> 33)


def _uniforms(key_hash, seed, dim):
    base = key_hash ^ _mix64(seed + 0x632BE59BD9B4E019)
    out = []
    for j in range(dim):
        z = (base + (j + 1) * 0x9E3779B97F4A7C15) & M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        z ^= z >> 31
        out.append(((z >> 11) + 0.5) * 2.0 ** -53)
    return out


def _reference(keys, kind, a, b, seed, dim):
    """The rows `keyed_random` must draw, as float64 [len(keys), dim]."""
    if isinstance(keys[0], str):   # the stable FarmHash fingerprint the module documents
        hashes = tf.strings.to_hash_bucket_fast(keys, (1 << 63) - 1).numpy().tolist()
    else:
        hashes = keys
    inv = statistics.NormalDist().inv_cdf
    lo = statistics.NormalDist().cdf(-2.0)
    rows = []
    for h in hashes:
        u = _uniforms(_mix64(h), seed, dim)
        if kind == "uniform":
            rows.append([a + (b - a) * x for x in u])
        elif kind == "normal":
            rows.append([a + b * inv(x) for x in u])
        else:
            rows.append([a + b * inv(lo + (1 - 2 * lo) * x) for x in u])
    return np.array(rows)


# (initializer factory, kind, a, b, seed): every library's seeded random initializers.
SEEDED = {
    "tf_normal": (lambda: tf.random_normal_initializer(0.0, 0.1, seed=7), "normal", 0.0, 0.1, 7),
    "tf_uniform": (lambda: tf.random_uniform_initializer(seed=3), "uniform", -0.05, 0.05, 3),
    "tf_truncated": (lambda: tf.initializers.TruncatedNormal(0.5, 2.0, seed=11),
                     "truncated_normal", 0.5, 2.0, 11),
    "v1_truncated": (lambda: tf.compat.v1.truncated_normal_initializer(1.0, 0.5, seed=-4),
                     "truncated_normal", 1.0, 0.5, -4),
    "keras_normal": (lambda: tf.keras.initializers.RandomNormal(0.0, 0.3, seed=5),
                     "normal", 0.0, 0.3, 5),
    "keras_uniform": (lambda: tf.keras.initializers.RandomUniform(-1.0, 2.0, seed=2),
                      "uniform", -1.0, 2.0, 2),
    "keras_truncated": (lambda: tf.keras.initializers.TruncatedNormal(seed=9),
                        "truncated_normal", 0.0, 0.05, 9),
    "tf_keras_normal": (lambda: tf_keras.initializers.RandomNormal(seed=4), "normal", 0.0, 0.05, 4),
    "tf_keras_uniform": (lambda: tf_keras.initializers.RandomUniform(seed=1),
                         "uniform", -0.05, 0.05, 1),
}


@pytest.mark.parametrize("seed", [0, 7, -3, 2**63 + 5])
def test_keyed_uniforms_match_the_reference_bit_for_bit(seed):
    keys = [0, 1, -1, 2**63 - 1, -2**63, 123456789]
    got = keyed_random.keyed_uniforms(tf.constant(keys, tf.int64), seed, 5).numpy()
    want = np.array([_uniforms(_mix64(k), seed, 5) for k in keys])
    np.testing.assert_array_equal(got, want)
    assert got.min() > 0 and got.max() < 1
    # An int32 key is its sign-extended int64 value.
    got32 = keyed_random.keyed_uniforms(tf.constant([-7, 3], tf.int32), seed, 5).numpy()
    np.testing.assert_array_equal(got32, np.array([_uniforms(_mix64(k), seed, 5) for k in (-7, 3)]))


@pytest.mark.skipif(not native.is_available(), reason="native op library not built")
@pytest.mark.parametrize("key_dtype, value_dtype", [(tf.int64, tf.float32), (tf.int32, tf.float64)])
def test_uniform_rows_equal_the_native_kernels(key_dtype, value_dtype):
    keys = tf.constant([5, -1, 2**31 - 1, 0, 77], key_dtype)
    init = native.NativeInitializer("uniform", -2.0, 1.0, seed=13, dim=6, dtype=value_dtype)
    table = native.NativeKVTable(key_dtype, value_dtype, 6, "kernel_draws")
    kernel_rows, _ = table.lookup_or_init(keys, init)
    spec = initializers.describe(tf.random_uniform_initializer(-2.0, 1.0, seed=13), 6,
                                 value_dtype)
    np.testing.assert_array_equal(spec.rows(keys).numpy(), kernel_rows.numpy())
    np.testing.assert_array_equal(init.rows(keys).numpy(), kernel_rows.numpy())  # its TF-op twin


def test_initializers_are_described_as_data_the_kernels_draw():
    describe = initializers.describe
    assert describe(None, 4, tf.float32).kind == "constant" and describe(None, 4, tf.float32).a == 0
    assert describe(2.5, 4, tf.float32).a == 2.5
    assert describe(tf.zeros_initializer(), 4, tf.float32).a == 0.0
    assert describe(tf.ones_initializer(), 4, tf.float32).a == 1.0
    assert describe(tf.constant_initializer(3.0), 4, tf.float32).a == 3.0
    assert describe(tf.constant_initializer(ROW), 4, tf.float32).row == tuple(ROW)
    i = describe(tf.random_normal_initializer(0.5, 0.1, seed=9), 4, tf.float32)
    assert (i.kind, i.a, i.seed, i.keyed) == ("normal", 0.5, 9, True) and abs(i.b - 0.1) < 1e-7
    i = describe(tf.keras.initializers.TruncatedNormal(0.0, 0.2), 4, tf.float32)
    assert i.kind == "truncated_normal" and abs(i.b - 0.2) < 1e-7 and not i.keyed
    i = describe(tf.random_uniform_initializer(-1.0, 3.0), 4, tf.float16)
    assert (i.kind, i.a, i.b) == ("uniform", -1.0, 3.0)
    assert describe("zeros", 4, tf.float32).a == 0.0
    # Kinds no kernel draws, and constants only TF ops hold exactly: TF-op rows.
    assert describe(tf.keras.initializers.GlorotUniform(), 4, tf.float32).kind == "custom"
    text = describe("", 4, tf.string)
    assert text.kind == "custom" and text.constant
    assert describe(2**60, 4, tf.int64).kind == "custom"
    # The TF-op rows: one per key, of the rows' dtype.
    rows = describe(tf.random_uniform_initializer(-1.0, 3.0), 4, tf.float16).rows(tf.range(6))
    assert rows.shape == (6, 4) and rows.dtype == tf.float16
    with pytest.raises(ValueError, match=r"\[1\] or \[dim\]"):
        describe(tf.constant_initializer([1.0, 2.0]), 4, tf.float32)
    with pytest.raises(ValueError, match="kind"):
        native.NativeInitializer("gamma")


@pytest.mark.parametrize("kind, a, b", [("uniform", -1.0, 3.0), ("normal", 0.5, 2.0),
                                        ("truncated_normal", 0.0, 1.0)])
def test_keyed_draws_have_the_distribution_over_100k_draws(kind, a, b):
    rows = keyed_random.keyed_rows(tf.range(25000, dtype=tf.int64), kind, a, b, seed=21, dim=4,
                                   dtype=tf.float64).numpy()
    x = rows.ravel()
    mean, std = {"uniform": (1.0, 4.0 / math.sqrt(12)), "normal": (0.5, 2.0),
                 "truncated_normal": (0.0, 0.87962566103423978)}[kind]
    assert abs(x.mean() - mean) < 5 * std / math.sqrt(x.size)
    assert abs(x.std() - std) < 0.01 * std
    if kind == "uniform":
        assert -1.0 <= x.min() < -0.999 and 2.999 < x.max() < 3.0
    elif kind == "normal":
        assert abs(np.mean(np.abs(x - 0.5) < 2.0) - 0.6827) < 0.01   # within one stddev
    else:
        assert -2.0 <= x.min() < -1.99 and 1.99 < x.max() <= 2.0
    # Columns are independent draws, not copies.
    corr = np.corrcoef(rows.T)
    assert np.abs(corr[np.triu_indices(4, 1)]).max() < 0.02


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_seeded_initializers_give_each_key_its_own_reproducible_row(kv_creator, name):
    factory, kind, a, b, seed = SEEDED[name]
    keys = list(range(100))
    want = _reference(keys, kind, a, b, seed, 4)
    for shards in (1, 2, 3):
        w = de.Variable(dim=4, devices=CPUS[:shards], initializer=factory(),
                        kv_creator=kv_creator)
        np.testing.assert_allclose(w.lookup(tf.constant(keys, tf.int64)).numpy(), want,
                                   rtol=1e-6, atol=1e-7)
    # One key per lookup (the case that gave every key one shared row): the same rows.
    one_by_one = np.concatenate([w.lookup(tf.constant([k], tf.int64)).numpy() for k in keys])
    assert len({tuple(r) for r in one_by_one}) == 100
    np.testing.assert_allclose(one_by_one, want, rtol=1e-6, atol=1e-7)


def test_seeded_rows_are_the_same_in_a_fresh_process():
    script = (
        "import json, tensorflow as tf\n"
        "import tensorflow_recommenders_addons.dynamic_embedding as de\n"
        "init = tf.random_normal_initializer(0.0, 1.0, seed=42)\n"
        "w = de.Variable(dim=3, initializer=init)\n"
        "s = de.Variable(tf.string, dim=3, initializer=init)\n"
        "print(json.dumps([w.lookup(tf.constant([3, 9], tf.int64)).numpy().tolist(),\n"
        "                  s.lookup(tf.constant(['a', 'bb'])).numpy().tolist()]))\n")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         text=True, timeout=300).stdout
    there = json.loads(out.strip().splitlines()[-1])
    init = tf.random_normal_initializer(0.0, 1.0, seed=42)
    here = [de.Variable(dim=3, initializer=init).lookup(tf.constant([3, 9], tf.int64)),
            de.Variable(tf.string, dim=3, initializer=init).lookup(tf.constant(["a", "bb"]))]
    for got, want in zip(there, here):
        np.testing.assert_array_equal(np.array(got, np.float32), want.numpy())


def test_string_keys_get_keyed_rows_whatever_the_shard_count(kv_creator):
    keys = [f"user_{i}" for i in range(60)]
    want = _reference(keys, "normal", 0.0, 0.1, 7, 4)
    for shards in (1, 2, 3):
        w = de.Variable(tf.string, dim=4, devices=CPUS[:shards], kv_creator=kv_creator,
                        initializer=tf.random_normal_initializer(0.0, 0.1, seed=7))
        np.testing.assert_allclose(w.lookup(tf.constant(keys)).numpy(), want, rtol=1e-6,
                                   atol=1e-7)
    assert len({tuple(r) for r in want}) == 60


def test_seeded_rows_are_the_same_in_eager_tf_function_and_v1_graphs(kv_creator):
    keys = np.array([4, 8, 15, 16, 23, 42], np.int64)
    want = _reference(keys.tolist(), "uniform", -1.0, 2.0, 2, 4)
    w = de.Variable(dim=4, devices=CPUS[:2], kv_creator=kv_creator,
                    initializer=tf.keras.initializers.RandomUniform(-1.0, 2.0, seed=2))
    lookup = tf.function(lambda k: w.lookup(k))
    np.testing.assert_allclose(lookup(tf.constant(keys)).numpy(), want, rtol=1e-6)
    with tf.Graph().as_default():
        # Named per backend: v1 sessions of one process share tables by node name.
        g = de.Variable(dim=4, devices=CPUS[:3], kv_creator=kv_creator,
                        name=f"seeded_v1_{type(kv_creator).__name__}",
                        initializer=tf.keras.initializers.RandomUniform(-1.0, 2.0, seed=2))
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows, _ = g.find_or_insert(ids)
        with tf.compat.v1.Session() as sess:
            np.testing.assert_allclose(sess.run(rows, {ids: keys}), want, rtol=1e-6)
            # Inserted: a later lookup reads back the same rows.
            np.testing.assert_allclose(sess.run(g.lookup(ids), {ids: keys[::-1]}), want[::-1],
                                       rtol=1e-6)


def test_a_lookup_and_a_later_insert_of_a_key_agree(kv_creator):
    w = de.Variable(dim=4, kv_creator=kv_creator,
                    initializer=tf.random_normal_initializer(0.0, 1.0, seed=1))
    peek = w.lookup(tf.constant([10, 11], tf.int64)).numpy()
    rows, exists = w.find_or_insert(tf.constant([11, 12, 10], tf.int64))
    assert not exists.numpy().any() and int(w.size()) == 3
    np.testing.assert_array_equal(rows.numpy()[[2, 0]], peek)


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_training_one_id_per_step_stores_each_ids_own_initial_row(kv_creator, shards):
    # SGD on sum(row): each step subtracts lr from every value of its one row, so the stored row
    # is the id's initial draw minus lr. Before, all 20 ids were stored with the same row.
    lr, ids = 0.5, list(range(100, 120))
    w = de.Variable(dim=4, devices=CPUS[:shards], kv_creator=kv_creator,
                    initializer=tf.random_normal_initializer(0.0, 0.1, seed=7))
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(lr))
    for i in ids:
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(w, tf.constant([i], tf.int64),
                                                return_trainable=True)
            loss = tf.reduce_sum(rows)
        opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
    stored = w.lookup(tf.constant(ids, tf.int64)).numpy()
    initial = stored + lr
    assert len({tuple(np.round(r, 6)) for r in initial}) == 20
    np.testing.assert_allclose(initial, _reference(ids, "normal", 0.0, 0.1, 7, 4), atol=1e-6)


def test_unseeded_initializers_draw_a_fresh_row_per_key(kv_creator):
    for init in (tf.random_normal_initializer(0.0, 1.0), tf.keras.initializers.RandomUniform(),
                 tf_keras.initializers.TruncatedNormal(), "uniform"):
        w = de.Variable(dim=4, kv_creator=kv_creator, initializer=init)
        rows = np.concatenate([w.lookup(tf.constant([k], tf.int64)).numpy() for k in range(30)])
        assert len({tuple(r) for r in rows}) == 30, init
        assert np.abs(rows).max() > 0


def test_v1_uniform_initializer_without_maxval_draws_in_zero_one(kv_creator):
    # tf.compat.v1.random_uniform_initializer() keeps maxval None, meaning 1 for floats.
    for init in (tf.compat.v1.random_uniform_initializer(),
                 tf.compat.v1.random_uniform_initializer(seed=5)):
        w = de.Variable(dim=50, kv_creator=kv_creator, initializer=init)
        rows = w.lookup(tf.range(40, dtype=tf.int64)).numpy()
        assert rows.min() >= 0.0 and rows.max() < 1.0 and rows.max() > 0.9


# -- constants ---------------------------------------------------------------------------------

CONSTANT_ROWS = {
    "tf": lambda: tf.constant_initializer(ROW),
    "v1": lambda: tf.compat.v1.constant_initializer(ROW),
    "keras": lambda: tf.keras.initializers.Constant(ROW),
    "tf_keras": lambda: tf_keras.initializers.Constant(ROW),
    "array": lambda: np.array(ROW),
}


@pytest.mark.parametrize("name", sorted(CONSTANT_ROWS))
def test_row_valued_constants_give_every_key_that_row(kv_creator, name):
    keys = np.array([3, 1, 4, 1, 5], np.int64)
    want = np.tile(ROW, (5, 1))
    w = de.Variable(dim=4, devices=CPUS[:2], initializer=CONSTANT_ROWS[name](),
                    kv_creator=kv_creator)
    assert w._init.constant  # pylint: disable=protected-access
    np.testing.assert_array_equal(w.lookup(tf.constant(keys)).numpy(), want)
    np.testing.assert_array_equal(tf.function(w.lookup)(tf.constant(keys)).numpy(), want)
    rows, _ = w.find_or_insert(tf.constant(keys))
    np.testing.assert_array_equal(rows.numpy(), want)
    assert int(w.size()) == 4
    with tf.Graph().as_default():
        g = de.Variable(dim=4, initializer=CONSTANT_ROWS[name](), kv_creator=kv_creator,
                        name=f"row_v1_{name}_{type(kv_creator).__name__}")
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows, _ = g.find_or_insert(ids)
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(rows, {ids: keys}), want)
            np.testing.assert_array_equal(sess.run(g.lookup(ids), {ids: [9]}), [ROW])


@pytest.mark.parametrize("init, value", [
    (np.array([0.5]), 0.5), ([0.5], 0.5), (tf.constant([2.0]), 2.0), (3, 3.0),
    (tf.constant_initializer([-1.5]), -1.5), (tf.keras.initializers.Constant(4.0), 4.0),
    (tf_keras.initializers.Ones(), 1.0), (tf.zeros_initializer(), 0.0), ("ones", 1.0)])
def test_a_one_element_value_is_broadcast_to_the_row(init, value):
    w = de.Variable(dim=8, initializer=init)
    np.testing.assert_array_equal(w.lookup(tf.constant([1, 2], tf.int64)).numpy(),
                                  np.full([2, 8], value))


def test_a_one_element_graph_tensor_is_broadcast():
    with tf.Graph().as_default():
        w = de.Variable(dim=3, initializer=tf.constant([0.25]))
        rows = w.lookup(tf.constant([1, 2], tf.int64))
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(rows), np.full([2, 3], 0.25))


@pytest.mark.parametrize("init, shape", [
    (np.ones([3]), r"\[3\]"), ([1.0, 2.0], r"\[2\]"), (np.ones([2, 4]), r"\[2, 4\]"),
    (tf.constant_initializer([1.0, 2.0, 3.0]), r"\[3\]"),
    (tf.keras.initializers.Constant(np.ones([1, 4])), r"\[1, 4\]")])
def test_other_constant_shapes_are_rejected_naming_initializer_and_shape(init, shape):
    with pytest.raises(ValueError, match=r"initializer.*dim\] = \[4\].*got shape " + shape):
        de.Variable(dim=4, initializer=init)


def test_inputs_that_are_no_initializer_are_rejected():
    with pytest.raises(ValueError, match="initializer 'no_such_init'"):
        de.Variable(dim=4, initializer="no_such_init")
    for bad in (True, {"mean": 0.0}, "abc".encode()):
        with pytest.raises(ValueError, match="initializer"):
            de.Variable(dim=4, initializer=bad)


def test_a_callable_returning_other_shapes_or_strings_is_named_at_lookup():
    ids = tf.constant([1, 2, 3], tf.int64)
    ignores_shape = de.Variable(dim=4, initializer=lambda shape, dtype: tf.ones([2, 4], dtype),
                                name="ignores_shape")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"initializer .* must return rows of the shape it is given, "
                             r"\[n, 4\]"):
        ignores_shape.lookup(ids)
    words = de.Variable(dim=4, initializer=lambda shape, dtype: tf.fill(shape, "x"),
                        name="words")
    with pytest.raises(ValueError, match="initializer .* must return numbers; got string"):
        words.lookup(ids)
    fits = de.Variable(dim=4, initializer=lambda shape, dtype: tf.ones(shape, dtype), name="fits")
    np.testing.assert_array_equal(fits.lookup(ids).numpy(), np.ones([3, 4]))


# -- VarianceScaling: drawn for the run-time shape [n, dim], as TFRA ------------------------------

@pytest.mark.parametrize("make, spread, bound", [
    # (initializer, expected std for n keys and dim 4, bound on |x| or None)
    (lambda: tf.keras.initializers.GlorotUniform(), lambda n: math.sqrt(2 / (n + 4)),
     lambda n: math.sqrt(6 / (n + 4))),
    (lambda: tf_keras.initializers.GlorotNormal(), lambda n: math.sqrt(2 / (n + 4)),
     lambda n: 2 * math.sqrt(2 / (n + 4)) / 0.87962566103423978),
    (lambda: tf.keras.initializers.HeNormal(), lambda n: math.sqrt(2 / n),
     lambda n: 2 * math.sqrt(2 / n) / 0.87962566103423978),
    (lambda: tf.compat.v1.variance_scaling_initializer(3.0, "fan_out", "untruncated_normal"),
     lambda n: math.sqrt(3 / 4), None)])
def test_variance_scaling_uses_the_run_time_row_count_in_v1_graphs(make, spread, bound):
    n = 5000
    with tf.Graph().as_default():
        w = de.Variable(dim=4, initializer=make())
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows = w.lookup(ids)
        with tf.compat.v1.Session() as sess:
            x = sess.run(rows, {ids: np.arange(n)}).ravel()
    assert abs(x.std() - spread(n)) < 0.03 * spread(n)
    if bound is not None:
        assert np.abs(x).max() <= bound(n) * (1 + 1e-6)
        assert np.abs(x).max() > 0.95 * bound(n)


def test_seeded_variance_scaling_draws_keyed_unit_rows_scaled_for_n():
    keys = list(range(50))
    w = de.Variable(dim=4, devices=CPUS[:2],
                    initializer=tf.keras.initializers.GlorotUniform(seed=1))
    rows = w.lookup(tf.constant(keys, tf.int64)).numpy()
    # Two shards: each draws for its own 25 missing keys, so fan_avg = (25 + 4) / 2.
    limit = math.sqrt(6 / (25 + 4))
    np.testing.assert_allclose(rows, _reference(keys, "uniform", -1.0, 1.0, 1, 4) * limit,
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(w.lookup(tf.constant(keys, tf.int64)).numpy(), rows)


def test_shape_bound_initializers_fail_in_graphs_naming_the_initializer():
    with tf.Graph().as_default():
        w = de.Variable(dim=4, initializer=tf.keras.initializers.Orthogonal())
        with pytest.raises(ValueError, match="initializer .*Orthogonal.*cannot make rows"):
            w.lookup(tf.compat.v1.placeholder(tf.int64, [None]))
