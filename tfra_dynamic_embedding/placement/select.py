"""The default proposer: every strategy proposes, one estimator scores, the cheapest plan wins.

A learned policy is only as good as the tasks its weights saw, and each heuristic wins on some
tasks and loses on others; scoring all of them with the estimator in use and keeping the best
means the default never loses to any of them (by that estimator). `learned_out_of_range` says
when a task's tables lie outside the training range of the learned proposer's cost model; when
their shapes lie far outside it (`default_judge`), the default scores with the analytic
estimator instead: the learned one extrapolates there (it predicted GPUs holding tables wider
than any it saw well below their measured cost; docs/learned_placement.md).

An estimate can rank two close plans the wrong way round. `verify=` re-scores the `verify_top`
cheapest distinct plans with a second estimator, e.g. "measured-cpu" (benchmarks: ground truth,
at the price of measuring those plans together), and the cheapest by it wins.

Example:
    choice = best_plan(task)       # scored by default_estimator(task): the learned cost model
    choice.plan.strategy           # e.g. 'learned'
    choice.margin                  # the runner-up's max cost / the winner's - 1
    for c in choice.candidates: print(c.strategy, c.max_cost, c.error)
    best_plan(task, "learned", verify="measured-cpu", verify_top=3)
"""

import dataclasses
import os
from typing import List, Optional

import numpy as np

from tfra_dynamic_embedding.placement import cost_model as cm
from tfra_dynamic_embedding.placement import estimators, features, proposers

# Proposers skipped by default: random is a baseline, not a proposal.
SKIPPED = ("random",)
# A feature farther than this share of its training range's width outside that range is
# outside what the cost model's weights saw (`CostModel.outside`'s margin).
OUT_OF_RANGE_MARGIN = 0.1
# Weights without a stored training range: a feature this many training standard deviations
# from its training mean is outside what they saw.
OUT_OF_RANGE_SIGMAS = 4.0
# A table whose shape lies this many training-range widths beyond the (widened) range is too far
# for the learned cost model's scores to pick among plans (`default_judge`).
EXTRAPOLATION_LIMIT = 0.5
# The features that say a table's shape (`features.FEATURE_NAMES`), unbounded unlike the reuse
# shares.
SHAPE_FEATURES = ("dim", "hash_size", "pooling_factor", "size_gb")


@dataclasses.dataclass
class Candidate:
    """One strategy's proposal: its estimated max device cost, or the error that stopped it."""

    strategy: str
    max_cost: Optional[float] = None
    error: Optional[str] = None
    verified_cost: Optional[float] = None   # max device cost by the `verify` estimator


@dataclasses.dataclass
class Choice:
    """The winning plan, every candidate (cheapest first, failures last) and the margin."""

    plan: object
    candidates: List[Candidate]
    estimator: str
    verified_by: Optional[str] = None   # the `verify` estimator's name, if one re-scored

    @property
    def margin(self):
        """The runner-up's max cost over the winner's, minus 1 (None with one candidate); by
        the verified costs when there were several."""
        costs = [c.verified_cost for c in self.candidates if c.verified_cost is not None]
        if len(costs) < 2:
            costs = [c.max_cost for c in self.candidates if c.max_cost is not None]
        return costs[1] / costs[0] - 1.0 if len(costs) > 1 and costs[0] > 0 else None


def best_plan(task, estimator=None, seed=0, strategies=None, verify=None, verify_top=3,
              judge=None, weights=None):
    """Proposes `task` with every registered strategy but random (or `strategies`), scores
    each plan's max device cost with `judge`, returns a `Choice` holding the cheapest plan.

    estimator: what the proposers use (cost-greedy, column-greedy); None:
    `default_estimator(task)`. judge: what scores the candidates; None: `estimator` when one
    was given, else `default_judge(task, ...)` (the default's own rule). weights: the
    directory of trained weights the learned proposer (and the default estimator and judge)
    use; None: the shipped ones.

    verify: None, or an estimator (name or instance) that re-scores the `verify_top` cheapest
    distinct plans (strategies that proposed the same placement count once); the cheapest by it
    wins and leads `candidates`, the rest follow by `estimator`'s costs. An estimator with
    `measure_plans` (the measured ones) measures those plans together, so they share the
    machine's drift.
    """
    if verify is not None and int(verify_top) < 1:
        raise ValueError(f"verify_top must be >= 1; got {verify_top!r}")
    est = estimators.get_estimator(default_estimator(task, weights) if estimator is None
                                   else estimator)
    if judge is None:
        judge = est if estimator is not None else default_judge(task, est, weights)
    judge = estimators.get_estimator(judge)
    names = list(strategies) if strategies else [
        s for s in proposers.list_strategies() if s not in SKIPPED]
    unknown = [s for s in names if s not in proposers.list_strategies()]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; choose from "
                         f"{proposers.list_strategies()}")
    plans, candidates = {}, []
    for name in names:
        try:
            plan = proposers.propose(task, name, seed=seed, estimator=est, weights=weights)
        except (ValueError, RuntimeError) as error:   # e.g. PlacementError: tables do not fit
            candidates.append(Candidate(name, error=f"{type(error).__name__}: {error}"))
            continue
        plans[name] = plan
        candidates.append(Candidate(name, max_cost=max(judge.plan_costs(plan).values())))
    scored = sorted((c for c in candidates if c.max_cost is not None),
                    key=lambda c: (c.max_cost, names.index(c.strategy)))
    if not scored:
        first = candidates[0]
        raise ValueError(f"no strategy could place the task: {first.strategy}: {first.error} "
                         f"(and {len(candidates) - 1} other strategies failed too)")
    failed = [c for c in candidates if c.max_cost is None]
    if verify is None:
        return Choice(plans[scored[0].strategy], scored + failed, judge.name)
    checker = estimators.get_estimator(verify)
    top, seen = [], set()
    for candidate in scored:
        placement = _placement_key(plans[candidate.strategy])
        if placement not in seen and len(top) < int(verify_top):
            seen.add(placement)
            top.append(candidate)
    if hasattr(checker, "measure_plans"):
        checker.measure_plans([plans[c.strategy] for c in top])
    for candidate in top:
        candidate.verified_cost = max(checker.plan_costs(plans[candidate.strategy]).values())
    top.sort(key=lambda c: (c.verified_cost, names.index(c.strategy)))
    rest = [c for c in scored if c.verified_cost is None]
    return Choice(plans[top[0].strategy], top + rest + failed, judge.name, checker.name)


def _placement_key(plan):
    """Hashable placement of a plan: which device holds which shard, and the column splits."""
    return (tuple(sorted((table, tuple(devices)) for table, devices in plan.assignment.items())),
            tuple(sorted((table, tuple(widths)) for table, widths in plan.columns.items())))


def default_estimator(task, weights_dir=None):
    """The estimator `tfra-de plan` and `best_plan` score with unless told: the learned cost
    model of the task's profile (`learned_cost_model`) when `weights_dir` (None: the shipped
    data) has one, else "analytic".

    Why learned: the analytic estimator counts bytes and ranks lookup-greedy first, whose
    plans measured well above the learned default's on filled CPU shards and on GPU kernels
    (docs/learned_placement.md); the cost models are trained on those measurements.

    Example: default_estimator(task).name   # "learned"
    """
    path = cm.weights_file("cost_model", cm.profile_of(task), weights_dir)
    if os.path.exists(path):
        return estimators.get_estimator("learned", weights=weights_dir)
    return "analytic"


def default_judge(task, estimator, weights_dir=None, limit=EXTRAPOLATION_LIMIT):
    """The estimator that scores the default's candidates: `estimator`, except a learned one
    on a task with a table whose shape (`SHAPE_FEATURES`: dim, rows, pooling, size) lies more
    than `limit` training-range widths beyond the (widened) range its weights saw -- or, for
    weights without a stored range, more than `OUT_OF_RANGE_SIGMAS` from the training mean
    -- which gives "analytic". Reuse shares are bounded in [0, 1], so the learned model's
    error there is bounded too; shapes are not. The learned proposer's plan stays a candidate.

    Example: default_judge(task, default_estimator(task)).name   # "learned" on seen shapes
    """
    est = estimators.get_estimator(estimator)
    if est.name != "learned" or not task.tables:
        return est
    model = learned_cost_model(weights_dir, task)
    x = np.stack([cm.shard_features(table, 1.0, model.scales, task.batch_size)
                  for table in task.tables])
    shape = np.isin(features.FEATURE_NAMES, SHAPE_FEATURES)
    if model.has_range:
        lo, hi = (np.asarray(model.meta[k], float) for k in ("x_min", "x_max"))
        middle = (lo + hi) / 2   # stands in for the reuse shares: only shapes count here
        _, distance = model.range_distance(np.where(shape, x, middle), OUT_OF_RANGE_MARGIN)
        far = distance > limit
    else:
        z = (x - model.params["x_mean"]) / model.params["x_std"]
        far = np.abs(z[:, shape]).max(axis=1) > OUT_OF_RANGE_SIGMAS
    return estimators.get_estimator("analytic") if far.any() else est


def default_verifier(task):
    """The measuring estimator `tfra-de plan --verify-top` uses unless told: "measured-gpu"
    for a task on GPUs, "measured-cpu" otherwise."""
    return "measured-gpu" if cm.profile_of(task) in cm.GPU_PROFILES else "measured-cpu"


def learned_cost_model(weights_dir=None, task=None):
    """The learned proposer's cost model for `task` (cached): cost_model_{profile}.npz of the
    task's profile (`cm.profile_of`; None: cpu) in `weights_dir` or the shipped data, the cpu
    file where the gpu one is missing.

    Example: learned_cost_model(None, gpu_task).meta.get("profile")   # "gpu" once shipped
    """
    return cm.load_cost_model(cm.weights_file("cost_model", cm.profile_of(task), weights_dir))


def learned_out_of_range(task, weights_dir=None, sigmas=OUT_OF_RANGE_SIGMAS,
                         margin=OUT_OF_RANGE_MARGIN):
    """Tables of `task` with a cost-model feature outside the training range the weights store
    (`meta["x_min"]`, `meta["x_max"]`) widened by `margin` of its width on each side, as
    `CostModel.outside` flags them: [(table name, feature index, distance)], worst first, where
    distance > 0 is how far beyond the widened range the feature lies, in widths of the range
    (inf for a feature that was constant in training). Non-empty means the learned proposer
    plans outside what its weights saw.

    Weights without a stored range fall back to z-scores: features more than `sigmas` training
    standard deviations from the training mean, with distance the (signed) z-score
    (`learned_cost_model(weights_dir, task).has_range` tells which). The weights are those of
    the task's profile (`learned_cost_model`).
    """
    model = learned_cost_model(weights_dir, task)
    if not task.tables:
        return []
    x = np.stack([cm.shard_features(table, 1.0, model.scales, task.batch_size)
                  for table in task.tables])
    if model.has_range:
        worst, dist = model.range_distance(x, margin)
        out = [(table.name, int(j), float(d))
               for table, j, d in zip(task.tables, worst, dist) if d > 0]
    else:
        z = (x - model.params["x_mean"]) / model.params["x_std"]
        worst = np.argmax(np.abs(z), axis=1)
        out = [(table.name, int(j), float(row[j]))
               for table, j, row in zip(task.tables, worst, z) if abs(row[j]) > sigmas]
    return sorted(out, key=lambda item: -abs(item[2]))


__all__ = ["Candidate", "Choice", "best_plan", "default_judge", "learned_cost_model",
           "learned_out_of_range"]
