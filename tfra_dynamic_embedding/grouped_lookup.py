"""Reading the rows of several variables at once: one lookup op per device.

A model with many tables reads each table's shard on each parameter server every step. Read one
by one, a PS runs one op per table and receives and sends one tensor per table, and that fixed
cost per table grows with the number of tables times the number of PS tasks. `lookup_rows` reads
the rows of all the shards one device holds with one `TfraDeFindInitGroup` op there: the keys go
out as one tensor and the rows come back as one, so a PS's work per step follows the rows it
serves. Shards the grouped op cannot read (another backend, an initializer its kernel does not
draw) are read as `Variable.lookup` reads them. The rows equal `Variable.lookup`'s.

Example:
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> a = de.Variable(dim=2, initializer=1.0, name="a")
    >>> b = de.Variable(dim=3, initializer=0.5, name="b")
    >>> rows = lookup_rows([a, b], [tf.constant([1, 2], tf.int64), tf.constant([7], tf.int64)])
    >>> [r.shape.as_list() for r in rows]
    [[2, 2], [1, 3]]
"""

import collections

import tensorflow as tf

from tfra_dynamic_embedding.tables import native
from tfra_dynamic_embedding.tables import stock_lookups


def lookup_rows(variables, keys, name="lookup_rows"):
    """`[v.lookup(k) for v, k in zip(variables, keys)]` for 1-D `keys`, with the shard lookups
    of every device grouped into one op there. Never inserts."""
    if len(variables) != len(keys):
        raise ValueError(f"lookup_rows needs one keys tensor per variable; got "
                         f"{len(variables)} variables and {len(keys)} keys tensors")
    if stock_lookups.current() is not None:   # traced for a stock SavedModel
        return [variable.lookup(flat) for variable, flat in zip(variables, keys)]
    with tf.name_scope(name):
        # Every shard read: (variable index, shard index) -> rows, filled group by group.
        reads, positions = [], []
        for i, (variable, flat) in enumerate(zip(variables, keys)):
            shards = variable.shards
            if len(shards) == 1:
                parts, where = [flat], None
            else:
                parts, where = shards.partition(flat)
            positions.append(where)
            reads.append([(table, part, variable.init_spec) for table, part in
                          zip(shards.tables, parts)])
        rows = _read(reads)
        out = []
        for i, where in enumerate(positions):
            if where is None:
                out.append(rows[i, 0])
            else:
                out.append(tf.dynamic_stitch(where, [rows[i, s] for s in range(len(where))]))
        return out


def _read(reads):
    """{(i, s): rows} of every shard read `reads[i][s] = (table, keys, init)`."""
    rows = {}
    groups = collections.defaultdict(list)
    for i, shard_reads in enumerate(reads):
        for s, (table, part, init) in enumerate(shard_reads):
            fused = (native.fused_form(init) if isinstance(table, native.NativeKVTable)
                     else None)
            if fused is None:
                rows[i, s] = table.lookup_or_init(part, init, return_exists=False)[0]
            else:
                key = (_canonical(table.device), table.key_dtype, table.value_dtype)
                groups[key].append(((i, s), table, part, fused))
    for members in groups.values():
        if len(members) == 1:   # nothing to group: the table's own fused lookup
            (at, table, part, init), = members
            rows[at] = table.lookup_or_init(part, init, return_exists=False)[0]
            continue
        for at, found in zip([m[0] for m in members],
                             native.find_init_group([m[1] for m in members],
                                                    [m[2] for m in members],
                                                    [m[3] for m in members])):
            rows[at] = found
    return rows


def _canonical(device):
    return tf.DeviceSpec.from_string(device or "").to_string()
