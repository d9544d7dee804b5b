"""de.FileSystemSaver (checkpoints write tables to files) and TFRA's per-table file methods.

The reference for every restore is the same content restored from a plain checkpoint (rows inside
the checkpoint), which tests/test_checkpoint.py checks on its own.
"""

import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.saved_model.registration import registration
from tensorflow.python.training.saving import saveable_object

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS


def _fs_creator(**saver_args):
    return de.CuckooHashTableCreator(saver=de.FileSystemSaver(**saver_args))


def _content(var):
    keys, values = var.export()
    order = np.argsort(keys.numpy())
    return keys.numpy()[order].tolist(), values.numpy()[order].tolist()


def _checkpoint_keys(path):
    return [name for name, _ in tf.train.list_variables(path)]


def _filled(kv_creator, shards, name="emb", n=300, seed=0):
    var = de.Variable(key_dtype=tf.int64, dim=4, devices=CPUS[:shards], name=name,
                      kv_creator=kv_creator)
    rng = np.random.default_rng(seed)
    keys = rng.choice(10**9, n, replace=False).astype(np.int64)
    var.upsert(tf.constant(keys), tf.constant(rng.normal(size=(n, 4)).astype(np.float32)))
    return var


# -- TFRA's kernel tests, as they use FileSystemSaver and per-table files ------------------------

def test_tfra_save_restore_file_system_v1_saver(tmp_path):
    """TFRA's test_save_restore_file_system: tf.compat.v1 Saver, 2 shards restored into 2, 3, 1."""
    save_path = str(tmp_path / "hash")

    def table(shards):
        return de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, initializer=-1.0,
                           devices=CPUS[:1] * shards, name="t1", dim=1,
                           kv_creator=_fs_creator())

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        v0 = tf.compat.v1.Variable(10.0, name="v0")
        v1 = tf.compat.v1.Variable(20.0, name="v1")
        t = table(2)
        saver = tf.compat.v1.train.Saver(var_list=[v0, v1, t])
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(t.upsert(tf.constant([0, 1, 2], tf.int64), tf.constant([[0.0], [1.0], [2.0]])))
        assert saver.save(sess, save_path) == save_path
    # The rows went to files next to the checkpoint, not into it.
    assert sorted(_checkpoint_keys(save_path)) == ["t1-prev_global_shard_num", "v0", "v1"]
    fs_dir = tmp_path / "TFRADynamicEmbedding"
    assert (fs_dir / "t1_rank0_size1.commit").exists()

    for shards in (2, 3, 1):
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            v0 = tf.compat.v1.Variable(-1.0, name="v0")
            v1 = tf.compat.v1.Variable(-1.0, name="v1")
            t = table(shards)
            sess.run(t.upsert(tf.constant([0, 1], tf.int64), tf.constant([[12.0], [24.0]])))
            assert sess.run(t.size()) == 2
            tf.compat.v1.train.Saver(var_list=[v0, v1, t]).restore(sess, save_path)
            assert sess.run([v0, v1]) == [10.0, 20.0]
            assert sess.run(t.size()) == 3
            got = sess.run(t.lookup(tf.constant([5, 0, 1, 2, 6], tf.int64)))
            np.testing.assert_array_equal(got, [[-1.0], [0.0], [1.0], [2.0], [-1.0]])


def test_tfra_table_save_load_local_file_system(tmp_path):
    """TFRA's test_table_save_load_local_file_system: per-table files under a file:// URI."""
    root = "file://" + str(tmp_path / "test_local_file_system")
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        t = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, initializer=-1.0, name="t1",
                        dim=1)
        sess.run(t.upsert(tf.constant([0, 1, 2], tf.int64), tf.constant([[0.0], [1.0], [2.0]])))
        for k, shard in enumerate(t.tables):
            sess.run(shard.save_to_file_system(f"{root}/{k}", buffer_size=4096))
    assert os.listdir(tmp_path / "test_local_file_system" / "0")  # the table's own file
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        t = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, initializer=-1.0, name="t1",
                        dim=1)
        sess.run(t.clear())
        sess.run(t.upsert(tf.constant([0, 1], tf.int64), tf.constant([[12.0], [24.0]])))
        for k, shard in enumerate(t.tables):
            sess.run(shard.load_from_file_system(f"{root}/{k}", buffer_size=4096))
        assert sess.run(t.size()) == 3
        got = sess.run(t.lookup(tf.constant([5, 0, 1, 2, 6], tf.int64)))
        np.testing.assert_array_equal(got, [[-1.0], [0.0], [1.0], [2.0], [-1.0]])


# -- tf.train.Checkpoint --------------------------------------------------------------------------

@pytest.mark.parametrize("shards_after", [2, 3, 1])
def test_checkpoint_writes_tables_to_files_like_the_plain_reference(kv_creator, tmp_path,
                                                                    shards_after):
    saver_creator = de.CuckooHashTableCreator(saver=de.FileSystemSaver())
    source = _filled(saver_creator, 2)
    module = tf.Module()
    module.emb, module.dense = source, tf.Variable([1.5, 2.5])
    path = tf.train.Checkpoint(model=module).save(str(tmp_path / "fs" / "ckpt"))
    keys = _checkpoint_keys(path)
    assert not any("emb/.ATTRIBUTES" in k for k in keys), keys  # no rows in the checkpoint
    assert "model/emb/.TFRA_DE_FILE_SYSTEM/global_shard_num" in keys
    assert (tmp_path / "fs" / "TFRADynamicEmbedding" / "emb_rank0_size1.commit").exists()

    # Reference: the same rows through a plain checkpoint.
    plain = _filled(kv_creator, 2)
    plain_path = tf.train.Checkpoint(emb=plain).save(str(tmp_path / "plain" / "ckpt"))
    reference = de.Variable(key_dtype=tf.int64, dim=4, devices=CPUS[:shards_after], name="emb",
                            kv_creator=kv_creator)
    tf.train.Checkpoint(emb=reference).restore(plain_path).assert_consumed()

    target = de.Variable(key_dtype=tf.int64, dim=4, devices=CPUS[:shards_after], name="emb",
                         kv_creator=de.CuckooHashTableCreator(saver=de.FileSystemSaver()))
    target.upsert(tf.constant([7], tf.int64), tf.ones([1, 4]))  # replaced by the restore
    fresh = tf.Module()
    fresh.emb, fresh.dense = target, tf.Variable([0.0, 0.0])
    tf.train.Checkpoint(model=fresh).restore(path).assert_consumed()
    assert _content(target) == _content(reference) == _content(source)
    np.testing.assert_array_equal(fresh.dense.numpy(), [1.5, 2.5])
    for i, table in enumerate(target.tables):  # re-partitioned over the restoring shards
        shard_keys = table.export()[0].numpy()
        assert np.all(np.mod(shard_keys, shards_after) == i)


def test_saved_model_export_writes_the_tables_beside_its_variables(tmp_path):
    """TFRA's Keras flow: `model.save(path)` then `load_weights(path)` on a new model."""
    module = tf.Module()
    module.emb = _filled(_fs_creator(), 2)
    module.lookup = tf.function(lambda ids: de.embedding_lookup(module.emb, ids),
                                input_signature=[tf.TensorSpec([None], tf.int64)])
    export_dir = str(tmp_path / "model")
    tf.saved_model.save(module, export_dir)
    assert os.path.exists(os.path.join(export_dir, "variables", "TFRADynamicEmbedding",
                                       "emb_rank0_size1.commit"))
    target = de.Variable(key_dtype=tf.int64, dim=4, devices=CPUS[:3], name="emb",
                         kv_creator=_fs_creator())
    tf.train.Checkpoint(emb=target).restore(os.path.join(export_dir, "variables", "variables"))
    assert _content(target) == _content(module.emb)


def test_plain_checkpoint_restores_into_a_file_system_variable(tmp_path):
    plain = _filled(None, 2)
    path = tf.train.Checkpoint(emb=plain).save(str(tmp_path / "ckpt"))
    target = de.Variable(key_dtype=tf.int64, dim=4, devices=CPUS[:3], name="emb",
                         kv_creator=_fs_creator())
    tf.train.Checkpoint(emb=target).restore(path)
    assert _content(target) == _content(plain)


def test_ranks_save_into_one_directory_and_restore_their_keys(tmp_path):
    """Two processes (as Horovod ranks) each save their own keys with one save_path."""
    save_path = str(tmp_path / "kv")
    rows = {}
    for rank in range(2):
        var = de.Variable(key_dtype=tf.int64, dim=2, devices=CPUS[:1], name="emb",
                          kv_creator=_fs_creator(proc_size=2, proc_rank=rank, save_path=save_path))
        keys = np.arange(rank, 40, 2, dtype=np.int64)  # key % 2 == rank
        values = np.stack([keys, keys + 0.5], 1).astype(np.float32)
        var.upsert(tf.constant(keys), tf.constant(values))
        rows.update({int(k): v.tolist() for k, v in zip(keys, values)})
        tf.train.Checkpoint(emb=var).save(str(tmp_path / f"rank{rank}" / "ckpt"))
    assert sorted(n for n in os.listdir(save_path) if n.endswith(".commit")) == [
        "emb_rank0_size2.commit", "emb_rank1_size2.commit"]
    for rank in range(2):
        var = de.Variable(key_dtype=tf.int64, dim=2, devices=CPUS[:2], name="emb",
                          kv_creator=_fs_creator(proc_size=2, proc_rank=rank, save_path=save_path))
        tf.train.Checkpoint(emb=var).restore(
            tf.train.latest_checkpoint(str(tmp_path / f"rank{rank}")))
        keys, values = _content(var)
        assert keys == [k for k in sorted(rows) if k % 2 == rank]
        assert values == [rows[k] for k in keys]
    # One process reading both ranks' saves gets everything.
    whole = de.Variable(key_dtype=tf.int64, dim=2, devices=CPUS[:3], name="emb")
    whole.load_from_file_system_with_restore_function(save_path)
    assert _content(whole) == (sorted(rows), [rows[k] for k in sorted(rows)])


def test_v1_saver_global_step_directories(tmp_path):
    """TFRA's Saver keeps `TFRADynamicEmbedding-<step>` per step: an older checkpoint restores
    its own tables."""
    prefix = str(tmp_path / "model.ckpt")
    with tf.Graph().as_default():
        var = de.get_variable("emb", dim=1, devices=CPUS[:2], kv_creator=_fs_creator())
        value = tf.compat.v1.placeholder(tf.float32, [])
        write = var.upsert(tf.constant([3, 4], tf.int64), tf.fill([2, 1], value))
        saver = tf.compat.v1.train.Saver()  # the collection path (no var_list)
        with tf.compat.v1.Session() as sess:
            for step in (1, 2):
                sess.run(write, {value: float(step)})
                saver.save(sess, prefix, global_step=step)
    assert {"TFRADynamicEmbedding-1", "TFRADynamicEmbedding-2"} <= set(os.listdir(tmp_path))
    for step in (1, 2):
        with tf.Graph().as_default():
            var = de.get_variable("emb", dim=1, devices=CPUS[:3], kv_creator=_fs_creator())
            saver = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session() as sess:
                saver.restore(sess, f"{prefix}-{step}")
                got = sess.run(var.lookup(tf.constant([3, 4], tf.int64)))
                np.testing.assert_array_equal(got, [[step], [step]])


def test_file_system_saver_rejects_bad_arguments():
    with pytest.raises(TypeError, match="proc_size and proc_rank must both be set"):
        de.FileSystemSaver(proc_size=2)
    with pytest.raises(ValueError, match="proc_rank must be an int in \\[0, proc_size=2\\); got 2"):
        de.FileSystemSaver(proc_size=2, proc_rank=2)
    with pytest.raises(ValueError, match="proc_size must be an int >= 1; got 0"):
        de.FileSystemSaver(proc_size=0, proc_rank=0)
    with pytest.raises(ValueError, match="save_path must be None or a non-empty string; got ''"):
        de.FileSystemSaver(save_path="")
    with pytest.raises(TypeError, match="saver must be None or a de.FileSystemSaver; got 'fs'"):
        de.CuckooHashTableCreator(saver="fs")
    saver = de.FileSystemSaver(proc_size=4, proc_rank=3, save_path="/x")
    assert (saver.config.proc_size, saver.config.proc_rank, saver.config.save_path) == (4, 3, "/x")
    assert de.CuckooHashTableCreator(saver=saver).saver is saver


# -- per-table methods (TFRA's, on `var.tables[i]`) ---------------------------------------------

def test_table_file_methods(kv_creator, tmp_path):
    var = _filled(kv_creator, 2)
    tables = list(var.tables)
    for table in tables:
        table.save_to_file_system(str(tmp_path))   # default name: the table's own
    suffixes = [""] if isinstance(kv_creator, de.NativeKVCreator) else ["-keys", "-values"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        f"emb_mht_{i}of2{s}" for i in (1, 2) for s in suffixes)
    copy = de.Variable(key_dtype=tf.int64, dim=4, devices=CPUS[:2], name="emb",
                       kv_creator=kv_creator)
    copy.upsert(tf.constant([10**12], tf.int64), tf.ones([1, 4]))  # replaced by the loads
    for src, dst in zip(tables, copy.tables):
        dst.load_from_file_system(str(tmp_path), file_name=src.name)
    assert _content(copy) == _content(var)
    # load_entire_dir: every `emb_mht_*` file of the directory, into one table.
    single = de.Variable(key_dtype=tf.int64, dim=4, devices=CPUS[:1], name="emb",
                         kv_creator=kv_creator)
    single.tables[0].load_from_file_system(str(tmp_path), load_entire_dir=True)
    assert _content(single) == _content(var)
    with pytest.raises(ValueError, match="append_to_file"):
        tables[0].save_to_file_system(str(tmp_path), append_to_file=True)
    with pytest.raises(ValueError, match="file_name must be a non-empty string; got ''"):
        tables[0].save_to_file_system(str(tmp_path), file_name="")
    with pytest.raises(tf.errors.NotFoundError):
        tables[0].load_from_file_system(str(tmp_path), file_name="nope")
    assert _content(copy) == _content(var)  # a failed load changes nothing


def test_private_tensorflow_names_still_resolve():
    """checkpoint.py reaches two TF internals (see its imports); this fails first when a TF
    release moves them."""
    assert callable(registration.register_checkpoint_saver)
    assert callable(registration.get_registered_saver_name)
    spec = saveable_object.SaveSpec(lambda: tf.constant(1), "", "n", dtype=tf.int32,
                                    device="/device:CPU:0")
    assert spec.dtype == tf.int32
    # The v1 Saver builds its ops in its name scope next to its file name placeholder.
    with tf.Graph().as_default():
        tf.compat.v1.Variable(1.0, name="v")
        saver = tf.compat.v1.train.Saver()
        filename = tf.compat.v1.get_default_graph().get_tensor_by_name(
            saver.saver_def.filename_tensor_name)
        assert saver.saver_def.filename_tensor_name == "save/Const:0"
        assert filename.op.type == "PlaceholderWithDefault"
