"""Restrict policies: cap a `de.Variable`'s size by evicting its stalest or rarest keys.

TFRA's API: a variable made with `restrict_policy=<policy class>` owns a policy that keeps a
status per key in a second, non-trainable `de.Variable` (int32, dim 1, same devices and
partitioner). `de.DynamicEmbeddingOptimizer` updates the status of every key it trains and
remembers the optimizer's slot tables; `var.restrict(num_reserved, trigger=...)` then removes,
when the variable holds more than `trigger` keys, all but `num_reserved // shard_num` keys per
shard -- those with the lowest status -- from the variable, the status and the slots.

    w = de.get_variable("user", dim=8, restrict_policy=de.TimestampRestrictPolicy)
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam())
    ...                                   # training steps
    w.restrict(1_000_000, trigger=1_200_000)   # back to 1M keys once over 1.2M

`TimestampRestrictPolicy`: status = Unix seconds of the key's last update (oldest out first).
`FrequencyRestrictPolicy`: status = number of updates that trained the key (rarest out first).
Keys written without training (e.g. `upsert`) have no status and are never evicted.
"""

import abc

import tensorflow as tf

from tfra_dynamic_embedding import variable as variable_lib


class RestrictPolicy(abc.ABC):
    """Base class: `apply_update(ids)` tracks the status of keys, `apply_restriction(residue,
    trigger=...)` evicts down to `residue` keys. Subclasses define `_fresh_status(keys)`."""

    STATUS = "status"

    def __init__(self, var):
        if not isinstance(var, variable_lib.Variable):
            raise TypeError(f"var must be a de.Variable; got {var!r}")
        self.var = var
        self.params_in_slots = []   # slot de.Variables of optimizers that trained `var`
        self._status = variable_lib.Variable(
            key_dtype=var.key_dtype, value_dtype=tf.int32, dim=1, devices=var.devices,
            partitioner=var.partition_fn, name=f"{var.name}/{self.STATUS}", initializer=0,
            trainable=False, checkpoint=var.checkpoint,
            kv_creator=_status_creator())

    @property
    def status(self):
        """The status `de.Variable` (key -> [int32])."""
        return self._status

    def apply_update(self, indices):
        """Updates the status of the keys in `indices` (any shape; repeats count once)."""
        keys, _ = tf.unique(tf.reshape(tf.convert_to_tensor(indices, self.var.key_dtype), [-1]))
        return self._status.upsert(keys, self._fresh_status(keys))

    @abc.abstractmethod
    def _fresh_status(self, keys):
        """[len(keys), 1] int32 status of `keys` after this update (higher = kept longer)."""

    def apply_restriction(self, residue, **kwargs):
        """Evicts, when the variable holds more than `trigger` (default `residue`) keys, all but
        `residue // shard_num` keys per shard, lowest status first. Returns the op (None when
        eager)."""
        if isinstance(residue, bool) or not isinstance(residue, int):
            raise TypeError(f"residue (num_reserved) must be an int; got {residue!r}")
        if residue < 0:
            raise ValueError(f"residue (num_reserved) must be >= 0; got {residue}")
        trigger = kwargs.pop("trigger", residue)
        if isinstance(trigger, bool) or not isinstance(trigger, int):
            raise TypeError(f"trigger must be an int; got {trigger!r}")
        if kwargs:
            raise TypeError(f"unexpected arguments {sorted(kwargs)}")
        per_shard = residue // self.var.shard_num
        return tf.cond(self.var.size() > trigger, lambda: self._evict(per_shard), tf.no_op)

    def _evict(self, per_shard):
        ops = []
        for i, device in enumerate(self.var.devices):
            with tf.device(device):
                keys, status = self._status.tables[i].export()
                status = tf.reshape(status, [-1])
                excess = tf.maximum(tf.size(status) - per_shard, 0)
                _, lowest = tf.math.top_k(-status, k=excess, sorted=False)
                gone = tf.gather(keys, lowest)
                tables = [self.var.tables[i], self._status.tables[i]]
                tables += [slot.tables[i] for slot in self.params_in_slots]
                ops += [table.remove(gone) for table in tables]
        return tf.group(*ops)

    def _track_params_in_slots(self, slots):
        """Remembers slot tables (de.Variables, or TrainableWrappers of them) to evict with."""
        for slot in slots:
            params = getattr(slot, "params", slot)
            if not isinstance(params, variable_lib.Variable):
                raise TypeError(f"slots must be de.Variables or TrainableWrappers; got {slot!r}")
            if params.shard_num != self.var.shard_num:
                raise ValueError(f"slot {params.name} has {params.shard_num} shards, "
                                 f"{self.var.name} has {self.var.shard_num}")
            if all(p is not params for p in self.params_in_slots):
                self.params_in_slots.append(params)


class TimestampRestrictPolicy(RestrictPolicy):
    """Oldest out first: the status is the Unix time (seconds) of a key's last update."""

    STATUS = "timestamp"

    def _fresh_status(self, keys):
        now = tf.cast(tf.timestamp(), tf.int32)
        return tf.fill(tf.stack([tf.size(keys), 1]), now)


class FrequencyRestrictPolicy(RestrictPolicy):
    """Rarest out first: the status counts the updates that trained a key."""

    STATUS = "frequency"

    def _fresh_status(self, keys):
        return self._status.lookup(keys) + 1


def _status_creator():
    # int32 rows: the built-in table holds them (the native kernels store floating rows)
    from tfra_dynamic_embedding.tables import BuiltinKVCreator  # pylint: disable=import-outside-toplevel
    return BuiltinKVCreator()
