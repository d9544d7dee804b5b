"""TF1 between-graph replication: chief + workers with MonitoredTrainingSession, tables on PS.

Each chief/worker is a `tf1_trainer.py` process with its own `tf.distribute.Server`; the PS
tasks are `tfra-de server` processes (LocalCluster). The trainer builds its graph under
`replica_device_setter`, shards `de.get_variable` over the PS tasks and trains with a
DynamicEmbeddingOptimizer-wrapped v1 optimizer (see tf1_trainer.py for the settings a user sets:
device_filters, operation_timeout_in_ms, GRPC_FAIL_FAST=true and a step-deadline hook).
"""

import json
import os
import time

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.distributed import procs
from tests.distributed import tf1_trainer as trainer
from tfra_dynamic_embedding.distributed.local import LocalCluster

# Runs alone: its processes must have the machine to themselves (tests/conftest.py).
pytestmark = pytest.mark.exclusive

# A dead PS must fail RPCs at once (not wait for it to come back), see tf1_trainer.py.
ENV = {"GRPC_FAIL_FAST": "true"}
SLOTS = {"adam": ["emb", "m", "v"], "adagrad": ["accumulator", "emb"], "sgd": ["emb"]}
TIMEOUT = 120


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One 2-PS cluster for the tests that do not kill a PS (each run has its own scope)."""
    local = LocalCluster(servers=("ps",), log_dir=str(tmp_path_factory.mktemp("tf1_cluster")),
                         ps=2, worker=2, chief=1)
    try:
        yield local.start()
    finally:
        local.close()


def _start(cluster, job, task, **config):
    return procs.start_script(cluster, job, task, "tf1_trainer.py", json.dumps(config), env=ENV)


def _ids_of(runs):
    """Every id the (job, task, steps) runs feed."""
    return sorted({int(i) for job, task, steps in runs
                   for ids, _ in trainer.batches(job, task, steps) for i in ids.ravel()})


def _assert_states_equal(got, want):
    assert sorted(got["tables"]) == sorted(want["tables"])
    for name, table in want["tables"].items():
        assert got["tables"][name]["keys"] == table["keys"], name
        np.testing.assert_array_equal(got["tables"][name]["values"], table["values"], name)
    for a, b in zip(got["dense"], want["dense"]):
        np.testing.assert_array_equal(a, b)
    assert got["non_slot"] == want["non_slot"]
    assert got["global_step"] == want["global_step"]


def _assert_saves(chief, scope):
    """Which task writes which checkpoint entries: every dense variable, the global step and
    the optimizer's non-slot variables are written by the PS task holding them; the de tables
    (one whole-table entry each, re-partitioned on restore) by the task of their first shard,
    PS 0, which gathers the other shards from the PS tasks: no row goes through the chief."""
    by_task = {}
    for device, names in chief["save_devices"].items():
        spec = tf.DeviceSpec.from_string(device)
        by_task.setdefault(f"/job:{spec.job}/task:{spec.task}", set()).update(names)
    tables = {f"{scope}/{scope}_emb{suffix}-{part}" for suffix in
              {"adam": ["", "_Adam_m", "_Adam_v"], "adagrad": ["", "_Adagrad_accumulator"],
               "sgd": [""]}[chief["opt"]] for part in ("keys", "values")}
    assert "/job:chief/task:0" not in by_task
    assert set(by_task) == {"/job:ps/task:0", "/job:ps/task:1"}
    assert tables <= by_task["/job:ps/task:0"]
    assert not tables & by_task["/job:ps/task:1"]
    ps_entries = set().union(*by_task.values()) - tables
    assert f"{scope}/global_step" in by_task["/job:ps/task:0"]
    assert {f"{scope}/tower/dense1/kernel", f"{scope}/tower/dense1/bias",
            f"{scope}/tower/dense2/kernel"} <= ps_entries
    if chief["opt"] == "adam":   # next to the first table shard, on PS 0
        assert {f"{scope}/beta1_power", f"{scope}/beta2_power"} <= by_task["/job:ps/task:0"]


@pytest.mark.parametrize("opt", ["adam", "adagrad", "sgd"])
def test_chief_then_worker_equals_single_process_and_checkpoint_reshards(cluster, tmp_path, opt):
    """The chief trains 4 steps, then worker 0 trains 4 (ordered by files): the PS tables, the
    slot tables, the dense weights and Adam's beta powers equal a single-process TF1 run of the
    same batches in the same order, bit for bit; the chief's final checkpoint restores into 3
    (Adam) or 1 local shards with exactly the values the PS tables held."""
    scope, steps = f"ordered_{opt}", 4
    common = dict(opt=opt, scope=scope, sync_dir=str(tmp_path), steps=steps)
    chief = _start(cluster, "chief", 0, **common, done="chief_done",
                   wait_workers=["worker0_done"], ckpt_dir=str(tmp_path / "ckpt"))
    worker = _start(cluster, "worker", 0, **common, wait_for=["chief_done"], done="worker0_done")
    worker_out = procs.wait_json(cluster, "worker", 0, worker, TIMEOUT)
    got = procs.wait_json(cluster, "chief", 0, chief, TIMEOUT)
    assert (got["ran"], worker_out["ran"], got["global_step"]) == (steps, steps, 2 * steps)
    runs = [("chief", 0, steps), ("worker", 0, steps)]
    assert sorted(got["tables"]) == SLOTS[opt]
    for table in got["tables"].values():   # rows (and slots) of every task's ids
        assert table["keys"] == _ids_of(runs)

    want = trainer.train_local(opt, runs, ["/CPU:0"], scope=scope)
    _assert_states_equal(got, want)

    got["opt"] = opt
    _assert_saves(got, scope)
    shards = ["/CPU:0"] * (3 if opt == "adam" else 1)
    restored = trainer.restore_local(opt, shards, str(tmp_path / "ckpt"), scope=scope)
    _assert_states_equal(restored, got)


def test_async_chief_and_two_workers_adam(cluster, tmp_path):
    """Chief and two workers train Adam at the same time: every task runs all its steps, the
    global step counts all of them, the PS tables (rows and both slots) hold exactly the ids
    of every task, each task's private ids were trained (rows moved off their initial values,
    slots non-zero), and the chief's final checkpoint restores into 3 local shards exactly."""
    scope, steps = "async_adam", 20
    common = dict(opt="adam", scope=scope, sync_dir=str(tmp_path), steps=steps)
    # The chief starts training once both workers have their sessions: all three overlap.
    chief = _start(cluster, "chief", 0, **common, wait_for=["worker0_session", "worker1_session"],
                   wait_workers=["w0_done", "w1_done"], ckpt_dir=str(tmp_path / "ckpt"))
    workers = [_start(cluster, "worker", i, **common, done=f"w{i}_done") for i in range(2)]
    outs = [procs.wait_json(cluster, "worker", i, p, TIMEOUT) for i, p in enumerate(workers)]
    got = procs.wait_json(cluster, "chief", 0, chief, TIMEOUT)
    assert [o["ran"] for o in outs] == [steps, steps] and got["ran"] == steps
    assert got["global_step"] == 3 * steps
    runs = [("chief", 0, steps), ("worker", 0, steps), ("worker", 1, steps)]
    assert sorted(got["tables"]) == ["emb", "m", "v"]
    for table in got["tables"].values():
        assert table["keys"] == _ids_of(runs)

    emb, m = got["tables"]["emb"], got["tables"]["m"]
    position = {k: i for i, k in enumerate(emb["keys"])}
    initial = de.Variable(key_dtype=tf.int64, dim=trainer.DIM, initializer=
                          tf.keras.initializers.RandomNormal(0.0, 0.1, seed=trainer.SEED))
    for job, task, _ in runs:
        own = sorted(trainer.private_keys(job, task) & set(position))
        assert own, (job, task)
        rows = np.array([emb["values"][position[k]] for k in own])
        start = initial.lookup(tf.constant(own, tf.int64)).numpy()
        unmoved = [k for k, moved in zip(own, np.any(rows != start, axis=1)) if not moved]
        # Adam's v (the squared gradients) tells a lost row write (v > 0) from no gradient.
        assert not unmoved, (job, task, {k: (m["values"][position[k]],
                                             got["tables"]["v"]["values"][position[k]])
                                         for k in unmoved})
        assert np.all(np.any(np.array([m["values"][position[k]] for k in own]) != 0, axis=1))
    # Every task multiplied the shared beta powers (a concurrent read-multiply-assign may
    # lose an update, as with dense Adam).
    exponent = np.log(got["non_slot"]["beta1_power"]) / np.log(0.9)
    assert steps + 1 <= round(exponent) <= 3 * steps + 1

    restored = trainer.restore_local("adam", ["/CPU:0"] * 3, str(tmp_path / "ckpt"), scope=scope)
    _assert_states_equal(restored, got)


def test_ps_kill_fails_chief_and_worker_in_bounded_time(make_cluster, tmp_path):
    """kill -9 of a PS mid-training: chief and worker exit with status 1 and a
    StepDeadlineError naming the dead PS task within the deadline (5 s without a finished
    step) plus detection; neither hangs in MonitoredSession's endless recovery."""
    cluster = make_cluster(ps=2, worker=1, chief=1, servers=("ps",))
    common = dict(opt="adam", scope="killed", sync_dir=str(tmp_path), steps=10**6,
                  step_deadline_s=5, ready_after=3)
    chief = _start(cluster, "chief", 0, **common, ready_file="chief_training",
                   ckpt_dir=str(tmp_path / "ckpt"))
    worker = _start(cluster, "worker", 0, **common, ready_file="worker_training")
    deadline = time.monotonic() + TIMEOUT
    while not all(os.path.exists(tmp_path / f) for f in ("chief_training", "worker_training")):
        assert chief.poll() is None and worker.poll() is None, cluster.log("chief", 0)[-3000:]
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.1)
    killed = time.monotonic()
    cluster.kill("ps", 1)
    for job, proc in (("chief", chief), ("worker", worker)):
        proc.wait(60)   # a hang fails here (TimeoutExpired); the fixture kills the processes
        elapsed = time.monotonic() - killed
        log = cluster.log(job, 0)
        assert proc.returncode == 1, f"{job} exited with {proc.returncode}:\n{log[-3000:]}"
        assert "StepDeadlineError: no training step finished in 5 s" in log, log[-3000:]
        assert "/job:ps/replica:0/task:1" in log.rsplit("StepDeadlineError", 1)[1]
        assert elapsed < 45, f"{job} took {elapsed:.1f} s to fail"
        print(f"{job} failed {elapsed:.1f} s after the PS was killed")


def test_tf1_chief_resumes_from_its_checkpoint_after_a_ps_restart(make_cluster, tmp_path):
    """kill -9 of a PS: the chief fails in bounded time; the PS is restarted (empty) and a new
    chief's MonitoredTrainingSession restores the latest checkpoint -- tables, Adam slots and
    global step exactly as saved -- and trains on."""
    cluster = make_cluster(ps=2, chief=1, servers=("ps",))
    config = dict(scope="resumed", ckpt_dir=str(tmp_path / "ckpt"), sync_dir=str(tmp_path))
    proc = procs.start_script(cluster, "chief", 0, "tf1_resume.py",
                              json.dumps(dict(config, phase="train")), env=ENV)
    deadline = time.monotonic() + 180
    while not (tmp_path / "training").exists():
        assert proc.poll() is None and time.monotonic() < deadline, cluster.log("chief", 0)[-3000:]
        time.sleep(0.1)
    cluster.kill("ps", 1)
    assert proc.wait(90) == 1
    assert "StepDeadlineError" in cluster.log("chief", 0)

    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(config["ckpt_dir"]))
    saved_step = int(reader.get_tensor("resumed/global_step"))
    assert saved_step >= 4 and saved_step % 2 == 0

    def saved(entry):
        keys = reader.get_tensor(f"resumed/resumed_emb{entry}-keys")
        values = reader.get_tensor(f"resumed/resumed_emb{entry}-values")
        order = np.argsort(keys)
        return {"keys": keys[order].tolist(), "values": values[order].tolist()}

    cluster.start_server("ps", 1)   # same address, empty tables
    resumed = procs.run_script(cluster, "tf1_resume.py", json.dumps(dict(config, phase="resume")),
                               timeout=180, env=ENV)
    restored = resumed["restored"]
    assert restored["global_step"] == saved_step
    assert restored["tables"]["emb"] == saved("")
    assert restored["tables"]["m"] == saved("_Adam_m")
    assert restored["tables"]["v"] == saved("_Adam_v")
    assert restored["tables"]["emb"]["keys"]   # something was trained and saved
    assert resumed["global_step"] == saved_step + 2


def test_tfra_tf1_ps_demo_runs_unchanged(make_cluster, tmp_path):
    """TFRA's movielens-1m-ps demo as written there (workers only, worker 0 the chief, tf_keras
    Dense, tf.unique + embedding_lookup, v1 Adam): both workers train all their batches and the
    tables hold exactly the ids both fed."""
    cluster = make_cluster(ps=2, worker=2, servers=("ps",))
    workers = [procs.start_script(cluster, "worker", i, "tfra_tf1_demo.py", tmp_path, env=ENV)
               for i in range(2)]
    results = [procs.wait_json(cluster, "worker", i, proc, TIMEOUT)
               for i, proc in reversed(list(enumerate(workers)))][::-1]
    from tests.distributed import tfra_tf1_demo  # pylint: disable=import-outside-toplevel
    batches = tfra_tf1_demo.ROWS // tfra_tf1_demo.BATCH
    assert [r["steps"] for r in results] == [batches, batches]
    feeds = [tfra_tf1_demo.data(i) for i in range(2)]
    assert results[0]["users"] == len(np.unique(np.concatenate([f["user_id"] for f in feeds])))
    assert results[0]["movies"] == len(np.unique(np.concatenate([f["movie_id"] for f in feeds])))
    assert results[0]["global_step"] == 2 * batches
