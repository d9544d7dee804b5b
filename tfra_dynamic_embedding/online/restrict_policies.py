"""Restrict policies: cap a `de.Variable`'s size by evicting its stalest or rarest keys.

TFRA's API: a variable made with `restrict_policy=<policy class>` owns a policy that keeps a
status per key (int32): `de.DynamicEmbeddingOptimizer` updates the status of every key it trains
and remembers the optimizer's slot tables; `var.restrict(num_reserved, trigger=...)` then
removes, when the variable holds more than `trigger` keys, all but `num_reserved // shard_num`
keys per shard -- those with the lowest status -- from the variable, the status and the slots.

Example (back to 1 key once over 2; at scale `w.restrict(1_000_000, trigger=1_200_000)`):
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> w = de.Variable(dim=2, restrict_policy=de.FrequencyRestrictPolicy)
    >>> opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam())
    >>> for ids in ([1, 2, 3], [1]):                 # training steps
    ...     with tf.GradientTape() as tape:
    ...         emb, wrapper = de.embedding_lookup(w, tf.constant(ids, tf.int64),
    ...                                            return_trainable=True)
    ...         loss = tf.reduce_sum(emb)
    ...     _ = opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
    >>> _ = w.restrict(1, trigger=2)
    >>> w.export()[0].numpy()                          # key 1, the most trained, stays
    array([1])

`TimestampRestrictPolicy`: status = Unix seconds of the key's last update (oldest out first).
`FrequencyRestrictPolicy`: status = number of updates of the key (rarest out first).

Where the status lives:
- native backend: in the rows themselves. Every native row carries the time of its last write
  and its number of writes, so training keeps the status with no extra table and no extra
  probe; every row has a status (rows written by `upsert` or a restore count too). Keys given
  a status before they have a row (`policy.apply_update(ids)`) wait in a small side table.
- built-in backend (or a variable that also has `eviction=`, whose step clock stamps the
  rows): a second, non-trainable `de.Variable` (int32, dim 1, same devices and partitioner);
  keys written without training (e.g. `upsert`) have no status there and are never evicted.
Either way `policy.status` exports, sizes and checkpoints alike (TFRA's `keys`/`values` entry).
"""

import abc
import copy
import weakref

import tensorflow as tf

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding import checkpoint as checkpoint_lib
from tfra_dynamic_embedding import hooks
from tfra_dynamic_embedding import variable as variable_lib
from tfra_dynamic_embedding.online import eviction as eviction_lib
from tfra_dynamic_embedding.tables import BuiltinKVCreator


class RestrictPolicy(hooks.VariableHook, hooks.AttachedHook, abc.ABC):
    """Base class: `apply_update(ids)` tracks the status of keys, `apply_restriction(
    num_reserved, trigger=...)` evicts down to `num_reserved` keys. Subclasses define
    `fresh_status` (the status table's new values), `combine` (how a row's and a waiting
    status add up) and `row_status` (a native row's status from its metadata).

    A hook (hooks.py) passed as its class, as TFRA does (`restrict_policy=de.
    TimestampRestrictPolicy`): the variable attaches the class, and the instance on the
    variable is the attached state, checkpointed as "restrict_status".
    """

    STATUS = "status"
    argument = "restrict_policy"
    passed_as_class = True

    @classmethod
    def attach(cls, variable):  # pylint: disable=arguments-differ
        """The policy of `variable`."""
        return cls(variable)

    def __init__(self, var):
        if not isinstance(var, variable_lib.Variable):
            raise TypeError(f"var must be a de.Variable; got {var!r}")
        self.var = var
        self.params_in_slots = []   # slot de.Variables of optimizers that trained `var`
        if _rows_keep_status(var):
            self._status = RowStatus(self)
        else:
            self._status = _status_variable(var, self.STATUS, var.checkpoint)

    @property
    def status(self):
        """The status: a `de.Variable` (key -> [int32]), or on native rows a `RowStatus` with
        the same `size`, `export`, `lookup` and checkpoint entry."""
        return self._status

    def apply_update(self, ids):
        """Updates the status of the keys in `ids` (any shape; repeats count once)."""
        keys, _ = tf.unique(tf.reshape(tf.convert_to_tensor(ids, self.var.key_dtype), [-1]))
        if isinstance(self._status, RowStatus):
            return self._status.touch(keys)
        return self._status.upsert(keys, self.fresh_status(self._status, keys))

    def trackables(self):
        return {"restrict_status": self._status}

    def after_write(self, ids):
        """The status update of a training write of `ids`: native rows stamped and counted
        themselves while being written (None); a status table is updated here."""
        if isinstance(self._status, RowStatus):
            return None
        return self.apply_update(ids)

    def after_restore(self, restored):
        """The op that ends a restore of the variable (`restored`, the import): a `RowStatus`
        gives the restored rows the statuses saved with them."""
        if not isinstance(self._status, RowStatus):
            return restored
        with tf.control_dependencies([restored] if restored is not None else []):
            return self._status.settle()

    @abc.abstractmethod
    def fresh_status(self, table, keys):
        """[len(keys), 1] int32 status of `keys` in status `table` after this update (higher =
        kept longer)."""

    @staticmethod
    @abc.abstractmethod
    def combine(row_status, waiting_status):
        """The status of a key from its row's metadata and its waiting status (int32)."""

    @staticmethod
    @abc.abstractmethod
    def row_status(stamps, counts):
        """A row's status (int32) from its metadata: last-write seconds and writes."""

    def apply_restriction(self, num_reserved, **kwargs):
        """Evicts, when the variable holds more than `trigger` (default `num_reserved`) keys,
        all but `num_reserved // shard_num` keys per shard, lowest status first. Returns the op
        (None when eager)."""
        if isinstance(num_reserved, bool) or not isinstance(num_reserved, int):
            raise TypeError(f"num_reserved must be an int; got {num_reserved!r}")
        if num_reserved < 0:
            raise ValueError(f"num_reserved must be >= 0; got {num_reserved}")
        trigger = kwargs.pop("trigger", num_reserved)
        if isinstance(trigger, bool) or not isinstance(trigger, int):
            raise TypeError(f"trigger must be an int; got {trigger!r}")
        if kwargs:
            raise TypeError(f"unexpected arguments {sorted(kwargs)}")
        per_shard = num_reserved // self.var.shard_num
        return tf.cond(self.var.size() > trigger, lambda: self._evict(per_shard), tf.no_op)

    def _evict(self, per_shard):
        ops = []
        for i, device in enumerate(self.var.devices):
            with tf.device(device):
                if isinstance(self._status, RowStatus):
                    keys, status = self._status.export_shard(i)
                else:
                    keys, status = self._status.tables[i].export()
                status = tf.reshape(status, [-1])
                excess = tf.maximum(tf.size(status) - per_shard, 0)
                _, lowest = tf.math.top_k(-status, k=excess, sorted=False)
                gone = tf.gather(keys, lowest)
                tables = [self.var.tables[i], self._status.tables[i]]
                tables += [slot.tables[i] for slot in self.params_in_slots]
                ops += [table.remove(gone) for table in tables]
        return tf.group(*ops)

    def track_slots(self, slots):
        """Remembers slot tables (de.Variables, or TrainableWrappers of them) to evict with
        (the optimizer gives it the slots it makes for the variable)."""
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

    @property
    def tstp_var(self):
        """The status (TFRA's attribute name)."""
        return self._status

    def fresh_status(self, table, keys):
        now = tf.cast(tf.timestamp(), tf.int32)
        return tf.fill(tf.stack([tf.size(keys), 1]), now)

    @staticmethod
    def combine(row_status, waiting_status):
        return tf.maximum(row_status, waiting_status)

    @staticmethod
    def row_status(stamps, counts):
        return tf.cast(stamps, tf.int32)


class FrequencyRestrictPolicy(RestrictPolicy):
    """Rarest out first: the status counts the updates that trained a key."""

    STATUS = "frequency"

    @property
    def freq_var(self):
        """The status (TFRA's attribute name)."""
        return self._status

    def fresh_status(self, table, keys):
        return table.lookup(keys) + 1

    @staticmethod
    def combine(row_status, waiting_status):
        return row_status + waiting_status

    @staticmethod
    def row_status(stamps, counts):
        return tf.cast(tf.minimum(counts, tf.int32.max), tf.int32)


class RowStatus(_tf_private.AutoTrackable):
    """A policy's status kept by native rows: each row's last-write time and write count.

    Keys given a status without a row (`apply_update` of keys the variable does not hold, or a
    restore of statuses before their rows) wait in `waiting`, a built-in table of the status's
    name; a key's status combines both (latest time, summed counts). A restore writes the saved
    statuses into the rows (`settle`), so after it the rows alone hold them again.

    Example:
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> var = de.Variable(dim=4, restrict_policy=de.FrequencyRestrictPolicy)   # native rows
        >>> _, wrapper = de.embedding_lookup(var, tf.constant([6, 6, 8], tf.int64),
        ...                                  return_trainable=True)
        >>> _ = wrapper.update_op()
        >>> keys, counts = var.restrict_policy.status.export()
        >>> keys.shape, counts.shape
        (TensorShape([2]), TensorShape([2, 1]))
    """

    def __init__(self, policy):
        var = policy.var
        # Not attributes AutoTrackable follows: the variable holds the policy and its status.
        object.__setattr__(self, "_policy", policy)
        object.__setattr__(self, "_var", var)
        object.__setattr__(self, "waiting",
                           _status_variable(var, policy.STATUS, checkpoint=False))
        # Tracked as a status variable tracks its tables: the object graph of a checkpoint is
        # the same either way, and a SavedModel exports the tables its functions use.
        self._tables = list(self.waiting.shards.tables)
        if var.checkpoint and not tf.executing_eagerly():
            checkpoint_lib.register_graph_saveable(self, self.waiting.saver_name)

    # -- the de.Variable surface TFRA code reads ----------------------------------------------
    name = property(lambda self: self.waiting.name)
    key_dtype = property(lambda self: self._var.key_dtype)
    value_dtype = property(lambda self: tf.int32)
    dim = property(lambda self: 1)
    devices = property(lambda self: self._var.devices)
    shard_num = property(lambda self: self._var.shard_num)
    # Removing keys from the status removes waiting ones; rows take their status with them.
    tables = property(lambda self: self.waiting.tables)

    def size(self, index=None, name=None):
        """Keys with a status (of shard `index`, or all): the variable's rows and the waiting
        keys without a row."""
        del name
        # Built once per graph and index, like Variable.size: usable in a finalized graph.
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        cache = self.__dict__.setdefault("_size_ops", weakref.WeakKeyDictionary())
        if graph is not None and not graph.building_function and index in cache.get(graph, {}):
            return cache[graph][index]
        with tf.control_dependencies(None):
            if index is None:
                keys, _ = self.waiting.export()
            else:
                keys, _ = self.waiting.tables[index].export()
            held = tf.reduce_sum(tf.cast(self._var.contains(keys), tf.int32))
            size = self._var.size(index) + tf.cast(tf.size(keys) - held, tf.int64)
        if graph is not None and not graph.building_function:
            cache.setdefault(graph, {})[index] = size
        return size

    def export(self, name=None):
        """(keys, [n, 1] int32 statuses) of every key with a status."""
        del name
        parts = [self.export_shard(i) for i in range(self.shard_num)]
        if len(parts) == 1:
            return parts[0]
        return tf.concat([p[0] for p in parts], 0), tf.concat([p[1] for p in parts], 0)

    def lookup(self, keys, name=None):
        """[..., 1] int32 statuses of `keys` (0 for a key without one)."""
        del name
        keys = tf.convert_to_tensor(keys, self.key_dtype)
        known, status = self.export()
        flat = tf.reshape(keys, [-1])
        if keys.dtype == tf.string:   # searched by fingerprint, like the eviction's member test
            known, flat_ids = (tf.strings.to_hash_bucket_fast(t, tf.int64.max)
                               for t in (known, flat))
        else:
            known, flat_ids = tf.cast(known, tf.int64), tf.cast(flat, tf.int64)
        order = tf.argsort(known)
        known, status = tf.gather(known, order), tf.gather(tf.reshape(status, [-1]), order)
        at = tf.minimum(tf.searchsorted(known, flat_ids), tf.maximum(tf.size(known) - 1, 0))
        found = tf.logical_and(tf.size(known) > 0,
                               tf.equal(tf.gather(tf.concat([known, flat_ids[:1]], 0), at),
                                        flat_ids))
        values = tf.where(found, tf.gather(tf.concat([status, [0]], 0), at), 0)
        return tf.reshape(values, tf.concat([tf.shape(keys), [1]], 0))

    # -- updates -------------------------------------------------------------------------------
    def _rows(self):
        """The tables holding the rows (in a SavedModel's export graph: their copies)."""
        return self.__dict__.get("_exported_rows") or _row_tables(self._var)

    def export_shard(self, shard):
        """(keys, [n, 1] statuses) of shard `shard`: its rows' and its waiting keys'."""
        policy = self._policy
        keys, stamps, counts = eviction_lib.row_metadata(self._rows()[shard], self.key_dtype)
        if self.waiting is None:   # an export graph's copy: the rows' statuses only
            return keys, tf.reshape(policy.row_status(stamps, counts), [-1, 1])
        waiting_keys, waiting = self.waiting.tables[shard].export()
        all_keys = tf.concat([keys, waiting_keys], 0)
        unique, index = tf.unique(all_keys)
        n = tf.size(unique)
        rows = tf.math.unsorted_segment_max(  # statuses are >= 0: 0 is "no row" / "not waiting"
            policy.row_status(stamps, counts), index[:tf.size(keys)], n)
        rows = tf.maximum(rows, 0)
        waits = tf.maximum(tf.math.unsorted_segment_max(
            tf.reshape(waiting, [-1]), index[tf.size(keys):], n), 0)
        return unique, tf.reshape(policy.combine(rows, waits), [-1, 1])

    def touch(self, keys):
        """`apply_update` of unique `keys`: rows present are written again unchanged (a zero
        accum stamps and counts them); keys without a row wait."""
        var = self._var
        present = var.contains(keys)
        held = tf.boolean_mask(keys, present)
        written = var.accum(held, tf.zeros([tf.size(held), var.dim], var.value_dtype))
        absent = tf.boolean_mask(keys, tf.logical_not(present))
        waiting = self.waiting.upsert(
            absent, self._policy.fresh_status(self.waiting, absent))
        return tf.group([op for op in (written, waiting) if op is not None])

    def settle(self):
        """Moves the waiting statuses of keys that have rows into those rows (after a restore:
        the rows were written with the restore's time and one write)."""
        ops = []
        for shard, table in enumerate(self._rows()):
            with tf.device(table.device):
                keys, status = self.waiting.tables[shard].export()
                held, written = self._write_rows_status(table, keys, status)
                with tf.control_dependencies([written]):   # keys without rows wait on
                    ops.append(self.waiting.tables[shard].remove(held))
        return tf.group(ops)

    def _write_rows_status(self, table, keys, status):
        """Gives the rows of `table` among `keys` the statuses `status`; returns (the keys that
        have rows there, the op). Keys without a row are skipped."""
        held = table.contains(keys)
        keys = tf.boolean_mask(keys, held)
        status = tf.cast(tf.boolean_mask(tf.reshape(status, [-1]), held), tf.int64)
        rows = table.lookup(keys, tf.zeros([self._var.dim], self._var.value_dtype))
        if isinstance(self._policy, TimestampRestrictPolicy):
            return keys, table.import_with_meta(keys, rows, stamps=status, clear=False)
        return keys, table.import_with_meta(keys, rows, freqs=status, clear=False)

    # -- SavedModel: the export graph holds copies of the row tables; read those ------------------
    def _deserialization_dependencies(self, children):
        del children   # the row tables are exported (and loaded) before this status
        return {f"table_{i}": t for i, t in enumerate(_row_tables(self._var))}

    def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kwargs):
        del tensor_map, options, kwargs
        exported = copy.copy(self)
        object.__setattr__(exported, "_exported_rows",
                           [object_map[t] for t in _row_tables(self._var)])
        # Waiting statuses (keys without rows) stay out of SavedModels: serving has no use
        # for them, and the waiting table is no node of the exported object graph.
        object.__setattr__(exported, "waiting", None)
        object_map[self] = exported
        return []

    # -- checkpoints: the entry of TFRA's status variable (keys, values) ------------------------
    def _serialize_to_tensors(self):
        keys, values = self.export()
        return {checkpoint_lib.KEYS: keys, checkpoint_lib.VALUES: values}

    def _restore_from_tensors(self, restored_tensors):
        return self.import_(restored_tensors[checkpoint_lib.KEYS],
                            restored_tensors[checkpoint_lib.VALUES])

    def import_(self, keys, values, name=None):
        """Replaces every status: saved ones wait, then go into the rows that exist (the
        variable's own restore settles the rest)."""
        del name
        if self.waiting is None:   # an export graph's copy: straight into the rows there are
            values = tf.reshape(values, [-1])
            tables = self._rows()
            if len(tables) == 1:
                return self._write_rows_status(tables[0], keys, values)[1]
            parts, positions = self._var.shards.partition(tf.reshape(keys, [-1]))
            return tf.group([self._write_rows_status(t, k, tf.gather(values, p))[1]
                             for t, k, p in zip(tables, parts, positions)])
        cleared = self.waiting.clear()
        with tf.control_dependencies([cleared] if cleared is not None else []):
            written = self.waiting.upsert(keys, tf.reshape(values, [-1, 1]))
        with tf.control_dependencies([written] if written is not None else []):
            return self.settle()


def _rows_keep_status(var):
    """Whether `var`'s rows carry a usable status: native metadata in wall-clock seconds (a
    variable with `eviction=` stamps its rows with training steps instead)."""
    return var.eviction_state is None and all(
        hasattr(t, "export_chunk") and hasattr(t, "import_with_meta") for t in _row_tables(var))


def _row_tables(var):
    """The backend tables of `var`'s shards (`var.tables` holds TFRA's views of them)."""
    return list(var.shards.tables)


def _status_variable(var, status_name, checkpoint):
    # int32 rows: the built-in table holds them (the native kernels store floating rows)
    return variable_lib.Variable(
        key_dtype=var.key_dtype, value_dtype=tf.int32, dim=1, devices=var.devices,
        partitioner=var.partition_fn, name=f"{var.name}/{status_name}", initializer=0,
        trainable=False, checkpoint=checkpoint, kv_creator=BuiltinKVCreator())
