"""A ParameterServerStrategy coordinator that loses a PS: run as the chief of a
LocalCluster(ps=2, worker=1, chief=1) with TF_CONFIG set.

    psst_ps_kill.py DIR            trains 5 steps, checkpoints to DIR, prints TRAINED, waits for
                                   the file DIR/killed, schedules more steps: prints the error
    psst_ps_kill.py DIR --resume   a new coordinator restores DIR's checkpoint (after the PS was
                                   restarted), prints the restored rows, trains 1 more step

Prints one JSON line last.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tensorflow_recommenders_addons.dynamic_embedding as de  # noqa: E402


def export(variable):
    keys, values = variable.export()
    order = np.argsort(keys.numpy())
    return {"keys": keys.numpy()[order].tolist(), "values": values.numpy()[order].tolist()}


def main(directory, resume):
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        table = de.get_variable("table", dim=2, initializer=1.0)
        optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))
    checkpoint = tf.train.Checkpoint(table=table)

    @tf.function
    def step(ids):
        def replica_fn(ids):
            with tf.GradientTape() as tape:
                rows, wrapper = de.embedding_lookup(table, ids, name="lookup",
                                                    return_trainable=True)
                loss = tf.reduce_sum(rows)
            optimizer.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
            return loss
        return strategy.run(replica_fn, args=(ids,))

    if resume:
        # The lookup wrapper's entry is matched when a step makes it; the rows are checked.
        checkpoint.restore(os.path.join(directory, "ckpt")).expect_partial()
        restored = export(table)
        coordinator.schedule(step, args=(tf.constant([100, 101], tf.int64),))
        coordinator.join()
        print(json.dumps({"restored": restored, "size": int(table.size()),
                          "new_rows": export(table)["values"][-2:]}), flush=True)
        return
    for i in range(5):
        coordinator.schedule(step, args=(tf.constant([i, i + 1], tf.int64),))
    coordinator.join()
    checkpoint.write(os.path.join(directory, "ckpt"))
    print(json.dumps({"checkpointed": export(table)}), flush=True)
    print("TRAINED", flush=True)
    while not os.path.exists(os.path.join(directory, "killed")):
        time.sleep(0.05)
    start = time.monotonic()
    try:
        for i in range(50):
            coordinator.schedule(step, args=(tf.constant([i, i + 1], tf.int64),))
        coordinator.join()
        print(json.dumps({"error": None}), flush=True)
    except tf.errors.OpError as error:
        print(json.dumps({"error": type(error).__name__, "message": error.message,
                          "seconds": time.monotonic() - start}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] == ["--resume"])
    sys.stdout.flush()
    os._exit(0)  # pylint: disable=protected-access  (coordinator threads may still wait on workers)
