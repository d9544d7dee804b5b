"""TF2 (Keras model, `tf.function` step) training-step speed of TFRA's published setup, runnable
on this package and on TFRA itself: the TF2 twin of train_step_v1.py.

The setup: 26 tables x dim 16, batch 4096, one Zipf(1.2) id per table per example, MLP
256-128-1 on the concatenated embeddings, binary cross-entropy, Keras Adam(1e-3). The dynamic
variant is TFRA user code as TFRA documents it: one `de.keras.layers.Embedding` per table, the
optimizer wrapped by `de.DynamicEmbeddingOptimizer`, a `tf.GradientTape` step in `tf.function`
over `model.trainable_variables`. It imports `tensorflow_recommenders_addons.dynamic_embedding`,
so the same script measures TFRA in an environment that has TFRA installed:

    python benchmarks/train_step_tf2.py                                       # this package, Keras 3
    TF_USE_LEGACY_KERAS=1 /path/to/tfra-env/bin/python benchmarks/train_step_tf2.py  # TFRA, tf_keras

Variants (they take turns step by step, so a change of the machine's load hits both alike):
  de      dynamic embeddings fed the raw int64 ids (new ids keep arriving: batches never repeat)
  static  `tf.keras.layers.Embedding` tables of the distinct ids of all batches (ids mapped to
          [0, vocab) beforehand), the same Adam (Keras 3's updates every row of a static table)

Prints a table and one JSON line last. Never fails on speed; compare the ratios of one run.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from train_step_v1 import DIM, HIDDEN, TABLES, make_batches, to_static  # noqa: E402

VARIANTS = ("de", "static")


class Model(tf.keras.Model):
    """26 embedding tables (dynamic or static), concatenated, MLP 256-128-1."""

    def __init__(self, variant, vocab):
        super().__init__()
        init = tf.random_normal_initializer(0.0, 0.01)
        if variant == "de":
            import tensorflow_recommenders_addons.dynamic_embedding as de  # pylint: disable=import-outside-toplevel
            self.tables = [de.keras.layers.Embedding(DIM, initializer=init, name=f"emb{t}")
                           for t in range(TABLES)]
        else:
            self.tables = [tf.keras.layers.Embedding(vocab[t], DIM, embeddings_initializer=init,
                                                     name=f"emb{t}") for t in range(TABLES)]
        self.dense = [tf.keras.layers.Dense(n, activation="relu") for n in HIDDEN]
        self.dense.append(tf.keras.layers.Dense(1))

    def call(self, ids):
        x = tf.concat([table(ids[:, t]) for t, table in enumerate(self.tables)], axis=1)
        for layer in self.dense:
            x = layer(x)
        return x[:, 0]


def build(variant, vocab):
    """(step function, table rows function) of one variant."""
    model = Model(variant, vocab)
    opt = tf.keras.optimizers.Adam(1e-3)
    if variant == "de":
        import tensorflow_recommenders_addons.dynamic_embedding as de  # pylint: disable=import-outside-toplevel
        opt = de.DynamicEmbeddingOptimizer(opt)

    @tf.function
    def step(ids, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                          logits=model(ids)))
        variables = model.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    if variant == "de":
        rows = lambda: sum(int(t.params.size()) for t in model.tables)  # noqa: E731
    else:
        rows = lambda: sum(vocab)  # noqa: E731
    return step, rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (>= 1)")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated: " + ",".join(VARIANTS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in VARIANTS for v in variants):
        parser.error(f"--variants must name some of {list(VARIANTS)}; got {args.variants!r}")
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")

    raw_ids, labels = make_batches(args.warmup + args.steps, args.batch_size, args.seed)
    static_ids, vocab = to_static(raw_ids)
    package = "none"
    if "de" in variants:
        import tensorflow_recommenders_addons as tfra  # pylint: disable=import-outside-toplevel
        package = getattr(tfra, "__version__", None) or "tfra_dynamic_embedding"
    built = {v: build(v, vocab) for v in variants}
    times = {v: [] for v in variants}
    for i in range(args.warmup + args.steps):
        for variant in variants:
            ids = raw_ids[i] if variant == "de" else static_ids[i]
            ids, label = tf.constant(ids), tf.constant(labels[i])
            began = time.perf_counter()
            value = float(built[variant][0](ids, label))
            times[variant].append(time.perf_counter() - began)
            if not np.isfinite(value):
                raise RuntimeError(f"{variant}: loss became {value}")

    keras_name = "tf_keras" if os.environ.get("TF_USE_LEGACY_KERAS") == "1" else "keras"
    keras_version = getattr(sys.modules.get(keras_name), "__version__", "?")
    print(f"TF2 train step (TFRA setup: {TABLES} tables x dim {DIM}, MLP "
          f"{'-'.join(map(str, HIDDEN))}-1, Keras Adam), batch {args.batch_size}, {args.steps} "
          f"timed steps after {args.warmup}; package {package}; TF {tf.__version__}, "
          f"{keras_name} {keras_version}, {os.cpu_count()} CPUs")
    header = f"{'variant':8} {'ms/step (p10-p90)':>24} {'examples/s':>11} {'table rows':>11}"
    print(header)
    print("-" * len(header))
    results = []
    for variant in variants:
        timed = np.asarray(times[variant][args.warmup:])
        median = float(np.median(timed))
        row = {"variant": variant, "ms_per_step": round(median * 1e3, 2),
               "ms_p10": round(float(np.percentile(timed, 10)) * 1e3, 2),
               "ms_p90": round(float(np.percentile(timed, 90)) * 1e3, 2),
               "examples_per_s": round(args.batch_size / median),
               "table_rows": built[variant][1]()}
        results.append(row)
        spread = f"{row['ms_per_step']:.1f} ({row['ms_p10']:.1f}-{row['ms_p90']:.1f})"
        print(f"{variant:8} {spread:>24} {row['examples_per_s']:>11,} {row['table_rows']:>11,}")
    print(json.dumps({"benchmark": "train_step_tf2", "package": package, "tf": tf.__version__,
                      "keras": f"{keras_name} {keras_version}", "batch_size": args.batch_size,
                      "steps": args.steps, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
