"""Benchmark backend "tf_cpu": this project's own kernels on the CPU (the cost of a PS shard).

A shard's tables become `de.Variable`s (the native backend when its op library is built, else
the built-in one). Two `tf.function`s (reduce_retracing) are timed by the protocol of
`protocol.measure`:
  forward: `de.safe_embedding_lookup_sparse(..., combiner="sum", return_trainable=True)` per
           table: the forward of a training step (rows fetched into the trainable wrapper +
           pooling);
  step:    the same forward under a GradientTape, gradient of sum(pooled), and one
           `de.DynamicEmbeddingOptimizer(SGD)` update that writes the rows back.
backward = step - forward. Warm-up steps run first, so the tables hold the batch's rows and
the timed steps measure the steady state (lookups of existing rows, updates in place).

A hash table holds only the rows inserted into it: without `fill` a shard's tables hold just
the measured batch's rows, whatever their `rows`, so a 10-million-row table costs like a small
one. `fill=True` first inserts every row of each table (keys 0 .. rows-1, or a row slice's keys
key % n == index: the id range the index streams draw from), as on a parameter server that has
seen the whole vocabulary, so the table's real size sets the cache / memory regime.

TensorFlow is imported inside functions only; importing this module stays cheap.

Measuring takes seconds: docs/learned_placement.md, "Measured costs", shows
`benchmark_shard([a, b], batch_size=1024, seed=0)`, `benchmark_devices`, the estimator
"measured-cpu" and `MeasuringProcess`.

Example (what a shard's key and filled memory are; nothing measured):
    >>> from tfra_dynamic_embedding.placement.types import TableSpec
    >>> shards = [TableSpec("a", rows=1000, dim=16), TableSpec("b", rows=1000, dim=32)]
    >>> shard_key(shards, 1024) == shard_key(shards[::-1], 1024)   # a table set
    True
"""

import hashlib
import itertools
import json

import numpy as np
from absl import logging

from tfra_dynamic_embedding.placement import estimators
from tfra_dynamic_embedding.placement.benchmark import protocol

BACKEND = "tf_cpu"
_counter = itertools.count()
_THREADS = {}


def set_threads(threads):
    """Pins TF intra-/inter-op threads (only possible before TF starts); returns the threads in
    effect: (intra, inter)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if threads and "set" not in _THREADS:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(int(threads))
            tf.config.threading.set_inter_op_parallelism_threads(int(threads))
            _THREADS["set"] = int(threads)
        except RuntimeError as error:  # the runtime already started: keep what it has
            logging.warning("cannot pin TF threads to %s now (%s); keeping %s", threads, error,
                            tf.config.threading.get_intra_op_parallelism_threads())
    return (tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads())


def threads_in_effect():
    """Intra-op threads TF uses (0 = TF's default, one per core)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return int(tf.config.threading.get_intra_op_parallelism_threads())


def default_kv_creator():
    from tfra_dynamic_embedding.tables import native  # pylint: disable=import-outside-toplevel
    import tfra_dynamic_embedding as de  # pylint: disable=import-outside-toplevel
    return native.NativeKVCreator() if native.is_available() else de.BuiltinKVCreator()


class _DropRetracingWarnings:
    """Logging filter: every shard traces its own two tf.functions once, by design, but TF
    counts the traces of the same Python code across shards and warns about retracing after
    five shards, burying a collection's or evaluation's progress under such warnings."""

    def filter(self, record):
        return "triggered tf.function retracing" not in record.getMessage()


def _drop_retracing_warnings(tf):
    logger = tf.get_logger()
    if not any(isinstance(f, _DropRetracingWarnings) for f in logger.filters):
        logger.addFilter(_DropRetracingWarnings())


def _sparse(indices, offsets):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    rows, cols = protocol.bag_rows(offsets), protocol.bag_positions(offsets)
    width = int(cols.max()) + 1 if cols.size else 1
    return tf.SparseTensor(np.stack([rows, cols], axis=1).reshape(-1, 2),
                           tf.constant(indices, tf.int64), [len(offsets) - 1, width])


# Resident bytes per filled row beyond its values (native backend: key, index slot, slab
# metadata), for the memory check of `fill`; a slight over-estimate of what this backend takes.
FILL_ROW_OVERHEAD = 64
FILL_CHUNK = 1 << 20


def piece_key(shard):
    """(name, rows, dim, slice index, slices, column offset): one table piece of a task."""
    spec = getattr(shard, "table", shard)
    return (spec.name, spec.rows, spec.dim, getattr(shard, "index", 0),
            getattr(shard, "num_slices", 1), getattr(shard, "col_offset", 0))


def filled_bytes(shards, bytes_per_value=4):
    """Estimated resident bytes of `shards` with every row inserted (`fill=True`).

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec
        >>> filled_bytes([TableSpec("t", rows=10**6, dim=16)]) == 10**6 * (64 + FILL_ROW_OVERHEAD)
        True
    """
    total = 0
    for shard in shards:
        spec = getattr(shard, "table", shard)
        rows = spec.slice_rows(getattr(shard, "index", 0), getattr(shard, "num_slices", 1))
        total += rows * (spec.dim * bytes_per_value + FILL_ROW_OVERHEAD)
    return int(total)


def available_bytes(meminfo="/proc/meminfo"):
    """MemAvailable of this machine in bytes (None where unknown)."""
    try:
        with open(meminfo, encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fill_memory(devices, margin=2 * 2 ** 30):
    """Raises MemoryError when filling `devices` (shard lists) would leave under `margin`
    bytes of the machine's available memory (a filled shard can take gigabytes)."""
    pieces = {piece_key(s): s for d in devices for s in d}   # shared pieces count once
    need = filled_bytes(pieces.values())
    free = available_bytes()
    if free is not None and need + margin > free:
        raise MemoryError(f"filling these shards takes ~{need / 2 ** 30:.1f} GiB; "
                          f"{free / 2 ** 30:.1f} GiB available (keeping "
                          f"{margin / 2 ** 30:.1f} free)")
    return need


def fill_variable(var, spec, index=0, num_slices=1, chunk=FILL_CHUNK):
    """Inserts every row of a table (or of row slice `index` of `num_slices`) into `var`
    (rows drawn by its initializer), in chunks of `chunk` keys; returns the rows inserted."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    step = int(num_slices) * int(chunk)
    inserted = 0
    for lo in range(int(index), spec.rows, step):
        keys = tf.range(lo, min(spec.rows, lo + step), int(num_slices), dtype=tf.int64)
        var.find_or_insert(keys)
        inserted += int(keys.shape[0])
    return inserted


class ShardKernels:
    """The de.Variables, inputs and the two tf.functions of one shard (build once, call often).

    `fill`: insert every row of each table first (see the module docstring); `shared`: a dict
    of filled variables by piece (`piece_key`) that devices measured together share, so that a
    table held by several plans' devices is built and filled once."""

    def __init__(self, shards, batch_size, seed=0, learning_rate=0.01, kv_creator=None,
                 device="/CPU:0", fill=False, shared=None):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        import tfra_dynamic_embedding as de  # pylint: disable=import-outside-toplevel
        self.shards = list(shards)
        if not self.shards:
            raise ValueError("a shard benchmark needs at least one table")
        _drop_retracing_warnings(tf)
        batches = protocol.shard_batches(self.shards, batch_size, seed)
        self.lookups = int(sum(len(ix) for ix, _ in batches))
        run = next(_counter)
        creator = kv_creator or default_kv_creator()
        self.variables = []
        with tf.device(device):
            self.filled_rows = 0
            for k, shard in enumerate(self.shards):
                spec = getattr(shard, "table", shard)
                piece = piece_key(shard)
                if fill and shared is not None and piece in shared:
                    self.variables.append(shared[piece])
                    continue
                init = tf.random_normal_initializer(0.0, 0.01, seed=int(seed) * 1009 + k)
                self.variables.append(de.Variable(
                    key_dtype=tf.int64, value_dtype=tf.float32, dim=spec.dim, devices=[device],
                    name=f"bench{run}_{k}", initializer=init, kv_creator=creator,
                    checkpoint=False))
                if fill:
                    self.filled_rows += fill_variable(self.variables[-1], spec,
                                                      getattr(shard, "index", 0),
                                                      getattr(shard, "num_slices", 1))
                    if shared is not None:
                        shared[piece] = self.variables[-1]
            self.inputs = [_sparse(ix, off) for ix, off in batches]
        self.optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(learning_rate))
        variables, optimizer = self.variables, self.optimizer

        def pooled(inputs):
            outs, wrappers = [], []
            for k, (var, sp_ids) in enumerate(zip(variables, inputs)):
                emb, wrapper = de.safe_embedding_lookup_sparse(
                    var, sp_ids, None, combiner="sum", name=f"t{k}", return_trainable=True)
                outs.append(emb)
                wrappers.append(wrapper)
            return outs, wrappers

        @tf.function(reduce_retracing=True)
        def forward(inputs):
            outs, _ = pooled(inputs)
            return tf.add_n([tf.reduce_sum(o) for o in outs])

        @tf.function(reduce_retracing=True)
        def step(inputs):
            with tf.GradientTape() as tape:
                outs, wrappers = pooled(inputs)
                loss = tf.add_n([tf.reduce_sum(o) for o in outs])
            grads = tape.gradient(loss, wrappers)
            optimizer.apply_gradients(list(zip(grads, wrappers)))
            return loss

        self._forward, self._step = forward, step

    def forward(self):
        return self._forward(self.inputs).numpy()   # .numpy(): wait for the result

    def step(self):
        return self._step(self.inputs).numpy()

    def table_state(self):
        """{k: (sorted keys, their rows)} of every table, for determinism checks."""
        out = {}
        for k, var in enumerate(self.variables):
            keys, values = var.export()
            keys, values = np.asarray(keys), np.asarray(values)
            order = np.argsort(keys)
            out[k] = (keys[order], values[order])
        return out


def benchmark_shard(shards, batch_size, seed=0, warmup=2, repeat=7, flush=None, threads=None,
                    kv_creator=None, return_kernels=False, fill=False):
    """Measures one shard (list of `Shard` or TableSpec) by the protocol; returns
    {"forward_ms", "backward_ms", "total_ms", "step_ms", "lookups", "threads"}.

    `flush`: a callable (default: a `protocol.CacheFlusher` of 2x the LLC), False for none.
    `threads`: pin TF threads (possible only before TF starts running ops).
    `fill`: insert every row of the tables first (their real size; see the module docstring).
    """
    return benchmark_devices([shards], batch_size, seed, warmup, repeat, flush, threads,
                             kv_creator, return_kernels, fill)[0]


def benchmark_devices(devices, batch_size, seed=0, warmup=2, repeat=7, flush=None,
                      threads=None, kv_creator=None, return_kernels=False, fill=False):
    """Measures several shards at once (a plan's devices: a list of shard lists); returns one
    `benchmark_shard` result per device.

    The devices' stages run interleaved, round by round (the protocol's rounds over all
    devices' stages), so a slow minute of the machine falls on every device alike -- as it
    would on devices that run at the same time -- instead of on whichever device was measured
    in it. Plan-level figures (max device, balance) then carry the per-device noise only.

    Usage: docs/learned_placement.md, "Measured costs" (`benchmark_devices([[a], [b]], 1024)`).
    """
    if threads:
        set_threads(threads)
    if flush is None:
        flush = _default_flusher()
    if fill:
        check_fill_memory(devices)
    shared = {}   # with fill, a piece on several devices (of different plans) is filled once
    kernels = [ShardKernels(shards, batch_size, seed, kv_creator=kv_creator, fill=fill,
                            shared=shared) for shards in devices]
    stages = {}
    for k, kern in enumerate(kernels):
        # The step goes first: warm-up steps insert the batch's rows, so the forward then reads
        # existing rows (the steady state of training).
        stages[(k, "step")] = kern.step
        stages[(k, "forward")] = kern.forward
    times = protocol.measure(stages, warmup=warmup, repeat=repeat, flush=flush or None)
    results = []
    for k, kern in enumerate(kernels):
        forward, backward, total = protocol.split_stages(times[(k, "forward")],
                                                         times[(k, "step")])
        results.append({"forward_ms": forward, "backward_ms": backward, "total_ms": total,
                        "step_ms": times[(k, "step")], "lookups": kern.lookups,
                        "threads": threads_in_effect(), "filled": bool(fill),
                        "filled_rows": kern.filled_rows})
        if return_kernels:
            results[-1]["kernels"] = kern
    return results


_FLUSHER = []


def _default_flusher():
    if not _FLUSHER:
        _FLUSHER.append(protocol.CacheFlusher())
    return _FLUSHER[0]


def shard_key(shards, batch_size, backend=BACKEND, filled=False):
    """A stable key of a shard's table set (specs, slices), batch size and whether its tables
    were filled (`filled` changes the key; unfilled keys are those of earlier records)."""
    parts = []
    for shard in shards:
        spec = getattr(shard, "table", shard)
        entry = dict(spec.to_dict())
        entry.pop("name", None)  # a table's name does not change its cost
        if entry.get("reuse_histogram") is not None:
            entry["reuse_histogram"] = [round(float(x), 6) for x in entry["reuse_histogram"]]
        entry["slice"] = [getattr(shard, "index", 0), getattr(shard, "num_slices", 1)]
        parts.append(json.dumps(entry, sort_keys=True))
    head = {"backend": backend, "batch_size": int(batch_size), "tables": sorted(parts)}
    if filled:
        head["filled"] = True
    text = json.dumps(head, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


class MeasuredEstimator(estimators.CostEstimator):
    """Device cost = measured step time (seconds) of its shards with the tf_cpu benchmark.

    `batch_size`: the batch to measure at (default: the task's, capped at `max_batch_size` so
    that CPU measurements of 65,536-sample tasks stay affordable). Results are cached by the
    shard's table set, so re-scoring a plan (or another plan sharing a device's tables) is free.
    `plan_costs` measures a plan's unmeasured devices together (`benchmark_devices`).

    `isolate`: 0 measures in this process; n > 0 in a child process, replaced after every n
    shards. Long evaluations need it: each measured shard leaves TensorFlow runtime memory in
    its process (traced functions are not given back), which the child takes along.

    `max_together`: the most devices `measure_plans` builds and times at once. Every device of
    an interleaved run stays alive until it ends, most of its memory TensorFlow's traced
    functions: all the plans of a large task at once can exhaust the machine's memory, so
    larger sets are measured in groups of whole plans (the figures: docs/learned_placement.md,
    "Shipped weights and results").

    `fill`: measure tables holding all their rows (`benchmark_devices(fill=True)`): full-size
    tables, where the table's size sets the memory regime. Filled devices take their tables'
    real memory, so give such tasks a small `max_together` (e.g. one plan's devices).

    Usage: docs/learned_placement.md, "Measured costs" (`evaluate_plan(plan, "measured-cpu")`).
    """

    name = "measured-cpu"
    measured = True
    additive = False

    def __init__(self, batch_size=None, max_batch_size=4096, seed=0, warmup=2, repeat=5,
                 flush=None, threads=None, cache_size=1024, on_measure=None, isolate=0,
                 max_together=160, fill=False):
        self.fill = bool(fill)
        self.worker = MeasuringProcess(isolate, threads, flush, self.fill) if isolate else None
        self.batch_size = batch_size
        self.max_batch_size = int(max_batch_size)
        self.seed, self.warmup, self.repeat = int(seed), int(warmup), int(repeat)
        self.flush, self.threads = flush, threads
        self.cache_size = int(cache_size)
        if int(max_together) < 1:
            raise ValueError(f"max_together must be >= 1; got {max_together!r}")
        self.max_together = int(max_together)
        self.cache = {}
        self.measurements = 0
        self.on_measure = on_measure   # called as on_measure(shards, batch_size, result)

    def _batch(self, task):
        if self.batch_size:
            return int(self.batch_size)
        return min(int(task.batch_size if task is not None else 4096), self.max_batch_size)

    def device_cost(self, shards, device, task):
        shards = list(shards)
        if not shards:
            return 0.0
        batch = self._batch(task)
        key = shard_key(shards, batch, filled=self.fill)
        if key not in self.cache:
            self._measure({key: shards}, batch)
        return self.cache[key]

    def plan_costs(self, plan):
        """{device: seconds}; a plan's unmeasured devices are measured together
        (`benchmark_devices`: interleaved rounds, so the machine's drift is common to them)."""
        batch = self._batch(plan.task)
        todo = {}
        for shards in plan.shards_by_device().values():
            key = shard_key(shards, batch, filled=self.fill) if shards else None
            if key and key not in self.cache:
                todo[key] = shards
        if todo:
            self._measure(todo, batch)
        return super().plan_costs(plan)

    def measure_plans(self, plans, extra_devices=()):
        """Measures the unmeasured devices of all `plans` (one task's) and the shard lists in
        `extra_devices` together, in one `benchmark_devices` call: every plan of the task then
        shares the machine's drift, so comparisons between them carry per-device noise only.
        Beyond `max_together` devices, in consecutive groups of whole plans (a plan's devices
        always share a run). Later `plan_costs` / `device_cost` calls read the cache."""
        plans = list(plans)
        if not plans:
            return
        batch = self._batch(plans[0].task)
        todo = {}
        groups = [list(plan.shards_by_device().values()) for plan in plans]
        groups.append([list(d) for d in extra_devices])
        for devices in groups:
            new = {}
            for shards in devices:
                key = shard_key(shards, batch, filled=self.fill) if shards else None
                if key and key not in self.cache and key not in todo and key not in new:
                    new[key] = shards
            if todo and len(todo) + len(new) > self.max_together:
                self._measure(todo, batch)
                todo = {}
            todo.update(new)
        if todo:
            self._measure(todo, batch)

    def _measure(self, todo, batch):
        """Measures {key: shards} together and caches each device's seconds."""
        devices = list(todo.values())
        if self.worker is not None:
            results = self.worker.measure_devices(devices, batch, self.seed, self.warmup,
                                                  self.repeat)
        else:
            results = benchmark_devices(devices, batch, self.seed, self.warmup, self.repeat,
                                        self.flush, self.threads, fill=self.fill)
        for key, shards, result in zip(todo, devices, results):
            self.measurements += 1
            if self.on_measure is not None:
                self.on_measure(shards, batch, result)
            if len(self.cache) >= self.cache_size:
                self.cache.pop(next(iter(self.cache)))
            self.cache[key] = result["total_ms"] / 1e3


class MeasuringProcess:
    """A child process that runs `benchmark_devices` (spawned, so it starts its own TensorFlow
    with `threads`), replaced after `limit` shards to hand its memory back.

    Usage (a script's main guard, as spawned children import it): docs/learned_placement.md,
    "Measured costs" (`MeasuringProcess(100, threads=1).measure(shards, 1024, 0, 2, 5)`).
    """

    def __init__(self, limit, threads=None, flush=None, fill=False):
        if int(limit) < 1:
            raise ValueError(f"limit must be >= 1; got {limit!r}")
        self.limit, self.threads, self.flush, self.fill = int(limit), threads, flush, bool(fill)
        self.count, self.process, self.conn, self.started = 0, None, None, 0

    def measure(self, shards, batch_size, seed, warmup, repeat):
        """One shard's `benchmark_shard` result."""
        return self.measure_devices([shards], batch_size, seed, warmup, repeat)[0]

    def measure_devices(self, devices, batch_size, seed, warmup, repeat):
        """`benchmark_devices` results of several shards measured together."""
        if self.process is None or self.count >= self.limit:
            self.close()
            import multiprocessing  # pylint: disable=import-outside-toplevel
            context = multiprocessing.get_context("spawn")
            self.conn, child = context.Pipe()
            self.process = context.Process(target=_serve,
                                           args=(child, self.threads, self.flush, self.fill),
                                           daemon=True)
            self.process.start()
            child.close()
            self.count, self.started = 0, self.started + 1
        self.conn.send(([list(s) for s in devices], batch_size, seed, warmup, repeat))
        try:
            ok, result = self.conn.recv()
        except EOFError as error:   # the child died (e.g. killed for memory)
            self.close()
            raise RuntimeError("the measuring child process exited") from error
        self.count += len(devices)
        if not ok:
            raise RuntimeError(f"measuring in the child process failed: {result}")
        return result

    def close(self):
        if self.process is not None:
            self.conn.close()
            self.process.join(timeout=30)
            if self.process.is_alive():
                self.process.terminate()
        self.process = self.conn = None


def _serve(conn, threads, flush, fill=False):
    """The child's loop: measure what the parent sends until it hangs up."""
    if threads:
        set_threads(threads)
    while True:
        try:
            devices, batch_size, seed, warmup, repeat = conn.recv()
        except EOFError:
            return
        try:
            result = benchmark_devices(devices, batch_size, seed, warmup, repeat, flush,
                                       fill=fill)
            conn.send((True, result))
        except Exception as error:  # pylint: disable=broad-except  (reported to the parent)
            conn.send((False, f"{type(error).__name__}: {error}"))
