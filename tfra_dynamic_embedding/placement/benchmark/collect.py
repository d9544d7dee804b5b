"""`tfra-de benchmark collect`: measured shard records (JSONL) for training the cost model.

    tfra-de benchmark collect --records 1000 --out cpu_shards.jsonl --pool-seed 0 \
        --batch-size 1024 --max-tables-per-shard 8

Record r (r = 0 .. N-1) is a shard drawn from a seeded, down-scaled MetaSyn-like pool
(`workloads.generate_pool(pool_tables, seed=pool_seed, batch_size=B, row_scale=row_scale)`),
its source cycling through:
  random     k ~ U{1..K} tables drawn from the pool;
  heuristic  a random task (2-6 devices, tables from the pool) placed by a greedy heuristic of
             proposers.py; the shard is one device's tables;
  plan       the same with a random plan (the "random" strategy);
  policy     the same placed by the learned policy (strategy "learned", its shipped weights);
  sliced     like random, but each table is, with probability 1/2, one row slice of 2-8 (the
             pieces the learned policy cuts hot tables into);
  task       one whole device of a task shaped like the placement evaluation's (80 tables on 8
             devices of 256 MiB, fewer tables if the pool is smaller), planned by a strategy
             of TASK_STRATEGIES (the learned one half the time: its own plans are where a cost
             model's errors matter, DreamShard's on-policy data); all its shards are kept, so
             these shards hold ~10-20 pieces where the other sources stop at K.
             With `--whole-plans` every device of the plan is kept, measured together
             (`tf_cpu.benchmark_devices`), one record per device with fields "plan_devices"
             and "measured_together"; record indices (and "written") then count plans.
Shards keep their plans' row slices. Each shard is measured by `tf_cpu.benchmark_devices` (one
shard per call, or a whole plan's with `--whole-plans`) and written as one JSON line:
  {"backend", "batch_size", "tables": [{"name", "features": [21 floats], "spec": {...},
   "fraction", "slice": [index, num_slices]}],
   "forward_ms", "backward_ms", "total_ms", "seed", "threads", "key", "source", "index", ...}
"spec" is the TableSpec JSON without its reuse histogram (that is features[4:21]; see
`records.record_shards`); "fraction" and "slice" only for row slices. Collection appends and is
resumable: a record whose shard key is already in the file is skipped.

Full-size tables: `--fill` inserts every row of each table before measuring (a hash table
otherwise holds only the batch's rows, whatever its size; `tf_cpu.ShardKernels`), and
`--row-bands 1e5-3e5,4e6-1.2e7` gives each drawn table a row count log-uniform in one of the
bands (`workloads.resize_table`; a table beyond `--max-shard-gib` filled is given a smaller dim
or dropped), so that chosen sizes can be kept out of training (`--split test`):

    tfra-de benchmark collect --records 100 --out full.jsonl --sources random --fill \
        --row-scale 1 --dims 4,8,16,32 --row-bands 1e5-3e5,4e6-1.2e7 --split train
"""

import json
import os
import sys
import time

import numpy as np

from tfra_dynamic_embedding.placement import cost_model, proposers, workloads
from tfra_dynamic_embedding.placement.benchmark import tf_cpu, torch_cuda
from tfra_dynamic_embedding.placement.benchmark.records import read_records
from tfra_dynamic_embedding.placement.types import Shard, TableSpec, Task, make_devices

DEFAULT_POOL_TABLES = 256
DEFAULT_ROW_SCALE = 1 / 64
_MODULE = "tfra_dynamic_embedding.placement.benchmark.collect"
SOURCES = ("random", "heuristic", "plan", "policy", "sliced", "task")
TASK_STRATEGIES = ("learned", "lookup-greedy", "learned", "random", "learned",
                   "size-lookup-greedy")
TASK_SHAPE = {"tables": 80, "devices": 8, "memory": "256MiB"}
# backend name -> module with shard_key and benchmark_devices (neither imports TF or torch).
BACKENDS = {tf_cpu.BACKEND: tf_cpu, torch_cuda.BACKEND: torch_cuda}
# Command-line defaults that depend on the backend: a CPU measures the down-scaled pool, a GPU
# the full-size one (train.PROFILES' pools) with 80-table tasks on devices of 16 GiB.
BACKEND_DEFAULTS = {
    tf_cpu.BACKEND: {"batch_size": 1024, "pool_tables": DEFAULT_POOL_TABLES,
                     "row_scale": DEFAULT_ROW_SCALE, "task_memory": TASK_SHAPE["memory"],
                     "max_shard_gib": 4.0, "max_tables_per_shard": 8},
    torch_cuda.BACKEND: {"batch_size": 65536, "pool_tables": 856, "row_scale": 1.0,
                         "task_memory": "16GiB", "max_shard_gib": 16.0,
                         "max_tables_per_shard": 12},
}
# Device names of the tasks a backend's shards are planned in: GPU names make the learned
# strategy plan with the GPU weights (cost_model.profile_of), so its shards are that policy's.
TASK_DEVICES = {tf_cpu.BACKEND: "/job:ps/task:{i}", torch_cuda.BACKEND: "/GPU:{i}"}
SLICE_COUNTS = (2, 3, 4, 6, 8)
HALVES = ("all", "train", "test")
HEURISTICS = ("size-greedy", "dim-greedy", "lookup-greedy", "size-lookup-greedy",
              "capacity-balanced", "load-balanced")


def make_pool(pool_seed=0, batch_size=1024, pool_tables=DEFAULT_POOL_TABLES,
              row_scale=DEFAULT_ROW_SCALE, half="all", dims=workloads.DEFAULT_DIMS):
    """The down-scaled pool shards are drawn from (reuse histograms expected at `batch_size`).

    `half`: "all", or "train" / "test" for one half of `workloads.split_pool(pool, pool_seed)`
    (the halves the placement evaluation trains and tests on), so that a cost model can be
    trained on one half's tables and checked on tables it never saw.
    """
    if half not in HALVES:
        raise ValueError(f"half must be one of {HALVES}; got {half!r}")
    pool = workloads.generate_pool(pool_tables, seed=pool_seed, batch_size=batch_size,
                                   row_scale=row_scale, dims=dims)
    if half == "all":
        return pool
    train, test = workloads.split_pool(pool, seed=pool_seed)
    return train if half == "train" else test


def draw_shard(pool, index, pool_seed=0, max_tables=8, batch_size=1024, sources=SOURCES,
               task_memory=None, task_devices=TASK_DEVICES[tf_cpu.BACKEND]):
    """(source, [Shard]) of record `index`: a pure function of (pool, index, pool_seed,
    sources); record `index` draws from `sources[index % len(sources)]`. `task_memory`: the
    devices' memory in the `task` source (default TASK_SHAPE's); `task_devices`: the device
    names (a template with {i}) of the tasks the planned sources place."""
    rng = np.random.default_rng([int(pool_seed), int(index), 17])
    source = sources[index % len(sources)]
    if source in ("random", "sliced"):
        k = int(rng.integers(1, max_tables + 1))
        chosen = sorted(rng.choice(len(pool), k, replace=False))
        shards = []
        for i in chosen:
            n = int(rng.choice(SLICE_COUNTS))
            cut = source == "sliced" and rng.random() < 0.5 and pool[i].rows >= n
            shards.append(Shard(pool[i], "", int(rng.integers(0, n)), n) if cut
                          else Shard(pool[i], ""))
        return source, shards
    if source == "task":
        return _task_shard(pool, index // len(sources), rng, batch_size, task_memory,
                           task_devices)
    devices = int(rng.integers(2, 7))
    count = int(rng.integers(devices, min(len(pool), devices * max_tables) + 1))
    chosen = sorted(rng.choice(len(pool), count, replace=False))
    task = Task([pool[i] for i in chosen], make_devices(devices, None, task_devices),
                batch_size=batch_size)
    strategy = {"heuristic": str(rng.choice(HEURISTICS)), "plan": "random",
                "policy": "learned"}[source]
    plan = proposers.propose(task, strategy, seed=int(rng.integers(0, 2 ** 31 - 1)))
    device = task.devices[int(rng.integers(0, devices))].name
    shards = plan.shards_on(device)
    if not shards:  # an empty device: take the fullest one
        device = max(task.devices, key=lambda d: len(plan.shards_on(d.name))).name
        shards = plan.shards_on(device)
    if len(shards) > max_tables:
        keep = sorted(rng.choice(len(shards), max_tables, replace=False))
        shards = [shards[i] for i in keep]
    return f"{source}:{strategy}", shards


def _task_shard(pool, turn, rng, batch_size, memory=None,
                template=TASK_DEVICES[tf_cpu.BACKEND]):
    """("task:STRATEGY", [Shard]): every piece on one random device of an eval-shaped task
    planned by TASK_STRATEGIES[turn % len(TASK_STRATEGIES)] (`turn`: this source's n-th use)."""
    source, devices = _task_plan(pool, turn, rng, batch_size, memory, template)
    return source, devices[int(rng.integers(0, len(devices)))]


def _task_plan(pool, turn, rng, batch_size, memory=None, template=TASK_DEVICES[tf_cpu.BACKEND]):
    """("task:STRATEGY", [[Shard] per non-empty device]) of an eval-shaped task planned by
    TASK_STRATEGIES[turn % len(TASK_STRATEGIES)]."""
    task = workloads.make_tasks(pool, 1, min(TASK_SHAPE["tables"], len(pool)),
                                TASK_SHAPE["devices"], memory or TASK_SHAPE["memory"],
                                seed=int(rng.integers(0, 2 ** 31 - 1)), batch_size=batch_size,
                                device_template=template)[0]
    strategy = TASK_STRATEGIES[turn % len(TASK_STRATEGIES)]
    plan = proposers.propose(task, strategy, seed=int(rng.integers(0, 2 ** 31 - 1)))
    return f"task:{strategy}", [shards for shards in plan.shards_by_device().values() if shards]


def draw_plan(pool, index, pool_seed=0, batch_size=1024, task_memory=None,
              task_devices=TASK_DEVICES[tf_cpu.BACKEND]):
    """(source, [[Shard] per device]): every non-empty device of the plan behind record
    `index` of the `task` source (`--whole-plans`; a pure function of its arguments, up to
    the learned policy's time-budgeted local search)."""
    rng = np.random.default_rng([int(pool_seed), int(index), 17])
    return _task_plan(pool, index, rng, batch_size, task_memory, task_devices)


def parse_bands(text):
    """'1e5-3e5,4e6-1.2e7' -> [(100000, 300000), (4000000, 12000000)]."""
    bands = []
    for part in str(text).split(","):
        if not part.strip():
            continue
        try:
            lo, hi = (int(float(x)) for x in part.split("-"))
        except ValueError as error:
            raise ValueError(f"row bands look like '1e5-3e5,4e6-1.2e7'; got {text!r}") from error
        if not 1 <= lo <= hi:
            raise ValueError(f"a row band needs 1 <= low <= high; got {part!r}")
        bands.append((lo, hi))
    if not bands:
        raise ValueError(f"no row bands in {text!r}")
    return bands


def size_shard(shards, bands, rng, batch_size=1024, max_bytes=4 * 2 ** 30):
    """Whole-table `Shard`s resized to row counts drawn log-uniformly in a random band of
    `bands` (`workloads.resize_table`). A table whose filled size (`tf_cpu.filled_bytes`)
    exceeds `max_bytes` alone gets its dim halved (down to 4); then the largest tables are
    dropped until the shard fits (at least one stays)."""
    out = []
    for shard in shards:
        table = getattr(shard, "table", shard)
        lo, hi = bands[int(rng.integers(0, len(bands)))]
        rows = int(round(np.exp(rng.uniform(np.log(lo), np.log(hi)))))
        dim = table.dim
        while dim > 4 and tf_cpu.filled_bytes([TableSpec(
                "x", rows, dim, table.bytes_per_value)]) > max_bytes:
            dim //= 2
        out.append(Shard(workloads.resize_table(table, rows, batch_size, dim), ""))
    return fit_shard(out, max_bytes, tf_cpu.filled_bytes)


def fit_shard(shards, max_bytes, size_of):
    """Drops the largest pieces (by `size_of([piece])`) until `size_of(shards) <= max_bytes`;
    one always stays."""
    out = list(shards)
    while len(out) > 1 and size_of(out) > max_bytes:
        out.remove(max(out, key=lambda s: size_of([s])))
    return out


def make_record(shards, result, batch_size, seed, backend=tf_cpu.BACKEND, **extra):
    """One JSONL record of a measured shard (`Shard`s, or TableSpecs for whole tables); a row
    slice's features scale with its share of rows (`cost_model.shard_features`)."""
    entries = []
    for shard in shards:
        table = getattr(shard, "table", shard)
        entry = {"name": table.name, "spec": _compact_spec(table)}
        index, num_slices = getattr(shard, "index", 0), getattr(shard, "num_slices", 1)
        fraction = table.slice_rows(index, num_slices) / table.rows
        entry["features"] = _round(cost_model.shard_features(table, fraction))
        if num_slices > 1:
            entry.update(fraction=fraction, slice=[int(index), int(num_slices)])
        entries.append(entry)
    record = {
        "backend": backend, "batch_size": int(batch_size), "tables": entries,
        "forward_ms": round(float(result["forward_ms"]), 5),
        "backward_ms": round(float(result["backward_ms"]), 5),
        "total_ms": round(float(result["total_ms"]), 5),
        "seed": int(seed), "threads": int(result["threads"]),
        "key": BACKENDS[backend].shard_key(shards, batch_size,
                                           filled=bool(result.get("filled"))),
        "lookups": int(result["lookups"])}
    for field in ("memory_bytes", "pooled_bytes"):   # torch_cuda: device bytes, all-to-all bytes
        if field in result:
            record[field] = int(result[field])
    if result.get("filled"):
        record["filled"] = True   # every row inserted (tf_cpu fill): the tables' real size
    record.update(extra)
    return record


def _round(values, digits=7):
    return [float(f"{float(x):.{digits}g}") for x in values]


def _compact_spec(spec):
    """TableSpec JSON without the reuse histogram: it is features[4:21] of the same record."""
    out = spec.to_dict()
    out.pop("reuse_histogram", None)
    return out


def _end_with_newline(path):
    """Terminates a torn last line (an interrupted write) so that appends start a new line."""
    if os.path.exists(path) and os.path.getsize(path):
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
        if last != b"\n":
            with open(path, "ab") as f:
                f.write(b"\n")


def _progress(done, total, start, skipped, stream=sys.stderr):
    elapsed = time.time() - start
    rate = done / elapsed if elapsed > 0 else 0.0
    width = 30
    filled = int(width * done / max(total, 1))
    eta = (total - done) / rate if rate > 0 else 0.0
    stream.write(f"\r[{'=' * filled}{'.' * (width - filled)}] {done}/{total} records "
                 f"({skipped} already there) {elapsed:.0f}s elapsed, eta {eta:.0f}s ")
    stream.flush()


def collect(out, records, pool_seed=0, batch_size=1024, max_tables=8, seed=0, threads=1,
            warmup=2, repeat=7, pool_tables=DEFAULT_POOL_TABLES, row_scale=DEFAULT_ROW_SCALE,
            time_limit=None, flush=None, progress=True, start_index=0, half="all",
            sources=SOURCES, whole_plans=False, fill=False, dims=workloads.DEFAULT_DIMS,
            row_bands=None, split=None, max_shard_bytes=4 * 2 ** 30, backend=tf_cpu.BACKEND,
            task_memory=None):
    """Appends records `start_index .. start_index + records - 1` to `out`, skipping shards
    whose key is already there. Stops early after `time_limit` seconds. Returns
    {"written", "skipped", "seconds"}. `sources`: the shard sources to cycle through.

    `whole_plans` (source "task" only): index r is a whole plan (`draw_plan`) whose devices are
    measured together (`tf_cpu.benchmark_devices`), one record per device, so that the records
    of one plan share the machine's drift as the placement evaluation's plans do.

    `fill`: measure tables holding all their rows; `row_bands` ([(lo, hi)], e.g. from
    `parse_bands`): resize each drawn table (`size_shard`, at most `max_shard_bytes` filled);
    `split`: "train" / "test", written to each record (`train.split_by_tables` reads it);
    `dims`: the pool's dims.

    `backend`: "tf_cpu" (this project's kernels, TensorFlow) or "torch_cuda" (fused
    EmbeddingBags on a GPU; every shard is cut to `max_shard_bytes` by dropping its largest
    pieces, and its tables always hold all their rows). `task_memory`: the devices' memory of
    the `task` source's tasks (default TASK_SHAPE's 256 MiB, for down-scaled pools)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}; got {backend!r}")
    bench = BACKENDS[backend]
    gpu = backend == torch_cuda.BACKEND
    bad = [x for x in sources if x not in SOURCES]
    if not sources or bad:
        raise ValueError(f"sources must be some of {SOURCES}; got {list(sources)}")
    if whole_plans and tuple(sources) != ("task",):
        raise ValueError(f"whole_plans measures plans of the 'task' source only; got sources "
                         f"{list(sources)}")
    if not gpu:
        tf_cpu.set_threads(threads)
    if row_bands and whole_plans:
        raise ValueError("row_bands resize the tables of single shards; not with whole_plans")
    if split not in (None, "train", "test"):
        raise ValueError(f"split must be 'train' or 'test'; got {split!r}")
    pool = make_pool(pool_seed, batch_size, pool_tables, row_scale, half, tuple(dims))
    # Record indices of a half are offset so its shards differ from the whole pool's.
    offset = {"all": 0, "train": 1 << 20, "test": 2 << 20}[half]
    present = {r.get("key") for r in read_records(out)}
    if os.path.dirname(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
    start, written, skipped = time.time(), 0, 0
    _end_with_newline(out)
    extra = {"pool_seed": pool_seed, "row_scale": row_scale, "pool_tables": pool_tables,
             "half": half, "warmup": warmup, "repeat": repeat}
    if split:
        extra["split"] = split
    if tuple(dims) != tuple(workloads.DEFAULT_DIMS):
        extra["dims"] = [int(d) for d in dims]
    if fill and not gpu:
        # A process's first measurement runs slow (placement/data/README.md, "Full-size
        # records"), and collection of filled shards uses few records per process, to hand
        # their gigabytes back: warm the runtime first.
        tf_cpu.benchmark_shard([TableSpec("warm-up", 4096, 8, pooling_factor=8.0)], batch_size,
                               seed=seed, warmup=warmup, repeat=3, flush=flush, fill=True)
    if gpu:   # the pool's batches, drawn in parallel once (slow on a CPU at full size)
        torch_cuda.prefetch(pool, batch_size, seed)
    with open(out, "a", encoding="utf-8") as f:
        for r in range(start_index, start_index + records):
            if time_limit and time.time() - start > time_limit:
                break
            if whole_plans:
                source, devices = draw_plan(pool, r + offset, pool_seed, batch_size,
                                            task_memory, TASK_DEVICES[backend])
            else:
                source, shards = draw_shard(pool, r + offset, pool_seed, max_tables, batch_size,
                                            sources, task_memory, TASK_DEVICES[backend])
                if row_bands:
                    rng = np.random.default_rng([int(pool_seed), int(r + offset), 29])
                    shards = size_shard(shards, row_bands, rng, batch_size, max_shard_bytes)
                    source = f"{source}:sized"
                if gpu:
                    shards = fit_shard(shards, max_shard_bytes, torch_cuda.piece_bytes)
                devices = [shards]
            todo = {}
            for shards in devices:
                key = bench.shard_key(shards, batch_size, filled=fill)
                if key not in present:
                    todo[key] = shards
            if not todo:
                skipped += 1
            else:
                began = time.time()
                results = bench.benchmark_devices(list(todo.values()), batch_size, seed=seed,
                                                  warmup=warmup, repeat=repeat, flush=flush,
                                                  fill=fill)
                wall = round(time.time() - began, 3)
                plan = {"plan_devices": len(devices), "measured_together": len(todo)} \
                    if whole_plans else {}
                for (key, shards), result in zip(todo.items(), results):
                    record = make_record(shards, result, batch_size, seed, backend, source=source,
                                         index=r, wall_s=wall, **plan, **extra)
                    f.write(json.dumps(record) + "\n")
                    present.add(key)
                f.flush()
                written += 1
            if progress:
                _progress(written + skipped, records, start, skipped)
    if progress:
        sys.stderr.write("\n")
    return {"written": written, "skipped": skipped, "seconds": time.time() - start}


# -- command line --------------------------------------------------------------------------------
def add_parser(subparsers):
    """Adds `benchmark collect` (no TensorFlow import here; see cli.py)."""
    parser = subparsers.add_parser("benchmark", help="kernel micro-benchmarks of table shards")
    sub = parser.add_subparsers(dest="benchmark_command", metavar="ACTION")
    col = sub.add_parser("collect", help="measure random / heuristic / plan shards into JSONL "
                         "records (appends; resumable)")
    col.add_argument("--records", type=int, required=True, help="number of shard records")
    col.add_argument("--out", required=True, metavar="FILE", help="JSONL file (appended to)")
    col.add_argument("--pool-seed", type=int, default=0, help="seed of the table pool and shards")
    by_backend = " (default: the backend's, BACKEND_DEFAULTS)"
    col.add_argument("--batch-size", type=int, default=None,
                     help="batch size measured at" + by_backend)
    col.add_argument("--max-tables-per-shard", type=int, default=None, help=by_backend.strip())
    col.add_argument("--pool-tables", type=int, default=None, help=by_backend.strip())
    col.add_argument("--half", choices=HALVES, default="all",
                     help="draw shards from this half of the pool (workloads.split_pool)")
    col.add_argument("--sources", default=",".join(SOURCES),
                     help=f"comma-separated shard sources to cycle through (of {','.join(SOURCES)})")
    col.add_argument("--row-scale", type=float, default=None,
                     help="hash sizes are MetaSyn's times this" + by_backend)
    col.add_argument("--threads", type=int, default=1, help="TF intra/inter-op threads")
    col.add_argument("--warmup", type=int, default=2)
    col.add_argument("--repeat", type=int, default=7)
    col.add_argument("--seed", type=int, default=0, help="seed of table initial values")
    col.add_argument("--start-index", type=int, default=0, help="first record index")
    col.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                     help="stop after this long (resume later with the same arguments)")
    col.add_argument("--records-per-process", type=int, default=0, metavar="N",
                     help="measure N records per child process (TF keeps ~8 MB per traced "
                     "shard; long runs should use e.g. 200); 0: all in this process")
    col.add_argument("--whole-plans", action="store_true",
                     help="with --sources task: each record index is a whole plan whose devices "
                     "are measured together, one record per device (drift common to a plan)")
    col.add_argument("--fill", action="store_true",
                     help="insert every row of each table before measuring (real table sizes)")
    col.add_argument("--dims", default=",".join(str(d) for d in workloads.DEFAULT_DIMS),
                     help="dims of the pool's tables")
    col.add_argument("--row-bands", default=None, metavar="LO-HI,...",
                     help="resize each drawn table to rows log-uniform in one of these bands, "
                     "e.g. 1e5-3e5,4e6-1.2e7 (with --fill: full-size tables)")
    col.add_argument("--max-shard-gib", type=float, default=None,
                     help="with --row-bands, or --backend torch_cuda: most GiB a shard may take"
                     + by_backend)
    col.add_argument("--split", choices=("train", "test"), default=None,
                     help="write this split into the records (train.split_by_tables)")
    col.add_argument("--backend", choices=sorted(BACKENDS), default=tf_cpu.BACKEND,
                     help="tf_cpu: this project's kernels with TensorFlow on the CPU, "
                     "down-scaled pool; torch_cuda: fused EmbeddingBags with PyTorch on a GPU, "
                     "full-size pool")
    col.add_argument("--task-memory", default=None,
                     help="memory per device of the 'task' source's tasks" + by_backend)
    col.add_argument("--no-flush", action="store_true", help="skip the cache flush (tests)")
    col.add_argument("--quiet", action="store_true", help="no progress bar")
    col.set_defaults(run=_run_collect)
    parser.set_defaults(run=lambda args: (parser.print_help(), 2)[1])
    return parser


def _run_chunks(args, argv):
    """Runs `--records` in child processes of `--records-per-process` records each."""
    import subprocess  # pylint: disable=import-outside-toplevel
    start, totals = time.time(), {"written": 0, "skipped": 0}
    first, last = args.start_index, args.start_index + args.records
    for lo in range(first, last, args.records_per_process):
        left = None if args.time_limit is None else args.time_limit - (time.time() - start)
        if left is not None and left <= 0:
            break
        child = list(argv) + ["--start-index", str(lo), "--records",
                              str(min(args.records_per_process, last - lo)),
                              "--records-per-process", "0"]
        if left is not None:
            child += ["--time-limit", str(left)]
        proc = subprocess.run([sys.executable, "-m", _MODULE] + child, stdout=subprocess.PIPE,
                              text=True, check=False)
        if proc.returncode:
            raise OSError(f"benchmark child process failed (exit {proc.returncode})")
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        totals["written"] += summary["written"]
        totals["skipped"] += summary["skipped"]
    totals["seconds"] = time.time() - start
    return totals


def _child_argv(args):
    argv = []
    for action in ("pool_seed", "batch_size", "max_tables_per_shard", "pool_tables", "row_scale",
                   "threads", "warmup", "repeat", "seed", "half", "sources", "dims",
                   "max_shard_gib", "backend"):
        argv += ["--" + action.replace("_", "-"), str(getattr(args, action))]
    argv += ["--out", args.out]
    argv += ["--no-flush"] if args.no_flush else []
    argv += ["--whole-plans"] if args.whole_plans else []
    argv += ["--fill"] if args.fill else []
    argv += ["--row-bands", args.row_bands] if args.row_bands else []
    argv += ["--split", args.split] if args.split else []
    argv += ["--task-memory", args.task_memory] if args.task_memory else []
    argv += ["--quiet"] if args.quiet else []
    return ["benchmark", "collect"] + argv


def _run_collect(args):
    for name, value in BACKEND_DEFAULTS[args.backend].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.out.endswith(".gz"):
        raise ValueError(f"--out must be a plain JSONL file (gzip it when done); got {args.out!r}")
    if args.records < 1:
        raise ValueError(f"--records must be >= 1; got {args.records}")
    if args.max_tables_per_shard < 1:
        raise ValueError(f"--max-tables-per-shard must be >= 1; got {args.max_tables_per_shard}")
    if args.records_per_process and args.records > args.records_per_process:
        summary = _run_chunks(args, _child_argv(args))
        print(json.dumps({"out": args.out, **{k: round(v, 2) if isinstance(v, float) else v
                                             for k, v in summary.items()}}))
        return 0
    summary = collect(args.out, args.records, pool_seed=args.pool_seed,
                      batch_size=args.batch_size, max_tables=args.max_tables_per_shard,
                      seed=args.seed, threads=args.threads, warmup=args.warmup,
                      repeat=args.repeat, pool_tables=args.pool_tables, row_scale=args.row_scale,
                      time_limit=args.time_limit, flush=False if args.no_flush else None,
                      progress=not args.quiet, start_index=args.start_index, half=args.half,
                      sources=tuple(x.strip() for x in args.sources.split(",") if x.strip()),
                      whole_plans=args.whole_plans, fill=args.fill,
                      dims=[int(d) for d in args.dims.split(",") if d.strip()],
                      row_bands=parse_bands(args.row_bands) if args.row_bands else None,
                      split=args.split, max_shard_bytes=int(args.max_shard_gib * 2 ** 30),
                      backend=args.backend, task_memory=args.task_memory)
    print(json.dumps({"out": args.out, **{k: round(v, 2) if isinstance(v, float) else v
                                         for k, v in summary.items()}}))
    return 0


def main(argv=None):
    """`python -m tfra_dynamic_embedding.placement.benchmark.collect benchmark collect ...`
    (what `--records-per-process` runs; the same as `tfra-de benchmark collect ...`)."""
    import argparse  # pylint: disable=import-outside-toplevel
    parser = argparse.ArgumentParser(prog="tfra-de")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
