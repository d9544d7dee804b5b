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
import copy
import dataclasses
import weakref

import tensorflow as tf

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding import checkpoint as checkpoint_lib
from tfra_dynamic_embedding import devices as devices_lib
from tfra_dynamic_embedding import hooks as hooks_lib
from tfra_dynamic_embedding import initializers
from tfra_dynamic_embedding import tables as tables_lib
from tfra_dynamic_embedding import trainable as trainable_lib
from tfra_dynamic_embedding import typed_inputs
from tfra_dynamic_embedding import variable_files
from tfra_dynamic_embedding.tables import native_slots
from tfra_dynamic_embedding.tables import stock_lookups

# Errors and conversions of inputs (typed_inputs.py), named here as well: callers use both.
DTypeError = typed_inputs.DTypeError
ShapeError = typed_inputs.ShapeError
typed_tensor = typed_inputs.typed_tensor
scope_name = typed_inputs.scope_name
default_partition_fn = devices_lib.default_partition_fn

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


class Variable(variable_files.FileSystemMethods, _tf_private.AutoTrackable):
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
        self._key_dtype = typed_inputs.checked_dtype(key_dtype, KEY_DTYPES, "key_dtype")
        self._value_dtype = typed_inputs.checked_dtype(value_dtype, VALUE_DTYPES + BUILTIN_VALUE_DTYPES,
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
        self._devices = devices_lib.device_list(devices)
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
        serving = stock_lookups.current()
        if serving is not None:   # traced for a stock SavedModel: read the stock snapshot
            return serving.lookup(self, keys, return_exists)
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
            with devices_lib.task_cpu_scope(keys.device or self._tables[0].device):
                parts, positions = self._partition(flat_keys)
                parts = [(p, tf.gather(flat_values, pos)) for p, pos in zip(parts, positions)]
            return tf.group(*[t.import_(p, v) for t, (p, v) in zip(self._tables, parts)])

    def get_slot_variables(self, optimizer):
        """The slot `de.Variable`s that `optimizer` (a DynamicEmbeddingOptimizer) made for this."""
        return optimizer.get_slot_variables(self)

    # -- checkpointing (TF2 object-based; graph-mode Saver support lives in checkpoint.py) ----
    def _serialize_to_tensors(self):
        if not self._checkpoint:
            return {}
        if _tf_private.saving_saved_model() and not any(
                getattr(t, "saved_model_holds_rows", True) for t in self._tables):
            # Rows kept outside the process (Redis): the SavedModel reads them there (and its
            # load must not write rows of the save's moment over newer ones).
            return {}
        if self._store_mode():
            # TFRA's table_store_mode 1 / 2 (Redis): each shard says what the checkpoint holds.
            return {f"{name}_{i}": tensor for i, t in enumerate(self._tables)
                    for name, tensor in t.store_tensors().items()}
        # Joined on the first shard's task, whose SaveV2 writes them (TF saves a tensor where it
        # lives): on a cluster the rows go PS to PS, never through the client.
        with devices_lib.task_cpu_scope(self._tables[0].device):
            keys, values = self.export()
        return {checkpoint_lib.KEYS: keys, checkpoint_lib.VALUES: values}

    def _restore_from_tensors(self, restored_tensors):
        if not self._checkpoint:
            return tf.no_op()
        if checkpoint_lib.KEYS not in restored_tensors:
            # A SavedModel of rows kept in Redis (nothing saved), or TFRA's table_store_mode
            # 1 / 2: each shard reads its own part.
            ops = []
            for i, t in enumerate(self._tables):
                mine = {name[:-len(f"_{i}")]: tensor for name, tensor in restored_tensors.items()
                        if name.endswith(f"_{i}")}
                if mine and hasattr(t, "restore_store_tensors"):
                    ops.append(t.restore_store_tensors(mine))
            return tf.group(*ops)
        restored = self.import_(restored_tensors[checkpoint_lib.KEYS],
                                restored_tensors[checkpoint_lib.VALUES])
        # A SavedModel's copy (`_exported_from`) leaves the hooks' state to its own copies.
        if "_exported_from" in self.__dict__:
            return restored
        for state in self._hooks.values():
            restored = state.after_restore(restored)
        return restored

    def _store_mode(self):
        """TFRA's `table_store_mode` when every shard table keeps its rows elsewhere and says
        what a checkpoint holds (Redis tables in mode 1 or 2), else 0: the rows."""
        modes = {getattr(t, "store_mode", 0) for t in self._tables}
        return modes.pop() if len(modes) == 1 and modes <= {1, 2} else 0

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
        return typed_inputs.typed_tensor(keys, self._key_dtype, "keys")

    def _values_tensor(self, values, keys, arg):
        values = typed_inputs.typed_tensor(values, self._value_dtype, arg)
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
