"""Grouped lookups: the rows of several variables read by one op per device
(`grouped_lookup.lookup_rows`, `de.embedding_lookups`, `de.keras.layers.call_grouped`) equal
the one-by-one reads, and the graph holds one `TfraDeFindInitGroup` per device."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS
from tfra_dynamic_embedding import grouped_lookup
from tfra_dynamic_embedding import tables as tables_lib

pytestmark = pytest.mark.skipif(not tables_lib.native.is_available(),
                                reason="native op library not built (run `make ops`)")


def _variables():
    """Variables of every initializer kind the grouped op draws, one it does not, a table on
    the built-in backend; shards over two and three devices."""
    return [
        de.Variable(dim=4, devices=CPUS[:2], name="g_normal",
                    initializer=tf.random_normal_initializer(0.0, 1.0)),
        de.Variable(dim=3, devices=CPUS[:3], name="g_uniform",
                    initializer=tf.random_uniform_initializer(-1.0, 1.0, seed=3)),
        de.Variable(dim=2, devices=CPUS[:2], name="g_row", initializer=[0.5, -2.0]),
        de.Variable(dim=5, devices=CPUS[1:3], name="g_truncated",
                    initializer=tf.keras.initializers.TruncatedNormal(0.0, 0.1, seed=7)),
        de.Variable(dim=4, devices=CPUS[:2], name="g_custom",
                    initializer=lambda shape, dtype=None: tf.fill(shape, 0.25)),
        de.Variable(dim=3, devices=CPUS[:2], name="g_builtin", initializer=1.5,
                    kv_creator=tables_lib.BuiltinKVCreator()),
    ]


def _keys(count):
    rng = np.random.default_rng(0)
    return [tf.constant(rng.integers(-10**12, 10**12, size=40 + 7 * i), tf.int64)
            for i in range(count)]


def _table_ops(graph):
    """{(device, op type): count} of the table ops in `graph`."""
    counts = collections.Counter()
    for op in graph.get_operations():
        if op.type.startswith("TfraDe") or op.type.startswith("LookupTable"):
            counts[tf.DeviceSpec.from_string(op.device).device_index, op.type] += 1
    return counts


def test_lookup_rows_equal_each_variables_lookup():
    variables, keys = _variables(), _keys(6)
    for v, k in zip(variables, keys):   # some keys present, with rows of their own
        v.upsert(k[::3], tf.fill([len(k[::3]), v.dim], 9.0))
    want = [v.lookup(k).numpy() for v, k in zip(variables, keys)]
    eager = grouped_lookup.lookup_rows(variables, keys)
    traced = tf.function(lambda: grouped_lookup.lookup_rows(variables, keys))()
    for v, w, e, t in zip(variables, want, eager, traced):
        np.testing.assert_array_equal(e.numpy(), w, err_msg=v.name)
        np.testing.assert_array_equal(t.numpy(), w, err_msg=v.name)
        assert (w == 9.0).all(axis=1).sum() == len(w[::3])
    # Nothing was inserted.
    assert [int(v.size()) for v in variables] == [len(k[::3]) for k in keys]


def test_one_grouped_op_per_device():
    variables, keys = _variables(), _keys(6)
    graph = tf.function(lambda: grouped_lookup.lookup_rows(variables, keys)) \
        .get_concrete_function().graph
    ops = _table_ops(graph)
    # Devices 0, 1, 2 hold shards of the four fused native variables: one op each.
    assert [ops[d, "TfraDeFindInitGroup"] for d in range(4)] == [1, 1, 1, 0]
    group_sizes = sorted(len(op.inputs) for op in graph.get_operations()
                         if op.type == "TfraDeFindInitGroup")
    # N tables + keys + counts + N init_args: device 0 holds 3 shards, 1 holds 4, 2 holds 2.
    assert group_sizes == [2 * 2 + 2, 2 * 3 + 2, 2 * 4 + 2]
    # The custom initializer's shards and the built-in table are read on their own.
    assert ops[0, "TfraDeFind"] + ops[1, "TfraDeFind"] == 2
    assert sum(n for (_, kind), n in ops.items() if kind == "TfraDeFindInit") == 0


def test_grouped_op_checks_its_inputs():
    table = tables_lib.NativeKVCreator().create(tf.int64, tf.float32, dim=2, name="g_checked")
    other = tables_lib.NativeKVCreator().create(tf.int64, tf.float32, dim=3, name="g_checked2")
    ops = tables_lib.native.ops()
    args = [tf.constant([0.0, 1.0], tf.float64)] * 2
    handles = [table.resource_handle, other.resource_handle]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"sum\(counts\) = 3"):
        ops.tfra_de_find_init_group(handles, tf.constant([1, 2], tf.int64),
                                    tf.constant([1, 2], tf.int64), args, inits=["normal"] * 2,
                                    seeds=[1, 2], keyed=[False, False], value_dtype=tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"counts\[1\] must be >= 0"):
        ops.tfra_de_find_init_group(handles, tf.constant([1], tf.int64),
                                    tf.constant([2, -1], tf.int64), args, inits=["normal"] * 2,
                                    seeds=[1, 2], keyed=[False, False], value_dtype=tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="uniform initializer needs maxval"):
        ops.tfra_de_find_init_group(handles, tf.constant([1, 2], tf.int64),
                                    tf.constant([1, 1], tf.int64),
                                    [tf.constant([1.0, 1.0], tf.float64)] * 2,
                                    inits=["uniform"] * 2, seeds=[1, 2], keyed=[False, False],
                                    value_dtype=tf.float32)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="one entry per table"):
        ops.tfra_de_find_init_group(handles, tf.constant([1, 2], tf.int64),
                                    tf.constant([1, 1], tf.int64), args, inits=["normal"],
                                    seeds=[1, 2], keyed=[False, False], value_dtype=tf.float32)
    # An empty table block is fine.
    rows = ops.tfra_de_find_init_group(handles, tf.constant([5, 6], tf.int64),
                                       tf.constant([0, 2], tf.int64), args,
                                       inits=["normal"] * 2, seeds=[1, 2], keyed=[False, False],
                                       value_dtype=tf.float32)
    assert rows.shape == (6,)


def _model(grouped):
    """Three variables (two over two devices), a loss over their lookups; Adam updates."""
    names = ["u", "i", "c"]
    variables = [de.get_variable(f"{'grp' if grouped else 'one'}_{n}", dim=d, devices=devs,
                                 initializer=tf.random_normal_initializer(0.0, 0.1, seed=s))
                 for n, d, devs, s in zip(names, (4, 4, 2), (CPUS[:2], CPUS[:2], CPUS[:1]),
                                          (1, 2, 3))]
    return names, variables


@pytest.mark.parametrize("max_norm", [None, 0.05])
def test_embedding_lookups_train_like_one_by_one(max_norm):
    rng = np.random.default_rng(2)
    batches = [[tf.constant(rng.integers(0, 30, size=shape), tf.int64)
                for shape in ((8,), (8, 3), (8,))] for _ in range(3)]
    results = {}
    for grouped in (True, False):
        names, variables = _model(grouped)
        opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05))

        @tf.function
        def step(ids, names=names, variables=variables, grouped=grouped, opt=opt):
            with tf.GradientTape() as tape:
                if grouped:
                    rows, wrappers = de.embedding_lookups(variables, ids, names=names,
                                                          max_norm=max_norm,
                                                          return_trainable=True)
                else:
                    pairs = [de.embedding_lookup(v, x, name=n, max_norm=max_norm,
                                                 return_trainable=True)
                             for v, x, n in zip(variables, ids, names)]
                    rows, wrappers = [p[0] for p in pairs], [p[1] for p in pairs]
                loss = (tf.reduce_sum(rows[0] * tf.reduce_sum(rows[1], 1))
                        + tf.reduce_sum(tf.square(rows[2])))
            grads = tape.gradient(loss, wrappers)
            opt.apply_gradients(zip(grads, wrappers))
            return loss

        losses = [float(step(b)) for b in batches]
        tables = []
        for v in variables:
            k, r = v.export()
            order = np.argsort(k.numpy())
            tables.append((k.numpy()[order], r.numpy()[order]))
        results[grouped] = losses, tables
    np.testing.assert_allclose(results[True][0], results[False][0], rtol=1e-6)
    for (k1, r1), (k2, r2) in zip(results[True][1], results[False][1]):
        np.testing.assert_array_equal(k1, k2)
        np.testing.assert_allclose(r1, r2, rtol=1e-6, atol=1e-7)


def test_embedding_lookups_in_a_tf1_graph_train_like_one_by_one():
    rng = np.random.default_rng(4)
    feeds = [rng.integers(0, 20, size=(6, 2)) for _ in range(3)]
    results = {}
    for grouped in (True, False):
        with tf.Graph().as_default():
            ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
            names, variables = _model(grouped)
            columns = [ids[:, 0], ids[:, 1], ids[:, 0]]
            if grouped:
                rows = de.embedding_lookups(variables, columns, names=names)
            else:
                rows = [de.embedding_lookup(v, c, name=n)
                        for v, c, n in zip(variables, columns, names)]
            loss = tf.add_n([tf.reduce_sum(tf.square(r - 1.0)) for r in rows])
            train = de.DynamicEmbeddingOptimizer(
                tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(loss)
            exported = [v.export() for v in variables]
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                losses = [sess.run([loss, train], {ids: f})[0] for f in feeds]
                tables = sess.run(exported)
        results[grouped] = losses, [(k[np.argsort(k)], r[np.argsort(k)]) for k, r in tables]
    np.testing.assert_allclose(results[True][0], results[False][0], rtol=1e-6)
    for (k1, r1), (k2, r2) in zip(results[True][1], results[False][1]):
        np.testing.assert_array_equal(k1, k2)
        np.testing.assert_allclose(r1, r2, rtol=1e-6)


def test_embedding_lookups_checks_its_arguments():
    v = de.Variable(dim=2, name="g_args")
    with pytest.raises(ValueError, match="one ids tensor per variable"):
        de.embedding_lookups([v, v], [tf.constant([1], tf.int64)])
    with pytest.raises(ValueError, match="names must hold one name per variable"):
        de.embedding_lookups([v], [tf.constant([1], tf.int64)], names=["a", "b"])
    with pytest.raises(TypeError, match="params must be a de.Variable"):
        de.embedding_lookups([tf.Variable([1.0])], [tf.constant([1], tf.int64)])
    with pytest.raises(ValueError, match="max_norm"):
        de.embedding_lookups([v], [tf.constant([1], tf.int64)], max_norm=-1.0)


def test_keras_call_grouped_equals_layer_calls():
    layers = [de.keras.layers.Embedding(4, name=f"cg_{i}", devices=CPUS[:2],
                                        initializer=tf.keras.initializers.RandomNormal(seed=i))
              for i in range(3)]
    pooled = de.keras.layers.Embedding(4, name="cg_pooled", pooling="mean")
    ids = [tf.constant([[1, 2], [3, 4]], tf.int64), tf.constant([5, 6], tf.int64),
           np.array([7, 8], np.int64)]
    want = [layer(tf.convert_to_tensor(x)) for layer, x in zip(layers, ids)]
    traced = tf.function(lambda: de.keras.layers.call_grouped(layers, ids))
    for got, w in zip(traced(), want):
        np.testing.assert_array_equal(got.numpy(), w.numpy())
    ops = _table_ops(traced.get_concrete_function().graph)
    assert ops[0, "TfraDeFindInitGroup"] == ops[1, "TfraDeFindInitGroup"] == 1
    # A pooling layer among them: every layer is called on its own.
    mixed = de.keras.layers.call_grouped(layers[:1] + [pooled], [ids[0], ids[0]])
    np.testing.assert_array_equal(mixed[0].numpy(), want[0].numpy())
    assert mixed[1].shape == (2, 4)
    with pytest.raises(ValueError, match="one input per layer"):
        de.keras.layers.call_grouped(layers, ids[:1])
