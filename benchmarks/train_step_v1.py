"""TF1 (graph, `tf.compat.v1.Session`) training-step speed of TFRA's published setup, runnable on
this package and on TFRA itself, with static-embedding baselines in the same run.

The setup: 26 tables x dim 16, batch 4096, one Zipf(1.2) id per table per example, MLP
256-128-1 on the concatenated embeddings, binary cross-entropy, `tf.compat.v1.train.AdamOptimizer`
(1e-3). The dynamic variant is TFRA user code as written for TFRA (`de.get_variable`,
`de.embedding_lookup`, `de.DynamicEmbeddingOptimizer`); it imports
`tensorflow_recommenders_addons.dynamic_embedding`, so the same script measures TFRA when run
with a Python environment that has TFRA installed instead of this package:

    python benchmarks/train_step_v1.py                       # this package
    /path/to/tfra-env/bin/python benchmarks/train_step_v1.py # TFRA (e.g. 0.8.1 on TF 2.16)

Variants (each its own graph and session; they take turns step by step, so a change of the
machine's load hits all alike):
  de            dynamic embeddings, raw int64 ids (new ids keep arriving: batches never repeat)
  static-lazy   one dense tf.Variable per table (ids mapped to [0, vocab) beforehand, vocab = the
                distinct ids of all batches, the best case for a static table), Adam updating
                only the batch's rows and their slots (lazy, as dynamic embeddings do)
  static-dense  the same tables with v1 Adam's own sparse update (m and v decay in every row)

`--profile` traces 5 more steps of each variant (RunOptions FULL_TRACE) and prints the mean time
per step of each op type, summed over the step's ops (ops run in parallel, so the sum exceeds
the wall time).
Prints a table and one JSON line last. Never fails on speed; compare the ratios of one run.
"""

import argparse
import collections
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

TABLES, DIM, HIDDEN = 26, 16, (256, 128)
VARIANTS = ("de", "static-lazy", "static-dense")
PROFILE_STEPS = 5


def make_batches(num_batches, batch_size, seed, exponent=1.2):
    """[num_batches] of (ids [batch, TABLES] int64 spread over the int64 range, labels)."""
    rng = np.random.default_rng(seed)
    ids = rng.zipf(exponent, size=(num_batches, batch_size, TABLES)).astype(np.int64)
    ids = ids * np.int64(0x9E3779B97F4A7C15 - 2**64) + np.arange(TABLES, dtype=np.int64)
    labels = rng.integers(0, 2, size=(num_batches, batch_size)).astype(np.float32)
    return ids, labels


def to_static(ids):
    """Every table's ids mapped to [0, vocab) over all batches; (mapped, vocab sizes)."""
    mapped = np.empty_like(ids)
    vocab = []
    for t in range(TABLES):
        distinct, index = np.unique(ids[..., t], return_inverse=True)
        mapped[..., t] = index.reshape(ids[..., t].shape)
        vocab.append(len(distinct))
    return mapped, vocab


class LazyAdam(tf.compat.v1.train.AdamOptimizer):
    """v1 Adam whose sparse update touches only the gradient's rows (m, v and the variable),
    as LazyAdam implementations and dynamic embeddings do."""

    def _resource_apply_sparse(self, grad, var, indices):
        beta1_power, beta2_power = self._get_beta_accumulators()
        b1 = tf.cast(self._beta1_t, grad.dtype)
        b2 = tf.cast(self._beta2_t, grad.dtype)
        lr = (tf.cast(self._lr_t, grad.dtype) * tf.sqrt(1 - tf.cast(beta2_power, grad.dtype))
              / (1 - tf.cast(beta1_power, grad.dtype)))
        eps = tf.cast(self._epsilon_t, grad.dtype)
        m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
        m_rows = b1 * tf.gather(m, indices) + (1 - b1) * grad
        v_rows = b2 * tf.gather(v, indices) + (1 - b2) * grad * grad
        return tf.group(
            m.scatter_update(tf.IndexedSlices(m_rows, indices)),
            v.scatter_update(tf.IndexedSlices(v_rows, indices)),
            var.scatter_sub(tf.IndexedSlices(lr * m_rows / (tf.sqrt(v_rows) + eps), indices)))


def build(variant, vocab):
    """(graph, session, ids placeholder, labels placeholder, train op, loss, table_rows fn)."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        ids = tf.compat.v1.placeholder(tf.int64, [None, TABLES], name="ids")
        labels = tf.compat.v1.placeholder(tf.float32, [None], name="labels")
        init = tf.random_normal_initializer(0.0, 0.01)
        embs, tables = [], []
        for t in range(TABLES):
            if variant == "de":
                import tensorflow_recommenders_addons.dynamic_embedding as de  # pylint: disable=import-outside-toplevel
                table = de.get_variable(f"emb{t}", key_dtype=tf.int64, value_dtype=tf.float32,
                                        dim=DIM, initializer=init)
                embs.append(de.embedding_lookup(table, ids[:, t], name=f"lookup{t}"))
            else:
                table = tf.compat.v1.get_variable(f"emb{t}", [vocab[t], DIM], tf.float32, init,
                                                  use_resource=True)
                embs.append(tf.nn.embedding_lookup(table, ids[:, t]))
            tables.append(table)
        x = tf.concat(embs, axis=1)
        widths = (TABLES * DIM,) + HIDDEN + (1,)
        glorot = tf.compat.v1.glorot_uniform_initializer(seed=1)
        for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
            w = tf.compat.v1.get_variable(f"w{i}", [n_in, n_out], initializer=glorot,
                                          use_resource=True)
            b = tf.compat.v1.get_variable(f"b{i}", [n_out], initializer=tf.zeros_initializer(),
                                          use_resource=True)
            x = tf.matmul(x, w) + b
            if i < len(HIDDEN):
                x = tf.nn.relu(x)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=x[:, 0]))
        if variant == "static-lazy":
            opt = LazyAdam(1e-3)
        else:
            opt = tf.compat.v1.train.AdamOptimizer(1e-3)
            if variant == "de":
                opt = de.DynamicEmbeddingOptimizer(opt)
        train = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        session = tf.compat.v1.Session(graph=graph)
        session.run(tf.compat.v1.global_variables_initializer())
        if variant == "de":
            sizes = tf.add_n([tf.cast(t.size(), tf.int64) for t in tables])
            rows = lambda: int(session.run(sizes))  # noqa: E731
        else:
            rows = lambda: sum(vocab)  # noqa: E731
    return session, ids, labels, train, loss, rows


def profile(session, feeds, fetches):
    """{op type: summed microseconds} of one traced run."""
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    metadata = tf.compat.v1.RunMetadata()
    session.run(fetches, feeds, options=options, run_metadata=metadata)
    types = {op.name: op.type for op in session.graph.get_operations()}
    per_type = collections.Counter()
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            name = node.node_name.split(":")[0]
            op_type = types.get(name)
            if op_type is None:   # _SOURCE, _Recv/_Send and other runtime nodes
                op_type = node.timeline_label.split("(")[0].split("= ")[-1] or name
            per_type[op_type] += node.all_end_rel_micros
    return per_type


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (>= 1)")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated: " + ",".join(VARIANTS))
    parser.add_argument("--profile", action="store_true", help="print time per op type")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in VARIANTS for v in variants):
        parser.error(f"--variants must name some of {list(VARIANTS)}; got {args.variants!r}")
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")
    tf.compat.v1.disable_eager_execution()

    num_batches = args.warmup + args.steps + (PROFILE_STEPS if args.profile else 0)
    raw_ids, labels = make_batches(num_batches, args.batch_size, args.seed)
    static_ids, vocab = to_static(raw_ids)
    package = "none"
    if "de" in variants:
        import tensorflow_recommenders_addons as tfra  # pylint: disable=import-outside-toplevel
        package = getattr(tfra, "__version__", None) or "tfra_dynamic_embedding"
    built = {v: build(v, vocab) for v in variants}
    times = {v: [] for v in variants}
    for i in range(args.warmup + args.steps):
        for variant in variants:
            session, ids, label, train, loss, _ = built[variant]
            feeds = {ids: raw_ids[i] if variant == "de" else static_ids[i], label: labels[i]}
            began = time.perf_counter()
            value = session.run([train, loss], feeds)[1]
            times[variant].append(time.perf_counter() - began)
            if not np.isfinite(value):
                raise RuntimeError(f"{variant}: loss became {value}")

    print(f"TF1 train step (TFRA setup: {TABLES} tables x dim {DIM}, MLP "
          f"{'-'.join(map(str, HIDDEN))}-1, v1 Adam), batch {args.batch_size}, {args.steps} "
          f"timed steps after {args.warmup}; package {package}; TF {tf.__version__}, "
          f"{os.cpu_count()} CPUs")
    header = f"{'variant':13} {'ms/step (p10-p90)':>24} {'examples/s':>11} {'table rows':>11}"
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
               "table_rows": built[variant][5]()}
        results.append(row)
        spread = f"{row['ms_per_step']:.1f} ({row['ms_p10']:.1f}-{row['ms_p90']:.1f})"
        print(f"{variant:13} {spread:>24} {row['examples_per_s']:>11,} {row['table_rows']:>11,}")
    by_name = {r["variant"]: r["ms_per_step"] for r in results}
    if "de" in by_name and "static-lazy" in by_name:
        print(f"de / static-lazy = {by_name['de'] / by_name['static-lazy']:.2f}x")
    profiles = {}
    if args.profile:
        for variant in variants:
            session, ids, label, train, loss, _ = built[variant]
            per_type = collections.Counter()
            for i in range(num_batches - PROFILE_STEPS, num_batches):
                feeds = {ids: raw_ids[i] if variant == "de" else static_ids[i], label: labels[i]}
                per_type.update(profile(session, feeds, [train, loss]))
            per_type = collections.Counter({k: v / PROFILE_STEPS for k, v in per_type.items()})
            total = sum(per_type.values())
            profiles[variant] = {k: round(v / 1e3, 2) for k, v in per_type.most_common()}
            print(f"\n{variant}: op time by type (summed over ops: {total / 1e3:.1f} ms)")
            for op_type, micros in per_type.most_common(15):
                print(f"  {op_type:34} {micros / 1e3:8.2f} ms {100 * micros / total:5.1f}%")
    print(json.dumps({"benchmark": "train_step_v1", "package": package,
                      "tf": tf.__version__, "batch_size": args.batch_size,
                      "steps": args.steps, "results": results, "profile_ms": profiles}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
