"""The RL placement policy: gradients, training beats random, shipped weights plan, errors."""


import numpy as np
import pytest

from tfra_dynamic_embedding.placement import cost_model as cm
from tfra_dynamic_embedding.placement import evaluate, pieces, proposers, policy as pol, train, workloads
from tfra_dynamic_embedding.placement.types import PlacementError

from tests.placement.helpers import run_python, table, task as make_task


@pytest.fixture(scope="module")
def model():
    return cm.load_cost_model()


@pytest.fixture(scope="module")
def tiny_tasks(small_pool):
    return workloads.make_tasks(small_pool, 3, tables_per_task=12, num_devices=3, seed=4,
                                batch_size=1024)


def _log_prob(policy, problem, choices):
    _, _, trace = pol.rollout(problem, policy, len(choices), greedy=False, keep=True,
                              force=choices)
    total = np.zeros(len(choices))
    for step in trace:
        total += np.log(step["probs"][np.arange(len(choices)), step["chosen"]])
    return total


def test_policy_gradient_matches_finite_differences(model, tiny_tasks):
    problem = pol.Problem(tiny_tasks[0], model)
    policy = pol.Policy(seed=1, alpha=2.0)
    policy.params["w2"] = np.random.default_rng(2).normal(0, 0.5, policy.params["w2"].shape)
    choices, _, trace = pol.rollout(problem, policy, 2, greedy=False,
                                    rng=np.random.default_rng(0), keep=True)
    adv = np.array([1.0, -0.5])
    grads = policy.gradients(trace, adv)
    # w1 rows: a scalar input, the piece's embedding, the device's sum (rollout adds these
    # parts of the first layer separately; the trace's x must be their concatenation)
    w1_rows = ((7, 2), (pol.NUM_SCALARS + 3, 1), (pol.NUM_SCALARS + cm.EMBED_DIM + 5, 4))
    for key, index in (("alpha", ()), ("w2", (3,)), ("b1", (5,))) + tuple(
            ("w1", rc) for rc in w1_rows):
        eps = 1e-5
        saved = policy.params[key].copy()
        policy.params[key] = saved.copy()
        policy.params[key][index] += eps
        up = -(adv * _log_prob(policy, problem, choices)).sum()
        policy.params[key][index] -= 2 * eps
        down = -(adv * _log_prob(policy, problem, choices)).sum()
        policy.params[key] = saved
        assert grads[key][index] == pytest.approx((up - down) / (2 * eps), rel=1e-3, abs=1e-6)


def test_short_training_beats_random(model, tiny_tasks):
    start = pol.Policy(seed=0, alpha=0.0)        # no greedy prior: the MLP must learn
    trained = train.train_policy(model, tiny_tasks, iterations=30, samples=8, lr=1e-2,
                                 policy=pol.Policy(seed=0, alpha=0.0), eval_every=5)
    est = cm.LearnedEstimator(model)
    for task in tiny_tasks:
        rand = evaluate.random_baseline(task, est, num_random=10)
        plan = pol.plan_task(task, trained, model)
        assert max(est.plan_costs(plan).values()) < rand
    assert train.mean_greedy_cost(model, trained, tiny_tasks) <= train.mean_greedy_cost(
        model, start, tiny_tasks)


def test_shipped_weights_plan_a_task(small_pool):
    task = workloads.make_tasks(small_pool, 1, tables_per_task=30, num_devices=4, seed=1,
                                memory="1GiB", batch_size=1024)[0]
    assert "learned" in proposers.list_strategies()
    plan = proposers.propose(task, "learned")
    assert plan.strategy == "learned" and sorted(plan.assignment) == sorted(
        t.name for t in task.tables)
    plan.validate(check_memory=True)
    memory = plan.memory_by_device()
    assert all(memory[d.name] <= d.memory_bytes for d in task.devices)
    rows, _ = evaluate.compare_strategies(task, ["random", "learned"], "learned", num_random=5)
    assert rows[1]["max_cost"] < rows[0]["max_cost"]


def test_big_tables_are_split_on_distinct_devices():
    tables = [table("big", 1000, dim=4, pooling=5.0), table("a", 100, dim=4, pooling=1.0),
              table("b", 100, dim=4, pooling=2.0)]
    plan = proposers.propose(make_task(tables, 3, memory=2500), "learned")
    assert len(plan.devices_for("big")) == 2 and len(set(plan.devices_for("big"))) == 2


def test_infeasible_task_gives_the_heuristics_error():
    tables = [table("a", 900), table("b", 900), table("c", 900)]
    task = make_task(tables, 2, memory=1000)
    with pytest.raises(PlacementError) as ours:
        proposers.propose(task, "learned")
    with pytest.raises(PlacementError) as theirs:
        proposers.propose(task, "lookup-greedy")
    assert str(ours.value) == str(theirs.value)
    assert "cannot place 1 of 3 tables on 2 devices" in str(ours.value)
    assert ours.value.shortfall_bytes == theirs.value.shortfall_bytes > 0
    with pytest.raises(PlacementError, match="larger than the largest device"):
        proposers.propose(make_task([table("huge", 5000)], 2, memory=1000), "learned")


def test_planning_imports_no_tensorflow():
    code = ("import sys; from tfra_dynamic_embedding.placement import proposers, "
            "workloads; pool = workloads.generate_pool(20, seed=1, batch_size=1024, "
            "row_scale=1/64); t = workloads.make_tasks(pool, 1, 10, 2)[0]; "
            "proposers.propose(t, 'learned'); print('tensorflow' in sys.modules)")
    assert run_python(code) == "False"


def test_weights_directory(tmp_path, small_pool):
    task = workloads.make_tasks(small_pool, 1, tables_per_task=10, num_devices=2)[0]
    with pytest.raises(ValueError, match="does not exist"):
        proposers.propose(task, "learned", weights=str(tmp_path / "nope"))
    cm.load_cost_model().save(str(tmp_path / "cost_model_cpu.npz"))
    pol.load_policy().save(str(tmp_path / "policy_cpu.npz"))
    plan = proposers.propose(task, "learned", weights=str(tmp_path))
    assert plan.assignment == proposers.propose(task, "learned").assignment


def test_local_search_lowers_the_max_and_keeps_the_plan_legal(model, small_pool):
    task = workloads.make_tasks(small_pool, 1, tables_per_task=24, num_devices=4, seed=3,
                                memory="1GiB", batch_size=1024)[0]
    problem = pol.Problem(task, model)
    rng = np.random.default_rng(0)
    start = rng.integers(0, 2, len(problem.items))      # everything on devices 0 and 1
    before = model.total(np.stack([problem.emb[start == d].sum(axis=0) for d in range(4)]))
    improved, top = pol.improve(problem, start)
    after = model.total(np.stack([problem.emb[improved == d].sum(axis=0) for d in range(4)]))
    assert top == pytest.approx(after.max()) and top < 0.8 * before.max()
    assert set(np.unique(improved)) == {0, 1, 2, 3}      # the idle devices got work
    # the budget counts scored moves, not seconds: none leaves the plan as it was, a small one
    # stops early, and the same budget always gives the same plan
    assert (pol.improve(problem, start, max_evaluations=0)[0] == start).all()
    early, early_top = pol.improve(problem, start, max_evaluations=50)
    assert top < early_top < before.max()
    assert (pol.improve(problem, start, max_evaluations=50)[0] == early).all()
    plan = pol._to_plan(problem, improved, 0, {})  # pylint: disable=protected-access
    plan.validate(check_memory=True)
    # memory is respected: with room for one table each, nothing moves onto a full device
    tables = [table(f"t{i}", 100, dim=4, pooling=1.0 + i) for i in range(4)]
    tight = pol.Problem(make_task(tables, 4, memory=450), model)
    fixed, _ = pol.improve(tight, np.array([0, 1, 2, 3]))
    assert sorted(fixed.tolist()) == [0, 1, 2, 3]
    # phase 2 balances below an unbeatable max: the giant table alone sets it, the small
    # tables spread from device 1 onto the idle device 2
    tables = [table("giant", 1000, dim=128, pooling=150.0)] + [
        table(f"s{i}", 1000, dim=16, pooling=5.0) for i in range(6)]
    lone = pol.Problem(make_task(tables, 3), model)
    start = np.array([0 if it.table.name == "giant" else 1 for it in lone.items])
    spread, top = pol.improve(lone, start)
    costs = model.total(np.stack([lone.emb[spread == d].sum(axis=0) for d in range(3)]))
    giant = [d for it, d in zip(lone.items, spread) if it.table.name == "giant"][0]
    assert top == pytest.approx(costs[giant]) and costs.max() == costs[giant]
    assert (spread[[it.table.name != "giant" for it in lone.items]] != giant).all()
    assert np.bincount(spread, minlength=3).min() >= 1 and costs.min() > 0
    # slices of one table never share a device
    split = pol.Problem(make_task([table("big", 1000, dim=4, pooling=50.0),
                                   table("s", 10, dim=4, pooling=1.0)], 3, memory=2500), model)
    moved, _ = pol.improve(split, np.arange(len(split.items)) % 3)
    slices = [d for it, d in zip(split.items, moved) if it.table.name == "big"]
    assert len(slices) == len(set(slices)) == 2


def test_hot_tables_are_cut_into_row_slices_when_that_lowers_the_max(model):
    # one table costs more than all the others together: whole, it alone sets the max
    tables = [table("hot", 4000, dim=64, pooling=60.0)] + [
        table(f"s{i}", 1000, dim=16, pooling=4.0) for i in range(6)]
    task = make_task(tables, 4)
    whole = pol.plan_task(task, model=model, hot_splits=(None,))
    cut = pol.plan_task(task, model=model)
    assert whole.num_slices("hot") == 1 and whole.meta["split_tables"] == []
    assert cut.meta["split_tables"] == ["hot"] and cut.meta["hot_split"] is not None
    devices = cut.devices_for("hot")
    assert len(devices) == cut.num_slices("hot") >= 2 and len(set(devices)) == len(devices)
    cut.validate(check_memory=True)
    est = cm.LearnedEstimator(model)
    by_model = {name: max(est.plan_costs(p).values()) for name, p in (("whole", whole),
                                                                        ("cut", cut))}
    assert by_model["cut"] < by_model["whole"]
    assert cut.meta["predicted_max_ms"] == pytest.approx(by_model["cut"] * 1e3, rel=1e-6)
    # every slice costs at most the limit it was cut for
    L = sum(model.total(model.shard_embedding(t)[None])[0] for t in tables) / 4
    items = pol.split_hot_items(pieces.split_pieces(task),
                                np.array([model.total(model.shard_embedding(t)[None])[0]
                                          for t in tables]), model, 4, L)
    hot = [it for it in items if it.table.name == "hot"]
    assert len(hot) >= 2 and all(it.num_slices == len(hot) for it in hot)
    costs = model.total(np.stack([model.shard_embedding(it.table, it.index, it.num_slices)
                                  for it in hot]))
    assert costs.max() <= L or len(hot) == 4
    assert [it.table.name for it in items if it.table.name != "hot"] == [
        f"s{i}" for i in range(6)]                       # the cool tables stay whole
    # a task without hot tables is planned exactly as with tables whole
    cool = make_task(tables[1:], 3)
    assert (pol.plan_task(cool, model=model).assignment
            == pol.plan_task(cool, model=model, hot_splits=(None,)).assignment)
