"""The measurement protocol shared by every benchmark backend (no TensorFlow, no torch here).

One measurement of a shard (the tables on one device) runs named stages (e.g. "forward": lookup +
pooling; "step": forward + backward + write-back) as follows:

  1. `warmup` untimed calls of every stage (tracing, table growth, page faults);
  2. `repeat` timed rounds; in each round, for each stage: flush the caches (touch a buffer larger
     than the last-level cache), synchronise, read the clock, call the stage, synchronise, read
     the clock;
  3. per stage, drop the highest and the lowest time and return the mean of the rest in ms
     (`trimmed_mean`).

Clock, flush and sync are injectable, so tests can drive the protocol with a fake clock.

Example:
    >>> ticks = iter(range(1000))               # a fake clock: each reading 0.5 s later
    >>> times = measure({"forward": lambda: None, "step": lambda: None}, warmup=2, repeat=7,
    ...                 clock=lambda: next(ticks) / 2, collect_garbage=False)
    >>> times["forward"], times["step"], len(times["raw"]["step"])       # ms
    (500.0, 500.0, 7)
"""

import gc
import glob
import os
import re
import subprocess
import time

import numpy as np
from absl import logging

from tfra_dynamic_embedding.placement import streams

DEFAULT_LLC_BYTES = 64 * 2 ** 20


def _parse_size(text):
    """'32768K' / '32 MiB' / '1024 KB' -> bytes (None when unreadable)."""
    match = re.search(r"([0-9.]+)\s*([KMG]?)(i?B)?", text.strip(), re.IGNORECASE)
    if not match:
        return None
    scale = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}[match.group(2).upper()]
    return int(float(match.group(1)) * scale)


def llc_bytes(sys_root="/sys/devices/system/cpu/cpu0/cache"):
    """Size of the last-level CPU cache: /sys first, then `lscpu`, else 64 MiB."""
    best_level, best_size = -1, None
    for entry in sorted(glob.glob(os.path.join(sys_root, "index*"))):
        try:
            with open(os.path.join(entry, "level"), encoding="utf-8") as f:
                level = int(f.read().strip())
            with open(os.path.join(entry, "type"), encoding="utf-8") as f:
                kind = f.read().strip()
            with open(os.path.join(entry, "size"), encoding="utf-8") as f:
                size = _parse_size(f.read())
        except (OSError, ValueError):
            continue
        if kind != "Instruction" and size and level > best_level:
            best_level, best_size = level, size
    if best_size:
        return best_size
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5,
                             check=False).stdout
        for line in out.splitlines():
            if line.lower().startswith("l3 cache"):
                size = _parse_size(line.split(":", 1)[1])
                if size:
                    return size
    except (OSError, subprocess.SubprocessError):
        pass
    return DEFAULT_LLC_BYTES


class CacheFlusher:
    """Evicts the CPU caches by writing a buffer of `factor` x the last-level cache size."""

    def __init__(self, size_bytes=None, factor=2.0):
        size = int((size_bytes or llc_bytes()) * factor)
        self.buffer = np.zeros(max(size // 8, 1), dtype=np.int64)
        self.calls = 0

    def __call__(self):
        self.buffer += 1          # read and write every line
        self.calls += 1


def trimmed_mean(times):
    """Mean after dropping one highest and one lowest value (plain mean below 3 values)."""
    values = sorted(float(t) for t in times)
    if not values:
        raise ValueError("trimmed_mean needs at least one time")
    if len(values) >= 3:
        values = values[1:-1]
    return float(np.mean(values))


def measure(stages, warmup=2, repeat=7, flush=None, clock=time.perf_counter, sync=None,
            collect_garbage=True):
    """Trimmed-mean milliseconds of each stage in `stages` (an ordered {name: callable}).

    Args:
      stages: {name: fn()}; stages run in the given order in every warm-up and timed round.
      warmup: untimed rounds first (>= 0).
      repeat: timed rounds (>= 1; 3 or more so that the trimmed mean drops the extremes).
      flush: fn() called before every timed call (default: no flush); see `CacheFlusher`.
      clock: seconds as a float (default time.perf_counter).
      sync: fn() called before reading the clock (a device synchronise; default none).
      collect_garbage: run a full collection between rounds (below); False where the stages
        make little garbage and a collection costs more than the measurement (torch_cuda).
    Returns {name: ms}, plus "raw" -> {name: [ms per round]}.

    Python's garbage collector is off during the timed rounds (as in `timeit`) and runs between
    rounds instead: with many shards' TensorFlow objects alive a full collection is slow and
    would land inside whichever call triggered it (the figure: docs/learned_placement.md,
    "Shipped weights and results").
    """
    if not stages:
        raise ValueError("measure needs at least one stage")
    if int(warmup) < 0 or int(repeat) < 1:
        raise ValueError(f"need warmup >= 0 and repeat >= 1; got warmup={warmup!r}, "
                         f"repeat={repeat!r}")
    for _ in range(int(warmup)):
        for fn in stages.values():
            fn()
        if sync:
            sync()
    raw = {name: [] for name in stages}
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(int(repeat)):
            if collect_garbage:
                gc.collect()   # between rounds, outside the timed calls
            for name, fn in stages.items():
                if flush:
                    flush()
                if sync:
                    sync()
                start = clock()
                fn()
                if sync:
                    sync()
                raw[name].append((clock() - start) * 1e3)
    finally:
        if was_enabled:
            gc.enable()
    out = {name: trimmed_mean(times) for name, times in raw.items()}
    logging.debug("measured %s", out)
    out["raw"] = raw
    return out


def split_stages(forward_ms, step_ms):
    """(forward, backward, total) ms from the forward-only and the full-step times.

    backward = step - forward (gradient + write-back/update), clipped at 0; total = forward +
    backward (= step unless noise made the step faster than its forward).
    """
    backward = max(float(step_ms) - float(forward_ms), 0.0)
    return float(forward_ms), backward, float(forward_ms) + backward


# -- index streams -> per-table batches (backend independent) -----------------------------------
def bag_rows(offsets):
    """Sample id of every lookup of a bag batch: offsets [0, 2, 2, 5] -> [0, 0, 2, 2, 2]."""
    offsets = np.asarray(offsets, dtype=np.int64)
    return np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))


def bag_positions(offsets):
    """Position of every lookup inside its bag: offsets [0, 2, 2, 5] -> [0, 1, 0, 1, 2]."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n = int(offsets[-1]) if len(offsets) else 0
    return np.arange(n, dtype=np.int64) - np.repeat(offsets[:-1], np.diff(offsets))


def slice_batch(indices, offsets, index, num_slices):
    """Keeps the lookups of row slice `index` of `num_slices` (keys with key % n == index)."""
    indices = np.asarray(indices, dtype=np.int64)
    if num_slices == 1:
        return indices, np.asarray(offsets, dtype=np.int64)
    keep = indices % num_slices == index
    rows = bag_rows(offsets)[keep]
    counts = np.bincount(rows, minlength=len(offsets) - 1)
    return indices[keep], np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def uniform_batch(spec, batch_size, seed):
    """A batch for a table without an index stream: Poisson(pooling) bags of uniform ids."""
    rng = np.random.default_rng([int(seed), spec.rows, spec.dim])
    lengths = rng.poisson(spec.pooling_factor, batch_size).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return rng.integers(0, spec.rows, int(offsets[-1])).astype(np.int64), offsets


def shard_batches(shards, batch_size, seed=0, batch_index=0):
    """[(indices, offsets)] of each shard (a `Shard` or a TableSpec) for one batch.

    Synthetic streams give batch `batch_index` at `batch_size`; tables without a stream get
    `uniform_batch`; row slices keep their own keys only.
    """
    out = []
    for shard in shards:
        spec = getattr(shard, "table", shard)
        if spec.stream is not None:
            indices, offsets = streams.open_stream(spec, batch_size).batch(batch_index)
        else:
            indices, offsets = uniform_batch(spec, batch_size, seed)
        out.append(slice_batch(indices, offsets, getattr(shard, "index", 0),
                               getattr(shard, "num_slices", 1)))
    return out
