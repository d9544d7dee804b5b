"""TFRA's standalone hash table, `de.CuckooHashTable`, on this package's table backends.

TFRA code that uses its table directly (outside a `de.Variable`) runs unchanged:

    table = de.CuckooHashTable(tf.int64, tf.float32, default_value=[0.0, 0.0])
    table.insert(tf.constant([1, 2], tf.int64), [[1.0, 1.0], [2.0, 2.0]])
    table.lookup(tf.constant([[1], [5]], tf.int64))  # shape [2, 1, 2]: [[[1, 1]], [[0, 0]]]

Keys may have any shape; each value is a tensor of `default_value`'s shape. The rows live in a
native table (`tables/native.py`) when the op library is built and the dtypes allow it (keys
int32 / int64 / string, floating values), else in TF's MutableHashTable (`tables/builtin.py`).
"""

import tensorflow as tf

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding import checkpoint as checkpoint_lib
from tfra_dynamic_embedding.tables import base, files
from tfra_dynamic_embedding.tables.creators import CuckooHashTableConfig, default_kv_creator


class CuckooHashTable(_tf_private.AutoTrackable):
    """A mutable hash table from keys to fixed-shape values (TFRA's `de.CuckooHashTable`).

    Args:
      key_dtype, value_dtype: dtypes of keys and values.
      default_value: the value of a missing key; its shape is every value's shape.
      name: table name (checkpoint key prefix and file name of `save_to_file_system`).
      checkpoint: save and restore the content with `tf.train.Checkpoint` and, in graph mode,
        `tf.compat.v1.train.Saver`.
      init_size: expected number of keys (pre-sizes a native table).
      config: a `de.CuckooHashTableConfig` (it has no settings) or None.
      device: where the table lives.
      shard_saveable_object_fn: graph mode only, `fn(table=, name=, full_name=)` returning the
        SaveableObject registered for the v1 Saver instead of the default one.
      kv_creator: the backend (not a TFRA argument); default: native when possible.
    """

    def __init__(self, key_dtype, value_dtype, default_value, name="CuckooHashTable",
                 checkpoint=True, init_size=0, config=None, device="",
                 shard_saveable_object_fn=None, kv_creator=None):
        if config is not None and not isinstance(config, CuckooHashTableConfig):
            raise TypeError(f"config must be a de.CuckooHashTableConfig or None; got {config!r}")
        self._set_up(key_dtype, value_dtype, default_value, name, checkpoint, device)
        creator = kv_creator or default_kv_creator(self._value_dtype, self._key_dtype)
        self._table = creator.create(self._key_dtype, self._value_dtype, self._dim, name,
                                     device=device, init_size=init_size)
        if self._checkpoint and not tf.executing_eagerly() and not tf.inside_function():
            # The v1 Saver finds graph tables through this collection; the resource op's name is
            # unique in the graph, so two tables both called "CuckooHashTable" do not collide.
            full_name = self._table.resource_handle.op.name
            make = shard_saveable_object_fn or (
                lambda table, name, full_name: checkpoint_lib.GraphSaveable(table, name))
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS,
                                           make(table=self, name=full_name, full_name=full_name))

    @classmethod
    def view_of(cls, kv_table, default_value, name):
        """TFRA's table surface over an existing shard table (what `de.Variable.tables` holds).

        The rows stay the variable's (its checkpoints save them); the view is saved only when
        handed to a checkpoint or a `tf.compat.v1.train.Saver(var_list=...)` itself.

        Example:
            >>> import tensorflow_recommenders_addons.dynamic_embedding as de
            >>> var = de.Variable(dim=2, initializer=-1.0)
            >>> _ = var.upsert(tf.constant([1], tf.int64), tf.ones([1, 2]))
            >>> var.tables[0].lookup(tf.constant([1, 2], tf.int64)).numpy()  # 2: the default row
            array([[ 1.,  1.],
                   [-1., -1.]], dtype=float32)
        """
        view = cls.__new__(cls)
        view._set_up(kv_table.key_dtype, kv_table.value_dtype, default_value, name, True,
                     kv_table.device)
        if view._dim != kv_table.dim:
            raise ValueError(f"default_value of table {name} must have {kv_table.dim} values; "
                             f"got shape {view._value_shape}")
        view._table = kv_table
        return view

    def _set_up(self, key_dtype, value_dtype, default_value, name, checkpoint, device):
        self._key_dtype = tf.as_dtype(key_dtype)
        self._value_dtype = tf.as_dtype(value_dtype)
        with tf.device(device or None):
            self._default_value = tf.convert_to_tensor(default_value, self._value_dtype,
                                                       name="default_value")
        shape = self._default_value.shape
        if not shape.is_fully_defined() or shape.num_elements() == 0:
            raise ValueError(f"default_value must have a known, non-empty shape; got {shape}")
        self._value_shape = shape
        self._dim = shape.num_elements()
        self._name = name
        self._checkpoint = bool(checkpoint)

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
    def resource_handle(self):
        return self._table.resource_handle

    @property
    def device(self):
        return self._table.device

    @property
    def default_value(self):
        """The value a missing key gets (shape: every value's shape)."""
        return self._default_value

    @property
    def kv_table(self):
        """The backend table (a `KVTable`) holding the rows as `[dim]` vectors."""
        return self._table

    # -- conversions ------------------------------------------------------------------------

    def _keys(self, keys):
        if isinstance(keys, (tf.Tensor, tf.Variable)) and keys.dtype != self._key_dtype:
            raise TypeError(f"Signature mismatch: keys must be {self._key_dtype.name}, "
                            f"got {keys.dtype.name}")
        return tf.convert_to_tensor(keys, self._key_dtype, name="keys")

    def _rows(self, values, arg, keys=None):
        """`values` as `[N, dim]` rows; with `keys`, checked to be `keys.shape + value_shape`
        (statically where the shapes are known, else when the op runs)."""
        values = tf.convert_to_tensor(values, self._value_dtype, name=arg)
        if keys is not None:
            want = keys.shape.concatenate(self._value_shape)
            if not values.shape.is_compatible_with(want):
                raise ValueError(f"{arg} must have shape keys.shape + value shape = {want}; "
                                 f"got {values.shape}")
            if not (values.shape.is_fully_defined() and keys.shape.is_fully_defined()):
                with tf.control_dependencies([tf.debugging.assert_equal(
                        tf.shape(values), tf.concat([tf.shape(keys), self._value_shape], 0),
                        message=f"{arg} must have shape keys.shape + value shape")]):
                    values = tf.identity(values)
        return tf.reshape(values, [-1, self._dim])

    def _shaped(self, rows, keys):
        """[N, dim] rows -> keys.shape + value_shape."""
        out = tf.reshape(rows, tf.concat([tf.shape(keys), self._value_shape.as_list()], 0))
        out.set_shape(keys.shape.concatenate(self._value_shape))
        return out

    def _scope(self, name, op):
        return tf.name_scope(name or f"{base.op_name(self._name)}_{op}")

    # -- data plane -------------------------------------------------------------------------

    def lookup(self, keys, dynamic_default_values=None, return_exists=False, name=None):
        """Values of `keys` (shape `keys.shape + value_shape`); a missing key gets
        `default_value`, or its entry of `dynamic_default_values` (same shape as the result).
        With `return_exists=True` also returns a bool tensor of `keys`' shape."""
        with self._scope(name, "lookup"):
            keys = self._keys(keys)
            flat = tf.reshape(keys, [-1])
            if dynamic_default_values is None:
                defaults = tf.reshape(self._default_value, [1, self._dim])
            else:
                defaults = self._rows(dynamic_default_values, "dynamic_default_values")
            defaults = tf.broadcast_to(defaults, [tf.size(flat), self._dim])
            rows, exists = self._table.lookup_with_exists(flat, defaults)
            values = self._shaped(rows, keys)
            if not return_exists:
                return values
            exists = tf.reshape(exists, tf.shape(keys))
            exists.set_shape(keys.shape)
            return values, exists

    def __getitem__(self, keys):
        """`table[keys]` is `table.lookup(keys)` (TFRA's tables are LookupInterfaces)."""
        return self.lookup(keys)

    def insert(self, keys, values, name=None):
        """Sets the values of `keys` (`values`: shape `keys.shape + value_shape`)."""
        with self._scope(name, "insert"):
            keys = self._keys(keys)
            return self._table.insert(tf.reshape(keys, [-1]), self._rows(values, "values", keys))

    def accum(self, keys, values_or_deltas, exists, name=None):
        """TFRA's optimistic update: where `exists[i]` is True and the key is present, adds
        `values_or_deltas[i]` to its value; where `exists[i]` is False and the key is absent,
        inserts `values_or_deltas[i]`; other keys are left alone (another writer changed them
        since `exists` was read)."""
        with self._scope(name, "accum"):
            keys = self._keys(keys)
            rows = self._rows(values_or_deltas, "values_or_deltas", keys)
            exists = base.exists_like_keys(exists, keys, f"table {self._name}")
            keys, exists = tf.reshape(keys, [-1]), tf.reshape(exists, [-1])
            _, present = self._table.lookup_with_exists(
                keys, tf.zeros([tf.size(keys), self._dim], self._value_dtype))
            add = tf.logical_and(exists, present)
            put = tf.logical_not(tf.logical_or(exists, present))
            added = self._table.accum(tf.boolean_mask(keys, add), tf.boolean_mask(rows, add))
            with tf.control_dependencies([added]):
                return self._table.insert(tf.boolean_mask(keys, put), tf.boolean_mask(rows, put))

    def remove(self, keys, name=None):
        """Removes `keys`; missing keys are ignored."""
        with self._scope(name, "remove"):
            return self._table.remove(tf.reshape(self._keys(keys), [-1]))

    def clear(self, name=None):
        """Removes every key."""
        with self._scope(name, "clear"):
            return self._table.clear()

    def size(self, name=None):
        """The number of keys, an int64 scalar."""
        with self._scope(name, "size"):
            return self._table.size()

    def export(self, name=None):
        """(keys `[n]`, values `[n] + value_shape`) of the whole table."""
        with self._scope(name, "export"):
            keys, rows = self._table.export()
            return keys, self._shaped(rows, keys)

    def import_(self, keys, values, name=None):
        """Replaces the whole content with `keys` / `values` (as `export` returns them)."""
        with self._scope(name, "import"):
            keys = tf.reshape(self._keys(keys), [-1])
            return self._table.import_(keys, self._rows(values, "values"))

    # -- files (tables/files.py) -------------------------------------------------------------

    def save_to_file_system(self, dirpath, file_name=None, dirpath_env=files.ENV_DIR,
                            append_to_file=False, buffer_size=4194304, name=None):
        """Writes the table to `<dirpath>/<file_name or name>` (`$TFRA_SAVED_KV` overrides
        `dirpath`): a native table streams one checksummed file, a built-in one writes
        `<prefix>-keys` and `<prefix>-values`. `buffer_size` is accepted for TFRA
        compatibility (native files stream in ~1 MB blocks)."""
        del buffer_size
        with self._scope(name, "save_to_file_system"):
            return files.save_file(self._table, dirpath,
                                   self._name if file_name is None else file_name, dirpath_env,
                                   append_to_file)

    def load_from_file_system(self, dirpath, file_name=None, dirpath_env=files.ENV_DIR,
                              load_entire_dir=False, buffer_size=4194304, name=None):
        """Replaces the content with what `save_to_file_system` wrote under the same names, or
        with `load_entire_dir=True` with every `<name before _mht_>_mht_*` shard file in
        `dirpath`. A truncated or corrupt native file raises DataLossError and leaves the table
        unchanged."""
        del buffer_size
        with self._scope(name, "load_from_file_system"):
            return files.load_file(self._table, dirpath,
                                   self._name if file_name is None else file_name, dirpath_env,
                                   load_entire_dir)

    # -- checkpoints (TF2 object-based; the v1 Saver uses the graph saveable above) ---------

    def _gather_saveables_for_checkpoint(self):
        # A v1 Saver handed tables (`Saver(var.tables)`) saves each under its own name
        # (`<name>-keys`, `<name>-values`); TF2 checkpoints use `_serialize_to_tensors`.
        if not self._checkpoint:
            return {}
        return {"table": lambda name=None: checkpoint_lib.GraphSaveable(self, self._name)}

    def _serialize_to_tensors(self):
        if not self._checkpoint:
            return {}
        keys, values = self.export()
        return {checkpoint_lib.KEYS: keys, checkpoint_lib.VALUES: values}

    def _restore_from_tensors(self, restored_tensors):
        if not self._checkpoint:
            return tf.no_op()
        return self.import_(restored_tensors[checkpoint_lib.KEYS],
                            restored_tensors[checkpoint_lib.VALUES])
