"""Where embedding tables live: a planner in stages, each a module with one interface.

  types       TableSpec, DeviceSpec, Task, Shard, Plan (plain dataclasses, JSON in and out);
              a table is placed whole, cut by rows (row slices) or by columns (column blocks)
  streams     index streams and their reuse statistics; workloads / loaders: tables and tasks
  features    the 21 table features (a pure function of a spec and its stream)
  pieces      a task's pieces (whole tables, row slices, column blocks) and their partition
              under memory
  estimators  what the shards on a device cost: analytic | learned (cost_model) | measured
              (CPU: benchmark/tf_cpu, GPU: benchmark/torch_cuda; comm: the GPUs' all-to-all)
  proposers   strategies that place pieces: heuristics | learned (policy, the RL proposer)
  planner     Planner(estimator, proposers, judge, weights).plan(task): the one place that
              plans (every strategy proposes, one estimator judges, the cheapest wins)
  apply       a Plan -> the devices of de.Variables (row slices: the key-mod partitioner)
  column_split  a table split by columns -> one de.Variable (or Keras Embedding) per block
  evaluate    reports and plots (reads plans; no stage imports it)

Example:
    from tfra_dynamic_embedding import placement
    pool = placement.generate_pool(856, seed=0)
    task = placement.make_tasks(pool, 1, tables_per_task=80, num_devices=8, memory="16GiB")[0]
    plan = placement.propose(task, "lookup-greedy")
    report = placement.evaluate_plan(plan, "analytic")
    with plan.scope():
        w = de.get_variable("t000", dim=16)     # on plan.devices_for("t000")

Only the names below are public here; everything else is imported from its module
(`placement.types.parse_bytes`, `placement.proposers.list_strategies`, ...). Planning imports
no TensorFlow: apply.py and the "measured-cpu" estimator load it when used.
"""

from tfra_dynamic_embedding.placement.estimators import get_estimator
from tfra_dynamic_embedding.placement.evaluate import evaluate_plan
from tfra_dynamic_embedding.placement.loaders import load_tables
from tfra_dynamic_embedding.placement.planner import Planner
from tfra_dynamic_embedding.placement.proposers import propose
from tfra_dynamic_embedding.placement.types import (DeviceSpec, PlacementError, Plan, Shard,
                                                    TableSpec, Task)
from tfra_dynamic_embedding.placement.workloads import generate_pool, make_tasks

__all__ = [
    "DeviceSpec", "PlacementError", "Plan", "Planner", "Shard", "TableSpec", "Task",
    "evaluate_plan", "generate_pool", "get_estimator", "load_tables", "make_tasks", "propose",
]
