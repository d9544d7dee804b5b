"""Plain data of the placement planner (tables, devices, tasks, plans; JSON in and out) and the
interfaces of its stages.

A plan places each table whole, cut by rows (slice i of n: the keys with key % n == i), or cut by
columns (blocks of columns, each holding every row); the pieces of a table lie on distinct devices.

Every stage of the planner (workloads -> features -> estimator -> proposer -> evaluate -> apply)
passes these dataclasses, so each stage can be tested alone and a plan can be saved, read and
edited by a person, then applied again. The stages `planner.Planner` composes each have one
interface here: `Estimator` (what a device costs), `Proposer` (a strategy placing a task) and
`Judge` (which estimator scores the candidate plans).

Example:
    >>> tables = [TableSpec("user", rows=1_000_000, dim=16, pooling_factor=3.0)]
    >>> task = Task(tables, make_devices(2, memory="1GiB"))
    >>> plan = Plan(task, {"user": ["/job:ps/task:1"]}, strategy="by-hand")
    >>> Plan.from_json(plan.to_json()).devices_for("user")
    ['/job:ps/task:1']
    >>> wide = Plan(task, {"user": ["/job:ps/task:0", "/job:ps/task:1"]}, columns={"user": [8, 8]})
    >>> wide.column_blocks("user")
    [(8, '/job:ps/task:0'), (8, '/job:ps/task:1')]
"""

import dataclasses
import hashlib
import json
import math
import re
from typing import Dict, List, Optional, Protocol, runtime_checkable

NUM_REUSE_BINS = 17
# Upper edges of the reuse bins (0,1], (1,2], (2,4], ..., (16384,32768], (32768,inf).
REUSE_BIN_EDGES = tuple([0] + [2 ** i for i in range(16)] + [math.inf])
REUSE_BIN_LABELS = tuple(
    f"({REUSE_BIN_EDGES[i]}, {REUSE_BIN_EDGES[i + 1]}]" if i < 16 else "(32768, inf)"
    for i in range(NUM_REUSE_BINS))
PLAN_FORMAT = "tfra-de-plan/1"
# Written instead of PLAN_FORMAT by plans with column splits, so that a reader that predates them
# refuses the file rather than taking column blocks for row slices; both are read.
PLAN_FORMAT_COLUMNS = "tfra-de-plan/2"
TASK_FORMAT = "tfra-de-task/1"

_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40,
          "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


class PlacementError(ValueError):
    """A task that cannot be placed: names the tables left over and the memory shortfall.

    Attributes: `tables` (names not placed) and `shortfall_bytes` (how much memory is missing).
    """

    def __init__(self, message, tables=(), shortfall_bytes=0):
        super().__init__(message)
        self.tables = list(tables)
        self.shortfall_bytes = int(shortfall_bytes)


def parse_bytes(value, arg="memory"):
    """Bytes from an int or a string like '16GiB', '1.5 GB', '512MiB', '1e9'.

    None stays None (no limit).

    Example:
        >>> parse_bytes("16GiB"), parse_bytes("1.5 GB"), parse_bytes(None)
        (17179869184, 1500000000, None)
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{arg} must be a number of bytes or a string like '16GiB'; got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
        if not match or match.group(2).upper() not in _UNITS:
            raise ValueError(f"{arg} must be a number of bytes or a string like '16GiB' "
                             f"(units {sorted(k for k in _UNITS if k)}); got {value!r}")
        number, unit = float(match.group(1)), match.group(2).upper()
    result = number * _UNITS[unit]
    if not math.isfinite(result) or result < 0:
        raise ValueError(f"{arg} must be a non-negative finite size; got {value!r}")
    return int(round(result))


def format_bytes(n):
    """A short human-readable size: format_bytes(3 * 2**30) -> '3.00 GiB'."""
    if n is None:
        return "unlimited"
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _check_int(value, arg, minimum):
    try:
        as_int = int(value)
        ok = not isinstance(value, (bool, str)) and as_int == value
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok or as_int < minimum:
        raise ValueError(f"{arg} must be an integer >= {minimum}; got {value!r}")
    return as_int


@dataclasses.dataclass
class TableSpec:
    """One embedding table as the planner sees it.

    Attributes:
      name: unique name; for `apply` it is the (variable-scope qualified) `de.get_variable` name.
      rows: hash size (number of rows / key capacity), >= 1.
      dim: embedding dimension, >= 1.
      bytes_per_value: bytes of one value (4 for float32, 2 for float16).
      pooling_factor: mean number of lookups per sample (>= 0).
      reuse_histogram: 17 shares summing to 1: the share of lookups that hit indices reused
        (0,1], (1,2], (2,4], ... , (32768, inf) times within a batch; None if unknown.
      group: optional network tag (for network-specific bin packing).
      stream: optional reference to an index stream, a JSON dict with a "kind" key (see
        `workloads.open_stream`), e.g. {"kind": "synthetic", "seed": 3, ...}.

    Example:
        >>> TableSpec("ad_id", rows=10**6, dim=32, pooling_factor=1.0).size_bytes
        128000000
    """

    name: str
    rows: int
    dim: int
    bytes_per_value: int = 4
    pooling_factor: float = 1.0
    reuse_histogram: Optional[List[float]] = None
    group: Optional[str] = None
    stream: Optional[dict] = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"TableSpec.name must be a non-empty string; got {self.name!r}")
        self.rows = _check_int(self.rows, f"rows of table {self.name!r}", 1)
        self.dim = _check_int(self.dim, f"dim of table {self.name!r}", 1)
        self.bytes_per_value = _check_int(self.bytes_per_value,
                                          f"bytes_per_value of table {self.name!r}", 1)
        pooling = float(self.pooling_factor)
        if not math.isfinite(pooling) or pooling < 0:
            raise ValueError(f"pooling_factor of table {self.name!r} must be >= 0; "
                             f"got {self.pooling_factor!r}")
        self.pooling_factor = pooling
        if self.reuse_histogram is not None:
            hist = [float(x) for x in self.reuse_histogram]
            total = sum(hist)
            if len(hist) != NUM_REUSE_BINS or min(hist) < 0 or not (
                    abs(total - 1.0) <= 1e-3 or total == 0.0):
                raise ValueError(
                    f"reuse_histogram of table {self.name!r} must be {NUM_REUSE_BINS} "
                    f"non-negative shares summing to 1 (or all 0); got {self.reuse_histogram!r}")
            self.reuse_histogram = hist
        if self.group is not None and not isinstance(self.group, str):
            self.group = str(self.group)
        if self.stream is not None and not (isinstance(self.stream, dict) and "kind" in self.stream):
            raise ValueError(f"stream of table {self.name!r} must be a dict with a 'kind' key; "
                             f"got {self.stream!r}")

    @property
    def size_bytes(self):
        """Memory of the whole table: rows * dim * bytes_per_value."""
        return self.rows * self.dim * self.bytes_per_value

    def slice_rows(self, index, num_slices):
        """Rows of row-slice `index` of `num_slices` (keys with key % num_slices == index)."""
        return self.rows // num_slices + (1 if index < self.rows % num_slices else 0)

    def slice_bytes(self, index, num_slices):
        return self.slice_rows(index, num_slices) * self.dim * self.bytes_per_value

    def to_dict(self):
        out = {"name": self.name, "rows": self.rows, "dim": self.dim,
               "bytes_per_value": self.bytes_per_value, "pooling_factor": self.pooling_factor}
        for key in ("reuse_histogram", "group", "stream"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_dict(cls, data):
        if not isinstance(data, dict):
            raise ValueError(f"a table must be a JSON object; got {data!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        aliases = {"hash_size": "rows", "row": "rows", "pooling": "pooling_factor",
                   "network": "group", "tag": "group"}
        kwargs = {}
        for key, value in data.items():
            key = aliases.get(key, key)
            if key in known:
                kwargs[key] = value
        missing = [k for k in ("name", "rows", "dim") if k not in kwargs]
        if missing:
            raise ValueError(f"table {data.get('name', data)!r} lacks {missing}")
        return cls(**kwargs)


@dataclasses.dataclass
class DeviceSpec:
    """A device or parameter-server task that can hold tables.

    `name` is a TensorFlow device string ('/job:ps/task:0', '/GPU:1', '/CPU:0');
    `memory_bytes` is its memory for tables (None: unlimited). A string like '16GiB' is accepted.
    """

    name: str
    memory_bytes: Optional[int] = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"DeviceSpec.name must be a non-empty string; got {self.name!r}")
        self.memory_bytes = parse_bytes(self.memory_bytes, f"memory of device {self.name!r}")

    def to_dict(self):
        out = {"name": self.name, "memory_bytes": self.memory_bytes}
        if self.memory_bytes is not None:
            out["memory"] = format_bytes(self.memory_bytes)
        return out

    @classmethod
    def from_dict(cls, data):
        if isinstance(data, str):
            return cls(data)
        memory = data.get("memory_bytes", data.get("memory"))
        return cls(data["name"], memory)


def make_devices(num_devices, memory=None, template="/job:ps/task:{i}"):
    """`num_devices` DeviceSpecs named by `template`: make_devices(2, '8GiB', '/GPU:{i}')."""
    num_devices = _check_int(num_devices, "num_devices", 1)
    return [DeviceSpec(template.format(i=i), parse_bytes(memory)) for i in range(num_devices)]


@dataclasses.dataclass
class Task:
    """A placement problem: tables to place on devices; `batch_size` is the training batch.

    Example:
        >>> Task([TableSpec("a", 10, 4)], make_devices(2)).num_devices
        2
    """

    tables: List[TableSpec]
    devices: List[DeviceSpec]
    batch_size: int = 65536
    name: str = ""

    def __post_init__(self):
        self.tables = [t if isinstance(t, TableSpec) else TableSpec.from_dict(t) for t in self.tables]
        self.devices = [d if isinstance(d, DeviceSpec) else DeviceSpec.from_dict(d)
                        for d in self.devices]
        if not self.devices:
            raise ValueError("a Task needs at least one device; got devices=[]")
        self.batch_size = _check_int(self.batch_size, "batch_size", 1)
        for kind, names in (("table", [t.name for t in self.tables]),
                            ("device", [d.name for d in self.devices])):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{kind} names must be unique; repeated: {dupes}")

    @property
    def num_devices(self):
        return len(self.devices)

    def table(self, name):
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(f"no table named {name!r} in the task (tables: "
                       f"{[t.name for t in self.tables][:10]}...)")

    def to_dict(self):
        return {"format": TASK_FORMAT, "name": self.name, "batch_size": self.batch_size,
                "devices": [d.to_dict() for d in self.devices],
                "tables": [t.to_dict() for t in self.tables]}

    @classmethod
    def from_dict(cls, data):
        return cls(tables=[TableSpec.from_dict(t) for t in data["tables"]],
                   devices=[DeviceSpec.from_dict(d) for d in data["devices"]],
                   batch_size=data.get("batch_size", 65536), name=data.get("name", ""))

    def save(self, path):
        _write_json(path, self.to_dict())

    @classmethod
    def load(cls, path):
        return cls.from_dict(_read_json(path))


@dataclasses.dataclass
class DeviceCost:
    """What a plan says about one device: memory used and predicted / measured cost (seconds)."""

    memory_bytes: int = 0
    predicted_cost: Optional[float] = None
    measured_cost: Optional[float] = None


# (id of a whole table, width) -> (the table, its fields then, the block spec): one spec object per
# block, so that caches keyed by the spec's id (the learned cost model's) keep hitting.
_BLOCK_SPECS = {}


def column_block_spec(table, width):
    """The spec of a column block of `table`: the same table (name, rows, pooling, reuse) with
    dim = `width`. Every estimator costs a block through it (`Shard.table`), so the analytic,
    learned and measured estimators all see the block's width.

    Example:
        >>> column_block_spec(TableSpec("ad", rows=10, dim=128), 32).dim
        32
    """
    if width == table.dim:
        return table
    fields = (table.name, table.rows, table.bytes_per_value, table.pooling_factor,
              table.reuse_histogram, table.group, table.stream)
    key = (id(table), width)
    hit = _BLOCK_SPECS.get(key)
    if hit is None or hit[0] is not table or hit[1] != fields:
        if len(_BLOCK_SPECS) > 10_000:
            _BLOCK_SPECS.clear()
        hit = (table, fields, dataclasses.replace(table, dim=width))
        _BLOCK_SPECS[key] = hit
    return hit[2]


@dataclasses.dataclass
class Shard:
    """One placed piece of table `source`: the whole table, row slice `index` of `num_slices`
    (the keys with key % num_slices == index), or a column block -- columns
    [col_offset, col_offset + col_width) of every row. A piece is cut by rows or by columns,
    never both.

    `table` is the spec of what the piece holds, the one every estimator costs: `source` itself,
    or for a column block `column_block_spec(source, col_width)` (dim = col_width).

    Example:
        >>> spec = TableSpec("ad", rows=10, dim=128)
        >>> Shard(spec, "/GPU:0", 1, 4).size_bytes                  # row slice 1 of 4: 3 rows
        1536
        >>> Shard(spec, "/GPU:1", col_offset=64, col_width=64).table.dim
        64
    """

    source: TableSpec
    device: str
    index: int = 0
    num_slices: int = 1
    col_offset: int = 0
    col_width: Optional[int] = None   # None: the whole dim

    def __post_init__(self):
        dim = self.source.dim
        if self.col_width is None:
            self.col_width = dim
        if not (0 <= self.col_offset < dim and 1 <= self.col_width <= dim - self.col_offset):
            raise ValueError(f"column block of table {self.source.name!r} (dim {dim}) must lie "
                             f"within its columns; got col_offset={self.col_offset!r}, "
                             f"col_width={self.col_width!r}")
        if self.is_column_block and self.num_slices != 1:
            raise ValueError(f"a piece of table {self.source.name!r} is cut by rows or by "
                             f"columns, not both; got {self.num_slices} row slices and "
                             f"col_width={self.col_width} of dim {dim}")

    @property
    def table(self):
        """The spec of this piece's rows: `source`, narrowed to the block for a column block."""
        return column_block_spec(self.source, self.col_width)

    @property
    def is_column_block(self):
        return self.col_width < self.source.dim

    @property
    def fraction(self):
        """Share of the table's rows (keys) this piece holds: 1 for a column block."""
        return self.source.slice_rows(self.index, self.num_slices) / self.source.rows

    @property
    def size_bytes(self):
        return self.table.slice_bytes(self.index, self.num_slices)


@dataclasses.dataclass
class Plan:
    """Each table -> the devices of its pieces: its row slices, or its column blocks.

    `assignment[name]` lists one device per piece, on distinct devices. One entry: the table is
    whole. Several: its row slices -- slice i holds the keys with key % n == i -- unless
    `columns[name]` lists column widths (summing to the table's dim): then block j holds
    columns [sum(widths[:j]), sum(widths[:j + 1])) of every row, on `assignment[name][j]`.
    A table is cut by rows or by columns, not both. `per_device` carries memory and predicted /
    measured costs.

    Example:
        >>> task = Task([TableSpec("user", 10, 8), TableSpec("item", 10, 8),
        ...              TableSpec("ad", 10, 128)], make_devices(2, template="/GPU:{i}"))
        >>> plan = Plan(task, {"user": ["/GPU:0"], "item": ["/GPU:0", "/GPU:1"],
        ...                    "ad": ["/GPU:1", "/GPU:0"]}, columns={"ad": [64, 64]})
        >>> plan.devices_for("item")      # keys mod 2 pick the slice
        ['/GPU:0', '/GPU:1']
        >>> plan.column_blocks("ad")      # lookups concatenate the blocks
        [(64, '/GPU:1'), (64, '/GPU:0')]
    """

    task: Task
    assignment: Dict[str, List[str]]
    strategy: str = ""
    estimator: Optional[str] = None
    per_device: Dict[str, DeviceCost] = dataclasses.field(default_factory=dict)
    meta: dict = dataclasses.field(default_factory=dict)
    columns: Dict[str, List[int]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.assignment = {k: [v] if isinstance(v, str) else list(v)
                           for k, v in self.assignment.items()}
        self.columns = {k: list(v) if isinstance(v, (list, tuple)) else v   # validate() names
                        for k, v in (self.columns or {}).items()}                 # a bad value
        self.validate(check_memory=False)
        memory = self.memory_by_device()
        given = self.per_device
        self.per_device = {}
        for device in self.task.devices:  # one entry per task device, memory recomputed
            cost = given.get(device.name) or DeviceCost()
            cost = DeviceCost(**cost) if isinstance(cost, dict) else cost
            cost.memory_bytes = memory[device.name]
            self.per_device[device.name] = cost

    # -- queries --------------------------------------------------------------------------
    def devices_for(self, name):
        """Devices of table `name`, one per row slice (the `devices=` of `de.get_variable`), or
        for a table split by columns one per column block."""
        if name not in self.assignment:
            raise KeyError(f"table {name!r} is not in the plan (tables: "
                           f"{sorted(self.assignment)[:10]})")
        return list(self.assignment[name])

    def num_slices(self, name):
        """Row slices of table `name` (1 for a whole table and for a table split by columns)."""
        devices = self.devices_for(name)
        return 1 if name in self.columns else len(devices)

    def column_blocks(self, name):
        """[(width, device)] of the column blocks of table `name`, left to right; [] when the
        plan does not split it by columns."""
        devices = self.devices_for(name)
        return list(zip(self.columns[name], devices)) if name in self.columns else []

    def shards(self):
        """All placed pieces, in table order (a table's slices or blocks in order)."""
        out = []
        for t in self.task.tables:
            devices = self.assignment[t.name]
            if t.name in self.columns:
                offsets = _offsets(self.columns[t.name])
                out += [Shard(t, device, col_offset=offset, col_width=width) for device, offset,
                        width in zip(devices, offsets, self.columns[t.name])]
            else:
                out += [Shard(t, device, i, len(devices)) for i, device in enumerate(devices)]
        return out

    def shards_by_device(self):
        """{device name: its pieces}, every device of the task (empty list where none)."""
        by_device = {d.name: [] for d in self.task.devices}
        for shard in self.shards():
            by_device[shard.device].append(shard)
        return by_device

    def shards_on(self, device):
        return [s for s in self.shards() if s.device == device]

    def memory_by_device(self):
        memory = {d.name: 0 for d in self.task.devices}
        for shard in self.shards():
            memory[shard.device] += shard.size_bytes
        return memory

    def digest(self):
        """A short fingerprint of the assignment and column splits (costs saved with a plan
        belong to it)."""
        placed = {"assignment": self.assignment, "columns": self.columns} if self.columns \
            else self.assignment   # plans without column splits keep their fingerprints
        text = json.dumps(placed, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    # -- checks -----------------------------------------------------------------------------
    def validate(self, check_memory=True):
        """Raises ValueError for unknown/missing tables or devices, PlacementError for memory."""
        rows = {t.name: t.rows for t in self.task.tables}
        names = set(rows)
        devices = {d.name for d in self.task.devices}
        unknown = sorted(set(self.assignment) - names)
        missing = sorted(names - set(self.assignment))
        if unknown or missing:
            raise ValueError(f"plan assignment must list every task table once; unknown tables "
                             f"{unknown}, unplaced tables {missing}")
        unknown = sorted(set(self.columns) - names)
        if unknown:
            raise ValueError(f"plan columns name tables not in the task: {unknown}")
        for name, placed in self.assignment.items():
            if not placed:
                raise ValueError(f"table {name!r} is assigned to no device")
            bad = [d for d in placed if d not in devices]
            if bad:
                raise ValueError(f"table {name!r} is assigned to unknown devices {bad}; "
                                 f"devices are {sorted(devices)}")
            if name in self.columns:
                self._validate_columns(name, placed)
                continue
            if len(set(placed)) != len(placed):
                raise ValueError(f"row slices of table {name!r} must lie on distinct devices; "
                                 f"got {placed}")
            if len(placed) > rows[name]:
                raise ValueError(f"table {name!r} has {rows[name]} rows, fewer "
                                 f"than its {len(placed)} slices")
        if check_memory:
            memory = self.memory_by_device()
            over = [(d, memory[d.name] - d.memory_bytes) for d in self.task.devices
                    if d.memory_bytes is not None and memory[d.name] > d.memory_bytes]
            if over:
                culprits = sorted({s.table.name for d, _ in over for s in self.shards_on(d.name)})
                detail = "; ".join(f"{d.name} over by {format_bytes(x)}" for d, x in over)
                raise PlacementError(f"plan exceeds device memory: {detail} (tables there: "
                                     f"{culprits})", culprits, sum(x for _, x in over))
        return self

    def _validate_columns(self, name, placed):
        widths, dim = self.columns[name], self.task.table(name).dim
        if not isinstance(widths, list) or len(widths) < 2 or not all(
                isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths):
            raise ValueError(f"column widths of table {name!r} must be a list of at least 2 "
                             f"positive integers; got {widths!r}")
        if sum(widths) != dim:
            raise ValueError(f"column widths of table {name!r} must sum to its dim {dim}; got "
                             f"{widths} (sum {sum(widths)})")
        if len(placed) != len(widths):
            raise ValueError(f"table {name!r} is split into {len(widths)} column blocks "
                             f"{widths} but assigned {len(placed)} devices {placed}: give one "
                             f"device per block (a table is cut by rows or by columns, not both)")
        if len(set(placed)) != len(placed):
            raise ValueError(f"column blocks of table {name!r} must lie on distinct devices; "
                             f"got {placed}")

    # -- applying (TensorFlow is imported only here) ------------------------------------------
    def partitioner_for(self, name):
        """None for a whole table, else the key-mod partitioner consistent with the slices."""
        from tfra_dynamic_embedding.placement import apply  # pylint: disable=import-outside-toplevel
        return apply.partitioner_for(self, name)

    def scope(self, strict=False):
        """`with plan.scope():` -- `de.get_variable` takes devices (and slices) from the plan."""
        from tfra_dynamic_embedding.placement import apply  # pylint: disable=import-outside-toplevel
        return apply.plan_scope(self, strict=strict)

    # -- JSON -------------------------------------------------------------------------------
    def to_dict(self):
        """JSON data; "columns" ({table: widths}) only when some table is split by columns."""
        out = {
            "format": PLAN_FORMAT_COLUMNS if self.columns else PLAN_FORMAT,
            "strategy": self.strategy, "estimator": self.estimator,
            "batch_size": self.task.batch_size, "task_name": self.task.name,
            "devices": [d.to_dict() for d in self.task.devices],
            "assignment": {t.name: self.assignment[t.name] for t in self.task.tables},
            "per_device": {name: dataclasses.asdict(cost) for name, cost in self.per_device.items()},
            "costs_digest": self.digest(),
            "meta": self.meta,
            "tables": [t.to_dict() for t in self.task.tables],
        }
        if self.columns:
            out["columns"] = {t.name: self.columns[t.name] for t in self.task.tables
                              if t.name in self.columns}
        return out

    @classmethod
    def from_dict(cls, data):
        """A plan from JSON; costs saved for another assignment (a hand edit) are dropped."""
        if data.get("format") not in (PLAN_FORMAT, PLAN_FORMAT_COLUMNS):
            raise ValueError(f"not a plan file: format must be {PLAN_FORMAT!r} or "
                             f"{PLAN_FORMAT_COLUMNS!r}; got {data.get('format')!r}")
        task = Task(tables=data["tables"], devices=data["devices"],
                    batch_size=data.get("batch_size", 65536), name=data.get("task_name", ""))
        per_device = {k: DeviceCost(**v) for k, v in data.get("per_device", {}).items()}
        plan = cls(task, data["assignment"], strategy=data.get("strategy", ""),
                   estimator=data.get("estimator"), per_device=per_device,
                   meta=dict(data.get("meta", {})), columns=data.get("columns") or {})
        if data.get("costs_digest") not in (None, plan.digest()):
            for cost in plan.per_device.values():
                cost.predicted_cost = cost.measured_cost = None
            plan.meta["edited"] = True
        return plan

    def to_json(self):
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, text):
        return cls.from_dict(json.loads(text))

    def save(self, path):
        _write_json(path, self.to_dict())

    @classmethod
    def load(cls, path):
        return cls.from_dict(_read_json(path))


def _offsets(widths):
    """First column of each block: _offsets([64, 32, 32]) -> [0, 64, 96]."""
    return [sum(widths[:j]) for j in range(len(widths))]


def _write_json(path, data):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error


# -- the stages' interfaces (`planner.Planner` composes them) --------------------------------------
@runtime_checkable
class Estimator(Protocol):
    """What the shards on one device cost, in seconds per training step. The built-in ones
    subclass `estimators.CostEstimator` and are named in its registry (`get_estimator`); one
    with `measure_plans(plans)` measures several plans' devices together (a planner's verifier).

    Example:
        >>> from tfra_dynamic_embedding.placement import estimators
        >>> task = Task([TableSpec("a", rows=1000, dim=16)], make_devices(2))
        >>> analytic = estimators.get_estimator("analytic")
        >>> isinstance(analytic, Estimator)
        True
        >>> analytic.plan_costs(Plan(task, {"a": ["/job:ps/task:0"]}))   # seconds per step
        {'/job:ps/task:0': ..., '/job:ps/task:1': 0.0}
    """

    name: str

    def device_cost(self, shards, device, task) -> float:
        """Cost of `shards` (a list of Shard) run together on `device` (a DeviceSpec, or None
        alone) in `task` (for its batch size)."""

    def plan_costs(self, plan) -> Dict[str, float]:
        """{device name: cost} of every device of `plan`."""


@runtime_checkable
class Proposer(Protocol):
    """A strategy placing a task: `proposers.py` names them. `estimator` serves those that place
    by estimated cost; a learned one also takes `weights=` (a directory of trained weights),
    which `proposers.get_strategy(name, weights)` binds.

    Example:
        >>> from tfra_dynamic_embedding.placement import proposers
        >>> task = Task([TableSpec("a", 1000, 16), TableSpec("b", 1000, 16)], make_devices(2))
        >>> proposers.get_strategy("lookup-greedy")(task, seed=0).assignment
        {'a': ['/job:ps/task:0'], 'b': ['/job:ps/task:1']}
    """

    def __call__(self, task, seed=0, estimator=None) -> "Plan":
        """A Plan of `task` (raises PlacementError when its tables do not fit)."""


@runtime_checkable
class Judge(Protocol):
    """Which estimator scores a task's candidate plans, given the one the proposers used and the
    planner's learned weights (None: the shipped ones). The default, `planner.default_judge`,
    keeps the proposers' estimator unless it is a learned one extrapolating far.

    Example:
        >>> from tfra_dynamic_embedding.placement import Planner
        >>> task = Task([TableSpec("a", 1000, 16), TableSpec("b", 1000, 16)], make_devices(2))
        >>> Planner(judge=lambda task, estimator, weights: "analytic").plan(task).estimator
        'analytic'
    """

    def __call__(self, task, estimator, weights=None) -> "Estimator | str":
        """An Estimator, or an estimator's registered name."""
