"""The native backend: shard tables on this package's C++ kernels (cc/ops).

A native table keeps rows in contiguous per-shard slabs indexed by an open-addressing hash table
with striped locks; batch ops run on TensorFlow's intra-op thread pool. Beyond the `KVTable`
interface it offers per-key metadata (last-write stamp, saturating write count) for eviction,
chunked export, streaming checksummed file save/load, and initializers computed in C++ for
exactly the missing keys (an `InitSpec` drawn by the fused lookup kernel).

The op library is `_tfra_de_ops.so` next to this file, or the file named by the environment
variable `TFRA_DE_OPS_LIBRARY`. It is loaded on first use; when it is missing or fails to load,
`is_available()` is False and creating a table raises `RuntimeError`.

Example:
    >>> import os, tempfile
    >>> table = NativeKVCreator().create(tf.int64, tf.float32, dim=4, name="t")
    >>> init = NativeInitializer("normal", 0.0, 0.01, seed=1)   # or initializers.describe(...)
    >>> rows, exists = table.find_or_insert(tf.constant([1, 2], tf.int64), init)
    >>> rows.shape, exists.numpy(), int(table.size())
    (TensorShape([2, 4]), array([False, False]), 2)
    >>> path = os.path.join(tempfile.mkdtemp(), "t.shard0")
    >>> _ = table.save_to(path)
    >>> os.path.exists(path)
    True
"""

import os
import random
import threading

import numpy as np
import tensorflow as tf
from absl import logging

from tfra_dynamic_embedding.tables import base

LIBRARY_ENV = "TFRA_DE_OPS_LIBRARY"
KEY_DTYPES = (tf.int32, tf.int64, tf.string)
VALUE_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)

_load_lock = threading.Lock()
_library = None
_load_error = None
_load_tried = False


def library_path():
    """Path the op library is loaded from: `$TFRA_DE_OPS_LIBRARY`, else next to this module."""
    return os.environ.get(LIBRARY_ENV) or os.path.join(os.path.dirname(__file__), "_tfra_de_ops.so")


def _load():
    global _library, _load_error, _load_tried
    with _load_lock:
        if not _load_tried:
            _load_tried = True
            path = library_path()
            try:
                _library = tf.load_op_library(path)
            except Exception as error:  # pylint: disable=broad-except  (any failure: fall back)
                _load_error = f"{path}: {error}"
                logging.warning("tfra_dynamic_embedding native ops unavailable (%s); "
                                "the built-in backend will be used.", _load_error)
    return _library


def is_available():
    """Whether the native op library is loaded (loading it on first call)."""
    return _load() is not None


def load_error():
    """Why the op library did not load, or None."""
    _load()
    return _load_error


def ops():
    """The op library's generated op functions (`ops().tfra_de_find(...)`); RuntimeError naming
    why when the library is not built or did not load."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"the native table backend is not available: {_load_error}. Build it "
                           f"(e.g. `make ops`) or use BuiltinKVCreator.")
    return lib


def commit_save(dirpath, record, generation, expected_files):
    """Op committing a multi-shard save (cc/ops/de_commit.cc; see tables/files.py for the layout):
    checks `<dirpath>/<generation>/<f>` exists for every f in `expected_files`, renames a new
    `<dirpath>/<record>` (naming `generation`) over the old one, removes stale generations."""
    return ops().tfra_de_commit_save(
        tf.convert_to_tensor(dirpath, tf.string), tf.convert_to_tensor(record, tf.string),
        tf.convert_to_tensor(generation, tf.string),
        tf.convert_to_tensor(list(expected_files), tf.string, name="expected_files")
        if isinstance(expected_files, (list, tuple)) else expected_files)


# ----------------------------------------------------------------------------- initializers --

_MASK64 = (1 << 64) - 1
_FUSED_KINDS = (base.CONSTANT, base.UNIFORM, base.NORMAL, base.TRUNCATED_NORMAL)


class NativeInitializer(base.InitSpec):
    """An `InitSpec` made by hand for native tables, with this backend's defaults: a random seed
    when `seed` is None, and unkeyed rows (the kernels' fast generator) unless `keyed=True`.

    Drawn with TF ops (`rows`, e.g. by another backend) its random rows follow
    `keyed_random.keyed_rows` under `seed`: equal to the kernels' rows when keyed (and for
    uniform rows of integer keys either way).

    Example:
        >>> table = NativeKVCreator().create(tf.int64, tf.float32, dim=2, name="t")
        >>> keys = tf.constant([5, 6], tf.int64)
        >>> init = NativeInitializer("normal", 0.0, 0.01, seed=1)
        >>> rows, exists = table.find_or_insert(keys, init)   # one fused kernel
        >>> again, exists = table.find_or_insert(keys, init)
        >>> exists.numpy(), bool(tf.reduce_all(rows == again))
        (array([ True,  True]), True)
    """

    def __init__(self, kind, a=0.0, b=0.0, seed=None, dim=None, dtype=tf.float32, keyed=False,
                 row=None):
        if kind not in _FUSED_KINDS:
            raise ValueError(f"kind must be one of {_FUSED_KINDS}; got {kind!r}")
        if row is not None:   # numbers of any array-like, flattened (a [dim] row)
            row = np.asarray(row, np.float64).reshape(-1)
        super().__init__(kind, dim=dim, dtype=dtype, a=a, b=b, row=row,
                         seed=random.getrandbits(63) if seed is None else seed, keyed=keyed)


def fused_form(init):
    """`init` if the fused kernel draws it (every kind but custom), else None: this backend
    then draws with TF ops (`init.rows`)."""
    return init if init.kind in _FUSED_KINDS else None


def signed_seed(seed):
    """`seed` as the kernels' int64 attr (its low 64 bits, two's complement)."""
    seed &= _MASK64
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def init_args(init):
    """The kernel's `init_args` tensor: [a, b], or the constant's [1] / [dim] row (float64)."""
    if init.kind == base.CONSTANT:
        return tf.constant(init.row if init.row is not None else [init.a], tf.float64)
    return tf.constant([init.a, init.b], tf.float64)


def find_init_group(tables, keys, inits):
    """Rows of `keys[i]` in `tables[i]` -- native tables of one device and dtypes -- where a
    missing key gets `inits[i]`'s row (fused kinds only), without inserting: one
    `TfraDeFindInitGroup` op on that device. Returns a `[size(keys[i]), dim_i]` tensor per table.

    The keys are joined and the rows split where the caller runs, so the device receives and
    sends one tensor each.
    """
    first = tables[0]
    keys = [table.key_tensor(k) for table, k in zip(tables, keys)]
    for table, init in zip(tables, inits):
        if init.row is not None and len(init.row) != table.dim:
            raise ValueError(f"the initializer's row has {len(init.row)} values; the table "
                             f"{table.name}'s dim is {table.dim}")
    counts = tf.stack([tf.size(k, out_type=tf.int64) for k in keys])
    joined = tf.concat(keys, 0)
    with tf.device(first.device):
        values = first.gen_ops.tfra_de_find_init_group(
            [t.resource_handle for t in tables], joined, counts,
            [init_args(init) for init in inits], inits=[init.kind for init in inits],
            seeds=[signed_seed(init.seed) for init in inits], keyed=[init.keyed for init in inits],
            value_dtype=first.value_dtype)
    sizes = counts * tf.constant([t.dim for t in tables], tf.int64)
    return [tf.reshape(part, [-1, table.dim])
            for part, table in zip(tf.split(values, sizes), tables)]


# ---------------------------------------------------------------------------------- tables --

class NativeKVTable(base.KVTable):
    """A shard table on the native kernels (see `KVTable` for the interface methods).

    Extra methods: `export_with_meta`, `export_chunks`, `import_with_meta`,
    `save_to`, `load_from`, `set_step`, `set_bound`, `evict`.
    """

    def __init__(self, key_dtype, value_dtype, dim, name, device="", shared_name=None,
                 init_size=0, num_shards=0):
        key_dtype, value_dtype = tf.as_dtype(key_dtype), tf.as_dtype(value_dtype)
        if key_dtype not in KEY_DTYPES:
            raise TypeError(f"key_dtype must be one of int32, int64, string; got {key_dtype.name}")
        if value_dtype not in VALUE_DTYPES:
            raise TypeError(f"value_dtype must be one of float16, bfloat16, float32, float64; "
                            f"got {value_dtype.name}")
        if int(dim) < 1:
            raise ValueError(f"dim must be >= 1; got {dim}")
        if int(init_size) < 0:
            raise ValueError(f"init_size must be >= 0; got {init_size}")
        if not 0 <= int(num_shards) <= 4096:
            raise ValueError(f"num_shards must be in [0, 4096]; got {num_shards}")
        super().__init__(key_dtype, value_dtype, dim, name, device, shared_name)
        self.gen_ops = ops()
        self._init_size = int(init_size)
        self._num_shards = int(num_shards)
        self.resource_handle  # pylint: disable=pointless-statement  (create it now, on `device`)

    def _create_resource(self):
        shared_name = self._shared_name or ""
        if self._owns_resource and not tf.executing_eagerly():
            # Traced into a function (the creator of an exported SavedModel): the eager name would
            # alias this live table from a model loaded in the same process, so the loaded table
            # is private to its creator kernel instead. (Tables made eagerly, also those lifted
            # out of a tf.function being traced, keep their unique names.)
            shared_name = ""
        return self.gen_ops.tfra_de_table(
            key_dtype=self.key_dtype, value_dtype=self.value_dtype, dim=self.dim,
            init_size=self._init_size, num_shards=self._num_shards, shared_name=shared_name,
            use_node_name_sharing=not tf.inside_function(), name=base.op_name(self.name))

    # -- conversions ----------------------------------------------------------------------

    def key_tensor(self, keys):
        keys = tf.convert_to_tensor(keys)
        if keys.dtype != self.key_dtype:
            if keys.dtype.is_integer and self.key_dtype.is_integer:
                keys = tf.cast(keys, self.key_dtype)
            else:
                raise TypeError(f"keys must be {self.key_dtype.name}; got {keys.dtype.name}")
        return keys

    def row_tensor(self, rows, name="values"):
        rows = tf.convert_to_tensor(rows)
        if rows.dtype != self.value_dtype:
            if not (rows.dtype.is_floating or rows.dtype.is_integer):
                raise TypeError(f"{name} must be {self.value_dtype.name}; got {rows.dtype.name}")
            rows = tf.cast(rows, self.value_dtype)
        return rows

    def _typed(self):
        return dict(key_dtype=self.key_dtype, value_dtype=self.value_dtype)

    # -- lookups --------------------------------------------------------------------------

    def lookup(self, keys, default_rows):
        return self.lookup_with_exists(keys, default_rows)[0]

    def lookup_with_exists(self, keys, default_rows):
        """(rows, exists); `default_rows` is `[N, dim]` or one `[dim]` row for every key."""
        with tf.device(self.device):
            keys = self.key_tensor(keys)
            return self.gen_ops.tfra_de_find(self.resource_handle, keys,
                                          self.row_tensor(default_rows, "default_rows"), dim=self.dim)

    def _lookup_or_zeros(self, keys):
        with tf.device(self.device):
            return self.gen_ops.tfra_de_find(self.resource_handle, self.key_tensor(keys),
                                          tf.zeros([self.dim], self.value_dtype), dim=self.dim)

    def contains(self, keys):
        """A bool mask of the keys present: one probe of the index per key, no row read."""
        with tf.device(self.device):
            return self.gen_ops.tfra_de_contains(self.resource_handle, self.key_tensor(keys))

    def lookup_or_init(self, keys, init, return_exists=True):
        """(rows, exists) without inserting; missing keys get initial rows of `init` (an
        `InitSpec`, or a `make_rows(keys)` callable).

        Constant, uniform, normal and truncated normal rows are drawn in C++ by one fused kernel
        (`TfraDeFindInit`); other rows as `KVTable.lookup_or_init` draws them, with TF ops.
        """
        init = base.as_init_spec(init, self.dim, self.value_dtype)
        fused = fused_form(init)
        if fused is None:
            return super().lookup_or_init(keys, init, return_exists)
        with tf.device(self.device):
            rows, exists = self._find_init(self.key_tensor(keys), fused, insert=False)
            return rows, exists if return_exists else None

    def find_or_insert(self, keys, init):
        """(rows, exists); missing keys are inserted with initial rows of `init`.

        Rows the fused kernel draws (see `lookup_or_init`) take one kernel; otherwise
        `init.rows` makes the distinct missing keys' rows, which are inserted unless another
        writer got there first (then its row is returned, so the result always matches the table).
        """
        init = base.as_init_spec(init, self.dim, self.value_dtype)
        fused = fused_form(init)
        with tf.device(self.device):
            keys = self.key_tensor(keys)
            if fused is not None:
                return self._find_init(keys, fused, insert=True)
            rows, exists = self._lookup_or_zeros(keys)
            missing = tf.where(tf.logical_not(exists))
            unique_keys, index = tf.unique(tf.gather_nd(keys, missing))
            new_rows = self.row_tensor(init.rows(unique_keys), "initial rows")
            stored = self.gen_ops.tfra_de_insert_missing(self.resource_handle, unique_keys, new_rows,
                                                      dim=self.dim)
            rows = tf.tensor_scatter_nd_update(rows, missing, tf.gather(stored, index))
            return rows, exists

    def _find_init(self, keys, init, insert):
        if init.row is not None and len(init.row) != self.dim:
            raise ValueError(f"the initializer's row has {len(init.row)} values; the table's "
                             f"dim is {self.dim}")
        return self.gen_ops.tfra_de_find_init(
            self.resource_handle, keys, [init_args(init)], dim=self.dim, insert=insert,
            init=init.kind, seed=signed_seed(init.seed),
            keyed=init.keyed, value_dtype=self.value_dtype)

    # -- updates --------------------------------------------------------------------------

    def insert(self, keys, values):
        with tf.device(self.device):
            return self.gen_ops.tfra_de_insert(self.resource_handle, self.key_tensor(keys),
                                            self.row_tensor(values))

    def accum(self, keys, deltas):
        with tf.device(self.device):
            return self.gen_ops.tfra_de_accum(self.resource_handle, self.key_tensor(keys),
                                           self.row_tensor(deltas, "deltas"))

    def remove(self, keys):
        """Deletes keys; returns the number removed (an int64 scalar)."""
        with tf.device(self.device):
            return self.gen_ops.tfra_de_remove(self.resource_handle, self.key_tensor(keys))

    def clear(self):
        with tf.device(self.device):
            return self.gen_ops.tfra_de_clear(self.resource_handle)

    def size(self):
        with tf.device(self.device):
            return self.gen_ops.tfra_de_size(self.resource_handle)

    def memory_bytes(self):
        """Bytes the table holds: its records (rows, optimizer slots kept with them, metadata)
        as far as rows were handed out, its hash index, free lists and long string keys.

        Example:
            >>> import tensorflow_recommenders_addons.dynamic_embedding as de
            >>> var = de.Variable(dim=4)
            >>> _ = var.upsert(tf.range(100, dtype=tf.int64), tf.ones([100, 4]))
            >>> per_key = int(var.tables[0].kv_table.memory_bytes()) / int(var.size())
            >>> per_key >= 4 * 4      # bytes per key: at least its row
            True
        """
        with tf.device(self.device):
            return self.gen_ops.tfra_de_memory(self.resource_handle)

    def memory_parts(self):
        """`memory_bytes()` by part, a dict of int64 scalars: "records" (bytes of the rows made:
        held, freed for reuse and prefaulted), "rows" (how many rows that is), "index" (the hash
        index's bytes) and "other" (free lists, long string keys).

        Example:
            >>> t = NativeKVCreator().create(tf.int64, tf.float32, dim=4, name="t")
            >>> _ = t.insert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 4]))
            >>> parts = t.memory_parts()
            >>> sorted(parts), int(parts["rows"]) >= 3
            (['index', 'other', 'records', 'rows'], True)
            >>> int(parts["records"]) // int(parts["rows"]) >= 4 * 4     # bytes of one record
            True
        """
        with tf.device(self.device):
            parts = tf.unstack(self.gen_ops.tfra_de_memory_parts(self.resource_handle))
        return dict(zip(("records", "rows", "index", "other"), parts))

    # -- export / import ------------------------------------------------------------------

    def export(self):
        keys, values, _, _ = self.export_with_meta()
        return keys, values

    def export_with_meta(self):
        """(keys, values, stamps, freqs) of the whole shard, one consistent snapshot.

        stamps: int64 last-write stamp per key (the step set by `set_step`, else Unix seconds);
        freqs: int64 number of writes (insert/accum/creation), saturating at 2^32 - 1.
        """
        with tf.device(self.device):
            out = self.gen_ops.tfra_de_export(self.resource_handle, tf.constant(0, tf.int64),
                                           tf.constant(-1, tf.int64), dim=self.dim,
                                           **self._typed())
            return out.keys, out.values, out.stamps, out.freqs

    def export_chunk(self, cursor, limit, with_values=True):
        """(keys, values, stamps, freqs, next_cursor): up to `limit` rows from `cursor`.

        Start at cursor 0; next_cursor is -1 once the table is exhausted. Unlike
        `export_with_meta` the chunks are not one snapshot under concurrent writes, but a key
        held throughout comes once: until the last chunk, removals move no rows (a scan with
        no chunk for 5 minutes counts as abandoned).
        `with_values=False`: values is [n, 0] (a scan of the metadata copies no rows).
        """
        with tf.device(self.device):
            return tuple(self.gen_ops.tfra_de_export(
                self.resource_handle, tf.cast(cursor, tf.int64), tf.cast(limit, tf.int64),
                dim=self.dim, with_values=bool(with_values), **self._typed()))

    def export_chunks(self, chunk_size=65536):
        """Eager generator of (keys, values, stamps, freqs) chunks of at most `chunk_size` rows."""
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")
        cursor = 0
        while cursor >= 0:
            *chunk, cursor = self.export_chunk(cursor, chunk_size)
            cursor = int(cursor)
            if int(tf.size(chunk[0])) > 0:
                yield tuple(chunk)

    def import_(self, keys, values):
        return self.import_with_meta(keys, values)

    def import_with_meta(self, keys, values, stamps=None, freqs=None, clear=True):
        """Writes rows with optional metadata; `clear=True` replaces the content atomically."""
        with tf.device(self.device):
            keys = self.key_tensor(keys)
            empty = tf.zeros([0], tf.int64)
            stamps = empty if stamps is None else tf.cast(stamps, tf.int64)
            freqs = empty if freqs is None else tf.cast(freqs, tf.int64)
            return self.gen_ops.tfra_de_import(self.resource_handle, keys, self.row_tensor(values),
                                            stamps, freqs, tf.constant(bool(clear)))

    # -- files and metadata ---------------------------------------------------------------

    def save_to(self, path):
        """Streams the shard (rows and metadata) to `path` (any TF filesystem), atomically."""
        with tf.device(self.device):
            return self.gen_ops.tfra_de_save_to_file(self.resource_handle,
                                                  tf.convert_to_tensor(path, tf.string))

    def load_from(self, path):
        """Replaces the content with a `save_to` file; returns the number of keys loaded.

        A truncated or corrupt file raises DataLossError and a file of another dtype/dim
        InvalidArgumentError; either way the table is left unchanged.
        """
        with tf.device(self.device):
            return self.gen_ops.tfra_de_load_from_file(self.resource_handle,
                                                    tf.convert_to_tensor(path, tf.string))

    def set_step(self, step):
        """Records `step` as the stamp of rows written from now on (step < 0: Unix seconds)."""
        with tf.device(self.device):
            return self.gen_ops.tfra_de_set_step(self.resource_handle, tf.cast(step, tf.int64))

    def set_bound(self, max_rows, extra_rows=0, order="lru"):
        """Bounds the keys that training writes (`insert`, `accum`, `upsert_groups`) leave in
        the table: a new key that would take it over `max_rows` (0: no bound) first evicts
        the lowest-scoring rows of its lock stripe (of the largest stripe while its own holds
        less than its share of the bound) not written at the current stamp ("lru":
        oldest stamp; "lfu": fewest writes, then oldest) and not among the batch's keys,
        `extra_rows` more over the table. Concurrent writers never exceed it together."""
        if order not in ("lru", "lfu"):
            raise ValueError(f"order must be 'lru' or 'lfu'; got {order!r}")
        with tf.device(self.device):
            return self.gen_ops.tfra_de_set_bound(self.resource_handle, tf.cast(max_rows, tf.int64),
                                               tf.cast(extra_rows, tf.int64),
                                               tf.constant(order == "lfu"))

    def evict(self, min_stamp=0, min_freq=0):
        """Removes keys with stamp < min_stamp or freq < min_freq; returns how many."""
        with tf.device(self.device):
            return self.gen_ops.tfra_de_evict(self.resource_handle, tf.cast(min_stamp, tf.int64),
                                           tf.cast(min_freq, tf.int64))


class NativeKVCreator(base.KVCreator):
    """Creates `NativeKVTable` shards: `de.Variable(..., kv_creator=NativeKVCreator())`.

    num_shards: lock stripes (and growth units) per table; 0 means 64.
    """

    def __init__(self, num_shards=0):
        if not 0 <= int(num_shards) <= 4096:
            raise ValueError(f"num_shards must be in [0, 4096]; got {num_shards}")
        self.num_shards = int(num_shards)

    def create(self, key_dtype, value_dtype, dim, name, device="", shared_name=None, init_size=0):
        return NativeKVTable(key_dtype, value_dtype, dim, name, device, shared_name, init_size,
                             self.num_shards)

