"""A TF2 client that puts one native-table Variable on every PS of TF_CONFIG's cluster.

Prints {"sizes": [size(i) per shard], "devices": [...], "rows": [...], "backend": ...}.
"""

import json
import os

import tensorflow as tf
import tensorflow_recommenders_addons.dynamic_embedding as de

spec = json.loads(os.environ["TF_CONFIG"])["cluster"]
tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec({"ps": spec["ps"]}))
devices = [f"/job:ps/replica:0/task:{i}" for i in range(len(spec["ps"]))]
w = de.get_variable("w", dim=2, devices=devices, kv_creator=de.NativeKVCreator())
keys = tf.constant([0, 1, 2, 3, 4], tf.int64)
w.upsert(keys, tf.reshape(tf.range(10, dtype=tf.float32), [5, 2]))
print(json.dumps({
    "sizes": [int(w.size(i)) for i in range(len(devices))],
    "devices": [t.resource_handle.device for t in w.tables],
    "rows": w.lookup(keys).numpy().tolist(),
}), flush=True)
