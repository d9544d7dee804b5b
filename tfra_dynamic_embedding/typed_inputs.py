"""Inputs checked before any op is built: dtypes by name, tensors of the right dtype (never
cast silently), and the errors that say what was wrong (`DTypeError`, `ShapeError`); a valid
name scope from a variable's name (`scope_name`).

Example:
    >>> typed_tensor([1, 2], tf.int64, "keys").dtype
    tf.int64
    >>> checked_dtype("float32", (tf.float32, tf.float64), "value_dtype")
    tf.float32
"""

import numpy as np
import tensorflow as tf


class DTypeError(TypeError, ValueError):
    """A tensor of the wrong dtype was passed (both a TypeError and a ValueError, like TF's)."""


class ShapeError(ValueError, tf.errors.InvalidArgumentError):
    """Rows of the wrong shape, caught when the op is built: a ValueError, and also the
    InvalidArgumentError ("Expected shape ...") that TFRA's table kernels raise when run."""

    def __init__(self, message):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


def checked_dtype(dtype, allowed, arg):
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
        tfra_dynamic_embedding.typed_inputs.DTypeError: rows must have dtype float32; got float64 (...)
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


def scope_name(name):
    """A valid name scope from a variable name (scope slashes become underscores)."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return cleaned.lstrip("._-") or "de"
