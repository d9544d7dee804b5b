"""de.shadow_ops.ShadowVariable trains exactly as de.embedding_lookup's TrainableWrapper does;
de.train.DECheckpoint round trips modules holding them."""

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS
from tfra_dynamic_embedding import tables

DIM = 3
INIT_IDS = np.arange(6, dtype=np.int64)
INIT_ROWS = np.linspace(-1.0, 1.0, 6 * DIM, dtype=np.float32).reshape(6, DIM)
COEF = np.array([[0.5], [-1.0], [2.0]], np.float32)
# 2-D batches with repeated ids, held ids (0..5) and new ones (6..11): all but 4 get trained.
BATCHES = [np.array([[0, 7], [7, 3]]), np.array([[11, 2], [2, 2]]), np.array([[5, 6], [8, 9]]),
           np.array([[7, 7], [10, 1]])]
OPTIMIZERS = {"sgd": lambda: tf.keras.optimizers.SGD(0.1),
              "adam": lambda: tf.keras.optimizers.Adam(0.1)}


def _table(name, bp_v2=False, devices=None, kv_creator=None):
    w = de.get_variable(name, dim=DIM, initializer=0.25, devices=devices or CPUS[:2],
                        bp_v2=bp_v2, kv_creator=kv_creator)
    upsert = w.upsert(tf.constant(INIT_IDS), tf.constant(INIT_ROWS))
    if not tf.executing_eagerly():
        tf.compat.v1.get_default_session().run(upsert)
    return w


def _loss(emb, ids):
    y = tf.cast(ids % 3, tf.float32)[..., None] - 1.0
    return tf.reduce_sum((tf.linalg.matmul(emb, COEF) - y) ** 2)


def _export(w):
    keys, values = (t.numpy() for t in w.export())
    order = np.argsort(keys)
    return keys[order], values[order]


def _train(path, optimizer, use_function, bp_v2=False, kv_creator=None):
    """Trains a fresh table over BATCHES through a ShadowVariable ("shadow") or through
    de.embedding_lookup(return_trainable=True) ("wrapper"); returns the table and its slots."""
    w = _table(f"{path}_{optimizer}_{use_function}_{bp_v2}", bp_v2, kv_creator=kv_creator)
    opt = de.DynamicEmbeddingOptimizer(OPTIMIZERS[optimizer]())
    shadow = de.shadow_ops.ShadowVariable(w, name="shadow") if path == "shadow" else None

    def step(ids):
        with tf.GradientTape() as tape:
            if shadow is not None:
                emb, var = de.shadow_ops.embedding_lookup(shadow, ids), shadow
            else:
                emb, var = de.embedding_lookup(w, ids, name="lookup", return_trainable=True)
            loss = _loss(emb, ids)
        opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))

    step = tf.function(step) if use_function else step
    for ids in BATCHES:
        step(tf.constant(ids, tf.int64))
    return [_export(w)] + [_export(s) for s in w.get_slot_variables(opt)], shadow


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("use_function", [False, True])
def test_training_equals_trainable_wrapper(optimizer, use_function):
    got, shadow = _train("shadow", optimizer, use_function)
    want, _ = _train("wrapper", optimizer, use_function)
    assert len(got) == len(want) == (1 if optimizer == "sgd" else 3)
    for (got_keys, got_values), (want_keys, want_values) in zip(got, want):
        np.testing.assert_array_equal(got_keys, want_keys)
        np.testing.assert_array_equal(got_values, want_values)
    np.testing.assert_array_equal(got[0][0], np.arange(12))   # rows 6..11 made by training
    # The shadow holds the last batch's unique ids and their trained rows.
    np.testing.assert_array_equal(shadow.ids.numpy(), [7, 10, 1])
    np.testing.assert_array_equal(shadow.read_value(do_prefetch=False).numpy(),
                                  got[0][1][[7, 10, 1]])


@pytest.mark.parametrize("use_function", [False, True])
def test_bp_v2_training_equals_trainable_wrapper(use_function):
    got, _ = _train("shadow", "adam", use_function, bp_v2=True)
    want, _ = _train("wrapper", "adam", use_function, bp_v2=True)
    assert len(got) == 3
    for (got_keys, got_values), (want_keys, want_values) in zip(got, want):
        np.testing.assert_array_equal(got_keys, want_keys)
        np.testing.assert_array_equal(got_values, want_values)


def _train_graph(path, optimizer):
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as sess:
        w = _table("graph_" + path)
        ids = tf.compat.v1.placeholder(tf.int64, [2, 2])
        if path == "shadow":
            shadow = de.shadow_ops.ShadowVariable(w)
            emb = de.shadow_ops.embedding_lookup(shadow, ids)
        else:
            emb = de.embedding_lookup(w, ids, name="lookup")
        opt = de.DynamicEmbeddingOptimizer(
            {"sgd": tf.compat.v1.train.GradientDescentOptimizer(0.1),
             "adam": tf.compat.v1.train.AdamOptimizer(0.1)}[optimizer])
        train = opt.minimize(_loss(emb, ids))
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch in BATCHES:
            sess.run(train, {ids: batch})
        keys, values = sess.run(w.export())
        slots = [sess.run(s.export()) for s in w.get_slot_variables(opt)]
    return [(keys, values)] + slots


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_tf1_graph_training_equals_trainable_wrapper(optimizer):
    got = _train_graph("shadow", optimizer)
    want = _train_graph("wrapper", optimizer)
    assert len(got) == len(want) == (1 if optimizer == "sgd" else 3)
    trained = np.setdiff1d(np.arange(12), [4])
    for i, ((got_keys, got_values), (want_keys, want_values)) in enumerate(zip(got, want)):
        order, want_order = np.argsort(got_keys), np.argsort(want_keys)
        # The variable holds every key; its slots the trained ones (as TFRA's slot tables).
        np.testing.assert_array_equal(got_keys[order], np.arange(12) if i == 0 else trained)
        np.testing.assert_array_equal(got_keys[order], want_keys[want_order])
        np.testing.assert_array_equal(got_values[order], want_values[want_order])


def test_two_lookups_in_one_step_equal_trainable_wrapper():
    """A shadow looked up twice in one tf.function step gets both lookups' gradients."""
    results = []
    for path in ("shadow", "wrapper"):
        w = _table("twice_" + path)
        opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))
        shadow = de.shadow_ops.ShadowVariable(w) if path == "shadow" else None

        @tf.function
        def step(a, b):
            with tf.GradientTape() as tape:
                if shadow is not None:
                    ea = de.shadow_ops.embedding_lookup(shadow, a)
                    eb = de.shadow_ops.embedding_lookup(shadow, b)
                    var = shadow
                else:
                    ea, var = de.embedding_lookup(w, a, name="lk", return_trainable=True)
                    eb, _ = de.embedding_lookup(w, b, name="lk", return_trainable=True)
                loss = _loss(ea, a) + 3.0 * _loss(eb, b)
            opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))

        step(tf.constant([1, 8], tf.int64), tf.constant([8, 2, 9], tf.int64))
        results.append(_export(w))
    np.testing.assert_array_equal(results[0][0], [0, 1, 2, 3, 4, 5, 8, 9])
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_lookup_loads_rows_and_inserts_nothing():
    w = _table("lookup")
    shadow = de.shadow_ops.ShadowVariable(w, name="s")
    assert shadow.read_value().shape == (0, DIM)
    assert w.trainable_store["s"] is shadow and w.get_trainable_by_name("s") is shadow
    ids = tf.constant([[2, 40], [40, 5]], tf.int64)
    with tf.GradientTape():   # a forward pass under a tape inserts nothing either
        emb = de.shadow_ops.embedding_lookup(shadow, ids)
    init = np.full([DIM], 0.25, np.float32)
    np.testing.assert_array_equal(emb.numpy(), [[INIT_ROWS[2], init], [init, INIT_ROWS[5]]])
    assert int(w.size()) == 6 and int(shadow.size()) == 6
    np.testing.assert_array_equal(shadow.ids.numpy(), [2, 40, 5])
    np.testing.assert_array_equal(shadow.read_value().numpy(), [INIT_ROWS[2], init, INIT_ROWS[5]])
    # Inference mode reads the table and leaves the shadow as it was.
    de.enable_inference_mode()
    try:
        emb = de.shadow_ops.embedding_lookup(shadow, tf.constant([1], tf.int64))
    finally:
        de.enable_train_mode()
    np.testing.assert_array_equal(emb.numpy(), [INIT_ROWS[1]])
    np.testing.assert_array_equal(shadow.ids.numpy(), [2, 40, 5])


def test_read_value_prefetch_and_reset_ids():
    w = _table("read")
    shadow = de.shadow_ops.ShadowVariable(w)
    shadow._reset_ids(tf.constant([3, 4], tf.int64))
    assert shadow.read_value(do_prefetch=False).shape == (0, DIM)
    np.testing.assert_array_equal(shadow.read_value(do_prefetch=True).numpy(), INIT_ROWS[3:5])
    w.upsert(tf.constant([3], tf.int64), tf.constant([[9.0, 9.0, 9.0]]))
    np.testing.assert_array_equal(shadow.read_value(do_prefetch=False).numpy(), INIT_ROWS[3:5])
    np.testing.assert_array_equal(shadow.read_value(do_prefetch=True).numpy(),
                                  [[9.0, 9.0, 9.0], INIT_ROWS[4]])


def test_embedding_lookup_unique_dense_and_ragged():
    w = _table("unique")
    shadow = de.shadow_ops.ShadowVariable(w)
    dense = de.shadow_ops.embedding_lookup_unique(shadow, tf.constant([[1, 2], [2, 30]],
                                                                      tf.int64), DIM, True)
    init = np.full([DIM], 0.25, np.float32)
    np.testing.assert_array_equal(dense.numpy(), [[INIT_ROWS[1], INIT_ROWS[2]],
                                                  [INIT_ROWS[2], init]])
    ragged = de.shadow_ops.embedding_lookup_unique(
        shadow, tf.ragged.constant([[4], [30, 4, 0]], tf.int64), DIM)
    assert isinstance(ragged, tf.RaggedTensor)
    np.testing.assert_array_equal(ragged.row_lengths().numpy(), [1, 3])
    np.testing.assert_array_equal(ragged.flat_values.numpy(),
                                  [INIT_ROWS[4], init, INIT_ROWS[4], INIT_ROWS[0]])
    assert int(w.size()) == 6


def test_max_norm_clips_rows():
    w = _table("norm")
    shadow = de.shadow_ops.ShadowVariable(w, max_norm=0.5)
    emb = de.shadow_ops.embedding_lookup(shadow, tf.constant([0, 0], tf.int64)).numpy()
    want = INIT_ROWS[0] * 0.5 / np.linalg.norm(INIT_ROWS[0])
    np.testing.assert_allclose(emb, [want, want], rtol=1e-6)


def test_restrict_policy_status_follows_training():
    w = de.get_variable("restrict", dim=DIM, initializer=0.0,
                        restrict_policy=de.TimestampRestrictPolicy)
    shadow = de.shadow_ops.ShadowVariable(w)
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
    for ids in ([0, 1, 2], [2, 3]):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(de.shadow_ops.embedding_lookup(shadow, tf.constant(ids, tf.int64)))
        opt.apply_gradients(zip(tape.gradient(loss, [shadow]), [shadow]))
    assert int(w.size()) == 4
    assert int(w.restrict_policy.status.size()) == 4


def test_errors_name_argument_and_value():
    w = _table("errors")
    with pytest.raises(TypeError, match="params must be a de.Variable; got ResourceVariable"):
        de.shadow_ops.ShadowVariable(tf.Variable([[1.0]]))
    with pytest.raises(TypeError, match=r"unsupported keyword arguments \['ids'\]"):
        de.shadow_ops.ShadowVariable(w, ids=tf.Variable([1], dtype=tf.int64))
    with pytest.raises(ValueError, match="max_norm must be None or a positive number; got -1"):
        de.shadow_ops.ShadowVariable(w, max_norm=-1)
    with pytest.raises(ValueError, match="distribute_strategy must be None or a "
                                         "ParameterServerStrategy; got MirroredStrategy"):
        de.shadow_ops.ShadowVariable(w, distribute_strategy=tf.distribute.MirroredStrategy(
            ["/CPU:0"]))
    shadow = de.shadow_ops.ShadowVariable(w)
    with pytest.raises(ValueError, match="ids must have dtype int64; got int32"):
        de.shadow_ops.embedding_lookup(shadow, tf.constant([1], tf.int32))
    with pytest.raises(TypeError, match="shadow must be a de.shadow_ops.ShadowVariable; got "
                                        "Variable"):
        de.shadow_ops.embedding_lookup(w, tf.constant([1], tf.int64))
    with pytest.raises(ValueError, match=r"embedding_size must equal the dim of .*\(3\); got 4"):
        de.shadow_ops.embedding_lookup_unique(shadow, tf.constant([1], tf.int64), 4)


class _Module(tf.Module):
    def __init__(self, devices, kv_creator=None):
        super().__init__()
        self.params = de.get_variable("ckpt_emb", dim=DIM, initializer=0.0, devices=devices,
                                      kv_creator=kv_creator)
        self.shadow = de.shadow_ops.ShadowVariable(self.params)

    def __call__(self, ids):
        return de.shadow_ops.embedding_lookup(self.shadow, ids)


def _creators():
    yield None
    if tables.native.is_available():
        yield de.CuckooHashTableCreator(saver=de.FileSystemSaver())


@pytest.mark.parametrize("file_system", [False, True])
def test_decheckpoint_round_trip_over_other_shard_counts(tmp_path, file_system):
    if file_system and not tables.native.is_available():
        pytest.skip("native op library not built (run `make ops`)")

    def creator():
        return de.CuckooHashTableCreator(saver=de.FileSystemSaver()) if file_system else None

    module = _Module(CPUS[:2], creator())
    ids = tf.constant(np.arange(10), tf.int64)
    rows = tf.constant(np.arange(30, dtype=np.float32).reshape(10, DIM))
    module.params.upsert(ids, rows)
    np.testing.assert_array_equal(module(ids).numpy(), rows.numpy())
    path = de.train.DECheckpoint(module).save(str(tmp_path / "model"))
    assert isinstance(de.train.DECheckpoint(module), tf.train.Checkpoint)
    # Saving empties the shadow (its rows are a cache of the table).
    assert module.shadow.read_value().shape == (0, DIM)
    assert module.shadow.ids.numpy().shape == (0,)
    assert (tmp_path / "TFRADynamicEmbedding").is_dir() == file_system
    for shards in (CPUS[:3], CPUS[:1]):
        tf.compat.v1.reset_default_graph()   # a fresh de.get_variable store
        restored = _Module(shards, creator())
        de.train.DECheckpoint(restored).restore(path).assert_consumed()
        assert int(restored.params.size()) == 10
        assert restored.shadow.read_value().shape == (0, DIM)
        np.testing.assert_array_equal(restored(ids).numpy(), rows.numpy())


def test_saved_model_of_a_module_serves_lookups(tmp_path):
    class Served(tf.Module):
        def __init__(self):
            super().__init__()
            self.params = _table("served")
            self.shadow = de.shadow_ops.ShadowVariable(self.params)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
        def __call__(self, ids):
            return de.shadow_ops.embedding_lookup(self.shadow, ids)

    module = Served()
    module(tf.constant([1, 2], tf.int64))
    tf.saved_model.save(module, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    init = np.full([DIM], 0.25, np.float32)
    np.testing.assert_array_equal(loaded(tf.constant([4, 70, 0], tf.int64)).numpy(),
                                  [INIT_ROWS[4], init, INIT_ROWS[0]])
    assert int(module.params.size()) == 6


def test_safe_lookup_sparse_through_a_shadow_trains_like_the_wrapper():
    """de.safe_embedding_lookup_sparse(shadow, ...) trains the shadow as the wrapper trains."""
    results = []
    for path in ("shadow", "wrapper"):
        w = _table("sparse_" + path)
        opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
        shadow = de.shadow_ops.ShadowVariable(w) if path == "shadow" else None
        sp = tf.sparse.from_dense(tf.constant([[1, 0, 7], [7, 7, 0]], tf.int64))
        with tf.GradientTape() as tape:
            if shadow is not None:
                emb, var = de.safe_embedding_lookup_sparse(shadow, sp), shadow
            else:
                emb, var = de.safe_embedding_lookup_sparse(w, sp, name="s", return_trainable=True)
            loss = tf.reduce_sum(tf.linalg.matmul(emb, COEF) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
        results.append(_export(w))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_array_equal(results[0][0], [0, 1, 2, 3, 4, 5, 7])
