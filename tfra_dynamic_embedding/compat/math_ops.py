"""`de.math`: TFRA's sparse helpers (TFRA ships GPU kernels for them; on the CPU they are
TensorFlow's own ops, with TFRA's signatures).

Example:
    >>> rows = tf.constant([[1.0], [2.0], [4.0]])
    >>> sparse_segment_sum(rows, tf.constant([0, 1, 2]), tf.constant([0, 0, 1]), num_segments=2)
    <tf.Tensor: shape=(2, 1), dtype=float32, numpy=
    array([[3.],
           [4.]], dtype=float32)>
"""

import tensorflow as tf


def sparse_segment_sum(data, indices, segment_ids, name=None, num_segments=None):
    """`tf.sparse.segment_sum`: sums of `data[indices]` per segment."""
    return tf.sparse.segment_sum(data, indices, segment_ids, num_segments=num_segments,
                                 name=name)


def sparse_fill_empty_rows(sp_input, default_value, name=None):
    """`tf.sparse.fill_empty_rows`: (filled SparseTensor, bool indicator of empty rows)."""
    return tf.sparse.fill_empty_rows(sp_input, default_value, name=name)


def sparse_reshape(sp_input, shape, name=None):
    """`tf.sparse.reshape`."""
    return tf.sparse.reshape(sp_input, shape, name=name)


__all__ = ["sparse_fill_empty_rows", "sparse_reshape", "sparse_segment_sum"]
