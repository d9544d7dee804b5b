"""The TF2 remote client: this process runs the training loop, the tables live on PS tasks.

    from tfra_dynamic_embedding.distributed import remote
    remote.connect({"ps": ["ps0:2222", "ps1:2222"]}, operation_timeout_in_ms=30000)
    w = de.Variable(dim=8, devices=remote.ps_devices(spec))   # shard i on /job:ps/.../task:i
    with remote.named_task_errors(spec):
        train()        # a dead PS: tf.errors.UnavailableError naming its task and address

Rows and optimizer slots live on the PS that owns the key (`de.Variable` places every shard
op on its table's device); checkpoints are written by the PS tasks (see checkpoint.py and
de.FileSystemSaver). TensorFlow reports a killed PS to the client within about a second (the
gRPC connection is reset), but as an InternalError/CancelledError that names no task:
`named_task_errors` probes the PS addresses and re-raises it as an UnavailableError naming the
unreachable task. A PS that stops answering without closing its connection is bounded by
`operation_timeout_in_ms` (ConfigProto.operation_timeout_in_ms).
"""

import contextlib
import socket
import time

import tensorflow as tf

# TF has no public setter of the eager client's operation_timeout_in_ms: see _tf_private.py.
from tfra_dynamic_embedding import _tf_private


def ps_devices(spec, job="ps"):
    """`/job:<job>/replica:0/task:<i>` for every task of `job` in `spec` (a Variable's devices)."""
    return [f"/job:{job}/replica:0/task:{i}" for i in range(len(spec.get(job, [])))]


def connect(spec, job_name="localhost", task_index=0, operation_timeout_in_ms=None):
    """Connects this (not yet connected) process to cluster `spec` ({"ps": [...], ...}) as
    a client; remote ops then run on `/job:ps/...` devices.

    operation_timeout_in_ms: a bound on every blocking operation (an op on a PS that does not
    answer fails with DeadlineExceededError after this long); must be set before TF's eager
    context starts, i.e. before this process ran any op.
    """
    if operation_timeout_in_ms is not None:
        _tf_private.set_operation_timeout_in_ms(operation_timeout_in_ms)
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(spec), job_name=job_name,
                                              task_index=task_index)


def unreachable_tasks(spec, timeout=2.0):
    """[(job, task, address, reason)] of the tasks of `spec` that refuse a TCP connection."""
    dead = []
    for job, addresses in sorted(spec.items()):
        for task, address in enumerate(addresses):
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host, int(port)), timeout=timeout):
                    pass
            except OSError as error:
                dead.append((job, task, address, error.strerror or str(error)))
    return dead


@contextlib.contextmanager
def named_task_errors(spec, timeout=2.0):
    """Re-raises a TF error of a failed remote call as `tf.errors.UnavailableError` naming the
    task(s) of `spec` that are unreachable now (the original error is its cause); errors with
    every task reachable pass unchanged."""
    try:
        yield
    except (tf.errors.InternalError, tf.errors.CancelledError, tf.errors.UnavailableError,
            tf.errors.AbortedError, tf.errors.DeadlineExceededError,
            tf.errors.UnknownError) as error:
        # A task being killed may still accept connections for a moment after the client saw
        # its connection drop: look again for up to `timeout` seconds before giving up.
        deadline = time.monotonic() + timeout
        dead = unreachable_tasks(spec, timeout)
        while not dead and time.monotonic() < deadline:
            time.sleep(0.1)
            dead = unreachable_tasks(spec, timeout)
        if not dead:
            raise
        names = ", ".join(f"/job:{j}/replica:0/task:{t} at {a} ({why})" for j, t, a, why in dead)
        raise tf.errors.UnavailableError(
            None, None, f"unreachable cluster task(s): {names}; the failed call: "
            f"{type(error).__name__}: {error.message.splitlines()[0] if error.message else ''}"
        ) from error
