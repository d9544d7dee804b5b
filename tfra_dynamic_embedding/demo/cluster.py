"""The demo on a cluster: `tfra-de demo --ps N [--workers M]` trains the DLRM with its tables on
N PS processes, by one synchronous client or by M asynchronous workers.

    tfra-de demo --ps 2 [--workers 2] [the demo's other options]
    make demo-cluster

The demo process itself imports no TensorFlow here: it starts a `LocalCluster` of `tfra-de
server` processes on loopback (kernels loaded), then runs the training in a child process:

- `--ps N` (synchronous, one trainer): N PS servers; the child connects to the cluster as a TF2
  client (`tf.config.experimental_connect_to_cluster`) and gives every
  `de.keras.layers.Embedding` the PS tasks as its devices: each table has one shard per PS (key
  mod N), rows and their Adam slots live there, the dense layers and the input pipeline stay in
  the client, which runs every step. Everything else is the single-process demo (progress bar,
  AUC, checkpoint, SavedModel served by stock TensorFlow in a fresh process).
- `--ps N --workers M` (asynchronous): N PS and M worker servers; the child is the chief
  (`TF_CONFIG`), a `tf.distribute.ParameterServerStrategy` coordinator (demo/ps_strategy.py): the
  model and optimizer are made under the strategy's scope (tables: one shard per PS task), each
  worker reads the training rows itself, and the coordinator schedules the steps, which the
  workers run concurrently against the PS tasks. It then evaluates, checkpoints and exports
  like the demo; metrics.json adds `mode` and `worker_steps` (steps each worker ran).

metrics.json also records `ps_table_sizes`: {feature: {PS device: rows}} and `ps_rows`. The
child and the servers are killed by pid when the demo ends, fails or is interrupted (Ctrl-C);
the servers also exit by themselves when the demo process is gone. See docs/distributed.md.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

SERVER_LOG_DIR = "cluster_logs"


def add_arguments(parser):
    """The demo's cluster options (added to the demo's parser by run.add_arguments)."""
    group = parser.add_argument_group("cluster")
    group.add_argument("--ps", type=int, default=0, metavar="N",
                       help="train with the embedding tables on N local PS processes "
                       "(`tfra-de server` on loopback); 0: one process, no cluster")
    group.add_argument("--workers", type=int, default=0, metavar="M",
                       help="with --ps: train asynchronously on M local worker processes "
                       "(ParameterServerStrategy, a coordinator schedules the steps); 0: one "
                       "synchronous client")
    return parser


def run(args):
    """Runs the demo of `args` (args.ps >= 1; args.workers >= 0) on a local cluster; returns
    metrics.json's content, or None when the training client failed or the run was interrupted
    (the cluster is down either way)."""
    # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.distributed import cluster as cluster_lib
    from tfra_dynamic_embedding.distributed.local import LocalCluster
    if args.ps < 1:
        raise ValueError(f"--ps must be at least 1; got {args.ps}")
    from tfra_dynamic_embedding.demo import run as demo_run
    demo_run.check_args(args)  # before starting anything
    workers = getattr(args, "workers", 0)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    log_dir = os.path.join(out, SERVER_LOG_DIR)
    os.makedirs(log_dir, exist_ok=True)
    options = {k: v for k, v in vars(args).items()
               if k not in ("run", "ps", "workers", "command")}
    options["out"] = out
    metrics_path = os.path.join(out, "metrics.json")
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    if workers:  # the child is the chief: ParameterServerStrategy's coordinator
        cluster = LocalCluster(ps=args.ps, worker=workers, chief=1, log_dir=log_dir)
        child_argv = ["-m", "tfra_dynamic_embedding.demo.ps_strategy"]
        extra_env = {"TF_CONFIG": cluster_lib.tf_config(cluster.spec, "chief", 0)}
        role = "coordinator"
    else:  # the child is a TF2 client of the PS tasks
        cluster = LocalCluster(ps=args.ps, servers=("ps",), log_dir=log_dir)
        child_argv = ["-m", "tfra_dynamic_embedding.demo.cluster", "--cluster",
                      json.dumps(cluster.spec)]
        extra_env = {}
        role = "training client"
    child = None
    began = time.perf_counter()
    try:
        what = f"{args.ps} PS" + (f" and {workers} worker" if workers else "")
        print(f"== starting {what} process(es) on loopback (logs in {log_dir})", flush=True)
        cluster.start()
        for job in ("ps", "worker"):
            for task, address in enumerate(cluster.spec.get(job, [])):
                pid = cluster.processes[(job, task)].pid
                print(f"   /job:{job}/task:{task} at {address} (pid {pid})", flush=True)
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH"))
                                            if p)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the child imports TF with the package
        env.setdefault("PYTHONUNBUFFERED", "1")  # its lines in order, also into a pipe or file
        env.update(extra_env)
        child = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, *child_argv, "--options", json.dumps(options)],
            env=env, stdin=subprocess.DEVNULL)
        print(f"   {role} (pid {child.pid})", flush=True)
        code = child.wait()
        if code != 0:
            print(f"tfra-de demo: the {role} exited with {code} (server logs: {log_dir})",
                  file=sys.stderr)
            return None
    except KeyboardInterrupt:
        print(f"tfra-de demo: interrupted; stopping the {role} and the servers", file=sys.stderr)
        return None
    finally:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        cluster.close()
    with open(metrics_path, encoding="utf-8") as f:
        results = json.load(f)
    print(f"cluster torn down; wall time with the cluster's start "
          f"{time.perf_counter() - began:.1f} s")
    return results


def ps_table_sizes(model):
    """{feature: {device of the shard: rows}} of a DLRM's dynamic tables."""
    sizes = {}
    for layer in model.embeddings:
        variable = layer.params
        sizes[layer.name] = {table.resource_handle.device: int(variable.size(i))
                             for i, table in enumerate(variable.tables)}
    return sizes


def record_ps_sizes(results, model):
    """Adds `ps_table_sizes` ({feature: {PS device: rows}}) and `ps_rows` ({PS device: rows of
    all tables}) of `model` to `results`; prints the rows per PS task."""
    sizes = ps_table_sizes(model)
    per_ps = {}
    for shards in sizes.values():
        for device, rows in shards.items():
            per_ps[device] = per_ps.get(device, 0) + rows
    print("rows per PS task: " + ", ".join(f"{d} {n:,}" for d, n in per_ps.items()))
    results["ps_table_sizes"] = sizes
    results["ps_rows"] = per_ps
    return results


def client_main(argv=None):
    """The training child: connects to the cluster, runs the demo with tables on the PS tasks."""
    parser = argparse.ArgumentParser(prog="python -m tfra_dynamic_embedding.demo.cluster")
    parser.add_argument("--cluster", required=True, help="cluster spec JSON")
    parser.add_argument("--options", required=True, help="the demo's options as JSON")
    parsed = parser.parse_args(argv)
    spec = json.loads(parsed.cluster)
    args = argparse.Namespace(**json.loads(parsed.options))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # pylint: disable=import-outside-toplevel
    import tensorflow as tf

    from tfra_dynamic_embedding.demo import run as demo_run
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(spec))
    args.ps = 0
    args.devices = [f"/job:ps/replica:0/task:{i}" for i in range(len(spec["ps"]))]
    print(f"client: connected to {len(spec['ps'])} PS task(s); every table has one shard per "
          f"PS: {', '.join(args.devices)}", flush=True)
    results = demo_run.run(args)
    record_ps_sizes(results, results.pop("model"))
    results["cluster"] = spec
    demo_run.write_metrics(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(client_main())
