"""Training on parameter servers: examples/s, bytes on the wire and per-PS load, one process vs
1, 2, 4 PS processes on loopback, with one synchronous TF2 client or 1-2 asynchronous TF1 trainers.

Model: TFRA's published setup -- 26 embedding tables x dim 16, one Zipf(1.2) id per table and
example (arbitrary int64), MLP 256-128-1 on the concatenated embeddings, Adam (1e-3) wrapped by
`de.DynamicEmbeddingOptimizer`, batch 4096 (the `tfra` setup of train_step.py).

Configurations, each in fresh processes:
  local         one process, tables in it, no cluster; a step is one `tf.function` (forward,
                backward, Adam on the dense weights and on the batch's rows), Keras Adam,
                `de.keras.layers.Embedding` tables (the DLRM demo model)
  tf2 ps=K      the same client as a TF2 remote client (`tf.config.experimental_connect_to_cluster`)
                of a `LocalCluster` of K `tfra-de server` processes; tables one shard per PS
                (key mod K); dense weights and the step's dense math stay in the client. One
                synchronous client.
  tf1 ps=K xN   TF1 between-graph replication (benchmarks/ps_tf1_trainer.py): N trainer
                processes (chief + N - 1 workers), each with its own `tf.distribute.Server`,
                the graph under `replica_device_setter` (dense weights, their Adam slots and the
                global step on the PS tasks, tables sharded key mod K), v1 Adam, a
                `MonitoredTrainingSession`; the trainers run asynchronously, each on its own
                batches. The x1 and x2 runs of one K share the K PS processes (own variables).

Measured over the timed steps (after warm-up; TF1: every trainer's warm-up is done and it waits
for a common start before its timed steps, and stays connected until the counters are read):
  examples/s       tf2/local: batch / median step time. tf1: all trainers' examples per second
                   over the window in which all of them were training (latest first timed step's
                   start to earliest last step's end; a step partly in it counts by its part);
                   `sum_of_rates` in the JSON is the sum of each trainer's batch / median step
  ms/step          median (p10-p90) step time (tf1: of all trainers' steps together)
  wire B/step      TCP payload bytes of the cluster's connections (both directions), from the
                   kernel's per-socket counters (`ss -ti`: bytes_sent + bytes_received of every
                   connection to a port of this cluster), so other processes' traffic is not in it;
                   `lo B/step` is the loopback interface counter (/sys/class/net/lo, headers
                   included, the whole machine) for comparison. tf1: over all trainers' steps
                   (a step is one trainer's batch)
  min B/step       what a step must move at least: per table the batch's unique ids (8 B each) to
                   the PS, their rows back, their gradients to the PS (4 B x dim each); the dense
                   weights that tf1 keeps on the PS tasks are not in it
  ratio            wire / min
  PS cpu ms/step   CPU time (utime + stime, /proc/<pid>/stat) of each PS process per step
  client cpu       CPU time of the training process(es) per step (tf1: of all trainers)
  (JSON only) memory_bytes_per_ps: the native tables' bytes on each PS task after training;
                   table_ops_per_ps (tf2): {PS device: {op type: count}} of the table ops in
                   the step's graph;
                   unique_ids_per_step, tables: what the capacity model is fitted to
                   (tfra_dynamic_embedding/distributed/capacity.py, `--fit-capacity`)

    python benchmarks/ps_training.py [--quick] [--modes tf2,tf1] [--ps 1,2,4] [--tf1-ps 1,2,4]
        [--trainers 1,2] [--steps 30] [--batch-size 4096]

--quick: 8 timed steps after 2 warm-up; local, tf2 ps=2, tf1 ps=2 x1 and x2 (about 3 minutes).
Prints a table and one JSON line. A machine with few cores cannot show scaling (trainer and PS
processes share them): read the figures, not a speed-up.
"""

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FULL = dict(steps=30, warmup=5, ps="1,2,4", tf1_ps="1,2,4", trainers="1,2")
QUICK = dict(steps=8, warmup=2, ps="2", tf1_ps="2", trainers="1,2")


# -- measurements (no TensorFlow) ------------------------------------------------------------------
def cpu_seconds(pid):
    """utime + stime of process `pid` in seconds (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loopback_bytes():
    """Bytes the loopback interface has sent so far (each loopback packet is sent once)."""
    with open("/sys/class/net/lo/statistics/tx_bytes", encoding="ascii") as f:
        return int(f.read())


_SS_LINE = re.compile(r"(\S+):(\d+)\s+(\S+):(\d+)")


def socket_bytes(ports):
    """Payload bytes (sent + received) of every established TCP connection one of whose ends
    listens on a port in `ports`, counted once per connection, from `ss -tin`."""
    text = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True,
                          text=True, check=True).stdout
    total, local_port = 0, None
    for line in text.splitlines():
        match = _SS_LINE.search(line)
        if match and not line.startswith(("\t", " ")):
            local_port = int(match.group(2))
            continue
        if local_port in ports:  # the server's end of a connection to the cluster
            for key in ("bytes_sent", "bytes_received"):
                found = re.search(rf"\b{key}:(\d+)", line)
                total += int(found.group(1)) if found else 0
            local_port = None
    return total


# -- the training client (a child process) ------------------------------------------------------
def client(args):
    """Trains `args.steps` timed steps (after `args.warmup`); prints one JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # pylint: disable=import-outside-toplevel
    import numpy as np
    import tensorflow as tf

    spec = json.loads(args.spec) if args.spec else None
    ports, ps_pids = set(), [int(p) for p in args.ps_pids.split(",") if p]
    devices = None
    if spec:
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(spec), job_name="chief",
                                                  task_index=0)
        devices = [f"/job:ps/replica:0/task:{i}" for i in range(len(spec["ps"]))]
        ports = {int(a.rsplit(":", 1)[1]) for job in spec.values() for a in job}
    sys.path.insert(0, ROOT)
    sys.path.insert(0, HERE)
    from tfra_dynamic_embedding.demo import dlrm
    from train_step import tfra_batches, training_step

    tf.keras.utils.set_random_seed(args.seed)
    batches = tfra_batches(args.warmup + args.steps, args.batch_size, args.seed)
    model = dlrm.DLRM(num_dense=0, interaction="concat", top=(256, 128),
                      embedding_dim=args.dim, devices=devices)
    step = training_step(model)

    tensors = [({"ids": tf.constant(inputs["ids"])}, tf.constant(label))
               for inputs, label in batches]
    times = []
    for i, (inputs, label) in enumerate(tensors):
        if i == args.warmup:
            before = (loopback_bytes(), socket_bytes(ports) if ports else 0,
                      [cpu_seconds(p) for p in ps_pids], time.process_time())
        began = time.perf_counter()
        loss = float(step(inputs, label).numpy())
        times.append(time.perf_counter() - began)
        if not np.isfinite(loss):
            raise RuntimeError(f"loss became {loss}")
    after = (loopback_bytes(), socket_bytes(ports) if ports else 0,
             [cpu_seconds(p) for p in ps_pids], time.process_time())
    n = args.steps
    timed = np.asarray(times[args.warmup:])
    # The least a step moves: unique ids to the PS, their rows back, their gradients to the PS.
    minimum = np.mean([sum(len(np.unique(inputs["ids"][:, t])) * (8 + 2 * 4 * args.dim)
                           for t in range(inputs["ids"].shape[1]))
                       for inputs, _ in batches[args.warmup:]])
    rows, memory, table_ops = {}, {}, {}
    if devices:
        # The table ops each PS runs per step (grouped: one lookup and one update op per PS).
        graph = step.get_concrete_function(*tensors[0]).graph
        for op in graph.get_operations():
            if op.type.startswith("TfraDe") and "/job:ps" in op.device:
                device = tf.DeviceSpec.from_string(op.device).replace(device_type="CPU",
                                                                      device_index=0)
                counts = table_ops.setdefault(device.to_string(), {})
                counts[op.type] = counts.get(op.type, 0) + 1
        for layer in model.embeddings:
            for i, table in enumerate(layer.params.shards.tables):
                device = table.resource_handle.device
                rows[device] = rows.get(device, 0) + int(layer.params.size(i))
                memory[device] = memory.get(device, 0) + int(table.memory_bytes())
    result = {
        "ms_per_step": float(np.median(timed) * 1e3),
        "ms_p10": float(np.percentile(timed, 10) * 1e3),
        "ms_p90": float(np.percentile(timed, 90) * 1e3),
        "examples_per_s": args.batch_size / float(np.median(timed)),
        "first_step_s": times[0],
        "wire_bytes_per_step": (after[1] - before[1]) / n if ports else 0.0,
        "lo_bytes_per_step": (after[0] - before[0]) / n,
        "min_bytes_per_step": float(minimum),
        "ps_cpu_ms_per_step": [(b - a) / n * 1e3 for a, b in zip(before[2], after[2])],
        "client_cpu_ms_per_step": (after[3] - before[3]) / n * 1e3,
        "rows_per_ps": rows,
        "memory_bytes_per_ps": memory,
        "table_ops_per_ps": table_ops,
        "unique_ids_per_step": float(np.mean([sum(len(np.unique(inputs["ids"][:, t]))
                                                  for t in range(inputs["ids"].shape[1]))
                                              for inputs, _ in batches[args.warmup:]])),
        "tables": int(batches[0][0]["ids"].shape[1]),
        "table_rows": sum(model.table_sizes().values()),
    }
    print(json.dumps(result), flush=True)
    return 0


# -- the driver -----------------------------------------------------------------------------------
def _finish(proc, timeout):
    """Waits up to `timeout` s for `proc`; its exit code, or "timeout" (then it is killed)."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "timeout"


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def run_config(num_ps, args, log_dir):
    """Runs the TF2 client for one configuration (0: local); returns its JSON result."""
    # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.distributed.local import LocalCluster
    argv = [sys.executable, os.path.abspath(__file__), "--client", "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--batch-size", str(args.batch_size),
            "--dim", str(args.dim), "--seed", str(args.seed)]
    cluster = LocalCluster(ps=num_ps, chief=1, servers=("ps",),
                           log_dir=_config_dir(log_dir, f"tf2_ps{num_ps}"),
                           env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        cluster.start(timeout=args.timeout)
        if num_ps:
            pids = [cluster.processes[("ps", i)].pid for i in range(num_ps)]
            argv += ["--spec", json.dumps(cluster.spec), "--ps-pids", ",".join(map(str, pids))]
        code = _finish(cluster.run("chief", 0, argv), args.timeout)
    finally:
        cluster.close()
    text = cluster.log("chief", 0)
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if code != 0 or not lines:
        raise RuntimeError(f"ps={num_ps}: client failed ({code}):\n{text[-3000:]}")
    return json.loads(lines[-1])


def _config_dir(log_dir, name):
    path = os.path.join(log_dir, name)
    os.makedirs(path, exist_ok=True)
    return path


def _wait_files(paths, processes, cluster, deadline):
    """Waits for `paths`; RuntimeError with the logs' tails if a process exits first or the
    deadline passes."""
    for path in paths:
        while not os.path.exists(path):
            for key, proc in processes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{key[0]}{key[1]} exited with {proc.returncode} before "
                                       f"{os.path.basename(path)}:\n{cluster.log(*key)[-3000:]}")
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {k[0]}{k[1]}:\n{cluster.log(*k)[-1500:]}"
                                  for k in processes)
                raise RuntimeError(f"{os.path.basename(path)} did not appear in time:\n{tails}")
            time.sleep(0.05)


def _overlap_rate(times, batch_size):
    """Examples/s of all trainers together over the window in which all of them were training
    (latest first step's start to earliest last step's end); a step partly in it counts by the
    part in it."""
    begin = max(t[0][0] for t in times)
    end = min(t[-1][1] for t in times)
    if end <= begin:
        return None
    steps = sum(max(0.0, min(e, end) - max(b, begin)) / (e - b)
                for trainer in times for b, e in trainer if e > b)
    return steps * batch_size / (end - begin)


def run_tf1(num_ps, trainer_counts, args, log_dir, tfra_python=None):
    """TF1 between-graph rows: for each n in `trainer_counts`, n trainer processes (chief + n - 1
    workers, asynchronous) against the same `num_ps` PS tasks (each run its own variables);
    returns one row's figures per n. `tfra_python`: run PS tasks and trainers under that Python
    (TFRA's environment; PS tasks as benchmarks/tfra_ps_server.py) instead of this package."""
    # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.distributed.local import LocalCluster
    logs = _config_dir(log_dir, f"{'tfra_' if tfra_python else ''}tf1_ps{num_ps}")
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    if tfra_python:   # nothing of this repository on the path; TFRA 0.8.1 wants tf_keras
        env.update(PYTHONPATH=HERE, TF_USE_LEGACY_KERAS="1")
    cluster = LocalCluster(ps=num_ps, chief=1, worker=max(trainer_counts) - 1,
                           servers=() if tfra_python else ("ps",), log_dir=logs, env=env)
    try:
        if tfra_python:
            import tfra_ps_server
            for i in range(num_ps):
                cluster.run("ps", i, [tfra_python, os.path.join(HERE, "tfra_ps_server.py")])
            for i in range(num_ps):
                cluster.wait_ready("ps", i, args.timeout, ready=tfra_ps_server.READY)
        else:
            cluster.start(timeout=args.timeout)
        for trainers in trainer_counts:
            yield _tf1_row(cluster, trainers, args, _config_dir(logs, f"x{trainers}"),
                           tfra_python)
    finally:
        cluster.close()


def _tf1_row(cluster, trainers, args, sync, tfra_python=None):
    # pylint: disable=import-outside-toplevel
    import numpy as np
    config = {"steps": args.steps, "warmup": args.warmup, "batch_size": args.batch_size,
              "dim": args.dim, "seed": args.seed, "scope": f"model_x{trainers}",
              "sync_dir": sync, "timeout": args.timeout}
    argv = [tfra_python or sys.executable, os.path.join(HERE, "ps_tf1_trainer.py"),
            json.dumps(config)]
    keys = [("chief", 0)] + [("worker", i) for i in range(trainers - 1)]
    deadline = time.monotonic() + args.timeout
    ports = {int(a.rsplit(":", 1)[1]) for job in cluster.spec.values() for a in job}
    ps_pids = [cluster.processes[("ps", i)].pid for i in range(len(cluster.spec["ps"]))]
    procs = {}
    try:
        procs = {key: cluster.run(*key, argv) for key in keys}
        _wait_files([os.path.join(sync, f"warm_{j}{t}") for j, t in keys], procs, cluster,
                    deadline)
        # Every trainer waits for `go` now: the counters cover exactly the timed steps.
        before = (loopback_bytes(), socket_bytes(ports), [cpu_seconds(p) for p in ps_pids],
                  [cpu_seconds(procs[k].pid) for k in keys])
        with open(os.path.join(sync, "go"), "w", encoding="utf-8"):
            pass
        _wait_files([os.path.join(sync, f"result_{j}{t}.json") for j, t in keys], procs,
                    cluster, deadline)
        # Before any trainer exits (its connections, and their counters, would be gone).
        after = (loopback_bytes(), socket_bytes(ports), [cpu_seconds(p) for p in ps_pids],
                 [cpu_seconds(procs[k].pid) for k in keys])
        with open(os.path.join(sync, "exit"), "w", encoding="utf-8"):
            pass
        codes = {k: _finish(p, max(5.0, deadline - time.monotonic())) for k, p in procs.items()}
    finally:
        for key, proc in procs.items():
            if proc.poll() is None:
                cluster.kill(*key)
    bad = {k: c for k, c in codes.items() if c != 0}
    if bad:
        raise RuntimeError(f"tf1 x{trainers}: trainers failed {bad}:\n"
                           + "\n".join(cluster.log(*k)[-3000:] for k in bad))
    results = [json.loads(_read(os.path.join(sync, f"result_{j}{t}.json"))) for j, t in keys]
    times = [r["times"] for r in results]
    durations = np.asarray([e - b for t in times for b, e in t])
    n = len(durations)   # timed steps of all trainers
    medians = [float(np.median([e - b for b, e in t])) for t in times]
    return {
        "ms_per_step": float(np.median(durations) * 1e3),
        "ms_p10": float(np.percentile(durations, 10) * 1e3),
        "ms_p90": float(np.percentile(durations, 90) * 1e3),
        "examples_per_s": _overlap_rate(times, args.batch_size),
        "sum_of_rates": sum(args.batch_size / m for m in medians),
        "trainer_ms_per_step": [m * 1e3 for m in medians],
        "wall_s": max(t[-1][1] for t in times) - min(t[0][0] for t in times),
        "timed_steps": n,
        "wire_bytes_per_step": (after[1] - before[1]) / n,
        "lo_bytes_per_step": (after[0] - before[0]) / n,
        "min_bytes_per_step": float(np.mean([m for r in results for m in r["min_bytes"]])),
        "ps_cpu_ms_per_step": [(b - a) / n * 1e3 for a, b in zip(before[2], after[2])],
        "client_cpu_ms_per_step": (sum(after[3]) - sum(before[3])) / n * 1e3,
        "trainer_cpu_ms_per_step": [(b - a) / len(t) * 1e3
                                    for a, b, t in zip(before[3], after[3], times)],
    }


def _print_row(r):
    spread = f"{r['ms_per_step']:.0f} ({r['ms_p10']:.0f}-{r['ms_p90']:.0f})"
    wire = f"{r['wire_bytes_per_step']:,.0f}" if r["ps"] else "-"
    ratio = f"{r['ratio']:.2f}" if r["ps"] else "-"
    rate = f"{r['examples_per_s']:,.0f}" if r["examples_per_s"] else "-"
    ps_cpu = " ".join(f"{x:.0f}" for x in r["ps_cpu_ms_per_step"]) or "-"
    print(f"{r['config']:17} {spread:>18} {rate:>10} {wire:>12} {r['lo_bytes_per_step']:>11,.0f} "
          f"{r['min_bytes_per_step']:>11,.0f} {ratio:>6} {r['client_cpu_ms_per_step']:>10.0f}  "
          f"{ps_cpu}", flush=True)


def _ints(text, parser, flag):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return parser.error(f"{flag} must be comma-separated ints; got {text!r}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"fewer steps ({QUICK['steps']} timed after {QUICK['warmup']} "
                             f"warm-up) and configurations (TF2: local, ps={QUICK['ps']}; TF1: "
                             f"ps={QUICK['tf1_ps']} x {QUICK['trainers']} trainers): about 3 "
                             f"minutes")
    parser.add_argument("--modes", default="tf2,tf1", help="tf2 (remote client) and/or tf1 "
                        "(between-graph, asynchronous trainers)")
    parser.add_argument("--ps", default=None, help="PS counts of the TF2 rows besides `local` "
                        "(default 1,2,4)")
    parser.add_argument("--tf1-ps", default=None, help="PS counts of the TF1 rows (default 1,2,4)")
    parser.add_argument("--trainers", default=None,
                        help="trainer processes of the TF1 rows: chief + (n - 1) workers "
                             "(default 1,2)")
    parser.add_argument("--no-local", dest="local", action="store_false",
                        help="skip the one-process baseline")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 30)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps first (>= 1, default 5)")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--tfra-python", metavar="PY",
                        help="also run each tf1 row with TFRA (its PS tasks and trainers under "
                             "this Python, e.g. a venv with tensorflow-recommenders-addons "
                             "0.8.1; docs/tfra_compatibility.md), as `tfra tf1 ...` rows")
    parser.add_argument("--fit-capacity", action="store_true",
                        help="fit the capacity model to the tf2 rows and print its predictions")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per configuration")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--ps-pids", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for key in ("steps", "warmup", "ps", "tf1_ps", "trainers"):
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    if args.client:
        return client(args)
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"tf2", "tf1"}:
        parser.error(f"--modes must name tf2 and/or tf1; got {args.modes!r}")
    configs = []
    if "tf2" in modes:
        configs += [("tf2", 0, 1)] if args.local else []
        configs += [("tf2", k, 1) for k in _ints(args.ps, parser, "--ps") if k > 0]
    if "tf1" in modes:
        counts = [w for w in _ints(args.trainers, parser, "--trainers") if w > 0]
        configs += [("tf1", k, counts) for k in _ints(args.tf1_ps, parser, "--tf1-ps")
                    if k > 0 and counts]

    import tempfile  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, ROOT)
    log_dir = tempfile.mkdtemp(prefix="tfra_de_ps_training_")
    print(f"PS training, TFRA setup (26 tables x dim {args.dim}, Zipf(1.2) ids, MLP 256-128-1, "
          f"Adam), batch {args.batch_size}, {args.steps} timed steps (per trainer) after "
          f"{args.warmup} warm-up; tf2: one TF2 remote client, synchronous; tf1: between-graph "
          f"trainers (chief + workers), asynchronous, examples/s over the window all of them "
          f"train; {os.cpu_count()} CPUs; logs in {log_dir}")
    header = (f"{'config':17} {'ms/step (p10-p90)':>18} {'examples/s':>10} {'wire B/step':>12} "
              f"{'lo B/step':>11} {'min B/step':>11} {'ratio':>6} {'client cpu':>10}  "
              f"PS cpu ms/step")
    print(header)
    print("-" * len(header))
    results = []
    def rows(mode, num_ps, trainers):
        if mode == "tf2":
            r = run_config(num_ps, args, log_dir)
            r.update(config="local" if num_ps == 0 else f"tf2 ps={num_ps}", trainers=1)
            yield r
        else:
            for tfra in ([False, True] if args.tfra_python else [False]):
                # TFRA's non-chief trainers wait forever for the chief to initialize their
                # lookups' wrappers (docs/distributed.md, Mode 2): one trainer only there.
                counts = [1] if tfra else trainers
                with contextlib.closing(run_tf1(num_ps, counts, args, log_dir,
                                                args.tfra_python if tfra else None)) as runs:
                    for n, r in zip(counts, runs):   # the PS tasks are killed on leaving
                        r.update(config=f"{'tfra ' if tfra else ''}tf1 ps={num_ps} x{n}",
                                 trainers=n, implementation="tfra" if tfra else "ours")
                        yield r

    for mode, num_ps, trainers in configs:
        for r in rows(mode, num_ps, trainers):
            r.update(mode=mode, ps=num_ps)
            r["ratio"] = r["wire_bytes_per_step"] / r["min_bytes_per_step"] if num_ps else None
            r["wire_bytes_per_example"] = r["wire_bytes_per_step"] / args.batch_size
            results.append(r)
            _print_row(r)
    for r in results:
        for key, value in list(r.items()):
            if isinstance(value, float):
                r[key] = round(value, 3)
            elif isinstance(value, list):
                r[key] = [round(v, 3) if isinstance(v, float) else v for v in value]
    fitted = capacity_check(results, args.dim) if args.fit_capacity else None
    print(json.dumps({"benchmark": "ps_training", "modes": modes,
                      "batch_size": args.batch_size, "dim": args.dim, "steps": args.steps,
                      "warmup": args.warmup, "cpus": os.cpu_count(), "results": results,
                      "capacity_costs": fitted}))
    return 0


def capacity_check(results, dim):
    """Fits the capacity model's costs to the tf2 rows and prints its predictions next to the
    measured figures (memory per PS, wire bytes per step, CPU per PS task and step); returns the
    fitted costs as a dict."""
    # pylint: disable=import-outside-toplevel
    import dataclasses

    from tfra_dynamic_embedding.distributed import capacity
    rows = [r for r in results if r["mode"] == "tf2" and r["ps"]]
    if not rows:
        return None
    payload = 2 * 8 + 2 * 4 * dim
    costs = capacity.fit([{"ps": r["ps"], "tables": r["tables"],
                           "rows_per_step": r["unique_ids_per_step"],
                           "ps_cpu_ms_per_step": r["ps_cpu_ms_per_step"],
                           "wire_bytes_per_step": r["wire_bytes_per_step"],
                           "payload_bytes_per_step": r["unique_ids_per_step"] * payload}
                          for r in rows])
    print(f"capacity model fitted to the tf2 rows: {costs}")
    print(f"{'config':10} {'memory/PS measured':>19} {'predicted':>11} {'wire B/step':>12} "
          f"{'predicted':>11} {'PS cpu ms':>9} {'predicted':>9}")
    for r in rows:
        count = r["tables"]
        tables = [capacity.TableLoad(f"t{i}", rows=r["table_rows"] / count, dim=dim,
                                     ids_per_step=r["unique_ids_per_step"] / count)
                  for i in range(count)]
        est = capacity.estimate(tables, r["ps"], costs)
        memory = sum(r["memory_bytes_per_ps"].values()) / r["ps"]
        cpu = sum(r["ps_cpu_ms_per_step"]) / r["ps"]
        print(f"{r['config']:10} {memory:>19,.0f} {est.memory_per_ps_bytes:>11,} "
              f"{r['wire_bytes_per_step']:>12,.0f} {est.wire_bytes_per_step:>11,.0f} "
              f"{cpu:>9.1f} {est.ps_cpu_ms_per_step:>9.1f}")
        r["capacity_predicted"] = est.as_dict()
    return dataclasses.asdict(costs)


if __name__ == "__main__":
    sys.exit(main())
