"""Helpers of the multi-process tests: run a client script against a LocalCluster, bounded.

A client (TF2 remote client, TF1 worker, ParameterServerStrategy coordinator) always runs in its
own process: connecting to a cluster changes TensorFlow's global context, which must not leak
into the pytest process. Scripts print one JSON line last; `run_script` returns it parsed.
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def script(name):
    """Path of a helper script in tests/distributed/."""
    return os.path.join(HERE, name)


def start_script(cluster, job, task, name, *args, env=None):
    """Starts tests/distributed/<name> as task `task` of `job` of `cluster` (TF_CONFIG set);
    it is killed with the cluster."""
    return cluster.run(job, task, [sys.executable, script(name), *map(str, args)], env=env)


def wait_for_output(cluster, job, task, proc, text, timeout):
    """Waits up to `timeout` s until (job, task)'s log holds `text`; True then, False when
    `proc` exited first. Over time fails with the log's tail."""
    deadline = time.monotonic() + timeout
    while text not in cluster.log(job, task):
        if proc.poll() is not None:
            return False
        assert time.monotonic() < deadline, (
            f"/job:{job}/task:{task} printed no {text!r} in {timeout} s:\n"
            f"{cluster.log(job, task)[-4000:]}")
        time.sleep(0.05)
    return True


def wait_json(cluster, job, task, proc, timeout):
    """Waits up to `timeout` s for `proc` (task `task` of `job`); returns its last JSON line.

    A timeout kills it; a non-zero exit or a missing JSON line fails with the log's tail.
    """
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        cluster.kill(job, task)
        raise AssertionError(f"/job:{job}/task:{task} ran over {timeout} s:\n"
                             f"{cluster.log(job, task)[-4000:]}") from None
    log = cluster.log(job, task)
    if proc.returncode != 0:
        raise AssertionError(f"/job:{job}/task:{task} exited with {proc.returncode}:\n"
                             f"{log[-4000:]}")
    for line in reversed(log.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"/job:{job}/task:{task} printed no JSON line:\n{log[-4000:]}")


def run_script(cluster, name, *args, job="chief", task=0, timeout=180, env=None):
    """Runs tests/distributed/<name> to its end as (job, task); returns its last JSON line."""
    proc = start_script(cluster, job, task, name, *args, env=env)
    return wait_json(cluster, job, task, proc, timeout)
