"""Learned placement vs random and the heuristics on unseen tables; transfer to larger tasks.

    python benchmarks/placement_eval.py [--tasks 10] [--measured-tasks 0] [--measured-transfer 0]
        [--measured-transfer-shape 160/16] [--remeasure 0] [--records-out F]
        [--plot placement_eval.png]

Setup (down-scaled for CPU, the pool the CPU benchmark records come from): a MetaSyn-like pool of
256 tables (batch 1024, hash sizes / 64, seed 0), split in halves; the cost model learned from
shards of the first halves of pools 0-2 and the policy from tasks of pool 0's first half; the
test tasks take 80 tables of pool 0's second half on 8 devices of 256 MiB.
Transfer: 160/16, 400/40, 800/80 tables/devices from larger pools of the same generator (seed
101, the test half), same memory per device.

Scores (LABELLED in the output): by the "learned" cost model (always), and by measured CPU
costs (the tf_cpu benchmark, one TF thread, the protocol of the shipped records) on the first
--measured-tasks tasks; the goals are judged on the measured scores when there are any.
Metrics: mean max device cost, degree of balance (min / max device cost), speedup over random,
and the gap to a bound: all tables on one device / devices -- a lower bound when sharing a
device never costs more than running apart and cutting a table into row slices never makes its
work cheaper (`learned` cuts hot tables, so the heaviest table alone is no bound); measured too
when scoring by measurement, and reported invalid if any plan beats it. "learned-whole" is the
learned strategy with tables kept whole, to show what cutting hot tables adds. cost-greedy is
given the cost model, so it is the cost model's own greedy. A plan's devices are measured
together (`tf_cpu.benchmark_devices`: interleaved rounds), as devices that run at the same time
would be: the machine's drift moves them alike and does not show as imbalance. Every measured
device is also a record of unseen tables: the cost model's MAE on them is printed and
`--records-out FILE` keeps them. `--remeasure N` measures the learned plans of N tasks again in
a fresh process: the noise of one measurement, the part of it not common to a plan's devices,
and the balance a perfectly balanced plan would show under that part (the ceiling for the
balance goal on this machine). The planning time of `learned` on 800 tables / 80 devices is
measured on one core (BLAS threads 1, CPU affinity one core).

Prints a table and one JSON line.
"""

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from tfra_dynamic_embedding.placement import cost_model as cm  # noqa: E402
from tfra_dynamic_embedding.placement import evaluate, pieces, proposers, train, workloads  # noqa: E402
from tfra_dynamic_embedding.placement import policy  # noqa: E402
from tfra_dynamic_embedding.placement.types import PlacementError  # noqa: E402

STRATEGIES = ["random", "size-greedy", "dim-greedy", "lookup-greedy", "size-lookup-greedy",
              "capacity-balanced", "load-balanced", "nsbp", "cost-greedy", "learned-whole",
              "learned"]
TRANSFER_SEED = 101
MEASURED_STRATEGIES = ["random", "lookup-greedy", "size-lookup-greedy", "cost-greedy",
                       "learned-whole", "learned"]


@proposers.register_strategy("learned-whole", "the learned strategy with every table kept "
                             "whole (no cutting of hot tables): an ablation")
def learned_whole(task, seed=0, estimator=None):
    del estimator
    return policy.plan_task(task, seed=seed, samples=policy.BEST_OF, hot_splits=(None,))


def bound_shards(task):
    """Every piece of the task's tables on one device."""
    return pieces.split_pieces(task)


def bound(task, est):
    """All pieces on one device / devices, by `est`: a lower bound on any plan's max cost when
    sharing a device never costs more than running apart and cutting a table into row slices
    never makes its work cheaper (the learned strategy cuts hot tables, so the heaviest table
    alone bounds only plans that keep it whole)."""
    return est.device_cost(bound_shards(task), None, task) / task.num_devices


def score(tasks, strategies, est, num_random=10, plan_est=None, bound_fn=None, on_task=None,
          on_plan=None, on_proposed=None, measure_bound=True, weights=None):
    """Rows per strategy: mean max cost, balance, speedup over random, gap to the bound, scored
    by `est`; proposers that use an estimator (cost-greedy) get `plan_est` (default `est`), the
    learned one the trained `weights` (a directory; None: the shipped ones).
    `bound_fn(task)` gives the bound (default `bound` by `est` unless it measures);
    `on_task(task, strategy)` is called before each strategy's plans are scored,
    `on_proposed(task, {strategy: plans})` once a task's plans are proposed (before a measuring
    estimator times them), `on_plan(strategy, plan, costs)` after each plan is scored;
    `measure_bound=False` leaves the all-tables device out of a measuring estimator's runs."""
    plan_est = plan_est or est
    if bound_fn is None:
        bound_fn = (lambda task: None) if est.measured else (lambda task: bound(task, est))
    per = {s: {"max": [], "bal": [], "speed": [], "gap": []} for s in strategies}
    failures = {s: 0 for s in strategies}
    for task in tasks:
        if on_task:
            on_task(task, "random")
        # the random baseline's plans (evaluate.random_baseline draws the same seeds)
        proposed = {"random": [proposers.propose(task, "random", k) for k in range(num_random)]}
        for name in strategies:
            if name == "random":
                continue
            try:
                proposed[name] = [proposers.propose(task, name, 0, plan_est, weights)]
            except PlacementError:
                failures[name] += 1
        if on_proposed:
            on_proposed(task, proposed)
        if hasattr(est, "measure_plans"):
            # A measuring estimator times all of the task's devices (and its bound) in one
            # interleaved run, so strategies and bound are compared under the same drift
            # (above its max_together devices, in groups of whole plans).
            est.measure_plans([p for plans in proposed.values() for p in plans],
                              extra_devices=[bound_shards(task)] if measure_bound else [])
        rand = evaluate.random_baseline(task, est, num_random)
        if on_task:
            on_task(task, "bound")
        lb = bound_fn(task)
        for name in strategies:
            if name not in proposed:   # infeasible for this strategy
                continue
            if on_task:
                on_task(task, name)
            for plan in proposed[name]:
                costs = est.plan_costs(plan)
                if on_plan:
                    on_plan(name, plan, costs)
                top = max(costs.values())
                per[name]["max"].append(top)
                per[name]["bal"].append(evaluate.balance(costs))
                per[name]["speed"].append(rand / top)
                if lb:
                    per[name]["gap"].append(top / lb - 1.0)
    rows = []
    for name in strategies:
        v = per[name]
        rows.append({"strategy": name, "tasks": len(tasks) - failures[name],
                     "failures": failures[name],
                     "max_cost": float(np.mean(v["max"])) if v["max"] else None,
                     "balance": float(np.mean(v["bal"])) if v["bal"] else None,
                     "speedup_over_random": float(np.mean(v["speed"])) if v["speed"] else None,
                     "gap": float(np.mean(v["gap"])) if v["gap"] else None,
                     "min_gap": float(np.min(v["gap"])) if v["gap"] else None,
                     "lower_bound": None})
    return rows


def _goals(by):
    """The issue's goals for `learned` from rows by strategy (one scoring)."""
    learned, lookup = by["learned"], by["lookup-greedy"]
    # a plan below the bound shows the cost is not sub-additive there (or slicing made work
    # cheaper), so the bound is no bound and the goal cannot be judged
    valid = all(r["min_gap"] is None or r["min_gap"] >= -1e-9 for r in by.values())
    return {"balance": learned["balance"], "balance_goal_met": learned["balance"] >= 0.95,
            "reduction_vs_lookup_greedy": 1 - learned["max_cost"] / lookup["max_cost"],
            "reduction_goal_met": learned["max_cost"] <= 0.9 * lookup["max_cost"],
            "ratio_to_bound": None if learned["gap"] is None else 1 + learned["gap"],
            "bound_valid": valid,
            "bound_goal_met": (learned["gap"] <= 0.03) if valid and learned["gap"] is not None
            else None}


def score_measured(tasks, model_est, records_out=None, label="80/8",
                   strategies=MEASURED_STRATEGIES, num_random=2, pool=None, reuse=None,
                   measure_bound=True):
    """Scores MEASURED_STRATEGIES on `tasks` by measured CPU costs (tf_cpu benchmark, one TF
    thread, the protocol of the shipped records); every measured device is also a record of
    unseen tables, on which the cost model's error is reported. None without TensorFlow.
    `measure_bound=False` skips the bound (its one device would hold every table)."""
    try:
        from tfra_dynamic_embedding.placement.benchmark import tf_cpu  # pylint: disable=import-outside-toplevel
        from tfra_dynamic_embedding.placement.benchmark import collect  # pylint: disable=import-outside-toplevel
    except ImportError as err:
        print(f"\n(no measured scoring: {err})")
        return None
    tf_cpu.set_threads(1)
    pool = pool or train.CPU_POOL
    records, where = [], {}

    def keep(shards, batch, result):
        # A task's devices are measured in one run: the label is the first strategy whose plan
        # holds the device (random plans first, the bound last).
        label = where["labels"].get(tf_cpu.shard_key(shards, batch), "bound")
        records.append(collect.make_record(
            shards, result, batch, 0, split="test",
            source=f"eval:{label}", pool_seed=pool["seed"],
            pool_tables=pool["num_tables"], row_scale=pool["row_scale"]))

    def on_proposed(task, proposed):
        batch = mest._batch(task)  # pylint: disable=protected-access
        where["labels"] = {}
        for strategy in sorted(proposed, key=lambda s: s != "random"):
            for plan in proposed[strategy]:
                for shards in plan.shards_by_device().values():
                    if shards:
                        where["labels"].setdefault(tf_cpu.shard_key(shards, batch), strategy)

    # Measured in a child process replaced every 100 shards: TF keeps memory per traced shard.
    mest = tf_cpu.MeasuredEstimator(batch_size=train.CPU_POOL["batch_size"], repeat=5,
                                    on_measure=keep, cache_size=1 << 20, threads=1,
                                    isolate=100)
    reused = collect.read_records(reuse) if reuse else []
    earlier = {record["key"]: record["total_ms"] / 1e3 for record in reused}   # same shard key
    t0 = time.time()

    def on_task(task, strategy):
        if where.get("task") is not task:
            # Each task's devices are measured in its own minutes: a device that recurs in
            # several tasks (a hot table kept whole) is measured in each, so one unlucky
            # measurement counts once, not in every task it recurs in.
            where["task"] = task
            mest.cache = dict(earlier)
        print(f"  {strategy} plans of task {tasks.index(task) + 1}/{len(tasks)} "
              f"({time.time() - t0:.0f}s, {mest.measurements} shards so far)", flush=True)

    learned = []   # (plan, device costs) of the learned plans, for `repeatability`

    def on_plan(strategy, plan, costs):
        if strategy == "learned":
            learned.append((plan, costs))

    try:
        rows = score(tasks, strategies, mest, num_random=num_random, plan_est=model_est,
                     bound_fn=(lambda task: bound(task, mest)) if measure_bound else None,
                     on_task=on_task, on_plan=on_plan, on_proposed=on_proposed,
                     measure_bound=measure_bound)
    finally:
        mest.worker.close()   # an idle TF process would share the core timed below
    print(f"\n== {label}, {len(tasks)} unseen tasks, scored by: MEASURED CPU costs (tf_cpu, "
          f"{mest.measurements} shards, {time.time() - t0:.0f}s) ==")
    print(evaluate.format_rows(rows))
    devices = [r for r in records if r["source"] != "eval:bound"]
    seen = {r["key"] for r in devices}   # judged on every measured device of these tables
    devices += [r for r in reused if r["source"] != "eval:bound" and r["key"] not in seen
                and r.get("pool_seed") == pool["seed"]]
    cm_metrics = train.metrics(model_est.model, devices)
    print(f"cost model on the {len(devices)} measured devices (unseen tables): MAE "
          f"{cm_metrics.get('mae_ms', float('nan')):.2f} ms, correlation "
          f"{cm_metrics.get('corr', float('nan')):.3f}")
    if records_out:
        with open(records_out, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        print(f"wrote {len(records)} measured records to {records_out}")
    return {"rows": rows, "cost_model_on_measured_devices": cm_metrics,
            "learned": learned}


def repeatability(measured, seed=0):
    """Re-measures plans in a fresh measuring process and compares with their first
    measurement (`measured`: [(plan, {device: seconds})]): the noise of one device
    measurement (relative; std of the pair difference / sqrt 2), the part of it that is not
    common to a plan's devices (a plan's devices are measured together, so a slower machine
    moves them alike; that part does not change a plan's balance), the plans' balance by the
    second measurement, and the balance a perfectly balanced plan would show under the
    within-plan noise (mean min / max of `devices` draws of 1 + noise; Monte Carlo) -- the
    ceiling any measured balance figure is up against on this machine."""
    from tfra_dynamic_embedding.placement.benchmark import tf_cpu  # pylint: disable=import-outside-toplevel
    mest = tf_cpu.MeasuredEstimator(batch_size=train.CPU_POOL["batch_size"], repeat=5,
                                    cache_size=1 << 20, threads=1, isolate=100)
    diffs, within, balances = [], [], []
    try:
        for plan, before in measured:
            again = mest.plan_costs(plan)
            logs = []
            for device, cost in again.items():
                if before.get(device):
                    diffs.append((cost - before[device]) / (0.5 * (cost + before[device])))
                    logs.append(np.log(cost / before[device]))
            if len(logs) > 1:   # deviations from the plan's mean change, unbiased
                scale = np.sqrt(len(logs) / (len(logs) - 1))
                within += list((np.array(logs) - np.mean(logs)) * scale)
            balances.append(evaluate.balance(again))
    finally:
        mest.worker.close()
    noise = float(np.std(diffs) / np.sqrt(2)) if diffs else float("nan")
    within_noise = float(np.std(within) / np.sqrt(2)) if within else float("nan")
    draws = 1 + within_noise * np.random.default_rng(seed).standard_normal(
        (20000, measured[0][0].task.num_devices))
    ceiling = float(np.mean(draws.min(axis=1) / draws.max(axis=1)))
    out = {"devices": len(diffs), "noise_cv": noise, "within_plan_noise_cv": within_noise,
           "mean_abs_change": float(np.mean(np.abs(diffs))) if diffs else float("nan"),
           "balance_first": float(np.mean([evaluate.balance(c) for _, c in measured])),
           "balance_again": float(np.mean(balances)), "balance_ceiling": ceiling}
    print(f"\nrepeatability ({len(diffs)} devices of {len(measured)} plans re-measured in a "
          f"fresh process): "
          f"one measurement's noise {noise:.1%} (mean |change| {out['mean_abs_change']:.1%}), "
          f"within a plan (not common to its devices) {within_noise:.1%}; balance "
          f"{out['balance_first']:.3f} first, {out['balance_again']:.3f} again; a perfectly "
          f"balanced plan would measure {ceiling:.3f} under this noise")
    return out


def planning_time(task, repeats=5):
    try:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    except (AttributeError, OSError):
        pass
    proposers.propose(task, "learned")     # loads the weights
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        proposers.propose(task, "learned")
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), float(np.min(times))


def transfer_tasks(tables, devices, num_tasks):
    # pool seed 101: no benchmark records come from it (training used pool seeds 0-2)
    pool = workloads.generate_pool(int(2.5 * tables), seed=TRANSFER_SEED, batch_size=1024,
                                   row_scale=1 / 64)
    _, test = workloads.split_pool(pool, seed=TRANSFER_SEED)
    return workloads.make_tasks(test, num_tasks, tables, devices, train.CPU_MEMORY, seed=7,
                                batch_size=1024)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--transfer-tasks", type=int, default=3)
    parser.add_argument("--measured-tasks", type=int, default=0,
                        help="also score this many 80/8 tasks by measured CPU costs (slow)")
    parser.add_argument("--measured-transfer", type=int, default=0,
                        help="also score this many transfer tasks by measured CPU costs (slow)")
    parser.add_argument("--measured-transfer-shape", default="160/16",
                        choices=["160/16", "400/40", "800/80"],
                        help="tables/devices of the measured transfer tasks (the bound is "
                        "measured for 160/16 only: beyond, its one device would hold 6+ GB)")
    parser.add_argument("--records-out", default=None, metavar="FILE",
                        help="append the measured devices as JSONL benchmark records")
    parser.add_argument("--reuse-records", default=None, metavar="FILE",
                        help="take the cost of shards already in this JSONL (an earlier "
                        "--records-out) instead of measuring them again")
    parser.add_argument("--remeasure", type=int, default=0, metavar="N",
                        help="re-measure the learned plans of the first N measured tasks in a "
                        "fresh process: the measurement noise and the balance it allows")
    parser.add_argument("--plot", default="placement_eval.png")
    args = parser.parse_args(argv)

    est = cm.LearnedEstimator()
    model_meta = est.model.meta
    tasks = train.cpu_pool_tasks(args.tasks, "test", seed=11)
    results = {"setup": {"pool": train.CPU_POOL, "memory_per_device": train.CPU_MEMORY,
                         "tasks": args.tasks, "tables": 80, "devices": 8,
                         "cost_model_records": model_meta.get("records"),
                         "cost_model_data": model_meta.get("data")}}
    rows = score(tasks, STRATEGIES, est)
    print(f"== 80 tables / 8 devices, {args.tasks} unseen tasks, scored by: COST MODEL "
          f"(learned estimator) ==")
    print(evaluate.format_rows(rows))
    results["80/8 cost-model"] = rows
    by = {r["strategy"]: r for r in rows}
    goals = {"scored_by": "cost model", **_goals(by)}

    if args.measured_tasks:
        measured = score_measured(tasks[:args.measured_tasks], est, args.records_out,
                                  reuse=args.reuse_records)
        if measured:
            results["80/8 measured"] = measured["rows"]
            results["unseen_tables_cost_model"] = measured["cost_model_on_measured_devices"]
            mb = {r["strategy"]: r for r in measured["rows"]}
            goals = {"scored_by": "measured CPU costs", **_goals(mb), "cost_model": goals}
            if args.remeasure:
                n = min(args.remeasure, args.measured_tasks)
                results["repeatability"] = repeatability(measured["learned"][:n])
    else:
        print("\n(no measured scoring: --measured-tasks 0)")

    transfer = {}
    for tables, devices in ((160, 16), (400, 40), (800, 80)):
        ttasks = transfer_tasks(tables, devices, args.transfer_tasks)
        trows = score(ttasks, ["random", "lookup-greedy", "cost-greedy", "learned"], est,
                      num_random=3)
        print(f"\n== transfer {tables}/{devices}, {args.transfer_tasks} tasks, scored by: "
              f"COST MODEL ==")
        print(evaluate.format_rows(trows))
        transfer[f"{tables}/{devices}"] = trows
    results["transfer cost-model"] = transfer
    if args.measured_transfer:
        shape = args.measured_transfer_shape
        tables, devices = map(int, shape.split("/"))
        measured = score_measured(transfer_tasks(tables, devices, args.measured_transfer), est,
                                  args.records_out, label=f"transfer {shape}",
                                  strategies=["random", "lookup-greedy", "cost-greedy",
                                              "learned"], num_random=1,
                                  pool={"seed": TRANSFER_SEED, "num_tables": int(2.5 * tables),
                                        "row_scale": 1 / 64}, reuse=args.reuse_records,
                                  measure_bound=tables <= 160)
        if measured:
            results[f"transfer {shape} measured"] = measured["rows"]

    big = transfer_tasks(800, 80, 1)[0]
    median, best = planning_time(big)
    print(f"\nplanning 800 tables on 80 devices with 'learned' (one core): median "
          f"{median * 1e3:.1f} ms, best {best * 1e3:.1f} ms (goal <= 200 ms)")
    results["planning_800_80_s"] = {"median": median, "min": best, "goal_met": median <= 0.2}
    results["goals_80_8"] = goals
    ratio = "n/a" if goals["ratio_to_bound"] is None else f"{goals['ratio_to_bound']:.3f}x"
    print("goals (80/8, scored by {scored_by}): balance {balance:.3f} (>= 0.95: "
          "{balance_goal_met}), max cost {reduction_vs_lookup_greedy:+.1%} vs lookup-greedy "
          "(>= 10%: {reduction_goal_met}), ".format(**goals) +
          f"{ratio} the bound (<= 1.03: {goals['bound_goal_met']}; bound valid: "
          f"{goals['bound_valid']})")
    if args.plot:
        plotted = results.get("80/8 measured", rows)
        evaluate.plot_comparison(plotted, args.plot, title="80 tables / 8 devices, unseen "
                                 f"tables, scored by {goals['scored_by']}")
        print(f"wrote {args.plot}")
    print(json.dumps({"benchmark": "placement_eval", **results}, default=float))


if __name__ == "__main__":
    main()
