"""A de.Variable's rows in a Keras 3 weights store (`save_own_variables` / `load_own_variables`
of `.keras` and `.weights.h5` files), under `<prefix>keys` and `<prefix>values`.

Keras' H5 store holds numeric arrays only, so string keys go as their bytes joined (uint8) plus
each key's length (`<prefix>key_lengths`, int64).

Example:
    save_table(store, "", var)      # in save_own_variables
    load_table(store, "", var)      # in load_own_variables: replaces var's content
"""

import numpy as np
import tensorflow as tf


def save_table(store, prefix, variable):
    """Writes all keys and rows of `variable` (a de.Variable) into `store`."""
    keys, values = variable.export()
    keys = keys.numpy()
    if keys.dtype == object:   # string keys: bytes objects
        store[prefix + "keys"] = np.frombuffer(b"".join(keys), np.uint8)
        store[prefix + "key_lengths"] = np.array([len(k) for k in keys], np.int64)
    else:
        store[prefix + "keys"] = keys
    store[prefix + "values"] = values.numpy()


def load_table(store, prefix, variable):
    """Replaces the content of `variable` with the table `save_table` wrote under `prefix`."""
    keys = np.asarray(store[prefix + "keys"])
    if prefix + "key_lengths" in store.keys():
        ends = np.cumsum(np.asarray(store[prefix + "key_lengths"]))
        data = keys.tobytes()
        keys = np.array([data[end - n:end] for end, n in
                         zip(ends, np.diff(np.concatenate([[0], ends])))], dtype=object)
    variable.import_(tf.constant(keys, dtype=variable.key_dtype),
                     tf.constant(np.asarray(store[prefix + "values"]),
                                 dtype=variable.value_dtype))
