"""tfra_dynamic_embedding.distributed.failures without a cluster: the ConfigProto, the argument
checks, StepDeadlineHook fed MonitoredSession's recovery log records, its watchdog (in a child
process: it ends its process). The hook against a killed PS is
test_between_graph.py::test_ps_kill_fails_chief_and_worker_in_bounded_time."""

import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest
import tensorflow as tf

from tfra_dynamic_embedding.distributed import failures

# What MonitoredSession logs when a step fails because PS 1 died (TF 2.21, shortened).
RECOVERY_MSG = ("An error was raised. This may be due to a preemption in a connected worker or "
                "parameter server. The current session will be closed and a new session will "
                "be created. Error: %s")
ERROR = ("From /job:ps/replica:0/task:1:\nSocket closed\nAdditional GRPC error information "
         "from remote target /job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/"
         "RecvTensor:\n:UNAVAILABLE: Socket closed")


def _recovery_record(msg=RECOVERY_MSG):
    return logging.LogRecord("tensorflow", logging.INFO, __file__, 1, msg, (ERROR,), None)


@pytest.fixture
def hook():
    made = []

    def make(seconds, grace=30.0):
        made.append(failures.StepDeadlineHook(seconds, grace=grace))
        made[-1].begin()
        return made[-1]

    yield make
    for h in made:
        h.stop()


def test_session_config_fields():
    config = failures.session_config("worker", 3, operation_timeout_in_ms=20000)
    assert isinstance(config, tf.compat.v1.ConfigProto)
    assert config.operation_timeout_in_ms == 20000
    assert list(config.device_filters) == ["/job:ps", "/job:worker/task:3"]
    default = failures.session_config("chief", 0)
    assert default.operation_timeout_in_ms == 60000
    assert list(default.device_filters) == ["/job:ps", "/job:chief/task:0"]
    assert list(failures.session_config("worker", 1, ps_job="param").device_filters) == [
        "/job:param", "/job:worker/task:1"]


@pytest.mark.parametrize("args, name", [
    (("", 0), "job"), ((None, 0), "job"), (("worker", -1), "task"), (("worker", "0"), "task"),
    (("worker", 0, 0), "operation_timeout_in_ms"), (("worker", 0, 1.5), "operation_timeout_in_ms"),
])
def test_session_config_rejects(args, name):
    with pytest.raises(ValueError, match=name):
        failures.session_config(*args)


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), "5", None, True])
def test_hook_rejects_seconds(seconds):
    with pytest.raises(ValueError, match="seconds"):
        failures.StepDeadlineHook(seconds)


def test_hook_rejects_grace():
    with pytest.raises(ValueError, match="grace"):
        failures.StepDeadlineHook(1, grace=-1)


def test_hook_raises_from_recovery_record_after_deadline_only(hook):
    deadline = hook(0.3)
    logger = tf.get_logger()
    assert deadline in logger.filters
    # Before the first finished step nothing is bounded (session start-up).
    deadline.before_run(None)
    time.sleep(0.4)
    deadline.filter(_recovery_record())   # no error
    deadline.after_run(None, None)
    # A step under way, recovering, not yet past the deadline: the record passes through.
    deadline.before_run(None)
    deadline.filter(_recovery_record())
    time.sleep(0.4)
    # Past the deadline: the recovery log call raises, naming the first error's code and task.
    with pytest.raises(failures.StepDeadlineError) as error:
        deadline.filter(_recovery_record())
    message = str(error.value)
    assert message.startswith("no training step finished in 0.3 s")
    assert "UNAVAILABLE" in message and "/job:ps/replica:0/task:1" in message
    # Also from the logger itself, i.e. from MonitoredSession's `logging.info` call.
    with pytest.raises(failures.StepDeadlineError):
        logger.info(RECOVERY_MSG, ERROR)
    # And when the recovery re-creates the session or starts the step again.
    with pytest.raises(failures.StepDeadlineError):
        deadline.after_create_session(None, None)
    with pytest.raises(failures.StepDeadlineError):
        deadline.before_run(None)
    # Other records never raise.
    assert deadline.filter(logging.LogRecord("tensorflow", logging.WARNING, __file__, 1,
                                             "something else", (), None))


def test_hook_time_between_steps_does_not_count(hook):
    deadline = hook(0.2)
    deadline.before_run(None)
    deadline.after_run(None, None)
    time.sleep(0.3)            # e.g. the chief waiting for the workers
    deadline.before_run(None)  # a new step: its clock starts now
    deadline.filter(_recovery_record())
    deadline.after_create_session(None, None)


def test_hook_stop_disarms_and_restores_logger(hook):
    logger = tf.get_logger()
    level = logger.level
    deadline = hook(0.1)
    assert logger.isEnabledFor(logging.INFO)   # the records reach the filter
    deadline.before_run(None)
    deadline.after_run(None, None)
    deadline.before_run(None)
    time.sleep(0.2)
    deadline.stop()
    assert deadline not in logger.filters and logger.level == level
    deadline.filter(_recovery_record())   # no error once stopped
    deadline.before_run(None)


def test_hook_keeps_output_at_the_loggers_level(hook):
    """With TF's logger at WARNING, the hook lowers it to INFO to see the recovery records but
    drops the INFO records the logger would not have shown."""
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        deadline = hook(10)
        assert not deadline.filter(_recovery_record())
        assert deadline.filter(logging.LogRecord("tensorflow", logging.WARNING, __file__, 1,
                                                 "shown", (), None))
        deadline.stop()
        assert logger.level == logging.WARNING
    finally:
        logger.setLevel(level)


def test_watchdog_ends_a_stuck_process():
    """A step stuck where the hook cannot raise: the watchdog ends the process with status
    WATCHDOG_EXIT_CODE and a stderr message naming the deadline."""
    code = textwrap.dedent("""
        import time
        from tfra_dynamic_embedding.distributed import failures
        hook = failures.StepDeadlineHook(0.5, grace=0.5)
        hook.begin()
        hook.before_run(None)
        hook.after_run(None, None)
        hook.before_run(None)
        time.sleep(60)   # stuck in the step
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                          text=True, timeout=120, check=False)
    elapsed = time.monotonic() - started
    assert proc.returncode == failures.WATCHDOG_EXIT_CODE, proc.stderr[-2000:]
    assert ("no training step finished in 0.5 s (deadline) + 0.5 s (grace)"
            in proc.stderr), proc.stderr[-2000:]
    assert elapsed < 60


def test_fail_fast_environment(monkeypatch):
    monkeypatch.delenv("GRPC_FAIL_FAST", raising=False)
    assert failures.fail_fast_environment() == "true"
    assert os.environ["GRPC_FAIL_FAST"] == "true"
    monkeypatch.setenv("GRPC_FAIL_FAST", "use_caller")   # the user's choice is kept
    assert failures.fail_fast_environment() == "use_caller"
    assert os.environ["GRPC_FAIL_FAST"] == "use_caller"
