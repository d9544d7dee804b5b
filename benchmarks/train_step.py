"""Training-step speed: dynamic embeddings (de) against static Keras embeddings, same run.

Two setups, each trained with (a) one static `tf.keras.layers.Embedding` per feature, whose
vocabulary is fixed in advance (ids are mapped to [0, vocab) before training; vocab = the distinct
ids of the benchmark's batches, the best case for a static table), and (b) one
`de.keras.layers.Embedding` per feature, fed the raw int64 ids:

  demo  the demo's DLRM (tfra_dynamic_embedding/demo/dlrm.py): 13 dense + 26 categorical
        features of the synthetic Criteo-format data (power-law ids), dim 16, dot interaction.
  tfra  TFRA's published setup: 26 tables x dim 16, batch x 26 Zipf(1.2) ids (one per table),
        MLP 256-128-1 on the concatenated embeddings.

Both variants use the same model code and the same `de.DynamicEmbeddingOptimizer`-wrapped Keras
Adam. A step is one `tf.function` (forward, backward, optimizer update, for (b) the table
write-back), fed batches prepared in memory, never repeated (new ids keep arriving, as in
training). The two variants take turns step by step, so load from other processes hits both. Reported: median ms/step over the timed steps after warm-up (p10-p90 in brackets),
examples/s, the first (tracing) step. Note that Keras 3's Adam updates a static table densely
(every row, every step), while de updates only the batch's rows.

    python benchmarks/train_step.py [--steps 50] [--batch-size 4096] [--setups demo,tfra]

TFRA's setup as TFRA user code in a tf.compat.v1 graph, runnable on TFRA itself for a side-by-side
figure, with a lazy-Adam static baseline: benchmarks/train_step_v1.py.

Prints a table and one JSON line. Never fails on speed; the machine may be shared, so timings are
noisy: compare the ratios of one run.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tfra_dynamic_embedding as de  # noqa: E402
from tfra_dynamic_embedding.demo import criteo, dlrm  # noqa: E402
from zipf_batches import tfra_batches  # noqa: E402,F401  (the TFRA setup's batches)

SETUPS = ("demo", "tfra")
VARIANTS = ("static", "de")


def demo_batches(num_batches, batch_size, seed):
    """Batches of the demo data: ({"dense", "ids"} numpy, label) with raw int64 hashed ids."""
    data = criteo.generate_arrays(num_batches * batch_size, seed=seed)
    dense = np.where(data.dense_missing, 0, data.dense).astype(np.float32)
    inputs = criteo.preprocess(tf.constant(dense), tf.constant(data.categorical_strings()
                                                              .astype(np.bytes_)))
    dense, ids = inputs["dense"].numpy(), inputs["ids"].numpy()
    label = data.label.astype(np.float32)
    return [({"dense": dense[i::num_batches], "ids": ids[i::num_batches]}, label[i::num_batches])
            for i in range(num_batches)]


def to_static(batches):
    """Maps every feature's ids to [0, vocab) over all batches; returns (batches, vocab sizes)."""
    ids = np.stack([inputs["ids"] for inputs, _ in batches])  # [batches, batch, features]
    mapped = np.empty_like(ids)
    vocab = []
    for f in range(ids.shape[-1]):
        distinct, index = np.unique(ids[..., f], return_inverse=True)
        mapped[..., f] = index.reshape(ids[..., f].shape)
        vocab.append(len(distinct))
    out = [({**inputs, "ids": mapped[i]}, label) for i, (inputs, label) in enumerate(batches)]
    return out, vocab


def make_step(setup, variant, vocab, kv_creator):
    """(one training step as a tf.function, the model) for a setup and variant."""
    if setup == "demo":
        kwargs = {}
    else:
        kwargs = dict(num_dense=0, interaction="concat", top=(256, 128))
    model = dlrm.DLRM(vocab_sizes=vocab if variant == "static" else None,
                      kv_creator=kv_creator if variant == "de" else None, **kwargs)
    return training_step(model), model


def training_step(model):
    """One training step of `model` as a tf.function `step(inputs, label) -> loss`: binary
    cross-entropy, Adam(1e-3) wrapped by de.DynamicEmbeddingOptimizer."""
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-3))
    loss_fn = tf.keras.losses.BinaryCrossentropy()

    @tf.function
    def step(inputs, label):
        with tf.GradientTape() as tape:
            loss = loss_fn(label[:, None], model(inputs, training=True))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return step


def time_steps(steps, batches):
    """Seconds per step of every `steps[variant]` on every batch of `batches[variant]`.

    The variants take turns batch by batch, so a change of the machine's load hits both alike.
    """
    tensors = {variant: [({k: tf.constant(v) for k, v in inputs.items()}, tf.constant(label))
                         for inputs, label in batches[variant]] for variant in steps}
    times = {variant: [] for variant in steps}
    for i in range(len(next(iter(tensors.values())))):
        for variant, step in steps.items():
            inputs, label = tensors[variant][i]
            began = time.perf_counter()
            loss = step(inputs, label).numpy()
            times[variant].append(time.perf_counter() - began)
            if not np.isfinite(loss):
                raise RuntimeError(f"{variant}: loss became {loss}")
    return {variant: np.asarray(t) for variant, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (>= 1)")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--setups", default=",".join(SETUPS), help="comma-separated: demo,tfra")
    parser.add_argument("--backend", choices=("default", "builtin", "native"), default="default",
                        help="table backend of the de variant")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    setups = [s for s in args.setups.split(",") if s]
    if not setups or any(s not in SETUPS for s in setups):
        parser.error(f"--setups must name some of {list(SETUPS)}; got {args.setups!r}")
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")
    kv_creator = _kv_creator(args.backend)
    tf.keras.utils.set_random_seed(args.seed)

    num_batches = args.warmup + args.steps
    results = []
    print(f"train step, batch {args.batch_size}, {args.steps} timed steps after {args.warmup} "
          f"warm-up; de backend: {type(kv_creator).__name__}; TF {tf.__version__}, "
          f"{os.cpu_count()} CPUs")
    header = (f"{'setup':6} {'variant':7} {'ms/step (p10-p90)':>24} {'examples/s':>11} "
              f"{'first step s':>12} {'table rows':>11}")
    print(header)
    print("-" * len(header))
    for setup in setups:
        make = demo_batches if setup == "demo" else tfra_batches
        raw = make(num_batches, args.batch_size, args.seed)
        static, vocab = to_static(raw)
        steps, models = {}, {}
        for variant in VARIANTS:
            steps[variant], models[variant] = make_step(setup, variant, vocab, kv_creator)
        times = time_steps(steps, {"static": static, "de": raw})
        per_variant = {}
        for variant in VARIANTS:
            timed = times[variant][args.warmup:]
            median = float(np.median(timed))
            rows = sum(models[variant].table_sizes().values())
            row = {"setup": setup, "variant": variant, "ms_per_step": round(median * 1e3, 2),
                   "ms_p10": round(float(np.percentile(timed, 10)) * 1e3, 2),
                   "ms_p90": round(float(np.percentile(timed, 90)) * 1e3, 2),
                   "examples_per_s": round(args.batch_size / median),
                   "first_step_s": round(float(times[variant][0]), 2), "table_rows": rows}
            results.append(row)
            per_variant[variant] = median
            spread = f"{row['ms_per_step']:.1f} ({row['ms_p10']:.1f}-{row['ms_p90']:.1f})"
            print(f"{setup:6} {variant:7} {spread:>24} {row['examples_per_s']:>11,} "
                  f"{row['first_step_s']:>12.1f} {rows:>11,}", flush=True)
        ratio = per_variant["de"] / per_variant["static"]
        results.append({"setup": setup, "ratio_de_over_static": round(ratio, 3)})
        print(f"{setup:6} de / static = {ratio:.2f}x (static: Keras Adam, which updates every row)", flush=True)
    print(json.dumps({"benchmark": "train_step", "batch_size": args.batch_size,
                      "steps": args.steps, "warmup": args.warmup,
                      "backend": type(kv_creator).__name__, "results": results}))
    return 0


def _kv_creator(backend):
    if backend == "builtin":
        return de.BuiltinKVCreator()
    if backend == "native":
        from tfra_dynamic_embedding.tables import native  # pylint: disable=import-outside-toplevel
        if not native.is_available():
            raise SystemExit("--backend native: the native op library is not available")
        return native.NativeKVCreator()
    from tfra_dynamic_embedding import tables  # pylint: disable=import-outside-toplevel
    return tables.default_kv_creator()


if __name__ == "__main__":
    sys.exit(main())
