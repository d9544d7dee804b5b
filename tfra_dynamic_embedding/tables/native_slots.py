"""Optimizer slots kept in their variable's native records (one probe per key per step).

A native table's record can hold, after the key's row (column group 0), further groups of `dim`
columns: one per optimizer slot (Adam's m and v are groups 1 and 2). `SlotColumnsCreator` makes a
slot `de.Variable`'s shard tables as `NativeSlotView`s of its variable's shard tables: a view is
a full `KVTable` (lookup, insert, export, import, files, checkpoints under the slot's own name)
on its group's columns, sharing the table's keys, size, removals and metadata. The optimizer then
reads all slot rows of a batch with one `find_groups` and writes the trained rows and slot rows
back with one `upsert_groups`: each touches a key once.

Semantics of the shared keys: a slot holds the keys it was written for (each record notes which
slot groups were: `upsert_groups`, or an insert, accum or import through the view; a write of
the row alone marks none), as TFRA's slots, tables of their own, hold the keys their optimizer
trained. So a slot's size, exports, files and checkpoint entries list those keys only, and its
lookups report the others missing (their columns hold the slot's fill, a new key's start value).
Removing a key from either removes it from both (evictions and restrict policies remove from both
anyway); a key written only through a slot view gets a zero row. Restoring rows replaces the set
of keys but keeps the slot columns of the keys that stay and their written marks, and restoring
a slot sets its columns and marks exactly its keys (keys it lacks get the fill), so a checkpoint
restores the same in either order.

Example:
    >>> table = native.NativeKVCreator().create(tf.int64, tf.float32, 4, "emb")
    >>> m = NativeSlotView(table, fill=0.0, name="emb/Adam/m")   # group 1 of `table`
    >>> keys = tf.constant([1, 2], tf.int64)
    >>> _ = upsert_groups(table, keys, [tf.ones([2, 4]), tf.fill([2, 4], 0.5)], [0, m.group])
    >>> (m_rows,), exists = find_groups(table, keys, [m.group])  # m's rows of keys
    >>> m_rows.numpy()[:, 0], exists.numpy()
    (array([0.5, 0.5], dtype=float32), array([ True,  True]))
    >>> _ = table.insert(tf.constant([3], tf.int64), tf.ones([1, 4]))   # a row, no slot write
    >>> int(table.size()), int(m.size())
    (3, 2)
"""

import copy
import dataclasses

import tensorflow as tf

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding.tables import base
from tfra_dynamic_embedding.tables import native


def fusable(tables):
    """Whether slots of a variable with these shard tables can live in its records."""
    return bool(tables) and all(type(t) is native.NativeKVTable for t in tables)  # pylint: disable=unidiomatic-typecheck


def slot_fills(table):
    """The start values of `table`'s slot groups 1, 2, ... (a list owned by the table)."""
    return table.__dict__.setdefault("_slot_fills", [])


class NativeSlotView(native.NativeKVTable):
    """One slot's columns of a native shard table, as a `KVTable` (see module docstring)."""

    def __init__(self, table, fill, name):
        fills = slot_fills(table)
        fills.append(float(fill))
        self.table = table
        self.group = len(fills)
        self.fill = float(fill)
        self._fills = tuple(fills)
        base.KVTable.__init__(self, table.key_dtype, table.value_dtype, table.dim, name,
                              table.device)
        self.gen_ops = native.ops()
        self.resource_handle  # pylint: disable=pointless-statement  (create it now)

    def _create_resource(self):
        return self.gen_ops.tfra_de_group_view(
            self.table.resource_handle, tf.constant(self._fills, tf.float64), group=self.group,
            name=base.op_name(self.name))

    def _deserialization_dependencies(self, children):
        del children
        return {"table": self.table}   # saved and loaded after its table

    def _export_to_saved_model_graph(self, object_map, tensor_map, **kwargs):
        # As TrackableResource's, but the copy views the table's copy (made first, see above).
        del kwargs
        exported = copy.copy(self)
        exported.table = object_map.get(self.table, self.table)
        with tf.device(self._resource_device):
            handle = _tf_private.recreate_resource(exported)
        object_map[self] = exported
        tensor_map[self.resource_handle] = handle
        return [self.resource_handle]

    # A slot's rows start at its fill, a constant: one find with default rows, never the
    # table's fused kernel (which draws group 0's rows).
    def lookup_or_init(self, keys, init, return_exists=True):
        return base.KVTable.lookup_or_init(self, keys, init, return_exists)

    def find_or_insert(self, keys, init):
        with tf.device(self.device):
            rows, exists = self.lookup_or_init(keys, init)
            missing = tf.logical_not(exists)
            insert = self.insert(tf.boolean_mask(keys, missing), tf.boolean_mask(rows, missing))
            with tf.control_dependencies([insert]):
                return tf.identity(rows), exists


class SlotColumnsCreator(base.KVCreator):
    """Makes a slot variable's shard tables as views of its variable's shard tables, in order.

    The variable's creator's `saver` (e.g. a `de.FileSystemSaver`) applies to the slot too.
    """

    def __init__(self, tables, fill, creator=None):
        self._tables = list(tables)
        self._fill = fill
        self._next = 0
        self.saver = getattr(creator, "saver", None)

    def create(self, key_dtype, value_dtype, dim, name, device="", shared_name=None, init_size=0):
        del key_dtype, value_dtype, dim, device, shared_name, init_size
        if self._next >= len(self._tables):
            raise ValueError(f"slot table {name}: its variable has only {len(self._tables)} "
                             f"shard tables")
        table = self._tables[self._next]
        self._next += 1
        return NativeSlotView(table, self._fill, name)


def find_groups(table, keys, groups):
    """([rows of group g for `keys`, `[n, dim]` each, for g in `groups`], exists), one probe
    per key; a missing key gets zeros (group 0) and each slot's fill."""
    with tf.device(table.device):
        out = table.gen_ops.tfra_de_find_groups(
            table.resource_handle, table.key_tensor(keys),
            tf.constant(slot_fills(table), tf.float64), dim=table.dim, groups=list(groups),
            N=len(groups), value_dtype=table.value_dtype)
        return list(out.values), out.exists


def upsert_groups(table, keys, values, groups):
    """Writes `values[j]` (`[n, dim]`) into the columns of `groups[j]`, one probe per key; a
    write of group 0 stamps the row and counts one write."""
    with tf.device(table.device):
        return table.gen_ops.tfra_de_upsert_groups(
            table.resource_handle, table.key_tensor(keys),
            [table.row_tensor(v) for v in values],
            tf.constant(slot_fills(table), tf.float64), dim=table.dim, groups=list(groups))


def drawn_in_table(init):
    """Whether a native table draws `init`'s rows itself (so an update op can make a missing
    key's row again, equal to the one its lookup returned); else the caller sends the rows."""
    return native.fused_form(init) is not None


@dataclasses.dataclass
class TableUpdate:
    """One shard table's part of an optimizer step (see `apply_gradients`): unique `keys`, their
    summed `grads`, the `init` spec of missing keys' rows or, when not None, those `rows`
    themselves (row i for keys[i]), and the column group of each slot of the rule (-1: none)."""
    table: native.NativeKVTable
    keys: tf.Tensor
    grads: tf.Tensor
    init: object
    rows: object
    groups: list


def apply_gradients(device, updates, kind, hyper):
    """One op on `device` applying optimizer rule `kind` with `hyper` (float64 numbers, see
    table_updates.py) to every `TableUpdate` in `updates` (tables of one key and value dtype).

    The tables' keys, gradients and sent rows travel as one tensor each (concatenated here, on
    the caller's device); the per-table constants are made on `device` itself."""
    first = updates[0].table
    sent = [u.rows is not None for u in updates]
    keys = tf.concat([u.table.key_tensor(u.keys) for u in updates], 0)
    counts = tf.stack([tf.size(u.keys, out_type=tf.int64) for u in updates])
    grads = tf.concat([tf.reshape(u.table.row_tensor(u.grads, "grads"), [-1]) for u in updates],
                      0)
    rows = [tf.reshape(u.table.row_tensor(u.rows, "initial rows"), [-1])
            for u in updates if u.rows is not None]
    rows = tf.concat(rows, 0) if rows else tf.zeros([0], first.value_dtype)
    inits, seeds, keyed = [], [], []
    drawn = [None if u.rows is not None else native.fused_form(u.init) for u in updates]
    for init in drawn:
        inits.append("constant" if init is None else init.kind)
        seeds.append(0 if init is None else native.signed_seed(init.seed))
        keyed.append(False if init is None else init.keyed)
    with tf.device(device):
        args = [tf.zeros([1], tf.float64) if init is None else native.init_args(init)
                for init in drawn]
        fills = [tf.constant(slot_fills(u.table), tf.float64) for u in updates]
        return first.gen_ops.tfra_de_apply_gradients(
            [u.table.resource_handle for u in updates], keys, counts, grads, rows, args, fills,
            hyper, optimizer=kind, slot_groups=[g for u in updates for g in u.groups],
            inits=inits, seeds=seeds, keyed=keyed, sent_rows=sent)
