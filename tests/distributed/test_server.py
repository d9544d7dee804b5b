"""The PS side of a cluster: `tfra-de server` and plain `tf.distribute.Server`s host native tables.

Every server is its own process on loopback (tfra_dynamic_embedding/distributed/local.py),
killed when the test ends.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tfra_dynamic_embedding.distributed import cluster as cluster_lib
from tfra_dynamic_embedding.distributed import server as server_lib
from tfra_dynamic_embedding.distributed.local import LocalCluster

from tests.distributed import procs


def _wait_line(proc, text, timeout):
    """The first stdout line of `proc` containing `text` (fails after `timeout` s)."""
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return line
    raise AssertionError(f"no {text!r} within {timeout} s; output:\n{''.join(lines)[-3000:]}")


def _server_process(argv, env=None):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "tfra_dynamic_embedding.cli", "server", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env)


@pytest.mark.parametrize("how", ["cluster_file", "tf_config"])
def test_tfra_de_server_starts_and_stops_on_sigterm(tmp_path, how):
    spec = cluster_lib.local_spec(ps=1, worker=1)
    if how == "cluster_file":
        path = tmp_path / "cluster.json"
        cluster_lib.write_spec(spec, str(path))
        proc = _server_process(["--cluster", str(path), "--job", "worker", "--task", "0"])
        expected = f"/job:worker/task:0 at {spec['worker'][0]}"
    else:
        proc = _server_process([], env={"TF_CONFIG": cluster_lib.tf_config(spec, "ps", 0)})
        expected = f"/job:ps/task:0 at {spec['ps'][0]}"
    try:
        line = _wait_line(proc, server_lib.READY, timeout=120)
        assert expected in line
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        assert code == 0, proc.stdout.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.parametrize("argv, env, message", [
    ([], {}, "no cluster"),
    (["--cluster", '{"ps": ["localhost:1"]}'], {}, "--job and --task"),
    (["--cluster", '{"ps": ["localhost:1"]}', "--job", "worker", "--task", "0"], {},
     "job 'worker' is not in the cluster"),
    (["--cluster", '{"ps": ["localhost:1"]}', "--job", "ps", "--task", "3"], {},
     "task 3 is out of range"),
    (["--cluster", '{"ps": ["nohostport"]}', "--job", "ps", "--task", "0"], {},
     "'host:port'"),
    ([], {"TF_CONFIG": "{not json"}, "TF_CONFIG is not valid JSON"),
])
def test_tfra_de_server_bad_arguments(argv, env, message):
    env = dict({k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, **env)
    result = subprocess.run([sys.executable, "-m", "tfra_dynamic_embedding.cli", "server", *argv],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode != 0
    assert message in result.stderr


def test_server_exits_with_its_launcher(tmp_path):
    """--parent-pid: a server never outlives the process that launched it."""
    spec = cluster_lib.local_spec(ps=1)
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    proc = _server_process(["--cluster", json.dumps(spec), "--job", "ps", "--task", "0",
                            "--parent-pid", str(parent.pid)])
    try:
        _wait_line(proc, server_lib.READY, timeout=120)
        parent.kill()
        parent.wait()
        assert proc.wait(timeout=30) == 0
    finally:
        for p in (parent, proc):
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.mark.parametrize("server_kind", ["tfra-de", "plain"])
def test_remote_client_puts_native_tables_on_every_ps(tmp_path, server_kind):
    """Kernels are registered on the PS by `tfra-de server` and by a plain TFRA-style PS script
    that only imports `tensorflow_recommenders_addons.dynamic_embedding`."""
    cluster = LocalCluster(servers=("ps",) if server_kind == "tfra-de" else (),
                           log_dir=str(tmp_path), ps=2, chief=1)
    try:
        cluster.start()
        if server_kind == "plain":
            for task in range(2):
                procs.start_script(cluster, "ps", task, "plain_ps.py")
            for task in range(2):
                cluster.wait_ready("ps", task)
        result = procs.run_script(cluster, "remote_smoke.py", timeout=180)
    finally:
        cluster.close()
    assert result["sizes"] == [3, 2]  # keys mod 2: {0, 2, 4} and {1, 3}
    assert result["devices"] == ["/job:ps/replica:0/task:0/device:CPU:0",
                                 "/job:ps/replica:0/task:1/device:CPU:0"]
    assert result["rows"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_a_restarted_server_is_ready_only_when_it_says_so_again(tmp_path):
    """LocalCluster.start_server on a task that ran before waits for the new process's own
    ready line (its log already holds the old one): the server accepts connections at once."""
    cluster = LocalCluster(servers=("ps",), log_dir=str(tmp_path), ps=1)
    try:
        cluster.start()
        cluster.kill("ps", 0)
        cluster.start_server("ps", 0)
        assert cluster.log("ps", 0).count(server_lib.READY) == 2
        host, port = cluster.address("ps", 0).rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()
    finally:
        cluster.close()


@pytest.mark.parametrize("own_dir", [True, False])
def test_a_cluster_removes_only_the_log_directory_it_made(tmp_path, own_dir):
    """Without `log_dir` a LocalCluster logs to a temporary directory and removes it on close
    (a `tfra-de serve` per run left one behind in /tmp); a directory given to it is made if
    missing, and kept."""
    given = tmp_path / "logs" / "serve"   # missing: the cluster makes it
    cluster = LocalCluster(servers=(), log_dir=None if own_dir else str(given), ps=1)
    try:
        proc = cluster.run("ps", 0, [sys.executable, "-c",
                                     "import time; print('up', flush=True); time.sleep(60)"])
        cluster.wait_ready("ps", 0, timeout=60, ready="up")
        log = cluster.log_path("ps", 0)
        assert os.path.isfile(log)
    finally:
        cluster.close()
    assert proc.poll() is not None
    assert os.path.exists(log) is not own_dir
    assert os.path.isdir(tmp_path)
    if not own_dir:
        assert os.path.dirname(log) == str(given)
