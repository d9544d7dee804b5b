"""Tracing a model for serving with every `de.Variable` read from a stock-op snapshot.

Inside `StockLookups().active()`, a `de.Variable`'s lookup (`Variable.lookup`, so every
`de.embedding_lookup*` and `de.keras.layers` call, grouped or not) reads a `StockTable` of the
variable's rows at that moment instead of its training tables, and makes no TrainableWrapper.
A function traced there holds stock TensorFlow ops only where it reads tables: a SavedModel of
it loads in stock TensorFlow and TF Serving (`inference.stock_saved_model`). The snapshot is
taken, eagerly, at a variable's first read; keys it does not hold get the variable's initial rows
drawn by stock ops (`InitSpec.rows`: a key's row depends on the key alone), so the function
predicts what the model predicts -- except for an unseeded random initializer on native tables,
which only the C++ kernels draw: such keys get zero rows (`drawn_by_stock_ops`).

Example:
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> w = de.Variable(dim=2, initializer=0.0, name="w")
    >>> w.upsert(tf.constant([1], tf.int64), tf.constant([[3.0, 3.0]]))
    >>> lookups = StockLookups()
    >>> with lookups.active():
    ...     serve = tf.function(lambda ids: de.embedding_lookup(w, ids)).get_concrete_function(
    ...         tf.TensorSpec([None], tf.int64))
    >>> serve(tf.constant([1, 2], tf.int64)).numpy().tolist()
    [[3.0, 3.0], [0.0, 0.0]]
    >>> sorted({op.type for op in serve.graph.get_operations()} & {"LookupTableFindV2"})
    ['LookupTableFindV2']
"""

import contextlib
import contextvars
import re

import tensorflow as tf

from tfra_dynamic_embedding.tables import base
from tfra_dynamic_embedding.tables import native

_ACTIVE = contextvars.ContextVar("tfra_de_stock_lookups", default=None)


def current():
    """The `StockLookups` whose `active()` block this is, or None."""
    return _ACTIVE.get()


class StockLookups:
    """The stock snapshots of the variables read inside `active()`, made at each one's first
    read; `tables` lists them (a SavedModel must track them: `inference.stock_saved_model` does)."""

    def __init__(self):
        self._tables = {}   # id(variable) -> (variable, StockTable)

    @contextlib.contextmanager
    def active(self):
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    @property
    def tables(self):
        return [table for _, table in self._tables.values()]

    @property
    def variables(self):
        return [variable for variable, _ in self._tables.values()]

    def table_for(self, variable):
        """`variable`'s StockTable, snapshotting its rows (eagerly) at the first call."""
        entry = self._tables.get(id(variable))
        if entry is None:
            from tfra_dynamic_embedding.tables import stock_table  # pylint: disable=import-outside-toplevel
            # Out of the function being traced: the snapshot is data of the SavedModel, not ops.
            with tf.init_scope():
                if not tf.executing_eagerly():
                    raise ValueError(f"de.Variable {variable.name!r}: a stock serving snapshot "
                                     f"needs eager execution (TF2), not a tf.compat.v1 graph")
                keys, values = variable.export()
                name = re.sub(r"\W", "_", variable.name) or "table"
                table = stock_table.StockTable(name if name[0].isalpha() else "t" + name,
                                               variable.key_dtype, variable.value_dtype,
                                               variable.dim, keys.numpy(), values.numpy())
            entry = self._tables[id(variable)] = (variable, table)
        return entry[1]

    def lookup(self, variable, keys, return_exists=False):
        """`variable.lookup(keys, return_exists)` read from the snapshot: keys it does not hold
        get the variable's initial rows, drawn by TF ops (`InitSpec.rows`), as the model's own
        lookups give them; zero rows where stock ops cannot draw those (`drawn_by_stock_ops`)."""
        table = self.table_for(variable)
        flat = tf.reshape(keys, [-1])
        position = table.positions(flat)
        rows = table.lookup(flat)   # zero rows for missing keys
        init = variable.init_spec
        if drawn_by_stock_ops(variable) and not (
                init.kind == base.CONSTANT and init.row is None and init.a == 0.0):
            missing = tf.where(position < 0)
            unique_keys, index = tf.unique(tf.gather_nd(flat, missing))
            new_rows = tf.cast(init.rows(unique_keys), variable.value_dtype)
            rows = tf.tensor_scatter_nd_update(rows, missing, tf.gather(new_rows, index))
        rows = tf.reshape(rows, tf.concat([tf.shape(keys), [variable.dim]], 0))
        rows.set_shape(keys.shape.concatenate([variable.dim]))
        if not return_exists:
            return rows
        exists = tf.reshape(position >= 0, tf.shape(keys))
        exists.set_shape(keys.shape)
        return rows, exists


def drawn_by_stock_ops(variable):
    """Whether stock ops draw the initial rows `variable`'s tables give keys they do not hold.

    Not for an unseeded random initializer on native tables: their C++ kernel draws it by a
    faster recipe (ziggurat normals, seeded per table) that has no stock-op form; keys a snapshot
    does not hold then get zero rows. A seeded initializer (drawn by the keyed recipe of
    `keyed_random`), a constant and any initializer on the built-in backend are drawn exactly.
    """
    init = variable.init_spec
    if init.kind in (base.CONSTANT, base.CUSTOM) or init.keyed:
        return True
    return not any(isinstance(t, native.NativeKVTable) for t in variable.shards.tables)
