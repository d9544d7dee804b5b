"""Placement plans on parameter servers: each PS's measured busy time per training step against the
plan's predicted per-device cost.

Eight tables of different sizes, dims and pooling factors (multi-hot ids, Zipf(1.1) over each
table's rows, mean-pooled by `de.keras.layers.Embedding(pooling="mean")`), an MLP 64-1 on the
pooled vectors, Keras Adam wrapped by `de.DynamicEmbeddingOptimizer`. A `LocalCluster` of K
`tfra-de server` processes holds the tables; one TF2 client process
(`tf.config.experimental_connect_to_cluster`) plans the tables over the PS devices
(`/job:ps/task:i`) with several strategies of `tfra_dynamic_embedding.placement`, builds the model
of each plan inside `plan.scope()` (so every table lands on its planned PS) and trains it.

Per plan and PS: predicted = the plan's per-device cost (the `analytic` estimator of
`placement.evaluate`, seconds); measured = CPU time (utime + stime, /proc/<pid>/stat) of that PS
process per step over the timed steps. Reported: both per device, the Pearson correlation of
predicted and measured busy time over all (plan, PS) pairs and per plan (and without the one-PS plan,
whose idle PS tasks make the correlation easy), and whether the plan's busiest PS is the predicted
one. The analytic estimator models a table's lookup and update kernels, not the fixed per-table work
a PS also does per step (op dispatch, RPCs), so read the correlation, not the absolute values; the
correlation of the busy time with the number of tables on each PS is printed for comparison. CPU time is counted in
clock ticks (10 ms): use enough steps (the default 20) for figures.

    python benchmarks/ps_placement.py [--quick] [--ps 3] [--steps 20] [--batch-size 2048]

Prints a table and one JSON line. Timings from a shared machine are noisy; the PS processes and
the client share its cores.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from ps_training import cpu_seconds  # noqa: E402  (no TensorFlow)

# name, rows, dim, pooling factor
TABLES = [("t0", 200_000, 32, 8), ("t1", 100_000, 16, 1), ("t2", 50_000, 64, 4),
          ("t3", 20_000, 16, 2), ("t4", 10_000, 8, 1), ("t5", 5_000, 32, 10),
          ("t6", 2_000, 16, 1), ("t7", 1_000, 8, 3)]
STRATEGIES = ("size-greedy", "lookup-greedy", "random", "one-ps")


def make_plans(num_ps, batch_size, seed):
    """{label: Plan} over `num_ps` PS devices; "one-ps" puts every table on task 0."""
    # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.placement import evaluate, proposers, types
    tables = [types.TableSpec(name, rows=rows, dim=dim, pooling_factor=float(pooling))
              for name, rows, dim, pooling in TABLES]
    task = types.Task(tables, types.make_devices(num_ps), batch_size=batch_size)
    plans = {}
    for strategy in STRATEGIES:
        if strategy == "one-ps":
            plan = types.Plan(task, {t.name: ["/job:ps/task:0"] for t in tables},
                              strategy="one-ps")
        else:
            plan = proposers.propose(task, strategy, seed=seed)
        evaluate.evaluate_plan(plan, "analytic", num_random=0)
        plans[strategy] = plan
    return plans


def batches(num, batch_size, seed):
    """`num` batches: {table: int64 ids [batch, pooling]} (Zipf(1.1) over the table's rows)."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num):
        batch = {}
        for k, (name, rows, _, pooling) in enumerate(TABLES):
            ids = (rng.zipf(1.1, size=(batch_size, pooling)) - 1) % rows
            batch[name] = (ids.astype(np.int64) * np.int64(0x9E3779B97F4A7C15 - 2**64)
                           + np.int64(k))
        out.append(batch)
    return out


def client(args):
    """Trains every plan's model; prints one JSON line: per plan, ms per step and PS CPU."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # pylint: disable=import-outside-toplevel
    import time

    import numpy as np
    import tensorflow as tf

    import tfra_dynamic_embedding as de
    spec = json.loads(args.spec)
    pids = [int(p) for p in args.ps_pids.split(",")]
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(spec))
    plans = make_plans(len(spec["ps"]), args.batch_size, args.seed)
    data = batches(args.warmup + args.steps, args.batch_size, args.seed)
    tensors = [{k: tf.constant(v) for k, v in b.items()} for b in data]
    labels = tf.constant(np.random.default_rng(args.seed).integers(0, 2, (args.batch_size, 1)),
                         tf.float32)
    results = {}
    for label, plan in plans.items():
        class Model(tf.keras.Model):
            def __init__(self):
                super().__init__(name=f"m_{label.replace('-', '_')}")
                for name, _, dim, _ in TABLES:  # each layer takes its plan table by its name
                    setattr(self, f"emb_{name}", de.keras.layers.Embedding(
                        dim, pooling="mean", name=name))
                self.hidden = tf.keras.layers.Dense(64, activation="relu")
                self.head = tf.keras.layers.Dense(1, activation="sigmoid")

            def call(self, inputs):
                pooled = [getattr(self, f"emb_{name}")(inputs[name]) for name, *_ in TABLES]
                return self.head(self.hidden(tf.concat(pooled, axis=1)))

        with plan.scope(strict=True):
            model = Model()
            model(tensors[0])  # builds; inserts no rows
        placed = {name: [t.resource_handle.device for t in getattr(model, f"emb_{name}")
                         .params.tables] for name, *_ in TABLES}
        optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-3))
        loss_fn = tf.keras.losses.BinaryCrossentropy()

        @tf.function
        def step(inputs, model=model, optimizer=optimizer, loss_fn=loss_fn):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(inputs))
            variables = model.trainable_variables
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss

        times = []
        for i, inputs in enumerate(tensors):
            if i == args.warmup:
                before = [cpu_seconds(p) for p in pids]
            began = time.perf_counter()
            step(inputs).numpy()
            times.append(time.perf_counter() - began)
        after = [cpu_seconds(p) for p in pids]
        results[label] = {
            "ms_per_step": float(np.median(times[args.warmup:]) * 1e3),
            "measured_ms": [(b - a) / args.steps * 1e3 for a, b in zip(before, after)],
            "predicted_ms": [plan.per_device[f"/job:ps/task:{i}"].predicted_cost * 1e3
                             for i in range(len(pids))],
            "assignment": plan.assignment, "placed": placed}
    print(json.dumps(results), flush=True)
    return 0


def pearson(x, y):
    import numpy as np  # pylint: disable=import-outside-toplevel
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 timed steps after 2 warm-up")
    parser.add_argument("--ps", type=int, default=3, help="PS processes")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--ps-pids", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        return client(args)
    if args.quick:
        args.steps, args.warmup = 8, 2
    if args.ps < 2 or args.steps < 1 or args.warmup < 1:
        parser.error("--ps must be >= 2, --steps and --warmup >= 1")
    from tfra_dynamic_embedding.distributed.local import LocalCluster  # pylint: disable=import-outside-toplevel

    log_dir = tempfile.mkdtemp(prefix="tfra_de_ps_placement_")
    print(f"PS placement: {len(TABLES)} tables (rows, dim, pooling: "
          + ", ".join(f"{n} {r // 1000}k/{d}/{p}" for n, r, d, p in TABLES)
          + f") on {args.ps} PS, batch {args.batch_size}, {args.steps} timed steps after "
          f"{args.warmup} warm-up; TF2 remote client; {os.cpu_count()} CPUs; logs in {log_dir}")
    cluster = LocalCluster(ps=args.ps, servers=("ps",), log_dir=log_dir)
    log = os.path.join(log_dir, "client.log")
    try:
        cluster.start()
        pids = [cluster.processes[("ps", i)].pid for i in range(args.ps)]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
        with open(log, "w", encoding="utf-8") as out:
            proc = subprocess.Popen(  # pylint: disable=consider-using-with
                [sys.executable, os.path.abspath(__file__), "--client", "--spec",
                 json.dumps(cluster.spec), "--ps-pids", ",".join(map(str, pids)),
                 "--steps", str(args.steps), "--warmup", str(args.warmup),
                 "--batch-size", str(args.batch_size), "--seed", str(args.seed)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            try:
                code = proc.wait(args.timeout)
            except subprocess.TimeoutExpired:
                code = "timeout"
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    finally:
        cluster.close()
    with open(log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if code != 0 or not lines:
        raise SystemExit(f"client failed ({code}):\n{text[-3000:]}")
    results = json.loads(lines[-1])

    header = f"{'plan':14} {'ms/step':>8}  {'PS':>3} {'predicted ms':>12} {'measured cpu ms':>15}"
    print(header)
    print("-" * len(header))
    all_predicted, all_measured, all_tables, rows = [], [], [], []
    for label, r in results.items():
        for i, (p, m) in enumerate(zip(r["predicted_ms"], r["measured_ms"])):
            tables = [n for n, devs in r["assignment"].items() if f"/job:ps/task:{i}" in devs]
            step_ms = f"{r['ms_per_step']:.1f}" if i == 0 else ""
            print(f"{label if i == 0 else '':14} {step_ms:>8}"
                  f"  {i:>3} {p:>12.3f} {m:>15.1f}   {' '.join(tables)}")
        r["pearson"] = pearson(r["predicted_ms"], r["measured_ms"])
        r["busiest_agrees"] = (max(range(len(pids)), key=lambda i: r["predicted_ms"][i])
                               == max(range(len(pids)), key=lambda i: r["measured_ms"][i]))
        r["tables_on_ps"] = [sum(f"/job:ps/task:{i}" in devs for devs in r["assignment"].values())
                             for i in range(len(pids))]
        all_tables += r["tables_on_ps"]
        all_predicted += r["predicted_ms"]
        all_measured += r["measured_ms"]
        rows.append({"plan": label, **{k: v for k, v in r.items() if k != "placed"}})
        for name, devices in r["placed"].items():  # the tables sit where the plan says
            planned = [d.replace("/job:ps/task:", "/job:ps/replica:0/task:") + "/device:CPU:0"
                       for d in r["assignment"][name]]
            if devices != planned:
                raise SystemExit(f"{label}: table {name} on {devices}, planned {planned}")
    overall = pearson(all_predicted, all_measured)
    by_count = pearson(all_tables, all_measured)
    spread = [x for r in rows if r["plan"] != "one-ps" for x in (r["predicted_ms"], r["measured_ms"])]
    balanced = pearson([x for p in spread[0::2] for x in p], [x for m in spread[1::2] for x in m])
    per_plan = ", ".join(f"{r['plan']} {r['pearson']:+.2f}" if r["pearson"] is not None
                         else f"{r['plan']} n/a" for r in rows)
    print(f"Pearson(predicted, measured) over {len(all_predicted)} (plan, PS) pairs: "
          f"{overall:+.3f} (without one-ps: {balanced:+.3f}); per plan: {per_plan}; busiest PS "
          f"predicted right in "
          f"{sum(r['busiest_agrees'] for r in rows)}/{len(rows)} plans")
    print(f"for comparison, Pearson(number of tables on the PS, measured) {by_count:+.3f} "
          f"(a fixed cost per table and step, e.g. its ops' dispatch and RPCs, is not in the "
          f"analytic estimator)")
    for r in rows:
        r["ms_per_step"] = round(r["ms_per_step"], 1)
        r["measured_ms"] = [round(x, 2) for x in r["measured_ms"]]
        r["predicted_ms"] = [round(x, 4) for x in r["predicted_ms"]]
        r["pearson"] = None if r["pearson"] is None else round(r["pearson"], 3)
    print(json.dumps({"benchmark": "ps_placement", "ps": args.ps, "batch_size": args.batch_size,
                      "steps": args.steps, "warmup": args.warmup, "cpus": os.cpu_count(),
                      "pearson": None if overall is None else round(overall, 3),
                      "pearson_without_one_ps": None if balanced is None else round(balanced, 3),
                      "pearson_tables_on_ps": None if by_count is None else round(by_count, 3),
                      "plans": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
