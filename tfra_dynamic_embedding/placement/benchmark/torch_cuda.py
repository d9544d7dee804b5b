"""Benchmark backend "torch_cuda": a shard's tables as fused EmbeddingBags on a GPU (PyTorch).

The same protocol as tf_cpu (`protocol.measure`): tables of one dimension are fused into one
`torch.nn.EmbeddingBag(sum of rows, dim, mode="sum", sparse=True)`; their index streams are
flattened into one (indices, offsets) pair with each table's ids shifted by its row offset
(`fuse_tables`). Stages:
  forward: one EmbeddingBag call per dimension group (lookup + sum pooling);
  step:    forward, backward of sum(pooled), and an SGD update of the touched rows.
backward = step - forward. `torch.cuda.synchronize()` brackets every timed call and the L2
cache is flushed by zeroing a device buffer of 2x its size.

torch is imported inside functions only; the index bookkeeping (`fuse_tables`, `group_by_dim`)
is plain numpy and runs (and is tested) without torch.

Example:
    if torch_cuda.is_available():
        result = torch_cuda.benchmark_shard([spec_a, spec_b], batch_size=65536)
"""

import numpy as np

from tfra_dynamic_embedding.placement.benchmark import protocol

BACKEND = "torch_cuda"


def is_available():
    """True when torch is installed and sees a CUDA device."""
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def group_by_dim(specs):
    """{dim: [positions of the tables with that dim]} in first-seen order."""
    groups = {}
    for k, spec in enumerate(specs):
        groups.setdefault(getattr(spec, "table", spec).dim, []).append(k)
    return groups


def fuse_tables(batches, rows):
    """Flattens per-table bags into one fused EmbeddingBag input, table-major.

    batches: [(indices, offsets [B + 1])] per table (same B); rows: rows of each table.
    Returns (indices, offsets [T * B + 1], row_offsets [T + 1]): bag t * B + j is sample j of
    table t, and table t's ids are shifted by row_offsets[t] = sum of the rows before it.
    """
    if len(batches) != len(rows):
        raise ValueError(f"need one row count per table; got {len(rows)} for {len(batches)}")
    if not batches:
        return (np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64))
    sizes = {len(off) - 1 for _, off in batches}
    if len(sizes) != 1:
        raise ValueError(f"tables' batches have different batch sizes: {sorted(sizes)}")
    row_offsets = np.concatenate([[0], np.cumsum(np.asarray(rows, dtype=np.int64))])
    indices, lengths = [], []
    for t, (ix, off) in enumerate(batches):
        ix = np.asarray(ix, dtype=np.int64)
        if ix.size and (ix.min() < 0 or ix.max() >= rows[t]):
            raise ValueError(f"table {t} has ids outside [0, {rows[t]})")
        indices.append(ix + row_offsets[t])
        lengths.append(np.diff(np.asarray(off, dtype=np.int64)))
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))]).astype(np.int64)
    return np.concatenate(indices).astype(np.int64), offsets, row_offsets.astype(np.int64)


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


class ShardKernels:
    """Fused EmbeddingBags, device inputs, and the forward / step callables of one shard."""

    def __init__(self, shards, batch_size, seed=0, learning_rate=0.01, device=0):
        import torch  # pylint: disable=import-outside-toplevel
        self.torch = torch
        self.device = torch.device(f"cuda:{device}")
        specs = [getattr(s, "table", s) for s in shards]
        if not specs:
            raise ValueError("a shard benchmark needs at least one table")
        batches = protocol.shard_batches(shards, batch_size, seed)
        torch.manual_seed(int(seed))
        self.bags, self.inputs = [], []
        for dim, members in group_by_dim(specs).items():
            rows = [specs[k].rows for k in members]
            indices, offsets, _ = fuse_tables([batches[k] for k in members], rows)
            bag = torch.nn.EmbeddingBag(int(sum(rows)), dim, mode="sum", sparse=True,
                                        include_last_offset=True).to(self.device)
            torch.nn.init.normal_(bag.weight, 0.0, 0.01)
            self.bags.append(bag)
            self.inputs.append((torch.as_tensor(indices, device=self.device),
                                torch.as_tensor(offsets, device=self.device)))
        self.optimizer = torch.optim.SGD([p for b in self.bags for p in b.parameters()],
                                         lr=learning_rate)

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


def benchmark_shard(shards, batch_size, seed=0, warmup=3, repeat=10, flush=None, device=0):
    """Measures one shard on a GPU; same result keys as `tf_cpu.benchmark_shard`."""
    import torch  # pylint: disable=import-outside-toplevel
    if not torch.cuda.is_available():
        raise RuntimeError("torch_cuda benchmark needs a CUDA device; none is visible")
    kernels = ShardKernels(shards, batch_size, seed, device=device)
    if flush is None:
        flush = L2Flusher(device)
    times = protocol.measure({"step": kernels.step, "forward": kernels.forward}, warmup=warmup,
                             repeat=repeat, flush=flush or None,
                             sync=lambda: torch.cuda.synchronize(kernels.device))
    forward, backward, total = protocol.split_stages(times["forward"], times["step"])
    return {"forward_ms": forward, "backward_ms": backward, "total_ms": total,
            "step_ms": times["step"], "threads": 0,
            "lookups": int(sum(int(ix.numel()) for ix, _ in kernels.inputs))}
