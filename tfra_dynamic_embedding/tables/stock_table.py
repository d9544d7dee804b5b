"""A table's rows in stock TensorFlow ops: what every SavedModel this package writes for serving
holds instead of its training tables.

`StockTable` keeps its keys in a `tf.lookup.experimental.DenseHashTable` (key -> row number; open
addressing in two flat arrays) and their rows in one variable whose row 0 is the zero row: the
row of every key it does not hold (the index's default number is 0). Stock TensorFlow and TF
Serving load it without this package; the overhead is per key (docs/serving.md measures it).
`apply` takes a delta in place (live deltas: `inference/live_deltas.py`).

Example:
    >>> import numpy as np
    >>> table = StockTable("t", tf.int64, tf.float32, 2, np.array([7, 9]),
    ...                    np.array([[1.0, 1.0], [2.0, 2.0]], np.float32))
    >>> table.lookup(tf.constant([9, 5], tf.int64)).numpy().tolist()   # 5: not held
    [[2.0, 2.0], [0.0, 0.0]]
    >>> int(table.apply(tf.constant([5, 9], tf.int64), 3 * tf.ones([2, 2]),
    ...                 tf.constant([7], tf.int64), tf.constant(False)))        # keys held after
    2
    >>> table.lookup(tf.constant([9, 5, 7], tf.int64)).numpy().tolist()
    [[3.0, 3.0], [3.0, 3.0], [0.0, 0.0]]
"""

import numpy as np
import tensorflow as tf


class StockTable(tf.Module):
    """`keys` -> rows `values` (`[n, dim]`) in stock ops; keys it does not hold give zero rows.

    The hash table reserves two keys (empty and deleted buckets); they are chosen among values
    the table does not hold, and a request id equal to one of them is looked up as a third such
    value (`apply` skips such keys).
    """

    def __init__(self, name, key_dtype, value_dtype, dim, keys, values):
        super().__init__(name=name)
        key_dtype, value_dtype = tf.as_dtype(key_dtype), tf.as_dtype(value_dtype)
        keys = np.asarray(keys)
        num_keys = len(keys)
        self.dim = int(dim)
        empty, deleted, absent = _unused_keys(keys, key_dtype, 3)
        self.reserved = tf.constant([empty, deleted], key_dtype)
        self.absent = tf.constant(absent, key_dtype)
        buckets = 1 << max(3, int(np.ceil(np.log2(max(1, num_keys) / 0.8))))
        self.index = tf.lookup.experimental.DenseHashTable(
            key_dtype, tf.int64, default_value=0, empty_key=empty, deleted_key=deleted,
            initial_num_buckets=buckets, name=name + "_index")
        if num_keys:
            self.index.insert(tf.constant(keys, key_dtype),
                              tf.range(1, num_keys + 1, dtype=tf.int64))
        rows = np.concatenate([np.zeros([1, self.dim], value_dtype.as_numpy_dtype),
                               np.asarray(values).reshape(-1, self.dim)])
        self.rows = tf.Variable(rows, trainable=False, shape=tf.TensorShape([None, self.dim]),
                                name=name + "_rows")

    def _is_reserved(self, ids):
        return tf.reduce_any(tf.equal(ids[:, None], self.reserved[None, :]), axis=1)

    def _numbers(self, ids):
        """Row numbers of 1-D `ids` in `rows` (0, the zero row: not held)."""
        return tf.reshape(self.index.lookup(tf.where(self._is_reserved(ids), self.absent, ids)),
                          [-1])

    def positions(self, ids):
        """Where 1-D `ids` are held (-1: not held)."""
        return self._numbers(ids) - 1

    def lookup(self, ids):
        """`[n, dim]` rows of 1-D `ids`; zero rows for ids not held."""
        return tf.gather(self.rows, self._numbers(ids))

    def keys(self):
        """The keys held (1-D, in no particular order)."""
        keys = tf.reshape(self.index.export()[0], [-1])
        return tf.boolean_mask(keys, tf.logical_not(self._is_reserved(keys)))

    def apply(self, keys, values, removed, replace):
        """Upserts distinct `keys` with `values`, removes `removed`; with `replace` (a full
        export) every key held before goes first. Returns the number of keys held after.
        Removed keys' rows stay in the variable until a replacing apply rebuilds it."""
        usable = tf.logical_not(self._is_reserved(keys))
        keys, values = tf.boolean_mask(keys, usable), tf.boolean_mask(values, usable)
        removed = tf.boolean_mask(removed, tf.logical_not(self._is_reserved(removed)))
        dropped = tf.cond(replace, self.keys, lambda: tf.zeros([0], keys.dtype))
        erased = self.index.erase(tf.concat([dropped, removed], 0))
        with tf.control_dependencies([erased]):
            base = tf.cond(replace, lambda: self.rows[:1], self.rows.read_value)
            number = tf.reshape(self.index.lookup(keys), [-1])
        held = number > 0
        fresh = tf.logical_not(held)
        updated = tf.tensor_scatter_nd_update(
            base, tf.boolean_mask(number, held)[:, None], tf.boolean_mask(values, held))
        new_keys = tf.boolean_mask(keys, fresh)
        first = tf.shape(base, out_type=tf.int64)[0]
        # Rows first, index second: a lookup in between sees the old rows, never a number past
        # the end of the variable.
        assigned = self.rows.assign(tf.concat([updated, tf.boolean_mask(values, fresh)], 0))
        with tf.control_dependencies([assigned]):
            inserted = self.index.insert(
                new_keys, tf.range(first, first + tf.size(new_keys, out_type=tf.int64)))
        with tf.control_dependencies([inserted]):
            return self.index.size()


def _unused_keys(keys, key_dtype, count):
    """`count` distinct values of `key_dtype` that are not among `keys`."""
    taken = set(keys.tolist())
    found = []
    if key_dtype == tf.string:
        candidate = b"\x00tfra-de reserved"
        while len(found) < count:
            candidate += b"\x00"
            if candidate not in taken:
                found.append(candidate)
        return found
    candidate = key_dtype.min
    while len(found) < count:
        if candidate not in taken:
            found.append(candidate)
        candidate += 1
    return found
