"""Pieces of a task and their partition under memory: the stage every proposer builds on.

A piece is a `types.Shard` not yet on a device: a whole table, row slice i of n of a table
bigger than the largest device (slice i: keys with key % n == i; the fewest slices that fit,
`min_slices`), or -- where a proposer asks for it -- a column block of a wide table.

Column splits (TorchRec's column-wise sharding): a table of dim >= MIN_COLUMN_DIM that fits a
device whole may be cut into n equal blocks of every row, n dividing dim, each block at least
MIN_COLUMN_BLOCK columns wide and n at most the number of devices (`column_splits`). Blocks lie
on distinct devices and lookups concatenate them. Each block hashes and probes every key
itself, so a split pays only for wide, hot tables (estimators.AnalyticEstimator.probe_bytes);
tables too big for a device are cut by rows instead (never by rows and columns).

A `Partition` puts pieces on devices, refuses what does not fit and turns the result into a
`Plan`, or into a `PlacementError` naming the pieces left over and the shortfall.

Example:
    >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
    >>> task = Task([TableSpec("ad", rows=10**6, dim=128), TableSpec("user", rows=100, dim=16)],
    ...             make_devices(8, "1GiB"))
    >>> state = Partition(task)
    >>> for piece in split_pieces(task):
    ...     state.put(piece, state.candidates(piece)[0])
    >>> state.plan("first-fit", seed=0).assignment
    {'ad': ['/job:ps/task:0'], 'user': ['/job:ps/task:0']}
    >>> column_splits(task.table("ad"), task)             # block counts, on 8 devices
    [2, 4, 8]
"""

import math

from absl import logging

from tfra_dynamic_embedding.placement.types import PlacementError, Plan, Shard, format_bytes

# Column splits: only tables at least this wide, into blocks at least this wide (TorchRec's
# min column block; a narrower block would mostly probe keys and move little data).
MIN_COLUMN_DIM = 64
MIN_COLUMN_BLOCK = 16


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


def column_splits(table, task, largest=None):
    """Numbers of equal column blocks `table` may be cut into on `task` (see the module
    docstring): n >= 2 dividing dim, dim / n >= MIN_COLUMN_BLOCK, n <= devices; [] for tables
    narrower than MIN_COLUMN_DIM or that fit no device whole (those are cut by rows).

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> column_splits(TableSpec("ad", rows=10**6, dim=128), Task([], make_devices(8)))
        [2, 4, 8]
        >>> column_splits(TableSpec("ad", rows=10**6, dim=96), Task([], make_devices(4)))
        [2, 3, 4]
    """
    if table.dim < MIN_COLUMN_DIM or min_slices(table, task, largest) > 1:
        return []
    return [n for n in range(2, min(task.num_devices, table.dim // MIN_COLUMN_BLOCK) + 1)
            if table.dim % n == 0]


def column_options(table, task, largest=None):
    """The `column_splits` of `table` into n blocks for which n devices of `task` have room
    for a block (blocks go to distinct devices).

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> ad = TableSpec("ad", rows=10**6, dim=128)                    # 512 MB
        >>> column_options(ad, Task([ad], make_devices(8, "1GiB")))
        [2, 4, 8]
        >>> small = make_devices(7, "100MiB", "/GPU:{i}")             # 1 device of 1 GiB, 7 small
        >>> column_options(ad, Task([ad], make_devices(1, "1GiB") + small))
        [8]
    """
    return [n for n in column_splits(table, task, largest) if n <= sum(
        d.memory_bytes is None or table.size_bytes // n <= d.memory_bytes for d in task.devices)]


def fewest_blocks(options, block_cost, limit):
    """Of the block counts `options`, the fewest whose block costs at most `limit`
    (`block_cost`: {n: cost of one of n equal blocks}), else the one whose block costs least.

    Example:
        >>> fewest_blocks([2, 4, 8], {2: 5.0, 4: 3.0, 8: 2.5}, 3.2)
        4
    """
    within = [n for n in options if block_cost[n] <= limit]
    return within[0] if within else min(options, key=lambda n: (block_cost[n], n))


def column_pieces(table, num_blocks):
    """The `num_blocks` equal column blocks of `table`, unplaced, left to right."""
    if num_blocks < 2 or table.dim % num_blocks:
        raise ValueError(f"num_blocks of table {table.name!r} must be >= 2 and divide its dim "
                         f"{table.dim}; got {num_blocks!r}")
    width = table.dim // num_blocks
    return [Shard(table, "", col_offset=j * width, col_width=width) for j in range(num_blocks)]


def split_pieces(task, columns=None):
    """All pieces of a task, unplaced (`Shard.device` ""): one per table, or its minimal row
    slices when it fits no device, or for the tables in `columns` ({name: number of blocks})
    their equal column blocks."""
    items = []
    columns = columns or {}
    largest = largest_memory(task)
    for table in task.tables:
        if table.name in columns:
            items.extend(column_pieces(table, columns[table.name]))
            continue
        n = min_slices(table, task, largest)
        if n > 1:
            logging.info("table %s (%s) is split row-wise into %d slices", table.name,
                         format_bytes(table.size_bytes), n)
        items.extend(Shard(table, "", i, n) for i in range(n))
    return items


class Partition:
    """Pieces put on devices under memory limits, so far: memory used and balance load per device;
    `plan()` is the Plan, or the PlacementError naming the pieces left in `unplaced`."""

    def __init__(self, task, slices=None, columns=None):
        """`slices`: {table name: row slices} where a planner cuts a table finer than
        `min_slices`; `columns`: {table name: column widths} of the tables it cuts by columns."""
        self.task = task
        slices = slices or {}
        self.columns = {name: list(widths) for name, widths in (columns or {}).items()}
        self.capacity = [math.inf if d.memory_bytes is None else d.memory_bytes
                         for d in task.devices]
        self.used = [0] * task.num_devices
        self.load = [0.0] * task.num_devices
        largest = largest_memory(task)
        self.placed = {t.name: [None] * (len(self.columns[t.name]) if t.name in self.columns
                                         else slices[t.name] if t.name in slices
                                         else min_slices(t, task, largest))
                       for t in task.tables}
        self.unplaced = []

    def candidates(self, item):
        """Devices with room for `item` that hold no other piece of its table."""
        taken = set(self.placed[item.table.name])
        return [d for d in range(self.task.num_devices)
                if d not in taken and self.used[d] + item.size_bytes <= self.capacity[d]]

    def put(self, item, device, load=0.0):
        self.placed[item.table.name][self._position(item)] = device
        self.used[device] += item.size_bytes
        self.load[device] += load

    def _position(self, item):
        """The piece's place in its table's device list: row slice index, or block number."""
        if not item.is_column_block:
            return item.index
        widths = self.columns[item.table.name]
        return [sum(widths[:j]) for j in range(len(widths))].index(item.col_offset)

    def plan(self, strategy, seed, estimator=None):
        if self.unplaced:
            raise _infeasible(self)
        names = [d.name for d in self.task.devices]
        assignment = {t: [names[d] for d in devices] for t, devices in self.placed.items()}
        return Plan(self.task, assignment, strategy=strategy,
                    estimator=getattr(estimator, "name", None), meta={"seed": seed},
                    columns=self.columns)


def _infeasible(state):
    task = state.task
    total = sum(t.size_bytes for t in task.tables)
    capacity = sum(state.capacity)
    parts, worst = [], 0
    for item in state.unplaced:
        free = [(state.capacity[d] - state.used[d], task.devices[d].name)
                for d in range(task.num_devices)]
        best_free, where = max(free, key=lambda x: x[0])  # first device on ties
        worst = max(worst, item.size_bytes - best_free)
        piece = (f"{item.table.name}[columns {item.col_offset}:"
                 f"{item.col_offset + item.col_width}]" if item.is_column_block else
                 item.table.name if item.num_slices == 1 else
                 f"{item.table.name}[slice {item.index}/{item.num_slices}]")
        parts.append(f"{piece} ({format_bytes(item.size_bytes)}; largest free space "
                     f"{format_bytes(best_free)} on {where})")
    shortfall = max(worst, total - capacity)
    names = sorted({item.table.name for item in state.unplaced})
    message = (f"cannot place {len(names)} of {len(task.tables)} tables on "
               f"{task.num_devices} devices: " + "; ".join(parts[:20]) +
               (f"; ... {len(parts) - 20} more" if len(parts) > 20 else "") +
               f". Shortfall {format_bytes(shortfall)} (tables need {format_bytes(total)}, "
               f"devices hold {format_bytes(capacity)})")
    return PlacementError(message, names, shortfall)
