"""Training on parameter servers: examples/s, bytes on the wire and per-PS load, one process vs
1, 2, 4 PS processes on loopback.

Model: TFRA's published setup -- 26 `de.keras.layers.Embedding` tables x dim 16, one Zipf(1.2) id
per table and example (arbitrary int64), MLP 256-128-1 on the concatenated embeddings, Keras Adam
wrapped by `de.DynamicEmbeddingOptimizer`, batch 4096 (the `tfra` setup of train_step.py). A step
is one `tf.function` (forward, backward, Adam on the dense weights and on the batch's rows).

Configurations: `local` (one process, tables in it, no cluster) and `ps=K`: a `LocalCluster` of K
`tfra-de server` processes; the training process is a TF2 client
(`tf.config.experimental_connect_to_cluster`) whose tables have one shard per PS (key mod K);
dense weights and the step's dense math stay in the client. Only this mode is measured: one
synchronous client (no asynchronous workers).

Measured over the timed steps (after warm-up), each configuration in a fresh process:
  examples/s       batch / median step time
  wire B/step      TCP payload bytes of the cluster's connections (both directions), from the
                   kernel's per-socket counters (`ss -ti`: bytes_sent + bytes_received of every
                   connection to a port of this cluster), so other processes' traffic is not in it;
                   `lo B/step` is the loopback interface counter (/sys/class/net/lo, headers
                   included, the whole machine) for comparison
  min B/step       what a step must move at least: per table the batch's unique ids (8 B each) to
                   the PS, their rows back, their gradients to the PS (4 B x dim each)
  ratio            wire / min
  PS cpu ms/step   CPU time (utime + stime, /proc/<pid>/stat) of each PS process per step
  client cpu       CPU time of the training process per step

    python benchmarks/ps_training.py [--quick] [--ps 1,2,4] [--steps 30] [--batch-size 4096]

Prints a table and one JSON line. A machine with few cores cannot show scaling (client and PS
processes share them): read the figures, not a speed-up.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


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
    import tfra_dynamic_embedding as de
    from tfra_dynamic_embedding.demo import dlrm
    from train_step import tfra_batches

    tf.keras.utils.set_random_seed(args.seed)
    batches = tfra_batches(args.warmup + args.steps, args.batch_size, args.seed)
    model = dlrm.DLRM(num_dense=0, interaction="concat", top=(256, 128),
                      embedding_dim=args.dim, devices=devices)
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-3))
    loss_fn = tf.keras.losses.BinaryCrossentropy()

    @tf.function
    def step(inputs, label):
        with tf.GradientTape() as tape:
            loss = loss_fn(label[:, None], model(inputs, training=True))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

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
    rows = {}
    if devices:
        for layer in model.embeddings:
            for i, table in enumerate(layer.params.tables):
                device = table.resource_handle.device
                rows[device] = rows.get(device, 0) + int(layer.params.size(i))
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
        "table_rows": sum(model.table_sizes().values()),
    }
    print(json.dumps(result), flush=True)
    return 0


# -- the driver -----------------------------------------------------------------------------------
def run_config(num_ps, args, log_dir):
    """Runs the client for one configuration (0: local); returns its JSON result."""
    sys.path.insert(0, ROOT)
    # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.distributed import cluster as cluster_lib
    from tfra_dynamic_embedding.distributed.local import LocalCluster
    argv = [sys.executable, os.path.abspath(__file__), "--client", "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--batch-size", str(args.batch_size),
            "--dim", str(args.dim), "--seed", str(args.seed)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    cluster = None
    log = os.path.join(log_dir, f"client_ps{num_ps}.log")
    try:
        if num_ps:
            cluster = LocalCluster(ps=num_ps, servers=("ps",), log_dir=log_dir)
            cluster.spec["chief"] = [f"localhost:{cluster_lib.free_port()}"]
            cluster.start()
            pids = [cluster.processes[("ps", i)].pid for i in range(num_ps)]
            argv += ["--spec", json.dumps(cluster.spec), "--ps-pids", ",".join(map(str, pids))]
        with open(log, "w", encoding="utf-8") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,  # pylint: disable=consider-using-with
                                    stdin=subprocess.DEVNULL, env=env)
            try:
                code = proc.wait(args.timeout)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    except subprocess.TimeoutExpired:
        code = "timeout"
    finally:
        if cluster is not None:
            cluster.close()
    with open(log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if code != 0 or not lines:
        raise RuntimeError(f"ps={num_ps}: client failed ({code}):\n{text[-3000:]}")
    return json.loads(lines[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer steps (8 timed after 2 warm-up): about 3 minutes")
    parser.add_argument("--ps", default="1,2,4", help="PS counts to run besides `local`")
    parser.add_argument("--no-local", dest="local", action="store_false",
                        help="skip the one-process baseline")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (>= 1)")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per configuration")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--ps-pids", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        return client(args)
    if args.quick:
        args.steps, args.warmup = 8, 2
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")
    try:
        counts = [int(x) for x in args.ps.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--ps must be comma-separated ints; got {args.ps!r}")
    configs = ([0] if args.local else []) + [k for k in counts if k > 0]

    import tempfile  # pylint: disable=import-outside-toplevel
    log_dir = tempfile.mkdtemp(prefix="tfra_de_ps_training_")
    print(f"PS training, TFRA setup (26 tables x dim {args.dim}, Zipf(1.2) ids, MLP 256-128-1, "
          f"Adam), batch {args.batch_size}, {args.steps} timed steps after {args.warmup} "
          f"warm-up; TF2 remote client, synchronous; {os.cpu_count()} CPUs; logs in {log_dir}")
    header = (f"{'config':7} {'ms/step (p10-p90)':>22} {'examples/s':>10} {'wire B/step':>12} "
              f"{'lo B/step':>11} {'min B/step':>11} {'ratio':>6} {'client cpu ms':>13}  "
              f"PS cpu ms/step")
    print(header)
    print("-" * len(header))
    results = []
    for num_ps in configs:
        r = run_config(num_ps, args, log_dir)
        r["config"] = "local" if num_ps == 0 else f"ps={num_ps}"
        r["ps"] = num_ps
        r["ratio"] = r["wire_bytes_per_step"] / r["min_bytes_per_step"] if num_ps else None
        results.append(r)
        spread = f"{r['ms_per_step']:.0f} ({r['ms_p10']:.0f}-{r['ms_p90']:.0f})"
        wire = f"{r['wire_bytes_per_step']:,.0f}" if num_ps else "-"
        ratio = f"{r['ratio']:.2f}" if num_ps else "-"
        ps_cpu = " ".join(f"{x:.0f}" for x in r["ps_cpu_ms_per_step"]) or "-"
        print(f"{r['config']:7} {spread:>22} {r['examples_per_s']:>10,.0f} {wire:>12} "
              f"{r['lo_bytes_per_step']:>11,.0f} {r['min_bytes_per_step']:>11,.0f} {ratio:>6} "
              f"{r['client_cpu_ms_per_step']:>13.0f}  {ps_cpu}", flush=True)
    for r in results:
        for key, value in list(r.items()):
            if isinstance(value, float):
                r[key] = round(value, 3)
            elif isinstance(value, list):
                r[key] = [round(v, 3) if isinstance(v, float) else v for v in value]
    print(json.dumps({"benchmark": "ps_training", "mode": "tf2_remote_client",
                      "batch_size": args.batch_size, "dim": args.dim, "steps": args.steps,
                      "warmup": args.warmup, "cpus": os.cpu_count(), "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
