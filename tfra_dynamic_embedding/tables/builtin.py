"""The built-in backend: shard tables on TensorFlow's own `MutableHashTableOfTensors` kernels.

Every op here is a stock TF op, so a model exported with this backend is servable by stock
TensorFlow without this package. It is the fallback when the native op library is not built.
Initial rows are drawn with TF ops, from the `InitSpec` (`KVTable.lookup_or_init`).

Example:
    >>> table = BuiltinKVCreator().create(tf.int64, tf.float32, dim=2, name="t")
    >>> _ = table.insert(tf.constant([3], tf.int64), [[1.0, 2.0]])
    >>> table.lookup(tf.constant([3, 4], tf.int64), tf.zeros([2, 2])).numpy()
    array([[1., 2.],
           [0., 0.]], dtype=float32)
"""

import tensorflow as tf

from tfra_dynamic_embedding.tables import base

# Bit-pattern integer types used to compare rows exactly (NaN-safe for floats) when detecting
# presence; integer rows are their own bit patterns.
_BITS = {tf.float32: tf.int32, tf.float64: tf.int64, tf.int32: tf.int32, tf.int64: tf.int64}
# First-column value of the default row that marks a key absent (see lookup_with_exists):
# quiet NaNs with a payload and integers no counter or id row is likely to hold.
_ABSENT = {tf.float32: 0x7FC5A5A5, tf.float64: 0x7FF8A5A5A5A5A5A5,
           tf.int32: -0x5A5A5A5B, tf.int64: -0x5A5A5A5A5A5A5A5B,
           tf.string: "\x00tfra-de absent\x00"}
# The stock kernels store no 16-bit floats or int8: those rows are kept widened (exact).
_STORAGE = {tf.float16: tf.float32, tf.bfloat16: tf.float32, tf.int8: tf.int32}
# Key dtype -> value (storage) dtypes TF registers MutableHashTableOfTensors kernels for.
_KERNELS = {tf.int32: (tf.int32, tf.float32, tf.float64),
            tf.int64: (tf.int32, tf.int64, tf.float32, tf.float64, tf.string),
            tf.string: (tf.int32, tf.int64, tf.float32, tf.float64)}


class BuiltinKVTable(base.KVTable):
    """A shard table on `tf.raw_ops.MutableHashTableOfTensorsV2` (see `KVTable` for the methods)."""

    def __init__(self, key_dtype, value_dtype, dim, name, device="", shared_name=None):
        super().__init__(key_dtype, value_dtype, dim, name, device, shared_name)
        self._storage_dtype = _STORAGE.get(self.value_dtype, self.value_dtype)
        if self._storage_dtype not in _KERNELS.get(self.key_dtype, ()):
            raise ValueError(f"the built-in backend has no table from key_dtype "
                             f"{self.key_dtype.name} to value_dtype {self.value_dtype.name}")
        self.resource_handle  # pylint: disable=pointless-statement  (create it now, on `device`)

    def _create_resource(self):
        return tf.raw_ops.MutableHashTableOfTensorsV2(
            key_dtype=self.key_dtype,
            value_dtype=self._storage_dtype,
            value_shape=[self.dim],
            shared_name=self._shared_name or "",
            # Graph mode without a shared name: share by node name, so every worker of a
            # PS cluster that builds the same graph addresses the same table.
            use_node_name_sharing=self._shared_name is None,
            name=base.op_name(self.name),
        )

    def lookup(self, keys, default_rows):
        with tf.device(self.device):
            return tf.cast(self._find(keys, tf.cast(default_rows, self._storage_dtype)),
                           self.value_dtype)

    def lookup_with_exists(self, keys, default_rows):
        # The stock kernel has no presence output. The first find's default carries a marker in
        # its first column that no trained row holds (a NaN payload, an unlikely integer, a
        # string with NULs): that find alone says which keys are present, in one op, so a
        # concurrent writer (another worker's accum) cannot make a present key look absent. A
        # second find with another default tells the rare row that stores the marker itself.
        # Bit patterns are compared, so NaN rows count as present.
        with tf.device(self.device):
            default_rows = tf.cast(default_rows, self._storage_dtype)
            count = tf.shape(keys)[0]
            if self._storage_dtype == tf.string:
                marker, other = tf.fill([count, 1], _ABSENT[tf.string]), tf.fill(
                    [count, 1], _ABSENT[tf.string] + "\x01")
                first = lambda rows: rows[:, 0]  # noqa: E731
            else:
                bits = _BITS[self._storage_dtype]
                marker_bits = tf.fill([count, 1], tf.constant(_ABSENT[self._storage_dtype], bits))
                marker = tf.bitcast(marker_bits, self._storage_dtype)
                other = tf.bitcast(tf.bitwise.invert(marker_bits), self._storage_dtype)
                first = lambda rows: tf.bitcast(rows[:, 0], bits)  # noqa: E731
            rows = self._find(keys, tf.concat([marker, default_rows[:, 1:]], axis=1))
            probe = self._find(keys, tf.concat([other, default_rows[:, 1:]], axis=1))
            marked = tf.equal(first(rows), first(tf.concat([marker, rows[:, 1:]], axis=1)))
            stores_marker = tf.equal(first(probe), first(tf.concat([marker, probe[:, 1:]], 1)))
            exists = tf.logical_or(tf.logical_not(marked), stores_marker)
            rows = tf.where(exists[:, None], rows, default_rows)
            return tf.cast(rows, self.value_dtype), exists

    def _find(self, keys, default_rows):
        return tf.raw_ops.LookupTableFindV2(
            table_handle=self.resource_handle, keys=keys, default_value=default_rows)

    def find_or_insert(self, keys, init):
        init = base.as_init_spec(init, self.dim, self.value_dtype)
        with tf.device(self.device):
            unique_keys, index = tf.unique(keys)
            zeros = tf.zeros([tf.size(unique_keys), self.dim], self.value_dtype)
            rows, exists = self.lookup_with_exists(unique_keys, zeros)
            missing = tf.where(tf.logical_not(exists))
            missing_keys = tf.gather_nd(unique_keys, missing)
            new_rows = tf.cast(init.rows(missing_keys), self.value_dtype)
            with tf.control_dependencies([self.insert(missing_keys, new_rows)]):
                rows = tf.tensor_scatter_nd_update(rows, missing, new_rows)
            return tf.gather(rows, index), tf.gather(exists, index)

    def insert(self, keys, values):
        with tf.device(self.device):
            return tf.raw_ops.LookupTableInsertV2(
                table_handle=self.resource_handle, keys=keys,
                values=tf.cast(values, self._storage_dtype))

    def accum(self, keys, deltas):
        with tf.device(self.device):
            unique_keys, index = tf.unique(keys)
            summed = tf.math.unsorted_segment_sum(deltas, index, tf.size(unique_keys))
            # Summed in storage precision, so 16-bit rows round once, not once per delta.
            summed = tf.cast(summed, self._storage_dtype)

        def add():
            with tf.device(self.device):
                current = self._find(unique_keys, tf.zeros_like(summed))
                inserted = self.insert(unique_keys, current + summed)
                with tf.control_dependencies([inserted] if inserted is not None else []):
                    return tf.size(unique_keys)

        # The stock kernels have no atomic add: the find and insert hold the table's lock, so
        # concurrent writers (e.g. the workers of a parameter server) all add up.
        return tf.group(self._accum_lock().execute(add))

    def _accum_lock(self):
        lock = self.__dict__.get("_lock")
        if lock is None:
            with tf.init_scope(), tf.device(self.device):
                lock = tf.CriticalSection(name=base.op_name(self.name) + "_accum_lock")
            object.__setattr__(self, "_lock", lock)
        return lock

    def remove(self, keys):
        with tf.device(self.device):
            return tf.raw_ops.LookupTableRemoveV2(table_handle=self.resource_handle, keys=keys)

    def clear(self):
        return self.import_(tf.zeros([0], self.key_dtype),
                            tf.zeros([0, self.dim], self._storage_dtype))

    def size(self):
        with tf.device(self.device):
            return tf.raw_ops.LookupTableSizeV2(table_handle=self.resource_handle)

    def export(self):
        with tf.device(self.device):
            keys, values = tf.raw_ops.LookupTableExportV2(
                table_handle=self.resource_handle, Tkeys=self.key_dtype,
                Tvalues=self._storage_dtype)
            values.set_shape([None, self.dim])
            return keys, tf.cast(values, self.value_dtype)

    def import_(self, keys, values):
        with tf.device(self.device):
            # The stock import kernel replaces the whole content of the table.
            return tf.raw_ops.LookupTableImportV2(
                table_handle=self.resource_handle, keys=keys,
                values=tf.cast(values, self._storage_dtype))


class BuiltinKVCreator(base.KVCreator):
    """Creates `BuiltinKVTable` shards: `de.Variable(..., kv_creator=de.BuiltinKVCreator())`."""

    def create(self, key_dtype, value_dtype, dim, name, device="", shared_name=None, init_size=0):
        del init_size  # The stock table grows by itself; there is nothing to pre-size.
        return BuiltinKVTable(key_dtype, value_dtype, dim, name, device, shared_name)

