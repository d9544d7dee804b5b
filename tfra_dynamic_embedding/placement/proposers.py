"""Proposers: strategies that place a task's pieces on devices, and the one table naming them.

A proposer is `fn(task, seed=0, estimator=None) -> Plan` (`types.Proposer`). The built-in ones
are listed in `_STRATEGIES` (the RL policy as "learned", imported from policy.py on first use);
`register_strategy(name)` adds one. A learned proposer also takes `weights=`, the directory of
its trained weights: `propose(..., weights=)` and `get_strategy(name, weights)` pass it to the
strategies in `_LEARNED`. Built in:

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
  column-greedy        cost-greedy after cutting tables costlier than the per-device average
                       into column blocks (`hot_column_splits`), when that lowers the max cost
  learned              the RL policy over the learned cost model (policy.py)

Greedy ties go to the device with less memory used, then the lower index. Every strategy
respects device memory; a table bigger than the largest device is split row-wise into the
fewest slices that fit (slice i: keys with key % n == i), slices on distinct devices
(pieces.py). Only column-greedy and learned cut tables by columns (blocks on distinct
devices). When a task cannot fit, `PlacementError` names the tables left over and the
shortfall.

Example:
    >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
    >>> task = Task([TableSpec("user", 1000, 16, pooling_factor=2.0), TableSpec("item", 1000, 64)],
    ...             make_devices(2))
    >>> propose(task, "lookup-greedy").assignment        # dim x pooling: 64 first, then 32
    {'user': ['/job:ps/task:1'], 'item': ['/job:ps/task:0']}
"""

import dataclasses
import functools
import math

import numpy as np

from tfra_dynamic_embedding.placement import estimators
from tfra_dynamic_embedding.placement.pieces import (Partition, column_options, column_pieces,
                                                     fewest_blocks, largest_memory, split_pieces)
from tfra_dynamic_embedding.placement.types import PlacementError


def register_strategy(name, description="", learned=False):
    """Decorator adding a proposer `fn(task, seed=0, estimator=None) -> Plan` under `name`
    (for extensions: the built-in ones are listed in `_STRATEGIES`); `learned`: it also takes
    `weights=` (a directory of trained weights; None: its shipped ones)."""
    def decorate(fn):
        if name in _STRATEGIES and _STRATEGIES[name] is not fn:
            raise ValueError(f"strategy {name!r} is already registered")
        fn.strategy_name = name
        fn.description = description or (fn.__doc__ or "").strip().split("\n")[0]
        _STRATEGIES[name] = fn
        if learned:
            _LEARNED.add(name)
        return fn
    return decorate


def unregister_strategy(name):
    """Removes a registered strategy (for plug-ins and tests)."""
    _STRATEGIES.pop(name, None)
    _LEARNED.discard(name)


def list_strategies():
    """Names of the registered strategies, in registration order."""
    return list(_STRATEGIES)


def get_strategy(name, weights=None):
    """The proposer registered as `name` (a "module:attr" entry is imported now); for a learned
    one (`_LEARNED`) with `weights` given, bound to those trained weights.

    Example (`weights`: a `tfra-de train-planner --out` directory; here the shipped one):
        >>> from tfra_dynamic_embedding.placement import cost_model
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> task = Task([TableSpec("a", 1000, 16), TableSpec("b", 1000, 16)], make_devices(2))
        >>> get_strategy("learned", cost_model.DATA_DIR)(task).strategy
        'learned'
    """
    if name not in _STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {list_strategies()}")
    fn = estimators.resolve(_STRATEGIES[name])
    if weights is not None and name in _LEARNED:
        return functools.partial(fn, weights=weights)
    return fn


def describe_strategy(name):
    """One line about a strategy: its registered description, else its docstring's first line."""
    fn = get_strategy(name)
    return getattr(fn, "description", None) or (fn.__doc__ or "").strip().split("\n")[0]


def propose(task, strategy="lookup-greedy", seed=0, estimator=None, weights=None):
    """A validated Plan of `task` by the named strategy; `weights`: the trained weights a
    learned one plans with (a directory; None: the shipped ones, see `get_strategy`)."""
    plan = get_strategy(strategy, weights)(task, seed=seed, estimator=estimator)
    plan.validate()
    return plan


def _order(items, weight):
    """Heaviest first; ties by bytes, then name, then slice or block (deterministic)."""
    return sorted(items, key=lambda it: (-weight(it), -it.size_bytes, it.table.name, it.index,
                                         it.col_offset))


def greedy(task, weight, strategy, seed=0, score=None):
    """Places items heaviest first, each on the fitting device with the lowest `score`.

    `weight(item)` orders items and is the load added; `score(state, device, item)` defaults
    to the device's accumulated load (ties: less memory used, lower index).
    """
    state = Partition(task)
    for item in _order(split_pieces(task), weight):
        candidates = state.candidates(item)
        if not candidates:
            state.unplaced.append(item)
            continue
        key = score or (lambda s, d, it: s.load[d])
        device = min(candidates, key=lambda d: (key(state, d, item), state.used[d], d))
        state.put(item, device, weight(item))
    return state.plan(strategy, seed)


# -- the heuristics ----------------------------------------------------------------------------
def random_plan(task, seed=0, estimator=None):
    """Each piece (biggest first) to a uniformly random device that has room for it."""
    del estimator
    rng = np.random.default_rng(seed)
    state = Partition(task)
    for item in _order(split_pieces(task), lambda it: it.size_bytes):
        candidates = state.candidates(item)
        if not candidates:
            state.unplaced.append(item)
            continue
        state.put(item, int(rng.choice(candidates)))
    return state.plan("random", seed)


def size_greedy(task, seed=0, estimator=None):
    """Biggest tables first, each to the device with the smallest total table size."""
    del estimator
    return greedy(task, lambda it: float(it.size_bytes), "size-greedy", seed)


def dim_greedy(task, seed=0, estimator=None):
    """Widest tables first, each to the device with the smallest total dimension."""
    del estimator
    return greedy(task, lambda it: it.table.dim * it.fraction, "dim-greedy", seed)


def lookup_greedy(task, seed=0, estimator=None):
    """By dim x pooling factor (values read per sample), to the least-loaded device."""
    del estimator
    return greedy(task, lambda it: it.table.dim * it.table.pooling_factor * it.fraction,
                  "lookup-greedy", seed)


def size_lookup_greedy(task, seed=0, estimator=None):
    """By dim x pooling factor x log10(rows), to the least-loaded device."""
    del estimator
    return greedy(task, lambda it: (it.table.dim * it.table.pooling_factor *
                                    math.log10(it.table.rows) * it.fraction),
                  "size-lookup-greedy", seed)


def capacity_balanced(task, seed=0, estimator=None):
    """Equal memory per shard: biggest first, to the device whose memory share stays lowest.

    Shares are of each device's own memory, so unequal devices fill in proportion (unlimited
    devices count as holding the whole task). On equal devices this is size-greedy.
    """
    del estimator
    total = max(sum(t.size_bytes for t in task.tables), 1)
    caps = [total if d.memory_bytes is None else max(d.memory_bytes, 1) for d in task.devices]
    return greedy(task, lambda it: float(it.size_bytes), "capacity-balanced", seed,
                  score=lambda s, d, it: (s.used[d] + it.size_bytes) / caps[d])


def load_balanced(task, seed=0, estimator=None):
    """Equal lookups per shard: by pooling factor, to the device with the fewest lookups."""
    del estimator
    return greedy(task, lambda it: it.table.pooling_factor * it.fraction, "load-balanced", seed)


def network_specific_bin_packing(task, seed=0, estimator=None):
    """Tables grouped by network tag; each group best-fit packed by size on few devices.

    Groups go biggest first. A piece goes to the fullest device of its own group that still
    fits the bin capacity (device memory; with unlimited memory, total size / devices), else to
    an empty device, else to the fullest device that fits, else (unlimited memory only) to the
    least used device. Untagged tables form one group.
    """
    del estimator
    state = Partition(task)
    total = sum(t.size_bytes for t in task.tables)
    soft = [c if c != math.inf else math.ceil(total / task.num_devices) for c in state.capacity]
    groups_on = [set() for _ in task.devices]
    groups = {}
    for item in split_pieces(task):
        groups.setdefault(item.table.group or "", []).append(item)
    order = sorted(groups, key=lambda g: (-sum(it.size_bytes for it in groups[g]), g))
    for group in order:
        for item in _order(groups[group], lambda it: it.size_bytes):
            fits = state.candidates(item)
            in_bin = [d for d in fits if state.used[d] + item.size_bytes <= soft[d]]
            tiers = ([d for d in in_bin if group in groups_on[d]],
                     [d for d in in_bin if not groups_on[d]], in_bin)
            device = None
            for tier in tiers:
                if tier:  # best fit: the least room left after placing
                    device = min(tier, key=lambda d: (soft[d] - state.used[d] - item.size_bytes, d))
                    break
            if device is None and fits:
                device = min(fits, key=lambda d: (state.used[d], d))
            if device is None:
                state.unplaced.append(item)
                continue
            state.put(item, device)
            groups_on[device].add(group)
    return state.plan("nsbp", seed)


def cost_greedy(task, seed=0, estimator=None):
    """By estimated cost, each piece to the device whose estimated cost after adding is least.

    `estimator` is an `estimators.CostEstimator` or a registered name (default 'analytic'); a
    non-additive estimator (a learned cost model) is asked for the whole device each time.
    """
    return _cost_greedy(task, seed, estimators.get_estimator(estimator or "analytic"),
                        "cost-greedy")


def column_greedy(task, seed=0, estimator=None):
    """Cost-greedy after cutting hot wide tables into column blocks on distinct devices.

    The tables `hot_column_splits` picks (estimated cost above the per-device average) are cut
    into equal column blocks, then every piece is placed as cost-greedy places it. The plan is
    kept only if its estimated max device cost is below cost-greedy's; otherwise (and on tasks
    without such a table) this is cost-greedy's plan.

    One table of dim 128 with most of the lookups, on 8 devices: its 8 blocks of 16 columns go
    to 8 devices, where any table-wise plan leaves that table's cost on one.

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> tables = [TableSpec("ad_id", rows=100_000, dim=128, pooling_factor=8.0)] + [
        ...     TableSpec(f"f{i}", rows=1000, dim=16) for i in range(7)]
        >>> plan = column_greedy(Task(tables, make_devices(8)))
        >>> plan.column_blocks("ad_id")
        [(16, '/job:ps/task:0'), (16, '/job:ps/task:1'), ..., (16, '/job:ps/task:7')]
    """
    est = estimators.get_estimator(estimator or "analytic")
    plain = _cost_greedy(task, seed, est, "column-greedy")
    splits = hot_column_splits(task, est)
    if not splits:
        return plain
    try:
        cut = _cost_greedy(task, seed, est, "column-greedy", splits)
    except PlacementError:   # blocks need distinct devices with room: then keep tables whole
        return plain
    return cut if max(est.plan_costs(cut).values()) < max(est.plan_costs(plain).values()) \
        else plain


def hot_column_splits(task, estimator=None):
    """{table name: number of column blocks} for the tables worth cutting by columns.

    A table qualifies when `pieces.column_splits` allows it and its estimated standalone cost
    exceeds the per-device average (total estimated cost / devices): placed whole, it alone
    sets the max. It gets the fewest blocks that each cost at most that average, else the
    number whose block costs least, among the numbers n for which n devices have the memory
    for a block. Each block probes every key (the estimator's probe term), so more blocks cost
    more in total.

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> tables = [TableSpec("ad_id", rows=100_000, dim=128, pooling_factor=8.0)] + [
        ...     TableSpec(f"f{i}", rows=1000, dim=16) for i in range(7)]
        >>> hot_column_splits(Task(tables, make_devices(8)), "analytic")
        {'ad_id': 8}
    """
    est = estimators.get_estimator(estimator or "analytic")
    solo = {}
    for item in split_pieces(task):
        solo[item.table.name] = solo.get(item.table.name, 0.0) + est.device_cost(
            [item], None, task)
    average = sum(solo.values()) / task.num_devices
    largest = largest_memory(task)
    out = {}
    for table in task.tables:
        options = column_options(table, task, largest)
        if not options or solo[table.name] <= average:
            continue
        # equal blocks cost the same: cost the first
        block = {n: est.device_cost(column_pieces(table, n)[:1], None, task) for n in options}
        out[table.name] = fewest_blocks(options, block, average)
    return out


def _cost_greedy(task, seed, est, strategy, columns=None):
    """Cost-greedy over the pieces of `task`, the tables in `columns` ({name: blocks}) cut into
    that many equal column blocks."""
    columns = columns or {}
    widths = {t.name: [t.dim // columns[t.name]] * columns[t.name]
              for t in task.tables if t.name in columns}
    state = Partition(task, columns=widths)

    def key(item):
        return item.table.name, item.index, item.col_offset

    items = split_pieces(task, columns)
    costs = {key(item): est.device_cost([item], None, task) for item in items}
    on_device = [[] for _ in task.devices]
    current = [0.0] * task.num_devices
    for item in _order(items, lambda it: costs[key(it)]):
        candidates = state.candidates(item)
        if not candidates:
            state.unplaced.append(item)
            continue

        def after(d, item=item):
            if est.additive:
                return current[d] + costs[key(item)]
            device = task.devices[d]
            return est.device_cost(on_device[d] + [dataclasses.replace(item, device=device.name)],
                                   device, task)

        scored = {d: after(d) for d in candidates}
        device = min(candidates, key=lambda d: (scored[d], state.used[d], d))
        current[device] = scored[device]
        on_device[device].append(dataclasses.replace(item, device=task.devices[device].name))
        state.put(item, device)
    return state.plan(strategy, seed, est)


# The registry, in the order strategies are listed (and compared): name -> proposer, or
# "module:attr" of one, imported by `get_strategy` on first use.
_STRATEGIES = {
    "random": random_plan,
    "size-greedy": size_greedy,
    "dim-greedy": dim_greedy,
    "lookup-greedy": lookup_greedy,
    "size-lookup-greedy": size_lookup_greedy,
    "capacity-balanced": capacity_balanced,
    "load-balanced": load_balanced,
    "nsbp": network_specific_bin_packing,
    "cost-greedy": cost_greedy,
    "column-greedy": column_greedy,
    "learned": "tfra_dynamic_embedding.placement.policy:learned_plan",
}
# The strategies that take `weights=` (trained weights), which `get_strategy` binds.
_LEARNED = {"learned"}
