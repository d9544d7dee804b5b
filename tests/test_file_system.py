"""de.Variable.save_to_file_system / load_from_file_system (TFRA's names), both backends."""

import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS


def content(var):
    keys, values = var.export()
    return {int(k): v.tolist() for k, v in zip(keys.numpy(), values.numpy())}


def filled(kv_creator, devices, name="emb", n=50):
    var = de.Variable(key_dtype=tf.int64, dim=3, devices=devices, name=name, kv_creator=kv_creator)
    keys = tf.range(n, dtype=tf.int64) * 7 - 20
    var.upsert(keys, tf.reshape(tf.range(3 * n, dtype=tf.float32), [n, 3]))
    return var


def test_round_trip_same_shards(kv_creator, tmp_path):
    var = filled(kv_creator, CPUS[:2])
    var.save_to_file_system(str(tmp_path))
    # One committed generation holding both shards under TFRA's names (tables/files.py).
    record = (tmp_path / "emb_rank0_size1.commit").read_text().strip()
    assert record.startswith("emb_rank0_size1.gen-")
    assert sorted(os.listdir(tmp_path)) == sorted(["emb_rank0_size1.commit", record])
    names = os.listdir(tmp_path / record)
    assert any(n.startswith("emb_mht_1of2_rank0_size1") for n in names)
    assert any(n.startswith("emb_mht_2of2_rank0_size1") for n in names)
    fresh = de.Variable(key_dtype=tf.int64, dim=3, devices=CPUS[:2], name="emb",
                        kv_creator=kv_creator)
    fresh.upsert(tf.constant([10_000], tf.int64), tf.ones([1, 3]))  # replaced by the load
    fresh.load_from_file_system(str(tmp_path))
    assert content(fresh) == content(var)
    # The shards kept their own keys: lookups route to them.
    rows = fresh.lookup(tf.constant([-20, 1], tf.int64))
    np.testing.assert_array_equal(rows.numpy()[0], [0, 1, 2])


@pytest.mark.parametrize("restore", ["entire_dir", "restore_function"])
def test_reshard_on_load(kv_creator, tmp_path, restore):
    var = filled(kv_creator, CPUS[:2])
    var.save_to_file_system(str(tmp_path))
    fresh = de.Variable(key_dtype=tf.int64, dim=3, devices=CPUS[:3], name="emb",
                        kv_creator=kv_creator)
    if restore == "entire_dir":
        fresh.load_from_file_system(str(tmp_path), load_entire_dir=True)
    else:
        fresh.load_from_file_system_with_restore_function(str(tmp_path))
    assert content(fresh) == content(var)
    for i in range(3):  # every key sits on the shard the partitioner names
        keys = fresh.tables[i].export()[0].numpy()
        assert np.all(de.default_partition_fn(tf.constant(keys), 3).numpy() == i)


def test_rank_filter_and_env_dir(kv_creator, tmp_path, monkeypatch):
    var = filled(kv_creator, CPUS[:1])
    monkeypatch.setenv("TFRA_SAVED_KV", str(tmp_path / "env"))
    var.save_to_file_system(str(tmp_path / "ignored"), proc_size=2, proc_rank=1)
    monkeypatch.delenv("TFRA_SAVED_KV")
    assert not os.path.exists(tmp_path / "ignored")
    assert "emb_rank1_size2.commit" in os.listdir(tmp_path / "env")
    fresh = de.Variable(key_dtype=tf.int64, dim=3, devices=CPUS[:1], name="emb",
                        kv_creator=kv_creator)
    fresh.load_from_file_system_with_restore_function(str(tmp_path / "env"), proc_size=2,
                                                      proc_rank=1)
    expected = {k: v for k, v in content(var).items() if k % 2 == 1}
    assert content(fresh) == expected and expected


def test_bad_arguments(kv_creator, tmp_path):
    var = filled(kv_creator, CPUS[:2])
    with pytest.raises(ValueError, match="file_name_list"):
        var.save_to_file_system(str(tmp_path), file_name_list=["only_one"])
    with pytest.raises(ValueError, match="append_to_file"):
        var.save_to_file_system(str(tmp_path), append_to_file=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="no shard files of variable 'emb'"):
        var.load_from_file_system(str(tmp_path), load_entire_dir=True)
    before = content(var)
    with pytest.raises(tf.errors.OpError):
        var.load_from_file_system(str(tmp_path))  # nothing saved there
    assert content(var) == before
