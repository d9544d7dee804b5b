"""Heuristic placement strategies, behind a registry that learned proposers join later.

A proposer is `fn(task, seed=0, estimator=None) -> Plan`; `register_strategy(name)` adds one
(the RL policy of a later issue registers itself the same way). Built in:

  random               each table to a uniformly random device with room
  size-greedy          biggest tables first, each to the device with the least total size
  dim-greedy           by dimension, to the device with the least total dimension
  lookup-greedy        by dim x pooling factor, to the device with the least total of it
  size-lookup-greedy   by dim x pooling x log10(rows)
  capacity-balanced    equal memory per device (share of each device's memory), biggest first
  load-balanced        equal pooling factor (lookups per sample) per device
  nsbp                 network-specific bin packing: tables grouped by network tag, each group
                       best-fit packed by size onto as few devices as possible
  cost-greedy          by estimated cost, to the device whose estimated cost grows least

Greedy ties go to the device with less memory used, then the lower index. Every strategy
respects device memory; a table bigger than the largest device is split row-wise into the
fewest slices that fit (slice i: keys with key % n == i), slices on distinct devices. When a
task cannot fit, `PlacementError` names the tables left over and the shortfall.

Example:
    plan = propose(task, "lookup-greedy")
    plan.devices_for("t000")
"""

import dataclasses
import math

import numpy as np
from absl import logging

from tfra_dynamic_embedding.placement.types import Plan, PlacementError, format_bytes

_STRATEGIES = {}


def register_strategy(name, description=""):
    """Decorator adding a proposer `fn(task, seed=0, estimator=None) -> Plan` under `name`."""
    def decorate(fn):
        if name in _STRATEGIES and _STRATEGIES[name] is not fn:
            raise ValueError(f"strategy {name!r} is already registered")
        fn.strategy_name = name
        fn.description = description or (fn.__doc__ or "").strip().split("\n")[0]
        _STRATEGIES[name] = fn
        return fn
    return decorate


def unregister_strategy(name):
    """Removes a registered strategy (for plug-ins and tests)."""
    _STRATEGIES.pop(name, None)


def list_strategies():
    """Names of the registered strategies, in registration order."""
    return list(_STRATEGIES)


def get_strategy(name):
    if name not in _STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {list_strategies()}")
    return _STRATEGIES[name]


def propose(task, strategy="lookup-greedy", seed=0, estimator=None):
    """A validated Plan of `task` by the named strategy."""
    plan = get_strategy(strategy)(task, seed=seed, estimator=estimator)
    plan.validate()
    return plan


# -- items: whole tables, or row slices of tables bigger than any device ----------------------
@dataclasses.dataclass
class Item:
    """A piece to place: slice `index` of `num_slices` of `table`."""

    table: object
    index: int
    num_slices: int

    @property
    def bytes(self):
        return self.table.slice_bytes(self.index, self.num_slices)

    @property
    def fraction(self):
        return self.table.slice_rows(self.index, self.num_slices) / self.table.rows


def largest_memory(task):
    """Memory of the task's largest device in bytes; None when some device has no limit."""
    limits = [d.memory_bytes for d in task.devices]
    return None if any(m is None for m in limits) else max(limits)


def min_slices(table, task, largest=None):
    """Fewest row slices of `table` that each fit the largest device (1 if it fits whole).
    `largest`: `largest_memory(task)` when already known (planners ask for every table)."""
    if largest is None:
        largest = largest_memory(task)
    if largest is None or table.size_bytes <= largest:
        return 1
    n = max(2, math.ceil(table.size_bytes / largest))
    while n <= min(task.num_devices, table.rows) and table.slice_bytes(0, n) > largest:
        n += 1
    if n > task.num_devices or n > table.rows or table.slice_bytes(0, n) > largest:
        raise PlacementError(
            f"table {table.name!r} ({format_bytes(table.size_bytes)}) is larger than the largest "
            f"device ({format_bytes(largest)}) and cannot be split into <= {task.num_devices} "
            f"row slices that fit", [table.name],
            table.size_bytes - task.num_devices * largest if n > task.num_devices else
            table.slice_bytes(0, n) - largest)
    return n


def split_items(task):
    """All pieces of a task: one per table, or its minimal row slices when it fits no device."""
    items = []
    largest = largest_memory(task)
    for table in task.tables:
        n = min_slices(table, task, largest)
        if n > 1:
            logging.info("table %s (%s) is split row-wise into %d slices", table.name,
                         format_bytes(table.size_bytes), n)
        items.extend(Item(table, i, n) for i in range(n))
    return items


class _State:
    """Memory used, balance load and the placement so far, per device."""

    def __init__(self, task, slices=None):
        """`slices`: {table name: row slices} where a planner cuts a table finer than
        `min_slices`."""
        self.task = task
        slices = slices or {}
        self.capacity = [math.inf if d.memory_bytes is None else d.memory_bytes
                         for d in task.devices]
        self.used = [0] * task.num_devices
        self.load = [0.0] * task.num_devices
        largest = largest_memory(task)
        self.placed = {t.name: [None] * (slices[t.name] if t.name in slices
                                         else min_slices(t, task, largest))
                       for t in task.tables}
        self.unplaced = []

    def candidates(self, item):
        taken = set(self.placed[item.table.name])
        return [d for d in range(self.task.num_devices)
                if d not in taken and self.used[d] + item.bytes <= self.capacity[d]]

    def put(self, item, device, load=0.0):
        self.placed[item.table.name][item.index] = device
        self.used[device] += item.bytes
        self.load[device] += load

    def plan(self, strategy, seed, estimator=None):
        if self.unplaced:
            raise _infeasible(self)
        names = [d.name for d in self.task.devices]
        assignment = {t: [names[d] for d in devices] for t, devices in self.placed.items()}
        return Plan(self.task, assignment, strategy=strategy,
                    estimator=getattr(estimator, "name", None), meta={"seed": seed})


def _infeasible(state):
    task = state.task
    total = sum(t.size_bytes for t in task.tables)
    capacity = sum(state.capacity)
    parts, worst = [], 0
    for item in state.unplaced:
        free = [(state.capacity[d] - state.used[d], task.devices[d].name)
                for d in range(task.num_devices)]
        best_free, where = max(free, key=lambda x: x[0])  # first device on ties
        worst = max(worst, item.bytes - best_free)
        piece = item.table.name if item.num_slices == 1 else (
            f"{item.table.name}[slice {item.index}/{item.num_slices}]")
        parts.append(f"{piece} ({format_bytes(item.bytes)}; largest free space "
                     f"{format_bytes(best_free)} on {where})")
    shortfall = max(worst, total - capacity)
    names = sorted({item.table.name for item in state.unplaced})
    message = (f"cannot place {len(names)} of {len(task.tables)} tables on "
               f"{task.num_devices} devices: " + "; ".join(parts[:20]) +
               (f"; ... {len(parts) - 20} more" if len(parts) > 20 else "") +
               f". Shortfall {format_bytes(shortfall)} (tables need {format_bytes(total)}, "
               f"devices hold {format_bytes(capacity)})")
    return PlacementError(message, names, shortfall)


def _order(items, weight):
    """Heaviest first; ties by bytes, then name, then slice (deterministic)."""
    return sorted(items, key=lambda it: (-weight(it), -it.bytes, it.table.name, it.index))


def greedy(task, weight, strategy, seed=0, score=None):
    """Places items heaviest first, each on the fitting device with the lowest `score`.

    `weight(item)` orders items and is the load added; `score(state, device, item)` defaults
    to the device's accumulated load (ties: less memory used, lower index).
    """
    state = _State(task)
    for item in _order(split_items(task), weight):
        candidates = state.candidates(item)
        if not candidates:
            state.unplaced.append(item)
            continue
        key = score or (lambda s, d, it: s.load[d])
        device = min(candidates, key=lambda d: (key(state, d, item), state.used[d], d))
        state.put(item, device, weight(item))
    return state.plan(strategy, seed)


# -- the strategies ----------------------------------------------------------------------------
@register_strategy("random")
def random_plan(task, seed=0, estimator=None):
    """Each piece (biggest first) to a uniformly random device that has room for it."""
    del estimator
    rng = np.random.default_rng(seed)
    state = _State(task)
    for item in _order(split_items(task), lambda it: it.bytes):
        candidates = state.candidates(item)
        if not candidates:
            state.unplaced.append(item)
            continue
        state.put(item, int(rng.choice(candidates)))
    return state.plan("random", seed)


@register_strategy("size-greedy")
def size_greedy(task, seed=0, estimator=None):
    """Biggest tables first, each to the device with the smallest total table size."""
    del estimator
    return greedy(task, lambda it: float(it.bytes), "size-greedy", seed)


@register_strategy("dim-greedy")
def dim_greedy(task, seed=0, estimator=None):
    """Widest tables first, each to the device with the smallest total dimension."""
    del estimator
    return greedy(task, lambda it: it.table.dim * it.fraction, "dim-greedy", seed)


@register_strategy("lookup-greedy")
def lookup_greedy(task, seed=0, estimator=None):
    """By dim x pooling factor (values read per sample), to the least-loaded device."""
    del estimator
    return greedy(task, lambda it: it.table.dim * it.table.pooling_factor * it.fraction,
                  "lookup-greedy", seed)


@register_strategy("size-lookup-greedy")
def size_lookup_greedy(task, seed=0, estimator=None):
    """By dim x pooling factor x log10(rows), to the least-loaded device."""
    del estimator
    return greedy(task, lambda it: (it.table.dim * it.table.pooling_factor *
                                    math.log10(it.table.rows) * it.fraction),
                  "size-lookup-greedy", seed)


@register_strategy("capacity-balanced")
def capacity_balanced(task, seed=0, estimator=None):
    """Equal memory per shard: biggest first, to the device whose memory share stays lowest.

    Shares are of each device's own memory, so unequal devices fill in proportion (unlimited
    devices count as holding the whole task). On equal devices this is size-greedy.
    """
    del estimator
    total = max(sum(t.size_bytes for t in task.tables), 1)
    caps = [total if d.memory_bytes is None else max(d.memory_bytes, 1) for d in task.devices]
    return greedy(task, lambda it: float(it.bytes), "capacity-balanced", seed,
                  score=lambda s, d, it: (s.used[d] + it.bytes) / caps[d])


@register_strategy("load-balanced")
def load_balanced(task, seed=0, estimator=None):
    """Equal lookups per shard: by pooling factor, to the device with the fewest lookups."""
    del estimator
    return greedy(task, lambda it: it.table.pooling_factor * it.fraction, "load-balanced", seed)


@register_strategy("nsbp")
def network_specific_bin_packing(task, seed=0, estimator=None):
    """Tables grouped by network tag; each group best-fit packed by size on few devices.

    Groups go biggest first. A piece goes to the fullest device of its own group that still
    fits the bin capacity (device memory; with unlimited memory, total size / devices), else to
    an empty device, else to the fullest device that fits, else (unlimited memory only) to the
    least used device. Untagged tables form one group.
    """
    del estimator
    state = _State(task)
    total = sum(t.size_bytes for t in task.tables)
    soft = [c if c != math.inf else math.ceil(total / task.num_devices) for c in state.capacity]
    groups_on = [set() for _ in task.devices]
    groups = {}
    for item in split_items(task):
        groups.setdefault(item.table.group or "", []).append(item)
    order = sorted(groups, key=lambda g: (-sum(it.bytes for it in groups[g]), g))
    for group in order:
        for item in _order(groups[group], lambda it: it.bytes):
            fits = state.candidates(item)
            in_bin = [d for d in fits if state.used[d] + item.bytes <= soft[d]]
            tiers = ([d for d in in_bin if group in groups_on[d]],
                     [d for d in in_bin if not groups_on[d]], in_bin)
            device = None
            for tier in tiers:
                if tier:  # best fit: the least room left after placing
                    device = min(tier, key=lambda d: (soft[d] - state.used[d] - item.bytes, d))
                    break
            if device is None and fits:
                device = min(fits, key=lambda d: (state.used[d], d))
            if device is None:
                state.unplaced.append(item)
                continue
            state.put(item, device)
            groups_on[device].add(group)
    return state.plan("nsbp", seed)


@register_strategy("cost-greedy")
def cost_greedy(task, seed=0, estimator=None):
    """By estimated cost, each piece to the device whose estimated cost after adding is least.

    `estimator` is a `evaluate.CostEstimator` or a registered name (default 'analytic'); a
    non-additive estimator (a learned cost model) is asked for the whole device each time.
    """
    from tfra_dynamic_embedding.placement import evaluate  # pylint: disable=import-outside-toplevel
    est = evaluate.get_estimator(estimator or "analytic")
    state = _State(task)
    costs = {}

    def shard_of(item, device_name=""):
        return evaluate.Shard(item.table, device_name, item.index, item.num_slices)

    items = split_items(task)
    for item in items:
        costs[(item.table.name, item.index)] = est.device_cost([shard_of(item)], None, task)
    on_device = [[] for _ in task.devices]
    current = [0.0] * task.num_devices
    for item in _order(items, lambda it: costs[(it.table.name, it.index)]):
        candidates = state.candidates(item)
        if not candidates:
            state.unplaced.append(item)
            continue

        def after(d, item=item):
            if est.additive:
                return current[d] + costs[(item.table.name, item.index)]
            device = task.devices[d]
            return est.device_cost(on_device[d] + [shard_of(item, device.name)], device, task)

        scored = {d: after(d) for d in candidates}
        device = min(candidates, key=lambda d: (scored[d], state.used[d], d))
        current[device] = scored[device]
        on_device[device].append(shard_of(item, task.devices[device].name))
        state.put(item, device)
    return state.plan("cost-greedy", seed, est)
