"""Redis tables: this package vs TFRA 0.8.1's, side by side against one redis-server.

The driver starts a redis-server (tests/redis_server.py: a free loopback port, no persistence)
and runs the same worker code twice, each in a subprocess of its own: with this package, and
with `--tfra-python` (a Python environment holding TFRA, e.g. /work/tfra-venv: TF 2.16.2 +
tensorflow-recommenders-addons 0.8.1). The worker imports
`tensorflow_recommenders_addons.dynamic_embedding as de` and uses only TFRA's public API
(`de.RedisTableConfig`, `de.RedisTableCreator`, `de.get_variable`, `de.embedding_lookup`,
`de.DynamicEmbeddingOptimizer`), in TF1 graph mode (`tf.compat.v1.Session`), so both sides run
the very same user code. Each side writes its hashes under a model_tag of its own, and the
server is flushed before each dim.

Measured, per dim (`--dims`, default 8 and 64), `--keys` keys (1M) in `--batch`-key batches
(65,536), keys/s (median over the batches, GC off while timing):
  upsert new        `var.upsert` of fresh keys (fills the table)
  upsert existing   `var.upsert` overwriting stored keys
  lookup+init miss  `var.lookup` of keys not stored: initializer rows (random normal), no insert
  lookup present    `var.lookup` of stored keys
  memory            Redis `INFO memory` used_memory after the fill minus before, per key, beside
                    the raw bytes of a key and its row (8 + dim * 4)
and for each measure the redis-server's CPU time per key (`INFO cpu`, over all its batches): where
both sides' server CPU per key is alike and the server is busy most of the time, the server's
single thread bounds the op, whichever client sends the commands.
and the TF1 training step (`--train-steps` timed steps after 3 warm-up steps, median): `--tables`
tables of dim `--train-dim`, batch `--train-batch` ids per table (Zipf(1.2) ids spread over the
int64 range: new ids keep arriving), MLP 64-1, sigmoid cross-entropy, Adam and Adagrad through
`de.DynamicEmbeddingOptimizer`.
This package also runs every measure with its in-memory native tables (`native` rows: the ratio
Redis / in-memory); `--tfra-memory` adds TFRA's in-memory (cuckoo) tables.

    python benchmarks/redis_tables.py --tfra-python /work/tfra-venv/bin/python \
        [--keys 1000000] [--batch 65536] [--dims 8 64] [--json out.json]

Each side runs `--rounds` times (2), the sides taking turns, and each measure keeps its best
round (a shared machine's load comes and goes). Prints a table, then one JSON line (also written
to `--json`, with every round). Never fails on speed; compare the ratios of one run.
"""

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST = "127.0.0.1"


# -- a raw RESP client (both sides; no client library) ---------------------------------------

def resp(port, *args):
    """One command over a fresh socket; its reply as bytes / int / list / None."""
    with socket.create_connection((HOST, port), timeout=60) as conn:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        conn.sendall(b"".join(out))
        reader = conn.makefile("rb")
        return _read_reply(reader)


def _read_reply(reader):
    line = reader.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b"-":
        raise RuntimeError(rest.decode(errors="replace"))
    if kind == b"+":
        return rest
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else reader.read(n + 2)[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_reply(reader) for _ in range(n)]
    raise RuntimeError(f"unexpected reply {line!r}")


def server_cpu(port):
    """Seconds of CPU the server has used (INFO cpu: user + sys)."""
    info = resp(port, "INFO", "cpu").decode()
    fields = dict(row.split(":", 1) for row in info.splitlines() if ":" in row)
    return float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"])


def used_memory(port):
    info = resp(port, "INFO", "memory").decode()
    for row in info.splitlines():
        if row.startswith("used_memory:"):
            return int(row.split(":")[1])
    raise RuntimeError("no used_memory in INFO memory")


# -- the worker (runs with either package) ---------------------------------------------------

def median_time(fn, args_list):
    """Median seconds of fn(a) over args_list (GC off while timing, as `timeit`)."""
    import numpy as np
    times = []
    gc.collect()
    gc.disable()
    try:
        for a in args_list:
            start = time.perf_counter()
            fn(a)
            times.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return float(np.median(times))


def write_config(path, port, tag):
    with open(path, "w") as f:
        json.dump({"redis_connection_mode": 2, "redis_host_ip": [HOST], "redis_host_port": [port],
                   "model_tag_runtime": tag, "storage_slice": 1, "keys_sending_size": 1024,
                   "redis_connect_timeout": 5000, "redis_socket_timeout": 60000,
                   "table_store_mode": 0}, f)


def worker(args):
    import numpy as np
    import tensorflow as tf
    if args.side == "ours":
        sys.path.insert(0, REPO)
    import tensorflow_recommenders_addons.dynamic_embedding as de
    tf.compat.v1.disable_eager_execution()

    backends = ["redis"] + (["memory"] if args.side == "ours" or args.tfra_memory else [])
    config_path = os.path.join(args.workdir, f"redis_{args.side}.json")
    write_config(config_path, args.port, f"bench_{args.side}")

    def creator(backend):
        if backend == "memory":
            return None   # the default: our native tables, TFRA's cuckoo tables
        return de.RedisTableCreator(de.RedisTableConfig(redis_config_abs_dir=config_path))

    results = {"side": args.side, "tf": tf.__version__, "ops": {}, "train": {}}
    rng = np.random.default_rng(1)
    n_batches = max(args.keys // args.batch, 1)
    for dim in args.dims:
        for backend in backends:
            if backend == "redis":
                resp(args.port, "FLUSHALL")
                mem0 = used_memory(args.port)
            graph = tf.Graph()
            with graph.as_default():
                var = de.get_variable(f"bench_d{dim}", key_dtype=tf.int64, value_dtype=tf.float32,
                                      dim=dim, initializer=tf.random_normal_initializer(0, 0.01),
                                      **({"kv_creator": creator(backend)}
                                         if creator(backend) else {}))
                keys_ph = tf.compat.v1.placeholder(tf.int64, [None])
                rows_ph = tf.compat.v1.placeholder(tf.float32, [None, dim])
                upsert = var.upsert(keys_ph, rows_ph)
                lookup = var.lookup(keys_ph)
                lookup_sum = tf.reduce_sum(lookup)   # fetch a scalar: no copy-out of the rows
                init = [tf.compat.v1.global_variables_initializer(),
                        tf.compat.v1.tables_initializer()]
            with tf.compat.v1.Session(graph=graph) as sess:
                sess.run(init)
                stored = rng.choice(2**62, size=n_batches * args.batch, replace=False)
                stored = stored.astype(np.int64).reshape(n_batches, args.batch)
                rows = rng.standard_normal((args.batch, dim)).astype(np.float32)
                cpu_us = {}

                def timed(measure, fn, batches):
                    """keys/s (median batch); the server's CPU µs per key over all batches."""
                    batches = list(batches)
                    cpu0 = server_cpu(args.port) if backend == "redis" else 0.0
                    t = median_time(fn, batches)
                    if backend == "redis":
                        cpu_us[measure] = ((server_cpu(args.port) - cpu0) * 1e6
                                           / (len(batches) * args.batch))
                    return args.batch / t

                sess.run(upsert, {keys_ph: stored[0], rows_ph: rows})   # connect, warm up
                out = {"upsert_new": timed(
                    "upsert_new", lambda b: sess.run(upsert, {keys_ph: stored[b], rows_ph: rows}),
                    range(1, n_batches))}
                fill = int(stored.size)
                mem = (used_memory(args.port) - mem0) / fill if backend == "redis" else None
                some = range(min(n_batches, args.repeats))
                sess.run(lookup_sum, {keys_ph: stored[0]})
                out["lookup_present"] = timed(
                    "lookup_present", lambda b: sess.run(lookup_sum, {keys_ph: stored[b]}), some)
                fresh = [rng.integers(2**62, 2**63 - 1, size=args.batch, dtype=np.int64)
                         for _ in some]
                sess.run(lookup_sum, {keys_ph: fresh[0]})
                out["lookup_init_missing"] = timed(
                    "lookup_init_missing", lambda i: sess.run(lookup_sum, {keys_ph: fresh[i]}),
                    some)
                out["upsert_existing"] = timed(
                    "upsert_existing",
                    lambda b: sess.run(upsert, {keys_ph: stored[b], rows_ph: rows}), some)
                size = int(sess.run(var.size()))
            results["ops"][f"{backend}/{dim}"] = dict(
                out, keys=fill, size=size, bytes_per_key=mem, raw_bytes_per_key=8 + 4 * dim,
                server_cpu_us_per_key=cpu_us or None)
            print(f"[{args.side}] {backend} dim {dim}: {results['ops'][f'{backend}/{dim}']}",
                  file=sys.stderr, flush=True)
    for backend in backends:
        for opt_name in ("adam", "adagrad"):
            if backend == "redis":
                resp(args.port, "FLUSHALL")
            results["train"][f"{backend}/{opt_name}"] = train_step(
                tf, de, np, creator(backend), opt_name, args)
            print(f"[{args.side}] train {backend}/{opt_name}: "
                  f"{results['train'][f'{backend}/{opt_name}']}", file=sys.stderr, flush=True)
    print(json.dumps(results))


def train_step(tf, de, np, kv_creator, opt_name, args):
    """Median seconds of a TF1 training step (see the module docstring)."""
    rng = np.random.default_rng(7)
    steps = args.train_steps + 3
    ids = rng.zipf(1.2, size=(steps, args.train_batch, args.tables)).astype(np.int64)
    ids = ids * np.int64(0x9E3779B97F4A7C15 - 2**64) + np.arange(args.tables, dtype=np.int64)
    labels = rng.integers(0, 2, size=(steps, args.train_batch, 1)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        ids_ph = tf.compat.v1.placeholder(tf.int64, [args.train_batch, args.tables])
        labels_ph = tf.compat.v1.placeholder(tf.float32, [args.train_batch, 1])
        embs = []
        for t in range(args.tables):
            var = de.get_variable(f"train_{opt_name}_t{t}", key_dtype=tf.int64,
                                  value_dtype=tf.float32, dim=args.train_dim,
                                  initializer=tf.random_normal_initializer(0, 0.01),
                                  **({"kv_creator": kv_creator} if kv_creator else {}))
            embs.append(de.embedding_lookup(var, ids_ph[:, t], name=f"lookup_{opt_name}_{t}"))
        x = tf.concat(embs, axis=1)
        w1 = tf.compat.v1.get_variable("w1", [args.tables * args.train_dim, 64])
        w2 = tf.compat.v1.get_variable("w2", [64, 1])
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels_ph,
                                                                       logits=logits))
        base = (tf.compat.v1.train.AdamOptimizer(1e-3) if opt_name == "adam"
                else tf.compat.v1.train.AdagradOptimizer(0.05))
        train = de.DynamicEmbeddingOptimizer(base).minimize(loss)
        init = [tf.compat.v1.global_variables_initializer(), tf.compat.v1.tables_initializer()]
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        for s in range(3):
            sess.run(train, {ids_ph: ids[s], labels_ph: labels[s]})
        t = median_time(lambda s: sess.run(train, {ids_ph: ids[s], labels_ph: labels[s]}),
                        range(3, steps))
        final_loss = float(sess.run(loss, {ids_ph: ids[0], labels_ph: labels[0]}))
    return {"step_s": t, "loss_after": final_loss}


# -- the driver ------------------------------------------------------------------------------

def run_side(side, python, args, port, workdir):
    cmd = [python, os.path.abspath(__file__), "--worker", side, "--port", str(port),
           "--workdir", workdir, "--keys", str(args.keys), "--batch", str(args.batch),
           "--repeats", str(args.repeats), "--dims", *map(str, args.dims),
           "--tables", str(args.tables), "--train-dim", str(args.train_dim),
           "--train-batch", str(args.train_batch), "--train-steps", str(args.train_steps)]
    if args.tfra_memory:
        cmd.append("--tfra-memory")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)   # TFRA's side must import TFRA, not this repository's shim
    print(f"running {side}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, env=env, cwd=workdir,
                          timeout=args.timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the {side} worker failed (exit {done.returncode})")
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def best_of(results):
    """Each measure's best round: the most keys/s, the shortest step (the first round's other
    fields)."""
    best = json.loads(json.dumps(results[0]))
    for res in results[1:]:
        for name, ops in res["ops"].items():
            for m in ("upsert_new", "upsert_existing", "lookup_init_missing", "lookup_present"):
                if ops[m] > best["ops"][name][m]:
                    best["ops"][name][m] = ops[m]
                    if ops.get("server_cpu_us_per_key"):
                        best["ops"][name]["server_cpu_us_per_key"][m] = (
                            ops["server_cpu_us_per_key"][m])
        for name, train in res["train"].items():
            if train["step_s"] < best["train"][name]["step_s"]:
                best["train"][name] = train
    return best


def ratio(a, b):
    return a / b if a and b else None


def report(ours, tfra, args):
    out = {"keys": args.keys, "batch": args.batch, "dims": args.dims, "ours": ours, "tfra": tfra,
           "ratios": {}}
    print(f"\nRedis tables, {args.keys} keys, batches of {args.batch} (keys/s, higher is better)")
    head = f"{'dim':>4} {'measure':<20} {'ours redis':>12} {'TFRA redis':>12} {'ours/TFRA':>10}"
    head += f" {'ours native':>12} {'redis/native':>12} {'server µs/key ours/TFRA':>24}"
    print(head)
    for dim in args.dims:
        o, n = ours["ops"][f"redis/{dim}"], ours["ops"].get(f"memory/{dim}", {})
        t = tfra["ops"][f"redis/{dim}"] if tfra else {}
        for m in ("upsert_new", "upsert_existing", "lookup_init_missing", "lookup_present"):
            r = ratio(o[m], t.get(m))
            out["ratios"][f"{m}/{dim}"] = r
            cpu_o = (o.get("server_cpu_us_per_key") or {}).get(m, float("nan"))
            cpu_t = (t.get("server_cpu_us_per_key") or {}).get(m, float("nan"))
            print(f"{dim:>4} {m:<20} {o[m]:>12,.0f} {t.get(m, float('nan')):>12,.0f} "
                  f"{r if r else float('nan'):>10.2f} {n.get(m, float('nan')):>12,.0f} "
                  f"{ratio(o[m], n.get(m)) or float('nan'):>12.3f} "
                  f"{cpu_o:>11.3f} / {cpu_t:<10.3f}")
        print(f"{dim:>4} {'Redis bytes/key':<20} {o['bytes_per_key']:>12.1f} "
              f"{t.get('bytes_per_key') or float('nan'):>12.1f}   (raw key+row: "
              f"{o['raw_bytes_per_key']} bytes)")
    print(f"\nTF1 training step, {args.tables} tables x dim {args.train_dim}, batch "
          f"{args.train_batch} (seconds, lower is better)")
    print(f"{'optimizer':<10} {'ours redis':>12} {'TFRA redis':>12} {'ours/TFRA':>10} "
          f"{'ours native':>12} {'redis/native':>12}")
    for opt_name in ("adam", "adagrad"):
        o = ours["train"][f"redis/{opt_name}"]["step_s"]
        n = ours["train"].get(f"memory/{opt_name}", {}).get("step_s")
        t = tfra["train"][f"redis/{opt_name}"]["step_s"] if tfra else None
        out["ratios"][f"train/{opt_name}"] = ratio(o, t)
        print(f"{opt_name:<10} {o:>12.4f} {t or float('nan'):>12.4f} "
              f"{ratio(o, t) or float('nan'):>10.2f} {n or float('nan'):>12.4f} "
              f"{ratio(o, n) or float('nan'):>12.2f}")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tfra-python", help="a Python with TFRA 0.8.1 (omit: ours only)")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--dims", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--repeats", type=int, default=8, help="lookup batches timed per dim")
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--train-dim", type=int, default=16)
    parser.add_argument("--train-batch", type=int, default=4096)
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each side, taking turns; each measure keeps its best")
    parser.add_argument("--tfra-memory", action="store_true",
                        help="also TFRA's in-memory tables")
    parser.add_argument("--json", help="also write the JSON report here")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per side")
    parser.add_argument("--worker", choices=("ours", "tfra"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.side = args.worker
        return worker(args)

    import tempfile
    sys.path.insert(0, os.path.join(REPO, "tests"))
    import redis_server   # noqa: E402  (tests/redis_server.py: started and stopped by pid)
    workdir = tempfile.mkdtemp(prefix="redis-bench-")
    rounds = {"ours": [], "tfra": []}
    sides = [("ours", sys.executable)] + ([("tfra", args.tfra_python)] if args.tfra_python else [])
    with redis_server.StandaloneRedis() as server:
        for r in range(args.rounds):
            # The sides take turns (the first of a round alternates), so that a change of the
            # machine's load hits both; each measure keeps its best round.
            for side, python in (sides if r % 2 == 0 else sides[::-1]):
                rounds[side].append(run_side(side, python, args, server.port, workdir))
    ours = best_of(rounds["ours"])
    tfra = best_of(rounds["tfra"]) if rounds["tfra"] else None
    out = report(ours, tfra, args)
    out["rounds"] = rounds
    line = json.dumps(out)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
