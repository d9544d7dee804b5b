"""A TF1 between-graph trainer as a TFRA user writes it (chief or worker of a LocalCluster).

Each chief/worker process disables eager execution, starts its own `tf.distribute.Server` for
its task, builds the graph under `replica_device_setter` (dense variables and the global step
on the PS tasks, de tables sharded over the PS tasks) and trains with a
`MonitoredTrainingSession` against its own server. The PS tasks are `tfra-de server` processes.

    python tf1_trainer.py '<config JSON>'        # TF_CONFIG names the cluster and the task

Config keys: opt ("adam" | "adagrad" | "sgd"), steps, scope (names of this run's variables, so
that runs can share a cluster), sync_dir (files that order the processes), ckpt_dir (chief),
wait_for (files to wait for before training, e.g. "worker0_session", which a non-chief
writes once its session is ready), done (file written after training),
ready_after/ready_file (file written after that many steps), step_deadline_s (see
`failures.StepDeadlineHook`), and on the chief: wait_workers (files to wait for before the final
export). Non-chief tasks create their session only after the chief wrote `chief_ready` (a
non-chief MonitoredTrainingSession re-checks readiness only every 30 s).
Prints one JSON line last: the steps it ran and (chief) the final state read from the PS tasks
(`state`) and which task's Saver shard writes which checkpoint entry.

What a user sets for a dead PS to fail training in bounded time instead of hanging is in
`tfra_dynamic_embedding.distributed.failures`: `fail_fast_environment()` (GRPC_FAIL_FAST=true),
`session_config(job, task, operation_timeout_in_ms=...)` (the ConfigProto: operation timeout and
device_filters) and `StepDeadlineHook(step_deadline_s)` (ends MonitoredSession's endless
recovery with a StepDeadlineError naming the dead task).

`build(...)` and `train_local(...)` are also used in-process by the tests for the
single-process reference run.
"""

import json
import os
import sys
import time

import numpy as np

DIM = 4
FEATURES = 3
BATCH = 8
HIDDEN = 5
SEED = 7
POLL = 0.05   # seconds between looks at the order files
# A step blocked on a PS that stopped answering fails after this (ms); generous against a busy
# 2-core box.
OPERATION_TIMEOUT_MS = 20000


def optimizer(name):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if name == "adam":
        return tf.compat.v1.train.AdamOptimizer(0.05)
    if name == "adagrad":
        return tf.compat.v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.2)
    if name == "sgd":
        return tf.compat.v1.train.GradientDescentOptimizer(0.3)
    raise ValueError(f"unknown optimizer {name!r}")


def batches(job, task, steps):
    """The (ids, labels) of each step of (job, task): ids [BATCH, FEATURES] from a range shared
    by all tasks (0..19) plus a range private to the task (so every task's updates are visible
    on their own keys), repeated ids included."""
    private = 1000 * (1 + (0 if job == "chief" else 1 + task))
    rng = np.random.default_rng(17 if job == "chief" else 101 + task)
    out = []
    for _ in range(steps):
        shared = rng.integers(0, 20, size=(BATCH, FEATURES - 1))
        own = private + rng.integers(0, 10, size=(BATCH, 1))
        ids = np.concatenate([shared, own], axis=1).astype(np.int64)
        labels = rng.integers(0, 2, size=(BATCH, 1)).astype(np.float32)
        out.append((ids, labels))
    return out


def private_keys(job, task):
    """The keys only (job, task) trains."""
    base = 1000 * (1 + (0 if job == "chief" else 1 + task))
    return set(range(base, base + 10))


def build(opt_name, devices, scope):
    """The model graph in the current graph and device scope. Returns a dict of its parts."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import tensorflow_recommenders_addons.dynamic_embedding as de  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(SEED)
    w1 = rng.normal(0, 0.3, size=(FEATURES * DIM, HIDDEN)).astype(np.float32)
    w2 = rng.normal(0, 0.3, size=(HIDDEN, 1)).astype(np.float32)
    with tf.compat.v1.variable_scope(scope):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None, FEATURES], name="ids")
        labels = tf.compat.v1.placeholder(tf.float32, [None, 1], name="labels")
        emb = de.get_variable(
            "emb", key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM, devices=devices,
            initializer=tf.keras.initializers.RandomNormal(0.0, 0.1, seed=SEED))
        rows = de.embedding_lookup(emb, ids, name="emb_lookup")
        x = tf.reshape(rows, [-1, FEATURES * DIM])
        kernel1 = tf.compat.v1.get_variable("tower/dense1/kernel", initializer=w1)
        bias1 = tf.compat.v1.get_variable("tower/dense1/bias",
                                          initializer=np.zeros(HIDDEN, np.float32))
        kernel2 = tf.compat.v1.get_variable("tower/dense2/kernel", initializer=w2)
        # tanh, not relu: its gradient is never zero, so a row that did not move was an update
        # lost (the async test checks every id moved); with relu a sample whose units are all
        # dead at its step gives its ids no gradient.
        hidden = tf.nn.tanh(tf.matmul(x, kernel1) + bias1)
        logits = tf.matmul(hidden, kernel2)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        opt = de.DynamicEmbeddingOptimizer(optimizer(opt_name))
        train_op = opt.minimize(loss, global_step=global_step)
        slots = opt.get_slot_variables(emb)
        exports = {"emb": emb.export()}
        exports.update({s.name.split("/")[-1]: s.export() for s in slots})
    non_slot = opt._non_slot_variables()  # pylint: disable=protected-access  (beta powers)
    return dict(global_step=global_step, ids=ids, labels=labels, emb=emb, opt=opt, loss=loss,
                train_op=train_op, exports=exports, dense=[kernel1, bias1, kernel2],
                non_slot=sorted(non_slot, key=lambda v: v.name))


def tables(values):
    """{name: {"keys": sorted keys, "values": their rows}} of exported (keys, values)."""
    out = {}
    for name, (keys, rows) in values.items():
        order = np.argsort(keys)
        out[name] = {"keys": keys[order].tolist(), "values": rows[order].tolist()}
    return out


def state(sess, model):
    """Tables, dense weights, non-slot variables and global step, as JSON-ready values."""
    exports, dense, non_slot, step = sess.run(
        [model["exports"], model["dense"], model["non_slot"], model["global_step"]])
    return {"tables": tables(exports), "dense": [d.tolist() for d in dense],
            "non_slot": {v.op.name.split("/")[-1]: float(x)
                         for v, x in zip(model["non_slot"], non_slot)},
            "global_step": int(step)}


def train_local(opt_name, runs, devices, scope="local"):
    """Single-process reference: trains the (job, task, steps) of `runs` in order in one graph
    with tables on local `devices`; returns `state` afterwards."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    with tf.Graph().as_default():
        model = build(opt_name, devices, scope)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for job, task, steps in runs:
                for ids, labels in batches(job, task, steps):
                    sess.run(model["train_op"], {model["ids"]: ids, model["labels"]: labels})
            return state(sess, model)


def restore_local(opt_name, devices, ckpt_dir, scope):
    """Restores the latest checkpoint of `ckpt_dir` into a local graph with tables on `devices`;
    returns `state`."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    with tf.Graph().as_default():
        model = build(opt_name, devices, scope)
        saver = tf.compat.v1.train.Saver(sharded=True)
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, tf.train.latest_checkpoint(ckpt_dir))
            return state(sess, model)


def _wait_files(paths, timeout=120.0):
    deadline = time.monotonic() + timeout
    for path in paths:
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not appear in {timeout} s")
            time.sleep(POLL)


def _touch(path):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write("1")
    os.replace(path + ".tmp", path)


def main(config):
    # pylint: disable-next=import-outside-toplevel
    from tfra_dynamic_embedding.distributed import failures
    failures.fail_fast_environment()   # before this process's server exists
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    # Registers the kernels (as in every TFRA process); build() uses it too.
    import tensorflow_recommenders_addons.dynamic_embedding  # noqa: F401  pylint: disable=all

    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    tf_config = json.loads(os.environ["TF_CONFIG"])
    spec, job, task = tf_config["cluster"], tf_config["task"]["type"], tf_config["task"]["index"]
    cluster = tf.train.ClusterSpec(spec)
    session_config = failures.session_config(job, task,
                                              operation_timeout_in_ms=OPERATION_TIMEOUT_MS)
    server = tf.distribute.Server(cluster, job_name=job, task_index=task, config=session_config)
    is_chief = job == "chief"
    ps = len(spec["ps"])
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            ps_tasks=ps, worker_device=f"/job:{job}/task:{task}", cluster=cluster)):
        model = build(config["opt"], [f"/job:ps/replica:0/task:{i}" for i in range(ps)],
                      config.get("scope", "model"))
    sync = config["sync_dir"]
    if not is_chief:   # a non-chief session re-checks readiness only every 30 s: come later
        _wait_files([os.path.join(sync, "chief_ready")])
    result = {"job": job, "task": task, "ran": 0}
    with failures.StepDeadlineHook(config.get("step_deadline_s", 60)) as deadline:
        with tf.compat.v1.train.MonitoredTrainingSession(
                master=server.target, is_chief=is_chief,
                checkpoint_dir=config.get("ckpt_dir") if is_chief else None,
                save_checkpoint_secs=3600,   # saves when the session starts and when it closes
                save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None,
                hooks=[deadline], config=session_config) as sess:
            _touch(os.path.join(sync, "chief_ready" if is_chief else f"{job}{task}_session"))
            _wait_files([os.path.join(sync, f) for f in config.get("wait_for", [])])
            for ids, labels in batches(job, task, config["steps"]):
                sess.run(model["train_op"], {model["ids"]: ids, model["labels"]: labels})
                result["ran"] += 1
                if config.get("ready_after") == result["ran"]:
                    _touch(os.path.join(sync, config["ready_file"]))
            if config.get("done"):
                _touch(os.path.join(sync, config["done"]))
            if is_chief:   # (time between steps does not count against the deadline)
                _wait_files([os.path.join(sync, f) for f in config.get("wait_workers", [])])
                result.update(state(sess, model))
                result["save_devices"] = _save_devices()
    print(json.dumps(result), flush=True)


def _save_devices():
    """{device: [checkpoint tensor names]} of the chief's sharded Saver (which task writes
    what)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    out = {}
    for op in tf.compat.v1.get_default_graph().get_operations():
        if op.type == "SaveV2":
            names = tf.make_ndarray(op.inputs[1].op.get_attr("value"))
            out.setdefault(op.device, []).extend(sorted(n.decode() for n in names))
    return out


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
