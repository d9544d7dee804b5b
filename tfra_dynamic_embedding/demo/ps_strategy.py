"""The demo's coordinator under `tf.distribute.ParameterServerStrategy`: `tfra-de demo --ps N
--workers M` runs this module as the chief of a local cluster (demo/cluster.py starts it, with
`TF_CONFIG` naming the chief, N PS and M worker tasks, all `tfra-de server` processes).

    python -m tfra_dynamic_embedding.demo.ps_strategy --options '<the demo's options as JSON>'

It builds the demo's DLRM and its `de.DynamicEmbeddingOptimizer` under `strategy.scope()` (no
devices given: every table gets one shard per PS task, its optimizer slots follow it; the dense
weights are spread over the PS tasks too) and trains it with a custom loop:

- the coordinator reads the training rows as the one-process demo does (the same shuffled
  order, one pass per epoch) and schedules one step per batch with `coordinator.schedule`,
  the batch as its argument, so the workers together see every row once per epoch (a
  per-worker dataset cannot be split between workers: ParameterServerStrategy gives every
  worker the same input context); the first step of each worker is waited for (it builds the
  step function there); whichever worker is free runs the next step, asynchronously
  against the PS tasks, where the optimizer's update is applied (docs/distributed.md), so
  concurrent updates of an id all count; the epoch ends with `coordinator.join()`;
- a per-worker variable counts each worker's steps (metrics.json `worker_steps`).

Then, in the coordinator: held-out AUC and log loss, a `tf.train.Checkpoint` after every epoch,
the SavedModel served by stock TensorFlow in a fresh process, table sizes per PS task -- the
same steps and metrics.json as `tfra-de demo --ps N` (demo/run.py, demo/cluster.py), plus
`mode`, `scheduled_steps` and `worker_steps`.

The process ends with `os._exit`: the coordinator's threads may still wait on the workers.
"""

import argparse
import itertools
import json
import math
import os
import sys
import time
import traceback

MODE = "parameter_server_strategy"
PROGRESS_POINTS = 4  # progress lines per epoch (--verbose 1)


def _bce(tf, label, probability):
    """Binary cross-entropy per example, as Keras' BinaryCrossentropy (probabilities clipped)."""
    p = tf.clip_by_value(probability, 1e-7, 1.0 - 1e-7)
    return -(label * tf.math.log(p) + (1.0 - label) * tf.math.log(1.0 - p))


def evaluate(model, dataset):
    """(AUC, log loss) of `model` on `dataset`, run by the coordinator itself (eagerly: its reads
    of the tables and the dense weights go to the PS tasks)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    auc = tf.keras.metrics.AUC(num_thresholds=1000)
    total, count = 0.0, 0
    for features, label in dataset:
        probability = tf.reshape(model(features, training=False), [-1])
        auc.update_state(label, probability)
        total += float(tf.reduce_sum(_bce(tf, label, probability)))
        count += int(tf.size(label))
    return float(auc.result()), total / max(count, 1)


def train(args, data):
    """Trains the demo's DLRM on the cluster of TF_CONFIG; returns (results, model, checkpoint
    manager, training seconds)."""
    # pylint: disable=import-outside-toplevel
    import numpy as np
    import tensorflow as tf

    import tfra_dynamic_embedding as de
    from tfra_dynamic_embedding.demo import criteo, dlrm
    from tfra_dynamic_embedding.demo import run as demo_run

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    spec = resolver.cluster_spec().as_dict()
    workers = len(spec["worker"])
    print(f"coordinator: ParameterServerStrategy over {len(spec['ps'])} PS and {workers} worker "
          f"task(s); every table has one shard per PS task", flush=True)
    with strategy.scope():
        model = dlrm.DLRM(embedding_dim=args.embedding_dim, interaction=args.interaction)
        # The update is applied on the PS tasks: concurrent workers' updates of an id add up.
        optimizer = de.DynamicEmbeddingOptimizer(demo_run.keras_optimizer(tf, args))
        dlrm.build(model)
        worker_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                   per_worker_variable=True)
    print(f"model: {demo_run.describe(model)}; {type(optimizer).__name__}(learning_rate="
          f"{args.learning_rate:g}) wrapped by de.DynamicEmbeddingOptimizer")
    _, manager, epoch = demo_run.make_checkpoint(model, optimizer, args.out, args.resume)

    # The rows in the one-process demo's order; each batch goes to the worker running its step.
    train_ds = criteo.read_tsv(data.path, args.batch_size, take=data.num_train,
                               shuffle_buffer=min(data.num_train, 100_000), seed=args.seed)
    loss_fn = tf.keras.losses.BinaryCrossentropy()

    @tf.function   # traced for the full batch and for an epoch's last, smaller one
    def train_step(features, label):
        def replica_fn(features, label):
            with tf.GradientTape() as tape:
                probability = model(features, training=True)
                loss = loss_fn(tf.reshape(label, [-1, 1]), probability)
            variables = model.trainable_variables
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            worker_steps.assign_add(1)
            return loss
        return strategy.run(replica_fn, args=(features, label))

    steps_per_epoch = math.ceil(data.num_train / args.batch_size)
    points = sorted({max(1, round(steps_per_epoch * (i + 1) / PROGRESS_POINTS))
                     for i in range(PROGRESS_POINTS)})
    scheduled = 0
    began = time.perf_counter()
    for index in range(int(epoch), args.epochs):
        epoch_began = time.perf_counter()
        batches = iter(train_ds)
        losses = []
        if index == int(epoch):
            # One first step per worker, waited for: a worker builds the step function in its
            # first step (seconds). Queued with the rest, one worker would take several steps
            # meanwhile and the other's first gradient would arrive that many steps stale.
            losses += [coordinator.schedule(train_step, args=batch)
                       for batch in itertools.islice(batches, workers)]
            coordinator.join()
        # The epoch's other steps are queued at once; the workers take them as they get free.
        losses += [coordinator.schedule(train_step, args=batch) for batch in batches]
        scheduled += steps_per_epoch
        last = 0
        for point in points:  # waits for that step only: the others run on meanwhile
            recent = [float(r.fetch()) for r in losses[last:point]]
            if args.verbose == 1:
                print(f"epoch {index + 1}/{args.epochs}: step {point}/{steps_per_epoch} done, "
                      f"mean loss of steps {last + 1}-{point} {np.mean(recent):.4f}", flush=True)
            last = point
        coordinator.join()
        epoch.assign(index + 1)
        manager.save(checkpoint_number=index + 1)
        counts = [int(c.numpy()) for c in worker_steps.read_all()]
        print(f"epoch {index + 1}/{args.epochs}: {steps_per_epoch} steps in "
              f"{time.perf_counter() - epoch_began:.1f} s, mean loss "
              f"{np.mean([float(r.fetch()) for r in losses]):.4f}; steps per worker so far "
              f"{counts}", flush=True)
    train_seconds = time.perf_counter() - began

    auc, log_loss = evaluate(model, demo_run.eval_dataset(data))
    results = demo_run.held_out_results(auc, log_loss, data, args, train_seconds)
    results["mode"] = MODE
    results["scheduled_steps"] = scheduled
    results["worker_steps"] = [int(c.numpy()) for c in worker_steps.read_all()]
    results["cluster"] = spec
    return results, model, manager, train_seconds


def main(argv=None):
    """The coordinator: trains, evaluates, checkpoints, exports; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m tfra_dynamic_embedding.demo.ps_strategy")
    parser.add_argument("--options", required=True, help="the demo's options as JSON")
    args = argparse.Namespace(**json.loads(parser.parse_args(argv).options))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # pylint: disable=import-outside-toplevel
    import tensorflow as tf

    from tfra_dynamic_embedding.demo import cluster
    from tfra_dynamic_embedding.demo import run as demo_run
    start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    tf.keras.utils.set_random_seed(args.seed)
    print("== tfra_dynamic_embedding demo: a DLRM with dynamic embeddings on Criteo-format data, "
          "trained by asynchronous workers")
    data = demo_run.prepare_data(args, args.out)
    results, model, manager, train_seconds = train(args, data)
    cluster.record_ps_sizes(results, model)
    demo_run.finish(model, manager, data, args, args.out, results, start, train_seconds)
    return 0


if __name__ == "__main__":
    try:
        CODE = main()
    except BaseException:  # pylint: disable=broad-except  (reported; the exit code says it)
        traceback.print_exc()
        CODE = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(CODE)  # coordinator threads may still wait
