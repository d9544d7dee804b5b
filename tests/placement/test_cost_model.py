"""The neural cost model: learns a known multi-table cost, exports to numpy, ships, estimates."""

import json

import numpy as np
import pytest

from tfra_dynamic_embedding.placement import cost_model as cm
from tfra_dynamic_embedding.placement import estimators, evaluate, proposers, train, workloads
from tfra_dynamic_embedding.placement.types import Shard, TableSpec

from tests.placement.helpers import task as make_task


@pytest.fixture(scope="module")
def halves():
    pool = workloads.generate_pool(200, seed=3, batch_size=1024, row_scale=1 / 64)
    return workloads.split_pool(pool, seed=0)


def test_learns_a_known_multi_table_cost_on_unseen_tables(halves):
    seen, unseen = halves
    train_recs = train.synthetic_records(seen, 400, max_tables=8, seed=1)
    test_recs = train.synthetic_records(unseen, 100, max_tables=8, seed=2)
    split_train, split_test = train.split_by_tables(train_recs + test_recs, seed=0)
    assert split_train and split_test   # pure records exist on both sides of a name split
    model = train.fit(train_recs, test_recs, epochs=50, batch_size=32, lr=3e-3, seed=0,
                      early_stop=0)
    true = np.array([r["total_ms"] for r in test_recs])
    baseline_mse = float(((true - np.mean([r["total_ms"] for r in train_recs])) ** 2).mean())
    unseen_metrics = model.meta["unseen_metrics"]
    assert unseen_metrics["n"] == 100
    assert unseen_metrics["corr"] > 0.9, unseen_metrics
    assert unseen_metrics["mse_ms2"] < 0.35 * baseline_mse, (unseen_metrics, baseline_mse)
    # the multi-table interaction: a pair costs what the model says about the pair, not the sum
    pair = seen[:2]
    fb = model.heads(model.embed_tables(pair).sum(axis=0))
    assert fb.shape == (2,) and (fb > 0).all()


def test_numpy_export_matches_keras():
    keras_model = train.build_keras_model(None, seed=4)
    rng = np.random.default_rng(0)
    x = rng.random((5, 3, 21)).astype(np.float32)
    mask = np.ones((5, 3, 1), dtype=np.float32)
    mask[0, 2] = 0.0
    mean, std = np.zeros(21), np.ones(21)
    model = cm.CostModel(train.export_params(keras_model, mean, std, 2.0), {"batch_size": 1024})
    want = keras_model.predict([x * mask, mask], verbose=0) * 2.0
    got = np.stack([model.heads(model.embed(x[i][mask[i, :, 0] > 0]).sum(axis=0))
                    for i in range(5)])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_save_load_roundtrip_and_record_parsing(tmp_path, halves):
    recs = train.synthetic_records(halves[0], 3, seed=5)
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n{\"tables\": [trunc")
    assert len(train.load_records(str(path))) == 3          # a half-written last line is skipped
    x, mask, y = train.pad_records(recs)
    assert x.shape[2] == 21 and mask.sum() == sum(len(r["tables"]) for r in recs)
    model = cm.CostModel.load()
    model.save(str(tmp_path / "m.npz"))
    again = cm.CostModel.load(str(tmp_path / "m.npz"))
    np.testing.assert_allclose(again.predict_records(recs), model.predict_records(recs),
                               rtol=1e-5)
    with pytest.raises(FileNotFoundError, match="train-planner"):
        cm.CostModel.load(str(tmp_path / "missing.npz"))


def test_shipped_model_is_the_learned_estimator(small_pool):
    assert "learned" in estimators.list_estimators()
    est = estimators.get_estimator("learned")
    assert not est.additive and not est.measured
    task = workloads.make_tasks(small_pool, 1, tables_per_task=12, num_devices=3,
                                batch_size=1024)[0]
    plan = proposers.propose(task, "lookup-greedy")
    report = evaluate.evaluate_plan(plan, "learned", num_random=2)
    assert report.estimator == "learned" and report.max_cost > 0
    assert all(c.predicted_cost is not None for c in plan.per_device.values())
    assert est.device_cost([], None, task) == 0.0
    one = est.device_cost([Shard(task.tables[0], "")], None, task)
    half = est.device_cost([Shard(task.tables[0], "", 0, 2)], None, task)
    assert one > 0 and half > 0
    # batch scaling is linear in the task's batch size
    big = make_task(task.tables[:1], 1, batch_size=2048)
    assert est.device_cost([Shard(task.tables[0], "")], None, big) == pytest.approx(2 * one)


def test_shard_embeddings_follow_the_table_not_a_stale_cache_entry():
    model = cm.load_cost_model()

    def uncached(table):
        return model.embed(cm.shard_features(table, 1.0, model.scales, model.batch_size)[None])[0]

    for dim in (8, 16, 64, 128):
        # a new spec often takes the id of one just freed: it must not get that one's entry
        table = TableSpec("same_name", rows=5000, dim=dim, pooling_factor=2.0)
        np.testing.assert_allclose(model.shard_embedding(table), uncached(table))
        del table
    table = TableSpec("edited", rows=5000, dim=16, pooling_factor=2.0)
    model.shard_embedding(table)
    table.pooling_factor = 9.0   # edited in place
    np.testing.assert_allclose(model.shard_embedding(table), uncached(table))


def test_train_planner_command_writes_weights_and_curves(tmp_path, halves):
    import argparse  # pylint: disable=import-outside-toplevel
    recs = (train.synthetic_records(halves[0], 30, max_tables=2, seed=1) +
            train.synthetic_records(halves[1], 12, max_tables=2, seed=2))
    data = tmp_path / "shards.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in recs))
    parser = argparse.ArgumentParser()
    train.add_parser(parser.add_subparsers())
    args = parser.parse_args(["train-planner", "--data", str(data), "--out", str(tmp_path / "w"),
                              "--epochs", "3", "--iterations", "4", "--tasks", "2",
                              "--samples", "2", "--no-measure"])
    assert args.run(args) == 0
    out = sorted(p.name for p in (tmp_path / "w").iterdir())
    assert out == ["cost_model_cpu.npz", "policy_cpu.npz", "training.json", "training.png"]
    summary = json.loads((tmp_path / "w" / "training.json").read_text())
    assert summary["held_out"]["unseen_metrics"]["n"] > 0 and len(summary["cost_history"]) == 3
    # the shipped model learns from the training side of the table split only
    shipped = cm.CostModel.load(str(tmp_path / "w" / "cost_model_cpu.npz"))
    assert shipped.meta["records"] == summary["train_records"] < 42


def test_split_by_tables_uses_the_pool_halves_of_the_placement_tasks():
    meta = {"pool_seed": 2, "pool_tables": 40, "row_scale": 1 / 64, "batch_size": 64}
    pool = workloads.generate_pool(40, seed=2, batch_size=64, row_scale=1 / 64)
    first, second = workloads.split_pool(pool, seed=2)
    seen = [dict(r, **meta) for r in train.synthetic_records(first, 6, max_tables=3, seed=1)]
    unseen = [dict(r, **meta) for r in train.synthetic_records(second, 4, max_tables=3, seed=2)]
    mixed = [dict(r, **meta) for r in train.synthetic_records([first[0], second[0]], 3,
                                                              max_tables=2, seed=3)
             if len(r["tables"]) == 2 and r["tables"][0]["name"] != r["tables"][1]["name"]]
    for seed in (0, 5):   # the name-split seed does not matter for pool records
        got_seen, got_unseen = train.split_by_tables(seen + mixed + unseen, seed=seed)
        assert got_seen == seen and got_unseen == unseen
    # an explicit "split" field wins
    forced = dict(seen[0], split="test")
    assert train.split_by_tables([forced])[1] == [forced]


class FakeMeasured(estimators.CostEstimator):
    """Reports a known cost per device (2 ms per table forward, 3 ms backward)."""
    name, measured, additive = "fake-measured", True, False
    calls = []

    def __init__(self, on_measure=None):
        self.on_measure = on_measure

    def device_cost(self, shards, device, task):
        shards = list(shards)
        if not shards:    # as "measured-cpu": an empty device costs 0 and is not measured
            return 0.0
        result = {"forward_ms": 2.0 * len(shards), "backward_ms": 3.0 * len(shards)}
        self.calls.append(len(shards))
        self.on_measure(shards, task.batch_size, result)
        return 5e-3 * len(shards)


def test_train_planner_keeps_the_measured_plans_as_records(tmp_path, halves, monkeypatch):
    monkeypatch.setitem(estimators._ESTIMATORS, "measured-cpu", FakeMeasured)  # pylint: disable=protected-access
    monkeypatch.setattr(FakeMeasured, "calls", [])
    data = tmp_path / "shards.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in
                            train.synthetic_records(halves[0], 30, max_tables=2, seed=1)))
    summary = train.train_planner(str(data), str(tmp_path / "w"), epochs=2, iterations=2,
                                  tasks=1, samples=2, log=lambda *_: None, refine_rounds=1,
                                  plans_per_round=1)
    assert summary["refined_with"] == "measured-cpu"
    kept = train.load_records(str(tmp_path / "w" / "measured_plans.jsonl"))
    assert len(kept) == len(FakeMeasured.calls) >= 2       # every measured device, once
    assert all(r["split"] == "train" and r["forward_ms"] == 2.0 * len(r["tables"]) for r in kept)


def test_refinement_measures_the_policys_own_plans_and_refits(halves, monkeypatch):
    from tfra_dynamic_embedding.placement import policy as pol  # pylint: disable=import-outside-toplevel
    seen, _ = halves
    monkeypatch.setattr(FakeMeasured, "calls", [])
    monkeypatch.setitem(estimators._ESTIMATORS, "fake-measured", FakeMeasured)  # pylint: disable=protected-access
    records = train.synthetic_records(seen, 60, max_tables=4, seed=1)
    model = train.fit(records, epochs=2, seed=0, early_stop=0)
    tasks = workloads.make_tasks(seen, 2, tables_per_task=6, num_devices=2, seed=0,
                                 batch_size=1024)
    _, policy, out = train.refine_with_measurements(
        model, pol.Policy(seed=0), tasks, records, estimator="fake-measured", rounds=1,
        plans_per_round=2, epochs=2, iterations=2)
    added = out[len(records):]
    assert len(added) == len(FakeMeasured.calls) >= 3      # one record per measured device
    for rec in added:
        n = len(rec["tables"])
        assert (rec["forward_ms"], rec["backward_ms"]) == (2.0 * n, 3.0 * n)
        assert rec["split"] == "train"
    assert isinstance(policy, pol.Policy)


class _Exact:
    """A stand-in model that predicts each record's undrifted cost exactly."""

    def predict_records(self, records):
        return np.array([[r["true_ms"], 0.0] for r in records])


def test_remove_drift_divides_out_each_measurement_groups_common_speed():
    rng = np.random.default_rng(0)
    records, speed = [], {"a": 1.3, "b": 0.8}
    for i in range(24):
        group = "ab"[i % 2] if i < 16 else None      # the last 8 were measured alone
        true = float(rng.uniform(5, 50))
        drift = speed[group] if group else 1.25
        records.append({"true_ms": true, "forward_ms": 0.4 * true * drift,
                        "backward_ms": 0.6 * true * drift, "total_ms": true * drift,
                        "group": group})
    fixed = train.remove_drift(records, _Exact(), prior=0.0)
    for old, new in zip(records, fixed):
        if old["group"] is None:
            assert new is old                            # lone measurements: unchanged
        else:
            assert new["total_ms"] == pytest.approx(old["true_ms"])
            assert new["forward_ms"] / new["backward_ms"] == pytest.approx(0.4 / 0.6)
            assert old["total_ms"] != pytest.approx(old["true_ms"])   # inputs untouched
    # a prior shrinks a small group's correction towards none
    shrunk = train.remove_drift(records, _Exact(), prior=8.0)
    assert records[0]["total_ms"] > shrunk[0]["total_ms"] > records[0]["true_ms"]
    # whole-plan records from `collect --whole-plans` group by their plan
    plan = {"plan_devices": 8, "pool_seed": 1, "half": "train", "index": 7, "source": "task:x"}
    assert train.measurement_group(plan) == train.measurement_group(dict(plan)) is not None
    assert train.measurement_group(dict(plan, index=8)) != train.measurement_group(plan)
    assert train.measurement_group({"source": "random"}) is None
