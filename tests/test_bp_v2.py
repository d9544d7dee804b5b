"""bp_v2: training adds row updates (accum) instead of overwriting rows."""

import threading

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tfra_dynamic_embedding.tables import native


def _two_workers_step(var, use_function, bp_v2=None, in_tables=False):
    """Two lookup sites read the same rows before either writes back (like two asynchronous
    workers); worker b's loss is twice worker a's, SGD(1.0): a moves rows by -1, b by -2.
    `bp_v2`: the optimizers' setting (None: the variable's); `in_tables`: the update applied
    in the tables (else on the trainer, written back)."""
    opt_a = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1.0), bp_v2=bp_v2,
                                         apply_in_tables=in_tables)
    opt_b = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1.0), bp_v2=bp_v2,
                                         apply_in_tables=in_tables)

    def step(ids):
        with tf.GradientTape(persistent=True) as tape:
            rows_a, wrapper_a = de.embedding_lookup(var, ids, name="worker_a",
                                                    return_trainable=True)
            rows_b, wrapper_b = de.embedding_lookup(var, ids, name="worker_b",
                                                    return_trainable=True)
            loss_a, loss_b = tf.reduce_sum(rows_a), tf.reduce_sum(2.0 * rows_b)
        grad_a, grad_b = tape.gradient(loss_a, wrapper_a), tape.gradient(loss_b, wrapper_b)
        opt_a.apply_gradients([(grad_a, wrapper_a)])
        opt_b.apply_gradients([(grad_b, wrapper_b)])

    (tf.function(step) if use_function else step)(tf.constant([1, 2], tf.int64))
    return var.lookup(tf.constant([1, 2], tf.int64)).numpy()


@pytest.mark.parametrize("use_function", [False, True])
def test_concurrent_updates_add_up_with_bp_v2_and_overwrite_without(use_function):
    start = np.array([[1.0, 1.0], [2.0, 2.0]], np.float32)
    for bp_v2, expected in ((True, start - 3.0), (False, start - 2.0)):
        var = de.Variable(dim=2, bp_v2=bp_v2, name=f"bp_{bp_v2}_{use_function}")
        assert var.bp_v2 is bp_v2
        var.upsert(tf.constant([1, 2], tf.int64), start)
        np.testing.assert_allclose(_two_workers_step(var, use_function), expected)
    for var_bp_v2, opt_bp_v2, expected in ((False, True, start - 3.0), (True, False, start - 2.0)):
        var = de.Variable(dim=2, bp_v2=var_bp_v2, name=f"bp_opt_{opt_bp_v2}_{use_function}")
        var.upsert(tf.constant([1, 2], tf.int64), start)
        np.testing.assert_allclose(_two_workers_step(var, use_function, opt_bp_v2), expected)


@pytest.mark.parametrize("use_function", [False, True])
@pytest.mark.parametrize("bp_v2", [False, True])
def test_updates_applied_in_tables_add_up_with_or_without_bp_v2(use_function, bp_v2):
    start = np.array([[1.0, 1.0], [2.0, 2.0]], np.float32)
    var = de.Variable(dim=2, bp_v2=bp_v2, name=f"in_tables_{bp_v2}_{use_function}")
    var.upsert(tf.constant([1, 2], tf.int64), start)
    np.testing.assert_allclose(_two_workers_step(var, use_function, in_tables=True), start - 3.0)


def test_new_ids_get_the_trained_rows_with_bp_v2():
    var = de.Variable(dim=2, initializer=0.5, bp_v2=True, name="bp_new")
    ref = de.Variable(dim=2, initializer=0.5, name="bp_ref")
    for table in (var, ref):
        opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
        for _ in range(3):
            with tf.GradientTape() as tape:
                rows, wrapper = de.embedding_lookup(table, tf.constant([7, 8, 7], tf.int64),
                                                    return_trainable=True)
                loss = tf.reduce_sum(rows ** 2)
            opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
    keys = tf.constant([7, 8], tf.int64)
    np.testing.assert_allclose(var.lookup(keys).numpy(), ref.lookup(keys).numpy(), rtol=1e-6)
    assert not np.allclose(var.lookup(keys).numpy(), 0.5)
    with pytest.raises(ValueError, match="bp_v2 must be a bool"):
        de.Variable(dim=2, bp_v2="yes")
    assert de.get_variable("bp_get", dim=2, bp_v2=True).bp_v2
    with pytest.raises(ValueError, match="synchronous must be a bool"):
        de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(), synchronous="yes")
    with pytest.raises(ValueError, match="bp_v2 must be None or a bool"):
        de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(), bp_v2="on")


def test_bp_v2_in_a_tf_compat_v1_graph():
    with tf.Graph().as_default():
        var = de.get_variable("bp_graph", dim=2, bp_v2=True, initializer=1.0)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(de.embedding_lookup(var, ids))
        train = de.DynamicEmbeddingOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.5)).minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch in ([1, 2], [2], [1, 2, 3]):
                sess.run(train, {ids: batch})
            got = sess.run(var.lookup(tf.constant([1, 2, 3], tf.int64)))
    # id 1: trained twice, id 2 three times, id 3 once; each step moves a row by -0.5
    np.testing.assert_allclose(got, [[0.0, 0.0], [-0.5, -0.5], [0.5, 0.5]])


@pytest.mark.parametrize("backend", ["builtin", "native"])
def test_threads_writing_back_at_once_add_up_exactly(backend):
    """Writers in threads (as workers of a parameter-server job) train rows that are already
    non-zero, with many shared ids: every step's change counts once. The built-in table's
    presence check is one find (a marker default); its old two-find check, racing another
    writer's accum, took a present row for absent and added the whole row."""
    if backend == "native" and not native.is_available():
        pytest.skip("native op library not built")
    kv = de.BuiltinKVCreator() if backend == "builtin" else de.NativeKVCreator()
    var = de.Variable(dim=4, bp_v2=True, kv_creator=kv, name=f"threads_{backend}")
    ids = np.arange(8, dtype=np.int64)
    start = np.tile(np.arange(1, 9, dtype=np.float32)[:, None] * 10.0, [1, 4])
    var.upsert(ids, start)
    def make_step(writer):
        # One lookup site (its own wrapper, i.e. rows buffer) and optimizer per writer, as each
        # worker has.
        opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1.0))

        @tf.function
        def step(batch):
            with tf.GradientTape() as tape:
                rows, wrapper = de.embedding_lookup(var, batch, name=f"writer_{writer}",
                                                    return_trainable=True)
                loss = tf.reduce_sum(rows)
            opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
        return step

    batches = [np.random.default_rng(i).integers(0, 8, 16).astype(np.int64) for i in range(160)]
    steps = [make_step(i) for i in range(4)]
    for i, step in enumerate(steps):      # traced before the threads start
        step(tf.constant(batches[i]))
    errors = []

    def run(step, part):
        try:
            for batch in part:
                step(tf.constant(batch))
        except Exception as error:  # pylint: disable=broad-except  (reported below)
            errors.append(error)

    threads = [threading.Thread(target=run, args=(steps[i], batches[4 + i::4]))
               for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    counts = np.bincount(np.concatenate(batches), minlength=8).astype(np.float32)
    np.testing.assert_array_equal(var.lookup(ids).numpy(), start - counts[:, None])


def test_native_slots_of_a_bp_v2_variable_are_written_after_its_rows():
    """In a tf.function the rows' write-back and the slots' (other resources of the same native
    records) are not ordered by TF itself: a slot written first created a new key's record and
    the row's write-back then added its change to a blank row. Runs must equal eager's."""
    def train(use_function):
        var = de.Variable(dim=2, name="bp_v2_slots", bp_v2=True, kv_creator=de.NativeKVCreator(),
                          initializer=0.25, devices=["/CPU:0", "/CPU:1"])
        opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))

        def step(ids):
            with tf.GradientTape() as tape:
                rows, wrapper = de.embedding_lookup(var, ids, return_trainable=True)
                loss = tf.reduce_sum(rows * rows)
            opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])

        run = tf.function(step) if use_function else step
        for start in range(0, 60, 6):   # new ids every step, and some seen before
            run(tf.constant(list(range(start, start + 6)) + [0, 1], tf.int64))
        keys, values = var.export()
        return dict(zip(keys.numpy().tolist(), values.numpy().tolist()))

    expected = train(use_function=False)
    for _ in range(4):
        assert train(use_function=True) == expected
