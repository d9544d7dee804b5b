"""Keeps the shard processes of `tfra-de serve` running: a thread polls every replica process of
a LocalCluster and restarts one that exited, at the same address (the clients' channels
reconnect to it), after an exponential backoff per replica -- `initial_backoff` seconds after
its first exit, doubling per exit up to `max_backoff`, back to `initial_backoff` once a restart
stayed up `stable_after` seconds -- so a replica that crashes at start does not spin.

`tfra-de serve` supervises its shard processes so (inference/operate.py).

Example (a process that sleeps, killed and restarted):
    >>> import io, os, signal
    >>> from tfra_dynamic_embedding.distributed.local import LocalCluster
    >>> cluster = LocalCluster(servers=(), sleeper=1)
    >>> argv = lambda job, task: [sys.executable, "-c", "import time; time.sleep(60)"]
    >>> first = cluster.run("sleeper", 0, argv("sleeper", 0))
    >>> supervisor = Supervisor(cluster, argv, initial_backoff=0.1, log=io.StringIO()).start()
    >>> os.kill(first.pid, signal.SIGKILL)
    >>> deadline = time.monotonic() + 30
    >>> while supervisor.restarts[("sleeper", 0)] == 0 and time.monotonic() < deadline:
    ...     time.sleep(0.05)
    >>> cluster.processes[("sleeper", 0)].pid != first.pid
    True
    >>> supervisor.stop(); cluster.close()   # stop first: nothing restarts during the close
"""

import sys
import threading
import time


class Supervisor:
    """Restarts exited processes of `cluster` (a started LocalCluster).

    Args:
      cluster: its `processes` {(job, task): Popen} are watched (those present at `start()`).
      argv_of: (job, task) -> the command line to restart it with.
      on_restart: optional callback (job, task, pid) after a restart (e.g. a metric).
      poll: seconds between looks at the processes.
    """

    def __init__(self, cluster, argv_of, initial_backoff=0.5, max_backoff=30.0,
                 stable_after=60.0, on_restart=None, poll=0.2, log=None):
        self.cluster = cluster
        self.argv_of = argv_of
        self.initial_backoff = float(initial_backoff)
        self.max_backoff = float(max_backoff)
        self.stable_after = float(stable_after)
        self.on_restart = on_restart
        self.poll = float(poll)
        self.log = log or sys.stdout
        self.restarts = {}            # (job, task) -> restarts so far
        self._keys = []
        self._backoff = {}            # (job, task) -> the next wait after an exit
        self._started_at = {}         # (job, task) -> when its process last started
        self._due = {}                # (job, task) -> when the exited process restarts
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        self._keys = sorted(self.cluster.processes)
        now = time.monotonic()
        for key in self._keys:
            self._backoff[key] = self.initial_backoff
            self._started_at[key] = now
            self.restarts[key] = 0
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Stops watching (returns once the thread is gone; processes are left as they are)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self):
        while not self._stop.wait(self.poll):
            for key in self._keys:
                if self._stop.is_set():
                    return
                self._look(key)

    def _look(self, key):
        proc = self.cluster.processes.get(key)
        now = time.monotonic()
        if proc is not None and proc.poll() is None:
            if now - self._started_at[key] >= self.stable_after:
                self._backoff[key] = self.initial_backoff
            return
        if key not in self._due:
            wait = self._backoff[key]
            self._due[key] = now + wait
            self._backoff[key] = min(self.max_backoff, wait * 2)
            code = None if proc is None else proc.returncode
            self._say(f"supervisor: /job:{key[0]}/task:{key[1]} exited ({code}); restarting "
                      f"at {self.cluster.address(*key)} in {wait:.1f} s")
            return
        if now < self._due[key]:
            return
        del self._due[key]
        try:
            restarted = self.cluster.run(key[0], key[1], self.argv_of(*key))
        except Exception as error:  # pylint: disable=broad-except
            # Whatever failed (e.g. out of processes) is retried after the next backoff.
            self._say(f"supervisor: restarting /job:{key[0]}/task:{key[1]} failed: {error}")
            return
        self._started_at[key] = time.monotonic()
        self.restarts[key] += 1
        self._say(f"supervisor: /job:{key[0]}/task:{key[1]} restarted at "
                  f"{self.cluster.address(*key)} (pid {restarted.pid})")
        if self.on_restart is not None:
            self.on_restart(key[0], key[1], restarted.pid)

    def _say(self, line):
        print(line, file=self.log, flush=True)
