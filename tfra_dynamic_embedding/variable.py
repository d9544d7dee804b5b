"""`de.Variable`: an embedding table that grows, sharded over devices as one hash table per device.

Keys are split over the shard tables by `partitioner(keys, shard_num)` with `tf.dynamic_partition`
and the results are joined back with `tf.dynamic_stitch`. Rows of missing keys come from the
initializer, one draw per key; `lookup` never inserts.

Example:
    >>> w = Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=4,
    ...              devices=["/CPU:0", "/CPU:0"], initializer=tf.random_normal_initializer())
    >>> _ = w.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 4]))
    >>> rows, exists = w.lookup(tf.constant([[1, 5]], tf.int64), return_exists=True)
    >>> rows.shape, exists.numpy()
    (TensorShape([1, 2, 4]), array([[ True, False]]))
    >>> int(w.size())
    2
"""

import collections.abc
import contextlib
import copy
import dataclasses
import weakref

import numpy as np
import tensorflow as tf

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding import checkpoint as checkpoint_lib
from tfra_dynamic_embedding import hooks as hooks_lib
from tfra_dynamic_embedding import initializers
from tfra_dynamic_embedding import tables as tables_lib
from tfra_dynamic_embedding import trainable as trainable_lib
from tfra_dynamic_embedding.tables import files
from tfra_dynamic_embedding.tables import native_slots

KEY_DTYPES = (tf.int32, tf.int64, tf.string)
VALUE_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
# Integer and string rows (e.g. a restrict policy's status) live in the built-in backend only.
BUILTIN_VALUE_DTYPES = (tf.int8, tf.int32, tf.int64, tf.string)
# The TypeError of an argument that is not a hook for it (hooks.py; the hooks live in online/).
_HOOK_ERRORS = {
    "eviction": "eviction must be a de.Eviction; got {!r}",
    "restrict_policy": ("restrict_policy must be a de.RestrictPolicy subclass such as "
                        "de.TimestampRestrictPolicy; got {!r}"),
    "admission": ("admission must be a de.CountAdmission, de.BloomAdmission or "
                  "de.ProbabilityAdmission; got {!r}"),
}


class GraphKeys:
    """TFRA's collection names, kept for code that adds `de.Variable`s to them by hand
    (`tf.compat.v1.add_to_collection(de.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES, var)`); variables
    are not added automatically."""
    DYNAMIC_EMBEDDING_VARIABLES = "dynamic_embedding_variables"
    TRAINABLE_DYNAMIC_EMBEDDING_VARIABLES = "trainable_dynamic_embedding_variables"


class DTypeError(TypeError, ValueError):
    """A tensor of the wrong dtype was passed (both a TypeError and a ValueError, like TF's)."""


class ShapeError(ValueError, tf.errors.InvalidArgumentError):
    """Rows of the wrong shape, caught when the op is built: a ValueError, and also the
    InvalidArgumentError ("Expected shape ...") that TFRA's table kernels raise when run."""

    def __init__(self, message):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


@dataclasses.dataclass(frozen=True)
class Shards:
    """A Variable's shards as hooks (online/) see them: `tables[i]` is shard i's backend table
    (a `KVTable`), `devices[i]` its device, and `partition(flat_keys)` splits 1-D keys over the
    shards: (keys per shard, their positions in `flat_keys`), by the variable's partitioner.

    Example:
        >>> var = Variable(dim=2, devices=["/CPU:0", "/CPU:0"])
        >>> _ = var.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2]))
        >>> parts, positions = var.shards.partition(tf.constant([1, 2, 3], tf.int64))
        >>> [p.numpy().tolist() for p in parts]
        [[2], [1, 3]]
        >>> [int(table.size()) for table in var.shards.tables]
        [1, 2]
    """

    tables: tuple
    devices: tuple
    partition: collections.abc.Callable

    def __len__(self):
        return len(self.tables)


def default_partition_fn(keys, shard_num):
    """Shard id of every key: `keys mod shard_num` (never negative) or a stable string hash.

    Example:
        >>> default_partition_fn(tf.constant([-1, 5], tf.int64), 4)
        <tf.Tensor: shape=(2,), dtype=int32, numpy=array([3, 1], dtype=int32)>
    """
    if keys.dtype == tf.string:
        return tf.cast(tf.strings.to_hash_bucket_fast(keys, shard_num), tf.int32)
    return tf.cast(tf.math.floormod(keys, tf.cast(shard_num, keys.dtype)), tf.int32)


class Variable(_tf_private.AutoTrackable):
    """A dynamic embedding table: `key -> [dim]` rows in one hash table per device.

    Args:
      key_dtype: tf.int32, tf.int64 or tf.string.
      value_dtype: tf.float16, tf.bfloat16, tf.float32 or tf.float64 (tf.int8, tf.int32,
        tf.int64 or tf.string for non-trainable tables on the built-in backend, e.g. a restrict
        policy's status).
      dim: row length, > 0.
      devices: a device string or list of them, one shard table per entry (default: the current
        device; under a `tf.distribute.ParameterServerStrategy` without a device scope, one
        shard per PS task).
      partitioner: `fn(keys, shard_num) -> int32 shard ids` in [0, shard_num).
      shared_name: tables with the same shared name on one device share storage.
      name: the variable's name (also its checkpoint name in graph mode).
      initializer: None (zeros), a number, a `[1]` or `[dim]` array, a TF/Keras initializer or
        its name. A seeded random initializer makes a key's row a pure function of (seed, key).
      trainable: whether optimizers may train it.
      checkpoint: whether checkpoints save it.
      init_size: expected number of keys (a sizing hint for backends that pre-allocate).
      kv_creator: a `KVCreator` choosing the backend (default: native if built, else built-in).
      restrict_policy: None or a `de.RestrictPolicy` class (`de.TimestampRestrictPolicy`,
        `de.FrequencyRestrictPolicy`); `restrict(n)` then evicts down to n keys.
      bp_v2: training adds each step's change to the rows (accum) instead of overwriting them,
        so asynchronous workers that update the same keys do not undo each other.
      short_file_name: TFRA's switch for short names: optimizer slot variables are named
        `<name>/<slot>` without the optimizer's name (`de.get_variable` also drops the scope).
      eviction: None or a `de.Eviction`: a capacity bound (LRU / LFU) and/or a time to live
        that `de.DynamicEmbeddingOptimizer` enforces at every training step; None on a
        trainable variable: the bound of `kv_creator` if it has one (`de.HkvHashTableCreator`).
      admission: None or a `de.CountAdmission` / `de.BloomAdmission` / `de.ProbabilityAdmission`:
        new keys get rows only once admitted (until then training does not write them).

    `eviction`, `restrict_policy` and `admission` are hooks (hooks.py, online/): the variable
    attaches them and they work on its public shard view, `shards`. TFRA's method form
    `var.embedding_lookup(ids, ...)` comes with the alias package's import (compat/methods.py).
    """

    def __init__(self,
                 key_dtype=tf.int64,
                 value_dtype=tf.float32,
                 dim=1,
                 devices=None,
                 partitioner=default_partition_fn,
                 shared_name=None,
                 name="DynamicEmbedding_Variable",
                 initializer=None,
                 trainable=True,
                 checkpoint=True,
                 init_size=0,
                 kv_creator=None,
                 restrict_policy=None,
                 bp_v2=False,
                 short_file_name=False,
                 eviction=None,
                 admission=None):
        self._short_file_name = bool(short_file_name)
        self._key_dtype = _checked_dtype(key_dtype, KEY_DTYPES, "key_dtype")
        self._value_dtype = _checked_dtype(value_dtype, VALUE_DTYPES + BUILTIN_VALUE_DTYPES,
                                           "value_dtype")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"dim must be a positive int; got {dim!r}")
        if not callable(partitioner):
            raise ValueError(f"partitioner must be callable; got {partitioner!r}")
        if not isinstance(init_size, int) or init_size < 0:
            raise ValueError(f"init_size must be a non-negative int; got {init_size!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string; got {name!r}")
        self._dim = dim
        self._name = name
        self._devices = _device_list(devices)
        self._partitioner = partitioner
        self._initializer = initializer
        # What the shard tables draw missing keys' rows from (a description; each backend draws
        # it its own way, nothing calls back into this variable).
        self._init = initializers.describe(initializer, dim, self._value_dtype)
        self._trainable = trainable
        self._checkpoint = checkpoint
        self._init_size = init_size
        # Lookup-site name -> TrainableWrapper (trainable.py). Not a checkpoint dependency: the
        # wrappers hold a per-step copy of rows, and the tables are what is saved.
        object.__setattr__(self, "_trainable_store", {})
        self._kv_creator = kv_creator or tables_lib.default_kv_creator(self._value_dtype,
                                                                          self._key_dtype)
        if not isinstance(self._kv_creator, tables_lib.KVCreator):
            raise ValueError(f"kv_creator must be a de.KVCreator; got {kv_creator!r}")
        if self._value_dtype in BUILTIN_VALUE_DTYPES and isinstance(self._kv_creator,
                                                                   tables_lib.NativeKVCreator):
            raise ValueError(f"value_dtype {self._value_dtype.name} needs the built-in backend "
                             f"(kv_creator=de.BuiltinKVCreator()); native tables hold "
                             f"floating rows")

        # Tables are created outside any tf.function being traced, like tf.Variable's storage.
        with tf.init_scope():
            scope = scope_name(name)
            if not tf.executing_eagerly():
                # The graph's unique name for this variable (name, name_1, ...), held by a NoOp
                # of that name: it is the checkpoint name a tf.compat.v1.train.Saver uses, and
                # the op a saved meta graph's SAVEABLE_OBJECTS entry refers to on import.
                scope = tf.no_op(name=scope).name + "/"
            with tf.name_scope(scope) as scope:
                self._unique_name = scope.rstrip("/") if scope else name
                shard_num = len(self._devices)
                self._tables = [
                    self._kv_creator.create(
                        self._key_dtype, self._value_dtype, dim,
                        name=f"{tables_lib.base.op_name(name)}_mht_{i + 1}of{shard_num}",
                        device=device,
                        shared_name=(f"{shared_name}_mht_{i + 1}of{shard_num}"
                                     if shared_name else None),
                        init_size=init_size // shard_num)
                    for i, device in enumerate(self._devices)
                ]
                for table in self._tables:
                    table.set_owner(self)
            if checkpoint and not tf.executing_eagerly():
                checkpoint_lib.register_graph_saveable(self, self._unique_name)
            # Not added to graph collections (as TFRA since 0.6): a Variable owns no tensor,
            # and a collection holding one breaks `import_meta_graph`.
        if not isinstance(bp_v2, bool):
            raise ValueError(f"bp_v2 must be a bool; got {bp_v2!r}")
        self._bp_v2 = bp_v2
        # The primary variable when this one holds an optimizer slot (`set_slot_of`).
        self._slot_of = None
        # argument -> the hooks.AttachedHook of `eviction`, `restrict_policy`, `admission`
        # (online/); not an attribute AutoTrackable follows: their trackables are tracked below.
        object.__setattr__(self, "_hooks", {})
        if eviction is None and trainable:   # e.g. de.HkvHashTableCreator: max_capacity per shard
            eviction = self._kv_creator.default_eviction(len(self._devices))
        for argument, hook in (("eviction", eviction), ("restrict_policy", restrict_policy),
                               ("admission", admission)):
            if hook is None:
                continue
            if not hooks_lib.is_hook(hook, argument):
                raise TypeError(_HOOK_ERRORS[argument].format(hook))
            state = hook.attach(self)
            self._hooks[argument] = state
            if checkpoint:   # the state is saved and restored with the variable
                for trackable_name, trackable in state.trackables().items():
                    self._track_trackable(trackable, name=trackable_name)

    # -- properties -------------------------------------------------------------------------
    @property
    def name(self):
        return self._name

    @property
    def key_dtype(self):
        return self._key_dtype

    @property
    def value_dtype(self):
        return self._value_dtype

    @property
    def dim(self):
        return self._dim

    @property
    def devices(self):
        return list(self._devices)

    @property
    def shard_num(self):
        return len(self._tables)

    @property
    def partition_fn(self):
        return self._partitioner

    @property
    def initializer(self):
        return self._initializer

    @property
    def trainable(self):
        return self._trainable

    @property
    def init_spec(self):
        """The `InitSpec` new keys' rows are drawn from (`initializers.describe` of
        `initializer`)."""
        return self._init

    @property
    def checkpoint(self):
        return self._checkpoint

    @property
    def init_size(self):
        return self._init_size

    @property
    def trainable_store(self):
        """{wrapper name: TrainableWrapper} of this variable's lookup sites."""
        return dict(self._trainable_store)

    def stored_trainable(self, name):
        """The TrainableWrapper kept under exactly `name` (`store_trainable`), or None."""
        return self._trainable_store.get(name)

    def store_trainable(self, name, wrapper):
        """Keeps `wrapper` (a TrainableWrapper of this variable, e.g. a ShadowVariable the user
        made) as the one of the lookup called `name`, found by `get_trainable_by_name`."""
        self._trainable_store[name] = wrapper

    def track_wrapper(self, wrapper, name):
        """Makes `wrapper` (a TrainableWrapper of this variable's lookup called `name`) a
        checkpoint dependency, `trainable_wrapper/<name>`, that saves only a placeholder: a
        restore then also matches the wrappers optimizers list among their variables."""
        self._track_trackable(wrapper, name=f"trainable_wrapper/{name}", overwrite=True)

    def get_trainable_by_name(self, name):
        """The TrainableWrapper of the lookup called `name` (e.g. in eager mode or a
        tf.function, where a lookup site is known by its name), or None."""
        store = self._trainable_store
        # A sparse lookup's wrapper is named after its inner lookup, as in TFRA.
        for candidate in (name, f"{name}/embedding_lookup",
                          f"{name}/embedding_lookup_sparse/embedding_lookup"):
            if candidate in store:
                return store[candidate]
            full = trainable_lib.wrapper_name(candidate)
            if full in store:
                return store[full]
        return None

    @property
    def short_file_name(self):
        return self._short_file_name

    @property
    def bp_v2(self):
        """Whether training adds each step's row updates (accum) instead of overwriting rows,
        so that asynchronous workers updating the same keys do not undo each other."""
        return self._bp_v2

    @property
    def restrict_policy(self):
        """The `de.RestrictPolicy` instance made from `restrict_policy=`, or None."""
        return self._hooks.get("restrict_policy")

    @property
    def admission_filter(self):
        """The filter made from `admission=` (online/admission.py), or None."""
        return self._hooks.get("admission")

    @property
    def eviction_state(self):
        """The `EvictionState` made from `eviction=` (online/eviction.py), or None."""
        return self._hooks.get("eviction")

    @property
    def shards(self):
        """The public view of the shards that hooks (online/) work on: `Shards`."""
        return Shards(tuple(self._tables), tuple(self._devices), self._partition)

    @property
    def saver_name(self):
        """The name a `tf.compat.v1.train.Saver` saves this variable under: its graph's unique
        name (`name`, `name_1`, ... in a graph; `name` in eager mode)."""
        return self._unique_name

    @property
    def slot_of(self):
        """The primary `de.Variable` when this one holds an optimizer slot of it, else None."""
        return self._slot_of

    def set_slot_of(self, primary):
        """Marks this variable as an optimizer slot of `primary` (the optimizer does): then a
        SavedModel of its tables leaves it out (serving needs no slot)."""
        # Untracked: a tracked attribute would make the primary a checkpoint child of its slot.
        object.__setattr__(self, "_slot_of", primary)
        for table in self._tables:
            table.set_owner(None if primary is not None else self)

    @property
    def kv_creator(self):
        return self._kv_creator

    @property
    def tables(self):
        """TFRA's per-shard tables, one per device (`de.CuckooHashTable` views of the shards):
        `lookup(keys)` (missing keys get the variable's default row), `insert`, `remove`,
        `size`, `export`, `resource_handle`, file save/load. `kv_table` is the backend table."""
        views = self.__dict__.get("_table_views")
        if views is None:
            with tf.init_scope():
                default = self._default_row()
                views = tuple(tables_lib.CuckooHashTable.view_of(t, default, t.name)
                              for t in self._tables)
            object.__setattr__(self, "_table_views", views)  # not a checkpoint dependency
        return views

    def _default_row(self):
        """The shard tables' static default value (TFRA's): the initializer's row of key 0 --
        the constant row, a seeded initializer's keyed row, or one draw of an unseeded one."""
        return self._init.rows(tf.zeros([1], self._key_dtype))[0]

    # -- data plane -------------------------------------------------------------------------
    def restrict(self, num_reserved, **kwargs):
        """Evicts keys by the restrict policy (`trigger=` keys at most before it acts; see
        online/restrict_policies.py); without a policy, a no-op with a warning."""
        if self.restrict_policy is None:
            tf.get_logger().warning("restrict() called on %s, which has no restrict_policy",
                                    self._name)
            return tf.no_op()
        return self.restrict_policy.apply_restriction(num_reserved, **kwargs)

    def lookup(self, keys, return_exists=False, name=None):
        """Rows for `keys` (any shape) -> `keys.shape + [dim]`; missing keys get initializer rows.

        Never inserts. With `return_exists=True` also returns a bool tensor shaped like `keys`.
        Each shard table draws the missing keys' rows from the initializer's description
        (native: in its fused lookup kernel; built-in: with TF ops).
        """
        keys = self._keys_tensor(keys)
        with tf.name_scope(name or scope_name(self._name + "_lookup")):
            flat = tf.reshape(keys, [-1])
            rows, exists = self._map_shards(flat, lambda table, shard_keys: table.lookup_or_init(
                shard_keys, self._init, return_exists=return_exists))
            rows = self._unflatten(rows, keys)
            if not return_exists:
                return rows
            exists = tf.reshape(exists, tf.shape(keys))
            exists.set_shape(keys.shape)
            return rows, exists

    # -- optimizer slots kept in the records (native backend; tables/native_slots.py) ------
    def slot_creator(self, fill):
        """The KVCreator of this variable's optimizer slot starting at `fill`: with native
        shard tables the slot lives in the records of this variable's tables (read and written
        with the rows by `lookup_groups` / `upsert_groups`); otherwise tables of its own."""
        if native_slots.fusable(self._tables):
            return native_slots.SlotColumnsCreator(self._tables, fill, self._kv_creator)
        return self._kv_creator

    def slot_groups(self, slots):
        """The column groups of `slots` (slot `de.Variable`s) in this variable's records, or
        None unless every one of them lives there."""
        groups = []
        for slot in slots:
            tables = slot.shards.tables
            if len(tables) != len(self._tables) or not all(
                    isinstance(v, native_slots.NativeSlotView) and v.table is t
                    for v, t in zip(tables, self._tables)):
                return None
            groups.append(tables[0].group)
        return groups

    def lookup_groups(self, keys, groups):
        """The rows of each column group in `groups` (0: the rows, g >= 1: slot groups) for
        1-D `keys`: a list of `[n, dim]` tensors, one probe per key (missing keys get zeros /
        the slots' fills)."""
        flat = tf.reshape(self._keys_tensor(keys), [-1])
        if self.shard_num == 1:
            return native_slots.find_groups(self._tables[0], flat, groups)[0]
        parts, positions = self._partition(flat)
        per_shard = []
        for table, part in zip(self._tables, parts):
            with tf.device(table.device):
                per_shard.append(native_slots.find_groups(table, part, groups)[0])
        return [tf.dynamic_stitch(positions, [rows[j] for rows in per_shard])
                for j in range(len(groups))]

    def upsert_groups(self, keys, values, groups):
        """Writes `values[j]` (`[n, dim]`) into column group `groups[j]` of 1-D `keys`, one
        probe per key (a new key's other groups start at zeros / their fills)."""
        flat = tf.reshape(self._keys_tensor(keys), [-1])
        values = [tf.convert_to_tensor(v, self._value_dtype) for v in values]
        if self.shard_num == 1:
            return native_slots.upsert_groups(self._tables[0], flat, values, groups)
        parts, positions = self._partition(flat)
        writes = []
        for table, part, pos in zip(self._tables, parts, positions):
            with tf.device(table.device):
                writes.append(native_slots.upsert_groups(
                    table, part, [tf.gather(v, pos) for v in values], groups))
        return tf.group(*writes)

    def contains(self, keys, name=None):
        """A bool tensor shaped like `keys`: whether each key has a row. Never inserts, draws
        no initial rows (native tables probe only their index)."""
        keys = self._keys_tensor(keys)
        with tf.name_scope(name or scope_name(self._name + "_contains")):
            exists, _ = self._map_shards(tf.reshape(keys, [-1]),
                                         lambda table, k: (table.contains(k), None))
            exists = tf.reshape(exists, tf.shape(keys))
            exists.set_shape(keys.shape)
            return exists

    def find_or_insert(self, keys, name=None):
        """Rows for `keys`, inserting initializer rows for missing keys; returns (rows, exists).

        Only the missing keys draw from the initializer, e.g. to warm a table before serving.
        (Training inserts through the optimizer's write-back instead.)
        """
        keys = self._keys_tensor(keys)
        with tf.name_scope(name or scope_name(self._name + "_find_or_insert")):
            rows, exists = self._map_shards(
                tf.reshape(keys, [-1]),
                lambda table, shard_keys: table.find_or_insert(shard_keys, self._init))
            exists = tf.reshape(exists, tf.shape(keys))
            exists.set_shape(keys.shape)
            return self._unflatten(rows, keys), exists

    def upsert(self, keys, values, name=None):
        """Insert or overwrite the rows of `keys`; `values` is shaped `keys.shape + [dim]`."""
        return self._write(keys, values, "values", lambda t, k, v: t.insert(k, v),
                           name or self._name + "_upsert")

    def accum(self, keys, old_values, new_values=None, exists=None, name=None):
        """TFRA's `accum(keys, old_values, new_values, exists)`: keys with `exists` True that
        are still present get `new_values - old_values` added; keys with `exists` False that are
        still absent are set to `new_values`; others (changed by another writer) are left alone.

        `accum(keys, deltas)` (no new_values, no exists) adds `deltas` (shaped
        `keys.shape + [dim]`) to the rows of `keys`; missing keys start at 0.
        """
        deltas = old_values
        if new_values is None and exists is None:
            return self._write(keys, deltas, "deltas", lambda t, k, v: t.accum(k, v),
                               name or self._name + "_accum")
        if new_values is None or exists is None:
            raise ValueError("accum(keys, old_values, new_values, exists) needs both new_values "
                             "and exists")
        keys = self._keys_tensor(keys)
        old = self._values_tensor(deltas, keys, "old_values")
        new = self._values_tensor(new_values, keys, "new_values")
        exists = tables_lib.base.exists_like_keys(exists, keys, self._name)
        with tf.name_scope(scope_name(name or self._name + "_accum")):
            flat, old = self._flat_rows(keys, old, "old_values")
            _, new = self._flat_rows(keys, new, "new_values")
            exists = tf.reshape(exists, [-1])
            # As TFRA: a key another writer removed (or inserted) since `exists` was read is
            # left alone rather than re-inserted (or overwritten).
            _, present = self._map_shards(flat, lambda t, k: t.lookup_with_exists(
                k, tf.zeros([tf.size(k), self._dim], self._value_dtype)))
            present = tf.reshape(present, [-1])   # a known rank for boolean_mask
            add = tf.logical_and(exists, present)
            put = tf.logical_not(tf.logical_or(exists, present))
            added = self.accum(tf.boolean_mask(flat, add), tf.boolean_mask(new - old, add))
            with tf.control_dependencies([added] if added is not None else []):
                return self.upsert(tf.boolean_mask(flat, put), tf.boolean_mask(new, put))

    def remove(self, keys, name=None):
        """Delete `keys` from the table (missing keys are ignored)."""
        keys = self._keys_tensor(keys)
        with tf.name_scope(name or scope_name(self._name + "_remove")):
            flat = tf.reshape(keys, [-1])
            if self.shard_num == 1:
                return self._tables[0].remove(flat)
            parts, _ = self._partition(flat)
            return tf.group(*[t.remove(p) for t, p in zip(self._tables, parts)])

    def clear(self, name=None):
        """Delete every key of every shard."""
        with tf.name_scope(name or scope_name(self._name + "_clear")):
            return tf.group(*[t.clear() for t in self._tables])

    def size(self, index=None, name=None):
        """Number of keys (int64): of shard `index`, or of all shards when index is None.

        In a tf.compat.v1 graph the op is built once per graph and index (as TFRA does), so
        `size()` also works after the graph is finalized (e.g. in a MonitoredTrainingSession);
        `name` names that first op.
        """
        if index is not None and not 0 <= index < self.shard_num:
            raise ValueError(
                f"index must be in [0, {self.shard_num}) for {self._name}; got {index!r}")
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        cache = self.__dict__.setdefault("_size_ops", weakref.WeakKeyDictionary())
        if graph is not None and not graph.building_function and (index in cache.get(graph, {})):
            return cache[graph][index]
        # The cached op must not carry the caller's control dependencies.
        with tf.control_dependencies(None), \
                tf.name_scope(name or scope_name(self._name + "_size")):
            if index is not None:
                size = self._tables[index].size()
            else:
                size = tf.add_n([t.size() for t in self._tables])
        if graph is not None and not graph.building_function:
            cache.setdefault(graph, {})[index] = size
        return size

    def export(self, name=None):
        """(keys, values) of all shards: `[n]` and `[n, dim]`, in shard order."""
        with tf.name_scope(name or scope_name(self._name + "_export")):
            exported = [t.export() for t in self._tables]
            if len(exported) == 1:
                return exported[0]
            return (tf.concat([k for k, _ in exported], 0), tf.concat([v for _, v in exported], 0))

    def import_(self, keys, values, name=None):
        """Replace the whole content with `keys`/`values`, re-partitioned over the current shards."""
        keys = self._keys_tensor(keys)
        values = self._values_tensor(values, keys, "values")
        with tf.name_scope(name or scope_name(self._name + "_import")):
            flat_keys, flat_values = self._flat_rows(keys, values, "values")
            if self.shard_num == 1:
                return self._tables[0].import_(flat_keys, flat_values)
            # Split where the rows are (e.g. a PS that restored them), not on the client.
            with _task_cpu_scope(keys.device or self._tables[0].device):
                parts, positions = self._partition(flat_keys)
                parts = [(p, tf.gather(flat_values, pos)) for p, pos in zip(parts, positions)]
            return tf.group(*[t.import_(p, v) for t, (p, v) in zip(self._tables, parts)])

    # -- files (TFRA's save_to_file_system; see tables/files.py) --------------------------
    def save_to_file_system(self, dirpath, proc_size=1, proc_rank=0, file_name_list=None,
                            dirpath_env=files.ENV_DIR, append_to_file=False,
                            buffer_size=4194304, name=None):
        """Op saving every shard, all or nothing: shard i goes to
        `<name>_mht_<i+1>of<n>_rank<proc_rank>_size<proc_size>` (or `file_name_list[i]`) in a new
        generation directory under `dirpath`, then one atomic rename commits them together (layout
        in tables/files.py). `$TFRA_SAVED_KV` overrides `dirpath`, which may be a string tensor.
        `buffer_size` is accepted for TFRA compatibility (native files stream in ~1 MB blocks).

        Example:
            >>> import os, tempfile
            >>> w = Variable(dim=2, devices=["/CPU:0", "/CPU:0"], name="files_w")
            >>> _ = w.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
            >>> folder = tempfile.mkdtemp()
            >>> _ = w.save_to_file_system(folder, proc_size=2, proc_rank=1)
            >>> sorted(f for _, _, files in os.walk(folder) for f in files)
            [...'files_w_mht_1of2_rank1_size2'..., ...'files_w_mht_2of2_rank1_size2'...]
        """
        del buffer_size
        if append_to_file:
            raise ValueError("append_to_file=True is not supported: every save writes whole, "
                             "checksummed shard files")
        checkpoint_lib.check_ranks(proc_size, proc_rank)
        directory = files.resolve_dir(dirpath, dirpath_env)
        names = self._shard_file_names(file_name_list, proc_rank, proc_size)
        with tf.name_scope(name or scope_name(self._name + "_save_to_file_system")):
            return files.save_shards(self._tables, directory, self._name, names, proc_rank,
                                     proc_size)

    def load_from_file_system(self, dirpath, proc_size=1, proc_rank=0, file_name_list=None,
                              dirpath_env=files.ENV_DIR, load_entire_dir=False,
                              buffer_size=4194304, name=None):
        """Op replacing the content with the last committed `save_to_file_system` (or plain
        TFRA-layout files where nothing was committed): shard i reads its own file (same shard
        count), or with `load_entire_dir=True` every shard file of this variable in the directory,
        any rank and shard count, is read and re-partitioned over the current shards. Which save
        is read is decided when the op runs."""
        del buffer_size
        checkpoint_lib.check_ranks(proc_size, proc_rank)
        directory = files.resolve_dir(dirpath, dirpath_env)
        with tf.name_scope(name or scope_name(self._name + "_load_from_file_system")):
            if load_entire_dir:
                return self._load_files(directory)
            names = self._shard_file_names(file_name_list, proc_rank, proc_size)
            prefixes = files.shard_prefixes(directory, self._name, names, proc_rank, proc_size)
            return files.load_shards(self._tables, prefixes)

    def load_from_file_system_with_restore_function(self, dirpath, proc_size=1, proc_rank=0,
                                                    buffer_size=4194304):
        """Op loading every shard file of this variable in `dirpath` (committed saves, see
        `load_from_file_system`), whatever shard count and rank wrote them, re-partitioned over the
        current shards. With `proc_size` > 1 only the keys of rank `proc_rank`
        (`key % proc_size == proc_rank`, as `default_partition_fn`)."""
        del buffer_size
        checkpoint_lib.check_ranks(proc_size, proc_rank)
        with tf.name_scope(scope_name(self._name + "_load_from_file_system")):
            return self._load_files(files.resolve_dir(dirpath, None), proc_size, proc_rank)

    def _shard_file_names(self, file_name_list, proc_rank, proc_size):
        if file_name_list is None:
            return [files.shard_file_name(self._name, i, self.shard_num, proc_rank,
                                                proc_size) for i in range(self.shard_num)]
        if len(file_name_list) != self.shard_num:
            raise ValueError(f"file_name_list must name one file per shard ({self.shard_num}); "
                             f"got {len(file_name_list)}")
        if not all(isinstance(n, str) and n and "/" not in n for n in file_name_list):
            raise ValueError(f"file_name_list must hold plain file names; got {file_name_list!r}")
        return list(file_name_list)

    def _load_files(self, directory, proc_size=1, proc_rank=0):
        if len({_task_cpu(d) for d in self._devices}) > 1:
            # Shards on several tasks (PSs): each task reads the files and keeps its own keys
            # (Paddle's PS-side load); no row passes through the client.
            loads = []
            for i, table in enumerate(self._tables):
                with _task_cpu_scope(table.device):
                    keys, values = self._read_files(directory, proc_size, proc_rank)
                    ids = tf.cast(self._partitioner(keys, self.shard_num), tf.int32)
                    mine = tf.equal(ids, i)
                    loads.append(table.import_(tf.boolean_mask(keys, mine),
                                               tf.boolean_mask(values, mine)))
            return tf.group(*loads)
        return self.import_(*self._read_files(directory, proc_size, proc_rank))

    def _read_files(self, directory, proc_size, proc_rank):
        keys, values = files.read_files(files.variable_files(directory, self._name),
                                        self._key_dtype, self._value_dtype, self._dim)
        if proc_size > 1:
            mine = tf.equal(default_partition_fn(keys, proc_size), proc_rank)
            keys, values = tf.boolean_mask(keys, mine), tf.boolean_mask(values, mine)
        return keys, values

    def get_slot_variables(self, optimizer):
        """The slot `de.Variable`s that `optimizer` (a DynamicEmbeddingOptimizer) made for this."""
        return optimizer.get_slot_variables(self)

    # -- checkpointing (TF2 object-based; graph-mode Saver support lives in checkpoint.py) ----
    def _serialize_to_tensors(self):
        if not self._checkpoint:
            return {}
        # Joined on the first shard's task, whose SaveV2 writes them (TF saves a tensor where it
        # lives): on a cluster the rows go PS to PS, never through the client.
        with _task_cpu_scope(self._tables[0].device):
            keys, values = self.export()
        return {checkpoint_lib.KEYS: keys, checkpoint_lib.VALUES: values}

    def _restore_from_tensors(self, restored_tensors):
        if not self._checkpoint:
            return tf.no_op()
        restored = self.import_(restored_tensors[checkpoint_lib.KEYS],
                                restored_tensors[checkpoint_lib.VALUES])
        # A SavedModel's copy (`_exported_from`) leaves the hooks' state to its own copies.
        if "_exported_from" in self.__dict__:
            return restored
        for state in self._hooks.values():
            restored = state.after_restore(restored)
        return restored

    def _gather_saveables_for_checkpoint(self):
        # Only `tf.compat.v1.train.Saver(var_list=[w])` asks this (TF2 checkpoints use
        # _serialize_to_tensors): without it TF names the tensors plain "keys" / "values", so two
        # variables in one var_list overwrite each other. Same names as the collection saveable.
        if not self._checkpoint:
            return {}
        # A de.FileSystemSaver variable writes its tables to files instead (checkpoint.py).
        file_system = checkpoint_lib.v1_saveable_factories(self, self._unique_name)
        if file_system:
            return file_system
        return {checkpoint_lib.KEYS: lambda name=self._unique_name: checkpoint_lib.GraphSaveable(
            self, name)}

    # -- SavedModel: the export graph holds copies of the shard tables; point a copy at them -----
    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        if save_type == "savedmodel":
            # Training state no server reads (e.g. the eviction's per-row metadata, read from
            # the live native tables, which an export graph cannot capture).
            for state in self._hooks.values():
                for name in state.checkpoint_only:
                    children.pop(name, None)
        return children

    def _lookup_dependency(self, name, cached_dependencies=None):
        found = super()._lookup_dependency(name, cached_dependencies)
        if found is None and checkpoint_lib.is_tfra_tables(name):
            # A checkpoint TFRA wrote: its shard tables' rows are inserted (checkpoint.py).
            # Kept (untracked) while this variable lives: a restore's status checks its objects.
            object.__setattr__(self, "_tfra_shard_tables", checkpoint_lib.TfraShardTables(self))
            found = self._tfra_shard_tables
        return found

    def _deserialization_dependencies(self, children):
        del children  # The shard tables must exist before this variable (export and load).
        return {f"table_{i}": t for i, t in enumerate(self._tables)}

    def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kwargs):
        del tensor_map, options, kwargs
        exported = copy.copy(self)
        # object.__setattr__: the shallow copy shares this variable's list of tracked children,
        # which a tracked assignment would rewrite (a second export then missed the tables).
        object.__setattr__(exported, "_tables", [object_map[t] for t in self._tables])
        # TF hands a registered saver (de.FileSystemSaver, checkpoint.py) this copy but maps the
        # captures of its functions from the live tables: it must trace the live variable.
        object.__setattr__(exported, "_exported_from", self)
        object_map[self] = exported
        return []

    # -- helpers ----------------------------------------------------------------------------
    def _keys_tensor(self, keys):
        return typed_tensor(keys, self._key_dtype, "keys")

    def _values_tensor(self, values, keys, arg):
        values = typed_tensor(values, self._value_dtype, arg)
        expected = keys.shape.concatenate([self._dim])
        if not values.shape.is_compatible_with(expected):
            raise ShapeError(
                f"Expected shape {expected} for {arg} of {self._name} (keys.shape + [dim], "
                f"dim={self._dim}); got {values.shape}")
        return values

    def _write(self, keys, values, arg, write, name):
        keys = self._keys_tensor(keys)
        values = self._values_tensor(values, keys, arg)
        with tf.name_scope(scope_name(name)):
            flat_keys, flat_values = self._flat_rows(keys, values, arg)
            if self.shard_num == 1:
                return write(self._tables[0], flat_keys, flat_values)
            parts, positions = self._partition(flat_keys)
            return tf.group(*[
                write(t, p, tf.gather(flat_values, pos))
                for t, p, pos in zip(self._tables, parts, positions)])

    def _flat_rows(self, keys, values, arg):
        """(1-D keys, `[n, dim]` values) of a write, checked before any shard is written, so a
        bad call leaves the table unchanged. Static shapes were checked already
        (`_values_tensor`); a graph that writes in a loop then holds no assert ops for them."""
        if keys.shape.is_fully_defined() and values.shape.is_fully_defined():
            flat_keys = keys if keys.shape.rank == 1 else tf.reshape(keys, [-1])
            flat_values = values if values.shape.rank == 2 else tf.reshape(values, [-1, self._dim])
            return flat_keys, flat_values
        with tf.control_dependencies([tf.debugging.assert_equal(
                tf.shape(values), tf.concat([tf.shape(keys), [self._dim]], 0),
                message=f"Expected shape keys.shape + [{self._dim}] for {arg} of {self._name}")]):
            return tf.reshape(keys, [-1]), tf.reshape(values, [-1, self._dim])

    def _partition(self, flat_keys):
        """Splits 1-D keys over shards: (keys per shard, their positions in `flat_keys`)."""
        shard_num = self.shard_num
        ids = self._partitioner(flat_keys, shard_num)
        if not isinstance(ids, tf.Tensor) and not hasattr(ids, "dtype"):
            ids = tf.convert_to_tensor(ids)
        if not ids.dtype.is_integer:
            raise ValueError(f"partitioner of {self._name} must return integer shard ids; "
                             f"got dtype {ids.dtype.name}")
        ids = tf.cast(ids, tf.int32)
        if self._partitioner is not default_partition_fn:
            message = (f"partitioner {getattr(self._partitioner, '__name__', self._partitioner)} "
                       f"of {self._name} returned shard ids outside [0, {shard_num})")
            with tf.control_dependencies([
                    tf.debugging.assert_non_negative(ids, message=message),
                    tf.debugging.assert_less(ids, shard_num, message=message),
                    tf.debugging.assert_equal(tf.size(ids), tf.size(flat_keys), message=message)]):
                ids = tf.identity(ids)
        parts = tf.dynamic_partition(flat_keys, ids, shard_num)
        positions = tf.dynamic_partition(tf.range(tf.size(flat_keys)), ids, shard_num)
        return parts, positions

    def _map_shards(self, flat_keys, fn):
        """Runs `fn(table, shard_keys) -> (rows, exists|None)` per shard and stitches results."""
        if self.shard_num == 1:
            return fn(self._tables[0], flat_keys)
        parts, positions = self._partition(flat_keys)
        results = []
        for table, part in zip(self._tables, parts):
            with tf.device(table.device):
                results.append(fn(table, part))
        rows = tf.dynamic_stitch(positions, [r for r, _ in results])
        exists = None
        if results[0][1] is not None:
            exists = tf.dynamic_stitch(positions, [e for _, e in results])
        return rows, exists

    def _unflatten(self, rows, keys):
        rows = tf.reshape(rows, tf.concat([tf.shape(keys), [self._dim]], 0))
        rows.set_shape(keys.shape.concatenate([self._dim]))
        return rows

    def __repr__(self):
        return (f"<de.Variable '{self._name}' key_dtype={self._key_dtype.name} "
                f"value_dtype={self._value_dtype.name} dim={self._dim} shards={self.shard_num}>")


# -- small helpers ----------------------------------------------------------------------------
def _checked_dtype(dtype, allowed, arg):
    try:
        dtype = tf.as_dtype(dtype)
    except TypeError as error:
        raise DTypeError(f"{arg} must be a TensorFlow dtype; got {dtype!r}") from error
    if dtype not in allowed:
        raise DTypeError(f"{arg} must be one of {[d.name for d in allowed]}; got {dtype.name}")
    return dtype


def typed_tensor(value, dtype, arg):
    """`value` as a tensor of `dtype`, as TFRA's `convert_to_tensor(value, dtype)` makes it: a
    tensor (or variable) of another dtype is an error naming `arg` and both dtypes, never cast
    (a float64 tensor into float32 rows would turn 1e300 into inf unseen); numpy values, lists
    and numbers are converted (numpy floats to another float width, numpy integers where every
    value fits `dtype`).

    Example:
        >>> typed_tensor(np.array([0.5]), tf.float32, "values").dtype
        tf.float32
        >>> typed_tensor(tf.constant([0.5], tf.float64), tf.float32, "rows")
        Traceback (most recent call last):
        ...
        tfra_dynamic_embedding.variable.DTypeError: rows must have dtype float32; got float64 (...)
    """
    if isinstance(value, (tf.SparseTensor, tf.RaggedTensor)):
        raise DTypeError(f"{arg} must be a dense tensor; got {type(value).__name__}")
    if isinstance(value, (np.ndarray, np.generic)):
        _check_numpy(value, dtype, arg)
    elif hasattr(value, "dtype") and not isinstance(value, (list, tuple)):
        got = tf.as_dtype(value.dtype)
        if got != dtype:
            raise DTypeError(f"{arg} must have dtype {dtype.name}; got {got.name} (Tensor "
                             f"conversion requested dtype {dtype.name} for Tensor with dtype "
                             f"{got.name}; tf.cast it first)")
    try:
        return tf.convert_to_tensor(value, dtype=dtype)
    except (TypeError, ValueError) as error:
        raise DTypeError(f"{arg} must be convertible to a {dtype.name} tensor: {error}") from error


def _check_numpy(value, dtype, arg):
    """Whether a numpy `value` converts to `dtype` without changing kind or wrapping around:
    numbers to floats, integers to integers that hold every value; else a DTypeError."""
    try:
        got = tf.as_dtype(value.dtype)
    except TypeError:
        return   # (e.g. an object array) as TF converts it, or says why not
    if got == dtype or (dtype.is_floating and (got.is_floating or got.is_integer)):
        return
    if dtype.is_integer and got.is_integer:
        if value.size == 0 or (value.min() >= dtype.min and value.max() <= dtype.max):
            return
        raise DTypeError(f"{arg} must have dtype {dtype.name}; got a numpy {got.name} array "
                         f"with values outside its range [{dtype.min}, {dtype.max}]")
    raise DTypeError(f"{arg} must have dtype {dtype.name}; got a numpy {got.name} array")


def _device_list(devices):
    if devices is None:
        current = _current_device()
        return [current] if current else (_ps_strategy_devices() or [current])
    if isinstance(devices, (str, tf.DeviceSpec)):
        devices = [devices]
    if not isinstance(devices, collections.abc.Iterable):
        raise ValueError(f"devices must be a device string or a non-empty list of them; "
                         f"got {devices!r}")
    devices = [d.to_string() if isinstance(d, tf.DeviceSpec) else d for d in devices]
    if not devices or not all(isinstance(d, str) for d in devices):
        raise ValueError(f"devices must be a device string or a non-empty list of them; "
                         f"got {devices!r}")
    for device in devices:
        try:
            tf.DeviceSpec.from_string(device)
        except ValueError as error:
            raise ValueError(f"devices: {device!r} is not a device name ({error})") from None
    return devices


def _ps_strategy_devices():
    """Under a `tf.distribute.ParameterServerStrategy` (its scope or a replica of it): one
    device per PS task of its cluster, `/job:ps/replica:0/task:<i>`; else None."""
    if trainable_lib.current_ps_strategy() is None:
        return None
    # The strategy connected this process to its cluster: the PS tasks' devices are listed.
    specs = (tf.DeviceSpec.from_string(d.name) for d in tf.config.list_logical_devices())
    tasks = sorted({spec.task for spec in specs if spec.job == "ps"})
    return [f"/job:ps/replica:0/task:{i}" for i in tasks] or None


def _task_cpu(device):
    """The CPU of `device`'s task ('' for no device): where file, split and join ops of a shard
    run (they have CPU kernels)."""
    if not device:
        return ""
    return tf.DeviceSpec.from_string(device).replace(device_type="CPU", device_index=0).to_string()


def _task_cpu_scope(device):
    """`tf.device` of `_task_cpu(device)`, or no scope for no device."""
    cpu = _task_cpu(device)
    return tf.device(cpu) if cpu else contextlib.nullcontext()


def _current_device():
    """The device of the enclosing `tf.device` scope ('' when there is none)."""
    if tf.executing_eagerly():
        return _tf_private.eager_device_name()
    return tf.no_op(name="device_probe").device  # a throwaway op picks up the device scope


def scope_name(name):
    """A valid name scope from a variable name (scope slashes become underscores)."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return cleaned.lstrip("._-") or "de"
