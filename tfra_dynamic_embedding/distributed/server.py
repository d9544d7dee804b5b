"""`tfra-de server`: one TensorFlow server (PS or worker) with this package's kernels loaded.

    tfra-de server --cluster cluster.json --job ps --task 0
    TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' tfra-de server

The process imports `tensorflow_recommenders_addons.dynamic_embedding` (which registers the
native table kernels, so clients may place tables on it), starts a `tf.distribute.Server` over
gRPC, prints one line `tfra-de server ready: /job:<job>/task:<task> at <address>` and serves
until SIGTERM or SIGINT, on which it exits with status 0. (TensorFlow cannot stop a server
inside a process: leaving the process is the clean stop.)
"""

import os
import signal
import sys
import threading
import time

from tfra_dynamic_embedding.distributed import cluster as cluster_lib

READY = "tfra-de server ready"


def add_parser(subparsers):
    """`tfra-de server`: registers the subcommand (see tfra_dynamic_embedding/cli.py)."""
    parser = subparsers.add_parser(
        "server", help="run a PS/worker TensorFlow server with the dynamic-embedding kernels",
        description=__doc__.split("\n\n")[2])
    parser.add_argument("--cluster", metavar="JSON", help="cluster spec: a JSON file or string "
                        "({'ps': ['host:port', ...], 'worker': [...]}); default: TF_CONFIG")
    parser.add_argument("--job", help="this server's job name (default: TF_CONFIG's task type)")
    parser.add_argument("--task", type=int, help="this server's task index (default: TF_CONFIG)")
    parser.add_argument("--parent-pid", type=int, metavar="PID",
                        help="exit when process PID is gone (local clusters: never outlive "
                        "the launcher)")
    parser.set_defaults(run=run)
    return parser


def run(args):
    """Starts the server of `args` and serves until a stop signal; returns the exit code."""
    spec, job, task = cluster_lib.server_target(args.cluster, args.job, args.task)
    serve(spec, job, task, parent_pid=args.parent_pid)
    return 0


def serve(spec, job, task, parent_pid=None):
    """Starts the server of task `task` of `job` in cluster `spec` and blocks until SIGTERM/SIGINT
    (or until process `parent_pid`, when given, is gone)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    exit_on_stop_signals(parent_pid)
    start_server(spec, job, task)
    print(f"{READY}: /job:{job}/task:{task} at {spec[job][task]}", flush=True)
    while True:
        # Short sleeps: the signal may reach one of TensorFlow's threads, which does not
        # interrupt this sleep; Python runs the handler when the main thread wakes.
        time.sleep(0.2)


def exit_on_stop_signals(parent_pid=None):
    """Makes this process exit with status 0 on SIGTERM/SIGINT, and when process `parent_pid`
    (if given) is gone: what a server process does, having no clean way to stop its server."""
    if parent_pid:
        threading.Thread(target=_exit_with, args=(parent_pid,), daemon=True).start()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_now)


def start_server(spec, job, task):
    """A started `tf.distribute.Server` for task `task` of `job`, after loading the kernels."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.tables import native  # pylint: disable=import-outside-toplevel
    if not native.is_available():  # the built-in backend still works; say why native does not
        print(f"tfra-de server: native kernels not loaded ({native.load_error()}); only "
              f"built-in tables can live here", file=sys.stderr, flush=True)
    return tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=task,
                                protocol="grpc", start=True)


def _exit_with(pid):
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _exit_now(signal.SIGTERM, None)
        except PermissionError:  # alive, owned by someone else
            pass
        time.sleep(1.0)


def _exit_now(signum, _frame):
    # No flush of sys.stdout here: the signal may interrupt a print in progress, and a
    # re-entrant flush raises. The ready line is flushed when printed.
    os._exit(0 if signum in (signal.SIGTERM, signal.SIGINT) else 1)


def main(argv=None):
    """`python -m tfra_dynamic_embedding.distributed.server --cluster ... --job ps --task 0`."""
    import argparse  # pylint: disable=import-outside-toplevel
    parser = add_parser(argparse.ArgumentParser(prog="tfra-de").add_subparsers())
    parser.prog = "python -m tfra_dynamic_embedding.distributed.server"
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ValueError as error:
        print(f"tfra-de server: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
