"""Benchmark backend "torch_cuda": a device's tables as fused EmbeddingBags on a GPU (PyTorch).

The same protocol as tf_cpu (`protocol.measure`): tables of one dimension are fused into one
`torch.nn.EmbeddingBag(sum of rows, dim, mode="sum", sparse=True)` made on the GPU; their index
batches are concatenated on the GPU into one (indices, offsets) pair, table-major, with each
table's ids shifted by the rows of the tables before it (`ShardKernels`). A row slice holds its
own rows only (keys with key % n == index, stored at row key // n); a column block is a table
of the block's width. Stages:
  forward: one EmbeddingBag call per dimension group (lookup + sum pooling);
  step:    forward, backward of sum(pooled), and an SGD update of the touched rows.
backward = step - forward. `torch.cuda.synchronize()` brackets every timed call and the L2
cache is flushed by zeroing a device buffer of 2x its size. GPU tables are dense arrays, so
every table holds all its rows (records say `filled`).

Communication is not measured (one GPU): the estimator adds `comm.AllToAll`, a documented
model of the all-to-all that model-parallel embeddings pay.

torch is imported inside functions only; the index bookkeeping (`group_by_dim`, `piece_rows`,
`piece_batch`) is plain numpy and runs (and is tested) without torch.

Measuring needs PyTorch and a GPU: docs/learned_placement.md, "Measured costs", shows
`torch_cuda.benchmark_shard([a, b], batch_size=65536)` and the estimator "measured-gpu".

Example:
    >>> from tfra_dynamic_embedding.placement.types import Shard, TableSpec
    >>> a, b = TableSpec("a", rows=10, dim=16), TableSpec("b", rows=10, dim=32)
    >>> group_by_dim([a, b, TableSpec("c", rows=5, dim=16)])     # one EmbeddingBag per dim
    {16: [0, 2], 32: [1]}
    >>> piece_rows(Shard(a, "/GPU:0", 1, 4)), piece_bytes([a, b])   # row slice 1 of 4
    (3, 1920)
"""

import json

import numpy as np

from tfra_dynamic_embedding.placement import estimators
from tfra_dynamic_embedding.placement.benchmark import protocol
from tfra_dynamic_embedding.placement.comm import AllToAll, pooled_bytes

BACKEND = "torch_cuda"


def is_available():
    """True when torch is installed and sees a CUDA device."""
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _spec(shard):
    return getattr(shard, "table", shard)


def group_by_dim(specs):
    """{dim: [positions of the tables with that dim]} in first-seen order."""
    groups = {}
    for k, spec in enumerate(specs):
        groups.setdefault(_spec(spec).dim, []).append(k)
    return groups


def piece_rows(shard):
    """Rows a piece holds on its device: a row slice's own rows, else the table's."""
    spec = _spec(shard)
    return spec.slice_rows(getattr(shard, "index", 0), getattr(shard, "num_slices", 1))


def piece_bytes(shards):
    """Device memory of the pieces' rows (float values; SGD keeps no slots)."""
    return int(sum(piece_rows(s) * _spec(s).dim * _spec(s).bytes_per_value for s in shards))


def piece_batch(shard, batch_size, seed=0, table_batch=None):
    """(local ids, offsets) of one piece's batch: a row slice's keys become rows key // n.
    `table_batch`: the whole table's (indices, offsets), when already drawn."""
    index, num_slices = getattr(shard, "index", 0), getattr(shard, "num_slices", 1)
    if table_batch is None:
        table_batch = protocol.shard_batches([_spec(shard)], batch_size, seed)[0]
    indices, offsets = protocol.slice_batch(*table_batch, index, num_slices)
    return indices // num_slices, offsets


def _table_key(spec, batch_size, seed):
    spec = spec.to_dict()
    spec.pop("name", None)   # a table's batch depends on its statistics, not its name
    return json.dumps([spec, int(batch_size), int(seed)], sort_keys=True)


def _draw_table_batch(args):
    spec, batch_size, seed = args
    return protocol.shard_batches([spec], batch_size, seed)[0]


class BatchCache:
    """Pieces' batches on the GPU, kept across measurements (a pool's tables recur in many
    shards, and drawing a full-size table's batch is slow on a CPU: placement/data/README.md).
    Whole tables' host batches are kept too, so the row slices of a table are cut from one
    draw; `prefetch` draws many tables' batches in worker processes."""

    def __init__(self, device, max_bytes=8 * 2 ** 30):
        import torch  # pylint: disable=import-outside-toplevel
        self.torch, self.device, self.max_bytes = torch, device, int(max_bytes)
        self.entries, self.bytes, self.tables = {}, 0, {}

    def prefetch(self, specs, batch_size, seed=0, processes=None):
        """Draws the host batches of `specs` (TableSpecs) in `processes` spawned workers."""
        import concurrent.futures  # pylint: disable=import-outside-toplevel
        import multiprocessing  # pylint: disable=import-outside-toplevel
        todo = {}
        for spec in specs:
            key = _table_key(spec, batch_size, seed)
            if key not in self.tables:
                todo[key] = (spec, int(batch_size), int(seed))
        if not todo:
            return
        with concurrent.futures.ProcessPoolExecutor(
                processes, mp_context=multiprocessing.get_context("spawn")) as pool:
            for key, batch in zip(todo, pool.map(_draw_table_batch, todo.values(),
                                                 chunksize=4)):
                self.tables[key] = batch

    def table_batch(self, spec, batch_size, seed):
        key = _table_key(spec, batch_size, seed)
        if key not in self.tables:
            self.tables[key] = _draw_table_batch((spec, batch_size, seed))
        return self.tables[key]

    def get(self, shard, batch_size, seed):
        spec = _spec(shard)
        key = json.dumps([_table_key(spec, batch_size, seed), getattr(shard, "index", 0),
                          getattr(shard, "num_slices", 1)])
        if key not in self.entries:
            ix, off = piece_batch(shard, batch_size, seed,
                                  self.table_batch(spec, batch_size, seed))
            value = (self.torch.as_tensor(ix, device=self.device),
                     self.torch.as_tensor(np.diff(off), device=self.device))
            size = 8 * (value[0].numel() + value[1].numel())
            while self.entries and self.bytes + size > self.max_bytes:   # oldest first
                old_ix, old_len = self.entries.pop(next(iter(self.entries)))
                self.bytes -= 8 * (old_ix.numel() + old_len.numel())
            self.entries[key] = value
            self.bytes += size
        return self.entries[key]


class ShardKernels:
    """Fused EmbeddingBags, device inputs, and the forward / step callables of one shard."""

    def __init__(self, shards, batch_size, seed=0, learning_rate=0.01, device=0, cache=None):
        import torch  # pylint: disable=import-outside-toplevel
        self.torch = torch
        self.device = torch_device(device)
        if not shards:
            raise ValueError("a shard benchmark needs at least one table")
        cache = cache or BatchCache(self.device)
        torch.manual_seed(int(seed))
        self.bags, self.inputs = [], []
        for dim, members in group_by_dim(shards).items():
            rows = [piece_rows(shards[k]) for k in members]
            parts = [cache.get(shards[k], batch_size, seed) for k in members]
            shift = torch.as_tensor(np.concatenate([[0], np.cumsum(rows)[:-1]]),
                                    device=self.device)
            indices = torch.cat([ix + shift[t] for t, (ix, _) in enumerate(parts)])
            lengths = torch.cat([length for _, length in parts])
            offsets = torch.cat([torch.zeros(1, dtype=lengths.dtype, device=self.device),
                                 torch.cumsum(lengths, 0)])
            bag = torch.nn.EmbeddingBag(int(sum(rows)), dim, mode="sum", sparse=True,
                                        include_last_offset=True, device=self.device)
            torch.nn.init.normal_(bag.weight, 0.0, 0.01)
            self.bags.append(bag)
            self.inputs.append((indices, offsets))
        self.optimizer = torch.optim.SGD([p for b in self.bags for p in b.parameters()],
                                         lr=learning_rate)
        self.lookups = int(sum(int(ix.numel()) for ix, _ in self.inputs))

    def _pooled(self):
        return [bag(ix, off) for bag, (ix, off) in zip(self.bags, self.inputs)]

    def forward(self):
        with self.torch.no_grad():
            return self._pooled()

    def step(self):
        self.optimizer.zero_grad(set_to_none=True)
        loss = sum(out.sum() for out in self._pooled())
        loss.backward()
        self.optimizer.step()
        return loss


class L2Flusher:
    """Evicts the GPU's L2 cache by zeroing a device buffer of `factor` x its size."""

    def __init__(self, device=0, factor=2.0):
        import torch  # pylint: disable=import-outside-toplevel
        props = torch.cuda.get_device_properties(device)
        size = int(getattr(props, "L2_cache_size", 0) or 64 * 2 ** 20)
        self.buffer = torch.empty(int(size * factor) // 4, dtype=torch.int32,
                                  device=f"cuda:{device}")

    def __call__(self):
        self.buffer.zero_()


def torch_device(device):
    """torch.device of `device`: a CUDA ordinal (int), or a name ("cpu" runs the same kernels
    on the CPU, for tests on machines without a GPU)."""
    import torch  # pylint: disable=import-outside-toplevel
    return torch.device(f"cuda:{device}" if isinstance(device, int) else device)


_STATE = {}


def _shared(device):
    """One L2 flusher (CUDA only) and one batch cache per process and device."""
    if device not in _STATE:
        dev = torch_device(device)
        _STATE[device] = (L2Flusher(dev.index or 0) if dev.type == "cuda" else None,
                          BatchCache(dev))
    return _STATE[device]


def prefetch(specs, batch_size, seed=0, device=0, processes=None):
    """Draws the batches of `specs` (TableSpecs) ahead, in worker processes (see BatchCache)."""
    _shared(device)[1].prefetch(specs, batch_size, seed, processes)


def benchmark_devices(devices, batch_size, seed=0, warmup=3, repeat=10, flush=None, device=0,
                      fill=True):
    """Measures each shard list of `devices` on the GPU, one after another (each alone on the
    GPU; its blocks stay in torch's allocator for the next); same result keys as `tf_cpu.benchmark_devices`, plus
    "memory_bytes" and "pooled_bytes" (`pooled_bytes`). `fill` is accepted for the collector's
    sake: GPU tables always hold every row. `device`: a CUDA ordinal, or "cpu" (tests)."""
    del fill
    import torch  # pylint: disable=import-outside-toplevel
    dev = torch_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("torch_cuda benchmark needs a CUDA device; none is visible")
    flusher, cache = _shared(device)
    if flush is None:
        flush = flusher
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None
    results = []
    for shards in devices:
        shards = list(shards)
        kernels = ShardKernels(shards, batch_size, seed, device=dev, cache=cache)
        times = protocol.measure({"step": kernels.step, "forward": kernels.forward},
                                 warmup=warmup, repeat=repeat, flush=flush or None, sync=sync,
                                 collect_garbage=False)
        forward, backward, total = protocol.split_stages(times["forward"], times["step"])
        results.append({"forward_ms": forward, "backward_ms": backward, "total_ms": total,
                        "step_ms": times["step"], "threads": 0, "lookups": kernels.lookups,
                        "filled": True, "memory_bytes": piece_bytes(shards),
                        "pooled_bytes": pooled_bytes(shards, batch_size)})
        del kernels   # its blocks stay in torch's allocator for the next shard
    return results


def benchmark_shard(shards, batch_size, seed=0, warmup=3, repeat=10, flush=None, device=0):
    """Measures one shard on a GPU; same result keys as `tf_cpu.benchmark_shard`."""
    return benchmark_devices([shards], batch_size, seed, warmup, repeat, flush, device)[0]


def shard_key(shards, batch_size, filled=True):
    """The tf_cpu key of a shard's table set, for this backend."""
    del filled
    from tfra_dynamic_embedding.placement.benchmark import tf_cpu  # pylint: disable=import-outside-toplevel
    return tf_cpu.shard_key(shards, batch_size, backend=BACKEND)


class MeasuredEstimator(estimators.CostEstimator):
    """Device cost (seconds) = measured GPU step time of its shards (fused EmbeddingBags,
    forward + backward + SGD) + the modelled all-to-all (`comm.AllToAll`) of its pooled rows.

    Measured at the task's batch size (or `batch_size`); results cached by table set. Its use,
    `evaluate_plan(plan, "measured-gpu")`: docs/learned_placement.md, "Measured costs".
    """

    name = "measured-gpu"
    measured = True
    additive = False

    def __init__(self, batch_size=None, seed=0, warmup=3, repeat=10, comm=None, device=0):
        self.batch_size, self.seed = batch_size, int(seed)
        self.warmup, self.repeat, self.device = int(warmup), int(repeat), device
        self.comm = comm if comm is not None else AllToAll()
        self.cache, self.measurements = {}, 0

    def _batch(self, task):
        return int(self.batch_size or (task.batch_size if task is not None else 65536))

    def compute_ms(self, shards, batch):
        key = shard_key(shards, batch)
        if key not in self.cache:
            result = benchmark_devices([shards], batch, self.seed, self.warmup, self.repeat,
                                       device=self.device)[0]
            self.cache[key] = result["total_ms"]
            self.measurements += 1
        return self.cache[key]

    def device_cost(self, shards, device, task):
        shards = list(shards)
        if not shards:
            return 0.0
        batch = self._batch(task)
        devices = task.num_devices if task is not None else 1
        comm = self.comm.step_ms(pooled_bytes(shards, batch), devices)
        return (self.compute_ms(shards, batch) + comm) / 1e3
