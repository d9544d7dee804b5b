"""`de.keras.layers.Embedding`: a Keras layer over a `de.Variable`.

Looks up int or string ids of any shape (dense, `tf.RaggedTensor` or `tf.SparseTensor`), trains
through `model.fit` with a `de.DynamicEmbeddingOptimizer`-wrapped optimizer, and is saved by
`model.save_weights` / `tf.train.Checkpoint`. Ids never seen get initializer rows and no table
entry until an optimizer step writes them.

Example:
    ids = tf.keras.Input(shape=(3,), dtype=tf.int64)
    pooled = de.keras.layers.Embedding(8, combiner="mean", name="user")(ids)   # [batch, 8]
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(pooled))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam()), loss="mse")
"""

import numpy as np
import tensorflow as tf

from tfra_dynamic_embedding import embedding_ops
from tfra_dynamic_embedding import trainable as trainable_lib
from tfra_dynamic_embedding import variable as variable_lib

COMBINERS = ("sum", "mean", "sqrtn")


class Embedding(tf.keras.layers.Layer):
    """Embeddings of dynamic ids, one `[embedding_size]` row per id.

    Args:
      embedding_size: row length (the variable's dim).
      key_dtype: tf.int64, tf.int32 or tf.string; integer inputs are cast to it.
      value_dtype: dtype of the rows.
      combiner: None (output `ids.shape + [embedding_size]`) or "sum"/"mean"/"sqrtn" to pool over
        the last id axis (required for SparseTensor ids, default "mean" there).
      initializer: initializer of new rows (default Keras' "uniform").
      devices: devices of the shard tables (default: the placement plan in scope, else the
        current device).
      kv_creator: the table backend (default: native if built, else built-in).
    """

    def __init__(self, embedding_size, key_dtype=tf.int64, value_dtype=tf.float32,
                 combiner=None, initializer=None, devices=None, name="DynamicEmbeddingLayer",
                 kv_creator=None, **kwargs):
        kwargs.setdefault("dtype", tf.as_dtype(value_dtype).name)
        super().__init__(name=name, **kwargs)
        if combiner is not None and combiner not in COMBINERS:
            raise ValueError(f"combiner must be None or one of {list(COMBINERS)}; got {combiner!r}")
        self.embedding_size = embedding_size
        self.combiner = combiner
        self.supports_jit = False  # hash-table kernels have no XLA implementation
        partitioner = variable_lib.default_partition_fn
        placed = variable_lib.resolve_placement(self.name) if devices is None else None
        if placed is not None:  # inside a placement plan's scope (placement/apply.py)
            devices, partitioner = placed[0], placed[1] or partitioner
        self.params = variable_lib.Variable(
            key_dtype=key_dtype, value_dtype=value_dtype, dim=embedding_size, devices=devices,
            partitioner=partitioner, name=self.name,
            initializer="uniform" if initializer is None else initializer, kv_creator=kv_creator)
        # The lookup's TrainableWrapper is one of the layer's trainable weights from the start
        # (model.fit hands its gradient to the optimizer, and checkpoints see the same weights
        # before and after training). It is transient: save_own_variables stores the table.
        wrapper = trainable_lib.wrapper_for(
            self.params, trainable_lib.wrapper_name(self.params, self.name))
        wrapper.regularizer = None  # Keras reads it off every trainable weight
        if self.params.trainable:
            _trainable_weight_list(self).append(wrapper)

    def call(self, ids):
        if isinstance(ids, tf.SparseTensor):
            return self._lookup_sparse(ids)
        if isinstance(ids, tf.RaggedTensor):
            rows = ids.with_flat_values(self._lookup(self._keys(ids.flat_values)))
        else:
            rows = self._lookup(self._keys(tf.convert_to_tensor(ids)))
        return rows if self.combiner is None else _pool(rows, self.combiner)

    def _keys(self, ids):
        if ids.dtype != self.params.key_dtype and ids.dtype.is_integer:
            ids = tf.cast(ids, self.params.key_dtype)
        return ids

    def _lookup(self, ids):
        return embedding_ops.embedding_lookup(self.params, ids, name=self.name)

    def _lookup_sparse(self, sp_ids):
        sp_ids = tf.SparseTensor(sp_ids.indices, self._keys(sp_ids.values), sp_ids.dense_shape)
        return embedding_ops.safe_embedding_lookup_sparse(
            self.params, sp_ids, combiner=self.combiner or "mean", name=self.name)

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        if self.combiner is not None:
            shape = shape[:-1]
        return tuple(shape) + (self.embedding_size,)

    def get_config(self):
        config = super().get_config()
        config.update(embedding_size=self.embedding_size,
                      key_dtype=self.params.key_dtype.name,
                      value_dtype=self.params.value_dtype.name,
                      combiner=self.combiner, devices=self.params.devices)
        return config

    # Keras 3 `save_weights` / `load_weights`: the whole table, re-sharded on load.
    def save_own_variables(self, store):
        keys, values = self.params.export()
        keys = keys.numpy()
        store["keys"] = keys.astype(np.bytes_) if keys.dtype == object else keys
        store["values"] = values.numpy()

    def load_own_variables(self, store):
        keys = np.asarray(store["keys"])
        self.params.import_(tf.constant(keys, dtype=self.params.key_dtype),
                            tf.constant(np.asarray(store["values"]),
                                        dtype=self.params.value_dtype))


def _trainable_weight_list(layer):
    """The list Keras builds `trainable_weights` from (Keras 3 / tf_keras name it differently)."""
    if hasattr(layer, "_trainable_variables"):
        return layer._trainable_variables  # pylint: disable=protected-access
    return layer._trainable_weights  # pylint: disable=protected-access


def _pool(rows, combiner):
    """Pools `[..., ids, dim]` rows (dense or ragged) over the id axis; empty rows give zeros."""
    ragged = isinstance(rows, tf.RaggedTensor)
    axis = rows.ragged_rank if ragged else -2  # the (innermost ragged) id axis
    total = tf.reduce_sum(rows, axis=axis)
    if combiner == "sum":
        return total
    if ragged:
        count = tf.cast(rows.row_lengths(axis=axis), rows.dtype)
        count = tf.expand_dims(count.to_tensor() if isinstance(count, tf.RaggedTensor)
                               else count, -1)
    else:
        count = tf.cast(tf.shape(rows)[-2], rows.dtype)
    scale = count if combiner == "mean" else tf.sqrt(count)
    return tf.math.divide_no_nan(total, scale)
