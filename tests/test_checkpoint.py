"""Persistence: tf.train.Checkpoint, the v1 Saver, re-sharding restores, SavedModel in stock TF."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS


def _content(w):
    keys, values = w.export()
    order = np.argsort(keys.numpy())
    return keys.numpy()[order], values.numpy()[order]


def _filled(kv_creator, devices, n=200, dim=5, seed=0, name="emb"):
    w = de.Variable(dim=dim, devices=devices, kv_creator=kv_creator, name=name)
    rng = np.random.default_rng(seed)
    keys = rng.choice(10**12, size=n, replace=False).astype(np.int64) - 5 * 10**11
    w.upsert(tf.constant(keys), rng.normal(size=(n, dim)).astype(np.float32))
    return w


@pytest.mark.parametrize("shards_before, shards_after", [(2, 2), (4, 3), (1, 4), (3, 1)])
def test_checkpoint_round_trip_and_resharding(kv_creator, tmp_path, shards_before, shards_after):
    source = _filled(kv_creator, CPUS[:shards_before])
    path = tf.train.Checkpoint(emb=source).save(str(tmp_path / "ckpt"))
    want_keys, want_values = _content(source)

    target = de.Variable(dim=5, devices=CPUS[:shards_after], kv_creator=kv_creator)
    target.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 5]))  # replaced by the restore
    tf.train.Checkpoint(emb=target).restore(path).assert_consumed()
    got_keys, got_values = _content(target)
    np.testing.assert_array_equal(got_keys, want_keys)
    np.testing.assert_array_equal(got_values, want_values)
    assert int(target.size()) == 200
    # every key sits on the shard the partitioner assigns it
    for i, table in enumerate(target.tables):
        shard_keys = table.export()[0].numpy()
        assert (np.mod(shard_keys, shards_after) == i).all()


def test_checkpoint_of_a_module_with_several_variables(kv_creator, tmp_path):
    module = tf.Module()
    module.user = _filled(kv_creator, CPUS[:2], seed=1, name="user")
    module.item = _filled(kv_creator, CPUS[2:], n=50, dim=5, seed=2, name="item")
    module.dense = tf.Variable([1.0, 2.0])
    path = tf.train.Checkpoint(model=module).save(str(tmp_path / "m"))

    fresh = tf.Module()
    fresh.user = de.Variable(dim=5, devices=CPUS[:2], kv_creator=kv_creator, name="user")
    fresh.item = de.Variable(dim=5, devices=CPUS[2:], kv_creator=kv_creator, name="item")
    fresh.dense = tf.Variable([0.0, 0.0])
    tf.train.Checkpoint(model=fresh).restore(path).assert_consumed()
    for a, b in [(module.user, fresh.user), (module.item, fresh.item)]:
        for x, y in zip(_content(a), _content(b)):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(fresh.dense.numpy(), [1.0, 2.0])


def test_checkpoint_false_is_not_saved(tmp_path):
    w = de.Variable(dim=2, checkpoint=False)
    w.upsert(tf.constant([1], tf.int64), tf.ones([1, 2]))
    path = tf.train.Checkpoint(emb=w).save(str(tmp_path / "c"))
    names = [name for name, _ in tf.train.list_variables(path)]
    assert not any("emb/" in n and ("keys" in n or "values" in n) for n in names)


@pytest.mark.parametrize("shards_before, shards_after", [(2, 2), (4, 3), (1, 4)])
def test_v1_saver_round_trip(tmp_path, shards_before, shards_after):
    prefix = str(tmp_path / "model.ckpt")
    rng = np.random.default_rng(3)
    keys = rng.choice(10**9, size=100, replace=False).astype(np.int64)
    values = rng.normal(size=(100, 4)).astype(np.float32)
    with tf.Graph().as_default():
        a = de.get_variable("a", dim=4, devices=CPUS[:shards_before])
        b = de.get_variable("b", dim=4, devices=CPUS[:1])
        dense = tf.compat.v1.get_variable("dense", initializer=[3.0])
        writes = [a.upsert(keys, values), b.upsert(keys[:10], values[:10] * 2)]
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(writes)
            saver.save(sess, prefix)
    with tf.Graph().as_default():
        a = de.get_variable("a", dim=4, devices=CPUS[:shards_after])
        b = de.get_variable("b", dim=4, devices=CPUS[:2])
        dense = tf.compat.v1.get_variable("dense", initializer=[0.0])
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, prefix)
            got_a, got_b = sess.run([a.lookup(keys), b.lookup(keys[:10])])
            np.testing.assert_array_equal(got_a, values)
            np.testing.assert_array_equal(got_b, values[:10] * 2)
            assert sess.run([a.size(), b.size()]) == [100, 10]
            assert sess.run(dense)[0] == 3.0


@pytest.mark.parametrize("dim", [1, 3])
def test_v1_saver_restore_of_another_dim_fails_and_changes_nothing(tmp_path, dim):
    # The restore of a dim-2 save into a sharded variable of another dim: before the shards were
    # written its rows were re-cut to the new dim (dim 1: wrong rows, no error) or half written.
    prefix = str(tmp_path / "model.ckpt")
    with tf.Graph().as_default():
        w = de.get_variable("emb", dim=2, devices=CPUS[:3])
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(w.upsert(tf.constant([7, 8, 9], tf.int64), [[1., 2.], [3., 4.], [5., 6.]]))
            saver.save(sess, prefix)
    with tf.Graph().as_default():
        w = de.get_variable("emb", dim=dim, devices=CPUS[:3])
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(w.upsert(tf.constant([99], tf.int64), tf.fill([1, dim], 9.0)))
            with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape"):
                saver.restore(sess, prefix)
            keys, values = sess.run(w.export())
    assert keys.tolist() == [99] and values.tolist() == [[9.0] * dim]


def test_saved_model_serves_in_stock_tensorflow(tmp_path):
    """The exported lookup runs in a process that never imports this package."""
    module = tf.Module()
    module.emb = de.Variable(dim=3, devices=CPUS[:2], initializer=-1.0,
                             kv_creator=de.BuiltinKVCreator())
    module.emb.upsert(tf.constant([10, 11, 12], tf.int64),
                      tf.constant([[1.0, 1, 1], [2, 2, 2], [3, 3, 3]]))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def serve(ids):
        return {"embedding": de.embedding_lookup(module.emb, ids)}

    module.serve = serve
    export_dir = str(tmp_path / "saved")
    tf.saved_model.save(module, export_dir, signatures={"serving_default": serve})
    module.emb.clear()  # the export must carry its own copy of the rows

    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        import tensorflow as tf
        loaded = tf.saved_model.load({export_dir!r})
        out = loaded.signatures["serving_default"](ids=tf.constant([12, 10, 99], tf.int64))
        assert "tfra_dynamic_embedding" not in sys.modules
        assert "tensorflow_recommenders_addons" not in sys.modules
        print(np.array2string(out["embedding"].numpy().ravel(), separator=","))
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH="")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, cwd=str(tmp_path), timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    got = np.array(eval(result.stdout.strip().splitlines()[-1]))  # pylint: disable=eval-used
    np.testing.assert_array_equal(got, [3, 3, 3, 1, 1, 1, -1, -1, -1])
