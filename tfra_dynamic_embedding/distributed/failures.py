"""TF1 sessions that fail in bounded time when a PS dies, instead of recovering forever.

`MonitoredSession` treats `UnavailableError` (a killed PS) as a preemption: it closes its
session and creates a new one until the PS is back -- forever if it never is. Three settings
turn that into an error within seconds:

    from tfra_dynamic_embedding.distributed import failures
    failures.fail_fast_environment()            # first: before TF's server or session exists
    config = failures.session_config(job, task, operation_timeout_in_ms=60000)
    server = tf.distribute.Server(cluster, job_name=job, task_index=task, config=config)
    with failures.StepDeadlineHook(300) as deadline:
        with tf.compat.v1.train.MonitoredTrainingSession(
                master=server.target, is_chief=..., hooks=[deadline], config=config) as sess:
            ...   # a dead PS: StepDeadlineError naming it, 300 s after the step started

  * GRPC_FAIL_FAST=true (`fail_fast_environment`): an RPC to an unreachable task fails at once.
    With TF's default ("use_caller") closing and re-creating the session wait for the dead task.
  * `session_config`: `operation_timeout_in_ms` fails a step blocked on a PS that stops
    answering without closing its connection; `device_filters` keep a task from waiting for the
    other workers.
  * `StepDeadlineHook`: gives up MonitoredSession's recovery once a step did not finish in time.

tests/distributed/test_between_graph.py kills a PS with SIGKILL mid-training: chief and worker
both fail with a StepDeadlineError naming the dead task soon after the deadline (measured times
in docs/distributed.md).
"""

import logging
import os
import re
import sys
import threading
import time

from absl import logging as absl_logging
import tensorflow as tf

# MonitoredSession (tensorflow/python/training/monitored_session.py) logs every error it
# recovers from at INFO on TF's logger, each message starting with this text (all four
# recovery paths: session creation, run, run_step_fn, should_stop). The text dates from TF 1.x
# and is expected in the TF 2.16-2.21 releases this project supports; tested with TF 2.21. If a
# TF release changes it, the hook still fails the step at the next session creation or step,
# and the watchdog still ends a process whose main thread never gets back to the hook.
RECOVERY_LOG_TEXT = "An error was raised"

# Status of a process ended by the watchdog (distinct from Python's 1 for an uncaught error).
WATCHDOG_EXIT_CODE = 3


class StepDeadlineError(RuntimeError):
    """No training step finished within a StepDeadlineHook's deadline (a task is gone)."""


class StepDeadlineHook(tf.compat.v1.train.SessionRunHook, logging.Filter):
    """Fails a MonitoredSession whose step did not finish within `seconds` while it recovers.

        with StepDeadlineHook(300) as deadline:
            with tf.compat.v1.train.MonitoredTrainingSession(..., hooks=[deadline]) as sess:
                while not sess.should_stop():
                    sess.run(train_op)

    The deadline applies from the first finished step on (starting a session -- waiting for the
    chief, restoring a checkpoint -- is not bounded by it) and only while a `sess.run` is under
    way: time between steps (evaluation, waiting for other tasks) does not count.

    Where it fails, in the main thread, with a StepDeadlineError naming the error codes and
    tasks of the first error since the last finished step (e.g. UNAVAILABLE,
    /job:ps/replica:0/task:1):
      * in MonitoredSession's recovery loop, from the log record it writes for every error it
        recovers from (see RECOVERY_LOG_TEXT). While the hook is active, TF's logger passes
        INFO records to the hook; records below the level the logger had are not shown.
      * or when the recovery created a new session or starts the step again.
    With GRPC_FAIL_FAST=true no RPC to the dead task blocks, so the loop keeps coming back there.

    Fallback: a watchdog thread ends the process (status WATCHDOG_EXIT_CODE, a message naming
    the deadline on stderr) once a step has not finished for `seconds + grace`: the main thread
    is then stuck where the hook cannot raise (e.g. an RPC without GRPC_FAIL_FAST).

    The hook is armed by MonitoredSession (`begin`) and disarmed by `end` (a normal close) or
    `stop` / leaving its `with` block: call one of them if training ends with an error that the
    process survives, else the watchdog ends the process later.
    """

    def __init__(self, seconds, grace=30.0):
        """seconds: how long a step may take from its start (including MonitoredSession's
        recovery) before it fails; grace: how much longer the watchdog waits."""
        super().__init__()
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ValueError(f"seconds must be a positive number of seconds, got {seconds!r}")
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not grace >= 0:
            raise ValueError(f"grace must be a non-negative number of seconds, got {grace!r}")
        self.seconds = seconds
        self.grace = grace
        self._lock = threading.Lock()
        self._armed = False          # a step has finished: the deadline applies from now on
        self._step_started = None    # monotonic time the unfinished step started, else None
        self._thread = None          # the thread running the steps (the one that may raise)
        self._first_error = None     # the first recovery log message since the last step
        self._stop = None            # set: the watchdog ends
        self._logger = None
        self._quiet_below = logging.NOTSET
        self._lowered_level = None   # the logger's own level before the hook lowered it

    # -- lifecycle ---------------------------------------------------------------------------

    def begin(self):
        """Called by MonitoredSession: starts watching its log records and the watchdog."""
        if self._stop is not None and not self._stop.is_set():
            return   # already active (begin() of a second session with the same hook)
        with self._lock:   # a hook used again after stop(): a fresh start
            self._armed, self._step_started, self._first_error = False, None, None
        self._logger = tf.get_logger()
        # Loggers drop records below their level before any filter sees them, and TF's logger
        # is at WARNING by default: lower it to INFO and drop, in `filter`, what it would not
        # have shown, so that the user's log output does not change.
        self._quiet_below = self._logger.getEffectiveLevel()
        if self._quiet_below > logging.INFO:
            self._lowered_level = self._logger.level
            self._logger.setLevel(logging.INFO)
        self._logger.addFilter(self)
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="StepDeadlineHook", daemon=True).start()

    def end(self, session):
        """Called by MonitoredSession when it closes without an error."""
        self.stop()

    def stop(self):
        """Disarms the hook: no more errors, the watchdog ends, the logger is as it was."""
        if self._stop is None or self._stop.is_set():
            return
        self._stop.set()
        self._logger.removeFilter(self)
        if self._lowered_level is not None and self._logger.level == logging.INFO:
            self._logger.setLevel(self._lowered_level)   # unless someone changed it since
        self._lowered_level = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()
        return False

    # -- the steps -----------------------------------------------------------------------------

    def after_create_session(self, session, coord):
        # MonitoredSession re-creates its session during recovery: a chance to give up.
        self._raise_if_late()

    def before_run(self, run_context):
        with self._lock:
            if self._step_started is None:
                self._step_started = time.monotonic()
                self._thread = threading.get_ident()
        # A recovered step is started again from here: another chance to give up.
        self._raise_if_late()
        return None

    def after_run(self, run_context, run_values):
        with self._lock:
            self._armed = True
            self._step_started = None
            self._first_error = None

    def _late(self, grace=0.0):
        with self._lock:
            return (self._armed and self._step_started is not None
                    and time.monotonic() - self._step_started > self.seconds + grace)

    def _raise_if_late(self):
        if self._stop is not None and not self._stop.is_set() and self._late():
            raise StepDeadlineError(self._message())

    def _message(self):
        detail = (self._first_error or "").split("Error: ", 1)[-1]
        codes = sorted(set(re.findall(r"\b([A-Z][A-Z_]{4,}): ", detail)))
        tasks = sorted(set(re.findall(r"/job:\w+/replica:\d+/task:\d+", detail)))
        return (f"no training step finished in {self.seconds} s; MonitoredSession kept "
                f"re-creating its session after {', '.join(codes) or 'an error'} involving "
                f"{', '.join(tasks) or 'an unknown task'}")

    # -- logging.Filter: MonitoredSession's recovery log records -------------------------------

    def filter(self, record):
        if RECOVERY_LOG_TEXT in str(record.msg):
            with self._lock:
                if self._first_error is None:
                    self._first_error = record.getMessage()
            # Raising from a filter propagates out of MonitoredSession's `logging.info` call,
            # i.e. out of its recovery loop; only in the thread running the steps.
            if threading.get_ident() == self._thread:
                self._raise_if_late()
        return record.levelno >= self._quiet_below

    # -- the fallback --------------------------------------------------------------------------

    def _watch(self):
        stop = self._stop
        while not stop.wait(0.5):
            if self._late(grace=self.grace):
                # The only output of this package outside logging: absl/TF logging may itself
                # be what is stuck, and the process is about to end.
                print(f"StepDeadlineHook: no training step finished in {self.seconds} s "
                      f"(deadline) + {self.grace} s (grace) and the main thread is stuck where "
                      f"the hook cannot raise; exiting with status {WATCHDOG_EXIT_CODE}",
                      file=sys.stderr, flush=True)
                os._exit(WATCHDOG_EXIT_CODE)


def session_config(job, task, operation_timeout_in_ms=60000, ps_job="ps"):
    """A ConfigProto for a TF1 chief/worker of a PS cluster (its server and its sessions).

        config = session_config("worker", 3, operation_timeout_in_ms=60000)
        # ConfigProto(operation_timeout_in_ms=60000,
        #             device_filters=["/job:ps", "/job:worker/task:3"])

    operation_timeout_in_ms: a step blocked on a task that stops answering (without closing its
    connection) fails with DeadlineExceededError after this long; keep it well above the
    slowest healthy step. device_filters: the session sees only the PS tasks and this task, so
    it never waits for (or fails with) the other workers.
    """
    if not isinstance(job, str) or not job:
        raise ValueError(f"job must be a job name, got {job!r}")
    if isinstance(task, bool) or not isinstance(task, int) or task < 0:
        raise ValueError(f"task must be a task index >= 0, got {task!r}")
    if (isinstance(operation_timeout_in_ms, bool) or not isinstance(operation_timeout_in_ms, int)
            or operation_timeout_in_ms <= 0):
        raise ValueError("operation_timeout_in_ms must be a positive number of milliseconds, "
                         f"got {operation_timeout_in_ms!r}")
    return tf.compat.v1.ConfigProto(
        operation_timeout_in_ms=operation_timeout_in_ms,
        device_filters=[f"/job:{ps_job}", f"/job:{job}/task:{task}"])


def fail_fast_environment():
    """Sets GRPC_FAIL_FAST=true in this process's environment unless it is set; returns the
    value in effect.

        failures.fail_fast_environment()   # first thing in main(), before any tf.distribute.Server

    TensorFlow's gRPC runtime reads GRPC_FAIL_FAST from the environment and may keep the value
    it read first, so call this before the process creates its server or any session to a
    remote target (or set the variable where the process is launched). This function can only
    tell that a tf.distribute.Server already exists (it warns then); it cannot tell whether an
    earlier RPC already read the variable.
    """
    value = os.environ.setdefault("GRPC_FAIL_FAST", "true")
    if value.lower() != "true":
        absl_logging.warning("GRPC_FAIL_FAST=%s is kept: RPCs to a dead task may wait for it "
                             "instead of failing", value)
    if _server_exists():
        absl_logging.warning("a tf.distribute.Server already exists in this process: TF's gRPC "
                             "runtime may have read GRPC_FAIL_FAST before it was set")
    return value


def _server_exists():
    import gc  # pylint: disable=import-outside-toplevel
    server_class = tf.distribute.Server
    return any(isinstance(o, server_class) for o in gc.get_objects())
