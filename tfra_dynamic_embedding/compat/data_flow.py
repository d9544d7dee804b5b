"""`de.data_flow`: how a `de.Variable` splits keys over its shards and joins the results.

TFRA exposes these two ops under this name; here they are TensorFlow's own
`tf.dynamic_partition` / `tf.dynamic_stitch` (gradients included), with TFRA's signatures.

Example:
    >>> keys = tf.constant([4, 7, 2], tf.int64)
    >>> parts = dynamic_partition(keys, tf.cast(tf.math.floormod(keys, 2), tf.int32), 2)
    >>> [p.numpy().tolist() for p in parts]
    [[4, 2], [7]]
    >>> positions = dynamic_partition(tf.range(3), tf.cast(tf.math.floormod(keys, 2), tf.int32), 2)
    >>> dynamic_stitch(positions, parts).numpy()
    array([4, 7, 2])
"""

import tensorflow as tf


def dynamic_partition(data, partitions, num_partitions, name=None):
    """Splits `data` into `num_partitions` tensors by `partitions` (as `tf.dynamic_partition`)."""
    return tf.dynamic_partition(data, partitions, num_partitions, name=name)


def dynamic_stitch(indices, data, use_fast=True, name=None):
    """Interleaves `data` by `indices` (as `tf.dynamic_stitch`). `use_fast` is TFRA's switch
    between two GPU kernels; both give this result."""
    del use_fast
    return tf.dynamic_stitch(indices, data, name=name)
