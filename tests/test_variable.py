"""de.Variable: construction, the data plane on every dtype and backend, sharding, bad input."""

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS
from tfra_dynamic_embedding.tables import native

VALUE_DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]


def _keys(key_dtype, values):
    if key_dtype == tf.string:
        return tf.constant([f"k{v}" for v in np.ravel(values)], tf.string, shape=np.shape(values))
    return tf.constant(values, key_dtype)


def _np(t):
    return tf.cast(t, tf.float64).numpy() if t.dtype == tf.bfloat16 else t.numpy()


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64, tf.string])
@pytest.mark.parametrize("value_dtype", VALUE_DTYPES)
@pytest.mark.parametrize("devices", [None, CPUS])
def test_upsert_lookup_every_dtype(kv_creator, key_dtype, value_dtype, devices):
    w = de.Variable(key_dtype=key_dtype, value_dtype=value_dtype, dim=3, devices=devices,
                    initializer=-1.0, kv_creator=kv_creator)
    ids = np.arange(10)
    rows = np.arange(30, dtype=np.float64).reshape(10, 3) / 4  # exact in every float dtype
    w.upsert(_keys(key_dtype, ids), tf.constant(rows, value_dtype))
    assert int(w.size()) == 10
    query = np.array([[3, 11], [0, 9]])
    got, exists = w.lookup(_keys(key_dtype, query), return_exists=True)
    assert got.shape == (2, 2, 3) and got.dtype == value_dtype
    expected = np.stack([rows[3], np.full(3, -1.0), rows[0], rows[9]]).reshape(2, 2, 3)
    np.testing.assert_array_equal(_np(got), expected)
    np.testing.assert_array_equal(exists.numpy(), [[True, False], [True, True]])
    assert int(w.size()) == 10  # lookup never inserts
    keys, values = w.export()
    order = np.argsort(keys.numpy())
    exported_keys = keys.numpy()[order]
    np.testing.assert_array_equal(exported_keys, _keys(key_dtype, ids).numpy()[np.argsort(
        _keys(key_dtype, ids).numpy())])
    np.testing.assert_array_equal(np.sort(_np(values).sum(axis=1)), np.sort(rows.sum(axis=1)))


def test_sharded_tables_live_on_their_devices(kv_creator):
    w = de.Variable(dim=2, devices=CPUS, kv_creator=kv_creator)
    assert w.shard_num == 4 and w.devices == CPUS
    for table, device in zip(w.tables, CPUS):
        assert table.resource_handle.device.endswith(device.replace("/CPU", "device:CPU"))
    keys = tf.constant(np.arange(-20, 20), tf.int64)
    w.upsert(keys, tf.ones([40, 2]))
    shard_sizes = [int(w.size(i)) for i in range(4)]
    assert shard_sizes == [10, 10, 10, 10]  # keys mod 4, negatives included
    assert int(w.size()) == 40
    shard_keys = w.tables[3].export()[0].numpy()
    assert sorted(shard_keys) == [k for k in range(-20, 20) if k % 4 == 3]


def test_default_partition_fn():
    ids = de.default_partition_fn(tf.constant([-1, -4, 5, 7], tf.int64), 4)
    assert ids.dtype == tf.int32
    np.testing.assert_array_equal(ids.numpy(), [3, 0, 1, 3])
    strings = tf.constant(["a", "b", "user_123"])
    np.testing.assert_array_equal(de.default_partition_fn(strings, 3).numpy(),
                                  tf.strings.to_hash_bucket_fast(strings, 3).numpy())


def test_initializers_draw_per_missing_key_and_do_not_insert(kv_creator):
    w = de.Variable(dim=4, initializer=tf.random_normal_initializer(0.0, 1.0), devices=CPUS[:2],
                    kv_creator=kv_creator)
    rows = w.lookup(tf.constant([1, 2, 3, 4], tf.int64)).numpy()
    assert len({tuple(r) for r in rows}) == 4  # every missing key gets its own draw
    again = w.lookup(tf.constant([1, 2, 3, 4], tf.int64)).numpy()
    assert int(w.size()) == 0  # not stored
    # The built-in backend draws afresh each time; the native kernel draws an unseeded row from
    # (the variable's seed, key), so it repeats until the key is inserted.
    assert np.array_equal(rows, again) == isinstance(kv_creator, de.NativeKVCreator)

    array_init = de.Variable(dim=3, initializer=np.array([1.0, 2.0, 3.0]), kv_creator=kv_creator)
    np.testing.assert_array_equal(array_init.lookup(tf.constant([9, 8], tf.int64)).numpy(),
                                  [[1, 2, 3], [1, 2, 3]])
    zeros = de.Variable(dim=2, kv_creator=kv_creator)
    np.testing.assert_array_equal(zeros.lookup(tf.constant([5], tf.int64)).numpy(), [[0, 0]])
    keras_init = de.Variable(dim=2, initializer=tf.keras.initializers.RandomUniform(5.0, 6.0),
                             kv_creator=kv_creator)
    first = keras_init.lookup(tf.constant([1, 2], tf.int64)).numpy()
    second = keras_init.lookup(tf.constant([3, 4], tf.int64)).numpy()
    assert ((first >= 5) & (first < 6)).all() and not np.array_equal(first, second)


def test_find_or_insert_creates_only_missing_rows(kv_creator):
    w = de.Variable(dim=2, initializer=tf.random_uniform_initializer(1.0, 2.0), devices=CPUS,
                    kv_creator=kv_creator)
    w.upsert(tf.constant([1], tf.int64), tf.constant([[7.0, 7.0]]))
    rows, exists = w.find_or_insert(tf.constant([1, 2, 2, 3], tf.int64))
    np.testing.assert_array_equal(exists.numpy(), [True, False, False, False])
    rows = rows.numpy()
    np.testing.assert_array_equal(rows[0], [7, 7])
    np.testing.assert_array_equal(rows[1], rows[2])  # one key, one row
    assert int(w.size()) == 3
    np.testing.assert_array_equal(w.lookup(tf.constant([2, 3], tf.int64)).numpy(), rows[2:])


def test_remove_clear_size(kv_creator):
    w = de.Variable(dim=1, devices=CPUS[:3], kv_creator=kv_creator)
    w.upsert(tf.constant(np.arange(12), tf.int64), tf.ones([12, 1]))
    w.remove(tf.constant([[0, 1], [2, 100]], tf.int64))
    assert int(w.size()) == 9
    _, exists = w.lookup(tf.constant([0, 3], tf.int64), return_exists=True)
    np.testing.assert_array_equal(exists.numpy(), [False, True])
    w.clear()
    assert int(w.size()) == 0 and [int(w.size(i)) for i in range(3)] == [0, 0, 0]


def test_accum_adds_deltas(kv_creator):
    w = de.Variable(dim=2, devices=CPUS[:2], kv_creator=kv_creator)
    w.upsert(tf.constant([1], tf.int64), tf.constant([[1.0, 1.0]]))
    w.accum(tf.constant([1, 2, 2], tf.int64), tf.constant([[1.0, 2.0], [3.0, 4.0], [1.0, 1.0]]))
    np.testing.assert_array_equal(w.lookup(tf.constant([1, 2], tf.int64)).numpy(),
                                  [[2, 3], [4, 5]])


def test_scalar_and_empty_keys(kv_creator):
    w = de.Variable(dim=2, initializer=3.0, devices=CPUS[:2], kv_creator=kv_creator)
    assert w.lookup(tf.constant(5, tf.int64)).shape == (2,)
    empty = w.lookup(tf.zeros([0, 4], tf.int64))
    assert empty.shape == (0, 4, 2)
    w.upsert(tf.zeros([0], tf.int64), tf.zeros([0, 2]))
    assert int(w.size()) == 0


def test_tf_function_does_not_retrace_per_batch_size(kv_creator):
    w = de.Variable(dim=2, initializer=1.0, devices=CPUS[:2], kv_creator=kv_creator)

    # TF itself retraces a plain tf.function per new input shape; with shape relaxation our ops
    # must not add traces of their own (no Python values captured per batch size).
    @tf.function(reduce_retracing=True)
    def step(keys):
        w.upsert(keys, tf.ones([tf.size(keys), 2]) * tf.cast(tf.size(keys), tf.float32))
        return w.lookup(keys)

    for n in [3, 5, 7, 9, 11, 13]:
        out = step(tf.range(n, dtype=tf.int64))
        np.testing.assert_array_equal(out.numpy(), np.full([n, 2], n))
    assert step.experimental_get_tracing_count() <= 2
    assert int(w.size()) == 13


def test_graph_mode_session():
    with tf.Graph().as_default():
        w = de.Variable(dim=2, devices=["/CPU:0", "/CPU:1"], initializer=0.5)
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        upsert = w.upsert(keys, tf.ones([tf.size(keys), 2]))
        rows, exists = w.lookup(keys, return_exists=True)
        with tf.compat.v1.Session() as sess:
            sess.run(upsert, {keys: [1, 2, 3]})
            got, ok = sess.run([rows, exists], {keys: [3, 4]})
            np.testing.assert_array_equal(got, [[1, 1], [0.5, 0.5]])
            np.testing.assert_array_equal(ok, [True, False])
            assert sess.run(w.size()) == 3


def test_saved_meta_graph_imports_and_restores(tmp_path):
    # TFRA stopped adding de.Variables to graph collections (an object that owns no tensor
    # breaks import_meta_graph); the Saver's entry must also name a real op of the graph.
    prefix = str(tmp_path / "ckpt")
    with tf.Graph().as_default():
        w = de.Variable(dim=2, name="coll", devices=CPUS[:2])
        size_name = w.size().name
        assert tf.compat.v1.get_collection(de.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES) == []
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(w.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2])))
            saver.save(sess, prefix)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        imported = tf.compat.v1.train.import_meta_graph(prefix + ".meta")
        imported.restore(sess, prefix)
        assert sess.run(size_name) == 3


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, words", [
    (dict(dim=0), "dim"),
    (dict(dim=-3), "dim"),
    (dict(dim=2.5), "dim"),
    (dict(key_dtype=tf.float32), "key_dtype"),
    (dict(value_dtype=tf.bool), "value_dtype"),
    (dict(value_dtype=tf.uint16), "value_dtype"),
    (dict(initializer=np.zeros(5), dim=3), "initializer"),
    (dict(partitioner="mod"), "partitioner"),
    (dict(devices=0), "devices must be .*got 0"),
    (dict(devices=[]), "devices must be .*got \\[\\]"),
])
def test_bad_construction_names_the_argument(kwargs, words):
    with pytest.raises(ValueError, match=words):
        de.Variable(**kwargs)


def test_wrong_key_dtype_is_rejected(kv_creator):
    w = de.Variable(key_dtype=tf.int64, dim=2, kv_creator=kv_creator)
    with pytest.raises(TypeError, match="keys must have dtype int64; got int32"):
        w.lookup(tf.constant([1], tf.int32))
    with pytest.raises(ValueError, match="keys"):
        w.upsert(tf.constant(["a"]), tf.ones([1, 2]))
    with pytest.raises(TypeError, match="values must have dtype float32; got int32"):
        w.upsert(tf.constant([1], tf.int64), tf.ones([1, 2], tf.int32))


def test_numpy_lists_and_numbers_are_converted_to_the_value_dtype(kv_creator):
    # As TFRA's convert_to_tensor(values, value_dtype): numpy arrays (float64 by default) and
    # Python lists and numbers are converted.
    w = de.Variable(key_dtype=tf.int64, dim=2, kv_creator=kv_creator)
    w.upsert(tf.constant([1], tf.int64), np.array([[0.5, 1.0 / 3]]))
    np.testing.assert_array_equal(w.lookup(tf.constant([1], tf.int64)).numpy(),
                                  np.float32([[0.5, 1.0 / 3]]))
    w.accum(tf.constant([1], tf.int64), np.ones([1, 2], np.float64))
    w.upsert(np.array([2, 3], np.int32), [[1, 2], [3.5, 4.0]])   # numpy int32 keys fit int64
    w.accum([3], np.array([[1, 1]], np.int64))
    w.import_(np.array([4]), np.float64([[9.0, 9.0]]))
    keys, values = w.export()
    assert keys.numpy().tolist() == [4] and values.dtype == tf.float32
    w.upsert(tf.constant([[5]], tf.int64), np.float64([[[2.5, 0.5]]]))
    got = w.lookup(tf.constant([4, 5], tf.int64))
    assert got.dtype == tf.float32
    np.testing.assert_array_equal(got.numpy(), [[9.0, 9.0], [2.5, 0.5]])


@pytest.mark.parametrize("var_dtype,tensor_dtype", [(tf.float32, tf.float64),
                                                    (tf.float64, tf.float32),
                                                    (tf.float32, tf.float16)])
def test_a_tensor_of_another_float_dtype_raises_naming_the_argument(kv_creator, var_dtype,
                                                                    tensor_dtype):
    # TFRA raises TF's "Tensor conversion requested dtype float32 for Tensor with dtype
    # float64"; a silent cast would turn a float64 1e300 into inf.
    w = de.Variable(key_dtype=tf.int64, value_dtype=var_dtype, dim=1, devices=CPUS[:2],
                    kv_creator=kv_creator)
    w.upsert(tf.constant([1], tf.int64), tf.constant([[1.0]], var_dtype))
    keys = tf.constant([1], tf.int64)
    rows = tf.constant([[1e300 if tensor_dtype == tf.float64 else 2.0]], tensor_dtype)
    words = (f"must have dtype {var_dtype.name}; got {tensor_dtype.name} .*Tensor conversion "
             f"requested dtype {var_dtype.name} for Tensor with dtype {tensor_dtype.name}")
    for arg, write in [("values", lambda: w.upsert(keys, rows)),
                       ("values", lambda: w.upsert(keys, tf.Variable(rows))),
                       ("deltas", lambda: w.accum(keys, rows)),
                       ("values", lambda: w.import_(keys, rows)),
                       ("old_values", lambda: w.accum(keys, rows, rows, [True])),
                       ("new_values", lambda: w.accum(keys, tf.constant([[1.0]], var_dtype),
                                                      rows, [True]))]:
        with pytest.raises(ValueError, match=f"^{arg} {words}"):
            write()
    # TFRA's table surface of a shard raises TF's own error.
    with pytest.raises(ValueError, match="Tensor conversion requested dtype"):
        w.tables[1].insert(keys, rows)
    np.testing.assert_array_equal(w.lookup(keys).numpy(), [[1.0]])   # unchanged
    assert int(w.size()) == 1


def test_keys_of_another_dtype_raise_for_tensors_and_convert_from_numpy_where_they_fit(
        kv_creator):
    w = de.Variable(key_dtype=tf.int32, dim=1, kv_creator=kv_creator)
    with pytest.raises(ValueError, match="keys must have dtype int32; got int64"):
        w.upsert(tf.constant([1], tf.int64), [[1.0]])
    w.upsert(np.array([1, 2], np.int64), [[1.0], [2.0]])
    assert sorted(w.export()[0].numpy().tolist()) == [1, 2]
    with pytest.raises(ValueError, match=r"keys must have dtype int32; got a numpy int64 array "
                                         r"with values outside its range"):
        w.upsert(np.array([2 ** 40], np.int64), [[1.0]])
    with pytest.raises(ValueError, match="keys must have dtype int32; got a numpy float64"):
        w.upsert(np.array([1.5]), [[1.0]])
    assert int(w.size()) == 2


def test_tfra_accum_leaves_keys_changed_by_another_writer(kv_creator):
    # accum(keys, old, new, exists) with `exists` read before another writer acted.
    w = de.Variable(dim=1, devices=CPUS[:2], kv_creator=kv_creator)
    w.upsert(tf.constant([1, 2], tf.int64), [[10.0], [20.0]])
    keys = tf.constant([1, 2, 3, 4], tf.int64)
    old, exists = w.lookup(keys, return_exists=True)      # 1, 2 exist; 3, 4 do not
    w.remove(tf.constant([2], tf.int64))                  # another writer removes 2 ...
    w.upsert(tf.constant([4], tf.int64), [[40.0]])        # ... and inserts 4
    w.accum(keys, old, old + 1.0, exists)
    got, present = w.lookup(keys, return_exists=True)
    np.testing.assert_array_equal(present.numpy(), [True, False, True, True])
    np.testing.assert_array_equal(got.numpy()[[0, 2, 3]], [[11.0], [1.0], [40.0]])


def test_bad_values_leave_table_unchanged(kv_creator):
    w = de.Variable(dim=3, devices=CPUS[:2], kv_creator=kv_creator)
    w.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 3]))
    with pytest.raises(ValueError, match="dim=3"):
        w.upsert(tf.constant([1, 5], tf.int64), tf.zeros([2, 4]))
    # TFRA's table kernels report a bad shape as an op error "Expected shape ..." when run;
    # caught at build time here, the error is both that and a ValueError.
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape"):
        w.upsert(tf.constant([1, 5, 6], tf.int64), tf.zeros([6]))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec(None, tf.float32)])
    def upsert(keys, values):
        w.upsert(keys, values)

    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape"):
        upsert(tf.constant([1, 5], tf.int64), tf.zeros([3, 3]))
    keys, values = w.export()
    assert sorted(keys.numpy()) == [1, 2] and values.numpy().sum() == 6


def test_writes_of_static_shapes_add_no_shape_asserts_to_the_graph(kv_creator):
    # TFRA code that upserts in a loop of session runs grows one graph: a write whose shapes
    # are known when it is built holds just its table op (shapes checked in Python), and one
    # of unknown shapes keeps its run-time check.
    with tf.Graph().as_default() as graph, tf.compat.v1.Session() as sess:
        w = de.Variable(dim=2, kv_creator=kv_creator, name="static_writes")
        before = len(graph.get_operations())
        write = w.upsert(tf.constant([1, 2], tf.int64), tf.constant([[1.0, 2.0], [3.0, 4.0]]))
        types = [op.type for op in graph.get_operations()[before:]]
        assert "Assert" not in types and len(types) <= 4, types
        sess.run(write)
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        rows = tf.compat.v1.placeholder(tf.float32, [None, 2])
        write = w.upsert(keys, rows)
        with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape"):
            sess.run(write, {keys: [3, 4, 5], rows: np.zeros([2, 2])})
        np.testing.assert_array_equal(sess.run(w.lookup(tf.constant([1, 2, 3], tf.int64))),
                                      [[1, 2], [3, 4], [0, 0]])


def test_import_and_accum_of_unknown_shapes_check_rows_before_any_shard_is_written(kv_creator):
    # Shapes known only at run time (a tf.function of None shapes, a v1 restore): a row width
    # other than dim is refused before any shard changes, not re-cut into rows of dim.
    w = de.Variable(dim=1, devices=CPUS[:3], kv_creator=kv_creator, name="late_shapes")
    w.upsert(tf.constant([1, 2], tf.int64), tf.constant([[10.0], [20.0]]))
    unknown = [tf.TensorSpec(None, tf.int64), tf.TensorSpec(None, tf.float32)]

    @tf.function(input_signature=unknown)
    def import_(keys, values):
        w.import_(keys, values)

    @tf.function(input_signature=unknown + [tf.TensorSpec(None, tf.float32),
                                            tf.TensorSpec(None, tf.bool)])
    def accum(keys, old, new, exists):
        w.accum(keys, old, new, exists)

    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape.*values"):
        import_(tf.constant([7, 8, 9], tf.int64), tf.constant([[1., 2.], [3., 4.], [5., 6.]]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape.*old_values"):
        accum(tf.constant([1, 3], tf.int64), tf.zeros([2, 2]), tf.ones([2, 2]), [True, False])
    with pytest.raises(tf.errors.InvalidArgumentError, match="exists must have the shape"):
        accum(tf.constant([1, 3], tf.int64), tf.zeros([2, 1]), tf.ones([2, 1]), [True])
    keys, values = (t.numpy() for t in w.export())
    assert dict(zip(keys.tolist(), values[:, 0].tolist())) == {1: 10.0, 2: 20.0}
    accum(tf.constant([1, 3], tf.int64), tf.zeros([2, 1]), tf.ones([2, 1]), [True, False])
    import_(tf.constant([5], tf.int64), tf.constant([[5.0]]))   # right widths still work
    assert w.export()[0].numpy().tolist() == [5]


def test_variable_names_and_devices_are_checked():
    with pytest.raises(ValueError, match="name must be a non-empty string; got None"):
        de.Variable(dim=2, name=None)
    with pytest.raises(ValueError, match="devices: 'bogus' is not a device name"):
        de.Variable(dim=2, devices="bogus")


def test_partitioner_out_of_range_leaves_table_unchanged(kv_creator):
    def bad_partitioner(keys, shard_num):
        return tf.cast(keys, tf.int32)  # key 7 -> shard 7 of 2

    w = de.Variable(dim=1, devices=CPUS[:2], partitioner=bad_partitioner, kv_creator=kv_creator)
    w.upsert(tf.constant([0, 1], tf.int64), tf.ones([2, 1]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="bad_partitioner.*outside \\[0, 2\\)"):
        w.upsert(tf.constant([0, 7], tf.int64), tf.zeros([2, 1]))
    np.testing.assert_array_equal(w.lookup(tf.constant([0, 1], tf.int64)).numpy(), [[1], [1]])
    assert int(w.size()) == 2


def test_size_index_out_of_range():
    w = de.Variable(dim=1, devices=CPUS[:2])
    with pytest.raises(ValueError, match="index"):
        w.size(5)


# -- get_variable --------------------------------------------------------------------------
def test_get_variable_reuse_semantics_in_graph_mode():
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("ctr"):
            a = de.get_variable("user", dim=4)
            assert a.name == "ctr/user"
            with pytest.raises(ValueError, match="ctr/user"):
                de.get_variable("user", dim=4)
        with tf.compat.v1.variable_scope("ctr", reuse=True):
            assert de.get_variable("user", dim=4) is a
            b = de.get_variable("item", dim=4)   # TFRA creates a new name under reuse=True
            assert b is not a and b.name == "ctr/item"
        with tf.compat.v1.variable_scope("ctr", reuse=tf.compat.v1.AUTO_REUSE):
            assert de.get_variable("user", dim=4) is a
            assert de.get_variable("item") is b
    with tf.Graph().as_default():  # a new graph has its own variables
        with tf.compat.v1.variable_scope("ctr"):
            assert de.get_variable("user", dim=4) is not a


def test_short_file_name_drops_scope_and_optimizer_from_names():
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("ctr"):
            short = de.get_variable("user", dim=2, short_file_name=True)
            long = de.get_variable("item", dim=2)
        assert (short.name, long.name) == ("user", "ctr/item")
        assert short.short_file_name and not long.short_file_name
        opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
        ids = tf.constant([1, 2], tf.int64)
        loss = tf.reduce_sum(de.embedding_lookup(short, ids, name="s")) + \
            tf.reduce_sum(de.embedding_lookup(long, ids, name="l"))
        opt.minimize(loss)
        slot_names = sorted(v.name for var in (short, long)
                            for v in var.get_slot_variables(opt))
    assert "user/m" in slot_names and "user/v" in slot_names
    assert any(n.startswith("ctr/item/") and n.endswith("/m") and n != "ctr/item/m"
               for n in slot_names)


def test_get_variable_eager_returns_live_variable():
    a = de.get_variable("eager_reuse_probe", dim=2)
    assert de.get_variable("eager_reuse_probe", dim=2) is a


@pytest.mark.parametrize("fresh", ["reset", "new_graph"])
def test_get_variable_store_follows_the_default_graph_in_eager_mode(fresh):
    # A notebook (or tf.test.TestCase.setUp) resetting the graph must not train on old rows.
    import gc
    name = f"graph_follow_{fresh}"
    a = de.get_variable(name, dim=2)
    a.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2]))
    if fresh == "reset":
        tf.compat.v1.reset_default_graph()
        b = de.get_variable(name, dim=2)
    else:
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            b = de.get_variable(name, dim=2)
            assert sess.run(b.size()) == 0
        return
    assert b is not a and int(b.size()) == 0
    # The old tables died with their variable: a new variable under the same name (and
    # another dtype) starts empty, not from a table left in the resource manager.
    del a, b
    gc.collect()
    tf.compat.v1.reset_default_graph()
    c = de.get_variable(name, dim=3, value_dtype=tf.float64)
    assert int(c.size()) == 0
    np.testing.assert_array_equal(c.lookup(tf.constant([1], tf.int64)).numpy(), [[0, 0, 0]])
    assert de.get_variable(name) is c


def test_get_variable_inside_tf_function_uses_the_outer_store():
    made = []

    @tf.function
    def step(ids):
        v = de.get_variable("fn_store", dim=2, initializer=1.0)
        made.append(v)
        return v.lookup(ids)

    step(tf.constant([1], tf.int64))
    step(tf.constant([1, 2], tf.int64))   # a retrace
    assert len(made) == 2 and made[0] is made[1]
    assert de.get_variable("fn_store") is made[0]


def test_placement_scope_chooses_devices():
    from tfra_dynamic_embedding import scopes  # pylint: disable=import-outside-toplevel

    def resolver(full_name):
        return (CPUS[1:3], None) if full_name == "placed" else None

    with scopes.placement_scope(resolver):
        placed = de.get_variable("placed", dim=2)
        other = de.get_variable("not_placed", dim=2, devices=[CPUS[3]])
    assert placed.devices == CPUS[1:3] and other.devices == [CPUS[3]]


def test_tensor_and_scalar_array_initializers():
    # TFRA code passes graph tensors (of another dtype) and 0-d arrays as initializers.
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        w = de.get_variable("t10", tf.int64, tf.int32, initializer=tf.constant([-1, -2], tf.int64),
                            dim=2)
        s = de.Variable(dim=3, initializer=tf.constant(0.5))
        sess.run(w.upsert(tf.constant([0], tf.int64), tf.constant([[4, 5]], tf.int32)))
        rows, scalar_rows = sess.run([w.lookup(tf.constant([0, 9], tf.int64)),
                                      s.lookup(tf.constant([1], tf.int64))])
    np.testing.assert_array_equal(rows, [[4, 5], [-1, -2]])
    np.testing.assert_array_equal(scalar_rows, [[0.5] * 3])
    v = de.Variable(dim=2, initializer=np.array(7.0))
    np.testing.assert_array_equal(v.lookup(tf.constant([3], tf.int64)).numpy(), [[7.0, 7.0]])
    with tf.Graph().as_default(), pytest.raises(ValueError, match="initializer"):
        de.Variable(dim=2, initializer=tf.constant([1.0, 2.0, 3.0]))


def test_initializer_is_called_for_exactly_the_missing_keys(kv_creator):
    shapes = []

    def recording_initializer(shape, dtype=None):
        shapes.append([int(d) for d in shape])
        return tf.random.normal(shape, dtype=dtype)

    w = de.Variable(dim=3, initializer=recording_initializer, devices=CPUS[:2],
                    kv_creator=kv_creator)
    w.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 3]))
    rows, exists = w.lookup(tf.constant([1, 5, 5, 6, 2, 8], tf.int64), return_exists=True)
    np.testing.assert_array_equal(exists.numpy(), [True, False, False, False, True, False])
    # ids 5, 6, 8 are missing: keys mod 2 puts 6 and 8 on shard 0 and 5 on shard 1
    assert sorted(shapes) == [[1, 3], [2, 3]]
    np.testing.assert_array_equal(rows.numpy()[1], rows.numpy()[2])  # one key, one draw
    np.testing.assert_array_equal(rows.numpy()[[0, 4]], np.ones([2, 3]))


def test_trainable_wrappers_by_lookup_name():
    w = de.Variable(dim=2, name="by_name", initializer=0.5)
    assert w.get_trainable_by_name("user") is None and w.trainable_store == {}
    with tf.GradientTape():
        _, wrapper = de.embedding_lookup(w, tf.constant([1, 2], tf.int64), name="user",
                                         return_trainable=True)
    assert w.get_trainable_by_name("user") is wrapper
    [(key, stored)] = w.trainable_store.items()
    assert stored is wrapper and w.get_trainable_by_name(key) is wrapper


def test_accum_tfra_form_adds_changes_of_existing_keys_and_sets_new_ones(kv_creator):
    w = de.Variable(dim=1, kv_creator=kv_creator, name="accum_tfra")
    w.upsert(tf.constant([1, 2], tf.int64), tf.constant([[10.0], [20.0]]))
    w.accum(tf.constant([1, 2, 3], tf.int64), tf.constant([[1.0], [2.0], [0.0]]),
            tf.constant([[4.0], [2.0], [9.0]]), tf.constant([True, True, False]))
    np.testing.assert_array_equal(w.lookup(tf.constant([1, 2, 3], tf.int64)).numpy(),
                                  [[13.0], [20.0], [9.0]])
    with pytest.raises(ValueError, match="needs both new_values and exists"):
        w.accum(tf.constant([1], tf.int64), tf.ones([1, 1]), new_values=tf.ones([1, 1]))


@pytest.mark.parametrize("key_dtype, value_dtype", [
    (tf.int64, tf.int8), (tf.string, tf.int8), (tf.int32, tf.int8), (tf.int64, tf.string)])
def test_int8_and_string_rows_on_the_builtin_backend(key_dtype, value_dtype):
    # TFRA tables hold int8 and string values too (non-trainable side tables).
    as_value = (lambda x: np.array(x).astype(str)) if value_dtype == tf.string else \
        (lambda x: np.array(x, np.int8))
    as_key = (lambda x: np.array(x).astype(str)) if key_dtype == tf.string else \
        (lambda x: np.array(x, key_dtype.as_numpy_dtype))
    w = de.Variable(key_dtype=key_dtype, value_dtype=value_dtype, dim=2, devices=CPUS[:2],
                    initializer=as_value([-1]), name=f"side_{key_dtype.name}_{value_dtype.name}")
    assert isinstance(w.kv_creator, de.BuiltinKVCreator)
    w.upsert(tf.constant(as_key([0, 1, 2])), tf.constant(as_value([[0, 0], [1, 1], [2, 2]])))
    w.remove(tf.constant(as_key([1, 5])))
    rows, exists = w.lookup(tf.constant(as_key([0, 1, 2])), return_exists=True)
    got = rows.numpy()
    if value_dtype == tf.string:
        got = np.vectorize(bytes.decode)(got)
    np.testing.assert_array_equal(got, as_value([[0, 0], [-1, -1], [2, 2]]))
    np.testing.assert_array_equal(exists.numpy(), [True, False, True])
    assert int(w.size()) == 2
    if native.is_available():
        with pytest.raises(ValueError, match="needs the built-in backend"):
            de.Variable(value_dtype=value_dtype, dim=2, kv_creator=de.NativeKVCreator())


def test_constant_initializers_must_fit_integer_and_string_rows_exactly():
    keys = tf.constant([1, 2], tf.int64)

    def rows(value_dtype, initializer):
        w = de.Variable(value_dtype=value_dtype, dim=2, initializer=initializer,
                        kv_creator=de.BuiltinKVCreator())
        return w.lookup(keys).numpy().tolist()

    # TF would cut 1.5 to 1 and wrap 300 to 44 in int8 rows, or fail at the first lookup
    for value_dtype, initializer in [(tf.int64, 1.5), (tf.int64, np.array([1.5, 2.0])),
                                     (tf.int8, 300), (tf.int8, np.array(-129)),
                                     (tf.int64, 2.0 ** 63), (tf.int32, float("nan"))]:
        with pytest.raises(ValueError, match=f"initializer .* value_dtype {value_dtype.name}"):
            de.Variable(value_dtype=value_dtype, dim=2, initializer=initializer,
                        kv_creator=de.BuiltinKVCreator())
    assert rows(tf.int64, 1.0) == [[1, 1], [1, 1]]          # a whole float (TF refused it)
    assert rows(tf.int64, np.array([3.0, -4.0])) == [[3, -4], [3, -4]]
    assert rows(tf.int8, -128) == [[-128, -128], [-128, -128]]
    # string rows: None is empty text, a str is text (not a Keras initializer's name)
    assert rows(tf.string, None) == [[b"", b""], [b"", b""]]
    assert rows(tf.string, "uniform") == [[b"uniform", b"uniform"], [b"uniform", b"uniform"]]
    with pytest.raises(ValueError, match="initializer 0 cannot fill rows of value_dtype string"):
        de.Variable(value_dtype=tf.string, dim=2, initializer=0)


def test_builtin_key_value_pairs_without_a_kernel_are_named():
    with pytest.raises(ValueError, match="key_dtype string to value_dtype string"):
        de.Variable(key_dtype=tf.string, value_dtype=tf.string, dim=1)
    with pytest.raises(ValueError, match="key_dtype int32 to value_dtype int64"):
        de.Variable(key_dtype=tf.int32, value_dtype=tf.int64, dim=1)


def test_contains_says_which_keys_have_rows_without_drawing_or_inserting(kv_creator):
    emb = de.Variable(dim=3, initializer=tf.random_normal_initializer(0.0, 1.0),
                      kv_creator=kv_creator, devices=CPUS[:2], name="contains_emb")
    emb.upsert(tf.constant([1, 4], tf.int64), tf.ones([2, 3]))
    got = emb.contains(tf.constant([[1, 2], [4, 8]], tf.int64))
    np.testing.assert_array_equal(got.numpy(), [[True, False], [True, False]])
    assert int(emb.size()) == 2
