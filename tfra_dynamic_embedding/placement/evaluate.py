"""Scoring plans for reports: balance, lower bound, speedup over random, strategy tables, plots.

Reads plans and estimators (estimators.py); no stage of the planner imports this module.
Metrics of a plan: max device cost (the step time: devices work in parallel), degree of
balance (min / max device cost, 1 = perfect), speedup over random placement (mean max cost of
several random plans / this max cost), and for additive estimators the lower bound
max(largest piece, total / devices) and the gap to it (max cost / bound - 1).

`plot_plan(plan, report, "plan.png")` and `plot_comparison(rows, "strategies.png")` draw them.

Example:
    >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
    >>> task = Task([TableSpec(f"t{i}", rows=1000, dim=16 * (i + 1), pooling_factor=1 + i)
    ...              for i in range(4)], make_devices(2), batch_size=1024)
    >>> report = evaluate_plan(proposers.propose(task, "lookup-greedy"), "analytic")
    >>> round(report.balance, 3), f"{report.gap:.1%}"
    (0.964, '1.8%')
    >>> rows, plans = compare_strategies(task, ["random", "size-greedy", "lookup-greedy"])
    >>> print(format_rows(rows))
    strategy       max cost (ms)  balance  speedup vs random  gap to bound  failed
    random                 0.050    0.552             1.086x         40.0%     0/1
    size-greedy            0.040    0.803             1.262x         10.9%     0/1
    lookup-greedy          0.037    0.964             1.375x          1.8%     0/1
"""

import dataclasses
import math

import numpy as np
from absl import logging

from tfra_dynamic_embedding.placement import pieces, proposers
from tfra_dynamic_embedding.placement.estimators import get_estimator
from tfra_dynamic_embedding.placement.types import PlacementError, Shard


# -- metrics -------------------------------------------------------------------------------------
@dataclasses.dataclass
class PlanReport:
    """Scores of one plan (or, for 'random', the mean of several random plans)."""

    strategy: str
    estimator: str
    device_costs: dict
    max_cost: float
    balance: float
    memory: dict
    shard_costs: dict = dataclasses.field(default_factory=dict)
    lower_bound: float = None
    gap: float = None
    speedup_over_random: float = None
    error: str = None

    def to_dict(self):
        return dataclasses.asdict(self)


def balance(costs):
    """Degree of balance min / max of device costs (1.0 when all equal or all zero)."""
    values = list(costs.values()) if isinstance(costs, dict) else list(costs)
    top = max(values)
    return 1.0 if top <= 0 else float(min(values) / top)


def lower_bound(task, estimator):
    """max(cost of the largest unavoidable piece, total cost / devices), additive estimators only.

    A table's unavoidable piece is the table itself, or its largest row slice when it fits no
    device whole, or, when it may be cut by columns (`pieces.column_splits`), the largest block
    of its cheapest split. It bounds plans that split only the tables they must or by columns
    (the "learned" strategy also cuts hot tables by rows and can go below it); None for
    non-additive estimators.
    """
    est = get_estimator(estimator)
    if not est.additive:
        return None
    total, largest, memory = 0.0, 0.0, pieces.largest_memory(task)
    for table in task.tables:
        n = pieces.min_slices(table, task, memory)
        total += est.shard_cost(Shard(table, "", 0, 1), task)
        piece = est.shard_cost(Shard(table, "", 0, n), task)
        for blocks in pieces.column_splits(table, task, memory):
            piece = min(piece, max(est.shard_cost(block, task)
                                   for block in pieces.column_pieces(table, blocks)))
        largest = max(largest, piece)
    return max(largest, total / task.num_devices)


def random_baseline(task, estimator="analytic", num_random=10, seed=0):
    """Mean max device cost of `num_random` random plans (seeds seed, seed+1, ...)."""
    est = get_estimator(estimator)
    costs = [max(est.plan_costs(proposers.propose(task, "random", seed + k)).values())
             for k in range(num_random)]
    return float(np.mean(costs))


def evaluate_plan(plan, estimator="analytic", num_random=10, seed=0, random_cost=None,
                  record=True):
    """A PlanReport of `plan`; with `record`, also stores the costs in `plan.per_device`
    (`measured_cost` for measured estimators, `predicted_cost` otherwise).

    `random_cost` (the mean max cost of random plans) is computed from `num_random` random
    plans unless given; num_random=0 skips the speedup.
    """
    est = get_estimator(estimator)
    plan.validate(check_memory=False)
    costs = est.plan_costs(plan)
    shard_costs = {}
    if est.additive:
        for shard in plan.shards():
            label = shard.table.name if shard.num_slices == 1 else (
                f"{shard.table.name}#{shard.index}")
            shard_costs.setdefault(shard.device, {})[label] = est.shard_cost(shard, plan.task)
    top = max(costs.values())
    bound = lower_bound(plan.task, est)
    if random_cost is None and num_random:
        random_cost = random_baseline(plan.task, est, num_random, seed)
    if record:
        for name, cost in costs.items():
            slot = plan.per_device[name]
            if est.measured:
                slot.measured_cost = cost
            else:
                slot.predicted_cost = cost
        if not est.measured:
            plan.estimator = est.name
    return PlanReport(
        strategy=plan.strategy, estimator=est.name, device_costs=costs, max_cost=top,
        balance=balance(costs), memory=plan.memory_by_device(), shard_costs=shard_costs,
        lower_bound=bound, gap=(top / bound - 1.0) if bound else None,
        speedup_over_random=(random_cost / top) if random_cost and top > 0 else None)


def compare_strategies(tasks, strategies="all", estimator="analytic", num_random=10, seed=0):
    """Scores strategies on one task or a list of tasks.

    Returns (rows, plans): rows are dicts per strategy with metrics averaged over tasks
    (max_cost, balance, speedup_over_random, gap, lower_bound, failures); plans maps
    strategy -> the plan of the first task. 'random' reports the mean of `num_random` plans.
    """
    tasks = tasks if isinstance(tasks, (list, tuple)) else [tasks]
    if strategies == "all" or strategies == ["all"]:
        strategies = proposers.list_strategies()
    est = get_estimator(estimator)
    per_strategy = {name: [] for name in strategies}
    plans, failures = {}, {name: [] for name in strategies}
    for k, task in enumerate(tasks):
        try:
            rand = random_baseline(task, est, num_random, seed) if num_random else None
        except PlacementError as error:  # random fails only where memory is tight
            logging.warning("no random baseline for task %d: %s", k, error)
            rand = None
        for name in strategies:
            try:
                if name == "random" and rand is not None:
                    samples = [evaluate_plan(proposers.propose(task, "random", seed + j), est,
                                             random_cost=rand, record=False)
                               for j in range(num_random)]
                    report = _mean_report(samples)
                    plan = proposers.propose(task, "random", seed)
                else:
                    plan = proposers.propose(task, name, seed, est)
                    report = evaluate_plan(plan, est, random_cost=rand, num_random=0)
            except PlacementError as error:
                logging.warning("strategy %s failed on task %d: %s", name, k, error)
                failures[name].append(str(error))
                continue
            per_strategy[name].append(report)
            plans.setdefault(name, plan)
    rows = []
    for name in strategies:
        reports = per_strategy[name]
        row = {"strategy": name, "tasks": len(reports), "failures": len(failures[name])}
        for key in ("max_cost", "balance", "speedup_over_random", "gap", "lower_bound"):
            values = [getattr(r, key) for r in reports if getattr(r, key) is not None]
            row[key] = float(np.mean(values)) if values else None
        if failures[name]:
            row["error"] = failures[name][0]
        rows.append(row)
    return rows, plans


def _mean_report(reports):
    first = reports[0]
    mean = lambda key: float(np.mean([getattr(r, key) for r in reports]))  # noqa: E731
    return dataclasses.replace(
        first, max_cost=mean("max_cost"), balance=mean("balance"),
        speedup_over_random=mean("speedup_over_random") if first.speedup_over_random else None,
        gap=mean("gap") if first.gap is not None else None)


def format_rows(rows, unit="ms", scale=1e3):
    """A plain-text table of `compare_strategies` rows."""
    header = ["strategy", f"max cost ({unit})", "balance", "speedup vs random",
              "gap to bound", "failed"]
    lines = [header]
    fmt = lambda x, f: "-" if x is None else f.format(x)  # noqa: E731
    for row in rows:
        lines.append([row["strategy"], fmt(row["max_cost"] and row["max_cost"] * scale, "{:.3f}"),
                      fmt(row["balance"], "{:.3f}"), fmt(row["speedup_over_random"], "{:.3f}x"),
                      fmt(row["gap"], "{:.1%}"), f"{row['failures']}/{row['failures'] + row['tasks']}"])
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                               for i, (c, w) in enumerate(zip(line, widths))) for line in lines)


# -- plots ---------------------------------------------------------------------------------------
def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (plots are written, never shown)."""
    try:
        import matplotlib  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise ImportError("plots need matplotlib: pip install matplotlib") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    return plt


def plot_plan(plan, report, path, unit="ms", scale=1e3):
    """PNG of per-device stacked cost bars (one segment per shard; whole bars when the
    estimator is not additive), the lower bound dashed, memory use in the tick labels."""
    plt = pyplot()
    devices = [d.name for d in plan.task.devices]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(devices) + 2), 4.5))
    cmap = plt.get_cmap("tab20")
    for x, device in enumerate(devices):
        segments = report.shard_costs.get(device) if report.shard_costs else None
        if not segments:
            segments = {"": report.device_costs[device]}
        bottom = 0.0
        for k, (label, cost) in enumerate(sorted(segments.items(), key=lambda kv: -kv[1])):
            ax.bar(x, cost * scale, bottom=bottom, color=cmap(k % 20), edgecolor="white",
                   linewidth=0.5)
            if cost * scale > 0.06 * report.max_cost * scale and label:
                ax.text(x, bottom + cost * scale / 2, label, ha="center", va="center", fontsize=6)
            bottom += cost * scale
    if report.lower_bound:
        ax.axhline(report.lower_bound * scale, color="black", linestyle="--", linewidth=1,
                   label=f"lower bound {report.lower_bound * scale:.3g} {unit}")
        ax.legend(loc="upper right", fontsize=8)
    mem = plan.memory_by_device()
    ax.set_xticks(range(len(devices)))
    ax.set_xticklabels([f"{d}\n{mem[d] / 2 ** 30:.1f} GiB" for d in devices], fontsize=7,
                       rotation=30 if len(devices) > 6 else 0)
    ax.set_ylabel(f"cost per step ({unit}, {report.estimator})")
    title = f"{plan.strategy or 'plan'}: max {report.max_cost * scale:.3g} {unit}, " \
            f"balance {report.balance:.2f}"
    if report.speedup_over_random:
        title += f", {report.speedup_over_random:.2f}x vs random"
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_comparison(rows, path, unit="ms", scale=1e3, title="strategies"):
    """PNG comparing strategies: mean max device cost (with the mean lower bound) and speedup
    over random placement."""
    plt = pyplot()
    rows = [r for r in rows if r["max_cost"] is not None]
    if not rows:
        raise ValueError("no strategy produced a plan; nothing to plot")
    names = [r["strategy"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8.0, 1.2 * len(names) + 3), 4.5))
    x = np.arange(len(names))
    ax1.bar(x, [r["max_cost"] * scale for r in rows], color="tab:blue")
    bounds = [r["lower_bound"] for r in rows if r["lower_bound"]]
    if bounds:
        ax1.axhline(np.mean(bounds) * scale, color="black", linestyle="--", linewidth=1,
                    label="lower bound")
        ax1.legend(fontsize=8)
    ax1.set_ylabel(f"max device cost ({unit})")
    speed = [r["speedup_over_random"] or 0.0 for r in rows]
    ax2.bar(x, speed, color="tab:green")
    ax2.axhline(1.0, color="black", linewidth=0.8)
    ax2.set_ylabel("speedup over random (x)")
    for ax in (ax1, ax2):
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def summary(rows):
    """The best strategy by mean max cost, for logs: ('lookup-greedy', 1.23e-3)."""
    ok = [r for r in rows if r["max_cost"] is not None]
    if not ok:
        return None, math.nan
    best = min(ok, key=lambda r: r["max_cost"])
    return best["strategy"], best["max_cost"]
