"""Real Redis servers for tests (a helper module, not a test): `redis-server` processes on free
loopback ports, standalone or as a 3-master Redis Cluster, each in a temporary directory of its
own. Every process started here is stopped by its pid: when its `with` block ends, and at the
latest when the Python process exits (atexit). Waits are bounded; nothing here can hang a test.

    with StandaloneRedis() as redis:          # redis.port, redis.cli("PING") == "PONG"
        ...
    with RedisCluster(masters=3) as cluster:  # cluster.ports, cluster.nodes[i].cli(...)
        ...
    with RedisSentinel(master.port) as sentinel:   # a sentinel watching `master`
        ...

`make test` installs `redis-server` (Debian's, with redis-cli) as it installs Bazel; where it is
missing, `require_redis()` skips the test, or fails it under CI (CI must have it).
"""

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

HOST = "127.0.0.1"
READY_TIMEOUT_S = 15.0        # a redis-server answers PING in ~10 ms; generous for a busy box
STOP_TIMEOUT_S = 10.0
CLUSTER_TIMEOUT_S = 30.0      # `redis-cli --cluster create` and every node reporting state ok

_LIVE = {}                    # pid -> Popen of every redis-server started and not yet stopped


def redis_binaries():
    """(redis-server, redis-cli) paths, or None where either is missing."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    return (server, cli) if server and cli else None


def require_redis():
    """Skip the calling test when redis-server/redis-cli are not installed; under CI fail."""
    import pytest     # here, so that scripts (benchmarks, probes) can use this module too
    if redis_binaries() is None:
        message = "redis-server/redis-cli not installed (`make test` installs Debian's redis-server)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def _port_free(port):
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port(cluster=False):
    """A loopback port free now (and, for a cluster node, its bus port + 10000 too)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if not cluster or (port + 10000 < 65536 and _port_free(port + 10000)):
            return port
    raise RuntimeError("no free loopback port found")


def _ping(port):
    """True when a server on `port` answers PING (a raw RESP exchange: no client library)."""
    try:
        with socket.create_connection((HOST, port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process: `start()`, `stop()`, `restart()` (same port and data
    directory, so what it persisted comes back), `cli(*args)` runs redis-cli against it."""

    def __init__(self, port=None, cluster=False, extra_args=(), directory=None):
        self.cluster = cluster
        self._auto_port = port is None     # a port we chose may be taken meanwhile: choose again
        self.port = port or free_port(cluster)
        self.extra_args = list(extra_args)
        self.dir = directory or tempfile.mkdtemp(prefix=f"redis-{self.port}-")
        self.proc = None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    @property
    def log_path(self):
        return os.path.join(self.dir, "redis.log")

    def start(self, attempts=3):
        for attempt in range(attempts if self._auto_port else 1):
            try:
                return self._start()
            except RuntimeError:
                if attempt + 1 == (attempts if self._auto_port else 1) or _port_free(self.port):
                    raise
                self.port = free_port(self.cluster)

    def _command(self):
        server, _ = redis_binaries()
        args = [server, "--port", str(self.port), "--bind", HOST, "--dir", self.dir,
                "--logfile", self.log_path, "--daemonize", "no", "--save", "",
                "--appendonly", "no"]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "5000"]
        # Later arguments win: extra_args may turn persistence back on ("--appendonly", "yes").
        return args + self.extra_args

    def _start(self):
        self.proc = subprocess.Popen(self._command(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _LIVE[self.proc.pid] = self.proc
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = ("exited with status %s" % self.proc.returncode
                       if self.proc.poll() is not None else "not ready in %.0f s" % READY_TIMEOUT_S)
                self.stop(remove_dir=False)
                raise RuntimeError(f"redis-server on port {self.port} {why}; log:\n{self.log()}")
            time.sleep(0.02)
        return self

    def stop(self, remove_dir=True):
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; the process is reaped either way."""
        proc, self.proc = self.proc, None
        if proc is not None:
            _stop(proc)
        if remove_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def restart(self):
        self.stop(remove_dir=False)
        return self.start()

    def log(self, tail=30):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-tail:])
        except OSError:
            return "(no log)"

    def cli(self, *args, timeout=10.0):
        """redis-cli's stdout (stripped) for one command; raises on a non-zero exit."""
        _, cli = redis_binaries()
        done = subprocess.run([cli, "-h", HOST, "-p", str(self.port), *map(str, args)],
                              capture_output=True, timeout=timeout, check=True,
                              stdin=subprocess.DEVNULL)
        return done.stdout.decode(errors="replace").strip()

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc):
        self.stop()


def _stop(proc):
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)
    except ProcessLookupError:      # already gone
        proc.wait(timeout=STOP_TIMEOUT_S)
    _LIVE.pop(proc.pid, None)


@atexit.register
def stop_all():
    """Stops every redis-server this process started and has not stopped yet."""
    for proc in list(_LIVE.values()):
        _stop(proc)


class StandaloneRedis(RedisServer):
    """A standalone redis-server on a free loopback port (a context manager)."""


class RedisSentinel(RedisServer):
    """A Redis Sentinel (`redis-server <conf> --sentinel`) on a free loopback port, watching the
    master `name` on `master_port` alone (quorum 1): it fails over to a replica once the master
    has not answered for `down_after_ms`."""

    def __init__(self, master_port, name="master", down_after_ms=1000):
        super().__init__()
        self.master_port, self.name, self.down_after_ms = master_port, name, down_after_ms

    def _command(self):
        server, _ = redis_binaries()
        conf = os.path.join(self.dir, "sentinel.conf")     # a sentinel rewrites its config file
        with open(conf, "w") as f:
            f.write(f"port {self.port}\nbind {HOST}\ndir {self.dir}\nlogfile {self.log_path}\n"
                    f"sentinel monitor {self.name} {HOST} {self.master_port} 1\n"
                    f"sentinel down-after-milliseconds {self.name} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {self.name} 10000\n")
        return [server, conf, "--sentinel"]


class RedisCluster:
    """A Redis Cluster of `masters` redis-server processes (no replicas): started, joined with
    `redis-cli --cluster create`, and ready when every node reports cluster_state:ok."""

    def __init__(self, masters=3, extra_args=()):
        if masters < 3:
            raise ValueError(f"redis-cli --cluster create needs >= 3 masters; got {masters}")
        self.nodes = [RedisServer(cluster=True, extra_args=extra_args) for _ in range(masters)]

    @property
    def ports(self):
        return [node.port for node in self.nodes]

    @property
    def pids(self):
        return [node.pid for node in self.nodes]

    def start(self):
        try:
            for node in self.nodes:
                node.start()
            _, cli = redis_binaries()
            subprocess.run([cli, "--cluster", "create", *[f"{HOST}:{p}" for p in self.ports],
                            "--cluster-replicas", "0", "--cluster-yes"],
                           capture_output=True, timeout=CLUSTER_TIMEOUT_S, check=True,
                           stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + CLUSTER_TIMEOUT_S
            while not all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in self.nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError("cluster not ok in %.0f s" % CLUSTER_TIMEOUT_S)
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        for node in self.nodes:
            node.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
