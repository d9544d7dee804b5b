"""Online learning under ParameterServerStrategy: a capacity-bounded, count-admitted
de.keras.layers.Embedding trained by steps scheduled on 2 workers, and the same steps in one
process (the reference).

    psst_online.py ps <work dir>      # the chief of a LocalCluster(ps=2, worker=2, chief=1)
    psst_online.py local <work dir>   # one process, 2 shards on its CPU; also restores the
                                      # checkpoint the ps run wrote

Each step is joined before the next is scheduled, so the steps run in the reference's order
(on whichever worker is free). Prints one JSON line last: the size after every step, the
table and its slot, and (local) the ps run's checkpoint restored here. The ps run then
schedules steps without joining in between (they overlap) and reports the sizes.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tensorflow_recommenders_addons.dynamic_embedding as de  # noqa: E402

BOUND = 30
ASYNC_BOUND = 400
BATCHES = [np.random.default_rng(200 + i).zipf(1.3, size=24) % 100 for i in range(16)]


def table(var):
    keys, values = var.export()
    order = np.argsort(keys.numpy())
    return {"keys": keys.numpy()[order].tolist(),
            "values": values.numpy()[order].astype(np.float64).tolist()}


def build(devices=None, name="user", bound=BOUND):
    layer = de.keras.layers.Embedding(4, initializer=tf.keras.initializers.Zeros(),
                                      name=name, devices=devices,
                                      eviction=de.Eviction(max_size=bound, order="lru"),
                                      admission=de.CountAdmission(2) if name == "user" else None)
    dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(0.5))
    dense.build([None, 4])
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(0.1))
    return layer, dense, optimizer


def replica_step(layer, dense, optimizer, ids):
    with tf.GradientTape() as tape:
        out = dense(layer(ids))
        loss = tf.reduce_mean((out - tf.cast(ids % 2, tf.float32)[:, None]) ** 2)
    variables = layer.trainable_variables + dense.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss


def state(layer, optimizer, sizes):
    seen = {}
    for ids in BATCHES:
        for k in set(ids.tolist()):
            seen[k] = seen.get(k, 0) + 1
    return {"sizes": sizes, "table": table(layer.params),
            "slots": [table(v) for v in optimizer.get_slot_variables(layer.params)],
            "admitted_ever": sorted(k for k, n in seen.items() if n >= 2),
            "devices": layer.params.devices}


def run_ps(work_dir):
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        layer, dense, optimizer = build()
        worker_steps = tf.Variable(0, dtype=tf.int64, per_worker_variable=True)

    @tf.function
    def step(ids):
        def replica_fn(ids):
            worker_steps.assign_add(1)
            return replica_step(layer, dense, optimizer, ids)
        return strategy.run(replica_fn, args=(ids,))

    sizes = []
    for ids in BATCHES:
        coordinator.schedule(step, args=(tf.constant(ids, tf.int64),))
        coordinator.join()
        sizes.append(int(layer.params.size()))
    tf.train.Checkpoint(layer=layer, optimizer=optimizer).write(os.path.join(work_dir, "ckpt"))
    result = state(layer, optimizer, sizes)
    result["worker_steps"] = [int(c.numpy()) for c in worker_steps.read_all()]
    result["async_sizes"] = run_async(strategy, coordinator)
    return result


def run_async(strategy, coordinator):
    """Steps of new ids scheduled without joining in between (both workers' steps overlap):
    the sizes of the table, polled while they run and after they end."""
    with strategy.scope():
        layer, dense, optimizer = build(name="item", bound=ASYNC_BOUND)

    @tf.function
    def step(ids):
        return strategy.run(lambda ids: replica_step(layer, dense, optimizer, ids), args=(ids,))

    for i in range(40):
        coordinator.schedule(step, args=(tf.range(50 * i, 50 * i + 50, dtype=tf.int64),))
    polled = []
    while not coordinator.done():
        polled.append(int(layer.params.size()))
    coordinator.join()
    return {"polled": polled, "final": int(layer.params.size())}


def run_local(work_dir):
    layer, dense, optimizer = build(devices=["/CPU:0", "/CPU:0"])
    step = tf.function(lambda ids: replica_step(layer, dense, optimizer, ids))
    sizes = []
    for ids in BATCHES:
        step(tf.constant(ids, tf.int64))
        sizes.append(int(layer.params.size()))
    result = state(layer, optimizer, sizes)
    restored_layer, _, restored_optimizer = build(devices=["/CPU:0", "/CPU:0"])
    restored_optimizer.build(restored_layer.trainable_variables)
    tf.train.Checkpoint(layer=restored_layer, optimizer=restored_optimizer).read(
        os.path.join(work_dir, "ckpt")).expect_partial()
    result["restored"] = table(restored_layer.params)
    return result


if __name__ == "__main__":
    mode, work = sys.argv[1:3]
    print(json.dumps(run_ps(work) if mode == "ps" else run_local(work)), flush=True)
