"""LocalCluster: TensorFlow servers (and client scripts) as separate processes on loopback.

Every process is started with `subprocess` (never fork after importing TensorFlow), writes its
output to a log file, and is killed by its pid when the cluster closes -- also when the code
using it fails. Servers also exit by themselves when the launching process is gone.

Starting servers takes seconds: `with LocalCluster(ps=2) as cluster:` (two `tfra-de server`
processes), `cluster.run`, `cluster.kill("ps", 1)` and `cluster.start_server("ps", 1)` are shown
in docs/distributed.md, "Launching servers".

Example (the spec and devices, before anything starts):
    >>> cluster = LocalCluster(ps=2, worker=1, servers=("ps",))
    >>> cluster.spec["ps"], cluster.devices("ps")
    (['localhost:...', 'localhost:...'], ['/job:ps/replica:0/task:0', '/job:ps/replica:0/task:1'])
    >>> cluster.close()                    # kills what runs, removes its log directory
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from tfra_dynamic_embedding.distributed import cluster as cluster_lib
from tfra_dynamic_embedding.distributed import server as server_lib

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ProcessError(RuntimeError):
    """A cluster process died or did not get ready in time (the message has its log's tail)."""


class LocalCluster:
    """A loopback cluster spec and the processes started on it.

    Args:
      servers: which jobs get a `tfra-de server` process per task on `start()` (default: ps and
        worker; a chief is usually the calling process or a script started with `run`).
      log_dir: where each process writes `<job>_<task>.log` (default: a temporary directory,
        removed with the logs on `close()`; a directory passed here is made if missing, and
        kept).
      env: extra environment variables for every process.
      **job_sizes: tasks per job, e.g. ps=2, worker=2, chief=1.
    """

    def __init__(self, servers=("ps", "worker"), log_dir=None, env=None, **job_sizes):
        self.spec = cluster_lib.local_spec(**job_sizes)
        self._servers = tuple(job for job in servers if job in self.spec)
        self._own_log_dir = not log_dir
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="tfra_de_cluster_")
        os.makedirs(self.log_dir, exist_ok=True)
        self._env = dict(env or {})
        self.processes = {}  # (job, task) -> Popen
        self._log_starts = {}  # (job, task) -> length of its log when last started

    # -- life cycle ---------------------------------------------------------------------------
    def start(self, timeout=120.0):
        """Starts a server for every task of the server jobs; waits until all are ready."""
        for job in self._servers:
            for task in range(len(self.spec[job])):
                self.start_server(job, task, wait=False)
        deadline = time.monotonic() + timeout
        for job in self._servers:
            for task in range(len(self.spec[job])):
                self.wait_ready(job, task, max(1.0, deadline - time.monotonic()))
        return self

    def close(self):
        """Kills every process still running (SIGKILL by pid) and reaps it; removes the log
        directory if this cluster made it."""
        for key in list(self.processes):
            self.kill(*key)
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # -- processes ----------------------------------------------------------------------------
    def start_server(self, job, task, wait=True, timeout=120.0):
        """Starts (or restarts) the `tfra-de server` of task `task` of `job` at its address."""
        argv = [sys.executable, "-m", "tfra_dynamic_embedding.distributed.server",
                "--cluster", json.dumps(self.spec), "--job", job, "--task", str(task),
                "--parent-pid", str(os.getpid())]
        self._spawn((job, task), argv, {})
        if wait:
            self.wait_ready(job, task, timeout)

    def run(self, job, task, argv, env=None):
        """Starts `argv` (e.g. [sys.executable, "worker.py"]) as task `task` of `job`, with
        `TF_CONFIG` naming that task; returns its Popen (killed on close like the servers)."""
        extra = {"TF_CONFIG": cluster_lib.tf_config(self.spec, job, task)}
        extra.update(env or {})
        return self._spawn((job, task), argv, extra)

    def _spawn(self, key, argv, extra_env):
        if key in self.processes and self.processes[key].poll() is None:
            raise ProcessError(f"/job:{key[0]}/task:{key[1]} is already running")
        env = dict(os.environ)
        # Children import this very package, wherever it lives (an install, a source tree,
        # Bazel's runfiles).
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        env.update(self._env)
        env.update(extra_env)
        # A restarted task appends to its log: its readiness is judged on the new output only.
        self._log_starts[key] = len(self.log(*key))
        with open(self.log_path(*key), "ab") as log:
            self.processes[key] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, env=env)
        return self.processes[key]

    def wait_ready(self, job, task, timeout=120.0, ready=server_lib.READY):
        """Blocks until the process of (job, task) printed `ready` (by default the ready line of
        `tfra-de server`); ProcessError if it exits first or `timeout` seconds pass."""
        proc = self.processes[(job, task)]
        deadline = time.monotonic() + timeout
        start = self._log_starts.get((job, task), 0)
        while ready not in self.log(job, task)[start:]:
            if proc.poll() is not None:
                raise ProcessError(f"/job:{job}/task:{task} exited with {proc.returncode}:\n"
                                   f"{self.log(job, task)[-3000:]}")
            if time.monotonic() > deadline:
                raise ProcessError(f"/job:{job}/task:{task} not ready after {timeout:.0f} s:\n"
                                   f"{self.log(job, task)[-3000:]}")
            time.sleep(0.1)

    def kill(self, job, task, sig=signal.SIGKILL, timeout=30.0):
        """Sends `sig` to the process of (job, task) and waits for it; returns its exit code."""
        proc = self.processes.pop((job, task), None)
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(sig)
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        return proc.wait()

    def log_path(self, job, task):
        return os.path.join(self.log_dir, f"{job}_{task}.log")

    def log(self, job, task):
        """The output of (job, task) so far (all of its runs)."""
        try:
            with open(self.log_path(job, task), encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def address(self, job, task):
        return self.spec[job][task]

    def devices(self, job="ps"):
        """`/job:<job>/replica:0/task:<i>` for every task of `job` (e.g. a Variable's devices)."""
        return [f"/job:{job}/replica:0/task:{i}" for i in range(len(self.spec.get(job, [])))]
