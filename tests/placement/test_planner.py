"""The planner (issue 23, item 2; issue 61): every strategy proposes, the estimator picks.

It must never be worse (by the estimator in use) than any strategy it ran, record the ones that
failed, and the learned proposer's out-of-range check must flag tables unlike its training data.
"""

import json
import shutil

import numpy as np
import pytest

from tfra_dynamic_embedding import cli
from tfra_dynamic_embedding.placement import cost_model as cm
from tfra_dynamic_embedding.placement import (estimators, features, planner, proposers, types,
                                              workloads)
from tfra_dynamic_embedding.placement.planner import Planner


def _task(seed, tables=24, devices=4, memory=None, row_scale=1.0):
    pool = workloads.generate_pool(tables, seed=seed, batch_size=4096, row_scale=row_scale)
    return types.Task(pool, types.make_devices(devices, memory), batch_size=4096)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_best_is_no_worse_than_any_candidate(seed):
    task = _task(seed)
    choice = Planner("analytic").plan(task, seed=seed)
    estimator = estimators.get_estimator("analytic")
    names = [c.strategy for c in choice.candidates]
    assert "learned" in names and "random" not in names
    assert sorted(names) == sorted(s for s in proposers.list_strategies() if s != "random")
    for candidate in choice.candidates:   # rescored independently
        plan = proposers.propose(task, candidate.strategy, seed=seed)
        assert max(estimator.plan_costs(plan).values()) == pytest.approx(candidate.max_cost)
    best = max(estimator.plan_costs(choice.plan).values())
    assert best == min(c.max_cost for c in choice.candidates)
    assert choice.plan.strategy == choice.candidates[0].strategy
    assert choice.margin is None or choice.margin >= 0


def test_default_scores_with_the_learned_cost_model_and_analytic_without_weights(tmp_path):
    # The analytic estimator ranks lookup-greedy first, which measured ~30% above the learned
    # default on filled CPU shards (docs/learned_placement.md): CPU tasks default to learned too.
    task = _task(5, row_scale=1 / 64)
    default = planner.default_estimator(task)
    assert default.name == "learned" and default.model_for(task).profile == "cpu"
    choice = Planner().plan(task)
    assert choice.estimator == "learned"
    learned = cm.LearnedEstimator()
    for candidate in choice.candidates:
        plan = proposers.propose(task, candidate.strategy, estimator=learned)
        assert max(learned.plan_costs(plan).values()) == pytest.approx(candidate.max_cost)
    assert planner.default_estimator(task, str(tmp_path)) == "analytic"   # no weights there
    assert Planner(estimator="analytic").plan(task).estimator == "analytic"


class _FavoursStrategy(estimators.CostEstimator):
    """A second opinion: the analytic cost, but plans of `favoured` strategy's placement cost
    half (the proposed plans carry their strategy's name)."""

    name = "favours"

    def __init__(self, favoured):
        self.favoured = favoured
        self.analytic = estimators.get_estimator("analytic")
        self.scored = []

    def device_cost(self, shards, device, task):
        return self.analytic.device_cost(shards, device, task)

    def plan_costs(self, plan):
        self.scored.append(plan.strategy)
        factor = 0.5 if plan.strategy == self.favoured else 1.0
        return {d: c * factor for d, c in self.analytic.plan_costs(plan).items()}


def test_verify_rescores_the_cheapest_distinct_plans_and_the_cheapest_by_it_wins():
    task = _task(0)
    plain = Planner("analytic").plan(task)
    ranked = [c.strategy for c in plain.candidates if c.max_cost is not None]
    plans = {name: proposers.propose(task, name) for name in ranked}
    distinct = []
    for name in ranked:
        key = planner._placement_key(plans[name])   # pylint: disable=protected-access
        if key not in {planner._placement_key(plans[d]) for d in distinct}:   # pylint: disable=protected-access
            distinct.append(name)
    assert len(distinct) >= 3
    favoured = distinct[2]           # third by the analytic estimate, cheapest by the checker
    checker = _FavoursStrategy(favoured)
    choice = Planner("analytic", verifier=checker, verify_top=3).plan(task)
    assert choice.plan.strategy == favoured and choice.verified_by == "favours"
    assert sorted(checker.scored) == sorted(distinct[:3])   # each distinct placement once
    verified = [c for c in choice.candidates if c.verified_cost is not None]
    assert [c.strategy for c in verified][0] == favoured and len(verified) == 3
    assert [c.verified_cost for c in verified] == sorted(c.verified_cost for c in verified)
    by_name = {c.strategy: c for c in plain.candidates}
    assert verified[0].verified_cost == pytest.approx(0.5 * by_name[favoured].max_cost)
    assert choice.margin == pytest.approx(verified[1].verified_cost / verified[0].verified_cost - 1)
    # the rest keep the first estimator's order; all candidates are still there
    assert sorted(c.strategy for c in choice.candidates) == sorted(c.strategy for c in plain.candidates)
    # verifying only the first keeps the plain choice
    assert Planner("analytic", verifier=checker, verify_top=1).plan(task).plan.strategy == \
        plain.plan.strategy
    with pytest.raises(ValueError, match="verify_top must be >= 1; got 0"):
        Planner("analytic", verifier=checker, verify_top=0)


def test_verify_by_measurement_picks_the_cheapest_measured_plan():
    from tfra_dynamic_embedding.placement.benchmark import tf_cpu   # pylint: disable=import-outside-toplevel
    pool = workloads.generate_pool(8, seed=4, batch_size=256, row_scale=1 / 256)
    task = types.Task(pool, types.make_devices(2), batch_size=256)
    measured = tf_cpu.MeasuredEstimator(repeat=3, warmup=1)
    choice = Planner("analytic", verifier=measured, verify_top=2).plan(task)
    verified = [c for c in choice.candidates if c.verified_cost is not None]
    assert len(verified) == 2 and choice.verified_by == "measured-cpu"
    assert choice.plan.strategy == verified[0].strategy
    assert verified[0].verified_cost <= verified[1].verified_cost
    # the costs are the measured ones of those plans (cached: re-reading measures nothing new)
    for c in verified:
        plan = proposers.propose(task, c.strategy)
        assert max(measured.plan_costs(plan).values()) == c.verified_cost


def test_plan_cli_verify_top_prints_the_verified_costs(capsys, tmp_path):
    tables = list(workloads.generate_pool(6, seed=2, batch_size=256, row_scale=1 / 256))
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({"tables": [t.to_dict() for t in tables]}))
    args = ["plan", "--tables", str(path), "--devices", "2", "--batch-size", "256",
            "--random", "0", "--out", str(tmp_path / "p.json")]
    assert cli.main(args + ["--verify-top", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count(", measured-cpu ") == 2
    assert "(by the measured-cpu estimator of the 2 cheapest by the learned estimator" in out
    assert cli.main(args + ["--verify-top", "-1"]) != 0
    assert "--verify-top must be >= 0; got -1" in capsys.readouterr().err
    assert cli.main(args + ["--verify-top", "2", "--strategy", "lookup-greedy"]) != 0
    assert "--verify-top needs --strategy best" in capsys.readouterr().err


def test_failures_are_recorded_and_all_failing_is_an_error():
    task = _task(0)
    choice = Planner(proposers=["lookup-greedy", "size-greedy"]).plan(task)
    assert [c.strategy for c in choice.candidates] in (["lookup-greedy", "size-greedy"],
                                                       ["size-greedy", "lookup-greedy"])
    tight = _task(0, memory="1MiB")
    with pytest.raises(ValueError, match="no strategy could place the task: .*PlacementError"):
        Planner(proposers=["lookup-greedy", "size-greedy"]).plan(tight)
    with pytest.raises(ValueError, match="unknown strategies \\['nope'\\]"):
        Planner(proposers=["nope"])


def _ranges():
    model = cm.load_cost_model()
    lo, hi = np.asarray(model.meta["x_min"]), np.asarray(model.meta["x_max"])
    return model, lo, hi, hi - lo


def _beyond(value, j):
    """Range widths beyond the widened training range of a feature `j` of `value` (above it)."""
    _, lo, hi, width = _ranges()
    return (value - hi[j]) / width[j] - planner.OUT_OF_RANGE_MARGIN


def _assert_worst_first(flagged):
    distances = [d for _, _, d in flagged]
    assert distances == sorted(distances, reverse=True)


def test_learned_out_of_range_flags_tables_beyond_the_training_range():
    # The shipped cost model stores its training range (down-scaled CPU shards and full-size
    # ones up to ~3 GB): tables inside it are not flagged, full-size or not.
    model, _, hi, width = _ranges()
    assert model.has_range
    one_row = 4 + features.FEATURE_NAMES[4:].index("reuse(4096, 8192]")
    small_task = _task(3, row_scale=1 / 64)
    small = planner.learned_out_of_range(small_task)
    # only the pool's 1-row table: all of a batch's lookups hit its one index, a reuse bin
    # training barely filled (share <= 0.06; the z-score rule missed it, its std floored at 0.25)
    assert [t.name for t in small_task.tables if t.rows == 1] == ["t02"]
    assert [(name, j) for name, j, _ in small] == [("t02", one_row)]
    assert small[0][2] == pytest.approx(_beyond(1.0, one_row))
    big_task = _task(3)
    big = planner.learned_out_of_range(big_task)
    # full size: besides that table, only tables above the trained size (3.0 GB + 10%) --
    # 3 of 24, where 4 standard deviations flagged 6 (any table above ~1 GB)
    limit = hi[3] + planner.OUT_OF_RANGE_MARGIN * width[3]
    too_big = {t.name: t.size_bytes / 2 ** 30 for t in big_task.tables
               if t.size_bytes / 2 ** 30 > limit}
    assert sorted(too_big) == ["t07", "t12"]
    assert len(big) == 3 and big[0][:2] == ("t02", one_row)
    assert {name: j for name, j, _ in big[1:]} == {name: 3 for name in too_big}
    for name, _, distance in big[1:]:
        assert distance == pytest.approx(_beyond(too_big[name], 3), rel=1e-5)
    _assert_worst_first(big)
    assert all(d > 0 for _, _, d in big)


def test_learned_out_of_range_names_the_feature_far_outside():
    tables = list(_task(3, row_scale=1 / 64).tables) + [
        types.TableSpec("huge", rows=100 * 12_543_670, dim=4),         # 100x the largest rows
        types.TableSpec("wide", rows=1000, dim=4096),                   # a dim never seen
        types.TableSpec("hot", rows=100_000, dim=16, pooling_factor=19_300)]   # 100x pooling
    task = types.Task(tables, types.make_devices(4), batch_size=4096)
    flagged = planner.learned_out_of_range(task)
    assert [(name, j) for name, j, _ in flagged] == [
        ("hot", 2), ("wide", 0), ("huge", 1), ("t02", 17)]
    scales = cm.load_cost_model().scales
    expected = [_beyond(19_300 / scales.pooling_factor, 2), _beyond(4096 / scales.dim, 0),
                _beyond(100.0, 1)]
    assert [d for _, _, d in flagged[:3]] == pytest.approx(expected, rel=1e-6)
    assert flagged[0][2] > 90        # pooling 100 (scaled) against a range of [0, 1]
    _assert_worst_first(flagged)


def test_range_distance_and_outside_agree():
    model, lo, hi, _ = _ranges()
    # reuse(32768, inf) made constant, as in weights whose training never hit that bin
    constant = features.FEATURE_NAMES.index("reuse(32768, inf)")
    lo, hi = lo.copy(), hi.copy()
    lo[constant] = hi[constant] = 0.0
    width = hi - lo
    model = cm.CostModel(model.params, {**model.meta, "x_min": lo, "x_max": hi})
    x = np.tile((lo + hi) / 2, (5, 1))
    x[1, 2] = hi[2] + 0.1 * width[2]           # on the widened range's edge: inside
    x[2, 2] = hi[2] + 0.5 * width[2]           # 0.4 widths beyond it
    x[3, 0] = lo[0] - 0.3 * width[0]           # below: 0.2 widths beyond
    x[3, 1] = hi[1] + 0.2 * width[1]           # 0.1 widths beyond: not the worst
    x[4, constant] = 0.01                      # any change of a constant feature
    worst, dist = model.range_distance(x)
    assert dist[:2].tolist() == [0.0, 0.0]
    assert dist[2:4] == pytest.approx([0.4, 0.2]) and worst[2:4].tolist() == [2, 0]
    assert worst[4] == constant and np.isinf(dist[4])
    assert model.outside(x).tolist() == [False, False, True, True, True]
    assert model.outside(x, margin=0.0).tolist() == [False, True, True, True, True]
    assert model.range_distance(x, margin=0.0)[1][1] == pytest.approx(0.1)


def test_weights_without_a_range_fall_back_to_z_scores(tmp_path):
    model = cm.load_cost_model()
    meta = {k: v for k, v in model.meta.items() if k not in ("x_min", "x_max")}
    cm.CostModel(model.params, meta).save(str(tmp_path / "cost_model_cpu.npz"))
    old = planner.learned_cost_model(str(tmp_path))
    assert not old.has_range and old.range_distance(np.zeros((1, 21))) is None
    assert old.outside(np.zeros((1, 21))) is None
    assert planner.learned_out_of_range(_task(3, row_scale=1 / 64), str(tmp_path)) == []
    task = _task(3)
    big = planner.learned_out_of_range(task, str(tmp_path))
    # 4 standard deviations: every table above ~1 GB, by its size (the std of the size
    # feature is floored at 0.25 as most training tables are small)
    x = np.stack([cm.shard_features(t, 1.0, old.scales, task.batch_size) for t in task.tables])
    z = (x - old.params["x_mean"]) / old.params["x_std"]
    expected = sorted(((t.name, 3, z[i, 3]) for i, t in enumerate(task.tables)
                       if np.abs(z[i]).max() > planner.OUT_OF_RANGE_SIGMAS), key=lambda e: -e[2])
    assert len(big) == 6 and [(n, j) for n, j, _ in big] == [(n, j) for n, j, _ in expected]
    assert [d for _, _, d in big] == pytest.approx([d for _, _, d in expected])
    assert all(abs(d) > planner.OUT_OF_RANGE_SIGMAS for _, _, d in big)
    _assert_worst_first(big)
    assert len(planner.learned_out_of_range(task, str(tmp_path), sigmas=20.0)) == 1
    name, _, z = big[0]
    assert planner.out_of_range_text(big[0], str(tmp_path)) == (
        f"{name}, feature size_gb at {z:+.1f} standard deviations")


def test_plan_notes_the_worst_table_outside_the_training_range(capsys, tmp_path):
    tables = list(_task(3, row_scale=1 / 64, tables=8).tables) + [
        types.TableSpec("wide", rows=1000, dim=4096)]
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({"tables": [t.to_dict() for t in tables]}))
    code = cli.main(["plan", "--tables", str(path), "--devices", "2", "--batch-size", "4096",
                     "--strategy", "learned", "--random", "0", "--out", str(tmp_path / "p.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    flagged = planner.learned_out_of_range(types.Task(tables, types.make_devices(2), 4096))
    assert flagged[0][:2] == ("wide", 0)
    assert (f"note: {len(flagged)} of 9 tables lie outside what the learned cost model was "
            f"trained on (worst: wide, feature dim at {flagged[0][2]:.1f} range widths beyond "
            f"its training range)") in out
    assert "standard deviations" not in out
    # a feature that was constant in training (never an index looked up 32,768+ times a batch)
    text = planner.out_of_range_text(
        ("t13", 20, float("inf")), None)
    assert text == "t13, feature reuse(32768, inf), which was 0 throughout training"


def _wide_gpu_task(dim=2048):
    """One hot table `dim` wide among 30 narrow ones on 8 GPUs (the gpu weights saw dims up to
    128, the gpu_wide ones pieces up to 448 wide)."""
    tables = [types.TableSpec("hot", rows=10**6, dim=dim, pooling_factor=10.0)] + [
        types.TableSpec(f"n{i:02d}", rows=100_000, dim=32, pooling_factor=2.0) for i in range(30)]
    return types.Task(tables, types.make_devices(8, "16GiB", "/GPU:{i}"), batch_size=65536)


def test_tasks_with_wide_tables_plan_and_score_with_the_gpu_wide_weights():
    # Trained on measured devices of 192-448 wide tables: 512 lies inside what they saw
    # (widened), so the learned model scores the candidates there.
    wide, narrow = _wide_gpu_task(512), _wide_gpu_task(128)
    assert cm.profile_of(wide) == "gpu_wide" and cm.profile_of(narrow) == "gpu"
    assert planner.learned_cost_model(None, wide).profile == "gpu_wide"
    assert planner.learned_cost_model(None, narrow).profile == "gpu"
    assert planner.default_judge(wide, planner.default_estimator(wide)).name == "learned"
    choice = Planner().plan(wide)
    assert choice.estimator == "learned"
    assert choice.candidates[0].max_cost == pytest.approx(
        max(planner.default_estimator(wide).plan_costs(choice.plan).values()))


def test_default_scores_with_analytic_where_a_shape_lies_far_outside_the_weights():
    # Measured on GPUs, learned models predicted devices with tables wider than they had seen
    # well below their cost, so there the analytic estimator picks among the candidates.
    task = _wide_gpu_task()
    learned = planner.default_estimator(task)
    assert learned.name == "learned"
    flagged = planner.learned_out_of_range(task)
    assert flagged[0][:2] == ("hot", 0) and flagged[0][2] > planner.EXTRAPOLATION_LIMIT
    assert planner.default_judge(task, learned).name == "analytic"
    choice = Planner().plan(task)
    assert choice.estimator == "analytic"
    analytic = estimators.get_estimator("analytic")
    names = [c.strategy for c in choice.candidates]
    assert "learned" in names            # the learned proposer still proposes
    for candidate in choice.candidates:  # proposed with the learned model, scored analytically
        plan = proposers.propose(task, candidate.strategy, estimator=learned)
        assert max(analytic.plan_costs(plan).values()) == pytest.approx(candidate.max_cost)
    assert max(analytic.plan_costs(choice.plan).values()) == choice.candidates[0].max_cost
    # an estimator the caller names scores as named
    assert Planner(learned).plan(task).estimator == "learned"
    assert Planner(learned, judge="analytic").plan(task).estimator == "analytic"
    # dim 128 lies inside what the GPU weights saw
    assert planner.default_judge(_wide_gpu_task(128), learned).name == "learned"


def test_default_keeps_learned_where_only_reuse_shares_lie_outside():
    # The 1-row table's reuse share lies far outside the training range, but shares are bounded
    # in [0, 1]: only a table's shape makes the learned scores extrapolate without bound.
    task = _task(3, row_scale=1 / 64)
    flagged = planner.learned_out_of_range(task)
    assert flagged and flagged[0][2] > planner.EXTRAPOLATION_LIMIT
    assert features.FEATURE_NAMES[flagged[0][1]] not in planner.SHAPE_FEATURES
    assert planner.default_judge(task, planner.default_estimator(task)).name == "learned"
    assert Planner().plan(task).estimator == "learned"
    # full size, two tables are above the trained size (3 GB): far only past EXTRAPOLATION_LIMIT
    big = _task(3)
    sizes = {name: d for name, j, d in planner.learned_out_of_range(big)
             if features.FEATURE_NAMES[j] == "size_gb"}
    assert max(sizes.values()) > planner.EXTRAPOLATION_LIMIT
    assert planner.default_judge(big, planner.default_estimator(big)).name == "analytic"
    assert planner.default_judge(big, planner.default_estimator(big),
                                limit=max(sizes.values()) + 0.01).name == "learned"
    # any other estimator is returned as is
    assert planner.default_judge(big, "analytic").name == "analytic"


def test_plan_says_when_analytic_scores_the_candidates(capsys, tmp_path):
    task = _wide_gpu_task()
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({"tables": [t.to_dict() for t in task.tables]}))
    common = ["plan", "--tables", str(path), "--devices", "8", "--device-template", "/GPU:{i}",
              "--memory", "16GiB", "--batch-size", "65536", "--random", "0"]
    assert cli.main(common + ["--out", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert "learned weights: gpu_wide profile (policy_gpu_wide.npz)" in out
    assert "so the analytic estimator scores the candidates" in out
    assert "(by the analytic estimator" in out and "estimator analytic" in out
    assert cli.main(common + ["--estimator", "learned", "--out", str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "scores the candidates" not in out and "(by the learned estimator" in out
    # a directory without gpu_wide weights plans with its gpu ones
    (tmp_path / "w").mkdir()
    for kind in ("cost_model", "policy"):
        shutil.copy(cm.weights_file(kind, "gpu"), tmp_path / "w" / f"{kind}_gpu.npz")
    assert cli.main(common + ["--weights", str(tmp_path / "w"),
                              "--out", str(tmp_path / "c.json")]) == 0
    assert "learned weights: gpu_wide profile (policy_gpu.npz)" in capsys.readouterr().out


# -- the Planner (issue 61): the one place that plans -------------------------------------------
def _other_weights(path):
    """A weights directory whose CPU cost model weighs the forward stage 3x (the shipped policy):
    the learned proposer plans the pool's tasks differently with it."""
    model = cm.load_cost_model()
    params = dict(model.params, forward_w2=model.params["forward_w2"] * 3)
    cm.CostModel(params, model.meta).save(str(path / "cost_model_cpu.npz"))
    shutil.copy(cm.weights_file("policy", "cpu"), path / "policy_cpu.npz")
    return str(path)


def test_the_default_planner_is_every_proposal_scored_by_the_default_judge():
    # What `tfra-de plan` did before the Planner, spelled out: the default estimator proposes,
    # the default judge scores, the cheapest wins (ties: the strategy listed first).
    task = _task(5, row_scale=1 / 64)
    est = planner.default_estimator(task)
    judge = planner.default_judge(task, est)
    names = [s for s in proposers.list_strategies() if s not in planner.SKIPPED]
    plans = {s: proposers.propose(task, s, seed=0, estimator=est) for s in names}
    costs = {s: max(judge.plan_costs(p).values()) for s, p in plans.items()}
    order = sorted(names, key=lambda s: (costs[s], names.index(s)))
    choice = Planner().plan(task)
    assert [c.strategy for c in choice.candidates] == order
    assert [c.max_cost for c in choice.candidates] == pytest.approx([costs[s] for s in order])
    assert choice.plan.assignment == plans[order[0]].assignment
    assert choice.plan.columns == plans[order[0]].columns
    assert choice.estimator == judge.name == "learned" and choice.judge.name == "learned"
    assert choice.notes[0] == "learned weights: cpu profile (policy_cpu.npz)"
    assert len(choice.notes) == 1 + bool(planner.learned_out_of_range(task))


def test_planners_with_different_weights_do_not_share_them(tmp_path, small_pool):
    # Before the Planner the learned weights were a process-wide setting (`policy.use_weights`):
    # planning with one directory changed what every later plan used.
    task = workloads.make_tasks(small_pool, 1, tables_per_task=12, num_devices=3)[0]
    other = _other_weights(tmp_path)
    shipped_plan = proposers.propose(task, "learned").assignment
    other_plan = proposers.propose(task, "learned", weights=other).assignment
    assert shipped_plan != other_plan
    shipped, mine = Planner(proposers=["learned"]), Planner(proposers=["learned"], weights=other)
    for _ in range(2):   # interleaved: each keeps its own weights
        assert mine.plan(task).plan.assignment == other_plan
        assert shipped.plan(task).plan.assignment == shipped_plan
    assert proposers.propose(task, "learned").assignment == shipped_plan
    # the default estimator and judge read the planner's weights too
    choice = Planner(weights=other).plan(task)
    learned = [c for c in choice.candidates if c.strategy == "learned"][0]
    assert learned.max_cost == pytest.approx(max(
        cm.LearnedEstimator(other).plan_costs(proposers.propose(
            task, "learned", weights=other)).values()))
    with pytest.raises(ValueError, match="weights directory .* does not exist"):
        Planner(weights=str(tmp_path / "nope"))


def test_one_proposer_is_not_judged_and_raises_its_own_error():
    # Nothing to choose: the plan as proposed, scored by the proposers' estimator (a learned one
    # here, where the default judge of several candidates would take the analytic one).
    task = _wide_gpu_task()
    assert Planner().plan(task).estimator == "analytic"
    choice = Planner(proposers=["learned"]).plan(task)
    assert choice.estimator == "learned" and choice.judge.name == "learned"
    assert [c.strategy for c in choice.candidates] == ["learned"]
    assert choice.plan.assignment == proposers.propose(
        task, "learned", estimator=planner.default_estimator(task)).assignment
    assert not any("scores the candidates" in note for note in choice.notes)
    tight = _task(0, memory="1MiB")
    with pytest.raises(types.PlacementError, match="cannot place|larger than the largest"):
        Planner(proposers=["lookup-greedy"]).plan(tight)


def test_proposers_and_judges_can_be_plain_functions():
    task = _task(0)
    calls = []

    def lookup_greedy_again(task, seed=0, estimator=None):
        calls.append(estimator.name)
        plan = proposers.propose(task, "lookup-greedy", seed)
        plan.strategy = "mine"
        return plan

    def judge(task, estimator, weights=None):
        calls.append((estimator.name, weights))
        return "analytic"

    assert isinstance(lookup_greedy_again, types.Proposer) and isinstance(judge, types.Judge)
    assert isinstance(planner.default_judge, types.Judge)
    choice = Planner("learned", [lookup_greedy_again, "size-greedy"], judge).plan(task)
    assert calls == [("learned", None), "learned"]
    assert {c.strategy for c in choice.candidates} == {"lookup_greedy_again", "size-greedy"}
    assert choice.estimator == "analytic"
    with pytest.raises(ValueError, match="distinct names"):
        Planner(proposers=["size-greedy", "size-greedy"])
    with pytest.raises(ValueError, match="verify_top must be >= 0; got -1"):
        Planner(verify_top=-1)


def test_the_plan_command_prints_what_the_planner_chose(capsys, tmp_path):
    task = _task(3, row_scale=1 / 64, tables=8)
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({"tables": [t.to_dict() for t in task.tables]}))
    assert cli.main(["plan", "--tables", str(path), "--devices", "4", "--batch-size", "4096",
                     "--random", "0", "--out", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    choice = Planner().plan(types.Task(task.tables, types.make_devices(4), 4096))
    assert out[:len(choice.notes)] == choice.notes
    rows = [line.split() for line in out if line.startswith("  candidate ")]
    assert [r[1] for r in rows] == [c.strategy for c in choice.candidates]
    assert [float(r[4]) for r in rows] == [round(c.max_cost * 1e3, 3) for c in choice.candidates]
    assert f"best: {choice.plan.strategy} (by the {choice.estimator} estimator" in "\n".join(out)
    assert types.Plan.load(tmp_path / "p.json").assignment == choice.plan.assignment
