"""Estimators: the cost (seconds per training step) of the shards on one device.

  - "analytic" (`AnalyticEstimator`): bytes moved / memory bandwidth. A baseline only, never
    ground truth: it ignores caches, kernel fusion and launch overheads.
  - "learned" (`cost_model.LearnedEstimator`): the neural multi-table cost model (numpy).
  - "measured-cpu" (`benchmark.tf_cpu.MeasuredEstimator`): kernel benchmarks with TensorFlow,
    ground truth (`measured = True`: costs land in `DeviceCost.measured_cost`).
  - "measured-gpu" (`benchmark.torch_cuda.MeasuredEstimator`): fused EmbeddingBag kernels on a
    GPU with PyTorch, plus a modelled all-to-all; ground truth for GPU devices.

All are named in one table, `_ESTIMATORS`; an entry is a factory or a "module:attr" string
imported on first use, so TensorFlow loads only when a TF-backed estimator is asked for.
`register_estimator(name, factory)` adds one.

Example:
    >>> from tfra_dynamic_embedding.placement.types import Plan, TableSpec, Task, make_devices
    >>> task = Task([TableSpec("a", rows=1000, dim=16), TableSpec("b", rows=1000, dim=32)],
    ...             make_devices(2), batch_size=1024)
    >>> plan = Plan(task, {"a": ["/job:ps/task:0"], "b": ["/job:ps/task:1"]})
    >>> get_estimator("analytic", bandwidth=2e11).plan_costs(plan)   # seconds per step
    {'/job:ps/task:0': 1.6384e-06, '/job:ps/task:1': 3.2768e-06}
"""

import abc
import importlib


class CostEstimator(abc.ABC):
    """Cost of the shards on one device: the base of the built-in `types.Estimator`s. Subclass
    and `register_estimator` to plug one in."""

    name = "estimator"
    additive = False   # True when a device's cost is the sum of its shards' costs
    measured = False   # True for benchmarks (ground truth), False for predictions

    @abc.abstractmethod
    def device_cost(self, shards, device, task):
        """Cost of running `shards` (list of `Shard`) together on `device` (a DeviceSpec, or
        None for a standalone estimate) in `task` (for the batch size)."""

    def plan_costs(self, plan):
        """{device name: cost} of every device of a plan."""
        by_device = plan.shards_by_device()
        return {d.name: float(self.device_cost(by_device[d.name], d, plan.task))
                for d in plan.task.devices}


class AdditiveEstimator(CostEstimator):
    """An estimator whose device cost is the sum of independent shard costs."""

    additive = True

    @abc.abstractmethod
    def shard_cost(self, shard, task):
        """Cost of one shard alone."""

    def device_cost(self, shards, device, task):
        return float(sum(self.shard_cost(s, task) for s in shards))


class AnalyticEstimator(AdditiveEstimator):
    """Seconds per step = bytes a shard's embedding kernels move / `bandwidth` (+ overhead).

    Per step a shard moves row_bytes * (3 * lookups + 2 * batch): forward gathers one row per
    lookup and writes one pooled row per sample; backward reads one gradient row per sample and
    read-modify-writes one row per lookup. lookups = batch * pooling factor * slice fraction;
    row_bytes = dim * bytes per value, with dim the block's width for a column block.

    A column block also pays `probe_bytes` per lookup: every block of a table split by columns
    hashes and probes each key in its own hash table (forward find, backward update: by default
    two 64-byte cache lines), so n blocks probe n times where the whole table probes once -- the
    price of a column split, which only a wide, hot table recovers. Whole tables and row slices
    are charged row bytes only, as before (their one probe is folded into the baseline).

    Example (1024 samples of 1 lookup, 64-byte rows: 1024 * 64 * (3 + 2) bytes at 2e11 B/s):
        >>> from tfra_dynamic_embedding.placement.types import Shard, TableSpec, Task, make_devices
        >>> table = TableSpec("a", rows=1000, dim=16)
        >>> task = Task([table], make_devices(1), batch_size=1024)
        >>> AnalyticEstimator(bandwidth=2e11).shard_cost(Shard(table, "/GPU:0"), task)
        1.6384e-06
    """

    name = "analytic"

    def __init__(self, bandwidth=1e11, overhead=0.0, probe_bytes=128.0):
        if not bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s; got {bandwidth!r}")
        if overhead < 0:
            raise ValueError(f"overhead must be >= 0 seconds; got {overhead!r}")
        if not probe_bytes >= 0:
            raise ValueError(f"probe_bytes must be >= 0 bytes per lookup; got {probe_bytes!r}")
        self.bandwidth = float(bandwidth)
        self.overhead = float(overhead)
        self.probe_bytes = float(probe_bytes)

    def bytes_moved(self, shard, task):
        table = shard.table   # a column block's spec has the block's width as dim
        row_bytes = table.dim * table.bytes_per_value
        lookups = task.batch_size * table.pooling_factor * shard.fraction
        probes = self.probe_bytes * lookups if shard.is_column_block else 0.0
        return row_bytes * (3.0 * lookups + 2.0 * task.batch_size) + probes

    def shard_cost(self, shard, task):
        return self.bytes_moved(shard, task) / self.bandwidth + self.overhead


# name -> factory, or "module:attr" of one (imported by `get_estimator` on first use).
_ESTIMATORS = {
    "analytic": AnalyticEstimator,
    "measured-cpu": "tfra_dynamic_embedding.placement.benchmark.tf_cpu:MeasuredEstimator",
    "measured-gpu": "tfra_dynamic_embedding.placement.benchmark.torch_cuda:MeasuredEstimator",
    "learned": "tfra_dynamic_embedding.placement.cost_model:LearnedEstimator",
}


def register_estimator(name, factory):
    """Makes `get_estimator(name, **kwargs)` return `factory(**kwargs)`; `factory` may be a
    "module:attr" string, imported when the estimator is first asked for."""
    if name in _ESTIMATORS and _ESTIMATORS[name] is not factory:
        raise ValueError(f"estimator {name!r} is already registered")
    _ESTIMATORS[name] = factory


def list_estimators():
    return list(_ESTIMATORS)


def resolve(entry):
    """The object a registry entry names: itself, or the `attr` of module `module` for a
    "module:attr" string."""
    if not isinstance(entry, str):
        return entry
    module, _, attr = entry.partition(":")
    return getattr(importlib.import_module(module), attr)


def get_estimator(estimator="analytic", **kwargs):
    """A CostEstimator from an instance (returned as is) or a registered name."""
    if isinstance(estimator, CostEstimator):
        return estimator
    if estimator not in _ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choose one of {list_estimators()} "
                         f"or pass a CostEstimator")
    return resolve(_ESTIMATORS[estimator])(**kwargs)

