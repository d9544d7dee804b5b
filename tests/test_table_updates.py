"""Optimizer updates applied in the tables (table_updates.py, TfraDeApplyGradients): equal to
the trainer-side path, slots never read by the trainer, one op per device, updates add up."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS
from tfra_dynamic_embedding import table_updates
from tfra_dynamic_embedding.tables import native

DIM = 4
OPTIMIZERS = {
    ("v1", "sgd"): lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    ("v1", "momentum"): lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    ("v1", "nesterov"): lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9,
                                                                     use_nesterov=True),
    ("v1", "adagrad"): lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    ("v1", "adam"): lambda: tf.compat.v1.train.AdamOptimizer(0.1),
    ("v1", "ftrl"): lambda: tf.compat.v1.train.FtrlOptimizer(
        0.1, l1_regularization_strength=0.01, l2_shrinkage_regularization_strength=0.02),
    ("v1", "rmsprop"): lambda: tf.compat.v1.train.RMSPropOptimizer(0.05, momentum=0.5),
    ("v1", "rmsprop_centered"): lambda: tf.compat.v1.train.RMSPropOptimizer(
        0.05, momentum=0.5, centered=True),
    ("keras3", "sgd"): lambda: tf.keras.optimizers.SGD(0.1),
    ("keras3", "momentum"): lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9),
    ("keras3", "nesterov"): lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    ("keras3", "adagrad"): lambda: tf.keras.optimizers.Adagrad(0.1),
    ("keras3", "adam"): lambda: tf.keras.optimizers.Adam(
        tf.keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5)),
    ("keras3", "adamw"): lambda: tf.keras.optimizers.AdamW(0.1, weight_decay=0.05),
    ("keras3", "ftrl"): lambda: tf.keras.optimizers.Ftrl(
        0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.01, beta=0.1),
    ("keras3", "rmsprop"): lambda: tf.keras.optimizers.RMSprop(0.05),
    ("keras3", "rmsprop_centered"): lambda: tf.keras.optimizers.RMSprop(
        0.05, momentum=0.5, centered=True),
    ("legacy", "sgd"): lambda: tf_keras.optimizers.legacy.SGD(0.1),
    ("legacy", "nesterov"): lambda: tf_keras.optimizers.legacy.SGD(0.1, 0.9, nesterov=True),
    ("legacy", "adagrad"): lambda: tf_keras.optimizers.legacy.Adagrad(0.1),
    ("legacy", "adam"): lambda: tf_keras.optimizers.legacy.Adam(0.1),
    ("legacy", "ftrl"): lambda: tf_keras.optimizers.legacy.Ftrl(
        0.1, l2_shrinkage_regularization_strength=0.02),
    ("legacy", "rmsprop"): lambda: tf_keras.optimizers.legacy.RMSprop(0.05),
    ("legacy", "rmsprop_momentum"): lambda: tf_keras.optimizers.legacy.RMSprop(
        0.05, momentum=0.5, centered=True),
    ("tf_keras", "momentum"): lambda: tf_keras.optimizers.SGD(0.1, momentum=0.9),
    ("tf_keras", "adam"): lambda: tf_keras.optimizers.Adam(0.1),
    ("tf_keras", "adamw"): lambda: tf_keras.optimizers.AdamW(0.1, weight_decay=0.05),
    ("tf_keras", "adagrad"): lambda: tf_keras.optimizers.Adagrad(0.1),
    ("tf_keras", "ftrl"): lambda: tf_keras.optimizers.Ftrl(0.1),
    ("tf_keras", "rmsprop"): lambda: tf_keras.optimizers.RMSprop(0.05, momentum=0.5,
                                                                 centered=True),
}
INITIALIZERS = {
    "unseeded_normal": lambda: tf.random_normal_initializer(0.0, 0.5),
    "seeded_uniform": lambda: tf.keras.initializers.RandomUniform(-0.5, 0.5, seed=3),
    "glorot": lambda: tf.keras.initializers.GlorotUniform(),   # rows sent by the trainer
}


def _batches(steps=4, vocab=12, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, 10) for _ in range(steps)]


class _Model:
    """Two embeddings (2 shards each) and a dense weight, trained by one optimizer."""

    def __init__(self, key, in_tables, init):
        self.embs = [de.Variable(dim=DIM, devices=CPUS[:2], initializer=init, name=f"e{i}")
                     for i in range(2)]
        self.w = tf.Variable(tf.linspace(0.5, 1.0, DIM)[:, None])
        self.opt = de.DynamicEmbeddingOptimizer(OPTIMIZERS[key](), apply_in_tables=in_tables)

    def step(self, ids):
        ids = tf.constant(ids, tf.int64)
        y = tf.cast(ids % 3, tf.float32)[:, None] - 1.0
        with tf.GradientTape() as tape:
            pairs = [de.embedding_lookup(e, ids + 5 * i, return_trainable=True)
                     for i, e in enumerate(self.embs)]
            rows = pairs[0][0] + 0.5 * pairs[1][0]
            loss = tf.reduce_mean((rows @ self.w - y) ** 2)
        variables = [p[1] for p in pairs] + [self.w]
        grads = tape.gradient(loss, variables)
        self.opt.apply_gradients(zip(grads, variables))

    def state(self):
        """Every table's keys -> rows, and every slot table's, sorted by key."""
        out = {}
        for emb in self.embs:
            for table in [emb] + self.opt.get_slot_variables(emb):
                keys, values = table.export()
                order = np.argsort(keys.numpy())
                slot = "" if table is emb else "/" + table.name.split("/")[-1]
                out[emb.name + slot] = (keys.numpy()[order], values.numpy()[order])
        return out


@pytest.mark.parametrize("key", sorted(OPTIMIZERS), ids="-".join)
def test_updates_in_tables_equal_the_trainer_path(key):
    runs = {}
    for in_tables in (True, False):
        tf.keras.utils.set_random_seed(7)
        model = _Model(key, in_tables, tf.keras.initializers.RandomUniform(-0.5, 0.5, seed=3))
        for ids in _batches():
            model.step(ids)
        runs[in_tables] = (model.state(), model.w.numpy())
    fused, trainer = runs[True], runs[False]
    optimizer = OPTIMIZERS[key]()
    slots = table_updates.rule_of(optimizer, type(optimizer), key[0]).slots
    assert fused[0].keys() == trainer[0].keys()
    assert len(fused[0]) == 2 * (1 + len([s for s in slots if s is not None]))
    for name, (keys, values) in trainer[0].items():
        got_keys, got_values = fused[0][name]
        np.testing.assert_array_equal(got_keys, keys, err_msg=name)
        np.testing.assert_allclose(got_values, values, rtol=2e-6,
                                   atol=1e-6 * np.abs(values).max(), err_msg=name)
    np.testing.assert_allclose(fused[1], trainer[1], rtol=2e-6)
    assert np.abs(trainer[0]["e0"][1]).max() > 0   # rows exist and were trained


@pytest.mark.parametrize("init", sorted(INITIALIZERS))
def test_new_keys_start_from_the_row_their_lookup_returned(init):
    """A key the table lacks is created by the update from the row its lookup gave the
    forward pass: drawn again from the same spec, or (custom initializers) sent."""
    emb = de.Variable(dim=DIM, devices=CPUS[:2], initializer=INITIALIZERS[init]())
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))
    ids = tf.constant([3, 4, 11], tf.int64)
    with tf.GradientTape() as tape:
        rows, wrapper = de.embedding_lookup(emb, ids, return_trainable=True)
        loss = tf.reduce_sum(rows * tf.constant([1.0, 2.0, 3.0, 4.0]))
    seen = rows.numpy()
    opt.apply_gradients(zip(tape.gradient(loss, [wrapper]), [wrapper]))
    want = seen - 0.5 * np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    np.testing.assert_allclose(emb.lookup(ids).numpy(), want, rtol=1e-6, atol=1e-7)


def _op_types(fn, *args):
    return [op.type for op in fn.get_concrete_function(*args).graph.get_operations()]


def test_one_op_per_device_and_no_slot_reads():
    embs = [de.Variable(dim=DIM, devices=CPUS[:2], initializer=0.1, name=f"t{i}")
            for i in range(3)]
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            pairs = [de.embedding_lookup(e, ids, return_trainable=True) for e in embs]
            loss = tf.add_n([tf.reduce_sum(p[0] ** 2) for p in pairs])
        wrappers = [p[1] for p in pairs]
        opt.apply_gradients(zip(tape.gradient(loss, wrappers), wrappers))

    ids = tf.constant([1, 2, 3, 4], tf.int64)
    step(ids)
    graph = step.get_concrete_function(ids).graph
    applies = [op for op in graph.get_operations() if op.type == "TfraDeApplyGradients"]
    assert sorted(op.device.split("/")[-1].upper() for op in applies) == ["DEVICE:CPU:0",
                                                                         "DEVICE:CPU:1"]
    assert all(op.get_attr("N") == 3 for op in applies)      # every table of the device
    types = {op.type for op in graph.get_operations()}
    assert not types & {"TfraDeFindGroups", "TfraDeUpsertGroups", "TfraDeInsert"}
    # Adam's slots were written in the records, for the trained keys only.
    for emb in embs:
        assert [int(s.size()) for s in opt.get_slot_variables(emb)] == [4, 4]
        m = opt.get_slot_variables(emb)[0].lookup(ids).numpy()
        assert np.all(m != 0)


def test_concurrent_updates_of_one_id_add_up():
    """Two trainers that looked up the same rows both have their updates applied (what
    bp_v2 gave, here without reading the rows again)."""
    emb = de.Variable(dim=2, initializer=1.0)
    opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.25))
    ids = tf.constant([7, 8], tf.int64)
    steps = []
    for scale in (1.0, 3.0):   # both look up before either applies
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(emb, ids, return_trainable=True,
                                                name=f"trainer{scale}")
            loss = scale * tf.reduce_sum(rows)
        steps.append((tape.gradient(loss, [wrapper]), [wrapper]))
    for grads, wrappers in steps:
        opt.apply_gradients(zip(grads, wrappers))
    np.testing.assert_allclose(emb.lookup(ids).numpy(), np.full([2, 2], 1.0 - 0.25 * 4.0))


def test_other_optimizers_and_variables_keep_the_trainer_path(monkeypatch):
    calls = []
    monkeypatch.setattr(table_updates, "apply_pending",
                        lambda pending, slots, keep: calls.append(len(pending)) or [])
    ids = tf.constant([1, 2], tf.int64)
    cases = [
        (de.Variable(dim=2, initializer=0.5), tf.keras.optimizers.Nadam(0.1)),
        (de.Variable(dim=2, initializer=0.5, kv_creator=de.BuiltinKVCreator()
                     if hasattr(de, "BuiltinKVCreator") else None),
         tf.keras.optimizers.Adam(0.1, amsgrad=True)),
    ]
    for emb, optimizer in cases:
        opt = de.DynamicEmbeddingOptimizer(optimizer)
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(emb, ids, return_trainable=True)
            loss = tf.reduce_sum(rows)
        opt.apply_gradients(zip(tape.gradient(loss, [wrapper]), [wrapper]))
        assert float(emb.lookup(ids).numpy().max()) < 0.5   # trained by the trainer's path
    assert calls == [0, 0]


def test_v1_graph_training_applies_in_tables():
    with tf.Graph().as_default():
        emb = de.get_variable("g", dim=2, devices=CPUS[:2], initializer=1.0)
        ids = tf.constant([1, 2, 3], tf.int64)
        rows = de.embedding_lookup(emb, ids)
        loss = tf.reduce_sum(rows)
        opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
        train = opt.minimize(loss)
        types = {op.type for op in tf.compat.v1.get_default_graph().get_operations()}
        assert "TfraDeApplyGradients" in types and "TfraDeUpsertGroups" not in types
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            got = sess.run(emb.lookup(ids))
    # Adam's first steps move each coordinate by about lr (gradient 1 everywhere).
    np.testing.assert_allclose(got, np.full([3, 2], 1.0 - 0.3), atol=1e-4)


def test_bad_input_is_a_clear_error():
    table = native.NativeKVCreator().create(tf.int64, tf.float32, 2, "bad")
    from tfra_dynamic_embedding.tables import native_slots
    spec = de.Variable(dim=2, initializer=0.0).init_spec
    update = native_slots.TableUpdate(table, tf.constant([1, 2], tf.int64), tf.ones([3, 2]),
                                      spec, None, [])
    with pytest.raises(tf.errors.InvalidArgumentError, match="grads"):
        native_slots.apply_gradients("/CPU:0", [update], "sgd",
                                     tf.constant([0.0, 0.1], tf.float64))
    update = native_slots.TableUpdate(table, tf.constant([1], tf.int64), tf.ones([1, 2]),
                                      spec, None, [1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="slot_groups"):
        native_slots.apply_gradients("/CPU:0", [update], "sgd",
                                     tf.constant([0.0, 0.1], tf.float64))
    update = native_slots.TableUpdate(table, tf.constant([1], tf.int64), tf.ones([1, 2]),
                                      spec, None, [5])
    with pytest.raises(tf.errors.InvalidArgumentError, match="group"):
        native_slots.apply_gradients("/CPU:0", [update], "adagrad",
                                     tf.constant([0.0, 0.1, 0.0, 0.0], tf.float64))
    assert int(table.size()) == 0   # nothing written by a refused update
