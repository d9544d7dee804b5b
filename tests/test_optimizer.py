"""Training de embeddings with every optimizer family equals training a dense embedding."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS

DIM = 4
V1 = {
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.3),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.1),
    "rmsprop": lambda: tf.compat.v1.train.RMSPropOptimizer(0.05, momentum=0.5, centered=True),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01),
    "proximal_adagrad": lambda: tf.compat.v1.train.ProximalAdagradOptimizer(0.1),
}
KERAS3 = {
    "sgd": lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: tf.keras.optimizers.Adam(0.1),
    "adamw": lambda: tf.keras.optimizers.AdamW(0.1, weight_decay=0.05),
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.3),
    "rmsprop": lambda: tf.keras.optimizers.RMSprop(0.05, momentum=0.5, centered=True),
    "ftrl": lambda: tf.keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01),
    "adamax": lambda: tf.keras.optimizers.Adamax(0.1),
    "nadam": lambda: tf.keras.optimizers.Nadam(0.1),
    "lion": lambda: tf.keras.optimizers.Lion(0.01),
}
TF_KERAS = {
    "legacy_sgd": lambda: tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9),
    "legacy_adam": lambda: tf_keras.optimizers.legacy.Adam(0.1),
    "legacy_adagrad": lambda: tf_keras.optimizers.legacy.Adagrad(0.1),
    "legacy_rmsprop": lambda: tf_keras.optimizers.legacy.RMSprop(0.05),
    "legacy_ftrl": lambda: tf_keras.optimizers.legacy.Ftrl(0.1),
    "sgd": lambda: tf_keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: tf_keras.optimizers.Adam(0.1),
    "adagrad": lambda: tf_keras.optimizers.Adagrad(0.1),
    "rmsprop": lambda: tf_keras.optimizers.RMSprop(0.05),
    "ftrl": lambda: tf_keras.optimizers.Ftrl(0.1),
}
# Optimizers whose update of a row with zero gradient is a no-op: lazy == dense on any batches.
ROW_LOCAL = {("v1", "sgd"), ("v1", "adagrad"), ("v1", "ftrl"), ("v1", "proximal_adagrad"),
             ("keras3", "adagrad"), ("tf_keras", "legacy_adagrad")}
FAMILIES = {"v1": V1, "keras3": KERAS3, "tf_keras": TF_KERAS}
ALL = [(f, n) for f, table in FAMILIES.items() for n in table]


def _same_set_batches(rng, steps, vocab=10):
    """Every batch holds all ids 0..vocab-1 plus repeats, shuffled: lazy and dense agree."""
    return [rng.permutation(np.concatenate([np.arange(vocab), rng.integers(0, vocab, 6)]))
            for _ in range(steps)]


def _dedup(grad):
    """The dense path's gradient: repeated indices summed (tf.compat.v1 does this itself)."""
    unique, index = tf.unique(grad.indices)
    return tf.IndexedSlices(tf.math.unsorted_segment_sum(grad.values, index, tf.size(unique)),
                            unique, grad.dense_shape)


class _Pair:
    """A de model and its dense twin: embedding -> dot with a dense weight -> squared error."""

    def __init__(self, family, name, vocab, init=0.1, devices=None, kv_creator=None):
        self.family = family
        self.emb = de.Variable(dim=DIM, devices=devices or CPUS[:2], initializer=init,
                               kv_creator=kv_creator)
        self.dense = tf.Variable(tf.fill([vocab, DIM], init))
        self.w = tf.Variable(tf.linspace(0.5, 1.0, DIM)[:, None])
        self.w_ref = tf.Variable(self.w)
        self.opt = de.DynamicEmbeddingOptimizer(FAMILIES[family][name]())
        self.opt_ref = FAMILIES[family][name]()

    def step(self, ids):
        ids = tf.constant(ids, tf.int64)
        y = tf.cast(ids % 3, tf.float32)[:, None] - 1.0
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(self.emb, ids, return_trainable=True)
            loss = tf.reduce_mean((rows @ self.w - y) ** 2)
        grads = tape.gradient(loss, [wrapper, self.w])
        self.opt.apply_gradients(zip(grads, [wrapper, self.w]))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.nn.embedding_lookup(self.dense, ids) @ self.w_ref - y) ** 2)
        grads = tape.gradient(loss, [self.dense, self.w_ref])
        if self.family != "v1":
            grads[0] = _dedup(grads[0])
        self.opt_ref.apply_gradients(zip(grads, [self.dense, self.w_ref]))

    def assert_equal(self, ids_seen):
        ids_seen = np.unique(ids_seen)
        got = self.emb.lookup(tf.constant(ids_seen, tf.int64)).numpy()
        want = self.dense.numpy()[ids_seen]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
        np.testing.assert_allclose(self.w.numpy(), self.w_ref.numpy(), rtol=1e-6, atol=1e-7)
        assert int(self.emb.size()) == len(ids_seen)  # only ids seen got rows
        for slot in self.opt.get_slot_variables(self.emb):
            assert int(slot.size()) == len(ids_seen)


@pytest.mark.parametrize("family, name", ALL)
def test_eager_training_equals_dense(kv_creator, family, name):
    pair = _Pair(family, name, vocab=10, kv_creator=kv_creator)
    batches = _same_set_batches(np.random.default_rng(0), steps=4)
    for ids in batches:
        pair.step(ids)
    pair.assert_equal(np.concatenate(batches))
    assert float(np.abs(pair.dense.numpy() - 0.1).max()) > 1e-3  # training moved the rows


@pytest.mark.parametrize("family, name", sorted(ROW_LOCAL))
def test_row_local_optimizers_equal_dense_on_any_batches(kv_creator, family, name):
    rng = np.random.default_rng(1)
    pair = _Pair(family, name, vocab=40, kv_creator=kv_creator)
    batches = [rng.integers(0, 40, size=12) for _ in range(5)]
    for ids in batches:
        pair.step(ids)
    pair.assert_equal(np.concatenate(batches))


def test_adam_is_lazy_rows_outside_the_batch_keep_their_values():
    pair = _Pair("keras3", "adam", vocab=10)
    pair.step([1, 2, 3])
    after_first = pair.emb.lookup(tf.constant([1], tf.int64)).numpy()
    pair.step([2, 3, 4])
    np.testing.assert_array_equal(pair.emb.lookup(tf.constant([1], tf.int64)).numpy(),
                                  after_first)
    # Keras 3's dense Adam keeps moving row 1 with its momentum; the de optimizer does not.
    assert not np.allclose(pair.dense.numpy()[1], after_first[0])


@pytest.mark.parametrize("name", sorted(V1))
def test_v1_graph_minimize_equals_dense(kv_creator, name):
    batches = _same_set_batches(np.random.default_rng(2), steps=3)
    with tf.Graph().as_default():
        emb = de.get_variable("emb", dim=DIM, devices=CPUS[:2], initializer=0.1,
                              kv_creator=kv_creator)
        dense = tf.compat.v1.get_variable("dense", initializer=tf.fill([10, DIM], 0.1))
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        y = tf.cast(ids % 3, tf.float32)[:, None] - 1.0
        w = tf.compat.v1.get_variable("w", initializer=tf.linspace(0.5, 1.0, DIM)[:, None])
        w_ref = tf.compat.v1.get_variable("w_ref", initializer=tf.linspace(0.5, 1.0, DIM)[:, None])
        loss = tf.reduce_mean((de.embedding_lookup(emb, ids) @ w - y) ** 2)
        loss_ref = tf.reduce_mean((tf.nn.embedding_lookup(dense, ids) @ w_ref - y) ** 2)
        opt = de.DynamicEmbeddingOptimizer(V1[name]())
        train = opt.minimize(loss)
        train_ref = V1[name]().minimize(loss_ref, var_list=[dense, w_ref])
        lookup = emb.lookup(tf.range(10, dtype=tf.int64))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch in batches:
                sess.run(train, {ids: batch})
                sess.run(train_ref, {ids: batch})
            got, want = sess.run([lookup, dense])
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(*sess.run([w, w_ref]), rtol=1e-6)
            assert sess.run(emb.size()) == 10


def test_only_the_optimizer_creates_rows():
    emb = de.Variable(dim=DIM, initializer=tf.random_normal_initializer())
    ids = tf.constant([5, 6, 5], tf.int64)
    with tf.GradientTape() as tape:
        rows, wrapper = de.embedding_lookup(emb, ids, return_trainable=True)
        loss = tf.reduce_sum(rows)
    grad = tape.gradient(loss, wrapper)
    assert isinstance(wrapper, de.TrainableWrapper)
    assert isinstance(wrapper, tf.Variable)
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_array_equal(tf.convert_to_tensor(grad).numpy(),
                                  [[2.0] * DIM, [1.0] * DIM])  # id 5 twice, id 6 once
    assert int(emb.size()) == 0  # forward + backward inserted nothing
    start = wrapper.numpy().copy()
    de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1.0)).apply_gradients([(grad, wrapper)])
    assert int(emb.size()) == 2
    np.testing.assert_allclose(emb.lookup(tf.constant([5, 6], tf.int64)).numpy(),
                               start - [[2.0] * DIM, [1.0] * DIM], rtol=1e-6)


def test_tf_function_training_step(kv_creator):
    emb = de.Variable(dim=DIM, devices=CPUS[:2], initializer=0.1, kv_creator=kv_creator)
    dense = tf.Variable(tf.fill([10, DIM], 0.1))
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(0.1))
    ref = tf.keras.optimizers.Adagrad(0.1)

    @tf.function(reduce_retracing=True)
    def step(ids):
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(emb, ids, return_trainable=True)
            loss = tf.reduce_sum(rows ** 2)
        opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(dense, ids) ** 2)
        ref.apply_gradients([(_dedup(tape.gradient(loss, dense)), dense)])

    rng = np.random.default_rng(3)
    seen = []
    for n in [3, 5, 8, 4, 7, 6, 9]:
        batch = rng.integers(0, 10, size=n)
        seen.extend(batch)
        step(tf.constant(batch, tf.int64))
    seen = np.unique(seen)
    want = dense.numpy()[seen]
    np.testing.assert_allclose(emb.lookup(tf.constant(seen, tf.int64)).numpy(), want,
                               rtol=1e-6, atol=1e-6 * np.abs(want).max())
    assert int(emb.size()) == len(seen)
    # First call traces twice (it creates the slot variables), then one relaxed-shape trace.
    assert step.experimental_get_tracing_count() <= 3


def test_unsupported_optimizer_is_named():
    with pytest.raises(TypeError, match="DynamicEmbeddingOptimizer needs"):
        de.DynamicEmbeddingOptimizer(object())


def test_a_gradient_of_another_dtype_is_refused_before_tfs_kernels_abort():
    # tf.compat.v1's kernels CHECK-fail (abort the process) on a float64 gradient of float32
    # rows: the step refuses it first, naming the wrapper, and writes nothing.
    w = de.Variable(dim=2, initializer=1.0, name="grad_dtype")
    opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    _, wrapper = de.embedding_lookup(w, tf.constant([1, 3], tf.int64), return_trainable=True)
    with pytest.raises(TypeError, match="gradient of .*grad_dtype.* must be float32 like its "
                                        "rows; got float64"):
        opt.apply_gradients([(tf.ones([2, 2], tf.float64), wrapper)])
    assert int(w.size()) == 0
    opt.apply_gradients([(tf.ones([2, 2]), wrapper)])
    np.testing.assert_allclose(w.lookup(tf.constant([1, 3], tf.int64)).numpy(), [[0.9] * 2] * 2)


def test_eager_steps_reuse_one_wrapper_and_buffers():
    """Steps must not accumulate variables, wrappers or buffers (no per-step leak)."""
    pair = _Pair("keras3", "adam", vocab=40)
    rng = np.random.default_rng(4)
    pair.step(rng.integers(0, 40, size=8))
    store = pair.emb._trainable_store  # pylint: disable=protected-access
    buffers = {k: list(v) for k, v in pair.opt._de_buffers.items()}  # pylint: disable=protected-access
    n_opt_vars = len(pair.opt.variables)
    for _ in range(20):
        pair.step(rng.integers(0, 40, size=rng.integers(1, 12)))
    assert len(store) == 1
    assert {k: list(v) for k, v in pair.opt._de_buffers.items()} == buffers  # pylint: disable=protected-access
    assert len(pair.opt.variables) == n_opt_vars


def test_v1_graph_training_adds_no_nodes_per_step():
    with tf.Graph().as_default() as graph:
        emb = de.get_variable("emb", dim=DIM, devices=CPUS[:2], initializer=0.1)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(de.embedding_lookup(emb, ids) ** 2)
        train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(
            loss)
        size = emb.size()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            graph.finalize()  # any op added from here on raises
            for n in [3, 7, 2, 9]:
                sess.run(train, {ids: np.arange(n)})
            assert sess.run(size) == 9


def test_inference_mode_builds_plain_table_reads_in_graphs():
    with tf.Graph().as_default():
        emb = de.get_variable("emb", dim=DIM, initializer=0.5)
        ids = tf.constant([1, 2], tf.int64)
        assert de.get_model_mode() == de.ModelMode.TRAIN
        de.embedding_lookup(emb, ids)
        assert len(emb._trainable_store) == 1  # pylint: disable=protected-access
        de.enable_inference_mode()
        try:
            assert de.get_model_mode() == de.ModelMode.INFERENCE
            assert de.ModelMode.CURRENT_SETTING == de.ModelMode.INFERENCE   # TFRA reads this
            rows = de.embedding_lookup(emb, ids)
            assert len(emb._trainable_store) == 1  # no new wrapper  # pylint: disable=protected-access
        finally:
            de.enable_train_mode()
        assert de.ModelMode.CURRENT_SETTING == de.ModelMode.TRAIN
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(rows), np.full([2, DIM], 0.5))


def test_variable_lists_its_slot_variables():
    pair = _Pair("keras3", "adam", vocab=10)
    pair.step([1, 2])
    slots = pair.emb.get_slot_variables(pair.opt)
    assert sorted(s.name.split("/")[-1] for s in slots) == ["momentum", "velocity"]
    assert all(s.dim == DIM and s.devices == pair.emb.devices for s in slots)


class _StandInHorovod:
    """`horovod.tensorflow` as `synchronous=True` uses it: `size` ranks whose dense gradients
    are equal, so their all-reduced sum is `size` times this rank's."""

    Sum = "sum"

    def __init__(self, size):
        self._size = size
        self.reduced = []   # names of the variables whose gradients were all-reduced

    def size(self):
        return self._size

    def allreduce(self, tensor, op):
        assert op == self.Sum
        self.reduced.append(tensor.name if not tf.executing_eagerly() else tensor.shape)
        return tensor * self._size


def _synchronous_step(opt, var, dense):
    """One step of embedding `var` and dense `dense`: (rows of ids 1, 2; dense value)."""
    ids = tf.constant([1, 2, 1], tf.int64)
    with tf.GradientTape() as tape:
        rows, wrapper = de.embedding_lookup(var, ids, return_trainable=True)
        loss = tf.reduce_sum(rows * dense)
    grads = tape.gradient(loss, [wrapper, dense])
    opt.apply_gradients(zip(grads, [wrapper, dense]))
    return var.lookup(tf.constant([1, 2], tf.int64)).numpy(), dense.numpy()


@pytest.mark.parametrize("ranks", [1, 2])
def test_synchronous_sums_dense_gradients_over_horovod_ranks(monkeypatch, ranks):
    """TFRA's synchronous=True: dense gradients are summed over the ranks before the update,
    an embedding's rows get this rank's gradient alone; one rank trains as without it."""
    hvd = _StandInHorovod(ranks)
    monkeypatch.setitem(__import__("sys").modules, "horovod.tensorflow", hvd)
    results = []
    for synchronous in (True, False):
        var = de.Variable(dim=DIM, initializer=0.5, name=f"sync_{ranks}_{synchronous}")
        dense = tf.Variable(tf.fill([DIM], 2.0))
        opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1), synchronous=synchronous)
        results.append(_synchronous_step(opt, var, dense))
    (rows_sync, dense_sync), (rows_plain, dense_plain) = results
    np.testing.assert_allclose(rows_sync, rows_plain)   # rows: 0.5 - 0.1 * count(id) * 2
    np.testing.assert_allclose(rows_plain, [[0.1] * DIM, [0.3] * DIM], rtol=1e-6)
    # d loss / d dense = the sum of the three looked-up rows = 1.5 per column.
    np.testing.assert_allclose(dense_plain, [2.0 - 0.1 * 1.5] * DIM, rtol=1e-6)
    np.testing.assert_allclose(dense_sync, [2.0 - 0.1 * 1.5 * ranks] * DIM, rtol=1e-6)
    assert len(hvd.reduced) == (1 if ranks > 1 else 0)   # the dense gradient only


def test_synchronous_without_horovod_fails_at_the_step_and_changes_nothing(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "horovod.tensorflow", None)  # import fails
    var = de.Variable(dim=DIM, initializer=0.5, name="sync_no_hvd")
    dense = tf.Variable(tf.fill([DIM], 2.0))
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1), synchronous=True)
    with pytest.raises(ValueError, match=r"Horovod is not installed.*synchronous=True"):
        _synchronous_step(opt, var, dense)
    assert int(var.size()) == 0
    np.testing.assert_allclose(dense.numpy(), [2.0] * DIM)
    config = opt.get_config()
    assert config["de_synchronous"] is True
    assert type(opt).from_config(config)._de_synchronous is True
