"""A table's rows in stock TensorFlow ops: what every SavedModel this package writes for serving
holds instead of its training tables.

`StockTable` keeps a fixed set of keys in a `tf.lookup.experimental.DenseHashTable` (key -> row
number; open addressing in two flat arrays, sized once so it never grows) and their rows in one
variable, plus a zero row last: the row of every key it does not hold. Stock TensorFlow and TF
Serving load it without this package; the overhead is per key (docs/serving.md measures it).

Example:
    >>> import numpy as np
    >>> table = StockTable("t", tf.int64, tf.float32, 2, np.array([7, 9]),
    ...                    np.array([[1.0, 1.0], [2.0, 2.0]], np.float32))
    >>> table.lookup(tf.constant([9, 5], tf.int64)).numpy().tolist()   # 5: not held
    [[2.0, 2.0], [0.0, 0.0]]
"""

import numpy as np
import tensorflow as tf


class StockTable(tf.Module):
    """`keys` -> rows `values` (`[n, dim]`) in stock ops; keys it does not hold give zero rows.

    The hash table reserves two keys (empty and deleted buckets); they are chosen among values
    the table does not hold, and a request id equal to one of them is looked up as a third such
    value.
    """

    def __init__(self, name, key_dtype, value_dtype, dim, keys, values):
        super().__init__(name=name)
        key_dtype, value_dtype = tf.as_dtype(key_dtype), tf.as_dtype(value_dtype)
        keys = np.asarray(keys)
        self.num_keys = len(keys)
        self.dim = int(dim)
        empty, deleted, absent = _unused_keys(keys, key_dtype, 3)
        self.reserved = tf.constant([empty, deleted], key_dtype)
        self.absent = tf.constant(absent, key_dtype)
        buckets = 1 << max(3, int(np.ceil(np.log2(max(1, self.num_keys) / 0.8))))
        self.index = tf.lookup.experimental.DenseHashTable(
            key_dtype, tf.int64, default_value=-1, empty_key=empty, deleted_key=deleted,
            initial_num_buckets=buckets, name=name + "_index")
        if self.num_keys:
            self.index.insert(tf.constant(keys, key_dtype),
                              tf.range(self.num_keys, dtype=tf.int64))
        rows = np.concatenate([np.asarray(values).reshape(-1, self.dim),
                               np.zeros([1, self.dim], value_dtype.as_numpy_dtype)])
        self.rows = tf.Variable(rows, trainable=False, name=name + "_rows")

    def positions(self, ids):
        """Row numbers of 1-D `ids` (-1: not held)."""
        reserved = tf.reduce_any(tf.equal(ids[:, None], self.reserved[None, :]), axis=1)
        return self.index.lookup(tf.where(reserved, self.absent, ids))

    def lookup(self, ids):
        """`[n, dim]` rows of 1-D `ids`; zero rows for ids not held."""
        position = self.positions(ids)
        return tf.gather(self.rows, tf.where(position < 0, tf.cast(self.num_keys, tf.int64),
                                             position))

    def keys(self):
        """The keys held (1-D, in no particular order)."""
        keys = tf.reshape(self.index.export()[0], [-1])
        held = tf.reduce_all(tf.not_equal(keys[:, None], self.reserved[None, :]), axis=1)
        return tf.boolean_mask(keys, held)


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
