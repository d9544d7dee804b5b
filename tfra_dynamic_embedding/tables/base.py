"""The key-value table interface every backend implements, and how a Variable asks for tables.

A `KVTable` is one shard of a `de.Variable`: a hash table from keys to rows of `dim` values, living
on one device as a TensorFlow resource. All methods take 1-D keys and `[N, dim]` rows and return
tensors or ops, so they work in eager mode, inside `tf.function` and in `tf.compat.v1` graphs.
Tables know nothing of training, partitioning or checkpoint layout: `de.Variable` does that.

Example (any backend):
    table = BuiltinKVCreator().create(tf.int64, tf.float32, dim=4, name="t", device="/CPU:0")
    table.insert(tf.constant([1, 2], tf.int64), tf.ones([2, 4]))
    rows, exists = table.lookup_with_exists(tf.constant([1, 7], tf.int64), tf.zeros([2, 4]))
"""

import abc
import itertools
import weakref

import tensorflow as tf

from tfra_dynamic_embedding import _tf_private

_table_ids = itertools.count()


class _AbstractResourceMeta(type(tf.saved_model.experimental.TrackableResource), abc.ABCMeta):
    """TrackableResource's metaclass plus ABCMeta, so missing methods fail at construction."""


class KVTable(tf.saved_model.experimental.TrackableResource, metaclass=_AbstractResourceMeta):
    """One shard table. Subclasses create the resource in `_create_resource`.

    Checkpointing is the Variable's job (it re-partitions on restore), so a KVTable must not
    save itself: it has no `_serialize_to_tensors`.
    """

    def __init__(self, key_dtype, value_dtype, dim, name, device="", shared_name=None):
        super().__init__(device=device)
        self.key_dtype = tf.as_dtype(key_dtype)
        self.value_dtype = tf.as_dtype(value_dtype)
        self.dim = int(dim)
        self.name = name
        self._device = device
        # In eager mode (also when lifted out of a tf.function being traced) an unnamed table
        # gets a unique shared name, else two tables on one device would share storage, and it
        # is destroyed with this object. A table the user shares by name is never destroyed by
        # us; in a v1 graph an unnamed table is shared by node name (see `_create_resource`).
        self._owns_resource = shared_name is None and tf.executing_eagerly()
        if self._owns_resource:
            shared_name = f"{op_name(name)}_{next(_table_ids)}"
        self._shared_name = shared_name
        self._owner = None   # weakref.ref to the de.Variable a SavedModel of this table holds

    # A SavedModel written with TF's default options keeps no device placements (so a model
    # trained on parameter servers loads in one process): while it is written, the table's
    # resource and the ops of the functions traced for it name no device.
    @property
    def device(self):
        """The device of the table's resource ("" while a SavedModel without devices is
        written)."""
        return "" if _tf_private.saving_without_devices() else self._device

    @property
    def _resource_device(self):
        return "" if _tf_private.saving_without_devices() else self._resource_device_name

    @_resource_device.setter
    def _resource_device(self, device):   # TrackableResource's constructor sets it
        self._resource_device_name = device

    def set_owner(self, variable):
        """Records `variable` (a de.Variable) as the one this table is a shard of, which a
        SavedModel of the table holds too; None for a table whose variable serving does not need
        (the variable says which: an optimizer slot's)."""
        self._owner = None if variable is None else weakref.ref(variable)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        owner = self._owner() if self._owner is not None else None
        if save_type == "savedmodel" and owner is not None:
            # The variable saves this table's rows (see the class docstring). Keras 3's
            # `model.export()` keeps only the TrackableResources it finds under the model, so
            # without this edge its SavedModel would hold empty tables. (A SavedModel of the
            # model itself has the slot tables through its optimizer.)
            children = dict(children, de_variable=owner)
        return children

    def _destroy_resource(self):
        # Runs eagerly when this object dies. When traced (a SavedModel's destroyer function) it
        # does nothing, like stock TF tables: a loaded model keeps serving from its tables even
        # if the Python object returned by tf.saved_model.load is dropped.
        if self._owns_resource and tf.executing_eagerly():
            tf.raw_ops.DestroyResourceOp(resource=self.resource_handle, ignore_lookup_error=True)

    @abc.abstractmethod
    def lookup(self, keys, default_rows):
        """Rows for `keys`; a missing key i gets `default_rows[i]`. Never inserts."""

    @abc.abstractmethod
    def lookup_with_exists(self, keys, default_rows):
        """(rows, exists): like `lookup` plus a bool mask of the keys present. Never inserts."""

    def contains(self, keys):
        """A bool mask of the keys present. Never inserts; backends may skip reading rows."""
        keys = tf.convert_to_tensor(keys)
        return self.lookup_with_exists(keys, tf.zeros([tf.size(keys), self.dim],
                                                      self.value_dtype))[1]

    def fuses_init(self, make_rows):
        """Whether this backend draws `make_rows`' rows inside its own lookup kernels (then
        `lookup_or_init` / `find_or_insert` never call it). The built-in backend never does."""
        del make_rows
        return False

    def lookup_or_init(self, keys, make_rows):
        """(rows, exists) without inserting: missing keys get rows from `make_rows(keys)`.

        `make_rows` is called once, with the 1-D tensor of distinct missing keys (a repeated key
        gets one row), and returns their `[n, dim]` rows. Backends may override this with a fused
        kernel.
        """
        with tf.device(self.device):
            rows, exists = self.lookup_with_exists(
                keys, tf.zeros([tf.size(keys), self.dim], self.value_dtype))
            missing = tf.where(tf.logical_not(exists))
            unique_keys, index = tf.unique(tf.gather_nd(keys, missing))
            new_rows = tf.cast(make_rows(unique_keys), self.value_dtype)
            return tf.tensor_scatter_nd_update(rows, missing, tf.gather(new_rows, index)), exists

    @abc.abstractmethod
    def find_or_insert(self, keys, make_rows):
        """(rows, exists): missing keys are inserted with rows from `make_rows(missing_keys)`.

        `make_rows` gets the 1-D tensor of the distinct missing keys, exactly those, and returns
        their `[n, dim]` initial rows (a row may depend on its key, e.g. a seeded draw).
        """

    @abc.abstractmethod
    def insert(self, keys, values):
        """Upsert: set the rows of `keys` to `values`."""

    @abc.abstractmethod
    def accum(self, keys, deltas):
        """Add `deltas` to the rows of `keys`; a missing key is inserted with its delta."""

    @abc.abstractmethod
    def remove(self, keys):
        """Delete `keys` (missing keys are ignored)."""

    @abc.abstractmethod
    def clear(self):
        """Delete every key."""

    @abc.abstractmethod
    def size(self):
        """Number of keys, an int64 scalar."""

    @abc.abstractmethod
    def export(self):
        """(keys, values) of the whole shard, `[n]` and `[n, dim]`."""

    @abc.abstractmethod
    def import_(self, keys, values):
        """Replace the whole content of the shard with `keys`/`values`."""


class KVCreator(metaclass=abc.ABCMeta):
    """Makes the shard tables of a Variable; `de.Variable(kv_creator=...)` selects the backend."""

    @abc.abstractmethod
    def create(self, key_dtype, value_dtype, dim, name, device="", shared_name=None, init_size=0):
        """Return a new `KVTable` whose resource lives on `device`."""

    def default_eviction(self, shard_num):
        """None, or the eviction hook (hooks.py) a trainable variable of `shard_num` shards made
        with this creator gets when it is given no `eviction` (TFRA's HKV creator, online/hkv.py,
        bounds every shard)."""
        del shard_num
        return None


def op_name(name):
    """A valid TF op name from a table or variable name (which may hold scope slashes)."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return cleaned.lstrip("._-") or "table"


def exists_like_keys(exists, keys, owner):
    """`exists` as a bool tensor, checked to have the shape of `keys` (statically where both
    shapes are known, else when the op runs), so a mask is never silently broadcast.

    Example: `exists = exists_like_keys([True, False], keys, "table t")`.
    """
    exists = tf.convert_to_tensor(exists, tf.bool, name="exists")
    if not exists.shape.is_compatible_with(keys.shape):
        raise ValueError(f"exists must have the shape of keys {keys.shape}; got {exists.shape}")
    if exists.shape.is_fully_defined() and keys.shape.is_fully_defined():
        return exists
    with tf.control_dependencies([tf.debugging.assert_equal(
            tf.shape(exists), tf.shape(keys),
            message=f"exists must have the shape of keys for {owner}")]):
        return tf.identity(exists)
