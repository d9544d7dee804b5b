"""Estimators, metrics (max cost, balance, lower bound, gap, speedup) and PNG plots."""

import numpy as np
import pytest

from tfra_dynamic_embedding.placement import estimators, evaluate, proposers
from tfra_dynamic_embedding.placement.types import Plan, Shard, TableSpec, Task, make_devices

from .helpers import table, task


class BytesEstimator(estimators.AdditiveEstimator):
    """Cost = bytes of the shard: device cost equals device memory (easy to check by hand)."""

    name = "bytes"

    def shard_cost(self, shard, task):
        return float(shard.size_bytes)


class MeasuredBytes(BytesEstimator):
    name = "measured-bytes"
    measured = True


def case_a():
    return task([table(n, s) for n, s in zip("abcde", (8, 7, 6, 5, 4))])


def test_analytic_estimator_counts_bytes_moved():
    t = Task([TableSpec("t", rows=10, dim=4, bytes_per_value=4, pooling_factor=2.0)],
             make_devices(1), batch_size=1000)
    est = estimators.AnalyticEstimator(bandwidth=1e6)
    # 16 B rows: 3 x 2000 lookups + 2 x 1000 samples = 8000 rows = 128,000 B.
    assert est.shard_cost(Shard(t.tables[0], "d"), t) == pytest.approx(0.128)
    # slice 0 of 3 holds 4 of 10 rows: 800 lookups -> 16 x (2400 + 2000) B.
    assert est.shard_cost(Shard(t.tables[0], "d", 0, 3), t) == pytest.approx(0.0704)
    assert estimators.AnalyticEstimator(1e6, overhead=0.5).shard_cost(
        Shard(t.tables[0], "d"), t) == pytest.approx(0.628)
    with pytest.raises(ValueError, match="bandwidth must be > 0 bytes/s; got 0"):
        estimators.AnalyticEstimator(bandwidth=0)
    assert estimators.get_estimator("analytic").name == "analytic"
    with pytest.raises(ValueError, match="unknown estimator 'oracle'"):
        estimators.get_estimator("oracle")


def test_metrics_of_a_plan():
    plan = proposers.propose(case_a(), "size-greedy")
    report = evaluate.evaluate_plan(plan, BytesEstimator(), random_cost=20.0)
    assert report.device_costs == {"/job:ps/task:0": 17.0, "/job:ps/task:1": 13.0}
    assert report.max_cost == 17.0
    assert report.balance == pytest.approx(13 / 17)
    assert report.lower_bound == 15.0                       # max(8, 30 / 2)
    assert report.gap == pytest.approx(17 / 15 - 1)
    assert report.speedup_over_random == pytest.approx(20 / 17)
    assert report.shard_costs["/job:ps/task:1"] == {"b": 7.0, "c": 6.0}
    assert plan.per_device["/job:ps/task:0"].predicted_cost == 17.0
    assert plan.per_device["/job:ps/task:0"].measured_cost is None
    assert plan.estimator == "bytes"
    evaluate.evaluate_plan(plan, MeasuredBytes(), num_random=0)
    assert plan.per_device["/job:ps/task:1"].measured_cost == 13.0


def test_speedup_is_over_the_mean_of_random_plans():
    t = case_a()
    est = BytesEstimator()
    randoms = [max(est.plan_costs(proposers.propose(t, "random", seed=s)).values())
               for s in range(7, 12)]
    report = evaluate.evaluate_plan(proposers.propose(t, "size-greedy"), est, num_random=5,
                                    seed=7)
    assert report.speedup_over_random == pytest.approx(np.mean(randoms) / 17.0)


def test_lower_bound_uses_forced_slices():
    t = task([table("big", 250), table("s", 10)], 3, memory=100)
    assert evaluate.lower_bound(t, BytesEstimator()) == pytest.approx(260 / 3)
    t = task([table("a", 90), table("b", 10)], 3)
    assert evaluate.lower_bound(t, BytesEstimator()) == 90.0
    assert evaluate.balance([0.0, 0.0]) == 1.0 and evaluate.balance({"x": 1, "y": 4}) == 0.25


def test_non_additive_estimator_has_no_bound():
    class Fused(estimators.CostEstimator):
        name = "fused"

        def device_cost(self, shards, device, task):
            return float(len(shards) ** 2)

    plan = proposers.propose(case_a(), "size-greedy")
    report = evaluate.evaluate_plan(plan, Fused(), num_random=0)
    assert report.device_costs == {"/job:ps/task:0": 9.0, "/job:ps/task:1": 4.0}
    assert report.lower_bound is None and report.gap is None and report.shard_costs == {}


def test_compare_strategies_rows_and_failures():
    ok = case_a()
    rows, plans = evaluate.compare_strategies([ok, ok], ["size-greedy", "random", "dim-greedy"],
                                              BytesEstimator(), num_random=4)
    by_name = {r["strategy"]: r for r in rows}
    assert by_name["size-greedy"]["max_cost"] == 17.0 and by_name["size-greedy"]["tasks"] == 2
    assert by_name["size-greedy"]["lower_bound"] == 15.0
    assert set(plans) == {"size-greedy", "random", "dim-greedy"}
    assert 17.0 <= by_name["random"]["max_cost"] <= 30.0
    tight = task([table(f"x{i}", 80) for i in range(3)], memory=100)
    rows, _ = evaluate.compare_strategies(tight, ["lookup-greedy"], BytesEstimator(), 0)
    assert rows[0]["failures"] == 1 and rows[0]["max_cost"] is None
    assert "cannot place 1 of 3 tables" in rows[0]["error"]
    text = evaluate.format_rows(rows)
    assert "lookup-greedy" in text and "1/1" in text


def test_plots_are_pngs(tmp_path, small_pool):
    t = Task(small_pool[:24], make_devices(4), batch_size=4096)
    plan = proposers.propose(t, "lookup-greedy")
    report = evaluate.evaluate_plan(plan, "analytic", num_random=3)
    path = evaluate.plot_plan(plan, report, str(tmp_path / "plan.png"))
    rows, _ = evaluate.compare_strategies(t, "all", "analytic", num_random=3)
    cmp_path = evaluate.plot_comparison(rows, str(tmp_path / "cmp.png"))
    for p in (path, cmp_path):
        data = open(p, "rb").read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert [r["strategy"] for r in rows] == proposers.list_strategies()
    assert all(r["failures"] == 0 for r in rows)
    lookup = next(r for r in rows if r["strategy"] == "lookup-greedy")
    assert lookup["speedup_over_random"] > 1.0


def test_plan_round_trip_keeps_predicted_costs(tmp_path):
    plan = proposers.propose(case_a(), "size-greedy")
    evaluate.evaluate_plan(plan, BytesEstimator(), num_random=0)
    plan.save(tmp_path / "p.json")
    again = Plan.load(tmp_path / "p.json")
    assert again.per_device["/job:ps/task:0"].predicted_cost == 17.0
    assert again.estimator == "bytes"
