"""A parameter server written as TFRA's PS demo does: import the package, start a plain
`tf.distribute.Server` from TF_CONFIG and join. Nothing of `tfra-de` is used."""

import json
import os

import tensorflow as tf
import tensorflow_recommenders_addons.dynamic_embedding as de  # noqa: F401  (registers kernels)

config = json.loads(os.environ["TF_CONFIG"])
server = tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]),
                              job_name=config["task"]["type"],
                              task_index=config["task"]["index"], protocol="grpc")
print("tfra-de server ready: plain tf.distribute.Server", flush=True)
server.join()
