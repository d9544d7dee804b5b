"""The native backend: shard tables on this package's C++ kernels (cc/ops).

A native table keeps rows in contiguous per-shard slabs indexed by an open-addressing hash table
with striped locks; batch ops run on TensorFlow's intra-op thread pool. Beyond the `KVTable`
interface it offers per-key metadata (last-write stamp, saturating write count) for eviction,
chunked export, streaming checksummed file save/load, and initializers computed in C++ for
exactly the missing keys (`NativeInitializer`).

The op library is `_tfra_de_ops.so` next to this file, or the file named by the environment
variable `TFRA_DE_OPS_LIBRARY`. It is loaded on first use; when it is missing or fails to load,
`is_available()` is False and creating a table raises `RuntimeError`.

Example:
    table = NativeKVCreator().create(tf.int64, tf.float32, dim=4, name="t")
    init = native_initializer(tf.random_normal_initializer(0.0, 0.01), dim=4, dtype=tf.float32)
    rows, exists = table.find_or_insert(tf.constant([1, 2], tf.int64), init)
    table.save_to("/tmp/t.shard0")
"""

import os
import random
import threading

import numpy as np
import tensorflow as tf
from absl import logging

from tfra_dynamic_embedding.tables import base
from tfra_dynamic_embedding.tables import keyed_random

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


def _ops():
    lib = _load()
    if lib is None:
        raise RuntimeError(f"the native table backend is not available: {_load_error}. Build it "
                           f"(e.g. `make ops`) or use BuiltinKVCreator.")
    return lib


def commit_save(dirpath, record, generation, expected_files):
    """Op committing a multi-shard save (cc/ops/de_commit.cc; see tables/files.py for the layout):
    checks `<dirpath>/<generation>/<f>` exists for every f in `expected_files`, renames a new
    `<dirpath>/<record>` (naming `generation`) over the old one, removes stale generations."""
    return _ops().tfra_de_commit_save(
        tf.convert_to_tensor(dirpath, tf.string), tf.convert_to_tensor(record, tf.string),
        tf.convert_to_tensor(generation, tf.string),
        tf.convert_to_tensor(list(expected_files), tf.string, name="expected_files")
        if isinstance(expected_files, (list, tuple)) else expected_files)


# ----------------------------------------------------------------------------- initializers --

_INIT_KINDS = ("constant", "uniform", "normal", "truncated_normal")
_MASK64 = (1 << 64) - 1


class NativeInitializer:
    """Initial rows the kernels draw for exactly the missing keys: `make_rows` for native tables.

    kind: "constant" (a, or a `[dim]` `row`), "uniform" in [a, b), "normal" (mean a, stddev b)
    or "truncated_normal" (mean a, stddev b, within two stddev, as TF's).
    The initial row of a key is a pure function of (seed, key): a read-only lookup and a later
    find_or_insert of the same key give the same row, whichever batch or shard.
    keyed: draw by the recipe of `keyed_random.py` (inverse-CDF normals, FarmHash string keys):
    the kernels' rows then equal `keyed_random.keyed_rows` bit for bit, which is what seeded
    user initializers get on every backend. Otherwise (the default) normals come from a faster
    generator (vectorized Box-Muller rows from dim 16, a ziggurat below; cc/ops/de_draw.h);
    uniform rows of integer keys are the same either way.
    Called as `make_rows(keys)` (e.g. by another backend) it draws the rows with TF ops
    (`keyed_random.keyed_rows`): equal to the kernels' rows when keyed.
    """

    def __init__(self, kind, a=0.0, b=0.0, seed=None, dim=None, dtype=tf.float32, keyed=False,
                 row=None):
        if kind not in _INIT_KINDS:
            raise ValueError(f"kind must be one of {_INIT_KINDS}; got {kind!r}")
        self.kind, self.a, self.b = kind, float(a), float(b)
        if kind != "constant":
            if not (np.isfinite(self.a) and np.isfinite(self.b)):
                raise ValueError(f"a {kind} initializer needs finite parameters; got a={a}, b={b}")
            if kind == "uniform" and not self.b > self.a:
                raise ValueError(f"maxval must be > minval for a uniform initializer; got "
                                 f"minval={a}, maxval={b}")
            if kind != "uniform" and self.b < 0:
                raise ValueError(f"stddev must be >= 0 for a {kind} initializer; got {b}")
        self.row = None
        if row is not None:
            if kind != "constant":
                raise ValueError(f"row is for constant initializers; got kind {kind!r}")
            self.row = np.asarray(row, np.float64).reshape(-1)
            if dim is not None and self.row.shape != (dim,):
                raise ValueError(f"row must have shape [dim] = [{dim}]; got {list(self.row.shape)}")
        # An unseeded initializer still needs one fixed seed so lookups and inserts agree.
        self.seed = int(seed) if seed is not None else random.getrandbits(63)
        self.dim = dim
        self.dtype = tf.as_dtype(dtype)
        self.keyed = bool(keyed)

    def init_args(self):
        """The kernel's `init_args` tensor: [a, b], or the constant's [1] / [dim] row (float64)."""
        if self.kind == "constant":
            return tf.constant(self.row if self.row is not None else [self.a], tf.float64)
        return tf.constant([self.a, self.b], tf.float64)

    def __call__(self, keys):
        if self.dim is None:
            raise ValueError("NativeInitializer needs `dim` to draw rows with TF ops")
        if self.kind == "constant":
            if self.row is not None:
                return tf.tile(tf.cast(self.row[np.newaxis, :], self.dtype),
                               tf.stack([tf.size(keys), 1]))
            return tf.fill(tf.stack([tf.size(keys), self.dim]),
                           tf.cast(tf.constant(self.a, tf.float64), self.dtype))
        return keyed_random.keyed_rows(keys, self.kind, self.a, self.b, self.seed, self.dim,
                                       self.dtype)

    def __repr__(self):
        if self.kind == "constant":
            value = self.a if self.row is None else f"row[{self.row.size}]"
            return f"NativeInitializer('constant', {value})"
        return (f"NativeInitializer({self.kind!r}, a={self.a}, b={self.b}, seed={self.seed}, "
                f"keyed={self.keyed})")


_CONFIG_KINDS = {  # initializer class name -> (kind, config key of a, config key of b, defaults)
    "RandomNormal": ("normal", "mean", "stddev", (0.0, 1.0)),
    "TruncatedNormal": ("truncated_normal", "mean", "stddev", (0.0, 1.0)),
    "RandomUniform": ("uniform", "minval", "maxval", (0.0, 1.0)),
}
_CONSTANT_CLASSES = {"Zeros": 0.0, "zeros_initializer": 0.0, "Ones": 1.0, "ones_initializer": 1.0,
                     "Constant": None, "constant_initializer": None}
# Modules whose initializer classes are recognized by name (TF, tf.compat.v1, Keras 3, tf_keras).
_LIBRARIES = ("tensorflow", "keras", "tf_keras")


def unseeded_seed():
    """A seed for an initializer the user left unseeded: drawn from TF's global seed when one is
    set (`tf.random.set_seed`, v1 `set_random_seed`: a seeded program stays reproducible, as
    TF's own random ops), else random."""
    global_seed, op_seed = tf.compat.v1.random.get_seed(None)
    if global_seed is None:
        return random.getrandbits(63)
    return ((int(global_seed) * 0x9E3779B97F4A7C15 + int(op_seed)) & _MASK64) >> 1


def _constant_row(value, dim, dtype):
    """(a, row) of a constant value rounded to `dtype` as TF rounds it, or None if it is not a
    number or a [1] / [dim] array."""
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
        return 0.0, arr
    return None


def native_initializer(initializer, dim, dtype=tf.float32):
    """A `NativeInitializer` equivalent to `initializer`, or None if it has no C++ equivalent.

    Understood: None / numbers / `[1]` or `[dim]` arrays (constant rows); Zeros, Ones, Constant
    (a number or a `[dim]` row), RandomNormal, TruncatedNormal and RandomUniform of TF v2,
    tf.compat.v1, Keras 3 and tf_keras (objects or Keras names such as "zeros"). A seeded random
    initializer draws by the keyed recipe (rows equal `keyed_random.keyed_rows`, the rows every
    backend gives it); an unseeded one by the fast one, seeded by `unseeded_seed()`.
    Raises ValueError for bad parameters (maxval <= minval, stddev < 0).
    """
    dtype = tf.as_dtype(dtype)
    if isinstance(initializer, NativeInitializer):
        return initializer
    if initializer is None:
        return NativeInitializer("constant", 0.0, dim=dim, dtype=dtype)
    if isinstance(initializer, str):
        try:
            initializer = tf.keras.initializers.get(initializer)
        except (ValueError, TypeError):
            return None
    if not callable(initializer):
        constant = _constant_row(initializer, dim, dtype)
        if constant is None:
            return None
        return NativeInitializer("constant", constant[0], dim=dim, dtype=dtype, row=constant[1])
    cls = type(initializer)
    if cls.__module__.split(".")[0] not in _LIBRARIES:
        return None
    name = cls.__name__
    get_config = getattr(initializer, "get_config", None)
    config = get_config() if callable(get_config) else {}
    if name in _CONSTANT_CLASSES:
        value = _CONSTANT_CLASSES[name]
        if value is None:
            value = getattr(initializer, "value", None)
            if value is None:
                value = config.get("value", 0.0)
        constant = _constant_row(value, dim, dtype)
        if constant is None:
            return None
        return NativeInitializer("constant", constant[0], dim=dim, dtype=dtype, row=constant[1])
    spec = _CONFIG_KINDS.get(name)
    if spec is None or spec[1] not in config or spec[2] not in config:
        return None
    kind, key_a, key_b, (default_a, default_b) = spec
    # tf.compat.v1's random_uniform_initializer leaves maxval None: 1 for float rows, as TF.
    a = default_a if config[key_a] is None else float(config[key_a])
    b = default_b if config[key_b] is None else float(config[key_b])
    seed = config.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        seed = None
    try:
        return NativeInitializer(kind, a, b, seed=unseeded_seed() if seed is None else int(seed),
                                 dim=dim, dtype=dtype, keyed=seed is not None)
    except ValueError as error:
        raise ValueError(f"initializer {initializer!r}: {error}") from error


def _native_form(make_rows):
    """The NativeInitializer a `make_rows` stands for (itself, or the `native_init` that
    initializers.rows_maker attached), or None."""
    if isinstance(make_rows, NativeInitializer):
        return make_rows
    init = getattr(make_rows, "native_init", None)
    return init if isinstance(init, NativeInitializer) else None


# ---------------------------------------------------------------------------------- tables --

class NativeKVTable(base.KVTable):
    """A shard table on the native kernels (see `KVTable` for the interface methods).

    Extra methods: `lookup_or_init`, `export_with_meta`, `export_chunks`, `import_with_meta`,
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
        self._gen = _ops()
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
        return self._gen.tfra_de_table(
            key_dtype=self.key_dtype, value_dtype=self.value_dtype, dim=self.dim,
            init_size=self._init_size, num_shards=self._num_shards, shared_name=shared_name,
            use_node_name_sharing=not tf.inside_function(), name=base.op_name(self.name))

    # -- conversions ----------------------------------------------------------------------

    def _keys(self, keys):
        keys = tf.convert_to_tensor(keys)
        if keys.dtype != self.key_dtype:
            if keys.dtype.is_integer and self.key_dtype.is_integer:
                keys = tf.cast(keys, self.key_dtype)
            else:
                raise TypeError(f"keys must be {self.key_dtype.name}; got {keys.dtype.name}")
        return keys

    def _rows(self, rows, name="values"):
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
            keys = self._keys(keys)
            return self._gen.tfra_de_find(self.resource_handle, keys,
                                          self._rows(default_rows, "default_rows"), dim=self.dim)

    def contains(self, keys):
        """A bool mask of the keys present: one probe of the index per key, no row read."""
        with tf.device(self.device):
            return self._gen.tfra_de_contains(self.resource_handle, self._keys(keys))

    def fuses_init(self, make_rows):
        """Whether `make_rows` is drawn inside this table's lookup kernels (a NativeInitializer,
        or a maker of initializers.rows_maker carrying one): then it is never called."""
        return _native_form(make_rows) is not None

    def lookup_or_init(self, keys, make_rows):
        """(rows, exists) without inserting; missing keys get initial rows.

        With a `NativeInitializer` (or a maker carrying one, see `fuses_init`) the rows are drawn
        in C++ by one fused kernel; otherwise `make_rows(keys)` is called once with the distinct
        missing keys (a repeated key gets one row).
        """
        with tf.device(self.device):
            keys = self._keys(keys)
            init = _native_form(make_rows)
            if init is not None:
                return self._find_init(keys, init, insert=False)
            rows, exists = self._gen.tfra_de_find(
                self.resource_handle, keys, tf.zeros([self.dim], self.value_dtype), dim=self.dim)
            missing = tf.where(tf.logical_not(exists))
            unique_keys, index = tf.unique(tf.gather_nd(keys, missing))
            new_rows = self._rows(make_rows(unique_keys), "make_rows(keys)")
            rows = tf.tensor_scatter_nd_update(rows, missing, tf.gather(new_rows, index))
            return rows, exists

    def find_or_insert(self, keys, make_rows):
        """(rows, exists); missing keys are inserted with fresh rows.

        With a `NativeInitializer` this is one fused kernel; otherwise `make_rows(keys)` is
        called with the distinct missing keys and those rows are inserted unless another writer
        got there first (then its row is returned, so the result always matches the table).
        """
        with tf.device(self.device):
            keys = self._keys(keys)
            init = _native_form(make_rows)
            if init is not None:
                return self._find_init(keys, init, insert=True)
            rows, exists = self._gen.tfra_de_find(
                self.resource_handle, keys, tf.zeros([self.dim], self.value_dtype), dim=self.dim)
            missing = tf.where(tf.logical_not(exists))
            unique_keys, index = tf.unique(tf.gather_nd(keys, missing))
            new_rows = self._rows(make_rows(unique_keys), "make_rows(keys)")
            stored = self._gen.tfra_de_insert_missing(self.resource_handle, unique_keys, new_rows,
                                                      dim=self.dim)
            rows = tf.tensor_scatter_nd_update(rows, missing, tf.gather(stored, index))
            return rows, exists

    def _find_init(self, keys, init, insert):
        if init.row is not None and init.row.shape != (self.dim,):
            raise ValueError(f"the initializer's row has {init.row.size} values; the table's "
                             f"dim is {self.dim}")
        seed = init.seed & _MASK64
        return self._gen.tfra_de_find_init(
            self.resource_handle, keys, [init.init_args()], dim=self.dim, insert=insert,
            init=init.kind, seed=seed - (1 << 64) if seed >= 1 << 63 else seed,
            keyed=init.keyed, value_dtype=self.value_dtype)

    # -- updates --------------------------------------------------------------------------

    def insert(self, keys, values):
        with tf.device(self.device):
            return self._gen.tfra_de_insert(self.resource_handle, self._keys(keys),
                                            self._rows(values))

    def accum(self, keys, deltas):
        with tf.device(self.device):
            return self._gen.tfra_de_accum(self.resource_handle, self._keys(keys),
                                           self._rows(deltas, "deltas"))

    def remove(self, keys):
        """Deletes keys; returns the number removed (an int64 scalar)."""
        with tf.device(self.device):
            return self._gen.tfra_de_remove(self.resource_handle, self._keys(keys))

    def clear(self):
        with tf.device(self.device):
            return self._gen.tfra_de_clear(self.resource_handle)

    def size(self):
        with tf.device(self.device):
            return self._gen.tfra_de_size(self.resource_handle)

    def memory_bytes(self):
        """Bytes the table holds: its records (rows, optimizer slots kept with them, metadata)
        as far as rows were handed out, its hash index, free lists and long string keys.

        Example: int(var.tables[0].kv_table.memory_bytes()) / int(var.size())  # bytes per key
        """
        with tf.device(self.device):
            return self._gen.tfra_de_memory(self.resource_handle)

    def memory_parts(self):
        """`memory_bytes()` by part, a dict of int64 scalars: "records" (bytes of the rows made:
        held, freed for reuse and prefaulted), "rows" (how many rows that is), "index" (the hash
        index's bytes) and "other" (free lists, long string keys).

        Example: parts = t.memory_parts(); int(parts["records"]) // int(parts["rows"])  # record bytes
        """
        with tf.device(self.device):
            parts = tf.unstack(self._gen.tfra_de_memory_parts(self.resource_handle))
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
            out = self._gen.tfra_de_export(self.resource_handle, tf.constant(0, tf.int64),
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
            return tuple(self._gen.tfra_de_export(
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
            keys = self._keys(keys)
            empty = tf.zeros([0], tf.int64)
            stamps = empty if stamps is None else tf.cast(stamps, tf.int64)
            freqs = empty if freqs is None else tf.cast(freqs, tf.int64)
            return self._gen.tfra_de_import(self.resource_handle, keys, self._rows(values),
                                            stamps, freqs, tf.constant(bool(clear)))

    # -- files and metadata ---------------------------------------------------------------

    def save_to(self, path):
        """Streams the shard (rows and metadata) to `path` (any TF filesystem), atomically."""
        with tf.device(self.device):
            return self._gen.tfra_de_save_to_file(self.resource_handle,
                                                  tf.convert_to_tensor(path, tf.string))

    def load_from(self, path):
        """Replaces the content with a `save_to` file; returns the number of keys loaded.

        A truncated or corrupt file raises DataLossError and a file of another dtype/dim
        InvalidArgumentError; either way the table is left unchanged.
        """
        with tf.device(self.device):
            return self._gen.tfra_de_load_from_file(self.resource_handle,
                                                    tf.convert_to_tensor(path, tf.string))

    def set_step(self, step):
        """Records `step` as the stamp of rows written from now on (step < 0: Unix seconds)."""
        with tf.device(self.device):
            return self._gen.tfra_de_set_step(self.resource_handle, tf.cast(step, tf.int64))

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
            return self._gen.tfra_de_set_bound(self.resource_handle, tf.cast(max_rows, tf.int64),
                                               tf.cast(extra_rows, tf.int64),
                                               tf.constant(order == "lfu"))

    def evict(self, min_stamp=0, min_freq=0):
        """Removes keys with stamp < min_stamp or freq < min_freq; returns how many."""
        with tf.device(self.device):
            return self._gen.tfra_de_evict(self.resource_handle, tf.cast(min_stamp, tf.int64),
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

