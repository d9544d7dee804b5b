"""Capacity model of a parameter-server deployment: for a set of tables and a PS count, the memory
each PS holds, the bytes a training step moves and the CPU each PS spends per step.

The model follows what the native tables and the updates applied on the PS do:

- memory: every key is one record (key, write stamp and count, the row and one row per optimizer
  slot with the mask of slots written, padded to the record's alignment) plus its hash-index
  slot (4 bytes at the index's load);
  keys spread evenly over the PS tasks (`key mod n`);
- bytes per step: per table the batch's unique ids go to their PS twice (lookup, update), their
  rows come back and their gradients go out -- slots never travel -- plus a fixed framing cost
  per PS task and step, and the dense weights that live on the PS tasks (TF1 between-graph);
- PS CPU per step: a fixed cost per PS task and step, a cost per table shard (its lookup and its
  part of the update op) and a cost per row served (looked up and updated).

The per-step constants (`Costs`) are fitted to a measured cluster (`fit` on the JSON of
`benchmarks/ps_training.py`); docs/distributed.md has the check against measured clusters and a
worked deployment.

Example:
    >>> tables = [TableLoad("user", rows=10**6, dim=16, ids_per_step=4096, optimizer="adam")]
    >>> est = estimate(tables, ps=2, costs=Costs(step_ms=1.0, table_ms=0.1, row_us=0.5,
    ...                                           framing_bytes=1000))
    >>> est.memory_per_ps_bytes // 10**6, int(est.wire_bytes_per_step)
    (111, 591824)
"""

import dataclasses
import json
import math
from typing import List, Sequence

# Optimizer -> slot rows kept per key (table_updates.py's rules; rmsprop: ms and momentum).
SLOTS = {"sgd": 0, "momentum": 1, "adagrad": 1, "adam": 2, "adamw": 2, "ftrl": 2,
         "rmsprop": 2, "rmsprop_centered": 3}
RECORD_HEADER_BYTES = 8   # write stamp and count, after the key
WRITTEN_MASK_BYTES = 2    # slot groups written, in records with slots (in padding if any)
INDEX_SLOT_BYTES = 4
INDEX_LOAD = 0.65         # the index grows at 7/8 load to half that: about 0.44-0.875


@dataclasses.dataclass(frozen=True)
class TableLoad:
    """One embedding table: `rows` keys held, `dim` columns, trained by `optimizer` (a key of
    SLOTS), `ids_per_step` distinct ids per training step (all trainers' steps together when
    they are concurrent), `key_bytes` (8 for int64) and `value_bytes` (4 for float32)."""
    name: str
    rows: int
    dim: int
    ids_per_step: int
    optimizer: str = "adam"
    key_bytes: int = 8
    value_bytes: int = 4

    def __post_init__(self):
        if self.optimizer not in SLOTS:
            raise ValueError(f"optimizer of table {self.name!r} must be one of {sorted(SLOTS)}; "
                             f"got {self.optimizer!r}")
        for field in ("rows", "dim", "ids_per_step"):
            if getattr(self, field) < 0 or (field == "dim" and self.dim < 1):
                raise ValueError(f"{field} of table {self.name!r} must be >= "
                                 f"{1 if field == 'dim' else 0}; got {getattr(self, field)}")

    def record_bytes(self):
        """Bytes of one key's record: key, stamp and count, row and slot rows, aligned."""
        align = max(self.key_bytes if self.key_bytes in (4, 8) else 8, self.value_bytes, 4)
        header = math.ceil(self.key_bytes / 4) * 4 + RECORD_HEADER_BYTES
        start = math.ceil(header / self.value_bytes) * self.value_bytes
        size = start + (1 + SLOTS[self.optimizer]) * self.dim * self.value_bytes
        if SLOTS[self.optimizer] and start - header < WRITTEN_MASK_BYTES:
            size += WRITTEN_MASK_BYTES   # which slots were written, after the rows
        return math.ceil(size / align) * align

    def key_bytes_in_memory(self):
        return self.record_bytes() + INDEX_SLOT_BYTES / INDEX_LOAD


@dataclasses.dataclass(frozen=True)
class Costs:
    """Per-step costs of a PS task, fitted to a measured cluster (`fit`): `step_ms` per task and
    step, `table_ms` per table shard and step, `row_us` per row served (looked up and updated),
    `framing_bytes` of wire overhead per task and step."""
    step_ms: float
    table_ms: float
    row_us: float
    framing_bytes: float


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The model's figures for one deployment (per PS task where named so)."""
    ps: int
    memory_per_ps_bytes: int
    wire_bytes_per_step: float
    min_bytes_per_step: float
    ps_cpu_ms_per_step: float        # of each PS task
    total_ps_cpu_ms_per_step: float

    def as_dict(self):
        return dataclasses.asdict(self)


def min_bytes_per_step(tables):
    """What a step must move at least: unique ids, their rows back, their gradients out."""
    return float(sum(t.ids_per_step * (t.key_bytes + 2 * t.dim * t.value_bytes) for t in tables))


def estimate(tables: Sequence[TableLoad], ps: int, costs: Costs, dense_bytes: float = 0.0):
    """The `Estimate` of `tables` on `ps` PS tasks; `dense_bytes`: the dense weights' bytes
    moved per step when they live on the PS tasks (read and their gradients sent: 2 x 4 B per
    parameter in TF1 between-graph training; 0 when the trainer holds them)."""
    if ps < 1:
        raise ValueError(f"ps must be >= 1; got {ps}")
    memory = sum(math.ceil(t.rows / ps) * t.key_bytes_in_memory() for t in tables)
    wire = sum(t.ids_per_step * (2 * t.key_bytes + 2 * t.dim * t.value_bytes) for t in tables)
    wire += ps * costs.framing_bytes + dense_bytes
    rows_per_ps = sum(t.ids_per_step for t in tables) / ps
    per_ps = costs.step_ms + len(tables) * costs.table_ms + rows_per_ps * costs.row_us / 1e3
    return Estimate(ps=ps, memory_per_ps_bytes=int(memory), wire_bytes_per_step=float(wire),
                    min_bytes_per_step=min_bytes_per_step(tables), ps_cpu_ms_per_step=per_ps,
                    total_ps_cpu_ms_per_step=per_ps * ps)


def fit(measured: List[dict]):
    """`Costs` fitted by least squares to measured clusters: each item a dict with `ps`,
    `tables`, `rows_per_step` (distinct ids of all tables per step), `ps_cpu_ms_per_step` (a
    list, one per PS task), `wire_bytes_per_step` and `payload_bytes_per_step` (the model's
    bytes without framing)."""
    import numpy as np   # pylint: disable=import-outside-toplevel  (only fitting needs it)
    # With one table count measured a fixed cost per task cannot be told from one per table:
    # it is then all per table (what a PS does per table and step -- receive its ids, send its
    # rows -- is what grows with the tables).
    fixed = len({m["tables"] for m in measured}) > 1
    a, b = [], []
    for m in measured:
        for cpu in m["ps_cpu_ms_per_step"]:
            a.append(([1.0] if fixed else []) + [m["tables"], m["rows_per_step"] / m["ps"] / 1e3])
            b.append(cpu)
    solution, *_ = np.linalg.lstsq(np.asarray(a), np.asarray(b), rcond=None)
    step_ms, table_ms, row_us = ([0.0] if not fixed else []) + list(solution)
    framing = float(np.mean([(m["wire_bytes_per_step"] - m["payload_bytes_per_step"]) / m["ps"]
                             for m in measured]))
    return Costs(step_ms=max(0.0, float(step_ms)), table_ms=max(0.0, float(table_ms)),
                 row_us=max(0.0, float(row_us)), framing_bytes=max(0.0, framing))


def load_tables(path):
    """`TableLoad`s from a JSON file: a list of objects with TableLoad's fields."""
    with open(path, encoding="utf-8") as f:
        return [TableLoad(**item) for item in json.load(f)]


# Fitted by `fit` to this repository's measured clusters (benchmarks/ps_training.py; the runs
# and the check of the model against them are in docs/distributed.md). Re-fit them for other
# machines and networks.
MEASURED_COSTS = Costs(step_ms=0.0, table_ms=0.17, row_us=0.47, framing_bytes=10800.0)


def add_parser(subparsers):
    """`tfra-de capacity`: registers the subcommand (see tfra_dynamic_embedding/cli.py)."""
    parser = subparsers.add_parser(
        "capacity", help="predict memory per PS, bytes per step and PS CPU per step",
        description="The capacity model of tfra_dynamic_embedding/distributed/capacity.py for "
                    "one table set (--tables JSON, or one table from --rows/--dim/...) on each "
                    "PS count given.")
    parser.add_argument("--tables", metavar="JSON", help="a JSON list of tables: name, rows, "
                        "dim, ids_per_step, optimizer (default adam), key_bytes, value_bytes")
    parser.add_argument("--rows", type=float, help="one table: keys held (e.g. 1e10)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--optimizer", default="adam", choices=sorted(SLOTS))
    parser.add_argument("--ids-per-step", type=float, default=65536,
                        help="one table: distinct ids per step")
    parser.add_argument("--ps", default="1,2,4", help="PS counts, comma-separated")
    parser.add_argument("--dense-bytes", type=float, default=0.0,
                        help="dense weights' bytes moved per step (TF1: 8 x parameters)")
    parser.set_defaults(run=run)
    return parser


def run(args):
    """Prints one JSON line per PS count; returns the exit code."""
    if args.tables:
        tables = load_tables(args.tables)
    elif args.rows is not None:
        tables = [TableLoad("table", rows=int(args.rows), dim=args.dim,
                            ids_per_step=int(args.ids_per_step), optimizer=args.optimizer)]
    else:
        raise ValueError("give --tables JSON or --rows (with --dim, --optimizer, "
                         "--ids-per-step)")
    for ps in (int(p) for p in args.ps.split(",")):
        print(json.dumps(estimate(tables, ps, MEASURED_COSTS, args.dense_bytes).as_dict()))
    return 0
