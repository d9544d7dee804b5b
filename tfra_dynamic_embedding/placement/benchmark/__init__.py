"""Kernel micro-benchmarks: the ground truth of placement costs.

  protocol.py    warm-up, cache flush, repeat, trimmed mean (backend independent)
  tf_cpu.py      this project's kernels on the CPU (de.Variable lookups + DE optimizer step)
  torch_cuda.py  fused EmbeddingBag kernels with PyTorch on a GPU (torch imported lazily)
  collect.py     `tfra-de benchmark collect`: JSONL records of measured shards

Importing this package registers the "measured-cpu" estimator (`tf_cpu.MeasuredEstimator`);
neither TensorFlow nor torch is imported until something is measured.

Example:
    from tfra_dynamic_embedding.placement import benchmark, evaluate_plan
    report = evaluate_plan(plan, "measured-cpu")
"""

from tfra_dynamic_embedding.placement import evaluate as _evaluate
from tfra_dynamic_embedding.placement.benchmark import protocol
from tfra_dynamic_embedding.placement.benchmark.tf_cpu import (MeasuredEstimator, benchmark_shard,
                                                               shard_key)

if "measured-cpu" not in _evaluate.list_estimators():
    _evaluate.register_estimator("measured-cpu", MeasuredEstimator)

__all__ = ["MeasuredEstimator", "benchmark_shard", "protocol", "shard_key"]
