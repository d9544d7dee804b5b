"""Users' initializers on the native backend's fused lookup-or-init kernel (TfraDeFindInit).

TF, tf.compat.v1, Keras 3 and tf_keras RandomNormal / TruncatedNormal / RandomUniform / Constant /
Zeros / Ones, numbers and `[dim]` rows draw their rows inside the kernel: no TF random ops in the
traced lookup or training step. Seeded ones draw by keyed_random.py's recipe (the rows every
backend gives them, bit for bit); unseeded ones by the kernel's own fast
normals (cc/ops/de_draw.h). Others (VarianceScaling,
custom callables) keep the TF-draw path.
"""

import json
import math
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS
from tfra_dynamic_embedding.tables import keyed_random, native

pytestmark = pytest.mark.skipif(not native.is_available(), reason="native op library not built")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIM = 4
ROW = [0.5, -1.0, 2.0, 0.125]
TRUNCATED_STD = 0.87962566103423978   # stddev of a unit normal truncated at +-2

# Initializers the fused kernel draws: name -> factory.
FUSED = {
    "tf_normal": lambda: tf.random_normal_initializer(0.0, 0.01),
    "tf_normal_seeded": lambda: tf.random_normal_initializer(0.0, 0.01, seed=3),
    "tf_uniform": lambda: tf.random_uniform_initializer(-0.1, 0.1),
    "tf_truncated": lambda: tf.initializers.TruncatedNormal(0.0, 0.5, seed=2),
    "tf_constant": lambda: tf.constant_initializer(0.5),
    "tf_constant_row": lambda: tf.constant_initializer(ROW),
    "tf_zeros": tf.zeros_initializer,
    "tf_ones": tf.ones_initializer,
    "v1_normal": lambda: tf.compat.v1.random_normal_initializer(0.0, 0.1),
    "v1_truncated": lambda: tf.compat.v1.truncated_normal_initializer(0.0, 0.1, seed=4),
    "v1_uniform": tf.compat.v1.random_uniform_initializer,
    "v1_zeros": tf.compat.v1.zeros_initializer,
    "keras_normal": lambda: keras.initializers.RandomNormal(0.0, 0.05),
    "keras_truncated": lambda: keras.initializers.TruncatedNormal(seed=1),
    "keras_uniform": lambda: keras.initializers.RandomUniform(seed=6),
    "keras_constant": lambda: keras.initializers.Constant(2.0),
    "keras_zeros": keras.initializers.Zeros,
    "keras_ones": keras.initializers.Ones,
    "tf_keras_normal": lambda: tf_keras.initializers.RandomNormal(seed=8),
    "tf_keras_truncated": tf_keras.initializers.TruncatedNormal,
    "tf_keras_uniform": tf_keras.initializers.RandomUniform,
    "tf_keras_constant": lambda: tf_keras.initializers.Constant(ROW),
    "tf_keras_zeros": tf_keras.initializers.Zeros,
    "tf_keras_ones": tf_keras.initializers.Ones,
    "number": lambda: 0.25,
    "row_list": lambda: list(ROW),
    "row_array": lambda: np.array(ROW, np.float32),
    "none": lambda: None,
    "keras_name": lambda: "random_normal",
}
# Initializers that keep the TF-draw path on the native backend.
NOT_FUSED = {
    "glorot": lambda: keras.initializers.GlorotUniform(),
    "variance_scaling_seeded": lambda: tf.initializers.VarianceScaling(2.0, seed=1),
    "callable": lambda: (lambda shape, dtype=None: tf.random.uniform(shape, dtype=dtype)),
}


def _op_types(fn, *specs):
    """Op types of the traced `fn`, including the bodies of nested functions (conds, loops)."""
    graph_def = tf.function(fn).get_concrete_function(*specs).graph.as_graph_def()
    types = {node.op for node in graph_def.node}
    for func in graph_def.library.function:
        types.update(node.op for node in func.node_def)
    return types


def _tf_draws(types):
    """Op types that draw random rows in TF: random ops and keyed_random.py's bit mixing."""
    return sorted(t for t in types if "Random" in t or t in ("Ndtri", "TruncatedNormal")
                  or t.startswith("Bitwise") or t == "RightShift")


# -- which path a user's initializer takes ----------------------------------------------------

@pytest.mark.parametrize("name", sorted(FUSED))
def test_users_initializers_draw_in_the_fused_kernel(name):
    w = de.get_variable(f"fused_{name}", dim=DIM, initializer=FUSED[name]())
    assert isinstance(w.kv_creator, native.NativeKVCreator)
    spec = tf.TensorSpec([None], tf.int64)
    for fn in (lambda k: w.lookup(k), lambda k: de.embedding_lookup(w, k)):
        types = _op_types(fn, spec)
        assert "TfraDeFindInit" in types and "TfraDeFind" not in types, sorted(types)
        assert _tf_draws(types) == [], name
    rows = w.lookup(tf.constant([1, 2, 1], tf.int64)).numpy()
    assert rows.shape == (3, DIM) and np.array_equal(rows[0], rows[2])
    assert int(w.size()) == 0   # a lookup never inserts


@pytest.mark.parametrize("name", sorted(FUSED)[:6])
def test_the_builtin_backend_keeps_tf_ops(name):
    w = de.get_variable(f"builtin_{name}", dim=DIM, initializer=FUSED[name](),
                        kv_creator=de.BuiltinKVCreator())
    types = _op_types(lambda k: w.lookup(k), tf.TensorSpec([None], tf.int64))
    assert not any(t.startswith("TfraDe") for t in types) and "LookupTableFindV2" in types


@pytest.mark.parametrize("name", sorted(NOT_FUSED))
def test_other_initializers_keep_the_tf_draw_path(name):
    w = de.get_variable(f"tf_path_{name}", dim=DIM, initializer=NOT_FUSED[name]())
    types = _op_types(lambda k: w.lookup(k), tf.TensorSpec([None], tf.int64))
    assert "TfraDeFind" in types and "TfraDeFindInit" not in types
    assert _tf_draws(types), sorted(types)
    rows = w.lookup(tf.range(50, dtype=tf.int64)).numpy()
    assert len({tuple(r) for r in rows}) == 50


def test_a_keras_training_step_prefetches_through_the_fused_kernel():
    layer = de.keras.layers.Embedding(DIM, initializer=keras.initializers.RandomNormal(0.0, 0.1),
                                      name="fused_layer")
    dense = keras.layers.Dense(1)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01))

    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(dense(layer(ids)) ** 2)
        variables = layer.trainable_variables + dense.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    step(tf.constant([[1, 2]], tf.int64))   # builds the layers and the optimizer's slots
    types = _op_types(step, tf.TensorSpec([None, 2], tf.int64))
    assert "TfraDeFindInit" in types
    # Dense's kernel was drawn at build time; the step itself draws nothing in TF.
    assert _tf_draws(types) == [], sorted(types)
    assert int(layer.params.size()) == 2


def test_tf_keras_layers_and_initializers_under_legacy_keras():
    script = textwrap.dedent("""
        import json, numpy as np, tensorflow as tf
        import tensorflow_recommenders_addons.dynamic_embedding as de
        assert tf.keras.__name__.startswith("tf_keras"), tf.keras.__name__
        layer = de.keras.layers.Embedding(4, name="legacy_fused",
            initializer=tf.keras.initializers.TruncatedNormal(0.0, 0.2, seed=9))
        opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.01))
        def step(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(layer(ids) ** 2)
            opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables),
                                    layer.trainable_variables))
            return loss
        step(tf.constant([[1, 2]], tf.int64))
        graph_def = tf.function(step).get_concrete_function(
            tf.TensorSpec([None, 2], tf.int64)).graph.as_graph_def()
        types = {n.op for n in graph_def.node}
        for f in graph_def.library.function:
            types.update(n.op for n in f.node_def)
        rows = layer.params.lookup(tf.constant([5, 6], tf.int64)).numpy()
        print(json.dumps({"types": sorted(types), "rows": rows.tolist()}))
    """)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "TfraDeFindInit" in out["types"] and _tf_draws(out["types"]) == []
    want = keyed_random.keyed_rows(tf.constant([5, 6], tf.int64), "truncated_normal", 0.0, 0.2,
                                   9, 4, tf.float32)
    np.testing.assert_array_equal(np.array(out["rows"], np.float32), want.numpy())


# -- distributions ----------------------------------------------------------------------------

DISTRIBUTIONS = {  # name -> (factory(seed), mean, std, bounds)
    "normal": (lambda s: tf.random_normal_initializer(0.5, 2.0, seed=s), 0.5, 2.0, None),
    "truncated": (lambda s: keras.initializers.TruncatedNormal(-1.0, 0.5, seed=s),
                  -1.0, 0.5 * TRUNCATED_STD, (-2.0, 0.0)),
    "uniform": (lambda s: tf.random_uniform_initializer(-1.0, 3.0, seed=s),
                1.0, 4.0 / math.sqrt(12.0), (-1.0, 3.0)),
}


@pytest.mark.parametrize("dim", [4, 64])   # 64: the vectorized draws (16 columns and more)
@pytest.mark.parametrize("seed", [None, 17])
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_fused_draws_have_the_distribution_over_100k_draws(name, seed, dim):
    factory, mean, std, bounds = DISTRIBUTIONS[name]
    w = de.Variable(dim=dim, initializer=factory(seed), kv_creator=de.NativeKVCreator(),
                    value_dtype=tf.float64, name=f"dist_{name}_{seed}_{dim}")
    keys = tf.constant(np.random.default_rng(3).choice(2**62, 100_000 // dim, replace=False),
                       tf.int64)
    rows = w.lookup(keys).numpy()
    x = rows.ravel()                                  # 100k draws
    assert abs(x.mean() - mean) < 5 * std / math.sqrt(x.size), (x.mean(), mean)
    assert abs(x.std() - std) < 0.01 * std, (x.std(), std)
    if bounds is None:   # normal: the share within one stddev, and tails beyond 4 stddev exist
        share = 0.682689   # within one stddev; 5 standard errors (unseeded draws vary per run)
        assert abs(np.mean(np.abs(x - mean) < std) - share) < 5 * math.sqrt(share * (1 - share) / x.size)
        assert np.abs(x - mean).max() > 4 * std
    else:
        lo, hi = bounds
        assert lo <= x.min() and x.max() <= hi
        assert x.min() < lo + 0.001 * (hi - lo) and x.max() > hi - 0.001 * (hi - lo)
    if name == "uniform":   # flat: each tenth of [a, b) holds a tenth of the draws
        counts = np.histogram(x, bins=10, range=bounds)[0]
        assert np.abs(counts / x.size - 0.1).max() < 0.005
    # Every key its own draw; columns are independent draws, not copies.
    assert len({tuple(r) for r in rows}) == len(rows)
    corr = np.corrcoef(rows.T)   # 5.5 standard errors of a zero correlation
    assert np.abs(corr[np.triu_indices(dim, 1)]).max() < 5.5 / math.sqrt(len(rows))
    # The row is a function of the key: looked up again, or inserted, it is the same.
    again = w.lookup(keys[:1000]).numpy()
    np.testing.assert_array_equal(again, rows[:1000])
    stored, exists = w.find_or_insert(keys[:1000])
    assert not exists.numpy().any()
    np.testing.assert_array_equal(stored.numpy(), rows[:1000])


@pytest.mark.parametrize("name", ["tf_constant", "tf_constant_row", "keras_ones", "number",
                                  "row_array", "none"])
def test_constant_rows_are_exact(name):
    w = de.get_variable(f"exact_{name}", dim=DIM, initializer=FUSED[name]())
    twin = de.get_variable(f"exact_twin_{name}", dim=DIM, initializer=FUSED[name](),
                           kv_creator=de.BuiltinKVCreator())
    keys = tf.constant([9, 2**40, -5, 9], tf.int64)
    got = w.lookup(keys).numpy()
    np.testing.assert_array_equal(got, twin.lookup(keys).numpy())
    assert (got == got[0]).all()


@pytest.mark.parametrize("value_dtype", [tf.float16, tf.bfloat16, tf.float64])
def test_16_bit_and_double_rows(value_dtype):
    for seed in (None, 5):
        w = de.Variable(dim=8, value_dtype=value_dtype, kv_creator=de.NativeKVCreator(),
                        initializer=tf.random_normal_initializer(0.0, 0.5, seed=seed))
        rows = tf.cast(w.lookup(tf.range(12500, dtype=tf.int64)), tf.float64).numpy()
        assert rows.dtype == np.float64 and abs(rows.mean()) < 0.01
        assert abs(rows.std() - 0.5) < 0.01
        assert len({tuple(r) for r in rows}) == len(rows)


# -- seeded rows: one function of (seed, key) everywhere --------------------------------------

SEEDED = {
    "normal": lambda: tf.random_normal_initializer(0.1, 0.01, seed=12345678901),
    "truncated": lambda: tf_keras.initializers.TruncatedNormal(-0.3, 0.7, seed=-4),
    "uniform": lambda: keras.initializers.RandomUniform(-0.05, 0.11, seed=2),
}


@pytest.mark.parametrize("value_dtype", [tf.float32, tf.float16, tf.bfloat16, tf.float64])
@pytest.mark.parametrize("key_dtype", [tf.int64, tf.int32, tf.string])
@pytest.mark.parametrize("name", sorted(SEEDED))
def test_seeded_rows_equal_the_builtin_backend_bit_for_bit_at_any_shard_count(
        name, key_dtype, value_dtype):
    if key_dtype == tf.string:
        keys = tf.strings.as_string(tf.range(300)) + "_" + tf.strings.as_string(tf.range(300) * 7)
        keys = tf.concat([keys, ["", "a" * 20, "b" * 21, "c" * 100]], 0)
    else:
        keys = tf.cast(tf.range(-150, 150) * 7919, key_dtype)
    want = de.Variable(key_dtype, value_dtype, dim=5, initializer=SEEDED[name](),
                       kv_creator=de.BuiltinKVCreator()).lookup(keys)
    for shards in (1, 2, 3):
        w = de.Variable(key_dtype, value_dtype, dim=5, devices=CPUS[:shards],
                        initializer=SEEDED[name](), kv_creator=de.NativeKVCreator())
        got = w.lookup(keys)
        np.testing.assert_array_equal(tf.cast(got, tf.float64).numpy(),
                                      tf.cast(want, tf.float64).numpy())
        inserted, _ = w.find_or_insert(keys)
        np.testing.assert_array_equal(tf.cast(inserted, tf.float64).numpy(),
                                      tf.cast(want, tf.float64).numpy())


def _child_rows(code, env=None):
    script = textwrap.dedent("""
        import json, tensorflow as tf
        import tensorflow_recommenders_addons.dynamic_embedding as de
    """) + textwrap.dedent(code) + textwrap.dedent("""
        rows = w.lookup(tf.constant([3, 9, 2**40], tf.int64)).numpy()
        print(json.dumps(rows.tolist()))
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT, **(env or {}))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.array(json.loads(proc.stdout.strip().splitlines()[-1]), np.float32)


def test_seeded_rows_are_reproducible_across_processes_and_unseeded_follow_the_global_seed():
    seeded = "w = de.Variable(dim=3, initializer=tf.random_normal_initializer(0.0, 1.0, seed=4))\n"
    here = de.Variable(dim=3, initializer=tf.random_normal_initializer(0.0, 1.0, seed=4))
    np.testing.assert_array_equal(_child_rows(seeded),
                                  here.lookup(tf.constant([3, 9, 2**40], tf.int64)).numpy())
    # Unseeded: fresh per process, unless the program sets TF's global seed.
    unseeded = "w = de.Variable(dim=3, initializer=tf.random_normal_initializer(0.0, 1.0))\n"
    global_seed = "tf.random.set_seed(123)\n" + unseeded
    first, second = _child_rows(global_seed), _child_rows(global_seed)
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(_child_rows(unseeded), first)


# -- wide rows: the vectorized normal draw (cc/ops/de_draw.h) ------------------------------

@pytest.mark.parametrize("dim, value_dtype", [(16, tf.float32), (40, tf.float32), (64, tf.float32),
                                              (64, tf.float64)])
def test_wide_unseeded_normal_rows_have_the_distribution(dim, value_dtype):
    w = de.Variable(dim=dim, initializer=tf.random_normal_initializer(1.0, 0.5),
                    kv_creator=de.NativeKVCreator(), value_dtype=value_dtype, name=f"wide_{dim}")
    keys = tf.constant(np.random.default_rng(5).choice(2**62, 200_000 // dim, replace=False),
                       tf.int64)
    rows = w.lookup(keys).numpy().astype(np.float64)
    z = (rows.ravel() - 1.0) / 0.5                          # >= 200k standard normals
    assert abs(z.mean()) < 5 / math.sqrt(z.size), z.mean()
    assert abs(z.std() - 1.0) < 0.01, z.std()
    # Kurtosis of a normal: E z^4 = 3, Var z^4 = 105 - 9 (5 standard errors: unseeded draws
    # differ per run, so a tighter bound fails now and then on a right sampler).
    assert abs(np.mean(z ** 4) - 3.0) < 5 * math.sqrt(96 / z.size), np.mean(z ** 4)
    for k, share in ((1, 0.682689), (2, 0.954500), (3, 0.997300)):
        assert abs(np.mean(np.abs(z) < k) - share) < 4 * math.sqrt(share * (1 - share) / z.size)
    assert 4.0 < np.abs(z).max() <= 5.78                     # tails exist; |z| <= sqrt(2 ln 2^24)
    # Columns are independent draws, also the cosine / sine pair of one word (k, k + 8).
    corr = np.corrcoef(rows.T)
    assert np.abs(corr[np.triu_indices(dim, 1)]).max() < 0.1
    assert np.abs(np.diag(corr, 8)).max() < 0.1
    assert len({tuple(r) for r in rows}) == len(rows)
    again = w.lookup(keys[:500]).numpy()
    np.testing.assert_array_equal(again, rows[:500].astype(again.dtype))
    stored, exists = w.find_or_insert(keys[:500])
    assert not exists.numpy().any()
    np.testing.assert_array_equal(stored.numpy(), again)


@pytest.mark.parametrize("dim", [8, 37, 64, 300])
@pytest.mark.parametrize("init", [lambda: tf.random_uniform_initializer(-0.3, 0.2, seed=9),
                                  lambda: keras.initializers.RandomUniform(seed=2),
                                  lambda: tf.random_normal_initializer(0.1, 0.02, seed=3),
                                  lambda: tf_keras.initializers.TruncatedNormal(0.0, 0.5, seed=8)])
def test_wide_seeded_rows_equal_the_builtin_backend(init, dim):
    # Vectorized draws (normal tails listed, then redone together) against TF's ops.
    keys = tf.constant(np.arange(-200, 200) * 104729, tf.int64)
    want = de.Variable(dim=dim, initializer=init(), kv_creator=de.BuiltinKVCreator()).lookup(keys)
    for shards in (1, 2):
        w = de.Variable(dim=dim, devices=CPUS[:shards], initializer=init(),
                        kv_creator=de.NativeKVCreator())
        np.testing.assert_array_equal(w.lookup(keys).numpy(), want.numpy())
        np.testing.assert_array_equal(w.find_or_insert(keys)[0].numpy(), want.numpy())


@pytest.mark.parametrize("value_dtype", [tf.float32, tf.float16, tf.bfloat16])
@pytest.mark.parametrize("mean, stddev", [(0.0, 0.01), (0.25, 3.0), (100.0, 1e-4), (-3.0, 0.0)])
@pytest.mark.parametrize("truncated", [False, True])
def test_seeded_rows_round_the_float64_rows(value_dtype, mean, stddev, truncated):
    # Float, float16 and bfloat16 rows come from a faster evaluation than float64 rows (AS 241,
    # checked against its error bound, the unsure columns recomputed: cc/ops/de_keyed.cc); they
    # must be the float64 rows rounded through float, also where many columns are unsure
    # (|mean| >> stddev) and for every dim the vectors cut differently.
    make = tf.keras.initializers.TruncatedNormal if truncated else tf.keras.initializers.RandomNormal
    keys = tf.constant(np.random.default_rng(4).integers(-2**62, 2**62, 4000), tf.int64)
    for dim in (1, 7, 64, 133):
        rows = {}
        for dtype in (tf.float64, value_dtype):
            w = de.Variable(dim=dim, value_dtype=dtype, kv_creator=de.NativeKVCreator(),
                            initializer=make(mean, stddev, seed=12))
            rows[dtype] = w.lookup(keys[:max(300, 40000 // dim)])
        want = tf.cast(tf.cast(rows[tf.float64], tf.float32), value_dtype)
        bits = tf.int32 if value_dtype == tf.float32 else tf.int16   # -0.0 != 0.0
        np.testing.assert_array_equal(tf.bitcast(rows[value_dtype], bits).numpy(),
                                      tf.bitcast(want, bits).numpy(), err_msg=f"dim {dim}")


WIDE_DIMS = (16, 24, 33, 48, 64, 100, 300)


def test_wide_rows_are_the_same_on_every_instruction_set():
    # The kernel picks AVX-512, AVX2 or plain code when it loads (TFRA_DE_DRAW_ISA lowers the
    # pick); all three must draw the same floats, or a key's row would depend on the machine.
    script = textwrap.dedent(f"""
        import json, tensorflow as tf
        import tensorflow_recommenders_addons.dynamic_embedding as de
        tf.random.set_seed(11)
        keys = tf.constant(list(range(1, 300)) + [2**40, -7], tf.int64)
        out = {{}}
        for dim in {WIDE_DIMS}:
            w = de.Variable(dim=dim, initializer=tf.random_normal_initializer(0.0, 1.0),
                            kv_creator=de.NativeKVCreator(), name=f"isa_{{dim}}")
            out[dim] = w.lookup(keys).numpy().tolist()
            u = de.Variable(dim=dim + 3, initializer=tf.random_uniform_initializer(-1.0, 2.0),
                            kv_creator=de.NativeKVCreator(), name=f"isa_u{{dim}}")
            out[f"u{{dim}}"] = u.lookup(keys).numpy().tolist()
            s = de.Variable(dim=dim, initializer=tf.random_normal_initializer(0.0, 1.0, seed=5),
                            kv_creator=de.NativeKVCreator(), name=f"isa_s{{dim}}")
            out[f"s{{dim}}"] = s.lookup(keys).numpy().tolist()
            t = de.Variable(dim=dim, kv_creator=de.NativeKVCreator(), name=f"isa_t{{dim}}",
                            initializer=tf.keras.initializers.TruncatedNormal(0.0, 1.0, seed=6))
            out[f"t{{dim}}"] = t.lookup(keys).numpy().tolist()
            n = de.Variable(dim=dim, kv_creator=de.NativeKVCreator(), name=f"isa_n{{dim}}",
                            initializer=tf.keras.initializers.TruncatedNormal(0.0, 1.0))
            out[f"n{{dim}}"] = n.lookup(keys).numpy().tolist()
            # |a| >> |b|: many columns whose fast float is unsure, recomputed exactly.
            f = de.Variable(dim=dim, kv_creator=de.NativeKVCreator(), name=f"isa_f{{dim}}",
                            initializer=tf.random_normal_initializer(100.0, 1e-4, seed=7))
            out[f"f{{dim}}"] = f.lookup(keys).numpy().tolist()
        print(json.dumps(out))
    """)
    rows = {}
    for isa in ("avx512", "avx2", "scalar"):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT, TFRA_DE_DRAW_ISA=isa)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows[isa] = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in [f"{kind}{dim}" for kind in ("", "u", "s", "t", "n", "f") for dim in WIDE_DIMS]:
        want = np.array(rows["scalar"][name], np.float32)
        assert want.shape[0] == 301
        # (Rows of 100 +- 1e-4 take few floats: the float spacing there is 7.6e-6.)
        assert len(np.unique(want)) > (50 if name.startswith("f") else 0.99 * want.size)
        for isa in ("avx512", "avx2"):
            np.testing.assert_array_equal(np.array(rows[isa][name], np.float32), want,
                                          err_msg=f"{isa} vs scalar, rows {name}")


# -- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("init, match", [
    (lambda: tf.random_uniform_initializer(1.0, 1.0), "maxval"),
    (lambda: keras.initializers.RandomUniform(2.0, -1.0, seed=1), "maxval"),
    (lambda: tf.random_normal_initializer(0.0, -0.1), "stddev"),
    (lambda: tf_keras.initializers.TruncatedNormal(0.0, -1.0), "stddev"),
])
def test_bad_parameters_are_rejected_naming_the_argument(kv_creator, init, match):
    with pytest.raises(ValueError, match=match):
        de.Variable(dim=4, initializer=init(), kv_creator=kv_creator)


def test_the_kernel_rejects_bad_init_args_naming_them():
    table = native.NativeKVTable(tf.int64, tf.float32, 3, "bad_args")
    ops = native.ops()
    keys = tf.constant([1, 2], tf.int64)
    cases = [("uniform", [2.0, 1.0], "maxval > minval"),
             ("normal", [0.0, -1.0], "stddev >= 0"),
             ("normal", [0.0, float("nan")], "finite"),
             ("normal", [0.0], r"init_args .* shape \[2\]"),
             ("constant", [1.0, 2.0], r"init_args .* \[1\] or \[dim\] = \[3\]")]
    for kind, args, match in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            ops.tfra_de_find_init(table.resource_handle, keys, [tf.constant(args, tf.float64)],
                                  dim=3, init=kind, value_dtype=tf.float32)
    with pytest.raises(ValueError, match="maxval must be > minval"):
        native.NativeInitializer("uniform", 1.0, 0.0)
    assert int(table.size()) == 0
