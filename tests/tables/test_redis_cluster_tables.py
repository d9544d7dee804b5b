"""Redis tables on a real 3-master Redis Cluster (tests/redis_server.py): slices on every master
as TFRA lays them out, every operation equal to the native backend's, and the slot routing done
in cc/redis/redis_cluster.cc following a slot that moves (ASK while it migrates, MOVED after)."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests import redis_server
from tfra_dynamic_embedding.tables import native
from tfra_dynamic_embedding.tables import redis as redis_tables
from tfra_dynamic_embedding.tables import redis_config as rc

pytestmark = pytest.mark.skipif(
    not os.environ.get("CI") and not (redis_tables.is_available() and native.is_available()),
    reason="Redis or native op library not built (`make ops` with libhiredis-dev installed)")

_tags = iter(range(10**6))


@pytest.fixture(scope="module")
def cluster():
    redis_server.require_redis()
    with redis_server.RedisCluster(masters=3) as c:
        yield c


def cluster_creator(cluster, directory, **fields):
    doc = {"redis_connection_mode": 0, "redis_host_ip": ["127.0.0.1"] * 3,
           "redis_host_port": cluster.ports, "model_tag_runtime": f"c{next(_tags)}",
           "storage_slice": 3, "keys_sending_size": 5}
    doc.update(fields)
    path = os.path.join(str(directory), "cluster.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    return de.RedisTableCreator(de.RedisTableConfig(redis_config_abs_dir=path))


def _sorted(keys, values):
    keys, values = keys.numpy(), values.numpy()
    order = np.argsort(keys)
    return keys[order], values[order]


def _owner(cluster, hash_name):
    """The node holding `hash_name` (its slot's master)."""
    slot = int(cluster.nodes[0].cli("CLUSTER", "KEYSLOT", hash_name))
    for node in cluster.nodes:
        out = node.cli("CLUSTER", "COUNTKEYSINSLOT", slot)
        if out != "0":
            return node, slot
    raise AssertionError(f"no node holds {hash_name}")


def test_slices_on_every_master_and_operations_equal_native(cluster, tmp_path):
    creator = cluster_creator(cluster, tmp_path)
    red = de.Variable(name="cemb", dim=3, kv_creator=creator,
                      initializer=tf.keras.initializers.RandomNormal(0, 1, seed=2))
    nat = de.Variable(name="cemb_native", dim=3, kv_creator=de.NativeKVCreator(),
                      initializer=tf.keras.initializers.RandomNormal(0, 1, seed=2))
    table = red.tables[0].kv_table
    config = table.config
    expected_tags = rc.hash_tags(3, (), rc.cluster_slot_ranges(cluster.nodes[0].cli(
        "CLUSTER", "NODES")))
    assert table.hash_names == [f"{config.model_tag_runtime}:cemb{t}".encode()
                                for t in expected_tags]
    keys = tf.range(-30, 30, dtype=tf.int64) * 1000003
    rows = tf.random.stateless_normal([60, 3], seed=[3, 4])
    probe = tf.concat([keys[::7], tf.constant([5, 6, 5], tf.int64)], 0)
    for var in (red, nat):
        var.upsert(keys, rows)
        var.accum(probe, tf.ones([tf.size(probe), 3]))
    np.testing.assert_array_equal(red.lookup(probe).numpy(), nat.lookup(probe).numpy())
    assert int(red.size()) == int(nat.size()) == 62
    # Each slice is one hash on its own master, holding the keys TFRA puts in it.
    counts = {}
    for node in cluster.nodes:
        names = node.cli("KEYS", f"{config.model_tag_runtime}:*").split()
        assert len(names) == 1, names
        counts[names[0].encode()] = int(node.cli("HLEN", names[0]))
    slices = [config.key_slice(int(k)) for k in np.concatenate([keys.numpy(), [5, 6]])]
    assert [counts[h] for h in table.hash_names] == [slices.count(i) for i in range(3)]
    r_keys, r_values = _sorted(*red.export())
    n_keys, n_values = _sorted(*nat.export())
    np.testing.assert_array_equal(r_keys, n_keys)
    np.testing.assert_array_equal(r_values, n_values)
    assert int(red.remove(keys[:10])) == 10
    red.clear()
    assert int(red.size()) == 0


def test_slot_routing_follows_a_migrating_slot(cluster, tmp_path):
    """ASK while the slot migrates (the hash already on the target), MOVED once it moved."""
    creator = cluster_creator(cluster, tmp_path, storage_slice=1)
    var = de.Variable(name="moving", dim=2, kv_creator=creator)
    keys = tf.constant([1, 2, 3], tf.int64)
    var.upsert(keys, [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    hash_name = var.tables[0].kv_table.hash_names[0].decode()
    source, slot = _owner(cluster, hash_name)
    target = next(n for n in cluster.nodes if n is not source)
    ids = {n.port: n.cli("CLUSTER", "MYID") for n in cluster.nodes}
    target.cli("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source.port])
    source.cli("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target.port])
    source.cli("MIGRATE", "127.0.0.1", target.port, hash_name, 0, 5000)
    # The table still sends the slot to `source`, which answers ASK.
    np.testing.assert_array_equal(var.lookup(keys).numpy(), [[1, 1], [2, 2], [3, 3]])
    var.upsert(tf.constant([4], tf.int64), [[4.0, 4.0]])
    for node in cluster.nodes:
        node.cli("CLUSTER", "SETSLOT", slot, "NODE", ids[target.port])
    assert target.cli("HLEN", hash_name) == "4"          # the write went to the target
    # Now `source` answers MOVED: the table reads the slot map again.
    np.testing.assert_array_equal(var.lookup(tf.constant([4, 1], tf.int64)).numpy(),
                                  [[4, 4], [1, 1]])
    var.accum(keys, tf.ones([3, 2]))
    assert int(var.size()) == 4
    np.testing.assert_array_equal(var.lookup(keys).numpy(), [[2, 2], [3, 3], [4, 4]])


def test_a_standalone_server_is_refused_in_cluster_mode(tmp_path):
    redis_server.require_redis()
    with redis_server.StandaloneRedis() as redis:
        path = os.path.join(str(tmp_path), "c.json")
        with open(path, "w") as f:
            json.dump({"redis_connection_mode": 0, "redis_host_ip": ["127.0.0.1"],
                       "redis_host_port": [redis.port], "redis_hash_tags_hypodispersion": True},
                      f)
        with pytest.raises(tf.errors.FailedPreconditionError, match="not a cluster node"):
            de.Variable(name="nc", dim=2, kv_creator=de.RedisTableCreator(
                de.RedisTableConfig(redis_config_abs_dir=path)))
