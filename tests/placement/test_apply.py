"""Applying plans to real de.Variables on 4 logical CPUs (set up by tests/conftest.py)."""

import numpy as np
import pytest
import tensorflow as tf

import tfra_dynamic_embedding as de
from tfra_dynamic_embedding.placement import apply
from tfra_dynamic_embedding.placement.types import DeviceSpec, Plan, TableSpec, Task

CPUS = [f"/CPU:{i}" for i in range(4)]


def make_plan(prefix):
    tables = [TableSpec(f"{prefix}_user", rows=100, dim=4),
              TableSpec(f"{prefix}_item", rows=30, dim=4),
              TableSpec(f"ctr/{prefix}_ad", rows=10, dim=4)]
    return Plan(Task(tables, [DeviceSpec(c) for c in CPUS]),
                {f"{prefix}_user": ["/CPU:1"], f"{prefix}_item": ["/CPU:2", "/CPU:3", "/CPU:0"],
                 f"ctr/{prefix}_ad": ["/CPU:3"]}, strategy="by-hand")


def cpu_of(device):
    assert device.startswith("/job:localhost/replica:0/task:0/device:CPU:"), device
    return "/CPU:" + device.rsplit(":", 1)[1]


def test_shard_tables_live_on_planned_devices_and_lookups_are_unchanged():
    plan = make_plan("a")
    with plan.scope():
        user = de.get_variable("a_user", dim=4)
        item = de.get_variable("a_item", dim=4)
        with tf.compat.v1.variable_scope("ctr"):
            ad = de.get_variable("a_ad", dim=4)
        free = de.get_variable("a_free", dim=4)       # not in the plan: its own device
    assert user.devices == ["/CPU:1"] and item.devices == ["/CPU:2", "/CPU:3", "/CPU:0"]
    assert [cpu_of(d) for d in apply.shard_devices(user)] == ["/CPU:1"]
    assert [cpu_of(d) for d in apply.shard_devices(item)] == ["/CPU:2", "/CPU:3", "/CPU:0"]
    assert [cpu_of(d) for d in apply.shard_devices(ad)] == ["/CPU:3"]
    assert free.shard_num == 1
    reference = de.get_variable("a_reference", dim=4)
    keys = tf.range(11, dtype=tf.int64)
    values = tf.reshape(tf.range(44, dtype=tf.float32), [11, 4])
    for var in (item, reference):
        var.upsert(keys, values)
    query = tf.constant([[3, 10], [0, 7]], tf.int64)
    np.testing.assert_array_equal(item.lookup(query).numpy(), reference.lookup(query).numpy())
    np.testing.assert_array_equal(item.lookup(query).numpy(), tf.gather(values, query).numpy())
    # Slice i of the plan holds the keys with key % 3 == i: 0,3,6,9 | 1,4,7,10 | 2,5,8.
    assert [int(item.size(i)) for i in range(3)] == [4, 4, 3]
    shard0_keys, _ = item.tables[0].export()
    assert sorted(shard0_keys.numpy().tolist()) == [0, 3, 6, 9]


def test_devices_for_without_a_scope():
    plan = make_plan("b")
    item = de.get_variable("b_item_explicit", dim=2, devices=plan.devices_for("b_item"),
                           partitioner=plan.partitioner_for("b_item"))
    assert [cpu_of(d) for d in apply.shard_devices(item)] == ["/CPU:2", "/CPU:3", "/CPU:0"]
    assert plan.partitioner_for("b_user") is None
    assert plan.partitioner_for("b_item") is de.default_partition_fn


def test_strict_scope_and_nesting():
    outer, inner = make_plan("c"), Plan(
        Task([TableSpec("c_user", rows=5, dim=4)], [DeviceSpec("/CPU:3")]),
        {"c_user": ["/CPU:3"]})
    with outer.scope():
        with inner.scope():
            user = de.get_variable("c_user", dim=4)       # inner plan wins
            item = de.get_variable("c_item", dim=4)       # only the outer knows it
    assert user.devices == ["/CPU:3"] and item.devices == ["/CPU:2", "/CPU:3", "/CPU:0"]
    with outer.scope(strict=True):
        with pytest.raises(KeyError, match="'c_unknown' is not in the placement plan"):
            de.get_variable("c_unknown", dim=4)


def test_name_matching():
    plan = Plan(Task([TableSpec("user", 5, 2), TableSpec("m/user", 5, 2)],
                     [DeviceSpec(c) for c in CPUS]), {"user": ["/CPU:0"], "m/user": ["/CPU:1"]})
    assert apply.match_table(plan, "user") == "user"
    assert apply.match_table(plan, "x/m/user") == "m/user"     # the longest suffix wins
    assert apply.match_table(plan, "x/user") == "user"
    assert apply.match_table(plan, "users") is None


def test_keras_embedding_takes_devices_from_the_plan():
    plan = make_plan("k")
    with plan.scope():
        layer = de.keras.layers.Embedding(4, name="k_item")
    assert [cpu_of(d) for d in apply.shard_devices(layer.params)] == ["/CPU:2", "/CPU:3", "/CPU:0"]


def test_a_learned_plan_that_cuts_a_hot_table_applies_to_de_variables():
    from tfra_dynamic_embedding.placement import proposers
    tables = [TableSpec("hot_t", rows=4000, dim=64, pooling_factor=60.0)] + [
        TableSpec(f"cool_{i}", rows=1000, dim=16, pooling_factor=4.0) for i in range(6)]
    plan = proposers.propose(Task(tables, [DeviceSpec(c) for c in CPUS]), "learned")
    assert plan.meta["split_tables"] == ["hot_t"]
    with plan.scope():
        hot = de.get_variable("hot_t", dim=4)
    devices = plan.devices_for("hot_t")
    assert len(devices) >= 2 and hot.devices == devices
    keys = tf.range(40, dtype=tf.int64)
    hot.upsert(keys, tf.ones([40, 4]))
    for i, device in enumerate(devices):   # slice i holds the keys with key % n == i
        assert cpu_of(apply.shard_devices(hot)[i]) == device
        held = np.sort(hot.tables[i].export()[0].numpy())
        np.testing.assert_array_equal(held, np.arange(i, 40, len(devices)))
