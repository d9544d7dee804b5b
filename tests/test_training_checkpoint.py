"""Save mid-training, restore into fresh objects, continue: equals an uninterrupted run."""

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS

DIM = 3
OPTIMIZERS = {
    "keras3_adam": lambda: tf.keras.optimizers.Adam(0.05),
    "keras3_ftrl": lambda: tf.keras.optimizers.Ftrl(0.1),
    "v1_adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
    "v1_adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
}
BATCHES = [np.random.default_rng(i).integers(0, 30, size=12) for i in range(6)]


class _Model(tf.Module):
    def __init__(self, opt_name, devices, kv_creator):
        super().__init__()
        self.emb = de.Variable(dim=DIM, devices=devices, initializer=0.2, name="emb",
                               kv_creator=kv_creator)
        self.w = tf.Variable(tf.linspace(0.5, 1.5, DIM)[:, None])
        self.opt = de.DynamicEmbeddingOptimizer(OPTIMIZERS[opt_name]())

    def step(self, ids):
        ids = tf.constant(ids, tf.int64)
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(self.emb, ids, return_trainable=True)
            loss = tf.reduce_mean((rows @ self.w - tf.cast(ids % 2, tf.float32)[:, None]) ** 2)
        grads = tape.gradient(loss, [wrapper, self.w])
        self.opt.apply_gradients(zip(grads, [wrapper, self.w]))

    def state(self):
        """Sorted table content of the embedding and of every slot, plus dense values."""
        def table(v):
            keys, values = v.export()
            order = np.argsort(keys.numpy())
            return keys.numpy()[order], values.numpy()[order]
        slots = sorted((v.name.split("/")[-1], table(v)) for v in self.opt.get_slot_variables(self.emb))
        if hasattr(self.opt, "iterations"):
            counters = [float(self.opt.iterations.numpy())]
        else:  # v1 optimizers count steps in non-slot variables (Adam's beta powers)
            counters = sorted(float(v.numpy()) for v in self.opt._non_slot_variables())  # pylint: disable=protected-access
        return table(self.emb), slots, self.w.numpy(), counters


def _assert_same(a, b):
    (ka, va), slots_a, wa, ia = a
    (kb, vb), slots_b, wb, ib = b
    np.testing.assert_array_equal(ka, kb)
    np.testing.assert_allclose(va, vb, rtol=1e-6)
    assert [n for n, _ in slots_a] == [n for n, _ in slots_b] and slots_a
    for (_, (ks, vs)), (_, (kt, vt)) in zip(slots_a, slots_b):
        np.testing.assert_array_equal(ks, kt)
        np.testing.assert_allclose(vs, vt, rtol=1e-6)
    np.testing.assert_allclose(wa, wb, rtol=1e-6)
    np.testing.assert_allclose(ia, ib, rtol=1e-6)


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_tf2_checkpoint_resume_equals_uninterrupted(kv_creator, tmp_path, opt_name):
    straight = _Model(opt_name, CPUS[:2], kv_creator)
    for ids in BATCHES:
        straight.step(ids)

    first = _Model(opt_name, CPUS[:2], kv_creator)
    for ids in BATCHES[:3]:
        first.step(ids)
    path = tf.train.Checkpoint(model=first).save(str(tmp_path / "ckpt"))

    resumed = _Model(opt_name, CPUS[:3], kv_creator)  # other shard count: re-partitioned
    status = tf.train.Checkpoint(model=resumed).restore(path)
    for ids in BATCHES[3:]:
        resumed.step(ids)  # slot tables appear at the first step and restore then
    status.assert_consumed()
    _assert_same(straight.state(), resumed.state())


def test_v1_saver_resume_equals_uninterrupted(kv_creator, tmp_path):
    prefix = str(tmp_path / "model.ckpt")

    def build():
        emb = de.get_variable("emb", dim=DIM, devices=CPUS[:2], initializer=0.2,
                              kv_creator=kv_creator)
        w = tf.compat.v1.get_variable("w", initializer=tf.linspace(0.5, 1.5, DIM)[:, None])
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows = de.embedding_lookup(emb, ids)
        loss = tf.reduce_mean((rows @ w - tf.cast(ids % 2, tf.float32)[:, None]) ** 2)
        opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.05))
        train = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        slots = opt.get_slot_variables(emb)
        probe = tf.range(30, dtype=tf.int64)
        readout = [emb.lookup(probe)] + [s.lookup(probe) for s in slots] + [w, emb.size()]
        return ids, train, readout

    def run(batches, restore=False, save=False):
        with tf.Graph().as_default():
            ids, train, readout = build()
            saver = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                if restore:
                    saver.restore(sess, prefix)
                for batch in batches:
                    sess.run(train, {ids: batch})
                if save:
                    saver.save(sess, prefix)
                return sess.run(readout)

    straight = run(BATCHES)
    run(BATCHES[:3], save=True)
    resumed = run(BATCHES[3:], restore=True)
    assert len(straight) == 5  # embedding, Adam's m and v, dense weight, size
    for a, b in zip(straight, resumed):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_eager_get_variable_resume_after_graph_reset_equals_uninterrupted(tmp_path):
    # A notebook / tf.test.TestCase flow: build with de.get_variable, train, save, reset the
    # default graph, rebuild under the same names, restore, continue. The rebuilt model must
    # start from the checkpoint, not from the first model's live rows and slots.
    tf_keras = pytest.importorskip("tf_keras")

    def build():
        emb = de.get_variable("resume_emb", dim=DIM, devices=CPUS[:2],
                              initializer=tf.random_normal_initializer(0.0, 0.1, seed=7))
        w = tf.Variable(tf.linspace(0.5, 1.5, DIM)[:, None])
        opt = de.DynamicEmbeddingOptimizer(tf_keras.optimizers.legacy.Adam(0.05))
        return emb, w, opt

    def step(emb, w, opt, ids):
        ids = tf.constant(ids, tf.int64)
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(emb, ids, name="lookup", return_trainable=True)
            loss = tf.reduce_mean((rows @ w - tf.cast(ids % 2, tf.float32)[:, None]) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, [wrapper, w]), [wrapper, w]))

    def content(emb):
        keys, values = emb.export()
        order = np.argsort(keys.numpy())
        return keys.numpy()[order], values.numpy()[order]

    emb, w, opt = build()
    for ids in BATCHES:
        step(emb, w, opt, ids)
    want_keys, want_values = content(emb)

    tf.compat.v1.reset_default_graph()
    emb, w, opt = build()
    for ids in BATCHES[:3]:
        step(emb, w, opt, ids)
    path = tf.train.Checkpoint(emb=emb, w=w, opt=opt).save(str(tmp_path / "ckpt"))

    tf.compat.v1.reset_default_graph()
    emb2, w2, opt2 = build()
    assert emb2 is not emb and int(emb2.size()) == 0
    tf.train.Checkpoint(emb=emb2, w=w2, opt=opt2).restore(path)
    for ids in BATCHES[3:]:
        step(emb2, w2, opt2, ids)
    got_keys, got_values = content(emb2)
    np.testing.assert_array_equal(got_keys, want_keys)
    np.testing.assert_allclose(got_values, want_values, rtol=1e-5, atol=1e-7)
