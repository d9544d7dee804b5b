"""Key-value op throughput and memory: native tables vs TF's MutableHashTable vs dense tf.gather.

A table is pre-filled with `--keys` random int64 keys; each timed batch holds `--batch` keys, half
present and half missing (fresh keys per repeat, so upserts really insert).
Headline, per dim: the public path a user writes, `de.Variable.lookup` of a variable made with
`initializer=tf.random_normal_initializer(0, 0.01)` (default backend; unseeded, and seeded), beside
TF's MutableHashTable (LookupTableFindV2 with an [N, dim] tf.random.normal default, as TFRA does)
and dense `tf.gather` of a batch of the same size from a same-size tf.Variable, with the ratios;
the four are timed interleaved (one call each per round) so they see the same machine.
Rows of the table below, per dim (the internal table API):
  lookup+init     rows for every key, missing keys get random-normal initial rows, no insert
                  (native: drawn in C++ for the missing keys only; built-in: LookupTableFindV2
                  with an [N, dim] tf.random.normal default, as TFRA does)
  lookup present  all keys present (dense: tf.gather on a same-size tf.Variable)
  upsert          insert/overwrite [N, dim] rows (dense: scatter_update)
  find_or_insert  rows, inserting missing keys with random-normal rows (built-in: find with
                  random defaults, then insert the batch)
Memory (`--memory`): resident and peak bytes/key after inserting 1M and 4M keys of dim 64, each
in a fresh process, and (native) the bytes the table itself holds (`memory_bytes()`); then the
same as a user measures it (`de.Variable.upsert` of numpy-made batches), split into the table,
glibc's heap and the rest, and after `malloc_trim`. Also the bandwidth of a first touch of fresh
memory (what new rows cost before their bytes are written).
Prints a table, then one JSON line. Timings are medians of `--repeats`.

    python benchmarks/kv_ops.py [--keys 1000000] [--batch 65536] [--dims 8 64] [--memory]
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tensorflow_recommenders_addons.dynamic_embedding as de  # noqa: E402
from tfra_dynamic_embedding.tables import native  # noqa: E402

FILL_BATCH = 65536


def median_time(fn, repeats, warmup=2):
    """Median seconds of fn(1..repeats) after `warmup` calls. Python's garbage collector is off
    while timing (as in `timeit`): with TensorFlow loaded a full collection walks millions of
    objects and would land inside some ops' times (measured: ~20% of the process's samples)."""
    for _ in range(warmup):
        fn(0)
    times = []
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            start = time.perf_counter()
            fn(r + 1)
            times.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return float(np.median(times))


def random_keys(rng, n):
    return rng.integers(1, 2**63 - 1, size=n, dtype=np.int64)


def run_dim(dim, n_keys, batch, repeats, backends):
    rng = np.random.default_rng(dim)
    present = random_keys(rng, n_keys)
    half = batch // 2

    def mixed_batches():
        # One batch per timed call (and warmup), each drawn afresh: random keys touch cold rows,
        # as in training, and an upsert or find_or_insert really inserts its missing half.
        return [tf.constant(rng.permutation(np.concatenate(
            [rng.choice(present, half), random_keys(rng, batch - half)]))) for _ in range(repeats + 2)]

    batches = {op: mixed_batches() for op in ("lookup+init", "lookup+init (TF draws)", "upsert",
                                              "find_or_insert")}
    present_batches = [tf.constant(rng.choice(present, batch)) for _ in range(repeats + 2)]
    dense_idx = [tf.constant(rng.integers(0, n_keys, batch), tf.int32) for _ in range(repeats + 2)]
    values = tf.random.normal([batch, dim], 0, 0.01)
    results = {}

    if "native" in backends:
        table = native.NativeKVTable(tf.int64, tf.float32, dim, f"bench{dim}")
        for i in range(0, n_keys, FILL_BATCH):
            chunk = tf.constant(present[i:i + FILL_BATCH])
            table.insert(chunk, tf.zeros([chunk.shape[0], dim]))
        init = native.NativeInitializer("normal", 0.0, 0.01, seed=1)
        spec = [tf.TensorSpec([None], tf.int64)]
        lookup_init = tf.function(lambda k: table.lookup_or_init(k, init)[0], input_signature=spec)
        lookup_tf_init = tf.function(
            lambda k: table.lookup_or_init(
                k, lambda ks: tf.random.normal(tf.stack([tf.size(ks), dim]), 0, .01))[0],
            input_signature=spec)
        lookup = tf.function(lambda k: table.lookup(k, tf.zeros([dim])), input_signature=spec)
        upsert = tf.function(lambda k: [table.insert(k, values)] and None, input_signature=spec)
        foi = tf.function(lambda k: table.find_or_insert(k, init)[0], input_signature=spec)
        results["native"] = {
            "lookup+init": median_time(lambda r: lookup_init(batches["lookup+init"][r]), repeats),
            "lookup+init (TF draws)": median_time(
                lambda r: lookup_tf_init(batches["lookup+init (TF draws)"][r]), repeats),
            "lookup present": median_time(lambda r: lookup(present_batches[r]), repeats),
            "upsert": median_time(lambda r: upsert(batches["upsert"][r]), repeats),
            "find_or_insert": median_time(lambda r: foi(batches["find_or_insert"][r]), repeats),
        }
        del table

    if "builtin" in backends:
        table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, tf.zeros([dim]))
        for i in range(0, n_keys, FILL_BATCH):
            chunk = tf.constant(present[i:i + FILL_BATCH])
            table.insert(chunk, tf.zeros([chunk.shape[0], dim]))
        handle = table.resource_handle
        spec = [tf.TensorSpec([None], tf.int64)]

        def find(k, default):
            return tf.raw_ops.LookupTableFindV2(table_handle=handle, keys=k, default_value=default)

        def draw(k):
            return tf.random.normal(tf.stack([tf.size(k), dim]), 0, 0.01)

        def find_or_insert(k):
            rows = find(k, draw(k))
            with tf.control_dependencies([table.insert(k, rows)]):
                return tf.identity(rows)

        lookup_init = tf.function(lambda k: find(k, draw(k)), input_signature=spec)
        lookup = tf.function(lambda k: find(k, tf.zeros(tf.stack([tf.size(k), dim]))),
                             input_signature=spec)
        upsert = tf.function(lambda k: [table.insert(k, values)] and None, input_signature=spec)
        foi = tf.function(find_or_insert, input_signature=spec)
        results["builtin"] = {
            "lookup+init": median_time(lambda r: lookup_init(batches["lookup+init"][r]), repeats),
            "lookup present": median_time(lambda r: lookup(present_batches[r]), repeats),
            "upsert": median_time(lambda r: upsert(batches["upsert"][r]), repeats),
            "find_or_insert": median_time(lambda r: foi(batches["find_or_insert"][r]), repeats),
        }
        del table

    if "dense" in backends:
        var = tf.Variable(tf.zeros([n_keys, dim]))
        gather = tf.function(lambda i: tf.gather(var, i))
        scatter = tf.function(lambda i: [var.scatter_update(tf.IndexedSlices(values, i))] and None)
        results["dense"] = {
            "lookup present": median_time(lambda r: gather(dense_idx[r]), repeats),
            "upsert": median_time(lambda r: scatter(dense_idx[r]), repeats),
        }
        del var
    return {b: {op: batch / t / 1e6 for op, t in ops.items()} for b, ops in results.items()}


HEADLINE = ("public", "public seeded", "MutableHashTable", "tf.gather")


def run_headline(dim, n_keys, batch, repeats):
    """M keys/s of the public path and its baselines, timed interleaved (one call of each per
    round, medians over the rounds) so that all four see the same machine: de.Variable.lookup
    with tf.random_normal_initializer(0, 0.01) unseeded and seeded (default backend), TF's
    MutableHashTable find with an [N, dim] tf.random.normal default, dense tf.gather."""
    rng = np.random.default_rng(1000 + dim)
    present = random_keys(rng, n_keys)
    half = batch // 2
    spec = [tf.TensorSpec([None], tf.int64)]
    fns = {}
    for label, seed in (("public", None), ("public seeded", 1)):
        # de.Variable, as de.get_variable makes it (that one keeps it in its store, alive).
        var = de.Variable(dim=dim, name=f"bench_public{dim}_{seed}",
                          initializer=tf.random_normal_initializer(0.0, 0.01, seed=seed))
        for i in range(0, n_keys, FILL_BATCH):
            chunk = tf.constant(present[i:i + FILL_BATCH])
            var.upsert(chunk, tf.zeros([chunk.shape[0], dim]))
        fns[label] = tf.function(lambda k, var=var: var.lookup(k), input_signature=spec)
    table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, tf.zeros([dim]))
    for i in range(0, n_keys, FILL_BATCH):
        chunk = tf.constant(present[i:i + FILL_BATCH])
        table.insert(chunk, tf.zeros([chunk.shape[0], dim]))
    fns["MutableHashTable"] = tf.function(
        lambda k: tf.raw_ops.LookupTableFindV2(
            table_handle=table.resource_handle, keys=k,
            default_value=tf.random.normal(tf.stack([tf.size(k), dim]), 0, 0.01)),
        input_signature=spec)
    dense = tf.Variable(tf.zeros([n_keys, dim]))
    fns["tf.gather"] = tf.function(lambda i: tf.gather(dense, i))

    def batches(label):
        if label == "tf.gather":   # the same number of rows, all present
            return [tf.constant(rng.integers(0, n_keys, batch), tf.int32)
                    for _ in range(repeats + 2)]
        return [tf.constant(rng.permutation(np.concatenate(
            [rng.choice(present, half), random_keys(rng, batch - half)])))
            for _ in range(repeats + 2)]

    inputs = {label: batches(label) for label in HEADLINE}
    times = {label: [] for label in HEADLINE}
    for label in HEADLINE:   # warm up (traces)
        fns[label](inputs[label][0])
        fns[label](inputs[label][1])
    gc.collect()
    gc.disable()
    try:
        for r in range(2, repeats + 2):
            for label in HEADLINE:
                start = time.perf_counter()
                fns[label](inputs[label][r])
                times[label].append(time.perf_counter() - start)
    finally:
        gc.enable()
    return {label: batch / float(np.median(t)) / 1e6 for label, t in times.items()}


MEMORY_CHILD = r'''
import os, sys, json, threading, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np, tensorflow as tf
sys.path.insert(0, sys.argv[3])
from tfra_dynamic_embedding.tables import native

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

n, backend, dim = int(sys.argv[1]), sys.argv[2], 64
if backend == "native":
    t = native.NativeKVTable(tf.int64, tf.float32, dim, "mem")
else:
    t = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, tf.zeros([dim]))
values = tf.zeros([65536, dim])
t.insert(tf.constant([-1], tf.int64), values[:1])  # warm up the op path
base = rss()
peak = [base]
stop = threading.Event()
def sample():  # the peak is sampled (1 ms) so the interpreter's start-up peak is excluded
    while not stop.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.001)
th = threading.Thread(target=sample); th.start()
rng = np.random.default_rng(0)
for i in range(0, n, 65536):
    m = min(65536, n - i)
    t.insert(tf.constant(rng.integers(1, 2**63 - 1, m, dtype=np.int64)), values[:m])
stop.set(); th.join()
end = rss()
print(json.dumps({"keys": int(t.size()) - 1, "resident": (end - base) / n,
                  "peak": (max(peak[0], end) - base) / n,
                  "table": int(t.memory_bytes()) / n if backend == "native" else None}))
'''


# Memory as a user measures it: a fresh process, a de.Variable with a TF initializer,
# `upsert` of batches made on the fly from numpy, RSS after minus RSS right after creating the
# variable. Split by /proc/self/smaps: the table's own bytes (memory_bytes()), growth of glibc's
# main heap (numpy's and TF's freed batch buffers it keeps) and the rest (other mappings: TF's
# allocator pool holding a batch tensor, code pages faulted in, thread stacks). With argv[3] ==
# "batches" the loop makes the same batches and writes none of them: what the user's own batches
# leave in the allocators, beside the table.
USER_MEMORY_CHILD = r'''
import os, sys, json, ctypes
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np, tensorflow as tf
sys.path.insert(0, sys.argv[2])
import tensorflow_recommenders_addons.dynamic_embedding as de

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def heap():
    total, in_heap = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if fields and "-" in fields[0] and not fields[0].endswith(":"):
                in_heap = fields[-1] == "[heap]"
            elif in_heap and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total

n, dim, batch = int(sys.argv[1]), 64, 65536
var = de.Variable(dim=dim, name="user_mem", initializer=tf.random_normal_initializer(0, 0.01))
base, base_heap = rss(), heap()
rng = np.random.default_rng(0)
write = sys.argv[3] != "batches"
for i in range(0, n, batch):
    m = min(batch, n - i)
    keys = tf.constant(rng.integers(1, 2**63 - 1, m, dtype=np.int64))
    values = tf.constant(rng.standard_normal((m, dim)).astype(np.float32))
    if write:
        var.upsert(keys, values)
    del keys, values
end, end_heap = rss(), heap()
table = sum(int(t.kv_table.memory_bytes()) for t in var.tables) if hasattr(
    var.tables[0], "kv_table") else None
ctypes.CDLL("libc.so.6").malloc_trim(0)
print(json.dumps({"keys": int(var.size()), "resident": (end - base) / n,
                  "heap": (end_heap - base_heap) / n,
                  "table": table / n if table is not None else None,
                  "after_trim": (rss() - base) / n}))
'''


TOUCH_CHILD = r'''
import json, time, numpy as np
start = time.perf_counter(); a = np.ones(1 << 25); first = time.perf_counter() - start
start = time.perf_counter(); a[:] = 2.0; again = time.perf_counter() - start
print(json.dumps({"first_touch_gbps": a.nbytes / first / 1e9,
                  "rewrite_gbps": a.nbytes / again / 1e9}))
'''


def touch_bandwidth():
    """GB/s of writing 256 MiB of fresh memory in a new process, then rewriting it. Inserts put
    new rows on fresh pages, so a slow first touch (a VM whose host backs guest pages lazily:
    measured 0.35-2.6 GB/s against 13-26 for a rewrite) caps upsert / find_or_insert."""
    out = subprocess.run([sys.executable, "-c", TOUCH_CHILD], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_memory(n, backend):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(n), backend, repo],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_user_memory(n, what="upsert"):
    """`what`: "upsert" (the user's loop) or "batches" (the same loop writing nothing)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", USER_MEMORY_CHILD, str(n), repo, what],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_headline(dim, res, args):
    """Prints the public path beside TF's MutableHashTable and dense tf.gather (timed
    interleaved, `run_headline`); returns the figures and ratios."""
    mht, gather = res["MutableHashTable"], res["tf.gather"]
    print(f"\ndim {dim}: de.Variable.lookup, initializer=tf.random_normal_initializer(0, 0.01), "
          f"batch {args.batch} (half new keys), table {args.keys} keys; interleaved medians")
    print(f"{'path':<58}{'M keys/s':>10}{'x MutableHashTable':>20}{'tf.gather / it':>16}")
    rows = [("de.Variable.lookup (unseeded; fused C++ draw)", res["public"]),
            ("de.Variable.lookup (seed=1; keyed C++ draw = TF's rows)", res["public seeded"]),
            ("TF MutableHashTable find + tf.random.normal default", mht),
            ("dense tf.gather of a same-size batch (all present)", gather)]
    for label, value in rows:
        print(f"{label:<58}{value:>10.2f}{value / mht:>19.1f}x{gather / value:>15.2f}x")
    out = {"m_keys_per_s": res}
    for key in ("public", "public seeded"):
        out[key] = {"x_mutable_hash_table": res[key] / mht, "gather_over_it": gather / res[key]}
    met_mht, met_gather = res["public"] / mht >= 10, gather / res["public"] <= 1.5
    print(f"goals (unseeded): >= 10x MutableHashTable: {'met' if met_mht else 'NOT met'}; "
          f"within 1.5x of tf.gather: {'met' if met_gather else 'NOT met'}")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--dims", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--backends", nargs="+",
                        default=["public", "native", "builtin", "dense"])
    parser.add_argument("--memory", action="store_true", help="also measure bytes/key (1M, 4M)")
    args = parser.parse_args()
    if "native" in args.backends and not native.is_available():
        print(f"native backend unavailable ({native.load_error()}); skipping it")
        args.backends = [b for b in args.backends if b != "native"]
    table_backends = [b for b in args.backends if b != "public"]

    report = {"keys": args.keys, "batch": args.batch, "cpus": os.cpu_count(),
              "unit": "M keys/s", "throughput": {}, "memory": {}}
    ops = ["lookup+init", "lookup+init (TF draws)", "lookup present", "upsert", "find_or_insert"]
    report["memory_touch"] = touch = touch_bandwidth()
    print(f"fresh memory: first touch {touch['first_touch_gbps']:.2f} GB/s, rewrite "
          f"{touch['rewrite_gbps']:.2f} GB/s (new rows land on fresh pages)")
    for dim in args.dims:
        if "public" in args.backends:
            headline = run_headline(dim, args.keys, args.batch, args.repeats)
            report.setdefault("headline", {})[dim] = print_headline(dim, headline, args)
        res = run_dim(dim, args.keys, args.batch, args.repeats, table_backends)
        report["throughput"][dim] = res
        print(f"\ndim {dim}: M keys/s (batch {args.batch}, table {args.keys} keys, "
              f"{os.cpu_count()} CPUs)")
        print(f"{'op':<24}" + "".join(f"{b:>12}" for b in table_backends)
              + f"{'native/builtin':>16}")
        for op in ops:
            cells = [res.get(b, {}).get(op) for b in table_backends]
            if all(c is None for c in cells):
                continue
            ratio = ""
            if res.get("native", {}).get(op) and res.get("builtin", {}).get(op):
                ratio = f"{res['native'][op] / res['builtin'][op]:.1f}x"
            print(f"{op:<24}" + "".join(f"{c:>12.2f}" if c else f"{'-':>12}" for c in cells)
                  + f"{ratio:>16}")
    if args.memory:
        print("\nmemory, dim 64 (raw key + row = 264 B/key)")
        print(f"{'backend':<10}{'keys':>10}{'resident B/key':>16}{'peak B/key':>12}"
              f"{'table B/key':>13}")
        for backend in [b for b in args.backends if b in ("native", "builtin")]:
            for n in (1_000_000, 4_000_000):
                m = run_memory(n, backend)
                report["memory"].setdefault(backend, {})[n] = m
                table = f"{m['table']:>13.1f}" if m["table"] is not None else f"{'-':>13}"
                print(f"{backend:<10}{n:>10}{m['resident']:>16.1f}{m['peak']:>12.1f}{table}")
        print("\nmemory as a user measures it (de.Variable.upsert of numpy-made 65,536-key "
              "batches, dim 64; RSS growth over the process' RSS after creating the variable; "
              "batches alone: the same loop writing nothing)")
        print(f"{'keys':>10}{'RSS B/key':>11}{'table':>8}{'heap':>8}{'other':>8}"
              f"{'after malloc_trim':>19}{'batches alone':>15}")
        for n in (1_000_000, 4_000_000):
            m = run_user_memory(n)
            m["batches_alone"] = run_user_memory(n, "batches")["resident"]
            report["memory"].setdefault("user", {})[n] = m
            other = m["resident"] - (m["table"] or 0) - m["heap"]
            print(f"{n:>10}{m['resident']:>11.1f}{m['table'] or 0:>8.1f}{m['heap']:>8.1f}"
                  f"{other:>8.1f}{m['after_trim']:>19.1f}{m['batches_alone']:>15.1f}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
