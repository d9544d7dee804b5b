"""Turns the `initializer` argument of `de.Variable` into a function that makes fresh rows.

`make_rows(n)` returns an `[n, dim]` tensor with one independent draw per row, for a dynamic
`n`, so that every missing key gets its own initial row. Lookups call it for exactly the missing
keys, unless `is_constant(make_rows)` (every row equal), when any number of rows will do.

Example:
    make_rows = rows_maker(tf.random_normal_initializer(0.0, 0.01), dim=8, dtype=tf.float32)
    make_rows(tf.constant(3))   # a [3, 8] tensor of fresh normal draws
"""

import numbers

import numpy as np
import tensorflow as tf

# Keras 3 (and tf_keras) random initializers draw with a seed fixed at construction, so calling
# one twice for the same shape returns the same rows: new keys of different batches would share
# initial values. These are re-expressed as stateful TF draws with the same distribution.
_KERAS_RANDOM = {
    "RandomNormal": lambda c, shape, dtype: tf.random.normal(
        shape, c["mean"], c["stddev"], dtype=dtype, seed=c.get("seed")),
    "TruncatedNormal": lambda c, shape, dtype: tf.random.truncated_normal(
        shape, c["mean"], c["stddev"], dtype=dtype, seed=c.get("seed")),
    "RandomUniform": lambda c, shape, dtype: tf.random.uniform(
        shape, c["minval"], c["maxval"], dtype=dtype, seed=c.get("seed")),
}


def rows_maker(initializer, dim, dtype):
    """Returns `make_rows(n) -> [n, dim]` for a number, a `[dim]` array, a TF/Keras initializer or name.

    None means zeros. Raises ValueError naming `initializer` when it cannot make `[n, dim]` rows.
    """
    dtype = tf.as_dtype(dtype)
    if initializer is None:
        return _constant_rows(lambda n: tf.zeros(tf.stack([n, dim]), dtype))
    # Constants are made inside make_rows, in the graph that calls it: a tensor made here could
    # belong to a tf.function trace and be out of scope in the next one.
    if isinstance(initializer, numbers.Number) and not isinstance(initializer, bool):
        return _constant_rows(
            lambda n: tf.fill(tf.stack([n, dim]), tf.constant(initializer, dtype)))
    if isinstance(initializer, tf.Tensor) and tf.is_symbolic_tensor(initializer):
        # A graph tensor (a v1 graph's constant): used in that graph, broadcast to the rows.
        shape = initializer.shape
        if not (shape.is_compatible_with([]) or shape.is_compatible_with([dim])):
            raise ValueError(f"initializer must be a scalar or have shape [dim] = [{dim}] when "
                             f"given as a tensor; got shape {shape}")
        return _constant_rows(
            lambda n: tf.broadcast_to(tf.cast(initializer, dtype), tf.stack([n, dim])))
    if isinstance(initializer, (np.ndarray, list, tuple, tf.Tensor)):
        row = np.asarray(initializer)
        if row.shape == ():   # a 0-d array or tensor is a number
            return rows_maker(row.item(), dim, dtype)
        if row.shape != (dim,):
            raise ValueError(
                f"initializer must have shape [dim] = [{dim}] when given as an array; "
                f"got shape {list(row.shape)}")
        return _constant_rows(
            lambda n: tf.tile(tf.constant(row[np.newaxis, :], dtype), tf.stack([n, 1])))
    if isinstance(initializer, str):  # a Keras identifier such as "uniform" or "zeros"
        initializer = tf.keras.initializers.get(initializer)
    if not callable(initializer):
        raise ValueError(
            f"initializer must be None, a number, a [dim] array or a callable initializer; "
            f"got {initializer!r}")
    keras_draw = _KERAS_RANDOM.get(type(initializer).__name__)
    if keras_draw is not None and type(initializer).__module__.startswith(("keras", "tf_keras")):
        config = initializer.get_config()
        return lambda n: keras_draw(config, tf.stack([n, dim]), dtype)

    def make_rows(n):
        try:
            rows = initializer(shape=tf.stack([n, dim]), dtype=dtype)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"initializer {initializer!r} cannot make rows of shape [n, {dim}] with a dynamic "
                f"n (initializers whose values depend on the table's full shape, such as "
                f"Glorot/VarianceScaling/Orthogonal, are not supported): {error}") from error
        return tf.cast(rows, dtype)

    return make_rows


def _constant_rows(make_rows):
    """Marks a row maker whose rows are all equal, so a caller may draw rows for every key."""
    make_rows.is_constant = True
    return make_rows


def is_constant(make_rows):
    """Whether `make_rows` (from `rows_maker`) gives the same row for every key."""
    return getattr(make_rows, "is_constant", False)
