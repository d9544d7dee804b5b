"""A parameter server as TFRA's documentation writes one, for side-by-side runs under TFRA's own
environment (`benchmarks/ps_training.py --tfra-python PY`): imports TFRA's dynamic_embedding
(which registers its kernels), starts the `tf.distribute.Server` of the task `TF_CONFIG` names,
prints READY and serves until killed. Imports nothing of this repository.

    TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' python tfra_ps_server.py
"""

import json
import os
import sys

READY = "tfra ps ready"

if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: E402
    import tensorflow_recommenders_addons.dynamic_embedding  # noqa: E402,F401  (its kernels)

    config = json.loads(os.environ["TF_CONFIG"])
    task = config["task"]
    server = tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]),
                                  job_name=task["type"], task_index=task["index"])
    print(f"{READY}: /job:{task['type']}/task:{task['index']}", flush=True)
    sys.stdout.flush()
    server.join()
