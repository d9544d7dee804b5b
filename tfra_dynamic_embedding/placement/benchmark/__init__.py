"""Kernel micro-benchmarks: the ground truth of placement costs.

  protocol.py    warm-up, cache flush, repeat, trimmed mean (backend independent)
  tf_cpu.py      this project's kernels on the CPU (de.Variable lookups + DE optimizer step);
                 `tf_cpu.MeasuredEstimator` is the estimator "measured-cpu" (estimators.py)
  torch_cuda.py  fused EmbeddingBag kernels with PyTorch on a GPU (torch imported lazily);
                 `torch_cuda.MeasuredEstimator` is the estimator "measured-gpu"
  collect.py     `tfra-de benchmark collect`: JSONL records of measured shards
  records.py     reading those records back

Importing this package imports none of them, so neither TensorFlow nor torch loads until
something is measured. Measuring takes seconds (CPU) or a GPU: docs/learned_placement.md,
"Measured costs", shows `evaluate_plan(plan, "measured-cpu")` and the backends' functions.
"""
