"""TFRA's public surface that user scripts touch: `__version__`, `var.tables[i]`, `de.data_flow`,
one-element params lists, TF's frozen Keras 2 optimizers, `size()` in a finalized graph."""

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons as tfra
import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS


def test_package_version():
    assert tfra.__version__ == de.__version__
    assert tfra.__version__.count(".") == 2


def test_variable_tables_have_tfras_table_methods(kv_creator):
    var = de.Variable(dim=3, devices=CPUS[:2], initializer=tf.constant_initializer(0.5),
                      kv_creator=kv_creator, name="surface")
    var.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 3]))
    shard1 = var.tables[1]                      # odd keys: 1 and 3
    assert [t.kv_table for t in var.tables] == list(var._tables)  # pylint: disable=protected-access
    assert "CPU:1" in shard1.resource_handle.device and shard1.device == CPUS[1]
    # lookup(keys): a missing key gets the table's default row (the initializer's row)
    np.testing.assert_array_equal(shard1.lookup(tf.constant([1, 5], tf.int64)).numpy(),
                                  [[1, 1, 1], [0.5, 0.5, 0.5]])
    rows, exists = shard1.lookup(tf.constant([3, 7], tf.int64), return_exists=True)
    np.testing.assert_array_equal(exists.numpy(), [True, False])
    assert int(shard1.size()) == 2
    shard1.insert(tf.constant([9], tf.int64), [[2.0, 2.0, 2.0]])
    shard1.remove(tf.constant([1], tf.int64))
    keys, values = shard1.export()
    order = np.argsort(keys.numpy())
    np.testing.assert_array_equal(keys.numpy()[order], [3, 9])
    np.testing.assert_array_equal(values.numpy()[order], [[1, 1, 1], [2, 2, 2]])
    assert int(var.size()) == 3      # the views write the variable's own shards


def test_de_resource_variable_filter_keeps_the_dense_weights():
    """TFRA scripts (and its Horovod callback) filter a model's variables with
    `isinstance(v, (de.TrainableWrapper, de.DEResourceVariable))`."""
    emb = de.Variable(dim=2, name="filtered")
    dense = tf.Variable(tf.ones([2, 1]), name="dense")
    with tf.GradientTape() as tape:
        rows, wrapper = de.embedding_lookup(emb, tf.constant([1, 2], tf.int64),
                                            return_trainable=True)
        loss = tf.reduce_sum(tf.matmul(rows, dense))
    assert tape.gradient(loss, wrapper) is not None
    assert isinstance(wrapper.ids, de.DEResourceVariable)
    assert not isinstance(wrapper, de.DEResourceVariable)
    candidates = [dense, wrapper, wrapper.ids]
    kept = [v for v in candidates
            if not isinstance(v, (de.TrainableWrapper, de.DEResourceVariable))]
    assert kept == [dense]


def test_v1_saver_of_variable_tables_saves_each_shard(tmp_path):
    prefix = str(tmp_path / "tables")
    with tf.Graph().as_default():
        var = de.Variable(dim=2, devices=CPUS[:2], name="saved_tables")
        fill = var.upsert(tf.constant([1, 2, 3], tf.int64), tf.constant([[1.0, 1], [2, 2], [3, 3]]))
        saver = tf.compat.v1.train.Saver(var.tables)
        with tf.compat.v1.Session() as sess:
            sess.run(fill)
            saver.save(sess, prefix)
            sess.run(var.clear())
            assert sess.run(var.size()) == 0
            saver.restore(sess, prefix)
            keys, values = sess.run(var.export())
    names = dict(tf.train.list_variables(prefix))
    assert names["saved_tables_mht_1of2-keys"] == [1]
    assert names["saved_tables_mht_2of2-keys"] == [2]
    order = np.argsort(keys)
    np.testing.assert_array_equal(keys[order], [1, 2, 3])
    np.testing.assert_array_equal(values[order], [[1, 1], [2, 2], [3, 3]])


def test_size_works_in_a_finalized_graph():
    with tf.Graph().as_default() as graph:
        var = de.Variable(dim=2, devices=CPUS[:2], name="finalized")
        fill = var.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2]))
        total, shard = var.size(), var.size(1)
        graph.finalize()
        with tf.compat.v1.Session() as sess:
            sess.run(fill)
            assert sess.run([var.size(), var.size(1)]) == [3, 2]
        assert var.size() is total and var.size(1) is shard


def test_size_op_does_not_keep_a_callers_control_dependency():
    with tf.Graph().as_default():
        var = de.Variable(dim=1, name="sized")
        flag = tf.Variable(0)
        with tf.control_dependencies([flag.assign_add(1)]):
            size = var.size()
        with tf.compat.v1.Session() as sess:
            sess.run(flag.initializer)
            sess.run(size)
            sess.run(var.size())
            assert sess.run(flag) == 0


def test_data_flow_partition_and_stitch_round_trip():
    keys = tf.constant([5, -3, 8, 0, 7], tf.int64)
    shard = de.default_partition_fn(keys, 3)
    parts = de.data_flow.dynamic_partition(keys, shard, 3)
    positions = de.data_flow.dynamic_partition(tf.range(5), shard, 3)
    np.testing.assert_array_equal(parts[0].numpy(), [-3, 0])
    np.testing.assert_array_equal(parts[1].numpy(), [7])
    np.testing.assert_array_equal(parts[2].numpy(), [5, 8])
    for use_fast in (True, False):
        back = de.data_flow.dynamic_stitch(positions, parts, use_fast=use_fast)
        np.testing.assert_array_equal(back.numpy(), keys.numpy())


@pytest.mark.parametrize("lookup", ["embedding_lookup", "embedding_lookup_unique"])
def test_lookup_accepts_a_one_element_list(lookup):
    var = de.Variable(dim=2, initializer=1.5, name=f"listed_{lookup}")
    got = getattr(de, lookup)([var], tf.constant([[1, 2]], tf.int64))
    np.testing.assert_array_equal(got.numpy(), np.full([1, 2, 2], 1.5))
    with pytest.raises(ValueError, match="params must be a de.Variable or a list of one"):
        getattr(de, lookup)([var, var], tf.constant([1], tf.int64))


@pytest.mark.parametrize("make", ["Adam", "Adagrad", "SGD"])
def test_tfs_frozen_keras2_optimizers_train(make):
    # TFRA code imports optimizers from tensorflow.python.keras.optimizer_v2 (TF's frozen copy).
    optimizer_v2 = pytest.importorskip("tensorflow.python.keras.optimizer_v2")
    del optimizer_v2
    from tensorflow.python.keras.optimizer_v2 import adagrad, adam, gradient_descent  # pylint: disable=import-outside-toplevel
    ctor = {"Adam": adam.Adam, "Adagrad": adagrad.Adagrad, "SGD": gradient_descent.SGD}[make]
    var = de.Variable(dim=2, initializer=1.0, name=f"frozen_{make}")
    dense = tf.Variable(tf.ones([3, 2]))
    opt, dense_opt = de.DynamicEmbeddingOptimizer(ctor(0.1)), ctor(0.1)
    ids = tf.constant([0, 2, 0], tf.int64)
    for _ in range(3):
        with tf.GradientTape(persistent=True) as tape:
            emb, wrapper = de.embedding_lookup(var, ids, return_trainable=True, name="l")
            loss = tf.reduce_sum(emb * emb * tf.constant([[1.0], [2.0], [3.0]]))
            dense_loss = tf.reduce_sum(tf.gather(dense, ids) ** 2 *
                                       tf.constant([[1.0], [2.0], [3.0]]))
        opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
        dense_opt.apply_gradients([(tape.gradient(dense_loss, dense), dense)])
    got = var.lookup(tf.constant([0, 2], tf.int64)).numpy()
    want = tf.gather(dense, [0, 2]).numpy()
    # Adam is lazy on the de side: with only rows 0 and 2 ever touched it equals the dense run.
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert not np.allclose(got, 1.0)


def test_trainable_wrapper_names_and_placement_follow_tfra():
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("test", reuse=tf.compat.v1.AUTO_REUSE):
            p1 = de.get_variable(name="p1")
            with tf.device(CPUS[1]):
                ids = tf.constant([0, 1, 2], tf.int64)
            with tf.compat.v1.variable_scope("q"), tf.device(CPUS[0]):
                _, t1 = de.embedding_lookup(p1, ids, name="emb", return_trainable=True)
                _, t2 = de.embedding_lookup(p1, ids, name="emb", return_trainable=True)
                sp = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 2], tf.int64), [2, 2])
                _, t3 = de.embedding_lookup_sparse(p1, sp, None, name="sp",
                                                   return_trainable=True)
                _, t4 = de.safe_embedding_lookup_sparse(p1, sp, None, name="safe",
                                                        return_trainable=True)
        assert (t1.name, t2.name) == ("test/q/emb/emb:0", "test/q/emb/emb_1:0")
        assert t3.name == "test/q/sp/embedding_lookup/sp/embedding_lookup:0"
        assert t4.name == ("test/q/safe/embedding_lookup_sparse/embedding_lookup/"
                           "safe/embedding_lookup_sparse/embedding_lookup:0")
        assert p1._tables[0].name == "test_p1_mht_1of1"   # pylint: disable=protected-access
        # the batch's rows live with the ids (the worker), not in the enclosing device scope
        assert t1.device.endswith("CPU:1")


def test_update_op_writes_the_rows_held_back():
    with tf.Graph().as_default():
        var = de.get_variable("t300", devices=CPUS[:2], initializer=2.0)
        emb, wrapper = de.embedding_lookup(var, tf.constant([0, 1, 2, 3, 4], tf.int64),
                                           max_norm=1.0, return_trainable=True)
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(emb), [[1.0]] * 5)
            assert sess.run(var.size()) == 0       # a lookup never inserts
            sess.run(wrapper.update_op())
            assert sess.run([var.size(), var.size(0), var.size(1)]) == [5, 3, 2]
            np.testing.assert_array_equal(sess.run(var.lookup(tf.constant([4], tf.int64))),
                                          [[2.0]])
    bp = de.Variable(dim=1, bp_v2=True, name="bp_update_op")
    with tf.GradientTape():
        _, bp_wrapper = de.embedding_lookup(bp, tf.constant([1], tf.int64), name="l",
                                            return_trainable=True)
    with pytest.raises(ValueError, match="bp_v2 variable, needs v0"):
        bp_wrapper.update_op()


def test_a_direct_read_of_the_wrapper_sees_the_batch_rows():
    # TFRA code builds losses on the wrapper itself (loss = wrapper * wrapper): in a v1 graph
    # that read must wait for the batch's rows, or it reads an unloaded variable.
    with tf.Graph().as_default():
        var = de.get_variable("direct", dim=2, initializer=1.0)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        _, wrapper = de.embedding_lookup(var, ids, return_trainable=True, name="direct_read")
        opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        train = opt.minimize(lambda: tf.reduce_sum(wrapper * wrapper), var_list=[wrapper])
        with tf.compat.v1.Session() as sess:
            for _ in range(3):
                sess.run(train, {ids: [3, 5]})
            got = sess.run(var.lookup(tf.constant([3, 5, 9], tf.int64)))
    np.testing.assert_allclose(got, [[0.8 ** 3] * 2, [0.8 ** 3] * 2, [1.0, 1.0]], rtol=1e-6)


def test_documented_argument_names_and_wrapper_methods(kv_creator):
    """Names TFRA's API documents: accum(old_values=...), table[keys], apply_update(ids=...),
    TrainableWrapper.size / prefetch_values / read_value(do_prefetch=...)."""
    var = de.Variable(dim=2, initializer=0.0, kv_creator=kv_creator, name="documented",
                      restrict_policy=de.FrequencyRestrictPolicy)
    keys = tf.constant([1, 2], tf.int64)
    var.upsert(keys, tf.ones([2, 2]))
    old = var.lookup(keys)
    var.accum(keys, old_values=old, new_values=old + 2.0, exists=tf.constant([True, False]))
    np.testing.assert_array_equal(var.lookup(keys).numpy(), [[3, 3], [1, 1]])
    np.testing.assert_array_equal(var.tables[0][keys].numpy(), [[3, 3], [1, 1]])
    var.restrict_policy.apply_update(ids=keys)
    assert int(var.restrict_policy.status.size()) == 2

    rows, wrapper = de.embedding_lookup(var, keys, return_trainable=True)
    assert int(wrapper.size()) == 2
    var.upsert(keys, tf.fill([2, 2], 7.0))       # another writer changes the rows
    np.testing.assert_array_equal(wrapper.read_value(do_prefetch=False).numpy(), rows.numpy())
    np.testing.assert_array_equal(wrapper.held_rows().numpy(), rows.numpy())
    np.testing.assert_array_equal(wrapper.prefetch_values().numpy(), [[7, 7], [7, 7]])
    # TFRA's default: do_prefetch=True reads the table's rows again and holds them.
    np.testing.assert_array_equal(wrapper.read_value().numpy(), [[7, 7], [7, 7]])
    np.testing.assert_array_equal(wrapper.read_value(do_prefetch=False).numpy(),
                                  [[7, 7], [7, 7]])
    np.testing.assert_array_equal(wrapper.numpy(), [[7, 7], [7, 7]])


def test_variable_embedding_lookup_method_trains_like_the_function():
    var = de.get_variable("method_lookup", dim=2, initializer=1.0)
    ids = tf.constant([[4, 9], [9, 4]], tf.int64)
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))
    with tf.GradientTape() as tape:
        rows, wrapper = var.embedding_lookup(ids, name="m", return_trainable=True)
        loss = tf.reduce_sum(rows)
    assert rows.shape == (2, 2, 2) and isinstance(wrapper, de.TrainableWrapper)
    opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
    # each id twice in the batch: gradient 2 per column, so 1 - 0.5 * 2 = 0
    np.testing.assert_array_equal(var.lookup(tf.constant([4, 9], tf.int64)).numpy(),
                                  np.zeros([2, 2]))
    np.testing.assert_array_equal(var.embedding_lookup(tf.constant([4], tf.int64)).numpy(),
                                  [[0, 0]])


def test_save_model_takes_tfras_save_format(tmp_path):
    inputs = tf.keras.Input(shape=(2,), dtype=tf.int64)
    model = tf.keras.Model(inputs, de.keras.layers.Embedding(2, pooling="sum", initializer=1.0,
                                                             name="sf")(inputs))
    de.keras.models.save_model(model, str(tmp_path / "m"), save_format="tf")
    assert (tmp_path / "m" / "saved_model.pb").exists()
    with pytest.raises(ValueError, match="save_format.*'h5'"):
        de.keras.models.save_model(model, str(tmp_path / "h"), save_format="h5")
    assert not (tmp_path / "h").exists()


def test_trainable_wrapper_filter_splits_wrappers_from_other_variables():
    var = de.Variable(dim=2, name="filtered")
    _, wrapper = de.embedding_lookup(var, tf.constant([1], tf.int64), return_trainable=True)
    dense = tf.Variable([1.0])
    others, wrappers = de.trainable_wrapper_filter([dense, wrapper, 3])
    assert others == (dense, 3) and wrappers == (wrapper,)
    assert de.trainable_wrapper_filter([dense, 3], lambda x: x == 3) == ((dense,), (3,))


def test_tfras_platform_checks_import_as_its_tests_do():
    import platform
    from tensorflow_recommenders_addons.utils.check_platform import (
        is_arm64, is_linux, is_macos, is_raspi_arm, is_windows)
    system, machine = platform.system(), platform.machine()
    assert (is_linux(), is_macos(), is_windows()) == (
        system == "Linux", system == "Darwin", system == "Windows")
    assert (is_arm64(), is_raspi_arm()) == (machine == "arm64", machine == "armv7l")
    assert sum((is_linux(), is_macos(), is_windows())) <= 1


def test_unknown_rank_shapes_list_as_empty_as_tfras_import_patches_them():
    """TFRA's import patches `TensorShape.as_list` (its `tf_patch_test`); importing this
    package's alias does the same, and `de.patch_on_tf()` may be called again."""
    from tensorflow.python.framework.tensor_shape import TensorShape
    de.patch_on_tf()
    assert TensorShape(None).as_list() == []
    assert tf.TensorShape([2, None]).as_list() == [2, None]
    assert tf.TensorShape([]).as_list() == []

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def rank_free(x):
        assert x.shape.as_list() == []   # unknown rank while tracing
        return tf.reduce_sum(x)

    assert float(rank_free(tf.ones([2, 3]))) == 6.0


def test_tfras_module_paths_import_as_its_tests_and_users_write_them():
    """`tensorflow_recommenders_addons.dynamic_embedding.python.*` (TFRA's source layout)
    resolves to this package's objects; names and modules TFRA does not have do not import."""
    from tensorflow_recommenders_addons.dynamic_embedding.python.keras.callbacks import \
        DEHvdBroadcastGlobalVariablesCallback
    from tensorflow_recommenders_addons.dynamic_embedding.python.ops import data_flow_ops
    from tensorflow_recommenders_addons.dynamic_embedding.python.ops import math_ops as de_math
    from tensorflow_recommenders_addons.dynamic_embedding.python.ops.dynamic_embedding_variable \
        import Variable, get_variable
    from tensorflow_recommenders_addons.dynamic_embedding.python.ops.ragged_embedding_ops \
        import embedding_lookup_sparse, safe_embedding_lookup_sparse
    from tensorflow_recommenders_addons.dynamic_embedding.python.ops.dynamic_embedding_creator \
        import CuckooHashTableCreator, FileSystemSaver, KVCreator
    from tensorflow_recommenders_addons.dynamic_embedding.python.ops.embedding_weights import \
        TrainableWrapper
    import tensorflow_recommenders_addons.dynamic_embedding.python.ops.data_flow_grad  # noqa: F401
    from tensorflow_recommenders_addons.dynamic_embedding.python.keras import layers

    assert DEHvdBroadcastGlobalVariablesCallback is (
        de.keras.callbacks.DEHvdBroadcastGlobalVariablesCallback)
    assert (Variable, get_variable, TrainableWrapper) == (de.Variable, de.get_variable,
                                                          de.TrainableWrapper)
    assert (embedding_lookup_sparse, safe_embedding_lookup_sparse) == (
        de.embedding_lookup_sparse, de.safe_embedding_lookup_sparse)
    assert (CuckooHashTableCreator, FileSystemSaver, KVCreator) == (
        de.CuckooHashTableCreator, de.FileSystemSaver, de.KVCreator)
    assert layers.Embedding is de.keras.layers.Embedding
    parts = data_flow_ops.dynamic_partition(tf.constant([5, 6, 7]), tf.constant([1, 0, 1]), 2)
    assert [p.numpy().tolist() for p in parts] == [[6], [5, 7]]
    np.testing.assert_array_equal(
        de_math.sparse_segment_sum(tf.ones([3, 2]), tf.constant([0, 1, 2]),
                                   tf.constant([0, 0, 1])).numpy(), [[2, 2], [1, 1]])
    with pytest.raises(ImportError):
        import tensorflow_recommenders_addons.dynamic_embedding.python.ops.no_such_module  # noqa: F401
    with pytest.raises(ImportError, match="HvdVariable"):
        from tensorflow_recommenders_addons.dynamic_embedding.python.ops.shadow_embedding_ops \
            import HvdVariable  # noqa: F401


def test_tfras_documented_layer_module_path_holds_the_layers():
    """TFRA documents `de.keras.layers.embedding.reduce_pooling` and the layers under
    `de.keras.layers.embedding`; they are the same objects as `de.keras.layers`'."""
    module = de.keras.layers.embedding
    for name in ("Embedding", "BasicEmbedding", "SquashedEmbedding", "FieldWiseEmbedding",
                 "HvdAllToAllEmbedding", "reduce_pooling"):
        assert getattr(module, name) is getattr(de.keras.layers, name)
    rows = tf.reshape(tf.range(24, dtype=tf.float32), [3, 2, 4])
    np.testing.assert_array_equal(module.reduce_pooling(rows, "mean").numpy(),
                                  rows.numpy().mean(axis=1))
    np.testing.assert_array_equal(module.reduce_pooling(rows[0]).numpy(), rows.numpy()[0].sum(0))
    with pytest.raises(ValueError, match="rank"):
        module.reduce_pooling(tf.ones([4]))
