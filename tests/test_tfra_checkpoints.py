"""Checkpoints that TFRA itself wrote (tests/data/tfra_checkpoints, made by
tools/write_tfra_checkpoints.py with TFRA 0.8.1) load into this package: TF2 `tf.train.Checkpoint`
and tf_keras `save_weights` by restoring as usual, TF1 `Saver` checkpoints by `de.warm_start`.
Each `<format>.json` holds the rows and optimizer slot rows TFRA saved."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tensorflow_recommenders_addons.dynamic_embedding as de

DATA = os.path.join(os.path.dirname(__file__), "data", "tfra_checkpoints")
BATCH = np.arange(1, 11, dtype=np.int64)   # the ids TFRA's optimizer step trained


def _saved(fmt):
    with open(os.path.join(DATA, f"{fmt}.json")) as f:
        return json.load(f)


def _rows(keys, values):
    return {int(k): np.asarray(v) for k, v in zip(np.asarray(keys), np.asarray(values))}


def _assert_rows(got, want, scale=1.0):
    """`got` ({key: row}) has every row of `want`, times `scale`."""
    assert set(want) <= set(got), sorted(set(want) - set(got))
    for key, row in want.items():
        np.testing.assert_allclose(got[key], scale * row, rtol=1e-6, err_msg=f"key {key}")


@pytest.mark.parametrize("shards", [1, 3])
def test_tf2_checkpoint_of_tfra_restores_over_any_shard_count(shards):
    saved = _saved("tf2")
    assert "emb/tables_of_user/1/.ATTRIBUTES/table-keys" in saved["tensor_names"]  # TFRA's layout
    w = de.get_variable(f"user_{shards}", dim=4, devices=["/CPU:0"] * shards, initializer=0.0)
    status = tf.train.Checkpoint(emb=w).restore(os.path.join(DATA, "tf2", "ckpt-1"))
    status.assert_consumed()
    keys, values = w.export()
    assert int(w.size()) == len(saved["keys"]) == 20
    _assert_rows(_rows(keys, values), _rows(saved["keys"], saved["values"]))
    for i, table in enumerate(w.tables):   # re-partitioned: each key on the shard it hashes to
        shard_keys = table.export()[0].numpy()
        assert all(int(de.default_partition_fn(tf.constant([k]), shards)[0]) == i
                   for k in shard_keys)


def test_tf2_checkpoint_of_tfra_of_another_dim_fails_and_changes_nothing():
    w = de.get_variable("user_dim3", dim=3, initializer=0.0)
    w.upsert(tf.constant([100], tf.int64), tf.constant([[1.0, 2.0, 3.0]]))
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        tf.train.Checkpoint(emb=w).restore(os.path.join(DATA, "tf2", "ckpt-1"))
    keys, values = w.export()
    assert keys.numpy().tolist() == [100] and values.numpy().tolist() == [[1.0, 2.0, 3.0]]


def _keras_model(name):
    ids = tf_keras.layers.Input(shape=(1,), dtype=tf.int64)
    layer = de.keras.layers.Embedding(4, devices=["/CPU:0"] * 3, name=name, initializer=0.0,
                                      keras=tf_keras)
    model = tf_keras.Model(ids, layer(ids))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf_keras.optimizers.Adam(0.1)),
                  loss="mse")
    return model, layer


@pytest.mark.parametrize("train_first", [False, True])
def test_tf_keras_weights_of_tfra_load_rows_and_adam_slots(train_first):
    """TFRA names the layer's variable `emb-parameter` and its slots
    `emb-parameter/DynamicEmbedding/emb-shadow/m`; here they are `emb` and `emb/Adam/m`.
    Slots made after `load_weights` (the usual order) get their rows when they are made."""
    saved = _saved("keras")
    model, layer = _keras_model("emb")
    targets = np.ones([10, 1, 4], np.float32)
    if train_first:   # the slots exist when the weights load
        model.fit(BATCH.reshape(-1, 1), targets, batch_size=10, verbose=0)
    model.load_weights(os.path.join(DATA, "keras", "weights"))
    keys, values = layer.params.export()
    _assert_rows(_rows(keys, values), _rows(saved["keys"], saved["values"]))
    assert int(layer.params.size()) == 20
    if not train_first:
        # A step whose gradient is zero makes the slots: Adam then keeps b1 * m and b2 * v.
        model.fit(BATCH.reshape(-1, 1), model.predict(BATCH.reshape(-1, 1), verbose=0),
                  batch_size=10, verbose=0)
    slots = layer.params.get_slot_variables(model.optimizer)
    assert sorted(s.name for s in slots) == ["emb/Adam/m", "emb/Adam/v"]
    for slot in slots:
        short = slot.name.rsplit("/", 1)[1]
        (tfra_keys, tfra_rows), = [r for n, r in saved["slots"].items() if n.endswith("/" + short)]
        want = _rows(tfra_keys, tfra_rows)
        assert any(np.abs(row).max() > 0 for row in want.values())
        scale = 1.0 if train_first else {"m": 0.9, "v": 0.999}[short]
        _assert_rows(_rows(*slot.export()), want, scale)


def test_tf2_checkpoint_of_tfra_shadow_training_restores_rows_and_slots():
    """A `ShadowVariable` trained by tf_keras Adam: TFRA names the slots `user/user_shadow/m`."""
    saved = _saved("shadow")
    # Slots are matched by the variable's name, as TFRA saved it ("user").
    w = de.Variable(key_dtype=tf.int64, dim=4, devices=["/CPU:0"] * 3, name="user",
                    initializer=0.0)
    shadow = de.shadow_ops.ShadowVariable(w, name="user_shadow")
    opt = de.DynamicEmbeddingOptimizer(tf_keras.optimizers.Adam(0.1))
    tf.train.Checkpoint(emb=w, optimizer=opt).restore(
        os.path.join(DATA, "shadow", "ckpt-1")).expect_partial()
    _assert_rows(_rows(*w.export()), _rows(saved["keys"], saved["values"]))

    def zero_loss():   # a zero gradient makes the slots: Adam keeps b1 * m and b2 * v
        return tf.reduce_sum(de.shadow_ops.embedding_lookup(shadow, tf.constant(BATCH)) * 0.0)

    opt.minimize(zero_loss, var_list=[shadow])
    slots = w.get_slot_variables(opt)
    assert sorted(s.name.rsplit("/", 1)[1] for s in slots) == ["m", "v"]
    for slot in slots:
        short = slot.name.rsplit("/", 1)[1]
        want = _rows(*saved["slots"][f"user/user_shadow/{short}"])
        _assert_rows(_rows(*slot.export()), want, {"m": 0.9, "v": 0.999}[short])


def test_tf1_checkpoint_of_tfra_warm_starts_rows_and_slots():
    saved = _saved("tf1")
    assert "user/user_mht_2of2-keys" in saved["tensor_names"]   # TFRA's per-shard tables
    with tf.Graph().as_default():
        w = de.get_variable("user", dim=4, devices=["/CPU:0"] * 3, initializer=0.0)
        emb = de.embedding_lookup(w, tf.constant(BATCH), name="lookup")
        opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
        opt.minimize(tf.reduce_sum(emb * emb))
        slots = w.get_slot_variables(opt)
        restore = de.warm_start(os.path.join(DATA, "tf1", "model"), [w] + slots)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(restore)
            _assert_rows(_rows(*sess.run(w.export())), _rows(saved["keys"], saved["values"]))
            assert sorted(s.name for s in slots) == sorted(saved["slots"]) == [
                "user/Adam/m", "user/Adam/v"]
            for slot in slots:
                want = _rows(*saved["slots"][slot.name])
                got = _rows(*sess.run(slot.export()))
                _assert_rows(got, want)
                for key in set(got) - set(want):   # keys TFRA's slot lacks: the slot's fill
                    assert not got[key].any()


def test_tfra_tf1_meta_graph_restores_with_its_own_saver_and_trains_as_tfra_did():
    """TFRA's own graph (import_meta_graph) runs on this package's kernels for TFRA's op names:
    its Saver restores the tables, and its Adam step gives TFRA's rows."""
    saved = _saved("tf1_meta")
    rows = _rows(saved["keys"], saved["values"])
    with tf.Graph().as_default():
        saver = tf.compat.v1.train.import_meta_graph(os.path.join(DATA, "tf1_meta", "model.meta"))
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, os.path.join(DATA, "tf1_meta", "model"))
            np.testing.assert_allclose(sess.run("all_rows:0"), [rows[k] for k in range(1, 21)],
                                       rtol=1e-6)
            sess.run(tf.compat.v1.get_collection("train_op")[0])
            after = np.array(saved["slots"]["after_step"])
            assert not np.allclose(after[:10], [rows[k] for k in range(1, 11)])  # it trained
            np.testing.assert_allclose(sess.run("all_rows:0"), after, rtol=1e-5)


def test_files_tfra_saved_load_into_either_backend(kv_creator):
    """TFRA's `save_to_file_system` writes raw `-keys`/`-values` arrays per shard."""
    saved = _saved("files")
    assert "user_mht_2of2_rank0_size1-values" in saved["tensor_names"]
    want = _rows(saved["keys"], saved["values"])
    directory = os.path.join(DATA, "files")

    def variable(shards):
        return de.Variable(key_dtype=tf.int64, dim=4, devices=["/CPU:0"] * shards, name="user",
                           kv_creator=kv_creator)

    same = variable(2)
    same.load_from_file_system(directory)
    resharded = variable(3)
    resharded.load_from_file_system(directory, load_entire_dir=True)
    restored = variable(1)
    restored.load_from_file_system_with_restore_function(directory)
    for w in (same, resharded, restored):
        assert int(w.size()) == 20
        _assert_rows(_rows(*w.export()), want)


def test_files_tfra_saved_of_another_dim_fail_and_change_nothing(kv_creator):
    w = de.Variable(key_dtype=tf.int64, dim=3, devices=["/CPU:0"] * 2, name="user",
                    kv_creator=kv_creator)
    w.upsert(tf.constant([100], tf.int64), tf.constant([[1.0, 2.0, 3.0]]))
    with pytest.raises(tf.errors.InvalidArgumentError):
        w.load_from_file_system(os.path.join(DATA, "files"))
    keys, values = w.export()
    assert keys.numpy().tolist() == [100] and values.numpy().tolist() == [[1.0, 2.0, 3.0]]
