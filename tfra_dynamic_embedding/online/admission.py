"""Admission: a new key gets a trainable row only once it has earned one.

`de.Variable(..., admission=...)` with
  * `de.CountAdmission(k)`: after the key was in k training batches (an exact count per
    not-yet-admitted key, in a table of its own);
  * `de.BloomAdmission(k, memory_bytes)`: the same count kept approximately in a counting Bloom
    filter of fixed memory (a key may be admitted early when it shares all its counters with
    frequent keys, never late);
  * `de.ProbabilityAdmission(p)`: each time a new key is trained, with probability p.
Until admitted, a key is not written: lookups give it its initializer row (as any unseen id) and
`de.DynamicEmbeddingOptimizer` drops its row update and slots. Keys the table holds are always
trained. The filter's state is checkpointed with the variable.

Example (a key gets a row once it was seen 2 times):
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> w = de.Variable(dim=2, admission=de.CountAdmission(2))
    >>> opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))
    >>> def step(ids):
    ...     with tf.GradientTape() as tape:
    ...         emb, wrapper = de.embedding_lookup(w, tf.constant(ids, tf.int64),
    ...                                            return_trainable=True)
    ...         loss = tf.reduce_sum(emb)
    ...     opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
    ...     return int(w.size())
    >>> step([1, 2]), step([1, 3])
    (0, 1)
"""

import abc
import math

import tensorflow as tf

from tfra_dynamic_embedding import hooks
from tfra_dynamic_embedding import variable as variable_lib
from tfra_dynamic_embedding.tables import BuiltinKVCreator


class Admission(hooks.VariableHook, abc.ABC):
    """Base class: `attach(var)` gives the per-variable filter (`admit(ids, exists)`), which
    `de.Variable(admission=...)` holds (hooks.py)."""

    argument = "admission"

    @abc.abstractmethod
    def attach(self, var):
        """The filter of `var` (a `hooks.AttachedHook`): `admit(ids, exists) -> (keep mask,
        update op)`, `trackables()`."""


def _check_count(k):
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (the batches a key needs) must be a positive int; got {k!r}")


class CountAdmission(Admission):
    """Admits a key in its k-th training batch (k = 1 admits every key)."""

    def __init__(self, k):
        _check_count(k)
        self.k = k

    def __repr__(self):
        return f"de.CountAdmission(k={self.k})"

    def attach(self, var):
        return _CountFilter(self.k, var)


class BloomAdmission(Admission):
    """Admits a key in (about) its k-th training batch, counting in `memory_bytes` of int32
    counters with `num_hashes` hash functions per key."""

    def __init__(self, k, memory_bytes=1 << 20, num_hashes=3):
        _check_count(k)
        if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or \
                memory_bytes < 4:
            raise ValueError(f"memory_bytes must be an int >= 4; got {memory_bytes!r}")
        if isinstance(num_hashes, bool) or not isinstance(num_hashes, int) or \
                not 1 <= num_hashes <= 8:
            raise ValueError(f"num_hashes must be an int in [1, 8]; got {num_hashes!r}")
        self.k = k
        self.memory_bytes = memory_bytes
        self.num_hashes = num_hashes

    def __repr__(self):
        return (f"de.BloomAdmission(k={self.k}, memory_bytes={self.memory_bytes}, "
                f"num_hashes={self.num_hashes})")

    def attach(self, var):
        return _BloomFilter(self, var)


class ProbabilityAdmission(Admission):
    """Admits a new key with probability p each time it is trained."""

    def __init__(self, p, seed=None):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"p must be a probability in (0, 1]; got {p!r}")
        self.p = float(p)
        self.seed = seed

    def __repr__(self):
        return f"de.ProbabilityAdmission(p={self.p})"

    def attach(self, var):
        return _ProbabilityFilter(self.p, self.seed)


class _CountFilter(hooks.AttachedHook):
    """Exact counts of keys not admitted yet, in a built-in table beside the variable."""

    def __init__(self, k, var):
        self.k = k
        self.counts = variable_lib.Variable(
            key_dtype=var.key_dtype, value_dtype=tf.int64, dim=1, devices=var.devices,
            partitioner=var.partition_fn, name=f"{var.name}/admission_counts", initializer=0,
            trainable=False, checkpoint=var.checkpoint, kv_creator=BuiltinKVCreator())

    def trackables(self):
        return {"admission_counts": self.counts}

    def admit(self, ids, exists):
        """(keep mask over `ids`, the op updating the filter): keep = held or admitted now."""
        new = tf.logical_not(exists)
        new_ids = tf.boolean_mask(ids, new)
        seen = self.counts.lookup(new_ids)[:, 0] + 1
        admitted = seen >= self.k
        update = tf.group(
            self.counts.upsert(tf.boolean_mask(new_ids, ~admitted),
                               tf.boolean_mask(seen, ~admitted)[:, None]),
            self.counts.remove(tf.boolean_mask(new_ids, admitted)))
        return _scatter_keep(exists, new, admitted), update


class _BloomFilter(hooks.AttachedHook):
    """A counting Bloom filter: `num_hashes` int32 counters per key, the smallest is its count."""

    def __init__(self, config, var):
        self.k = config.k
        self.num_hashes = config.num_hashes
        self.size = config.memory_bytes // 4
        with tf.init_scope(), tf.device(var.devices[0]):
            self.counters = tf.Variable(
                tf.zeros([self.size], tf.int32), trainable=False,
                name=f"{var.name.replace('/', '_')}_admission_bloom")

    def trackables(self):
        return {"admission_bloom": self.counters}

    def _slots(self, ids):
        """[len(ids), num_hashes] counter positions (independent hashes of each key)."""
        text = ids if ids.dtype == tf.string else tf.strings.as_string(ids)
        return tf.stack([tf.strings.to_hash_bucket_fast(
            tf.strings.join([text, f"#{i}"]), self.size) for i in range(self.num_hashes)], 1)

    def admit(self, ids, exists):
        new = tf.logical_not(exists)
        new_ids = tf.boolean_mask(ids, new)
        slots = self._slots(new_ids)
        seen = tf.reduce_min(tf.gather(self.counters, slots), axis=1) + 1
        admitted = seen >= self.k
        # Keys not admitted yet count this batch (a key's own repeated position counts twice:
        # early, never late). Admitted keys leave their counters as they are.
        waiting = tf.reshape(tf.boolean_mask(slots, ~admitted), [-1])
        update = self.counters.scatter_add(tf.IndexedSlices(tf.ones_like(waiting, tf.int32),
                                                            waiting))
        return _scatter_keep(exists, new, admitted), update


class _ProbabilityFilter(hooks.AttachedHook):
    """Draws for each new key; no state to keep."""

    def __init__(self, p, seed):
        self.p = p
        self.seed = seed

    def admit(self, ids, exists):
        new = tf.logical_not(exists)
        draws = tf.random.uniform([tf.reduce_sum(tf.cast(new, tf.int32))], seed=self.seed)
        return _scatter_keep(exists, new, draws < self.p), tf.no_op()


def _scatter_keep(exists, new, admitted):
    """keep[i] = exists[i] or (ids[i] new and admitted in the order of the new ones)."""
    admitted_all = tf.scatter_nd(tf.where(new), tf.cast(admitted, tf.int32),
                                 tf.shape(exists, out_type=tf.int64))
    return tf.logical_or(exists, admitted_all > 0)


def expected_false_admissions(num_keys, memory_bytes, num_hashes):
    """The chance a key never seen shares all its counters with others (Bloom's estimate):
    the share of keys a BloomAdmission may admit early, for sizing `memory_bytes`."""
    counters = memory_bytes // 4
    return (1 - math.exp(-num_hashes * num_keys / counters)) ** num_hashes
