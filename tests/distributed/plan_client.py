"""TF2 remote client of test_plan_cluster.py: `plan.scope()` puts every table on its planned PS.

Connects to the cluster of TF_CONFIG (its PS tasks), plans three tables over the PS devices --
one plan written by hand (a table split in two row slices) and one proposed by a strategy --,
creates the variables inside `plan.scope()` (de.get_variable and a Keras layer), writes rows,
and prints one JSON line: per table, the plan's devices, the shards' devices and rows per shard.
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import tensorflow_recommenders_addons.dynamic_embedding as de  # noqa: E402
from tfra_dynamic_embedding.placement import proposers, types  # noqa: E402

spec = json.loads(os.environ["TF_CONFIG"])["cluster"]
tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec({"ps": spec["ps"]}))
num_ps = len(spec["ps"])
task = types.Task([types.TableSpec("user", rows=100_000, dim=8, pooling_factor=4.0),
                   types.TableSpec("item", rows=20_000, dim=8, pooling_factor=1.0),
                   types.TableSpec("ad", rows=500, dim=4, pooling_factor=1.0)],
                  types.make_devices(num_ps))          # /job:ps/task:{i}
plans = {
    "by_hand": types.Plan(task, {"user": ["/job:ps/task:1", "/job:ps/task:0"],
                                 "item": ["/job:ps/task:1"], "ad": ["/job:ps/task:0"]},
                          strategy="by-hand"),
    "proposed": proposers.propose(task, "lookup-greedy"),
}
ids = tf.constant(list(range(1, 41)), tf.int64)
out = {}
for label, plan in plans.items():
    with plan.scope(strict=True):
        with tf.compat.v1.variable_scope(label):
            variables = {"user": de.get_variable("user", dim=8),
                         "item": de.get_variable("item", dim=8)}
            if label == "by_hand":  # a Keras layer takes its plan table by its own name
                variables["ad"] = de.keras.layers.Embedding(4, name="ad").params
            else:
                variables["ad"] = de.get_variable("ad", dim=4)
    result = {}
    for name, var in variables.items():
        dim = var.dim
        var.upsert(ids, tf.ones([40, dim]))
        assert float(tf.reduce_sum(de.embedding_lookup(var, ids))) == 40 * dim
        result[name] = {"planned": plan.devices_for(name),
                        "shards": [t.resource_handle.device for t in var.tables],
                        "sizes": [int(var.size(i)) for i in range(var.shard_num)]}
    out[label] = result
print(json.dumps(out))
