"""A table the plan splits by columns: one de.Variable per column block, lookups concatenated.

A plan may cut a wide, hot table into column blocks (pieces.py): block j holds columns
[offset_j, offset_j + width_j) of every row, on its own device. One `de.Variable` shards keys,
not columns, so such a table is built here as one variable per block -- `<name>/col<j>`
(`apply.block_name`), `dim=width_j`, on block j's device -- and a lookup reads every block and
concatenates the rows on the last axis. A table is cut by rows or by columns, never both.

Training: `embedding_lookup` goes through `de.embedding_lookup` on each block, so the gradient of
the concatenated rows reaches each block as its own columns, and any optimizer wrapped by
`de.DynamicEmbeddingOptimizer` trains the blocks. For element-wise optimizers (SGD, Adam,
Adagrad, Ftrl, RMSProp, ...) that is exactly the training of the whole table; an update that
mixes the columns of a row (a row norm, `max_norm` clipping) would differ, so none is offered.
Each block draws its own initial rows: with a random initializer they differ from an unsplit
table's (same distribution); a constant one gives the same rows.

Example:
    >>> from tfra_dynamic_embedding.placement.types import Plan, TableSpec, Task, make_devices
    >>> task = Task([TableSpec("ad", rows=1000, dim=128)], make_devices(2, template="/CPU:{i}"))
    >>> plan = Plan(task, {"ad": ["/CPU:0", "/CPU:1"]}, columns={"ad": [64, 64]})
    >>> split = column_split_variables(plan, "ad", initializer=tf.zeros_initializer())
    >>> split
    ColumnSplitVariable('ad', widths=[64, 64], devices=['/CPU:0', '/CPU:1'])
    >>> ad_ids = tf.constant([[3, 7]], tf.int64)
    >>> split.embedding_lookup(ad_ids).shape                   # [batch, 2, the plan's dim]
    TensorShape([1, 2, 128])
    >>> ColumnSplitEmbedding(plan, "ad", 128, pooling="sum")(ad_ids).shape   # Keras: the same
    TensorShape([1, 128])
"""

import tensorflow as tf

from tfra_dynamic_embedding import embedding_ops
from tfra_dynamic_embedding import scopes
from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding.keras import binding
from tfra_dynamic_embedding.keras import layers
from tfra_dynamic_embedding.placement import apply


def _blocks(plan, name):
    """(plan table name, [(width, device)]) of a table the plan splits by columns."""
    table = apply.match_table(plan, name)
    if table is None:
        raise KeyError(f"table {name!r} is not in the placement plan (tables: "
                       f"{sorted(plan.assignment)[:10]})")
    blocks = plan.column_blocks(table)
    if not blocks:
        raise ValueError(f"the placement plan does not split table {table!r} by columns (its "
                         f"devices: {plan.devices_for(table)}); use de.get_variable in "
                         f"plan.scope() for it")
    return table, blocks


def _check_dim(table, dim, plan, arg):
    if dim is not None and dim != plan.task.table(table).dim:
        raise ValueError(f"{arg} of table {table!r} must be the plan's dim "
                         f"{plan.task.table(table).dim}; got {dim!r}")


class ColumnSplitVariable(_tf_private.AutoTrackable):
    """A table split by columns: `variables[j]` holds block j (a `de.Variable` of dim
    `widths[j]` on `devices[j]`); every block holds the same keys. Tracked by
    `tf.train.Checkpoint` like a `de.Variable`. Made by `column_split_variables`.

    Example:
        >>> from tfra_dynamic_embedding.placement.types import Plan, TableSpec, Task, make_devices
        >>> task = Task([TableSpec("wide", rows=10, dim=64)], make_devices(2, template="/CPU:{i}"))
        >>> plan = Plan(task, {"wide": ["/CPU:0", "/CPU:1"]}, columns={"wide": [32, 32]})
        >>> split = column_split_variables(plan, "wide", initializer=0.0)
        >>> ids, rows = tf.constant([1, 2], tf.int64), tf.reshape(tf.range(128.0), [2, 64])
        >>> _ = split.upsert(ids, rows)                 # rows [n, dim] split by columns
        >>> bool(tf.reduce_all(split.lookup(ids) == rows))
        True
    """

    def __init__(self, name, variables):
        self._table_name = name
        self.variables = list(variables)

    @property
    def name(self):
        """The plan's table name."""
        return self._table_name

    @property
    def widths(self):
        return [v.dim for v in self.variables]

    @property
    def dim(self):
        return sum(self.widths)

    @property
    def devices(self):
        """One device per block."""
        return [v.devices[0] for v in self.variables]

    @property
    def key_dtype(self):
        return self.variables[0].key_dtype

    def lookup(self, ids):
        """Rows of `ids` (any shape) -> `ids.shape + [dim]`; never inserts (de.Variable.lookup)."""
        return tf.concat([v.lookup(ids) for v in self.variables], axis=-1)

    def embedding_lookup(self, ids, name=None):
        """Trainable rows of `ids` -> `ids.shape + [dim]`: `de.embedding_lookup` on each block
        (lookup names `<name>_col<j>`), concatenated."""
        name = name or "embedding_lookup"
        return tf.concat([embedding_ops.embedding_lookup(v, ids, name=f"{name}_col{j}")
                          for j, v in enumerate(self.variables)], axis=-1)

    def upsert(self, ids, values):
        """Inserts or overwrites the rows of `ids`; `values` is `ids.shape + [dim]`, split by
        columns over the blocks."""
        values = tf.convert_to_tensor(values, dtype=self.variables[0].value_dtype)
        if values.shape.rank is not None and values.shape[-1] not in (None, self.dim):
            raise ValueError(f"values of table {self.name!r} must have {self.dim} columns (its "
                             f"dim); got shape {values.shape}")
        parts = tf.split(values, self.widths, axis=-1)
        return tf.group([v.upsert(ids, part) for v, part in zip(self.variables, parts)])

    def size(self):
        """Number of keys (the blocks are written together, so block 0's count)."""
        return self.variables[0].size()

    def __repr__(self):
        return (f"ColumnSplitVariable({self.name!r}, widths={self.widths}, "
                f"devices={self.devices})")


def column_split_variables(plan, name, **kwargs):
    """The `ColumnSplitVariable` of table `name`, which `plan` splits by columns: one
    `de.get_variable(apply.block_name(name, j), dim=width_j, devices=[device_j], **kwargs)` per
    block, so variable scopes and reuse apply as for any `de.get_variable`.

    `kwargs` are `de.get_variable`'s (initializer, key_dtype, kv_creator, ...); `dim`, if given,
    must be the plan's dim of the table; `devices` and `partitioner` come from the plan.

    Example:
        >>> from tfra_dynamic_embedding.placement.types import Plan, TableSpec, Task, make_devices
        >>> task = Task([TableSpec("item", rows=10, dim=64)], make_devices(2, template="/CPU:{i}"))
        >>> plan = Plan(task, {"item": ["/CPU:0", "/CPU:1"]}, columns={"item": [48, 16]})
        >>> split = column_split_variables(plan, "item", initializer=0.0)
        >>> [v.name for v in split.variables], split.widths
        (['item/col0', 'item/col1'], [48, 16])
        >>> split.lookup(tf.constant([5], tf.int64)).shape
        TensorShape([1, 64])
    """
    table, blocks = _blocks(plan, name)
    _check_dim(table, kwargs.pop("dim", None), plan, "dim")
    given = sorted({"devices", "partitioner"} & set(kwargs))
    if given:
        raise ValueError(f"column_split_variables takes devices from the plan; got {given} for "
                         f"table {table!r}")
    variables = [scopes.get_variable(apply.block_name(name, j), dim=width, devices=[device],
                                     **kwargs)
                 for j, (width, device) in enumerate(blocks)]
    return ColumnSplitVariable(table, variables)


class ColumnSplitEmbedding:
    """Keras layer of a table the plan splits by columns: one `de.keras.layers.Embedding` per
    block (`blocks[j]`, named `<name>_col<j>`: Keras names hold no "/", dim `width_j`, on block
    j's device), their outputs concatenated on the last axis.

    Args are those of `de.keras.layers.Embedding` (`pooling` pools each block: pooling is
    column-wise, so this equals pooling the whole rows), plus `plan` and the plan's table
    `name`; `embedding_size` must be the plan's dim of the table. A Keras layer of the Keras
    chosen as for `de.keras.layers.Embedding` (Keras 3 unless told otherwise).

    Example:
        >>> import keras
        >>> from tfra_dynamic_embedding.placement.types import Plan, TableSpec, Task, make_devices
        >>> task = Task([TableSpec("user", rows=10, dim=128)], make_devices(2, template="/CPU:{i}"))
        >>> plan = Plan(task, {"user": ["/CPU:0", "/CPU:1"]}, columns={"user": [64, 64]})
        >>> ids = keras.Input(shape=(3,), dtype="int64")
        >>> ColumnSplitEmbedding(plan, "user", 128, pooling="sum")(ids).shape
        (None, 128)
    """

    def __new__(cls, *args, **kwargs):
        layer_class, _ = binding.class_for(cls, args, kwargs)
        # The Keras Layer's own __new__ (both Kerases set up the instance there).
        return super(ColumnSplitEmbedding, layer_class).__new__(layer_class, *args, **kwargs)

    def __init__(self, plan, name, embedding_size, key_dtype=tf.int64, value_dtype=tf.float32,
                 pooling=None, initializer=None, keras=None, **kwargs):
        del keras   # chose the class in __new__
        table, blocks = _blocks(plan, name)
        _check_dim(table, embedding_size, plan, "embedding_size")
        given = sorted({"devices", "partitioner"} & set(kwargs))
        if given:
            raise ValueError(f"ColumnSplitEmbedding takes devices from the plan; got {given} for "
                             f"table {table!r}")
        super().__init__(name=name.replace("/", "_"), dtype=tf.as_dtype(value_dtype).name)
        self.embedding_size = int(embedding_size)
        self.pooling = pooling
        self.blocks = [layers.Embedding(width, key_dtype=key_dtype, value_dtype=value_dtype,
                                        pooling=pooling, initializer=initializer,
                                        devices=[device], name=f"{self.name}_col{j}",
                                        keras=self.keras, **kwargs)
                       for j, (width, device) in enumerate(blocks)]

    @property
    def keras(self):
        """The layer's Keras: "keras" (Keras 3) or "tf_keras"."""
        return binding.package_of(type(self))

    def call(self, ids):
        return tf.concat([block(ids) for block in self.blocks], axis=-1)

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)[:-1] if self.pooling is not None else list(input_shape)
        shape = tuple(shape) + (self.embedding_size,)
        return tf.TensorShape(shape) if self.keras == binding.TF_KERAS else shape


__all__ = ["ColumnSplitEmbedding", "ColumnSplitVariable", "column_split_variables"]
