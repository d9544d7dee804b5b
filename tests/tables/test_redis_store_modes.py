"""TFRA's `table_store_mode` and `expire_model_tag_in_seconds` on Redis tables, against a real
redis-server: mode 1 dumps each slice (Redis DUMP) under `model_lib_abs_dir/<tag>/` at a save and
reads the dump back at a restore without writing it first; mode 2 keeps the rows in Redis only;
the TTL is set on every hash a write touches. Rows are checked against an in-memory twin."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests import redis_server
from tests.conftest import CPUS
from tfra_dynamic_embedding.tables import native
from tfra_dynamic_embedding.tables import redis as redis_tables

pytestmark = pytest.mark.skipif(
    not os.environ.get("CI") and not (redis_tables.is_available() and native.is_available()),
    reason="Redis or native op library not built (`make ops` with libhiredis-dev installed)")

_tags = iter(range(10**6))


@pytest.fixture(scope="module")
def server():
    redis_server.require_redis()
    with redis_server.StandaloneRedis() as redis:
        yield redis


def make_creator(directory, port, **fields):
    doc = {"redis_connection_mode": 2, "redis_host_ip": ["127.0.0.1"], "redis_host_port": [port],
           "model_tag_runtime": f"store{next(_tags)}", "redis_socket_timeout": 5000,
           "model_lib_abs_dir": str(directory / "lib"), "keys_sending_size": 5}
    doc.update(fields)
    path = directory / f"redis_{doc['model_tag_runtime']}.json"
    path.write_text(json.dumps(doc))
    return de.RedisTableCreator(de.RedisTableConfig(redis_config_abs_dir=str(path))), doc


def exported(var):
    keys, values = var.export()
    order = np.argsort(keys.numpy())
    return keys.numpy()[order], values.numpy()[order]


def fill(var, twin, keys):
    rows = tf.random.stateless_normal([len(keys), var.dim], seed=[len(keys), 3])
    for v in (var, twin):
        v.upsert(tf.constant(keys, tf.int64), rows)


def test_mode_1_dumps_at_save_and_restores_the_dump_without_rewriting_it(server, tmp_path):
    creator, doc = make_creator(tmp_path, server.port, table_store_mode=1)
    var = de.Variable(name="dumped", dim=3, devices=CPUS[:2], kv_creator=creator)
    twin = de.Variable(name="dumped_twin", dim=3, devices=CPUS[:2])
    fill(var, twin, list(range(1, 40)))
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
    # One file per slice of each shard, under model_lib_abs_dir/<tag>/; the checkpoint holds
    # their names, no rows.
    dump_dir = tmp_path / "lib" / doc["model_tag_runtime"]
    files = sorted(os.listdir(dump_dir))
    assert files == sorted(f"{doc['model_tag_runtime']}:dumped_mht_{i}of2{{3560}}.rdb"
                           for i in (1, 2))
    names = [n for n, _ in tf.train.list_variables(path)]
    assert not any(n.endswith(("/keys", "/values")) for n in names), names
    assert sum("redis_dump_files" in n for n in names) == 2
    before = {f: ((dump_dir / f).read_bytes(), (dump_dir / f).stat().st_mtime_ns) for f in files}
    # Changed after the save: a removed key, a new one, an overwritten row.
    var.remove(tf.constant([1, 2], tf.int64))
    var.upsert(tf.constant([3, 1000], tf.int64), tf.ones([2, 3]))
    tf.train.Checkpoint(emb=var).restore(path).assert_consumed()
    np.testing.assert_array_equal(exported(var)[0], exported(twin)[0])
    np.testing.assert_array_equal(exported(var)[1], exported(twin)[1])
    # The restore only read the dump (TFRA's restore first dumps the live table over it).
    assert {f: ((dump_dir / f).read_bytes(), (dump_dir / f).stat().st_mtime_ns)
            for f in files} == before


def test_mode_1_with_a_v1_saver(server, tmp_path):
    creator, _ = make_creator(tmp_path, server.port, table_store_mode=1)
    with tf.Graph().as_default():
        var = de.get_variable("graph_dumped", dim=2, kv_creator=creator)
        upsert = var.upsert(tf.constant([10, 20], tf.int64), [[1.0, 2.0], [3.0, 4.0]])
        clear, size = var.clear(), var.size()
        lookup = var.lookup(tf.constant([10, 20], tf.int64))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(upsert)
            path = saver.save(sess, str(tmp_path / "model"))
            sess.run(clear)
            assert sess.run(size) == 0
            saver.restore(sess, path)
            assert sess.run(size) == 2
            np.testing.assert_array_equal(sess.run(lookup), [[1, 2], [3, 4]])


def test_mode_2_checkpoint_holds_nothing_and_rows_stay_in_redis(server, tmp_path):
    creator, _ = make_creator(tmp_path, server.port, table_store_mode=2)
    var = de.Variable(name="kept", dim=2, kv_creator=creator)
    twin = de.Variable(name="kept_twin", dim=2)
    fill(var, twin, [1, 2, 3])
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
    names = [n for n, _ in tf.train.list_variables(path)]
    assert any("redis_hashes" in n for n in names)
    assert not any(n.endswith(("/keys", "/values")) for n in names), names
    fill(var, twin, [2, 7])                # written after the save: a restore keeps them
    tf.train.Checkpoint(emb=var).restore(path).assert_consumed()
    np.testing.assert_array_equal(exported(var)[1], exported(twin)[1])
    assert not os.path.exists(tmp_path / "lib")


def test_mode_0_when_the_file_names_no_mode(server, tmp_path):
    """TFRA's default is 1; here a file without the field keeps the rows in the checkpoint."""
    creator, _ = make_creator(tmp_path, server.port)
    var = de.Variable(name="plain", dim=2, kv_creator=creator)
    var.upsert(tf.constant([1], tf.int64), tf.ones([1, 2]))
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
    assert any(n.endswith("/keys") for n, _ in tf.train.list_variables(path))


def test_expire_model_tag_in_seconds_sets_a_ttl_on_every_written_hash(server, tmp_path):
    creator, _ = make_creator(tmp_path, server.port, expire_model_tag_in_seconds=1000)
    var = de.Variable(name="ttl", dim=2, devices=CPUS[:2], kv_creator=creator,
                      initializer=tf.keras.initializers.Constant(0.5))
    names = [t.kv_table.hash_names[0] for t in var.tables]

    def ttls():
        return [int(server.cli("TTL", n.decode())) for n in names]

    # Many keys in commands of 5: several per hash (on several lanes with >= 8 CPUs), each
    # lane's last followed by an EXPIRE.
    var.upsert(tf.range(2000, dtype=tf.int64), tf.ones([2000, 2]))
    assert all(0 < t <= 1000 for t in ttls()), ttls()
    for n in names:
        server.cli("PERSIST", n.decode())
    var.accum(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
    assert sum(0 < t <= 1000 for t in ttls()) >= 1       # the hashes the two keys are in
    for n in names:
        server.cli("PERSIST", n.decode())
    table = var.tables[0].kv_table
    table.find_or_insert(tf.constant([5000], tf.int64), lambda k: tf.zeros([1, 2]))
    assert 0 < ttls()[0] <= 1000
    # A negative value, or no field (TFRA's default is 7 days; here a TTL needs asking for):
    # no TTL.
    for fields in ({"expire_model_tag_in_seconds": -1}, {}):
        never, _ = make_creator(tmp_path, server.port, **fields)
        plain = de.Variable(name="no_ttl", dim=2, kv_creator=never)
        plain.upsert(tf.constant([1], tf.int64), tf.ones([1, 2]))
        assert int(server.cli("TTL", plain.tables[0].kv_table.hash_names[0].decode())) == -1
