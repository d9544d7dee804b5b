"""Where embedding tables live: a planner in stages, each a module with one interface.

  types       TableSpec, DeviceSpec, Task, Shard, Plan (plain dataclasses, JSON in and out);
              a table is placed whole, cut by rows (row slices) or by columns (column blocks);
              the stages' interfaces (Estimator, Proposer, Judge)
  streams     index streams and their reuse statistics; workloads / loaders: tables and tasks
  features    the 21 table features (a pure function of a spec and its stream)
  pieces      a task's pieces (whole tables, row slices, column blocks) and their partition
              under memory
  estimators  what the shards on a device cost: analytic | learned (cost_model) | measured
              (CPU: benchmark/tf_cpu, GPU: benchmark/torch_cuda; comm: the GPUs' all-to-all)
  proposers   strategies that place pieces: heuristics | learned (policy, the RL proposer)
  planner     Planner(estimator, proposers, judge, weights).plan(task): the one place that
              plans (every strategy proposes, one estimator judges, the cheapest wins)
  train       training the learned cost model and policy (`tfra-de train-planner`)
  apply       a Plan -> the devices of de.Variables (row slices: the key-mod partitioner)
  column_split  a table split by columns -> one de.Variable (or Keras Embedding) per block
  evaluate    reports and plots (reads plans; no stage imports it)

Example (tables from a file: `placement.load_tables("tables.json")`):
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> from tfra_dynamic_embedding import placement
    >>> tables = [placement.TableSpec("user", rows=1000, dim=16),
    ...           placement.TableSpec("item", rows=1000, dim=16, pooling_factor=4.0)]
    >>> task = placement.Task(tables, [placement.DeviceSpec(f"/CPU:{i}", "1GiB") for i in range(2)])
    >>> choice = placement.Planner().plan(task)    # every strategy proposes, the cheapest wins
    >>> choice.plan.devices_for("user") != choice.plan.devices_for("item")
    True
    >>> report = placement.evaluate_plan(choice.plan, choice.judge)
    >>> with choice.plan.scope():
    ...     w = de.get_variable("planned/user", dim=16)   # "user" names it, as "ctr/user" would
    >>> w.devices == choice.plan.devices_for("user")
    True

Only the names below are public here; everything else is imported from its module
(`placement.types.make_devices`, `placement.workloads.generate_pool`,
`placement.proposers.propose`, ...). Planning imports no TensorFlow: apply.py and the
"measured-cpu" estimator load it when used.
"""

from tfra_dynamic_embedding.placement.evaluate import evaluate_plan
from tfra_dynamic_embedding.placement.loaders import load_tables
from tfra_dynamic_embedding.placement.planner import Planner
from tfra_dynamic_embedding.placement.types import (DeviceSpec, PlacementError, Plan, TableSpec,
                                                    Task)

__all__ = ["DeviceSpec", "PlacementError", "Plan", "Planner", "TableSpec", "Task",
           "evaluate_plan", "load_tables"]
