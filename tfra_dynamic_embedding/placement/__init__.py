"""Where embedding tables live: specs, workloads, heuristic planners, evaluation, applying plans.

    from tfra_dynamic_embedding import placement
    pool = placement.generate_pool(856, seed=0)
    task = placement.make_tasks(pool, 1, tables_per_task=80, num_devices=8, memory="16GiB")[0]
    plan = placement.propose(task, "lookup-greedy")
    report = placement.evaluate_plan(plan, "analytic")
    with plan.scope():
        w = de.get_variable("t000", dim=16)     # on plan.devices_for("t000")

None of these modules imports TensorFlow itself (apply.py does so only when a plan is
applied), so planning runs anywhere.
"""

from tfra_dynamic_embedding.placement.evaluate import (AdditiveEstimator, AnalyticEstimator,
                                                       CostEstimator, PlanReport,
                                                       compare_strategies, evaluate_plan,
                                                       get_estimator, list_estimators,
                                                       lower_bound, plot_comparison, plot_plan,
                                                       register_estimator)
from tfra_dynamic_embedding.placement.features import (FEATURE_NAMES, NUM_FEATURES, FeatureScales,
                                                       features_matrix, reuse_histogram,
                                                       table_features)
from tfra_dynamic_embedding.placement.heuristics import (get_strategy, list_strategies, propose,
                                                         register_strategy)
from tfra_dynamic_embedding.placement.loaders import (criteo_tsv_stats, load_dlrm_pt, load_tables,
                                                      save_tables, tables_from_dlrm_arrays)
from tfra_dynamic_embedding.placement.types import (DeviceCost, DeviceSpec, PlacementError, Plan,
                                                    Shard, TableSpec, Task, make_devices,
                                                    parse_bytes)
from tfra_dynamic_embedding.placement.workloads import (calibration_report, generate_pool,
                                                        make_tasks, open_stream, split_pool)
# Registering modules: the "measured-cpu" estimator (kernel benchmarks), the "learned" estimator
# (cost model) and strategy (RL policy). TensorFlow loads only when one of them is used.
from tfra_dynamic_embedding.placement import benchmark, cost_model, policy  # noqa: E402,F401  pylint: disable=unused-import

__all__ = [
    "AdditiveEstimator", "AnalyticEstimator", "CostEstimator", "DeviceCost", "DeviceSpec",
    "FEATURE_NAMES", "FeatureScales", "NUM_FEATURES", "PlacementError", "Plan", "PlanReport",
    "Shard", "TableSpec", "Task", "calibration_report", "compare_strategies", "criteo_tsv_stats",
    "evaluate_plan", "features_matrix", "generate_pool", "get_estimator", "get_strategy",
    "list_estimators", "list_strategies", "load_dlrm_pt", "load_tables", "lower_bound",
    "make_devices", "make_tasks", "open_stream", "parse_bytes", "plot_comparison", "plot_plan",
    "propose", "register_estimator", "register_strategy", "reuse_histogram", "save_tables",
    "split_pool", "table_features", "tables_from_dlrm_arrays",
]
