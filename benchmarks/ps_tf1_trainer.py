"""One trainer (chief or worker) of the TF1 between-graph rows of benchmarks/ps_training.py.

TFRA's setup as a TF1 user writes it: 26 `de.get_variable` tables x dim 16 sharded over the PS
tasks (key mod K), looked up together by one `de.embedding_lookups` (one lookup op per PS and
step; TFRA, which has no such call, runs one `de.embedding_lookup` per table), MLP 256-128-1 on
the concatenated rows,
v1 Adam (1e-3) wrapped by `de.DynamicEmbeddingOptimizer`, built under `replica_device_setter`
(dense weights, their Adam slots and the global step on the PS tasks, as in TFRA's TF1 examples)
and trained with a `MonitoredTrainingSession` against this task's own `tf.distribute.Server`.
Trainers run asynchronously (no barrier between their steps).

    python ps_tf1_trainer.py '<config JSON>'     # TF_CONFIG names the cluster and this task

Config keys: steps (timed), warmup, batch_size, dim, seed, scope (variable names of this run,
so runs can share a cluster), sync_dir, timeout (seconds for any one wait).

Order (files in sync_dir, written by the trainers and by the driver, ps_training.py):
  chief: session created -> `chief_ready` (a non-chief MonitoredTrainingSession re-checks
  readiness only every 30 s, so workers create theirs after this file);
  every trainer: `warmup` steps -> `warm_<job><task>`; waits for the driver's `go`; `steps`
  timed steps -> `result_<job><task>.json`; waits for the driver's `exit` (its connections stay
  open until the driver has read the sockets' byte counters), then closes its session.
Prints the result as one JSON line last: per-step (start, end) wall-clock times of the timed
steps and the least bytes its timed batches had to move.
"""

import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
POLL = 0.02


def wait_files(paths, timeout):
    deadline = time.monotonic() + timeout
    for path in paths:
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not appear in {timeout:.0f} s")
            time.sleep(POLL)


def write_file(path, text="1"):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def build(dim, features, hidden, devices, scope):
    """The model graph in the current graph and device scope; returns (ids, labels, loss,
    train_op)."""
    # pylint: disable=import-outside-toplevel
    import tensorflow as tf
    import tensorflow_recommenders_addons.dynamic_embedding as de

    glorot = tf.compat.v1.glorot_uniform_initializer()
    with tf.compat.v1.variable_scope(scope):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None, features], name="ids")
        labels = tf.compat.v1.placeholder(tf.float32, [None], name="labels")
        tables = [de.get_variable(
            f"C{t + 1}", key_dtype=tf.int64, value_dtype=tf.float32, dim=dim, devices=devices,
            initializer=tf.keras.initializers.RandomNormal(0.0, 0.05)) for t in range(features)]
        names = [f"C{t + 1}_lookup" for t in range(features)]
        columns = [ids[:, t] for t in range(features)]
        if hasattr(de, "embedding_lookups"):   # all tables at once: one lookup op per PS
            rows = de.embedding_lookups(tables, columns, names=names)
        else:   # TFRA 0.8.1 (--tfra-python)
            rows = [de.embedding_lookup(t, c, name=n) for t, c, n in zip(tables, columns, names)]
        x = tf.concat(rows, axis=1)
        sizes = [features * dim] + list(hidden) + [1]
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            kernel = tf.compat.v1.get_variable(f"dense{i}/kernel", [fan_in, fan_out],
                                               initializer=glorot)
            bias = tf.compat.v1.get_variable(f"dense{i}/bias", [fan_out],
                                             initializer=tf.compat.v1.zeros_initializer())
            x = tf.matmul(x, kernel) + bias
            if i < len(sizes) - 2:
                x = tf.nn.relu(x)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=x[:, 0]))
        opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(1e-3))
        train_op = opt.minimize(loss, global_step=global_step)
    return ids, labels, loss, train_op


def main(config):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # pylint: disable=import-outside-toplevel
    import tensorflow as tf
    sys.path.insert(0, HERE)
    from zipf_batches import tfra_batches

    tf.compat.v1.disable_eager_execution()
    tf_config = json.loads(os.environ["TF_CONFIG"])
    spec, job, task = tf_config["cluster"], tf_config["task"]["type"], tf_config["task"]["index"]
    name = f"{job}{task}"
    index = 0 if job == "chief" else 1 + task
    sync, timeout = config["sync_dir"], config.get("timeout", 300)
    warmup, steps, batch_size = config["warmup"], config["steps"], config["batch_size"]
    # Each trainer its own batches (the chief's are the TF2 client rows' batches).
    batches = tfra_batches(warmup + steps, batch_size, config["seed"] + index)
    features = batches[0][0]["ids"].shape[1]

    cluster = tf.train.ClusterSpec(spec)
    session_config = tf.compat.v1.ConfigProto(
        device_filters=["/job:ps", f"/job:{job}/task:{task}"])   # never wait for other trainers
    server = tf.distribute.Server(cluster, job_name=job, task_index=task, config=session_config)
    ps = len(spec["ps"])
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            ps_tasks=ps, worker_device=f"/job:{job}/task:{task}", cluster=cluster)):
        ids, labels, loss, train_op = build(
            config["dim"], features, config.get("hidden", (256, 128)),
            [f"/job:ps/replica:0/task:{i}" for i in range(ps)], config.get("scope", "model"))
    is_chief = job == "chief"
    if not is_chief:
        wait_files([os.path.join(sync, "chief_ready")], timeout)
    times = []
    with tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=is_chief, checkpoint_dir=None,
            save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None,
            config=session_config) as sess:
        if is_chief:
            write_file(os.path.join(sync, "chief_ready"))
        for i, (inputs, label) in enumerate(batches):
            if i == warmup:
                write_file(os.path.join(sync, f"warm_{name}"))
                wait_files([os.path.join(sync, "go")], timeout)
            began = time.time()
            value = sess.run([train_op, loss], {ids: inputs["ids"], labels: label})[1]
            if i >= warmup:
                times.append((began, time.time()))
            if not np.isfinite(value):
                raise RuntimeError(f"loss became {value}")
        # The least a step moves: per table the batch's unique ids to the PS, their rows back
        # and their gradients to the PS.
        minimum = [sum(len(np.unique(inputs["ids"][:, t])) * (8 + 2 * 4 * config["dim"])
                       for t in range(features)) for inputs, _ in batches[warmup:]]
        result = {"trainer": name, "times": times, "min_bytes": minimum, "loss": float(value)}
        write_file(os.path.join(sync, f"result_{name}.json"), json.dumps(result))
        wait_files([os.path.join(sync, "exit")], timeout)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
