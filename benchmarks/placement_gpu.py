"""Placement on GPUs judged on measured costs: learned vs every heuristic on unseen 80/8 tasks.

Planning and training need no GPU and a GPU's time is short, so this runs in three steps:

    python benchmarks/placement_gpu.py plans --out gpu_plans.json [--tasks 10] [--weights DIR] \
        [--old-weights DIR] [--task-seed 7]
    python benchmarks/placement_gpu.py measure --plans gpu_plans.json --out gpu_measured.json \
        [--records gpu_eval.jsonl] [--time-limit S] [--passes 2]   # on the GPU (PyTorch + CUDA)
    python benchmarks/placement_gpu.py report --plans gpu_plans.json --measured gpu_measured.json
    python benchmarks/placement_gpu.py      # report: the shipped weights' plans, made again, scored
                                            # by the shipped measurement (results/, one H200)
    python benchmarks/placement_gpu.py report --task-seed 11    # the second set of unseen tasks
    python benchmarks/placement_gpu.py plans --out wide.json --wide-dim 512 --task-seed 13 \
        --tasks 8     # the two hottest tables of each task 512 wide: column splits and a shape
                      # the learned weights never saw (docs/learned_placement.md)
    python benchmarks/placement_gpu.py report --wide-dim 512 --task-seed 13   # shipped: 512
                      # and 256 of seed 13, 384 of seed 17 (planned with the gpu_wide weights)
    python benchmarks/placement_gpu.py plans --half train --wide-dim 384 --out t.json
    python benchmarks/placement_gpu.py measure --plans t.json --out m.json --records r.jsonl \
        --no-bound        # training records: devices of plans on the cost model's tables

Tasks: 80 tables of the second (unseen) half of the full-size MetaSyn-like GPU pool
(`train.PROFILES["gpu"]`: 856 tables, batch 65,536) on 8 GPUs of 16 GiB. Plans: every
registered strategy (cost-greedy and column-greedy score with the learned GPU cost model),
`random` (3 seeds), and `best` (what `tfra-de plan` does by default: every strategy proposes,
the learned estimator picks, or the analytic one where a table's shape lies far outside what
the weights saw: `planner.default_judge`; tasks with a table wider than 128 plan with the
`gpu_wide` weights, `cost_model.profile_of`); with --old-weights also "learned-old" / "best-old"
planned with other weights (e.g. the shipped ones beside retrained ones, measured in the same run).
Measured cost of a device: its pieces as fused EmbeddingBags,
forward + backward + SGD (`torch_cuda.benchmark_devices`), plus the modelled all-to-all of its
pooled rows (`comm.AllToAll`); a plan's cost is its most expensive device.
Bound: all of a task's tables measured together on one GPU, / 8, plus the all-to-all of an
eighth of the pooled rows -- a bound when sharing a GPU never costs more than running apart.
Balance: cheapest / most expensive device. `measure` also writes every measured device as a
benchmark record (`--records`): cost-model data on tables it never saw. `--passes N` measures
every device N times, pass after pass; a device's cost is then the median of its passes, and
`report` gives the spread between passes (the GPU's timing noise) and each pass's table.

Prints a table and one JSON line (`report`).
"""

import argparse
import dataclasses
import gzip
import json
import os
import sys
import time

import numpy as np

from tfra_dynamic_embedding.placement import estimators, planner, proposers, train
from tfra_dynamic_embedding.placement.benchmark import collect, torch_cuda
from tfra_dynamic_embedding.placement.comm import AllToAll, pooled_bytes
from tfra_dynamic_embedding.placement.types import Plan, Shard, Task

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
TASK_SEED = 7
# the shipped H200 measurement of each task seed's plans (the shipped weights were chosen on 7;
# 11 is a second set of unseen tasks, measured after that choice)
SHIPPED_MEASUREMENTS = {7: os.path.join(RESULTS, "placement_gpu_measured.json.gz"),
                        11: os.path.join(RESULTS, "placement_gpu_measured_seed11.json.gz")}
# the shipped H200 measurement of tasks with two tables widened (--wide-dim): (task seed, dim) ->
# (file, tasks); one run measured all three sets' plans (strategies: the file's "strategies")
WIDE_FILE = "placement_gpu_measured_wide_seed13_17.json.gz"
SHIPPED_WIDE = {(13, 512): (WIDE_FILE, 8), (13, 256): (WIDE_FILE, 8), (17, 384): (WIDE_FILE, 5)}
RANDOM_SEEDS = (0, 1, 2)
GOALS = {"below_lookup_greedy": 0.10, "balance": 0.95, "bound_ratio": 1.03}


def widen(task, dim, count=2):
    """`task` with its `count` hottest tables (by lookups per sample) widened to `dim` columns,
    among those that still fit an eighth of a device at that width: tasks where column splits
    matter (the pool's tables are at most 128 wide)."""
    room = task.devices[0].memory_bytes / 8
    fits = [t for t in task.tables
            if t.dim < dim and t.rows * dim * t.bytes_per_value <= room]
    hot = {t.name for t in sorted(fits, key=lambda t: -t.pooling_factor)[:count]}
    tables = [dataclasses.replace(t, dim=dim) if t.name in hot else t for t in task.tables]
    return dataclasses.replace(task, tables=tables)


def make_plans(num_tasks, weights=None, old_weights=None, task_seed=TASK_SEED, wide_dim=None,
               half="test", strategies=None):
    """{"tasks": [task JSON], "plans": [{"task", "strategy", "plan"}], "half"} of the tasks
    drawn with `task_seed` from the pool's `half` ("test": unseen tables; "train": the cost
    model's tables, so that `measure --records` writes training records); `old_weights`: also
    "learned-old" / "best-old" planned and picked with those weights; `wide_dim`: every task's
    two hottest tables widened to it (`widen`), and "learned-rows" beside "learned": the
    learned plan that cuts tables by rows only; `strategies`: plan only these registered
    strategies ("best" and the extras above are always planned)."""
    from tfra_dynamic_embedding.placement import policy  # pylint: disable=import-outside-toplevel
    tasks = train.pool_tasks(num_tasks, "gpu", half=half, seed=task_seed)
    if wide_dim:
        tasks = [widen(t, wide_dim) for t in tasks]
    learned = estimators.get_estimator("learned", weights=weights)
    old = estimators.get_estimator("learned", weights=old_weights) if old_weights else None
    out = {"tasks": [t.to_dict() for t in tasks], "plans": [], "half": half}
    for k, task in enumerate(tasks):
        began = time.time()
        for name in proposers.list_strategies():
            if strategies is not None and name not in strategies:
                continue
            seeds = RANDOM_SEEDS if name == "random" else (0,)
            for seed in seeds:
                plan = proposers.propose(task, name, seed=seed, estimator=learned,
                                         weights=weights)
                out["plans"].append({"task": k, "strategy": name, "seed": seed,
                                     "plan": plan.to_dict()})
        choice = planner.Planner(learned, judge=planner.default_judge,
                                 weights=weights).plan(task)
        out["plans"].append({"task": k, "strategy": "best", "seed": 0, "winner":
                             choice.plan.strategy, "plan": choice.plan.to_dict()})
        if wide_dim:
            margin, policy.COLUMN_MARGIN = policy.COLUMN_MARGIN, 1.0   # keeps no column blocks
            try:
                plan = proposers.propose(task, "learned", seed=0, estimator=learned,
                                         weights=weights)
            finally:
                policy.COLUMN_MARGIN = margin
            out["plans"].append({"task": k, "strategy": "learned-rows", "seed": 0,
                                 "plan": plan.to_dict()})
        if old is not None:
            plan = proposers.propose(task, "learned", seed=0, estimator=old,
                                     weights=old_weights)
            out["plans"].append({"task": k, "strategy": "learned-old", "seed": 0,
                                 "plan": plan.to_dict()})
            choice = planner.Planner(old, judge=planner.default_judge,
                                     weights=old_weights).plan(task)
            out["plans"].append({"task": k, "strategy": "best-old", "seed": 0, "winner":
                                 choice.plan.strategy, "plan": choice.plan.to_dict()})
        print(f"task {k}: {len(out['plans'])} plans so far ({time.time() - began:.1f}s)",
              file=sys.stderr)
    return out


def device_sets(data, strategies=None, bound_sets=True):
    """[(task index, label, [Shard])]: every distinct device of the plans (of `strategies`
    only, when given), then each task's all-tables set (the bound; not when `bound_sets` is
    False), task by task."""
    out, seen = [], set()
    by_task = {}
    for entry in data["plans"]:
        if strategies is None or entry["strategy"] in strategies:
            by_task.setdefault(entry["task"], []).append(entry)
    for k, task_data in enumerate(data["tasks"]):
        task = Task.from_dict(task_data)
        for entry in by_task.get(k, []):
            plan = Plan.from_dict(entry["plan"])
            for shards in plan.shards_by_device().values():
                key = torch_cuda.shard_key(shards, task.batch_size) if shards else None
                if key and key not in seen:
                    seen.add(key)
                    out.append((k, entry["strategy"], shards))
        if bound_sets:
            out.append((k, "all-tables", [Shard(t, "") for t in task.tables]))
    return out


def measure(data, out, records=None, time_limit=None, max_bytes=110 * 2 ** 30, device=0,
            passes=1, strategies=None, bound_sets=True):
    """Measures every device set on the GPU (`device`: "cpu" for a dry run), `passes` times
    over, pass after pass (a set's "total_ms" is the median of its passes, all of them kept in
    "passes_ms"); writes {key: result} at the end, also after an error or the time limit, and
    the first pass's records as it goes (source "eval:<strategy>" for tasks of the test half,
    "plans:<strategy>" for the training half). `strategies`, `bound_sets`: see `device_sets`."""
    import torch  # pylint: disable=import-outside-toplevel
    batch = Task.from_dict(data["tasks"][0]).batch_size
    half = data.get("half", "test")
    prefix = "eval" if half == "test" else "plans"
    sets = device_sets(data, strategies, bound_sets)
    specs = {}
    for _, _, shards in sets:
        for s in shards:
            specs.setdefault(s.table.name, s.table)
    began = time.time()
    torch_cuda.prefetch(list(specs.values()), batch, device=device)
    print(f"prefetched {len(specs)} tables' batches in {time.time() - began:.1f}s",
          file=sys.stderr)
    results = {}
    out_of_time = lambda: time_limit and time.time() - began > time_limit   # noqa: E731
    rec_file = open(records, "w", encoding="utf-8") if records else None
    try:
        for done in range(passes):
            if out_of_time():
                break
            for k, label, shards in sets:
                if out_of_time():
                    break
                key = torch_cuda.shard_key(shards, batch)
                if "skipped" in results.get(key, {}):
                    continue
                if torch_cuda.piece_bytes(shards) > max_bytes:
                    results[key] = {"skipped": "memory"}
                    continue
                try:
                    result = torch_cuda.benchmark_devices([shards], batch, device=device)[0]
                except torch.cuda.OutOfMemoryError:
                    results[key] = {"skipped": "out of GPU memory"}
                    torch.cuda.empty_cache()
                    continue
                if key in results:
                    first = results[key]
                    first["passes_ms"].append(result["total_ms"])
                    first["total_ms"] = float(np.median(first["passes_ms"]))
                    continue
                results[key] = dict(result, passes_ms=[result["total_ms"]])
                if rec_file and label != "all-tables":
                    rec = collect.make_record(shards, result, batch, 0, torch_cuda.BACKEND,
                                              source=f"{prefix}:{label}", index=k,
                                              pool_seed=0, pool_tables=856, row_scale=1, half=half,
                                              warmup=3, repeat=10)
                    rec_file.write(json.dumps(rec) + "\n")
            print(f"pass {done + 1}: {time.time() - began:.1f}s", file=sys.stderr)
    finally:
        if rec_file:
            rec_file.close()
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"seconds": time.time() - began, "passes": passes, "results": results,
                       "strategies": strategies}, f)
    print(f"measured {len(results)} of {len(sets)} device sets in {time.time() - began:.1f}s",
          file=sys.stderr)


def plan_score(plan, results, comm):
    """(max device ms, balance) of a plan from measured results; None if a device is missing."""
    n, batch = plan.task.num_devices, plan.task.batch_size
    costs = []
    for shards in plan.shards_by_device().values():
        if not shards:
            costs.append(0.0)
            continue
        result = results.get(torch_cuda.shard_key(shards, batch))
        if result is None or "total_ms" not in result:
            return None
        costs.append(result["total_ms"] + comm.step_ms(pooled_bytes(shards, batch),
                                                       n))
    top = max(costs)
    return top, (min(costs) / top if top > 0 else 1.0)


def bound(task, results, comm):
    shards = [Shard(t, "") for t in task.tables]
    result = results.get(torch_cuda.shard_key(shards, task.batch_size), {})
    if "total_ms" not in result:
        return None
    n = task.num_devices
    return (result["total_ms"] / n
            + comm.step_ms(pooled_bytes(shards, task.batch_size) / n, n))


def strategy_table(data, results, comm):
    """(table {strategy: {max_ms, balance, bound_ratio, per_task_ms}} over the tasks whose
    every plan is measured, number of those tasks, "best"'s winner per task, plans unmeasured)."""
    tasks = [Task.from_dict(t) for t in data["tasks"]]
    rows, winners, unmeasured = {}, {}, 0
    for entry in data["plans"]:
        plan = Plan.from_dict(entry["plan"])
        score = plan_score(plan, results, comm)
        if score is None:   # a device the measurement does not hold (e.g. other weights' plan)
            unmeasured += 1
            continue
        bnd = bound(tasks[entry["task"]], results, comm)
        rows.setdefault(entry["strategy"], {}).setdefault(entry["task"], []).append(
            (score[0], score[1], score[0] / bnd if bnd else None))
        if entry["strategy"] == "best":
            winners[entry["task"]] = entry.get("winner")
    complete = set.intersection(*(set(v) for v in rows.values())) if rows else set()
    table = {}
    for name, per_task in rows.items():
        # random: the mean of its seeds on each task
        vals = [np.mean(np.array(per_task[k], dtype=float), axis=0) for k in sorted(complete)]
        if not vals:
            continue
        arr = np.array(vals, dtype=float)
        table[name] = {"max_ms": float(arr[:, 0].mean()), "balance": float(arr[:, 1].mean()),
                       "bound_ratio": float(np.nanmean(arr[:, 2])) if np.isfinite(
                           arr[:, 2]).any() else None,
                       "per_task_ms": [round(float(x), 4) for x in arr[:, 0]]}
    return table, len(complete), winners, unmeasured


def pass_noise(results):
    """None for a one-pass measurement; else the relative spread of a device's passes
    ((max - min) / median: median and 90th percentile over devices) and each pass's results."""
    spreads, count = [], 0
    for r in results.values():
        ms = r.get("passes_ms", [])
        count = max(count, len(ms))
        if len(ms) > 1:
            spreads.append((max(ms) - min(ms)) / np.median(ms))
    if not spreads:
        return None
    per_pass = [{key: {"total_ms": r["passes_ms"][i]} for key, r in results.items()
                 if len(r.get("passes_ms", [])) > i} for i in range(count)]
    return {"devices": len(spreads), "median_spread": float(np.median(spreads)),
            "p90_spread": float(np.percentile(spreads, 90))}, per_pass


def report(data, measured):
    """Prints the strategies' measured max device ms and a JSON summary line; scores only the
    strategies the measurement names (its "strategies"), all of the plans' when it names none."""
    results = measured["results"]
    if measured.get("strategies"):   # a plan of another strategy can share devices with
        # measured ones on some tasks only; scored there, it would cut the tasks compared
        data = dict(data, plans=[e for e in data["plans"]
                                 if e["strategy"] in measured["strategies"]])
    comm = AllToAll()
    table, complete, winners, unmeasured = strategy_table(data, results, comm)
    heuristics = [s for s in table
                  if s not in ("learned", "best", "random", "learned-old", "best-old",
                                 "learned-rows")]
    best_h = min(heuristics, key=lambda s: table[s]["max_ms"]) if heuristics else None
    print(f"{complete} task(s) fully measured: 80 unseen full-size tables on 8 GPUs, "
          "max device ms (measured compute + modelled all-to-all)")
    print(f"{'strategy':20s} {'max ms':>9s} {'balance':>8s} {'x bound':>8s}")
    for name, row in sorted(table.items(), key=lambda kv: kv[1]["max_ms"]):
        ratio = "-" if row["bound_ratio"] is None else f"{row['bound_ratio']:.3f}"
        print(f"{name:20s} {row['max_ms']:9.3f} {row['balance']:8.3f} {ratio:>8s}")
    summary = {"tasks": complete, "unmeasured_plans": unmeasured, "best_heuristic": best_h,
               "best_winners": winners, "table": table}
    for name in ("learned", "best", "learned-old", "best-old", "learned-rows"):
        if name in table and "lookup-greedy" in table:
            row = table[name]
            summary[name] = {
                "below_lookup_greedy": 1 - row["max_ms"] / table["lookup-greedy"]["max_ms"],
                "vs_best_heuristic": row["max_ms"] / table[best_h]["max_ms"] - 1,
                "balance": row["balance"], "bound_ratio": row["bound_ratio"],
                "wins": sum(1 for k in range(len(table[name]["per_task_ms"]))
                            if table[name]["per_task_ms"][k] <= min(
                                table[h]["per_task_ms"][k] for h in heuristics))}
            ok = summary[name]
            ok["goals_met"] = bool(ok["below_lookup_greedy"] >= GOALS["below_lookup_greedy"]
                                   and ok["balance"] >= GOALS["balance"]
                                   and ok["bound_ratio"] is not None
                                   and ok["bound_ratio"] <= GOALS["bound_ratio"])
    noise = pass_noise(results)
    if noise is not None:
        spread, per_pass = noise
        summary["noise"] = dict(spread, passes=[])
        for i, one in enumerate(per_pass):
            t = strategy_table(data, one, comm)[0]
            summary["noise"]["passes"].append(
                {name: round(t[name]["max_ms"], 3) for name in
                 ("learned", "best", "learned-old", "best-old", "learned-rows",
                  "lookup-greedy", best_h)
                 if name in t})
            print(f"pass {i + 1}: " + ", ".join(
                f"{k} {v:.3f}" for k, v in summary["noise"]["passes"][-1].items()))
    print(json.dumps({k: v for k, v in summary.items() if k != "table"}))
    return summary


def _read_json(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="step")
    p = sub.add_parser("plans")
    p.add_argument("--out", required=True)
    p.add_argument("--tasks", type=int, default=10)
    p.add_argument("--weights", default=None, help="directory of *_gpu.npz (default shipped)")
    p.add_argument("--old-weights", default=None,
                   help="also plan learned-old / best-old with these weights")
    p.add_argument("--task-seed", type=int, default=TASK_SEED, help="draws the unseen tasks")
    p.add_argument("--wide-dim", type=int, default=None,
                   help="widen each task's two hottest tables to this dim (column splits)")
    p.add_argument("--half", choices=("test", "train"), default="test",
                   help="the pool half the tasks' tables come from (train: cost-model records)")
    m = sub.add_parser("measure")
    m.add_argument("--plans", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--records", default=None)
    m.add_argument("--time-limit", type=float, default=None)
    m.add_argument("--device", default="0", help="CUDA ordinal, or cpu (a dry run)")
    m.add_argument("--passes", type=int, default=1, help="measure every device this often")
    m.add_argument("--strategies", default=None,
                   help="comma-separated: measure only these strategies' devices")
    m.add_argument("--no-bound", action="store_true", help="skip the all-tables sets")
    r = sub.add_parser("report")
    r.add_argument("--plans", default=None, help="default: make the 10 tasks' plans again")
    r.add_argument("--measured", default=None,
                   help="default: the shipped measurement of --task-seed's plans")
    r.add_argument("--task-seed", type=int, default=TASK_SEED,
                   help="with no --plans: the tasks to plan again (7 or 11 are shipped)")
    r.add_argument("--wide-dim", type=int, default=None,
                   help="with no --plans: the widened tasks (shipped: 512 and 256 of seed 13, "
                   "384 of seed 17)")
    args = parser.parse_args(argv)
    if args.step is None:
        args = parser.parse_args(["report"])
    if args.step == "plans":
        data = make_plans(args.tasks, args.weights, args.old_weights, args.task_seed,
                          args.wide_dim, args.half)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(data, f)
        print(f"wrote {len(data['plans'])} plans of {len(data['tasks'])} tasks to {args.out}")
    elif args.step == "measure":
        with open(args.plans, encoding="utf-8") as f:
            data = json.load(f)
        measure(data, args.out, args.records, args.time_limit,
                device=int(args.device) if args.device.isdigit() else args.device,
                passes=args.passes,
                strategies=args.strategies.split(",") if args.strategies else None,
                bound_sets=not args.no_bound)
    else:
        num_tasks, measured = 10, SHIPPED_MEASUREMENTS.get(args.task_seed)
        if args.wide_dim:
            shipped = SHIPPED_WIDE.get((args.task_seed, args.wide_dim))
            num_tasks, measured = (None, None) if shipped is None else (
                shipped[1], os.path.join(RESULTS, shipped[0]))
        measured = args.measured or measured
        if measured is None:
            parser.error(f"no shipped measurement for --task-seed {args.task_seed} --wide-dim "
                         f"{args.wide_dim}; pass --measured (shipped: "
                         f"{sorted(SHIPPED_MEASUREMENTS)}, wide {sorted(SHIPPED_WIDE)})")
        measured = _read_json(measured)
        strategies = measured.get("strategies")
        data = (_read_json(args.plans) if args.plans else
                make_plans(num_tasks, task_seed=args.task_seed, wide_dim=args.wide_dim,
                           strategies=strategies))
        report(data, measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
