"""All-or-nothing multi-shard `save_to_file_system`: crashes, concurrent readers, leftovers.

The writer is a real process (tests/fs_save_loop.py) that sets every row to its generation number
and saves, over and over; it is SIGKILLed at random moments. A load must then find every key with
one generation's value: the last committed save, or the one that was being saved (its commit may
have landed just before the kill). Each child is killed by pid in `finally`.
"""

import os
import queue
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS
from tfra_dynamic_embedding.tables import files, native

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAVE_LOOP = os.path.join(ROOT, "tests", "fs_save_loop.py")
N_KEYS = 200_000
DIM = 32
LOADS = ("same", "entire_dir", "restore_function")


def _creator(backend):
    if backend == "native":
        if not native.is_available():
            pytest.skip("native op library not built (run `make ops`)")
        return de.NativeKVCreator()
    return de.BuiltinKVCreator()


class Writer:
    """A fs_save_loop.py child; its stdout lines arrive on a queue (a reader thread)."""

    def __init__(self, directory, backend, first_generation, proc_rank=0, proc_size=1):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                   PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, SAVE_LOOP, directory, backend, str(N_KEYS), str(DIM),
             str(first_generation), str(proc_rank), str(proc_size)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.lines = queue.Queue()
        self.saved = []       # (generation, seconds) of completed saves
        self.started = []     # generations whose save began
        self._stderr = []
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put),
                             daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._stderr.append),
                             daemon=True)]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _pump(stream, sink):
        for line in stream:
            sink(line)
        sink(None)

    def next_event(self, deadline):
        """The next `saving`/`saved` line, parsed; fails the test when the child dies or stalls."""
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("the save loop stalled:\n" + "".join(self._stderr[-20:]))
            if line is None:
                raise AssertionError("the save loop died:\n" + "".join(self._stderr[-40:]))
            parts = line.split()
            if parts and parts[0] == "saving":
                self.started.append(int(parts[1]))
                return "saving", int(parts[1])
            if parts and parts[0] == "saved":
                self.saved.append((int(parts[1]), float(parts[2])))
                return "saved", int(parts[1])

    def kill(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        for thread in self._threads:
            thread.join(timeout=10)
        # Lines printed before the kill still count.
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            parts = (line or "").split()
            if parts and parts[0] == "saved":
                self.saved.append((int(parts[1]), float(parts[2])))
            elif parts and parts[0] == "saving":
                self.started.append(int(parts[1]))


def load_generations(directory, backend, how, shards=2):
    """The distinct row values a load finds (one per complete save it read), checking that every
    key is there; raises AssertionError on a missing or extra key."""
    var = de.Variable(key_dtype=tf.int64, dim=DIM, devices=CPUS[:shards], name="emb",
                      kv_creator=_creator(backend))
    if how == "same":
        var.load_from_file_system(directory)
    elif how == "entire_dir":
        var.load_from_file_system(directory, load_entire_dir=True)
    else:
        var.load_from_file_system_with_restore_function(directory)
    keys, values = var.export()
    keys = np.sort(keys.numpy())
    assert keys.shape == (N_KEYS,) and keys[0] == 0 and keys[-1] == N_KEYS - 1, (
        f"{how} load found {keys.shape[0]} keys, not the {N_KEYS} saved")
    return sorted(np.unique(values.numpy()).tolist())


@pytest.mark.parametrize("backend", ["native", "builtin"])
def test_sigkill_mid_save_leaves_one_whole_generation(backend, tmp_path):
    _creator(backend)
    directory = str(tmp_path / "kv")
    rng = random.Random()
    seed = rng.randrange(2**32)
    rng.seed(seed)
    first = 1
    deadline = time.monotonic() + 240
    for cycle in range(4):
        writer = Writer(directory, backend, first)
        try:
            # Learn how long a save takes, then kill at a random moment of a later one.
            while len(writer.saved) < 2:
                writer.next_event(deadline)
            while writer.next_event(deadline)[0] != "saving":
                pass
            typical = statistics.median(s for _, s in writer.saved)
            time.sleep(rng.uniform(0.0, 1.2 * typical))
        finally:
            writer.kill()
        committed = max(g for g, _ in writer.saved)
        allowed = {committed, committed + 1}
        for how, shards in [("same", 2), ("entire_dir", 3), ("restore_function", 1)]:
            found = load_generations(directory, backend, how, shards)
            assert len(found) == 1 and found[0] in allowed, (
                f"cycle {cycle} (seed {seed}): a {how} load after SIGKILL found rows of "
                f"generations {found}; committed {committed}, in flight {writer.started[-1]}")
        first = max(writer.started) + 1


@pytest.mark.parametrize("backend", ["native", "builtin"])
def test_reader_while_writer_saves_never_sees_a_mix(backend, tmp_path):
    _creator(backend)
    directory = str(tmp_path / "kv")
    writer = Writer(directory, backend, 1)
    whole, mixed, failed = 0, [], []
    try:
        deadline = time.monotonic() + 120
        while not writer.saved:
            writer.next_event(deadline)
        stop = time.monotonic() + 6
        i = 0
        while (time.monotonic() < stop or whole < 6) and time.monotonic() < deadline:
            how = LOADS[i % len(LOADS)]
            i += 1
            try:
                found = load_generations(directory, backend, how, shards=2 if how == "same" else 3)
            except tf.errors.OpError as error:
                # A reader slower than two commits loses its generation: an error, never a mix.
                if not (isinstance(error, (tf.errors.NotFoundError, tf.errors.DataLossError))
                        or "is incomplete" in error.message):
                    raise
                failed.append(f"{how}: {type(error).__name__}")
                continue
            except AssertionError as error:
                mixed.append(f"{how}: {error}")
                continue
            if len(found) == 1:
                whole += 1
            else:
                mixed.append(f"{how}: generations {found}")
    finally:
        writer.kill()
    assert len(writer.saved) >= 3, "the writer should have committed several saves meanwhile"
    assert not mixed, f"{len(mixed)} of {whole + len(mixed)} loads mixed saves: {mixed[:5]}"
    assert whole >= 6 and len(failed) <= whole, (whole, failed)


# -- layout, cleanup and leftovers (in process) ---------------------------------------------------

def _filled(kv_creator, value, name="emb", shards=2, keys=range(0, 60, 3)):
    var = de.Variable(key_dtype=tf.int64, dim=3, devices=CPUS[:shards], name=name,
                      kv_creator=kv_creator)
    keys = np.asarray(list(keys), np.int64)
    var.upsert(tf.constant(keys), tf.fill([len(keys), 3], float(value)))
    return var


def _loaded(kv_creator, directory, how="same", shards=2, name="emb", **kwargs):
    """{key: row value} after a load into a fresh variable (rows here are constant per save)."""
    var = de.Variable(key_dtype=tf.int64, dim=3, devices=CPUS[:shards], name=name,
                      kv_creator=kv_creator)
    if how == "same":
        var.load_from_file_system(directory, **kwargs)
    elif how == "entire_dir":
        var.load_from_file_system(directory, load_entire_dir=True, **kwargs)
    else:
        var.load_from_file_system_with_restore_function(directory, **kwargs)
    keys, values = var.export()
    assert np.all(values.numpy() == values.numpy()[:, :1])
    return dict(zip(keys.numpy().tolist(), values.numpy()[:, 0].tolist()))


def _generations(directory, stem="emb_rank0_size1"):
    return sorted(n for n in os.listdir(directory) if n.startswith(stem + ".gen-"))


def _record(directory, stem="emb_rank0_size1"):
    with open(os.path.join(directory, stem + ".commit"), encoding="utf-8") as f:
        return f.read().strip()


def test_commit_keeps_the_previous_generation_and_removes_older_and_leftovers(kv_creator,
                                                                            tmp_path):
    directory = str(tmp_path)
    var = _filled(kv_creator, 1)
    var.save_to_file_system(directory)
    first = _record(directory)
    assert _generations(directory) == [first]
    var.upsert(tf.constant([0], tf.int64), tf.fill([1, 3], 2.0))
    var.save_to_file_system(directory)
    second = _record(directory)
    assert second != first and _generations(directory) == sorted([first, second])

    # Leftovers of interrupted saves, and another variable's save, in the same directory.
    junk = os.path.join(directory, "emb_rank0_size1.gen-99999999999999999-1")
    os.makedirs(junk)
    for name in ("emb_mht_1of2_rank0_size1", "emb_mht_2of2_rank0_size1",
                 "emb_mht_1of2_rank0_size1-keys"):
        with open(os.path.join(junk, name), "wb") as f:
            f.write(b"half a save")
    with open(os.path.join(directory, "emb_rank0_size1.commit.tmp-1-2"), "w") as f:
        f.write("emb_rank0_size1.gen-99999999999999999-1\n")
    other = _filled(kv_creator, 7, name="other")
    other.save_to_file_system(directory)
    other_generation = _record(directory, "other_rank0_size1")

    # Loads read the committed save only.
    want = {k: (2.0 if k == 0 else 1.0) for k in range(0, 60, 3)}
    for how, shards in [("same", 2), ("entire_dir", 3), ("restore_function", 1)]:
        assert _loaded(kv_creator, directory, how, shards) == want, how

    var.save_to_file_system(directory)
    third = _record(directory)
    # Kept: the new and the previous generation; gone: the first, the junk, the stale record.
    assert _generations(directory) == sorted([second, third])
    assert not os.path.exists(junk)
    assert not any(".tmp-" in n for n in os.listdir(directory))
    assert _generations(directory, "other_rank0_size1") == [other_generation]
    assert _loaded(kv_creator, directory, name="other") == {k: 7.0 for k in range(0, 60, 3)}


def test_a_committed_save_supersedes_plain_tfra_files(kv_creator, tmp_path):
    directory = str(tmp_path)
    old = _filled(kv_creator, 1)
    # Plain TFRA layout (what TFRA or an older version of this package wrote): no record.
    for i, table in enumerate(old.tables):
        table.save_to_file_system(directory,
                                  file_name=f"emb_mht_{i + 1}of2_rank0_size1")
    assert not any(n.endswith(".commit") for n in os.listdir(directory))
    for how, shards in [("same", 2), ("entire_dir", 3)]:
        assert set(_loaded(kv_creator, directory, how, shards).values()) == {1.0}
    _filled(kv_creator, 5, keys=range(100, 110)).save_to_file_system(directory)
    for how, shards in [("same", 2), ("entire_dir", 3), ("restore_function", 1)]:
        assert _loaded(kv_creator, directory, how, shards) == {k: 5.0 for k in range(100, 110)}


def test_ranks_commit_their_own_saves(kv_creator, tmp_path):
    directory = str(tmp_path)
    for step in (1, 2, 3):  # interleaved saves of two ranks into one directory
        for rank in (0, 1):
            var = _filled(kv_creator, 10 * rank + step, keys=range(rank, 40, 2))
            var.save_to_file_system(directory, proc_size=2, proc_rank=rank)
    for rank in (0, 1):
        stem = f"emb_rank{rank}_size2"
        assert len(_generations(directory, stem)) == 2  # its own current and previous
        assert _loaded(kv_creator, directory, proc_size=2, proc_rank=rank) == {
            k: 10.0 * rank + 3 for k in range(rank, 40, 2)}
        assert _loaded(kv_creator, directory, "restore_function", 3, proc_size=2,
                       proc_rank=rank) == {k: 10.0 * rank + 3 for k in range(rank, 40, 2)}
    assert _loaded(kv_creator, directory, "entire_dir", 3) == {
        k: 10.0 * (k % 2) + 3 for k in range(40)}


def test_graph_save_op_commits_a_new_generation_per_run(kv_creator, tmp_path):
    """A save op built once writes a fresh generation each run, and a load op built once reads
    the save committed when it runs."""
    directory = str(tmp_path)
    with tf.Graph().as_default():
        var = de.Variable(key_dtype=tf.int64, dim=3, devices=CPUS[:2], name="emb",
                          kv_creator=kv_creator)
        value = tf.compat.v1.placeholder(tf.float32, [])
        write = var.upsert(tf.constant([1, 2, 3], tf.int64), tf.fill([3, 3], value))
        save = var.save_to_file_system(tf.constant(directory))  # a directory tensor works too
        target = de.Variable(key_dtype=tf.int64, dim=3, devices=CPUS[:3], name="emb",
                             kv_creator=kv_creator)
        loads = {"same": None,
                 "entire_dir": target.load_from_file_system(directory, load_entire_dir=True),
                 "restore_function": target.load_from_file_system_with_restore_function(
                     directory)}
        same_target = de.Variable(key_dtype=tf.int64, dim=3, devices=CPUS[:2], name="emb",
                                  kv_creator=kv_creator)
        loads["same"] = same_target.load_from_file_system(directory)
        with tf.compat.v1.Session() as sess:
            seen = []
            for step in (1.0, 2.0, 3.0):
                sess.run(write, {value: step})
                sess.run(save)
                seen.append(_record(directory))
                for how, load in loads.items():
                    sess.run(load)
                    reader = same_target if how == "same" else target
                    np.testing.assert_array_equal(
                        sess.run(reader.lookup(tf.constant([1, 2, 3], tf.int64))),
                        np.full([3, 3], step))
    assert len(set(seen)) == 3
    assert _generations(directory) == sorted(seen[1:])


def test_function_save_and_load(kv_creator, tmp_path):
    directory = str(tmp_path)
    var = _filled(kv_creator, 1)
    target = de.Variable(key_dtype=tf.int64, dim=3, devices=CPUS[:3], name="emb",
                         kv_creator=kv_creator)

    @tf.function
    def save():
        var.save_to_file_system(directory)

    @tf.function
    def load():
        target.load_from_file_system(directory, load_entire_dir=True)

    for step in (1.0, 2.0):
        var.upsert(tf.constant([0], tf.int64), tf.fill([1, 3], step))
        save()
        load()
        assert float(target.lookup(tf.constant([0], tf.int64))[0, 0]) == step
    assert len(_generations(directory)) == 2


def test_corrupt_record_and_missing_generation_are_errors(kv_creator, tmp_path):
    directory = str(tmp_path)
    _filled(kv_creator, 1).save_to_file_system(directory)
    generation = _record(directory)
    target = _filled(kv_creator, 9)
    record = os.path.join(directory, "emb_rank0_size1.commit")
    with open(record, "w") as f:
        f.write("../../etc\n")
    for kwargs in ({}, {"load_entire_dir": True}):
        with pytest.raises(tf.errors.InvalidArgumentError, match="corrupt commit record"):
            target.load_from_file_system(directory, **kwargs)
    with open(record, "w") as f:
        f.write("emb_rank0_size1.gen-1-1\n")  # a generation that is not there
    with pytest.raises(tf.errors.NotFoundError):
        target.load_from_file_system(directory)
    with pytest.raises(tf.errors.InvalidArgumentError, match="is incomplete"):
        target.load_from_file_system(directory, load_entire_dir=True)
    # A generation missing a shard file (as when a newer save deletes it under a slow reader).
    with open(record, "w") as f:
        f.write(generation + "\n")
    shard = [n for n in os.listdir(os.path.join(directory, generation)) if "_mht_2of2" in n]
    os.remove(os.path.join(directory, generation, shard[0]))
    for kwargs in ({}, {"load_entire_dir": True}):
        with pytest.raises((tf.errors.NotFoundError, tf.errors.InvalidArgumentError)):
            target.load_from_file_system(directory, **kwargs)
    keys, values = target.export()
    assert sorted(keys.numpy().tolist()) == list(range(0, 60, 3))
    assert np.all(values.numpy() == 9.0)  # failed loads changed nothing


def test_bad_arguments_name_the_argument(tmp_path):
    var = _filled(None, 1)
    with pytest.raises(ValueError, match="proc_rank must be an int in \\[0, proc_size=2\\); got 2"):
        var.save_to_file_system(str(tmp_path), proc_size=2, proc_rank=2)
    with pytest.raises(ValueError, match="proc_size must be an int >= 1; got 0"):
        var.load_from_file_system(str(tmp_path), proc_size=0)
    with pytest.raises(ValueError, match="file_name_list must hold plain file names"):
        var.save_to_file_system(str(tmp_path), file_name_list=["a/b", "c"])
    with pytest.raises(ValueError, match="dirpath must name a directory; got ''"):
        var.save_to_file_system("", dirpath_env=None)
    assert os.listdir(tmp_path) == []


def test_commit_op_checks_its_inputs(tmp_path):
    if not native.is_available():
        pytest.skip("native op library not built (run `make ops`)")
    directory = str(tmp_path)
    os.makedirs(os.path.join(directory, "v_rank0_size1.gen-1-1"))
    open(os.path.join(directory, "v_rank0_size1.gen-1-1", "a"), "w").close()
    bad = [
        (dict(dirpath=""), "dirpath must not be empty"),
        (dict(record="v_rank0_size1"), "record must be '<stem>.commit'"),
        (dict(record="x/v_rank0_size1.commit"), "record must be a plain file name"),
        (dict(generation=".."), "generation must be a plain file name"),
        (dict(generation="w_rank0_size1.gen-1-1"), "generation must be 'v_rank0_size1.gen-<id>'"),
        (dict(expected_files=["../a"]), "expected_files must be a plain file name"),
        (dict(dirpath=["a", "b"]), "dirpath must be a scalar string"),
    ]
    good = dict(dirpath=directory, record="v_rank0_size1.commit",
                generation="v_rank0_size1.gen-1-1", expected_files=["a"])
    for change, message in bad:
        args = dict(good, **change)
        with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(message)):
            native.commit_save(**args)
    with pytest.raises(tf.errors.NotFoundError, match="was not committed"):
        native.commit_save(**dict(good, expected_files=["a", "b"]))
    assert not os.path.exists(os.path.join(directory, "v_rank0_size1.commit"))
    native.commit_save(**good)
    assert _record(directory, "v_rank0_size1") == "v_rank0_size1.gen-1-1"


def test_commit_without_the_op_library_runs_in_python(tmp_path, monkeypatch):
    """Built-in tables and a py_function commit: eager and v1 graphs."""
    monkeypatch.setattr(files.native, "is_available", lambda: False)
    directory = str(tmp_path)
    creator = de.BuiltinKVCreator()
    var = _filled(creator, 1)
    var.save_to_file_system(directory)
    first = _record(directory)
    with tf.Graph().as_default():
        graph_var = _filled(creator, 2)  # graph mode: the upsert is an op
        save = graph_var.save_to_file_system(directory)
        write = graph_var.upsert(tf.constant([0], tf.int64), tf.fill([1, 3], 3.0))
        with tf.compat.v1.Session() as sess:
            sess.run(graph_var.upsert(tf.constant(list(range(0, 60, 3)), tf.int64),
                                      tf.fill([20, 3], 2.0)))
            sess.run(save)
            second = _record(directory)
            sess.run(write)
            sess.run(save)
    third = _record(directory)
    assert len({first, second, third}) == 3 and _generations(directory) == sorted([second, third])
    want = {k: (3.0 if k == 0 else 2.0) for k in range(0, 60, 3)}
    assert _loaded(creator, directory) == want
    assert _loaded(creator, directory, "entire_dir", 3) == want
    # (a py_function reports Python errors as UnknownError)
    with pytest.raises(tf.errors.OpError, match="was not committed"):
        files.commit(directory, "emb_rank0_size1.commit", first, ["missing"])
    assert _record(directory) == third
