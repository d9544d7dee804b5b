"""Kernel micro-benchmarks: the protocol, the tf_cpu backend, collection and the estimator."""

import argparse
import gzip
import importlib.util
import json
import os

import numpy as np
import pytest

from tfra_dynamic_embedding.placement import benchmark, comm, estimators, evaluate, workloads
from tfra_dynamic_embedding.placement import cost_model as cm
from tfra_dynamic_embedding.placement.benchmark import collect, protocol, tf_cpu, torch_cuda
from tfra_dynamic_embedding.placement.benchmark import records as records_lib
from tfra_dynamic_embedding.placement.types import Plan, Shard, TableSpec, Task, make_devices
from tfra_dynamic_embedding.placement.features import NUM_FEATURES

from tests.placement.helpers import run_cli, run_python

DATA = os.path.join(os.path.dirname(benchmark.__file__), os.pardir, "data",
                    "cpu_shards.jsonl.gz")


# -- protocol ------------------------------------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_measure_warms_up_flushes_and_trims():
    clock = FakeClock()
    calls = {"a": 0, "b": 0, "flush": 0, "sync": 0}
    durations = {"a": iter([9.0, 9.0, 0.001, 0.005, 0.002, 0.004, 0.003]),   # 2 warm-ups first
                 "b": iter([9.0, 9.0, 0.010, 0.050, 0.020, 0.030, 0.100])}

    def stage(name):
        def run():
            calls[name] += 1
            clock.now += next(durations[name])
        return run

    def flush():
        calls["flush"] += 1

    def sync():
        calls["sync"] += 1

    out = protocol.measure({"a": stage("a"), "b": stage("b")}, warmup=2, repeat=5, flush=flush,
                           clock=clock, sync=sync)
    assert calls["a"] == calls["b"] == 7
    assert calls["flush"] == 10            # one per timed call, none in warm-up
    assert calls["sync"] == 2 + 2 * 10     # after each warm-up round, around each timed call
    assert out["a"] == pytest.approx(3.0)  # ms of 2, 3, 4 (1 and 5 dropped)
    assert out["b"] == pytest.approx(100 / 3)  # ms of 20, 30, 50 (10 and 100 dropped)
    assert out["raw"]["a"] == pytest.approx([1.0, 5.0, 2.0, 4.0, 3.0])


def test_garbage_collector_is_off_only_in_timed_calls():
    import gc  # pylint: disable=import-outside-toplevel
    seen = []
    protocol.measure({"a": lambda: seen.append(gc.isenabled())}, warmup=1, repeat=3)
    assert seen == [True, False, False, False]   # on in the warm-up, off when timed
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        protocol.measure({"a": lambda: (_ for _ in ()).throw(RuntimeError("boom"))}, warmup=0)
    assert gc.isenabled()                        # restored after a failing stage too


def test_trimmed_mean_and_errors():
    assert protocol.trimmed_mean([5, 1, 100, 3]) == 4.0
    assert protocol.trimmed_mean([2, 4]) == 3.0
    with pytest.raises(ValueError, match="at least one"):
        protocol.trimmed_mean([])
    with pytest.raises(ValueError, match="repeat"):
        protocol.measure({"a": lambda: None}, repeat=0)
    assert protocol.split_stages(2.0, 5.0) == (2.0, 3.0, 5.0)
    assert protocol.split_stages(2.0, 1.5) == (2.0, 0.0, 2.0)


def test_llc_size_from_sys_and_fallback(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"),
                                             (2, "Unified", "1024K"), (3, "Unified", "16384K")]):
        entry = tmp_path / f"index{i}"
        entry.mkdir()
        (entry / "level").write_text(f"{level}\n")
        (entry / "type").write_text(f"{kind}\n")
        (entry / "size").write_text(f"{size}\n")
    assert protocol.llc_bytes(str(tmp_path)) == 16 * 2 ** 20
    assert protocol.llc_bytes(str(tmp_path / "missing")) > 0   # lscpu or 64 MiB
    flusher = protocol.CacheFlusher(size_bytes=1024)
    flusher()
    assert flusher.calls == 1 and flusher.buffer.nbytes == 2048 and flusher.buffer[0] == 1


def test_bag_bookkeeping():
    offsets = np.array([0, 2, 2, 5])
    np.testing.assert_array_equal(protocol.bag_rows(offsets), [0, 0, 2, 2, 2])
    np.testing.assert_array_equal(protocol.bag_positions(offsets), [0, 1, 0, 1, 2])
    ix, off = protocol.slice_batch([4, 5, 6, 7, 8], offsets, 0, 2)
    np.testing.assert_array_equal(ix, [4, 6, 8])
    np.testing.assert_array_equal(off, [0, 1, 1, 3])


# -- tf_cpu ----------------------------------------------------------------------------------------
TINY = [TableSpec("a", rows=50, dim=4, pooling_factor=3.0),
        TableSpec("b", rows=20, dim=8, pooling_factor=1.0)]


def test_tf_cpu_is_deterministic_given_a_seed():
    runs = [tf_cpu.benchmark_shard(TINY, batch_size=16, seed=seed, warmup=1, repeat=3,
                                   flush=False, return_kernels=True) for seed in (3, 3, 4)]
    states = [r["kernels"].table_state() for r in runs]
    for k in range(len(TINY)):
        np.testing.assert_array_equal(states[0][k][0], states[1][k][0])
        np.testing.assert_array_equal(states[0][k][1], states[1][k][1])
        assert len(states[0][k][0]) > 0
    assert not np.array_equal(states[0][0][1], states[2][0][1])  # another seed, other values
    first = runs[0]
    assert first["lookups"] == runs[1]["lookups"] > 0
    assert first["total_ms"] == pytest.approx(first["forward_ms"] + first["backward_ms"])
    assert first["forward_ms"] > 0 and first["backward_ms"] >= 0
    assert tf_cpu.shard_key(TINY, 16) == tf_cpu.shard_key(list(reversed(TINY)), 16)
    assert tf_cpu.shard_key(TINY, 16) != tf_cpu.shard_key(TINY, 32)


def test_shards_built_one_after_another_log_no_retracing_warnings():
    # each shard traces its own tf.functions once; TF would warn about "retracing" from the
    # fifth shard on, drowning a collection's progress
    import logging  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    tf.get_logger().addHandler(handler)
    try:
        for seed in range(7):
            kernels = tf_cpu.ShardKernels(TINY, batch_size=16, seed=seed)
            kernels.forward()
            kernels.step()
    finally:
        tf.get_logger().removeHandler(handler)
    assert not [message for message in seen if "retracing" in message]


def test_devices_measured_together_run_in_interleaved_rounds(monkeypatch):
    order = []
    real_measure = protocol.measure

    def recording_measure(stages, **kwargs):
        wrapped = {}
        for name, fn in stages.items():
            def call(name=name, fn=fn):
                order.append(name)
                return fn()
            wrapped[name] = call
        return real_measure(wrapped, **kwargs)

    monkeypatch.setattr(protocol, "measure", recording_measure)
    devices = [[TINY[0]], [TINY[1]], TINY]
    results = tf_cpu.benchmark_devices(devices, batch_size=16, warmup=1, repeat=3, flush=False)
    one_round = [(k, stage) for k in range(3) for stage in ("step", "forward")]
    assert order == one_round * 4            # 1 warm-up + 3 timed rounds, every device in each
    assert [r["lookups"] for r in results][2] == results[0]["lookups"] + results[1]["lookups"]
    alone = tf_cpu.benchmark_shard(TINY, batch_size=16, warmup=1, repeat=3, flush=False)
    assert alone["lookups"] == results[2]["lookups"]
    assert all(r["total_ms"] == pytest.approx(r["forward_ms"] + r["backward_ms"])
               and r["forward_ms"] > 0 for r in results)


@pytest.fixture
def measure_calls(monkeypatch):
    """The number of devices of each `benchmark_devices` call, in order."""
    calls = []
    real = tf_cpu.benchmark_devices

    def counting(devices, *args, **kwargs):
        calls.append(len(devices))
        return real(devices, *args, **kwargs)

    monkeypatch.setattr(tf_cpu, "benchmark_devices", counting)
    return calls


def test_a_plans_unmeasured_devices_are_measured_in_one_call(measure_calls):
    calls = measure_calls
    est = tf_cpu.MeasuredEstimator(batch_size=16, warmup=1, repeat=3, flush=False)
    task = Task(list(TINY), make_devices(3, template="/CPU:{i}"), batch_size=16)
    plan = Plan(task, {"a": ["/CPU:0"], "b": ["/CPU:1"]})          # /CPU:2 stays empty
    costs = est.plan_costs(plan)
    assert calls == [2] and est.measurements == 2
    assert costs["/CPU:2"] == 0.0 and costs["/CPU:0"] > 0 and costs["/CPU:1"] > 0
    swapped = Plan(task, {"a": ["/CPU:1"], "b": ["/CPU:2"]})        # same shards: cached
    assert sorted(est.plan_costs(swapped).values()) == sorted(costs.values())
    assert calls == [2]
    both = Plan(task, {"a": ["/CPU:0"], "b": ["/CPU:0"]})          # one new shard
    est.plan_costs(both)
    assert calls == [2, 1] and est.measurements == 3


def test_several_plans_and_extra_devices_are_measured_in_one_call(measure_calls):
    calls = measure_calls
    est = tf_cpu.MeasuredEstimator(batch_size=16, warmup=1, repeat=3, flush=False)
    task = Task(list(TINY), make_devices(2, template="/CPU:{i}"), batch_size=16)
    apart = Plan(task, {"a": ["/CPU:0"], "b": ["/CPU:1"]})
    mirrored = Plan(task, {"a": ["/CPU:1"], "b": ["/CPU:0"]})      # the same two devices
    est.measure_plans([apart, mirrored], extra_devices=[list(TINY)])
    assert calls == [3] and est.measurements == 3                # a, b and a+b, once each
    est.plan_costs(apart), est.plan_costs(mirrored), est.device_cost(list(TINY), None, task)
    assert calls == [3]                                          # all from the cache
    est.measure_plans([apart])
    assert calls == [3]


def test_beyond_max_together_plans_are_measured_in_groups_of_whole_plans(measure_calls):
    calls = measure_calls
    task = Task(list(TINY), make_devices(2, template="/CPU:{i}"), batch_size=16)
    apart = Plan(task, {"a": ["/CPU:0"], "b": ["/CPU:1"]})         # two devices
    both = Plan(task, {"a": ["/CPU:0"], "b": ["/CPU:0"]})          # one device: a+b
    for limit, expected in ((3, [3]), (2, [2, 1]), (1, [2, 1])):  # a plan is never split
        del calls[:]
        est = tf_cpu.MeasuredEstimator(batch_size=16, warmup=1, repeat=3, flush=False,
                                       max_together=limit)
        est.measure_plans([apart, both], extra_devices=[list(TINY)])   # a+b again: no new one
        assert calls == expected and est.measurements == 3
    with pytest.raises(ValueError, match="max_together"):
        tf_cpu.MeasuredEstimator(max_together=0)


def test_measured_estimator_scores_a_tiny_plan():
    assert "measured-cpu" in estimators.list_estimators()
    est = estimators.get_estimator("measured-cpu", batch_size=16, warmup=1, repeat=3, flush=False)
    assert est.measured and not est.additive
    task = Task(TINY + [TableSpec("c", rows=30, dim=4, pooling_factor=2.0)],
                make_devices(2, template="/CPU:{i}"), batch_size=65536)
    plan = Plan(task, {"a": ["/CPU:0"], "b": ["/CPU:1"], "c": ["/CPU:0", "/CPU:1"]})
    report = evaluate.evaluate_plan(plan, est, num_random=0)
    assert est.measurements == 2
    assert set(report.device_costs) == {"/CPU:0", "/CPU:1"}
    assert all(c > 0 for c in report.device_costs.values())
    assert plan.per_device["/CPU:0"].measured_cost == report.device_costs["/CPU:0"]
    assert plan.per_device["/CPU:0"].predicted_cost is None
    assert est.plan_costs(plan) == report.device_costs     # served from the cache
    assert est.measurements == 2
    assert est.device_cost([], None, task) == 0.0


def test_measuring_in_a_child_process_that_is_replaced():
    est = tf_cpu.MeasuredEstimator(batch_size=16, warmup=1, repeat=3, flush=False, threads=1,
                                   isolate=2, on_measure=lambda *args: seen.append(args[2]))
    seen = []
    shards = [[TINY[0]], [TINY[1]], TINY]
    costs = [est.device_cost(s, None, None) for s in shards]
    assert est.measurements == 3 and est.worker.started == 2      # replaced after 2 shards
    assert all(c > 0 for c in costs) and len(seen) == 3
    assert all(r["lookups"] > 0 and r["threads"] == 1 for r in seen)
    assert seen[2]["lookups"] == seen[0]["lookups"] + seen[1]["lookups"]
    with pytest.raises(RuntimeError, match="child process failed"):
        est.worker.measure(["not a shard"], 16, 0, 1, 3)
    est.worker.close()
    with pytest.raises(ValueError, match="limit"):
        tf_cpu.MeasuringProcess(0)


# -- collection ------------------------------------------------------------------------------------
def test_collect_cli_end_to_end_and_resume(tmp_path, capsys):
    out = str(tmp_path / "shards.jsonl")
    base = ["benchmark", "collect", "--out", out, "--pool-tables", "40", "--batch-size", "32",
            "--max-tables-per-shard", "2", "--warmup", "1", "--repeat", "3", "--no-flush",
            "--quiet", "--row-scale", "0.0001", "--pool-seed", "2"]
    assert run_cli(base + ["--records", "3"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["written"] == 3
    records = records_lib.read_records(out)
    assert len(records) == 3
    assert [r["source"].split(":")[0] for r in records] == ["random", "heuristic", "plan"]
    for record in records:
        assert record["backend"] == "tf_cpu" and record["batch_size"] == 32
        assert 1 <= len(record["tables"]) <= 2
        assert all(len(t["features"]) == NUM_FEATURES for t in record["tables"])
        assert record["total_ms"] == pytest.approx(record["forward_ms"] + record["backward_ms"],
                                                   abs=1e-4)
        shards = records_lib.record_shards(record)
        assert tf_cpu.shard_key(shards, 32) == record["key"]  # round trip of the specs
    with open(out, "a", encoding="utf-8") as f:
        f.write('{"torn": ')                                  # an interrupted write
    assert run_cli(base + ["--records", "4"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["written"], summary["skipped"]) == (1, 3)
    again = records_lib.read_records(out)
    assert [r["key"] for r in again[:3]] == [r["key"] for r in records]
    assert len(again) == 4 and again[3]["index"] == 3
    assert again[3]["source"] == "policy:learned"        # a device of the policy's own plan
    # --half train: shards only from the pool's first half, the one placement tasks train on
    half_out = str(tmp_path / "half.jsonl")
    half_args = [a if a != out else half_out for a in base] + ["--half", "train", "--records", "3"]
    assert run_cli(half_args) == 0
    first = {t.name for t in workloads.split_pool(collect.make_pool(2, 32, 40, 0.0001), seed=2)[0]}
    halves = records_lib.read_records(half_out)
    assert len(halves) == 3 and all(r["half"] == "train" for r in halves)
    assert all(t["name"] in first for r in halves for t in r["tables"])
    with pytest.raises(ValueError, match="half"):
        collect.make_pool(half="middle")


def test_sliced_source_records_row_slices(tmp_path, capsys):
    out = str(tmp_path / "sliced.jsonl")
    argv = ["benchmark", "collect", "--out", out, "--pool-tables", "40", "--batch-size", "64",
            "--max-tables-per-shard", "4", "--warmup", "1", "--repeat", "3", "--no-flush",
            "--quiet", "--row-scale", "0.001", "--pool-seed", "3", "--sources", "sliced",
            "--records", "6"]
    assert run_cli(argv) == 0
    records = records_lib.read_records(out)
    assert len(records) == 6 and {r["source"] for r in records} == {"sliced"}
    sliced = [(r, t) for r in records for t in r["tables"] if "slice" in t]
    assert sliced, "half of the tables should be row slices"
    for record, entry in sliced:
        index, n = entry["slice"]
        spec = TableSpec.from_dict(dict(entry["spec"], reuse_histogram=entry["features"][4:]))
        assert 0 <= index < n and entry["fraction"] == pytest.approx(
            spec.slice_rows(index, n) / spec.rows)
        whole = cm.shard_features(spec)
        np.testing.assert_allclose(entry["features"][1:4], whole[1:4] * entry["fraction"],
                                   rtol=1e-5)                     # rows, pooling, size scale
        np.testing.assert_allclose(entry["features"][4:], whole[4:], rtol=1e-5)
    for record in records:   # the key round-trips, and a slice measured only its own keys
        shards = records_lib.record_shards(record)
        assert tf_cpu.shard_key(shards, 64) == record["key"]
        kept = protocol.shard_batches(shards, 64, seed=0)
        assert record["lookups"] == sum(len(ix) for ix, _ in kept)
        assert all((ix % s.num_slices == s.index).all() for (ix, _), s in zip(kept, shards))
    gz = str(tmp_path / "sliced.jsonl.gz")
    with open(out, "rb") as src, gzip.open(gz, "wb") as dst:
        dst.write(src.read())
    assert records_lib.read_records(gz) == records                    # shipped data is gzipped
    with pytest.raises(ValueError, match="sources"):
        collect.collect(out, 1, sources=("sliced", "nope"))
    with pytest.raises(ValueError, match="--out must be a plain JSONL"):
        run_cli(argv[:3] + [gz] + argv[4:])
    capsys.readouterr()


def test_shipped_data_file_is_well_formed():
    if not os.path.exists(DATA):
        pytest.skip("no collected data file")
    assert os.path.getsize(DATA) < 5 * 2 ** 20
    records = records_lib.read_records(DATA)
    assert len(records) >= 50
    # a collection measures a shard once; whole full-size plans measure their devices once per
    # task (a table that two tasks both isolate on a device is measured in each)
    keys = [r["key"] for r in records if not r["source"].startswith("full-size-plans:")]
    assert len(set(keys)) == len(keys)
    for record in records:
        assert record["backend"] == "tf_cpu" and record["total_ms"] > 0
        assert all(len(t["features"]) == NUM_FEATURES for t in record["tables"])


# -- torch_cuda (numpy parts run everywhere) ----------------------------------------------------
def test_pieces_on_a_gpu_hold_their_own_rows():
    table = TableSpec("t", 10, 8, pooling_factor=4.0)
    assert torch_cuda.group_by_dim(TINY + [TableSpec("c", 5, 4)]) == {4: [0, 2], 8: [1]}
    assert torch_cuda.piece_rows(Shard(table, "", 1, 3)) == 3      # keys 1, 4, 7
    assert torch_cuda.piece_rows(table) == 10
    assert torch_cuda.piece_bytes([Shard(table, "", 0, 3), TINY[0]]) == (4 * 8 + 50 * 4) * 4
    keys, offsets = protocol.shard_batches([table], 32)[0]
    ids, sliced = torch_cuda.piece_batch(Shard(table, "", 1, 3), 32)
    kept = keys[keys % 3 == 1]
    np.testing.assert_array_equal(ids, kept // 3)
    assert ids.max() < 3 and sliced[-1] == len(kept) and len(sliced) == 33


def test_all_to_all_model():
    assert comm.pooled_bytes([TableSpec("a", 10, 16), Shard(TableSpec("b", 9, 8), "", 0, 3)],
                             1024) == 1024 * 24 * 4
    model = comm.AllToAll(bandwidth=1e9, latency=1e-5)
    assert model.stage_ms(8e6, 8) == pytest.approx((1e-5 + 7e6 / 1e9) * 1e3)
    assert model.step_ms(8e6, 8) == pytest.approx(2 * model.stage_ms(8e6, 8))
    assert model.step_ms(8e6, 1) == 0.0 and model.step_ms(0, 8) == 0.0
    with pytest.raises(ValueError, match="bandwidth"):
        comm.AllToAll(bandwidth=0)


TORCH_KERNELS_CHECK = """
import numpy as np
from tfra_dynamic_embedding.placement.benchmark import torch_cuda
from tfra_dynamic_embedding.placement.types import Shard, TableSpec
a, b = TableSpec("a", 50, 4, pooling_factor=3.0), TableSpec("b", 30, 4, pooling_factor=2.0)
shards = [Shard(a, "", 1, 2), Shard(b, "")]
kernels = torch_cuda.ShardKernels(shards, 16, device="cpu")
bag = kernels.bags[0]
before = bag.weight.detach().numpy().copy()
pooled = kernels.forward()[0].numpy()
shift = 0
for t, shard in enumerate(shards):
    ids, offsets = torch_cuda.piece_batch(shard, 16)
    for j in range(16):
        rows = before[shift + ids[offsets[j]:offsets[j + 1]]]
        np.testing.assert_allclose(pooled[t * 16 + j], rows.sum(axis=0), rtol=1e-5, atol=1e-6)
    shift += torch_cuda.piece_rows(shard)
kernels.step()   # SGD on sum(pooled): each row moves by -lr x its lookups
counts = np.bincount(kernels.inputs[0][0].numpy(), minlength=len(before))
np.testing.assert_allclose(bag.weight.detach().numpy(), before - 0.01 * counts[:, None],
                           rtol=1e-5, atol=1e-6)
result = torch_cuda.benchmark_devices([shards, [a]], 16, warmup=1, repeat=3, device="cpu")
assert [r["memory_bytes"] for r in result] == [(25 + 30) * 16, 50 * 16], result
assert result[0]["pooled_bytes"] == 16 * 8 * 4 and result[1]["total_ms"] > 0
# the estimator "measured-gpu": measured compute (cached by table set) + the modelled all-to-all
from tfra_dynamic_embedding.placement.comm import AllToAll
from tfra_dynamic_embedding.placement.types import Task, make_devices
task = Task([a, b], make_devices(4, None, "/GPU:{i}"), batch_size=16)
est = torch_cuda.MeasuredEstimator(warmup=1, repeat=3, device="cpu")
cost = est.device_cost(shards, None, task)
assert est.measurements == 1 and est.device_cost(shards, None, task) == cost
compute = est.cache[torch_cuda.shard_key(shards, 16)]
assert abs(cost * 1e3 - compute - AllToAll().step_ms(16 * 8 * 4, 4)) < 1e-9, (cost, compute)
print("ok")
"""


def test_torch_kernels_pool_and_update_like_numpy():
    """The fused kernels (on the CPU) against numpy; in a child process without TensorFlow
    (torch and TensorFlow in one process can crash)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    assert run_python(TORCH_KERNELS_CHECK, timeout=300) == "ok"


def test_collect_measures_with_the_torch_cuda_backend(tmp_path, monkeypatch):
    seen = []

    def fake(devices, batch_size, **kwargs):
        seen.extend(devices)
        return [{"forward_ms": 1.0, "backward_ms": 2.0, "total_ms": 3.0, "threads": 0,
                 "lookups": 5, "filled": True, "memory_bytes": torch_cuda.piece_bytes(d),
                 "pooled_bytes": comm.pooled_bytes(d, batch_size)} for d in devices]

    monkeypatch.setattr(torch_cuda, "benchmark_devices", fake)
    monkeypatch.setattr(torch_cuda, "prefetch", lambda *a, **k: None)
    out = str(tmp_path / "gpu.jsonl")
    limit = 200_000
    summary = collect.collect(out, 6, batch_size=64, pool_tables=32, row_scale=1 / 500,
                              max_tables=6, backend="torch_cuda", task_memory="1GiB",
                              max_shard_bytes=limit, progress=False, sources=("random", "task"))
    records = [json.loads(line) for line in open(out, encoding="utf-8")]
    assert summary["written"] + summary["skipped"] == 6   # a shard drawn twice is measured once
    assert len(records) == len(seen) == summary["written"] >= 4
    for record, shards in zip(records, seen):
        assert record["backend"] == "torch_cuda" and record["filled"]
        assert record["key"] == torch_cuda.shard_key(shards, 64)
        assert record["memory_bytes"] == torch_cuda.piece_bytes(shards)
        assert len(shards) == 1 or record["memory_bytes"] <= limit
        if record["source"].startswith("task"):   # planned on GPUs: with the GPU weights
            assert all(s.device.startswith("/GPU:") for s in shards), shards
    with pytest.raises(ValueError, match="backend"):
        collect.collect(out, 1, backend="tpu")
    smallest = min(TINY, key=lambda t: torch_cuda.piece_bytes([t]))
    assert collect.fit_shard(TINY, 0, torch_cuda.piece_bytes) == [smallest]
    assert collect.fit_shard(TINY, 10 ** 9, torch_cuda.piece_bytes) == TINY


def test_torch_cuda_benchmark_runs_on_a_gpu():
    pytest.importorskip("torch")
    if not torch_cuda.is_available():
        pytest.skip("no CUDA device")
    result = torch_cuda.benchmark_shard(TINY, batch_size=64, warmup=1, repeat=3)
    assert result["total_ms"] > 0 and result["lookups"] > 0


def test_benchmark_package_and_parser_do_not_import_tensorflow():
    script = ("import sys, argparse\n"
              "from tfra_dynamic_embedding.placement import benchmark, estimators\n"
              "from tfra_dynamic_embedding.placement.benchmark import collect\n"
              "p = argparse.ArgumentParser(); collect.add_parser(p.add_subparsers())\n"
              "assert 'measured-cpu' in estimators.list_estimators()\n"
              "assert 'tensorflow' not in sys.modules and 'torch' not in sys.modules\n"
              "print('ok')\n")
    assert run_python(script) == "ok"


def test_task_source_takes_whole_devices_of_eval_shaped_tasks():
    pool = collect.make_pool(3, 64, 40, 0.001)
    names = {t.name for t in pool}
    drawn = [collect.draw_shard(pool, i, 3, max_tables=2, batch_size=64, sources=("task",))
             for i in range(len(collect.TASK_STRATEGIES))]
    # one strategy per draw, in TASK_STRATEGIES' order; the learned policy's plans included
    assert [src for src, _ in drawn] == [f"task:{s}" for s in collect.TASK_STRATEGIES]
    for _, shards in drawn:
        assert shards and {s.table.name for s in shards} <= names
        assert len({s.device for s in shards}) == 1          # one device of the plan
    # a device of a 40-table task on 8 devices holds ~5 pieces: no max_tables cap here
    assert max(len(shards) for _, shards in drawn) > 2
    # a pure function (index 1: lookup-greedy; the learned policy's local search has a time
    # budget, so its plans may differ on a busy machine)
    again = collect.draw_shard(pool, 1, 3, max_tables=2, batch_size=64, sources=("task",))
    assert [(s.table.name, s.index, s.num_slices) for s in again[1]] == \
        [(s.table.name, s.index, s.num_slices) for s in drawn[1][1]]


def test_whole_plans_measure_every_device_of_a_plan_together(tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "plans.jsonl")
    # indices 1 and 2: a lookup-greedy plan (reproducible) and a learned one (its local search
    # has a time budget, so on a busy machine the plan may differ from a later draw)
    argv = ["benchmark", "collect", "--out", out, "--pool-tables", "40", "--batch-size", "32",
            "--warmup", "1", "--repeat", "3", "--no-flush", "--quiet", "--row-scale", "0.0001",
            "--pool-seed", "3", "--sources", "task", "--whole-plans", "--start-index", "1",
            "--records", "2"]
    calls = []
    real = tf_cpu.benchmark_devices
    monkeypatch.setattr(tf_cpu, "benchmark_devices",
                        lambda devices, *a, **k: calls.append(len(devices)) or real(devices, *a, **k))
    assert run_cli(argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["written"] == 2
    records = records_lib.read_records(out)
    pool = collect.make_pool(3, 32, 40, 0.0001)
    per_plan = []
    for index in (1, 2):
        mine = [r for r in records if r["index"] == index]
        per_plan.append(len(mine))
        # one record per non-empty device, all measured in one call; a device the first plan
        # already measured (the same tables alone, say) is not measured again for the second
        assert all(len(mine) == r["measured_together"] <= r["plan_devices"] for r in mine)
        assert index == 2 or all(r["plan_devices"] == len(mine) for r in mine)
        assert len({r["source"] for r in mine}) == 1
        pieces = [(t["name"], tuple(t.get("slice", (0, 1)))) for r in mine for t in r["tables"]]
        assert len(pieces) == len(set(pieces)) and {n for n, _ in pieces} <= {t.name for t in pool}
    assert calls == per_plan and min(per_plan) > 1
    source, devices = collect.draw_plan(pool, 1, 3, 32)
    assert source == "task:lookup-greedy"                      # TASK_STRATEGIES[1]
    assert [r["key"] for r in records if r["index"] == 1] == \
        [tf_cpu.shard_key(d, 32) for d in devices]             # device order, same plan
    assert run_cli(argv) == 0                                     # resumable: nothing measured again
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["skipped"] >= 1
    assert len(records_lib.read_records(out)) >= len(records)
    with pytest.raises(ValueError, match="whole_plans"):
        collect.collect(out, 1, sources=("random", "task"), whole_plans=True)


def test_collect_command_defaults_follow_the_backend(monkeypatch):
    calls = []
    monkeypatch.setattr(collect, "collect", lambda out, records, **kwargs: (
        calls.append(kwargs), {"written": 0, "skipped": 0, "seconds": 0.0})[1])
    assert run_cli(["benchmark", "collect", "--backend", "torch_cuda", "--records", "3",
                    "--out", "gpu.jsonl"]) == 0
    assert run_cli(["benchmark", "collect", "--records", "3", "--out", "cpu.jsonl",
                    "--batch-size", "512"]) == 0
    gpu, cpu = calls
    from tfra_dynamic_embedding.placement import train   # the GPU weights' pool
    pool = train.PROFILES["gpu"]["pool"]
    assert (gpu["backend"], gpu["batch_size"], gpu["pool_tables"], gpu["row_scale"]) == (
        "torch_cuda", pool["batch_size"], pool["num_tables"], pool["row_scale"])
    assert gpu["task_memory"] == train.PROFILES["gpu"]["memory"]
    assert gpu["max_shard_bytes"] == 16 * 2 ** 30 and gpu["max_tables"] == 12
    assert (cpu["backend"], cpu["batch_size"], cpu["row_scale"], cpu["max_tables"]) == (
        "tf_cpu", 512, collect.DEFAULT_ROW_SCALE, 8)
    assert cpu["task_memory"] == collect.TASK_SHAPE["memory"]
