"""Coordinator (chief) of the ParameterServerStrategy tests: one process runs every scenario.

    psst_train.py <work dir> <backends, e.g. native,builtin>

Run as the chief of a LocalCluster(ps=2, worker=2, chief=1) with TF_CONFIG set. Scenarios:
  sum     SGD(lr=1) on bp_v2 variables, one per backend, with the default devices (one shard per
          PS task): steps scheduled on 2 workers with known batches; the rows must move by
          exactly the summed gradients (the test compares with numpy).
  keras   a Keras model with two de.keras.layers.Embedding (one per backend) trained by a
          custom loop (Adam) over per-worker datasets, after a warm-up with zero gradients
          that both workers take part in (its loss on all rows before and after); then
          tf.train.Checkpoint(model, optimizer).write(<work dir>/ckpt) and the tables' rows and
          slots to <work dir>/tables.npz.
  kill    more SGD steps in three phases, each joined before the next: the script prints
          PSST_KILL and waits for the file <work dir>/killed (the test kills worker 1 and writes
          it), schedules steps while worker 1 is down, prints PSST_RESTART and waits for
          <work dir>/restarted (the test restarts worker 1) and for the coordinator to have
          recovered the cluster, then schedules the rest. No step is in flight when a worker
          dies or the cluster is updated: `schedule` runs a function at least once, and twice
          if a worker or a cluster update interrupts it midway (TF's documented semantics), so
          only then must the rows equal the exact sum.
Prints one JSON line last.
"""

import json
import logging
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tensorflow_recommenders_addons.dynamic_embedding as de  # noqa: E402

DIM = 3
COEF = np.array([1.0, 0.5, 0.25], np.float32)   # d loss / d row of key k = count * (k+1) * COEF
SUM_STEPS = 16
KILL_STEPS = (8, 12, 8)   # before the kill, while worker 1 is down, after its restart
BATCH = 6


def batches(seed, count, vocab=12):
    """`count` known batches of ids (with repeats), drawn from a fixed seed."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, BATCH).astype(np.int64) for _ in range(count)]


def expected_rows(all_batches):
    """{key: row} after SGD(lr=1) from zero rows: row -= count * (key+1) * COEF per batch."""
    rows = {}
    for ids in all_batches:
        for k in ids.tolist():
            rows[k] = rows.get(k, np.zeros(DIM, np.float64)) - (k + 1) * COEF
    return rows


def export(variable):
    keys, values = variable.export()
    keys, values = keys.numpy(), values.numpy()
    order = np.argsort(keys)
    return keys[order], values[order]


def max_error(variable, before, expected):
    """Largest |row - (row before + expected change)| over the rows of `variable` now."""
    keys, values = export(variable)
    old = dict(zip(before[0].tolist(), before[1]))
    want = np.stack([old.get(k, 0.0) + expected.get(k, 0.0) for k in keys.tolist()])
    return float(np.max(np.abs(values - want)))


def wait_for(path, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout} s")
        time.sleep(0.1)


class RecoveryWatch(logging.Handler):
    """Sets `recovered` when TF's coordinator logs that it brought the cluster back (the only
    public sign of it). Logged at INFO, so the TF logger is opened to INFO for this handler
    only: its other handlers stay at WARNING."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.recovered = threading.Event()

    def emit(self, record):
        if "Cluster successfully recovered" in record.getMessage():
            self.recovered.set()

    @classmethod
    def install(cls):
        logger = tf.get_logger()
        for handler in logger.handlers:
            handler.setLevel(max(handler.level, logging.WARNING))
        logger.setLevel(logging.INFO)
        watch = cls()
        logger.addHandler(watch)
        return watch


def kv(backend):
    return de.BuiltinKVCreator() if backend == "builtin" else de.NativeKVCreator()


def main(work_dir, backends):
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    ps_devices = [f"/job:ps/replica:0/task:{i}" for i in range(2)]
    result = {"backends": backends}

    # -- sum: exact concurrent bp_v2 updates ------------------------------------------------
    with strategy.scope():
        sums = {b: de.get_variable(f"sum_{b}", dim=DIM, initializer=0.0, kv_creator=kv(b),
                                   bp_v2=True) for b in backends}
        sgd = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1.0))
        # Each worker's own step count (a TF per-worker variable): both workers must train.
        counter = tf.Variable(0, dtype=tf.int64, per_worker_variable=True)
    coef = tf.constant(COEF)

    @tf.function
    def sgd_step(ids):
        def replica_fn(ids):
            wrappers, loss = [], 0.0
            with tf.GradientTape() as tape:
                for b in backends:
                    emb, wrapper = de.embedding_lookup(sums[b], ids, name=f"lookup_{b}",
                                                       return_trainable=True)
                    weight = tf.cast(ids + 1, tf.float32)[:, None] * coef
                    loss += tf.reduce_sum(emb * weight)
                    wrappers.append(wrapper)
            grads = tape.gradient(loss, wrappers)
            sgd.apply_gradients(zip(grads, wrappers))
            counter.assign_add(1)
            return loss
        return strategy.run(replica_fn, args=(ids,))

    sum_batches = batches(1, SUM_STEPS)
    losses = [coordinator.schedule(sgd_step, args=(tf.constant(ids),)) for ids in sum_batches]
    coordinator.join()
    result["sum_losses_done"] = sum(1 for r in losses if np.isfinite(r.fetch()))
    result["sum_worker_steps"] = [int(c.numpy()) for c in counter.read_all()]
    result["sum_devices"] = {b: sums[b].devices for b in backends}
    expected = expected_rows(sum_batches)
    sum_rows = {}
    for b in backends:
        keys, values = export(sums[b])
        sum_rows[b] = (keys, values)
        want = np.stack([expected[k] for k in keys.tolist()])
        result[f"sum_{b}"] = {"keys": keys.tolist(),
                              "expected_keys": sorted(expected),
                              "max_abs_error": float(np.max(np.abs(values - want)))}

    # -- keras: a model with de.keras.layers.Embedding trained by a custom loop -------------
    with strategy.scope():
        model, layers = build_model(backends)
        adam = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05))
        keras_counter = tf.Variable(0, dtype=tf.int64, per_worker_variable=True)

    def dataset_fn():
        ids = tf.constant(np.stack([np.arange(64) % 16, (np.arange(64) * 7) % 11], 1), tf.int64)
        labels = tf.cast(ids[:, :1] % 3, tf.float32) - 1.0   # learnable from the user id alone
        return tf.data.Dataset.from_tensor_slices((ids, labels)).batch(16).repeat()

    def evaluate():
        """The model's loss on all 64 rows, computed here from the tables on the PS tasks."""
        ids, labels = next(iter(dataset_fn().unbatch().batch(64)))
        return float(tf.reduce_mean(tf.square(model(ids) - labels)))

    per_worker_dataset = coordinator.create_per_worker_dataset(dataset_fn)
    per_worker_iterator = iter(per_worker_dataset)

    @tf.function
    def train_step(iterator, scale):
        def replica_fn(batch):
            ids, labels = batch
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(ids, training=True) - labels))
                scaled = loss * scale
            grads = tape.gradient(scaled, model.trainable_variables)
            adam.apply_gradients(zip(grads, model.trainable_variables))
            keras_counter.assign_add(1)
            return loss
        return strategy.run(replica_fn, args=(next(iterator),))

    # Warm-up with zero gradients (rows unchanged) until both workers have run the function.
    # A worker's first run of a function is slow (it registers and optimizes the graph); the
    # other worker's steps meanwhile would be undone when that first step writes back the
    # rows it read at its start (absolute rows: TFRA's semantics without bp_v2).
    # (The per-worker counters exist once a function using them was scheduled.)
    warm_up = 0
    while warm_up == 0 or (min(int(c.numpy()) for c in keras_counter.read_all()) == 0
                           and warm_up < 40):
        for _ in range(2):
            coordinator.schedule(train_step, args=(per_worker_iterator, tf.constant(0.0)))
        coordinator.join()
        warm_up += 2
    result["keras_warm_up_steps"] = warm_up
    result["keras_first_loss"] = evaluate()
    keras_steps = 40
    losses = [coordinator.schedule(train_step, args=(per_worker_iterator, tf.constant(1.0)))
              for _ in range(keras_steps)]
    coordinator.join()
    result["keras_steps_done"] = sum(1 for r in losses if np.isfinite(r.fetch()))
    result["keras_last_loss"] = evaluate()
    result["keras_worker_steps"] = [int(c.numpy()) for c in keras_counter.read_all()]
    result["keras_iterations"] = int(adam.iterations.numpy())
    result["keras_devices"] = {layer.name: layer.params.devices for layer in layers}
    result["keras_slot_devices"] = {
        slot.name: slot.devices for layer in layers
        for slot in adam.get_slot_variables(layer.params)}
    result["keras_dense_devices"] = sorted({v.value.device for v in model.layers[-1].weights})
    tables = {}
    for layer in layers:
        for variable in [layer.params] + adam.get_slot_variables(layer.params):
            keys, values = export(variable)
            tables[variable.name + "/keys"] = keys
            tables[variable.name + "/values"] = values
    result["keras_sizes"] = {layer.name: int(layer.params.size().numpy()) for layer in layers}
    tf.train.Checkpoint(model=model, optimizer=adam).write(os.path.join(work_dir, "ckpt"))
    np.savez(os.path.join(work_dir, "tables.npz"), **tables)
    result["keras_tables"] = sorted(tables)

    # -- kill: a worker killed between batches, the job goes on -------------------------------
    watch = RecoveryWatch.install()
    kill_batches = batches(2, sum(KILL_STEPS))
    phases = np.split(np.arange(sum(KILL_STEPS)), np.cumsum(KILL_STEPS)[:-1])
    before = {b: export(sums[b]) for b in backends}
    # Diagnostics: `before` must equal the rows checked right after the sum phase.
    before_vs_sum = {b: (len(before[b][0]), len(sum_rows[b][0]),
                         float(np.max(np.abs(before[b][1] - sum_rows[b][1])))
                         if len(before[b][0]) == len(sum_rows[b][0]) else None)
                     for b in backends}
    done = 0
    for phase, steps in enumerate(phases):
        if phase == 1:
            print("PSST_KILL", flush=True)
            wait_for(os.path.join(work_dir, "killed"))
        if phase == 2:
            print("PSST_RESTART", flush=True)
            wait_for(os.path.join(work_dir, "restarted"))
            if not watch.recovered.wait(120):
                raise TimeoutError("the coordinator did not recover worker 1 in 120 s")
        losses = [coordinator.schedule(sgd_step, args=(tf.constant(kill_batches[i]),))
                  for i in steps]
        coordinator.join()
        done += sum(1 for r in losses if np.isfinite(r.fetch()))
        # The error after each phase, to tell where rows went wrong if they do.
        so_far = expected_rows(kill_batches[:steps[-1] + 1])
        for b in backends:
            result.setdefault(f"kill_{b}_phase_errors", []).append(
                max_error(sums[b], before[b], so_far))
    result["kill_steps_done"] = done
    expected = expected_rows(kill_batches)
    for b in backends:
        keys, values = export(sums[b])
        old = dict(zip(before[b][0].tolist(), before[b][1]))
        want = np.stack([old.get(k, 0.0) + expected.get(k, 0.0) for k in keys.tolist()])
        result[f"kill_{b}"] = {"keys": keys.tolist(),
                               "expected_keys": sorted(set(old) | set(expected)),
                               "phase_errors": result.pop(f"kill_{b}_phase_errors"),
                               "before_vs_sum": before_vs_sum[b],
                               "rows": values.tolist(), "wanted": want.tolist(),
                               "max_abs_error": float(np.max(np.abs(values - want)))}
    print(json.dumps(result), flush=True)


def build_model(backends):
    """ids [batch, 2] -> one de.keras.layers.Embedding per backend (user: first backend, item:
    last) -> Dense(1). Built the same way by psst_restore.py."""
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    user = de.keras.layers.Embedding(4, initializer=tf.keras.initializers.RandomNormal(0.0, 0.1,
                                                                                       seed=1),
                                     kv_creator=kv(backends[0]), name="user")
    item = de.keras.layers.Embedding(4, initializer=tf.keras.initializers.RandomNormal(0.0, 0.1,
                                                                                       seed=2),
                                     kv_creator=kv(backends[-1]), name="item")
    hidden = tf.keras.layers.Concatenate()([user(ids[:, 0]), item(ids[:, 1])])
    out = tf.keras.layers.Dense(1, kernel_initializer="ones", name="out")(hidden)
    return tf.keras.Model(ids, out), [user, item]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","))
    sys.stdout.flush()
    os._exit(0)  # pylint: disable=protected-access  (coordinator threads may still wait on workers)
