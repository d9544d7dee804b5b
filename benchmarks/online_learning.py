"""Online learning on the public path: a capacity-bounded table under an endless id stream,
admission filters on the demo's data, and delta exports.

    python benchmarks/online_learning.py [--quick] [--unique 30000000] [--capacity 1000000]
                                         [--dims 16 64]

1. Capacity streams, one per `--dims` row length, each in a process of its own. A `de.Variable`
   (native backend, `de.Eviction(max_size=capacity)`) trained by
   `de.DynamicEmbeddingOptimizer(keras Adagrad)` on batches that are half ids never seen (a
   counter: `--unique` of them in all) and half Zipf(1.1) draws over the ids seen so far (hot
   ids come back). After every step the table size is read: `peak_keys` must not exceed
   `capacity_keys`. Peak RSS (VmHWM, read before the first export) less the process baseline
   (VmRSS after a warm-up step) is set against the bound's bytes: capacity x (8-byte key + row +
   Adagrad slot row), and so are the bytes the table itself holds then (`memory_parts()`:
   records, the rows they hold, the hash index, the rest; together `memory_bytes()`).
   `step_peak_mb`: how far the warm-up step, run again on its own (held) keys, peaks above the
   RSS it leaves: the step's own buffers, which the growth includes. Per-key costs that do not
   grow with the row (the stamp and count, the index slot) weigh more at a short row, so the
   streams run at two row lengths.
2. Delta exports. Over the last `--export-share` of each stream, every `--interval` steps an
   `online.delta.DeltaExporter` writes an export (the first full); each delta's bytes are set
   against a full export of the table as it is then. At the end all exports are replayed into a
   fresh built-in variable, which must equal the trained table exactly (`delta_roundtrip_exact`).
3. Admission. The demo's DLRM (embedding_dim: the first of `--dims`) on its synthetic Criteo
   data (`--rows`), trained one epoch with no admission, `de.CountAdmission(2)` and
   `de.CountAdmission(3)`: table sizes and held-out AUC.

The last line printed is one JSON object: the first stream's fields (`capacity_keys`,
`peak_rss_over_bound`, ...), `peak_keys` (the largest over the streams),
`delta_roundtrip_exact` (all streams), `memory_goal_met` per dim, every stream under `streams`,
and `admission`. `--quick` streams 4M unique ids (batches of 16,384) into a 400k bound and uses
40k demo rows (about two minutes on 2 cores).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tensorflow_recommenders_addons.dynamic_embedding as de  # noqa: E402
from tfra_dynamic_embedding.demo import criteo, dlrm  # noqa: E402
from tfra_dynamic_embedding.online import delta  # noqa: E402


def proc_status(field):
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0   # MiB
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak_rss():
    """Sets VmHWM to the current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def id_stream(rng, unique, batch):
    """Batches (unique int64 ids): half never seen, half Zipf(1.1) over the ids seen so far."""
    fresh_per_batch = batch // 2
    seen = 0
    while seen < unique:
        fresh = np.arange(seen, min(seen + fresh_per_batch, unique), dtype=np.int64)
        seen += len(fresh)
        ranks = rng.zipf(1.1, size=batch - len(fresh))
        again = (ranks[ranks <= seen] - 1).astype(np.int64)
        # Ids are scrambled so that hot ids are not the low ones (partition-neutral).
        yield np.unique(np.concatenate([fresh, again]) * 2654435761 % (2 ** 61 - 1)), seen


def capacity_stream(args, work):
    dim = args.dim
    var = de.Variable(dim=dim, initializer=tf.keras.initializers.RandomNormal(0, 0.01),
                      kv_creator=de.NativeKVCreator(), name="stream",
                      eviction=de.Eviction(max_size=args.capacity, order=args.order))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.05))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def step(ids):
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(var, ids, return_trainable=True, name="lookup")
            target = tf.cast(tf.reshape(ids % 7, [-1, 1]), tf.float32) / 7.0
            loss = tf.reduce_mean(tf.square(rows - target))
        opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
        return loss

    warm_ids = tf.constant(np.arange(-args.batch, 0, dtype=np.int64))
    step(warm_ids)   # warm-up: traced, slots made
    # What a step itself takes at its peak, above the RSS it leaves: the same step again, its
    # keys all held now (the table does not grow).
    resting, step_peak = proc_status("VmRSS"), None
    if reset_peak_rss():
        step(warm_ids)
        step_peak = proc_status("VmHWM") - resting
    var.clear()
    for slot in var.get_slot_variables(opt):
        slot.clear()
    baseline = proc_status("VmRSS")
    reset_peak_rss()   # the peak read below is the stream's
    exporter = delta.DeltaExporter([var], os.path.join(work, "deltas"))
    rng = np.random.default_rng(args.seed)
    peak_keys, steps, exports, began = 0, 0, [], time.perf_counter()
    streamed = 0
    # The capacity stream proper, then (its RSS peak read first) the same stream continued
    # with a delta export every `interval` steps: an export's own copies are not the bound's.
    stream = id_stream(rng, args.unique, args.batch)
    hwm = None
    for ids, seen in stream:
        step(tf.constant(ids))
        steps += 1
        streamed = seen
        peak_keys = max(peak_keys, int(var.size()))
        if args.trace_rss and steps % 20 == 0:
            print(f"step {steps}: {int(var.size()):,} keys, RSS {proc_status('VmRSS'):.0f} MiB",
                  flush=True)
        if hwm is None and seen >= args.unique * (1 - args.export_share):
            hwm = proc_status("VmHWM")
            parts = [{k: int(v) for k, v in t.kv_table.memory_parts().items()}
                     for t in var.tables]
            table_mb = sum(p["records"] + p["index"] + p["other"] for p in parts) / 2 ** 20
            rows_made = sum(p["rows"] for p in parts)
            record_bytes = sum(p["records"] for p in parts) // max(1, rows_made)
            index_mb = sum(p["index"] for p in parts) / 2 ** 20
            seconds = time.perf_counter() - began
            ids_trained = steps * args.batch
        if hwm is not None and steps % args.interval == 0:
            exports.append(_export(exporter, var))
    exports.append(_export(exporter, var))

    replayed = de.Variable(dim=dim, name="stream", kv_creator=de.BuiltinKVCreator())
    delta.replay(os.path.join(work, "deltas"), [replayed])
    exact = _same_content(var, replayed)

    row_bytes = 8 + 2 * 4 * dim     # key + row + Adagrad accumulator row
    bound_mb = args.capacity * row_bytes / 2 ** 20
    return {
        "capacity_keys": args.capacity, "peak_keys": peak_keys, "final_keys": int(var.size()),
        "unique_ids": streamed, "steps": steps, "batch": args.batch, "dim": dim,
        "ids_per_s": round(ids_trained / seconds), "stream_seconds": round(seconds, 1),
        "baseline_rss_mb": round(baseline, 1), "peak_rss_mb": round(hwm, 1),
        "bound_mb": round(bound_mb, 1),
        "peak_rss_over_bound": round((hwm - baseline) / bound_mb, 3),
        "table_mb": round(table_mb, 1), "table_over_bound": round(table_mb / bound_mb, 3),
        "step_peak_mb": None if step_peak is None else round(step_peak, 1),
        "table_rows_made": rows_made, "table_record_bytes": record_bytes,
        "raw_key_bytes": row_bytes, "table_index_mb": round(index_mb, 1),
        "delta_roundtrip_exact": exact, "exports": exports,
        "delta_over_full": [e["over_full"] for e in exports[1:]],
    }


def _export(exporter, var):
    """One export, with its bytes over those of a full export of the table as it is now (the
    first export's bytes per row times the rows held)."""
    info = exporter.export()
    if info.full:
        exporter.bytes_per_row = info.bytes / max(1, info.upserts)
    return {"sequence": info.sequence, "full": info.full, "upserts": info.upserts,
            "removals": info.removals, "bytes": info.bytes,
            "over_full": round(info.bytes / (exporter.bytes_per_row * int(var.size())), 3)}


def _same_content(a, b):
    (ka, va), (kb, vb) = (tuple(t.numpy() for t in v.export()) for v in (a, b))
    oa, ob = np.argsort(ka), np.argsort(kb)
    return bool(np.array_equal(ka[oa], kb[ob]) and np.array_equal(va[oa], vb[ob]))


def admission_runs(args, work):
    path = os.path.join(work, "criteo.tsv")
    criteo.generate(path, args.rows, seed=args.seed)
    num_eval = args.rows // 10
    num_train = args.rows - num_eval
    results = {}
    for k in (1, 2, 3):
        tf.keras.utils.set_random_seed(args.seed)
        admission = None if k == 1 else de.CountAdmission(k)
        model = dlrm.DLRM(embedding_dim=args.dim, admission=admission)
        model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.002)),
                      loss=keras.losses.BinaryCrossentropy(),
                      metrics=[keras.metrics.AUC(name="auc", num_thresholds=1000)])
        train = criteo.read_tsv(path, 512, take=num_train, shuffle_buffer=num_train,
                                seed=args.seed)
        began = time.perf_counter()
        model.fit(train, epochs=1, verbose=0)
        seconds = time.perf_counter() - began
        metrics = model.evaluate(criteo.read_tsv(path, 4096, skip=num_train, take=num_eval),
                                 return_dict=True, verbose=0)
        results["none" if k == 1 else f"k{k}"] = {
            "keys": int(sum(model.table_sizes().values())), "auc": round(float(metrics["auc"]), 4),
            "log_loss": round(float(metrics["loss"]), 4), "train_seconds": round(seconds, 1)}
    return results


def run_stream_process(args, dim):
    """One capacity stream in a process of its own (its baseline and peak RSS are its own);
    returns the stream's JSON."""
    cmd = [sys.executable, os.path.abspath(__file__), "--stream-only", "--dims", str(dim),
           "--unique", str(args.unique), "--capacity", str(args.capacity),
           "--batch", str(args.batch), "--order", args.order, "--interval", str(args.interval),
           "--export-share", str(args.export_share), "--seed", str(args.seed)]
    if args.trace_rss:
        cmd.append("--trace-rss")
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=3600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode not in (0, 1) or not lines:
        raise RuntimeError(f"the dim-{dim} stream failed ({done.returncode}):\n{done.stderr[-3000:]}")
    if args.trace_rss:
        print(done.stdout, end="")
    return json.loads(lines[-1])


def stream_ok(stream, args):
    """The bound held and the exports replayed exactly."""
    return stream["peak_keys"] <= args.capacity and stream["delta_roundtrip_exact"]


def print_stream(stream, args):
    dim = stream["dim"]
    print(f"capacity stream, dim {dim}: {stream['unique_ids']:,} unique ids in {stream['steps']} "
          f"steps of {args.batch:,} ({stream['ids_per_s']:,} ids/s), bound {args.capacity:,} "
          f"keys ({args.order}): peak {stream['peak_keys']:,} keys -> "
          f"{'met' if stream['peak_keys'] <= args.capacity else 'NOT met'}")
    print(f"  peak RSS {stream['peak_rss_mb']:.0f} MiB = baseline {stream['baseline_rss_mb']:.0f} + "
          f"{stream['peak_rss_mb'] - stream['baseline_rss_mb']:.0f} MiB = "
          f"{stream['peak_rss_over_bound']:.2f} x the bound's {stream['bound_mb']:.0f} MiB "
          f"(goal: growth <= 1.1 x the bound: "
          f"{'met' if stream['peak_rss_over_bound'] <= 1.1 else 'NOT met'}; peak / (bound + "
          f"baseline) = {stream['peak_rss_mb'] / (stream['bound_mb'] + stream['baseline_rss_mb']):.3f})")
    print(f"  of which the table holds {stream['table_mb']:.0f} MiB = "
          f"{stream['table_over_bound']:.2f} x the bound: {stream['table_rows_made']:,} records "
          f"of {stream['table_record_bytes']} bytes (key, stamp and count, row, slot row; "
          f"{stream['raw_key_bytes']} raw) = "
          f"{stream['table_rows_made'] / args.capacity:.3f} x the bound's keys, and an index of "
          f"{stream['table_index_mb']:.1f} MiB ({stream['table_index_mb'] / stream['bound_mb']:.1%} "
          f"of the bound); the rest, "
          f"{stream['peak_rss_mb'] - stream['baseline_rss_mb'] - stream['table_mb']:.0f} MiB, is the "
          f"training step's buffers and the allocator's (a step that writes only keys the table "
          f"holds peaks {stream['step_peak_mb']} MiB over the RSS it leaves)")
    ratios = stream["delta_over_full"]
    print(f"  exports every {args.interval} steps: {len(ratios)} deltas, bytes / a full export's "
          f"median {np.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}); "
          f"full + deltas replayed == trained: {stream['delta_roundtrip_exact']}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4M ids, 400k bound, 40k rows")
    parser.add_argument("--unique", type=int, default=30_000_000)
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 64],
                        help="row lengths of the capacity streams; the first is also the "
                             "admission runs' embedding_dim")
    parser.add_argument("--order", choices=("lru", "lfu"), default="lru")
    parser.add_argument("--interval", type=int, default=5, help="steps between exports")
    parser.add_argument("--export-share", type=float, default=0.25,
                        help="the last share of the unique ids streams with delta exports")
    parser.add_argument("--rows", type=int, default=200_000, help="demo rows for admission")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace-rss", action="store_true", help="print RSS every 20 steps")
    parser.add_argument("--stream-only", action="store_true",
                        help="run the capacity stream of the first of --dims here, print its JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.unique, args.capacity, args.batch = 4_000_000, 400_000, 16_384
        args.interval, args.rows = 5, 40_000
    args.dim = args.dims[0]
    if args.stream_only:
        with tempfile.TemporaryDirectory(prefix="tfra_de_online_") as work:
            stream = capacity_stream(args, work)
        print(json.dumps(stream))
        return 0 if stream_ok(stream, args) else 1
    began = time.perf_counter()
    streams = [run_stream_process(args, dim) for dim in args.dims]
    with tempfile.TemporaryDirectory(prefix="tfra_de_online_") as work:
        admission = admission_runs(args, work)
    for stream in streams:
        print_stream(stream, args)
    for name, r in admission.items():
        print(f"admission {name:>4} (dim {args.dim}): {r['keys']:>9,} keys, held-out AUC "
              f"{r['auc']:.4f}, log loss {r['log_loss']:.4f}")
    print(f"wall time {time.perf_counter() - began:.0f} s")
    first = streams[0]
    print(json.dumps({
        **first,
        "peak_keys": max(s["peak_keys"] for s in streams),
        "delta_roundtrip_exact": all(s["delta_roundtrip_exact"] for s in streams),
        "memory_goal_met": {str(s["dim"]): s["peak_rss_over_bound"] <= 1.1 for s in streams},
        "streams": streams, "admission": admission, "quick": args.quick,
        "benchmark": "online_learning"}))
    return 0 if all(stream_ok(s, args) for s in streams) else 1


if __name__ == "__main__":
    sys.exit(main())
