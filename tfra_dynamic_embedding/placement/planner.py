"""The planner: every proposer proposes, one estimator judges, the cheapest plan wins.

`Planner(estimator, proposers, judge, weights).plan(task)` is the one place that plans; its
stages have the interfaces of `types.py` (Estimator, Proposer, Judge). A learned policy is only
as good as the tasks its weights saw, and each heuristic wins on some tasks and loses on others;
scoring all of them with one estimator and keeping the best means the default never loses to
any of them (by that estimator).

The defaults: the learned cost model of the task's profile proposes and judges
(`default_estimator`), except where a table's shape lies far outside what its weights saw: then
the analytic estimator judges (`default_judge`; the learned one extrapolates there, predicting
GPUs holding tables wider than any it saw well below their measured cost, see
docs/learned_placement.md). An estimate can rank two close plans the wrong way round, so
`verify_top=K` re-scores the K cheapest distinct plans with a measuring estimator
(`default_verifier`) and the cheapest measured one wins.

Planning with trained weights (`tfra-de train-planner --out`) and measured verification,
`Planner(weights="my_weights/", verify_top=3)`: docs/placement.md, "The planner".

Example:
    >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
    >>> task = Task([TableSpec("user", 1000, 16), TableSpec("item", 1000, 16, pooling_factor=4.0),
    ...              TableSpec("ad", 100, 32)], make_devices(2), batch_size=256)
    >>> choice = Planner().plan(task)           # what `tfra-de plan` does
    >>> choice.estimator, choice.plan.strategy == choice.candidates[0].strategy
    ('learned', True)
    >>> choice.margin >= 0                      # the runner-up's max cost / the winner's - 1
    True
    >>> [c.strategy for c in choice.candidates if c.error]    # every strategy proposed a plan
    []
    >>> Planner("analytic", ["lookup-greedy", "cost-greedy"]).plan(task).plan.strategy
    'lookup-greedy'
"""

import dataclasses
import math
import os
from typing import List, Optional

import numpy as np

from tfra_dynamic_embedding.placement import cost_model as cm
from tfra_dynamic_embedding.placement import estimators, features
from tfra_dynamic_embedding.placement import proposers as proposers_lib

# Proposers skipped by default: random is a baseline, not a proposal.
SKIPPED = ("random",)
# The proposer whose weights the planner's notes describe.
LEARNED = "learned"
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
    verified_cost: Optional[float] = None   # max device cost by the verifier


@dataclasses.dataclass
class Choice:
    """The winning plan, every candidate (cheapest first, failures last) and the margin.

    `estimator` names the judge, the estimator that scored the candidates (`judge`; a report
    of the plan should score it the same way); `notes`: what a person should know about how it
    was planned, one line each (`tfra-de plan` prints them).
    """

    plan: object
    candidates: List[Candidate]
    estimator: str
    verified_by: Optional[str] = None   # the verifier's name, if one re-scored
    judge: object = None
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def margin(self):
        """The runner-up's max cost over the winner's, minus 1 (None with one candidate); by
        the verified costs when there were several."""
        costs = [c.verified_cost for c in self.candidates if c.verified_cost is not None]
        if len(costs) < 2:
            costs = [c.max_cost for c in self.candidates if c.max_cost is not None]
        return costs[1] / costs[0] - 1.0 if len(costs) > 1 and costs[0] > 0 else None


class Planner:
    """Plans tasks: every proposer proposes, the judge scores each plan's max device cost, the
    cheapest wins (ties: the proposer listed first).

    estimator: what the proposers use (cost-greedy, column-greedy); a name or an Estimator, or
      None: `default_estimator` of each task.
    proposers: strategy names (`proposers.list_strategies()`) or Proposers; None: every strategy
      registered when the planner is built, but random. With one there is nothing to choose:
      its plan is returned as proposed (its error raised), scored by `estimator`.
    judge: what scores the candidates: an estimator (name or instance), a `types.Judge`, or
      None: `estimator` when one was given, else the `default_judge` rule.
    weights: a directory of trained weights (`tfra-de train-planner --out`) for the learned
      proposer and the default estimator and judge; None: the shipped ones.
    verifier, verify_top: re-score the `verify_top` cheapest distinct plans (strategies that
      proposed the same placement count once) with `verifier` (an estimator; None:
      `default_verifier` of each task); the cheapest by it wins and leads the candidates, the
      rest follow by the judge's costs. A verifier with `measure_plans` (the measured ones)
      measures those plans together, so they share the machine's drift. verify_top None: 3
      with a verifier, else 0 (off).

    `Planner(verifier="measured-cpu")` measures the 3 cheapest plans (seconds to minutes of
    TensorFlow benchmarks): docs/placement.md, "The planner".

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> task = Task([TableSpec("a", 1000, 16), TableSpec("b", 1000, 64)], make_devices(2))
        >>> plan = Planner().plan(task).plan             # the default of `tfra-de plan`
        >>> sorted(plan.assignment)
        ['a', 'b']
        >>> Planner(proposers=["size-greedy"]).plan(task).plan.assignment   # one: as proposed
        {'a': ['/job:ps/task:1'], 'b': ['/job:ps/task:0']}
    """

    def __init__(self, estimator=None, proposers=None, judge=None, weights=None, verifier=None,
                 verify_top=None):
        self.weights = cm.check_weights_dir(weights)
        self.estimator = estimator
        self.judge = judge
        self.verifier = verifier
        if verify_top is None:
            verify_top = 3 if verifier is not None else 0
        self.verify_top = int(verify_top)
        if self.verify_top < (1 if verifier is not None else 0):
            raise ValueError(f"verify_top must be >= {1 if verifier is not None else 0}; "
                             f"got {verify_top!r}")
        if proposers is None:
            proposers = [s for s in proposers_lib.list_strategies() if s not in SKIPPED]
        proposers = list(proposers)
        unknown = [p for p in proposers if isinstance(p, str)
                   and p not in proposers_lib.list_strategies()]
        if unknown:
            raise ValueError(f"unknown strategies {unknown}; choose from "
                             f"{proposers_lib.list_strategies()}")
        if not proposers:
            raise ValueError("a Planner needs at least one proposer; got none")
        # (name, proposer) pairs; a named learned one is bound to the planner's weights
        self.proposers = [(p, proposers_lib.get_strategy(p, self.weights)) if isinstance(p, str)
                          else (_proposer_name(p), p) for p in proposers]
        names = [name for name, _ in self.proposers]
        if len(set(names)) != len(names):
            raise ValueError(f"proposers must have distinct names; got {names}")

    def plan(self, task, seed=0):
        """A `Choice` for `task`: the cheapest plan by the judge, every candidate, the notes.
        ValueError when no proposer could place the task (with one proposer: its own error,
        e.g. PlacementError)."""
        names = [name for name, _ in self.proposers]
        est = estimators.get_estimator(default_estimator(task, self.weights)
                                       if self.estimator is None else self.estimator)
        notes = self._learned_notes(task) if LEARNED in names else []
        judge = self._judge(task, est, notes)
        plans, candidates = {}, []
        for name, proposer in self.proposers:
            try:
                plan = proposer(task, seed=seed, estimator=est)
                plan.validate()
            except (ValueError, RuntimeError) as error:   # e.g. PlacementError: no room
                if len(self.proposers) == 1:
                    raise
                candidates.append(Candidate(name, error=f"{type(error).__name__}: {error}"))
                continue
            plans[name] = plan
            candidates.append(Candidate(name, max_cost=max(judge.plan_costs(plan).values())))
        scored = sorted((c for c in candidates if c.max_cost is not None),
                        key=lambda c: (c.max_cost, names.index(c.strategy)))
        if not scored:
            first = candidates[0]
            raise ValueError(f"no strategy could place the task: {first.strategy}: "
                             f"{first.error} (and {len(candidates) - 1} other strategies failed "
                             f"too)")
        failed = [c for c in candidates if c.max_cost is None]
        if not self.verify_top:
            return Choice(plans[scored[0].strategy], scored + failed, judge.name, judge=judge,
                          notes=notes)
        checker = estimators.get_estimator(default_verifier(task) if self.verifier is None
                                           else self.verifier)
        top = self._verify(checker, plans, scored, names)
        rest = [c for c in scored if c.verified_cost is None]
        return Choice(plans[top[0].strategy], top + rest + failed, judge.name, checker.name,
                      judge=judge, notes=notes)

    def _judge(self, task, est, notes):
        """The estimator that scores `task`'s candidates (`est` for a lone proposer: nothing
        to choose); says so in `notes` when the default rule turned from a learned `est`."""
        if len(self.proposers) == 1:
            return est
        judge = self.judge
        if judge is None:
            judge = est if self.estimator is not None else default_judge
        rule = None
        if not isinstance(judge, (str, estimators.CostEstimator)) and callable(judge):
            rule, judge = judge, judge(task, est, self.weights)
        judge = estimators.get_estimator(judge)
        if rule is default_judge and judge is not est:
            notes.append(f"note: tables lie more than {EXTRAPOLATION_LIMIT} training ranges "
                         f"beyond what the learned cost model saw, so the {judge.name} "
                         f"estimator scores the candidates (pass --estimator to choose)")
        return judge

    def _verify(self, checker, plans, scored, names):
        """The `verify_top` cheapest distinct candidates of `scored`, each with its cost by
        `checker` (measured together when it can), cheapest first."""
        top, seen = [], set()
        for candidate in scored:
            placement = _placement_key(plans[candidate.strategy])
            if placement not in seen and len(top) < self.verify_top:
                seen.add(placement)
                top.append(candidate)
        if hasattr(checker, "measure_plans"):   # one interleaved run: they share its drift
            checker.measure_plans([plans[c.strategy] for c in top])
        for candidate in top:
            candidate.verified_cost = max(checker.plan_costs(plans[candidate.strategy]).values())
        return sorted(top, key=lambda c: (c.verified_cost, names.index(c.strategy)))

    def _learned_notes(self, task):
        """Which learned weights plan `task`, and the tables they never saw."""
        from tfra_dynamic_embedding.placement import policy  # pylint: disable=import-outside-toplevel
        policy_file = policy.weights_files(task, self.weights)[1]
        notes = [f"learned weights: {cm.profile_of(task)} profile "
                 f"({os.path.basename(policy_file)})"]
        outside = learned_out_of_range(task, self.weights)
        if outside:
            notes.append(f"note: {len(outside)} of {len(task.tables)} tables lie outside what "
                         f"the learned cost model was trained on (worst: "
                         f"{out_of_range_text(outside[0], self.weights, task)}); its "
                         f"predictions there are extrapolations")
        return notes


def _proposer_name(proposer):
    return (getattr(proposer, "strategy_name", None) or getattr(proposer, "__name__", None)
            or type(proposer).__name__)


def _placement_key(plan):
    """Hashable placement of a plan: which device holds which shard, and the column splits."""
    return (tuple(sorted((table, tuple(devices)) for table, devices in plan.assignment.items())),
            tuple(sorted((table, tuple(widths)) for table, widths in plan.columns.items())))


# -- the default stages ----------------------------------------------------------------------------
def default_estimator(task, weights_dir=None):
    """The estimator a `Planner` proposes and scores with unless told: the learned cost model
    of the task's profile (`learned_cost_model`) when `weights_dir` (None: the shipped data)
    has one, else "analytic".

    Why learned: the analytic estimator counts bytes and ranks lookup-greedy first, whose
    plans measured well above the learned default's on filled CPU shards and on GPU kernels
    (docs/learned_placement.md); the cost models are trained on those measurements.

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> default_estimator(Task([TableSpec("a", 1000, 16)], make_devices(2))).name
        'learned'
    """
    path = cm.weights_file("cost_model", cm.profile_of(task), weights_dir)
    if os.path.exists(path):
        return estimators.get_estimator("learned", weights=weights_dir)
    return "analytic"


def default_judge(task, estimator, weights_dir=None, limit=EXTRAPOLATION_LIMIT):
    """The default `types.Judge`: `estimator`, except a learned one on a task with a table
    whose shape (`SHAPE_FEATURES`: dim, rows, pooling, size) lies more than `limit`
    training-range widths beyond the (widened) range its weights saw -- or, for weights
    without a stored range, more than `OUT_OF_RANGE_SIGMAS` from the training mean -- which
    gives "analytic". Reuse shares are bounded in [0, 1], so the learned model's error there is
    bounded too; shapes are not. The learned proposer's plan stays a candidate.

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> task = Task([TableSpec("a", 1000, 64)], make_devices(2))
        >>> default_judge(task, default_estimator(task)).name        # shapes it saw
        'learned'
        >>> wide = Task([TableSpec("wide", 1000, 4096)], make_devices(2))
        >>> default_judge(wide, default_estimator(wide)).name        # dim 4096: far beyond
        'analytic'
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
    """The measuring estimator a `Planner` verifies with unless told: "measured-gpu" for a task
    on GPUs, "measured-cpu" otherwise.

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> tables = [TableSpec("a", 1000, 64)]
        >>> default_verifier(Task(tables, make_devices(2, "16GiB", "/GPU:{i}")))
        'measured-gpu'
        >>> default_verifier(Task(tables, make_devices(2)))
        'measured-cpu'
    """
    return "measured-gpu" if cm.profile_of(task) in cm.GPU_PROFILES else "measured-cpu"


# -- what the learned weights saw ------------------------------------------------------------------
def learned_cost_model(weights_dir=None, task=None):
    """The learned proposer's cost model for `task` (cached): cost_model_{profile}.npz of the
    task's profile (`cm.profile_of`; None: cpu) in `weights_dir` or the shipped data, the cpu
    file where the gpu one is missing.

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> gpu_task = Task([TableSpec("a", 1000, 64)], make_devices(2, "16GiB", "/GPU:{i}"))
        >>> learned_cost_model(None, gpu_task).meta.get("profile")
        'gpu'
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

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> task = Task([TableSpec("wide", 1000, 4096), TableSpec("a", 1000, 64)], make_devices(2))
        >>> learned_out_of_range(task)[:1]            # feature 0, its dim: far beyond
        [('wide', 0, ...)]
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


def out_of_range_text(item, weights_dir=None, task=None):
    """One entry of `learned_out_of_range` in words, by the cost model of `task`'s profile.

    Example:
        >>> out_of_range_text(("t07", 3, 0.9))
        't07, feature size_gb at 0.9 range widths beyond its training range'
    """
    name, index, distance = item
    feature = features.FEATURE_NAMES[index] if index < len(features.FEATURE_NAMES) else index
    model = learned_cost_model(weights_dir, task)
    if not model.has_range:   # weights without a stored range: z-scores
        return f"{name}, feature {feature} at {distance:+.1f} standard deviations"
    if math.isinf(distance):  # a feature that was constant in training
        return (f"{name}, feature {feature}, which was {model.meta['x_min'][index]:g} "
                f"throughout training")
    return f"{name}, feature {feature} at {distance:.1f} range widths beyond its training range"


__all__ = ["Candidate", "Choice", "Planner", "default_estimator", "default_judge",
           "default_verifier", "learned_cost_model", "learned_out_of_range", "out_of_range_text"]
