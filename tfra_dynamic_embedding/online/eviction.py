"""Eviction during training: a capacity bound (LRU / LFU) and a time to live, per de.Variable.

`de.Variable(..., eviction=de.Eviction(max_size=N))` keeps the variable at N keys at most while
`de.DynamicEmbeddingOptimizer` trains it: before a step writes its rows, keys go when the step's
new keys would not fit -- the least recently updated first ("lru") or the least often updated
("lfu") -- together with their optimizer slots (and restrict-policy status). Each eviction frees
`slack` of the bound more than needed, so the scan it takes runs once per `slack x N` new keys,
not every step. `ttl_steps=T` also drops keys not updated in the last T training steps (checked
every `ttl_steps // 10` steps, so a key lives at most 1.1 T steps unused); `ttl_seconds=S` drops
keys not updated in the last S seconds of wall-clock time (checked every `S // 10` seconds at
the next step). Steps that run at the same time (asynchronous workers) each make room for their
own new keys. On the native backend, with the optimizer's slots in the records, the write-back
itself also holds the bound (`set_bound`: a new key over it evicts old rows first), so
together they never pass it; otherwise they may, by the others' new keys, and each step ends by
evicting such an excess again.

The clock is the variable's own count of training steps, or with `ttl_seconds` Unix seconds (then
"lru" orders by the second of the last update). Per-key recency and counts come from the native
table's row metadata (no extra table, no extra probe: every write stamps its row), or on the
built-in backend from a status table of [last update, updates] per key; checkpoints save the
clock and the recency and counts of either.

Example:
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> w = de.Variable(dim=2, eviction=de.Eviction(max_size=2, order="lfu", slack=0.0))
    >>> opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam())
    >>> for ids in ([1, 2], [1, 3], [4, 5]):
    ...     with tf.GradientTape() as tape:
    ...         emb, wrapper = de.embedding_lookup(w, tf.constant(ids, tf.int64),
    ...                                            return_trainable=True)
    ...         loss = tf.reduce_sum(emb)
    ...     _ = opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
    ...     print(int(w.size()))      # at most max_size after every step
    2
    2
    2
"""

import tensorflow as tf

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding import hooks
from tfra_dynamic_embedding import variable as variable_lib
from tfra_dynamic_embedding.tables import BuiltinKVCreator

ORDERS = ("lru", "lfu")
_CHUNK_ROWS = 65536   # rows a native sweep reads at a time


class Eviction(hooks.VariableHook):
    """What to evict and when (see the module docstring); one object may serve many variables
    (`de.Variable(eviction=...)` attaches it: hooks.py).

    Args:
      max_size: None or the most keys the variable holds after any training step (split evenly
        over its shards).
      order: "lru" (least recently updated first) or "lfu" (least often updated first, the least
        recent among equals).
      ttl_steps: None or the training steps after which a key not updated is dropped.
      ttl_seconds: None or the seconds after which a key not updated is dropped (wall clock;
        not together with ttl_steps).
      slack: the share of the bound an eviction frees beyond what the step needs (amortizes
        the scan); 0 evicts exactly the excess.
    """

    argument = "eviction"

    def __init__(self, max_size=None, order="lru", ttl_steps=None, slack=0.05, ttl_seconds=None):
        for arg, value in (("max_size", max_size), ("ttl_steps", ttl_steps),
                           ("ttl_seconds", ttl_seconds)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{arg} must be None or a positive int; got {value!r}")
        if max_size is None and ttl_steps is None and ttl_seconds is None:
            raise ValueError("Eviction needs max_size, ttl_steps or ttl_seconds; got none")
        if ttl_steps is not None and ttl_seconds is not None:
            raise ValueError(f"Eviction takes ttl_steps or ttl_seconds, not both; got "
                             f"ttl_steps={ttl_steps!r}, ttl_seconds={ttl_seconds!r}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {list(ORDERS)}; got {order!r}")
        if isinstance(slack, bool) or not isinstance(slack, (int, float)) or not 0 <= slack < 1:
            raise ValueError(f"slack must be a number in [0, 1); got {slack!r}")
        self.max_size = max_size
        self.order = order
        self.ttl_steps = ttl_steps
        self.ttl_seconds = ttl_seconds
        self.slack = float(slack)

    @property
    def ttl(self):
        """The time to live in the clock's units (steps or seconds), or None."""
        return self.ttl_steps if self.ttl_seconds is None else self.ttl_seconds

    def __repr__(self):
        ttl = (f"ttl_steps={self.ttl_steps}" if self.ttl_seconds is None
               else f"ttl_seconds={self.ttl_seconds}")
        return (f"de.Eviction(max_size={self.max_size}, order={self.order!r}, {ttl}, "
                f"slack={self.slack})")

    def attach(self, var):
        """The per-variable state (`EvictionState`) that enforces this on `var`."""
        return EvictionState(self, var)


def _uses_native_metadata(var):
    return all(hasattr(t, "export_with_meta") and hasattr(t, "set_step")
               for t in var.shards.tables)


class EvictionState(hooks.AttachedHook):
    """An `Eviction` bound to one variable: its step count and, on the built-in backend, its
    status table (the variable checkpoints both)."""

    # The native rows' metadata is read from the live tables, which a SavedModel's export
    # graph cannot capture; serving has no use for it.
    checkpoint_only = ("eviction_metadata",)

    def __init__(self, eviction, var):
        self.eviction = eviction
        self._var = var
        self.native = _uses_native_metadata(var)
        # Wall-clock time: the native rows keep their default stamps (Unix seconds).
        self.seconds = eviction.ttl_seconds is not None
        with tf.init_scope(), tf.device(var.devices[0]):
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                    name=f"{var.name.replace('/', '_')}_eviction_step")
            # Seconds clock: when the next time-to-live sweep is due (not checkpointed: a
            # restored run sweeps at its first step).
            self.ttl_due = tf.Variable(0, dtype=tf.int64, trainable=False,
                                       name=f"{var.name.replace('/', '_')}_eviction_ttl_due")
        def status_table(name, checkpoint):
            return variable_lib.Variable(
                key_dtype=var.key_dtype, value_dtype=tf.int64, dim=2, devices=var.devices,
                partitioner=var.partition_fn, name=f"{var.name}/{name}", initializer=0,
                trainable=False, checkpoint=checkpoint, kv_creator=BuiltinKVCreator())

        # Built-in: [last step, updates] per key, checkpointed. Native: the rows' own metadata;
        # a checkpoint saves it (`metadata`), and a restore parks it in `restored` until the
        # next sweep gives it back to the rows (restored rows carry wall-clock stamps till then).
        self.status = None if self.native else status_table("eviction_status", var.checkpoint)
        self.restored = status_table("eviction_restored", False) if self.native else None
        self.metadata = _NativeMetadata(self, var) if self.native else None
        shards = var.shard_num
        bound = eviction.max_size
        self.caps = (None if bound is None else
                     [bound // shards + (1 if i < bound % shards else 0) for i in range(shards)])

    def trackables(self):
        """The step count, and the status table (built-in) or the rows' metadata (native)."""
        found = {"eviction_step": self.step, "eviction_status": self.status,
                 "eviction_metadata": self.metadata}
        return {name: t for name, t in found.items() if t is not None}

    def make_room(self, ids, companions=(), exists=None):
        """The op run before a training step writes the rows of `ids` (unique): advances the
        step, and evicts from the variable and `companions` (slot de.Variables, status tables)
        what the bound and the time to live require. `exists`: whether the variable holds each
        id, when the caller looked it up already."""
        var = self._var
        step = self.step.assign_add(1)
        ops = []
        if self.seconds:
            now = tf.cast(tf.timestamp(), tf.int64)
        else:
            now = step
            if self.native:
                ops += [t.set_step(step) for t in var.shards.tables]
        if self.native and self.caps is not None and not companions:
            # Nothing beside the records to evict with: the write-back itself holds the
            # bound (set every step, so a restarted PS task gets it back).
            ev = self.eviction
            ops += [t.set_bound(cap, int(ev.slack * cap), ev.order)
                    for t, cap in zip(var.shards.tables, self.caps)]
        with tf.control_dependencies(ops):
            incoming = self._incoming_per_shard(ids, exists)
            ttl_sweep = self._ttl_sweep_due(now)
            sweeps = []
            for i in range(var.shard_num):
                sweeps.append(self._sweep_if_needed(i, now, incoming[i], ids, companions,
                                                    ttl_sweep))
        if self.seconds:
            every = max(1, self.eviction.ttl_seconds // 10)
            with tf.control_dependencies(sweeps):
                sweeps = [tf.cond(ttl_sweep, lambda: self.ttl_due.assign(now + every).op,
                                  tf.no_op)]
        with tf.control_dependencies(sweeps):
            if self.status is not None:   # built-in: the step's keys get [now, updates + 1]
                counts = self.status.lookup(ids)[:, 1:]
                stamps = tf.fill(tf.shape(counts), now)
                return tf.group(self.status.upsert(ids, tf.concat([stamps, counts + 1], 1)))
            return tf.group(sweeps)

    def trim(self, ids, companions=()):
        """The op run after a training step wrote the rows of `ids`: brings back under the
        bound any shard that steps running at the same time (asynchronous workers) took over
        it, each having made room for its own keys only. Never evicts `ids`; reads one size
        per shard and sweeps only a shard over its bound."""
        if self.caps is None:
            return tf.no_op()
        now = (tf.cast(tf.timestamp(), tf.int64) if self.seconds
               else self.step.read_value())
        zero, no_ttl = tf.constant(0, tf.int32), tf.constant(False)
        return tf.group([self._sweep_if_needed(i, now, zero, ids, companions, no_ttl)
                         for i in range(self._var.shard_num)])

    def _incoming_per_shard(self, ids, exists=None):
        """How many of `ids` each shard does not hold yet (the step would add them)."""
        var = self._var
        if self.caps is None:
            return [tf.constant(0, tf.int32)] * var.shard_num
        if exists is None:
            exists = var.contains(ids)
        new = tf.boolean_mask(ids, tf.logical_not(exists))
        if var.shard_num == 1:
            return [tf.size(new)]
        parts, _ = var.shards.partition(new)
        return [tf.size(p) for p in parts]

    def _ttl_sweep_due(self, now):
        """Whether this step sweeps for the time to live: every ttl // 10 steps or seconds."""
        ev = self.eviction
        if ev.ttl is None:
            return tf.constant(False)
        if self.seconds:
            return now >= self.ttl_due
        return tf.equal(now % max(1, ev.ttl_steps // 10), 0)

    def _sweep_if_needed(self, shard, step, incoming, ids, companions, ttl_sweep):
        table = self._var.tables[shard]
        needed = ttl_sweep
        if self.caps is not None:
            needed = tf.logical_or(needed, tf.cast(table.size(), tf.int64) + tf.cast(
                incoming, tf.int64) > self.caps[shard])
        def sweep():
            with tf.device(self._var.devices[shard]):
                return self._sweep(shard, step, incoming, ids, companions)
        return tf.cond(needed, sweep, tf.no_op)

    def _restamp(self, shard, step):
        """`fix` for `scan_chunks` over a native shard: rows written outside training (a
        restore, an upsert) carry wall-clock stamps (on the step clock) -- they count as written
        now, and are stamped so -- and restored rows take back their saved stamps and counts."""
        table = self._var.shards.tables[shard]
        restored = self.restored.shards.tables[shard]

        def restamp(chunk_keys, chunk_stamps, chunk_counts):
            if self.seconds:   # wall-clock stamps are all true; only restored rows change
                later = tf.reshape(tf.cond(
                    restored.size() > 0, lambda: restored.contains(chunk_keys),
                    lambda: tf.zeros_like(chunk_stamps, tf.bool)), [-1])
            else:
                later = chunk_stamps > step
            later_keys = tf.boolean_mask(chunk_keys, later)
            # A restored row takes back its saved stamp and count; any other gets now.
            saved, found = restored.lookup_with_exists(
                later_keys, tf.zeros(tf.stack([tf.size(later_keys), 2]), tf.int64))
            saved, found = tf.reshape(saved, [-1, 2]), tf.reshape(found, [-1])
            new_stamps = tf.where(found, tf.minimum(saved[:, 0], step), step)
            new_counts = tf.where(found, saved[:, 1], tf.boolean_mask(chunk_counts, later))
            # The chunk carries no rows (few are restamped): they are read now, and a key
            # removed since the chunk was read is not written back.
            rows, present = table.lookup_with_exists(
                later_keys, tf.zeros(tf.stack([tf.size(later_keys), table.dim]), table.value_dtype))
            present = tf.reshape(present, [-1])
            restamp_op = table.import_with_meta(
                tf.boolean_mask(later_keys, present), tf.boolean_mask(rows, present),
                tf.boolean_mask(new_stamps, present), tf.boolean_mask(new_counts, present),
                clear=False)
            with tf.control_dependencies([restamp_op]):
                forget = restored.remove(tf.boolean_mask(later_keys, found))
            fixed_stamps = tf.tensor_scatter_nd_update(
                tf.minimum(chunk_stamps, step), tf.where(later), new_stamps)
            fixed_counts = tf.tensor_scatter_nd_update(chunk_counts, tf.where(later), new_counts)
            return fixed_stamps, fixed_counts, forget

        return restamp

    def _sweep(self, shard, step, incoming, ids, companions):
        """Removes from one shard the keys past their time to live and, over the bound, the
        lowest-scoring others. The scan keeps only the keys it may drop (at most the excess
        plus the slack), never the shard's whole metadata, so its memory stays a chunk's."""
        ev = self.eviction
        key_dtype = self._var.key_dtype
        size = tf.cast(self._var.shards.tables[shard].size(), tf.int64)
        most = tf.constant(0, tf.int64)   # the most keys the bound can make this sweep drop
        if self.caps is not None:
            cap, extra = self.caps[shard], int(ev.slack * self.caps[shard])
            most = tf.maximum(size + tf.cast(incoming, tf.int64) - cap + extra, 0)
        sorted_ids = tf.sort(_sortable(ids))

        def absorb(state, keys, stamps, counts):
            candidates, scores, expired_keys, n_expired, n_step = state
            keys, stamps, counts = (tf.reshape(x, [-1]) for x in (keys, stamps, counts))
            expired = tf.zeros_like(stamps, tf.bool)
            if ev.ttl_steps is not None:
                expired = stamps <= step - ev.ttl_steps
            elif ev.ttl_seconds is not None:   # whole seconds: never before ttl_seconds
                expired = stamps < step - ev.ttl_seconds
            # Expired keys go anyway (not picked twice); the step's own keys stay: evicting one
            # would only see it written again, over the bound.
            in_step = _member_of_sorted(keys, sorted_ids)
            score = stamps if ev.order == "lru" else counts * (1 << 32) + stamps
            # Once `most` candidates are held (sorted), only a lower score can displace one: an
            # equal one comes later in the stable order. Most of a chunk stops here.
            held = tf.size(scores, out_type=tf.int64)
            worst = tf.gather(tf.concat([[tf.int64.min], scores], 0), tf.minimum(most, held))
            limit = tf.where(held >= most, worst, tf.int64.max)
            pick = tf.logical_not(tf.logical_or(expired, in_step)) & (score < limit)
            candidates = tf.concat([candidates, tf.boolean_mask(keys, pick)], 0)
            scores = tf.concat([scores, tf.boolean_mask(score, pick)], 0)
            lowest = tf.argsort(scores, stable=True)[:most]
            return (tf.gather(candidates, lowest), tf.gather(scores, lowest),
                    expired_keys.write(expired_keys.size(), tf.boolean_mask(keys, expired)),
                    n_expired + tf.reduce_sum(tf.cast(expired, tf.int64)),
                    n_step + tf.reduce_sum(tf.cast(in_step & ~expired, tf.int64)))

        state = (tf.zeros([0], key_dtype), tf.zeros([0], tf.int64),
                 tf.TensorArray(key_dtype, size=0, dynamic_size=True, infer_shape=False),
                 tf.constant(0, tf.int64), tf.constant(0, tf.int64))
        if self.native:
            state = scan_chunks(self._var.shards.tables[shard], key_dtype, absorb, state,
                                self._restamp(shard, step))
        else:
            keys, status = self.status.shards.tables[shard].export()
            state = absorb(state, keys, status[:, 0], status[:, 1])
        candidates, _, expired_keys, n_expired, n_step = state
        drop = tf.constant(0, tf.int64)
        if self.caps is not None:
            alive = size - n_expired
            excess = alive + tf.cast(incoming, tf.int64) - cap
            drop = tf.where(excess > 0, tf.minimum(excess + extra, alive), 0)
            drop = tf.minimum(drop, alive - n_step)
        gone = tf.concat([tf.reshape(expired_keys.concat(), [-1]), candidates[:drop]], 0)
        tables = [self._var.tables[shard]] + [c.tables[shard] for c in companions]
        if self.status is not None:
            tables.append(self.status.tables[shard])
        return tf.group([t.remove(gone) for t in tables])


def scan_chunks(table, key_dtype, absorb, state, fix=None):
    """Folds a native table's metadata chunk by chunk: `state = absorb(state, keys, stamps,
    counts)` for every chunk of rows (no row values are read); returns the last state.

    `fix(keys, stamps, counts) -> (stamps, counts, op)` may correct a chunk's metadata first;
    the next chunk is read after `op`. `state` is a tuple of tensors and TensorArrays whose
    tensors may change their first dimension. One chunk at a time is in flight
    (`parallel_iterations=1`), so the scan's memory is one chunk's keys and metadata.
    """
    def body(cursor, *state):
        keys, _, stamps, counts, cursor = table.export_chunk(cursor, _CHUNK_ROWS,
                                                             with_values=False)
        if fix is not None:
            stamps, counts, done = fix(keys, stamps, counts)
            with tf.control_dependencies([done]):
                cursor = tf.identity(cursor)
        return (cursor,) + tuple(absorb(state, keys, stamps, counts))

    def invariant(x):
        if isinstance(x, tf.TensorArray):
            return tf.TensorShape(None)
        return tf.TensorShape([None] * x.shape.rank)

    state = tuple(state)
    out = tf.while_loop(lambda cursor, *_: cursor >= 0, body, (tf.constant(0, tf.int64),) + state,
                        shape_invariants=(tf.TensorShape([]),) + tuple(invariant(x) for x in state),
                        parallel_iterations=1)
    return out[1:]


def row_metadata(table, key_dtype, fix=None):
    """(keys, stamps, counts) of a native table's rows, read in chunks that do not keep the
    rows' values.

    Example:
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> var = de.Variable(dim=2, eviction=de.Eviction(max_size=10))
        >>> _ = var.upsert(tf.constant([3, 4], tf.int64), tf.ones([2, 2]))
        >>> keys, stamps, counts = row_metadata(var.tables[0].kv_table, tf.int64)
        >>> sorted(keys.numpy().tolist()), stamps.shape, counts.shape
        ([3, 4], TensorShape([2]), TensorShape([2]))
    """
    def append(arrays, *chunk):
        return tuple(a.write(a.size(), c) for a, c in zip(arrays, chunk))

    arrays = tuple(tf.TensorArray(dtype, size=0, dynamic_size=True, infer_shape=False)
                   for dtype in (key_dtype, tf.int64, tf.int64))
    arrays = scan_chunks(table, key_dtype, append, arrays, fix)
    return tuple(tf.reshape(a.concat(), [-1]) for a in arrays)


def _sortable(ids):
    """Ids as sortable numbers (strings by their fingerprints, int32 widened)."""
    if ids.dtype == tf.string:
        return tf.strings.to_hash_bucket_fast(ids, tf.int64.max)
    return tf.cast(ids, tf.int64)


def _member_of_sorted(keys, sorted_ids):
    """keys[i] in the ids `sorted_ids` (`_sortable` and sorted), by a binary search."""
    keys = _sortable(keys)
    position = tf.minimum(tf.searchsorted(sorted_ids, keys),
                          tf.maximum(tf.size(sorted_ids) - 1, 0))
    return tf.logical_and(
        tf.size(sorted_ids) > 0,
        tf.equal(tf.gather(tf.concat([sorted_ids, keys[:1]], 0), position), keys))


class _NativeMetadata(_tf_private.AutoTrackable):
    """The native rows' stamps and counts in a checkpoint: saved from the tables, restored into
    the eviction's `restored` table (the rows themselves may be restored after it)."""

    def __init__(self, state, var):
        # Not attributes Keras or AutoTrackable would follow: the variable holds the state.
        object.__setattr__(self, "_state", state)
        object.__setattr__(self, "_var", var)

    def _serialize_to_tensors(self):
        parts = [t.export_with_meta() for t in self._var.shards.tables]
        return {"keys": tf.concat([p[0] for p in parts], 0),
                "stamps": tf.concat([p[2] for p in parts], 0),
                "counts": tf.concat([p[3] for p in parts], 0)}

    def _restore_from_tensors(self, restored_tensors):
        restored = self._state.restored
        clear = restored.clear()
        with tf.control_dependencies([clear] if clear is not None else []):
            return restored.upsert(restored_tensors["keys"], tf.stack(
                [restored_tensors["stamps"], restored_tensors["counts"]], 1))
