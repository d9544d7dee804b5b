"""TF2 remote client: one client process connected to PS tasks
(`tf.config.experimental_connect_to_cluster`), de.Variables sharded over `/job:ps/...`.

Every op, training with three optimizer families, PS-side checkpoints (tf.train.Checkpoint and
de.FileSystemSaver) restored into another PS count and into one process, a save killed midway,
and a PS killed mid-training. Client scripts are tests/distributed/remote_*.py; each runs in its
own process, and the single-process reference runs the same script with MODE local.
"""

import json
import os
import time

import numpy as np

from tests.distributed import procs

# The client scripts must not see the TF_CONFIG that LocalCluster.run sets (they pass the
# cluster explicitly); TF_USE_LEGACY_KERAS=1 makes tf.keras tf_keras (Keras 3 stays `keras`).
ENV = {"TF_CONFIG": "", "TF_USE_LEGACY_KERAS": "1"}


def _run(cluster, name, mode, *args, env=None, timeout=150):
    return procs.run_script(cluster, name, mode, json.dumps(cluster.spec), *args,
                            job="client" if mode == "remote" else "local",
                            env=dict(ENV, **(env or {})), timeout=timeout)


def _assert_on_owner(shards, n_ps):
    """Shard i's table is on /job:ps/task:i and holds exactly the keys it owns (key % n)."""
    assert [s["device"] for s in shards] == [
        f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(n_ps)]
    assert all(s["size"] == s["owned"] for s in shards), shards
    assert sum(s["size"] for s in shards) > 0


def test_every_variable_op_on_remote_tables_equals_one_process(make_cluster):
    cluster = make_cluster(ps=2, servers=("ps",))
    remote = _run(cluster, "remote_ops.py", "remote")
    local = _run(cluster, "remote_ops.py", "local")
    assert remote["results"] == local["results"]   # exact: floats round-trip through JSON
    results = remote["results"]
    assert results["size_after_upsert"] == [10, 5, 5]
    assert results["lookup"][1] == [True, True, False, False, True]
    assert results["find_or_insert"][1:] == [[False, False, True], 12]
    assert results["size_after_remove"] == [9, 5, 4]
    assert results["shard1_export_keys"] == [1, 5, 7, 9, 301]
    assert results["size_after_clear"] == [0, 0, 0]
    assert results["e_size"] == 4
    assert results["restrict"][0] == [0, 1, 2, 3, 4, 5]
    for name in ("w", "e", "r", "r_status"):
        _assert_on_owner(remote["placement"][name], 2)
    # Delta export: 20 rows in full, then 3 upserts (one new key) and 2 removals; each shard's
    # rows were hashed on its own PS.
    assert results["delta"][:3] == [20, 3, 2] and results["delta"][3] == [3, 8, 25]
    assert results["delta"][5:] == [[4, 11], False]
    for i, devices in enumerate(remote["placement"]["d_hashing"]):
        assert devices and all(d.startswith(f"/job:ps/replica:0/task:{i}") for d in devices), devices


def _assert_tables_equal(got, want):
    for family in want:
        g, w = got[family], want[family]
        assert np.array_equal(g["emb"]["keys"], w["emb"]["keys"]), family
        assert np.array_equal(g["emb"]["values"], w["emb"]["values"]), family
        assert sorted(g["slots"]) == sorted(w["slots"]) and len(w["slots"]) == 2, family
        for slot in w["slots"]:
            assert np.array_equal(g["slots"][slot]["keys"], w["slots"][slot]["keys"])
            assert np.array_equal(g["slots"][slot]["values"], w["slots"][slot]["values"])


def test_training_and_ps_side_checkpoints_restore_into_other_ps_counts(make_cluster, tmp_path):
    two = make_cluster(ps=2, servers=("ps",))
    trained = _run(two, "remote_train.py", "remote", tmp_path / "remote")
    reference = _run(two, "remote_train.py", "local", tmp_path / "local")
    # Rows, slots, dense weights and step counters equal the one-process run exactly.
    assert trained["state"] == reference["state"]
    _assert_tables_equal(trained["state"], reference["state"])
    for family, where in trained["placement"].items():
        _assert_on_owner(where["emb"], 2)
        assert len(where["slots"]) == 2, family
        for slot_shards in where["slots"].values():   # slots live with their rows
            _assert_on_owner(slot_shards, 2)
    # tf.train.Checkpoint: the rows are saved by PS 0's SaveV2 (TF saves a tensor on its task):
    # one data file per writing task (client, PS 0) plus the FileSystemSaver's shard-count file.
    assert trained["saved_tensor_devices"] == ["/job:ps/replica:0/task:0/device:CPU:0"]
    assert len(trained["data_files"]) == 3 and reference["data_files"] != trained["data_files"]
    # de.FileSystemSaver: one file per PS shard (written by that PS), one commit per table.
    fs_dir = tmp_path / "remote" / "ckpt" / "TFRADynamicEmbedding"
    shard_files = sorted(name for _, _, names in os.walk(fs_dir) for name in names
                         if "_mht_" in name)
    assert len(shard_files) == 6 and all("of2_rank0_size1" in n for n in shard_files)

    path = trained["path"]
    three = make_cluster(ps=3, servers=("ps",))
    resharded = _run(three, "remote_train.py", "remote", tmp_path / "r3", "--restore", path)
    _assert_tables_equal(resharded["state"], trained["state"])
    for family, where in resharded["placement"].items():
        _assert_on_owner(where["emb"], 3)
        for slot_shards in where["slots"].values():
            _assert_on_owner(slot_shards, 3)
    single = _run(three, "remote_train.py", "local", tmp_path / "r1", "--restore", path,
                  env={"LOCAL_SHARDS": "1"})
    _assert_tables_equal(single["state"], trained["state"])


def test_save_killed_midway_leaves_the_previous_checkpoint_loadable(make_cluster, tmp_path):
    cluster = make_cluster(ps=2, servers=("ps",))
    directory = tmp_path / "ckpt"
    proc = procs.start_script(cluster, "client", 0, "remote_save_loop.py", "remote",
                              json.dumps(cluster.spec), directory, env=ENV)
    assert procs.wait_for_output(cluster, "client", 0, proc, "saved 4", timeout=90), \
        cluster.log("client", 0)
    cluster.kill("client", 0)   # SIGKILL, most likely inside save 5 (a save takes ~0.1 s)
    last = max(int(line.split()[1]) for line in cluster.log("client", 0).splitlines()
               if line.startswith("saved "))
    check = _run(cluster, "remote_save_loop.py", "local", directory, "--check",
                 env={"LOCAL_SHARDS": "1"})
    n = check["save_counter"]
    assert n >= last and check["path"].endswith(f"model-{n}")
    assert check["t"] == {"keys": list(range(200)), "row_values": [float(n)]}
    # The files hold the latest committed save: this one or the one the kill interrupted
    # after its commit -- whole, never a mix.
    assert check["f"]["keys"] == list(range(200))
    assert check["f"]["row_values"] in ([float(n)], [float(n + 1)])


def test_ps_killed_mid_training_fails_fast_naming_it_and_a_restart_resumes(make_cluster,
                                                                           tmp_path):
    cluster = make_cluster(ps=2, servers=("ps",))
    directory = tmp_path / "ckpt"
    proc = procs.start_script(cluster, "client", 0, "remote_kill.py", "remote",
                              json.dumps(cluster.spec), directory, env=ENV)
    assert procs.wait_for_output(cluster, "client", 0, proc, "\ncheckpointed", timeout=90), \
        cluster.log("client", 0)
    time.sleep(0.5)   # mid-training
    killed = time.monotonic()
    cluster.kill("ps", 1)
    failed = procs.wait_json(cluster, "client", 0, proc, timeout=90)
    elapsed = time.monotonic() - killed
    assert elapsed < 60, elapsed
    assert failed["error"] == "UnavailableError" and failed["steps"] > 3
    assert f"/job:ps/replica:0/task:1 at {cluster.address('ps', 1)}" in failed["message"]
    checkpointed = next(json.loads(line)["checkpointed"]
                        for line in cluster.log("client", 0).splitlines()
                        if line.startswith('{"checkpointed"'))

    cluster.start_server("ps", 1)   # same address, empty tables
    resumed = _run(cluster, "remote_kill.py", "remote", directory, "--resume")
    assert resumed["restored"] == checkpointed
    assert len(checkpointed["slots"]) == 2 and checkpointed["emb"]["keys"]
    assert resumed["grew"] == len(np.unique(np.random.default_rng(100).integers(0, 50, size=16)))
    print(f"PS kill -> client error in {elapsed:.2f} s")


def test_eviction_and_admission_on_remote_tables_equal_one_process(make_cluster, tmp_path):
    """A capacity bound (LRU native, LFU built-in) with count admission, trained on 2 PS tasks,
    checkpointed mid-way and restored: the same keys, rows and slots as in one process."""
    cluster = make_cluster(ps=2, servers=("ps",))
    remote = _run(cluster, "remote_online.py", "remote", tmp_path / "remote")
    local = _run(cluster, "remote_online.py", "local", tmp_path / "local")
    bound = 24   # as in remote_online.py
    assert remote["admitted_ever"] > bound + 10          # the bound had to evict
    assert remote["sizes"] == local["sizes"]
    assert max(max(s) for s in remote["sizes"]) == bound  # reached, never exceeded
    assert remote["state"] == local["state"]              # exact: rows and slots
    for backend in ("native", "builtin"):
        state = remote["state"][backend]
        assert len(state["emb"]["keys"]) == bound and len(state["slots"]) == 1
        assert state["slots"][0]["keys"] == state["emb"]["keys"]
    # Restored from the mid-way checkpoint (recency, counts, admission counts included), the
    # next steps evict and admit exactly as the run that went on.
    assert remote["restored_sizes"] == remote["sizes"][-len(remote["restored_sizes"]):]
    assert remote["restored_state"] == remote["state"]
    assert remote["devices"] == [f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(2)]
    for shards in remote["placement"].values():
        _assert_on_owner(shards, 2)
