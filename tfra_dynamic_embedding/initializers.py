"""Turns the `initializer` argument of `de.Variable` into an `InitSpec`: a description of the
initial rows that goes down to the tables, each backend drawing it its own way.

The description (`tables.base.InitSpec`) holds the initializer's kind and parameters as data the
native kernels draw from, and a TF-op row maker for backends that draw with TF ops (and for kinds
no kernel draws): `spec.rows(keys)` gives the `[size(keys), dim]` initial rows of 1-D `keys`.
Tables ask for rows of exactly the distinct missing keys, unless `spec.constant` (every row
equal), when of any keys. By initializer:

- None (zeros), a number, a scalar, `[1]` (broadcast, as TFRA) or `[dim]` array, list or tensor,
  Zeros / Ones / Constant initializers (a Constant may hold a `[dim]` row): that row for every key
  (kind "constant"). Integer rows take only whole numbers in their range (TF would cut or wrap
  the rest); string rows take text (None: empty text); those, and graph tensors, are custom
  constants (TF ops only).
- RandomNormal / RandomUniform / TruncatedNormal of TF, tf.compat.v1, Keras 3 or tf_keras with an
  integer seed: keyed -- a key's row is a pure function of (seed, key) (tables/keyed_random.py),
  the same whatever batch, shard count, backend or process first makes it; different keys get
  different rows. (Called directly, a seeded initializer returns the same values on every call,
  which would give every new key one shared row.)
- the same without a seed: fresh draws, one per key (TF's stateful ops; the native kernels' fast
  generator under a seed drawn here, from TF's global seed when one is set).
- VarianceScaling and its subclasses (Glorot, He, LeCun): custom; as TFRA, drawn for the
  run-time shape `[n, dim]`, n the number of rows being made (a shard's distinct missing keys),
  so fan_in = n and fan_out = dim. With a seed the unit draws are keyed as above, then scaled.
- any other callable: custom, called with `shape=[n, dim]` (shape-bound ones such as Orthogonal
  fail when n is only known at run time).

A bad parameter (maxval <= minval, stddev < 0) raises ValueError naming it.

Example:
    >>> spec = describe(tf.random_normal_initializer(0.0, 0.01, seed=7), dim=8, dtype=tf.float32)
    >>> spec.kind, spec.keyed              # the native kernels draw it
    ('normal', True)
    >>> rows = spec.rows(tf.constant([3, 5], tf.int64))   # by TF ops
    >>> rows.shape
    TensorShape([2, 8])
    >>> bool(tf.reduce_all(spec.rows(tf.constant([3], tf.int64))[0] == rows[0]))  # key 3's row
    True
"""

import math
import numbers
import random

import numpy as np
import tensorflow as tf

from tfra_dynamic_embedding.tables import base
from tfra_dynamic_embedding.tables import keyed_random
from tfra_dynamic_embedding.tables.base import InitSpec  # the description type (tables read it)

# Initializer class name -> (draw kind, config key of a, config key of b). The names are the same
# in TF v2 (init_ops_v2), tf.compat.v1 (init_ops), Keras 3 and tf_keras.
_RANDOM = {
    "RandomNormal": (base.NORMAL, "mean", "stddev"),
    "TruncatedNormal": (base.TRUNCATED_NORMAL, "mean", "stddev"),
    "RandomUniform": (base.UNIFORM, "minval", "maxval"),
}
_STATEFUL = {base.NORMAL: tf.random.normal, base.TRUNCATED_NORMAL: tf.random.truncated_normal,
             base.UNIFORM: tf.random.uniform}
_CONSTANT_CLASSES = ("Zeros", "Ones", "Constant")
_LIBRARIES = ("tensorflow", "keras", "tf_keras")   # modules whose classes we re-express
# Stddev of a unit normal truncated at +-2 (TF's VarianceScaling divides by it).
_TRUNCATED_STDDEV = 0.87962566103423978
_MASK64 = (1 << 64) - 1


def describe(initializer, dim, dtype):
    """The `InitSpec` of `initializer` for `[n, dim]` rows of `dtype` (see the module doc).

    Raises ValueError naming `initializer` when it cannot make `[n, dim]` rows.
    """
    dtype = tf.as_dtype(dtype)
    if initializer is None:   # zeros; empty text in string rows
        return _constant(b"" if dtype == tf.string else 0, dim, dtype)
    if dtype == tf.string and isinstance(initializer, (str, bytes)):   # text, not a Keras name
        return _constant(initializer, dim, dtype)
    if isinstance(initializer, str):  # a Keras identifier such as "uniform" or "zeros"
        try:
            initializer = tf.keras.initializers.get(initializer)
        except ValueError as error:
            raise ValueError(f"initializer {initializer!r} is not a Keras initializer name: "
                             f"{error}") from error
    if not callable(initializer):
        return _constant(initializer, dim, dtype)
    cls = type(initializer)
    if cls.__module__.split(".")[0] in _LIBRARIES:
        if cls.__name__ in _CONSTANT_CLASSES:
            value = {"Zeros": 0, "Ones": 1}.get(cls.__name__)
            if value is None:
                value = getattr(initializer, "value", None)
                if value is None:
                    value = initializer.get_config().get("value", 0)
            return _constant(value, dim, dtype)
        if cls.__name__ in _RANDOM:
            return _random(initializer, dim, dtype)
        if any(klass.__name__ == "VarianceScaling" for klass in cls.__mro__):
            return InitSpec(base.CUSTOM, dim=dim, dtype=dtype,
                            make_rows=_variance_scaling_rows(initializer, dim, dtype))
    return InitSpec(base.CUSTOM, dim=dim, dtype=dtype,
                    make_rows=_callable_rows(initializer, dim, dtype))


def unseeded_seed():
    """A seed for an initializer the user left unseeded: drawn from TF's global seed when one is
    set (`tf.random.set_seed`, v1 `set_random_seed`: a seeded program stays reproducible, as
    TF's own random ops), else random."""
    global_seed, op_seed = tf.compat.v1.random.get_seed(None)
    if global_seed is None:
        return random.getrandbits(63)
    return ((int(global_seed) * 0x9E3779B97F4A7C15 + int(op_seed)) & _MASK64) >> 1


def _constant(value, dim, dtype):
    """A constant's InitSpec: the kernels' fields (the value rounded to `dtype` as TF rounds it)
    where they hold it -- a number, or a [1] / [dim] array, in floating rows -- else a custom
    constant; either way with the exact TF-op maker of `_constant_rows`."""
    make_rows = _constant_rows(value, dim, dtype)
    fields = _constant_fields(value, dim, dtype) if dtype.is_floating else None
    if fields is None:
        return InitSpec(base.CUSTOM, dim=dim, dtype=dtype, make_rows=make_rows, equal_rows=True)
    a, row = fields
    return InitSpec(base.CONSTANT, dim=dim, dtype=dtype, a=a, row=row, make_rows=make_rows)


def _constant_fields(value, dim, dtype):
    """(a, row) of a constant value rounded to `dtype` as TF rounds it, or None if it is not a
    number or a [1] / [dim] array (e.g. a graph tensor)."""
    if isinstance(value, bool) or (isinstance(value, tf.Tensor) and tf.is_symbolic_tensor(value)):
        return None
    try:
        arr = np.asarray(value)
    except Exception:  # pylint: disable=broad-except  (not array-like: not a constant)
        return None
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype.name == "bfloat16"):
        return None
    arr = arr.astype(dtype.as_numpy_dtype).astype(np.float64)
    if arr.shape in ((), (1,)):
        return float(arr.reshape(())), None
    if arr.shape == (dim,):
        return 0.0, tuple(arr.tolist())
    return None


def _callable_rows(initializer, dim, dtype):
    """A maker calling `initializer(shape=[n, dim], dtype=dtype)`, checked."""

    def make_rows(keys):
        try:
            rows = initializer(shape=tf.stack([tf.size(keys), dim]), dtype=dtype)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"initializer {initializer!r} cannot make rows of shape [n, {dim}] with a dynamic "
                f"n (initializers bound to a full table shape, such as Orthogonal or Identity, "
                f"are not supported): {error}") from error
        rows = tf.convert_to_tensor(rows)
        if not (rows.dtype.is_floating or rows.dtype.is_integer):
            raise ValueError(f"initializer {initializer!r} must return numbers; got "
                             f"{rows.dtype.name} rows")
        # A callable of the user's own may ignore `shape`: say so here, not deep in a table op.
        with tf.control_dependencies([tf.debugging.assert_equal(
                tf.shape(rows), tf.stack([tf.size(keys), dim]),
                message=f"initializer {initializer!r} must return rows of the shape it is given, "
                        f"[n, {dim}]")]):
            return tf.cast(rows, dtype)

    return make_rows


def _constant_rows(value, dim, dtype):
    """A maker repeating `value`: a number, or a scalar, `[1]` or `[dim]` array/list/tensor."""
    # Tensors are made inside make_rows, in the graph that calls it: a tensor made here could
    # belong to a tf.function trace and be out of scope in the next one.
    if isinstance(value, tf.Tensor) and tf.is_symbolic_tensor(value):
        # A graph tensor (a v1 graph's constant): used in that graph, broadcast to the rows.
        if not any(value.shape.is_compatible_with(s) for s in ([], [1], [dim])):
            raise ValueError(f"initializer must be a scalar or have shape [1] or [dim] = [{dim}] "
                             f"when given as a tensor; got shape {value.shape}")

        def make_rows(keys):
            return tf.broadcast_to(tf.cast(value, dtype), tf.stack([tf.size(keys), dim]))
    else:
        if isinstance(value, bool):
            raise ValueError(f"initializer must be a number, an array or an initializer; "
                             f"got {value!r}")
        row = np.asarray(value)
        numeric = np.issubdtype(row.dtype, np.number) or row.dtype.name == "bfloat16"
        text = row.dtype.kind in "SU" and dtype == tf.string   # string-valued tables
        if not (numeric or text):
            raise ValueError(f"initializer must be None, a number, a [dim] array or a callable "
                             f"initializer; got {value!r}")
        row = _exact_row(value, row, dtype)
        if row.shape in ((), (1,)):   # one number for every column (TFRA broadcasts [1])
            scalar = row.reshape(()).item()

            def make_rows(keys):
                return tf.fill(tf.stack([tf.size(keys), dim]), tf.constant(scalar, dtype))
        elif row.shape == (dim,):
            def make_rows(keys):
                return tf.tile(tf.constant(row[np.newaxis, :], dtype),
                               tf.stack([tf.size(keys), 1]))
        else:
            raise ValueError(f"initializer must be a scalar or have shape [1] or [dim] = [{dim}] "
                             f"when given as an array or a constant initializer's value; got "
                             f"shape {list(row.shape)}")
    return make_rows


def _exact_row(value, row, dtype):
    """`row` (numpy, from the constant `value`) as rows of `dtype` hold it; a ValueError naming
    `initializer` when they cannot hold it exactly (TF would cut 1.5 to 1 or wrap 300 to 44 in
    int8 rows, or refuse a number for string rows only at the first lookup).

    Example:
        >>> _exact_row(2.0, np.asarray(2.0), tf.int64)
        array(2)
        >>> _exact_row(1.5, np.asarray(1.5), tf.int64)
        Traceback (most recent call last):
        ...
        ValueError: ...
    """
    if dtype == tf.string:
        if row.dtype.kind not in "SU":
            raise ValueError(f"initializer {value!r} cannot fill rows of value_dtype string; "
                             "give it as text, e.g. initializer=''")
        return row
    if not dtype.is_integer:
        return row
    info = np.iinfo(dtype.as_numpy_dtype)
    if row.dtype.kind in "iu":
        exact = row.size == 0 or (int(row.min()) >= info.min and int(row.max()) <= info.max)
    else:
        as_float = row.astype(np.float64)
        exact = bool(np.all(np.isfinite(as_float)) and np.all(as_float == np.round(as_float))
                     and np.all(as_float >= info.min) and np.all(as_float < float(info.max) + 1.0))
    if not exact:
        raise ValueError(f"initializer {value!r} cannot fill rows of value_dtype {dtype.name} "
                         f"exactly: give whole numbers in [{info.min}, {info.max}]")
    return row.astype(dtype.as_numpy_dtype)


def _seed_of(initializer):
    """The integer seed the user gave `initializer`, or None (unseeded or a seed generator)."""
    seed = initializer.get_config().get("seed")
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return int(seed)
    return None


def _stateful(kind, shape, a, b, dtype):
    """Fresh stateful draws (drawn in float32 for 16-bit and integer rows, then cast)."""
    draw_dtype = dtype if dtype in (tf.float32, tf.float64) else tf.float32
    return tf.cast(_STATEFUL[kind](shape, tf.cast(a, draw_dtype), tf.cast(b, draw_dtype),
                                   dtype=draw_dtype), dtype)


def _random(initializer, dim, dtype):
    """A RandomNormal / TruncatedNormal / RandomUniform's InitSpec: keyed under the user's seed,
    else fresh draws (stateful TF ops; the kernels' generator under `unseeded_seed()`)."""
    kind, key_a, key_b = _RANDOM[type(initializer).__name__]
    config = initializer.get_config()
    # tf.compat.v1's random_uniform_initializer leaves maxval None: 1 for float rows, as TF.
    a = float(0.0 if config[key_a] is None else config[key_a])
    b = float(1.0 if config[key_b] is None else config[key_b])
    if kind == base.UNIFORM and not b > a:
        raise ValueError(f"initializer {initializer!r} needs maxval > minval; got minval={a}, "
                         f"maxval={b}")
    if kind != base.UNIFORM and b < 0:
        raise ValueError(f"initializer {initializer!r} needs stddev >= 0; got stddev={b}")
    if not (math.isfinite(a) and math.isfinite(b)):
        raise ValueError(f"initializer {initializer!r} needs finite parameters; got {a}, {b}")
    seed = _seed_of(initializer)
    if seed is not None:
        def make_rows(keys):
            return keyed_random.keyed_rows(keys, kind, a, b, seed, dim, dtype)

        return InitSpec(kind, dim=dim, dtype=dtype, a=a, b=b, seed=seed, keyed=True,
                        make_rows=make_rows)

    def fresh_rows(keys):
        return _stateful(kind, tf.stack([tf.size(keys), dim]), a, b, dtype)

    # Drawn for floating rows only (the kernels' dtypes): like a TF random op, it advances the
    # graph's op seed.
    return InitSpec(kind, dim=dim, dtype=dtype, a=a, b=b,
                    seed=unseeded_seed() if dtype.is_floating else 0, make_rows=fresh_rows)


def _variance_scaling_rows(initializer, dim, dtype):
    scale = float(initializer.scale)
    mode, distribution = initializer.mode, initializer.distribution
    if mode not in ("fan_in", "fan_out", "fan_avg"):
        raise ValueError(f"initializer {initializer!r} has mode {mode!r}; expected fan_in, "
                         f"fan_out or fan_avg")
    if distribution == "uniform":
        kind, unit_a, unit_b, factor = "uniform", -1.0, 1.0, math.sqrt(3.0)
    elif distribution == "untruncated_normal":
        kind, unit_a, unit_b, factor = "normal", 0.0, 1.0, 1.0
    elif distribution in ("truncated_normal", "normal"):   # "normal" is v1's truncated normal
        kind, unit_a, unit_b, factor = "truncated_normal", 0.0, 1.0, 1.0 / _TRUNCATED_STDDEV
    else:
        raise ValueError(f"initializer {initializer!r} has distribution {distribution!r}; "
                         f"expected uniform, truncated_normal or untruncated_normal")
    seed = _seed_of(initializer)

    def make_rows(keys):
        # TFRA calls the initializer with shape [n, dim]: fan_in = n, fan_out = dim.
        n = tf.cast(tf.size(keys), tf.float64)
        fan = {"fan_in": n, "fan_out": tf.constant(float(dim), tf.float64),
               "fan_avg": (n + dim) / 2.0}[mode]
        spread = factor * tf.sqrt(scale / tf.maximum(fan, 1.0))   # stddev or uniform limit
        if seed is not None:
            unit = keyed_random.keyed_rows(keys, kind, unit_a, unit_b, seed, dim, tf.float64)
        else:
            unit = _stateful(kind, tf.stack([tf.size(keys), dim]), unit_a, unit_b, tf.float64)
        return tf.cast(unit * spread, dtype)

    return make_rows
