"""Delta export: per table shard, only the rows changed since the last export, and the removals.

`DeltaExporter(variables, directory)` writes numbered exports: the first holds every row (a
full export), each later one the keys inserted or updated since the previous export (with their
rows) and the keys removed (evicted, restricted, removed by hand). Changes are found by
comparing each shard with a fingerprint of the previous export (its keys and a 64-bit hash of
each row, 16 bytes per key, kept in the directory): any backend, any writer, nothing to enable
beforehand. Rows are hashed where the table lives (its parameter server), so a delta moves
each shard's keys and hashes and only the changed rows, not the whole table. Replaying the full
export and every delta in order gives the last export exactly.

Files (stock TensorFlow reads them: `tf.data.TFRecordDataset` + `tf.io.parse_tensor`):
    directory/<seq:06d>/<table>.shard<i>.tfrecord   records: a JSON header, then per chunk
                                                    keys, rows (upserts), then removed keys
    directory/<seq:06d>/DONE                         written last: the export is complete
    directory/fingerprints/<table>.shard<i>.keys     the previous export's keys (a serialized
                                                    tensor) and .hashes.npy (its row hashes)

A serving SavedModel built on built-in tables takes a delta in place, without a reload, through
`add_apply_delta_signature` (a signature taking every table's upserts and removals) and
`apply_delta(loaded, export_dir)`.

Example:
    >>> import tempfile
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> user = de.Variable(dim=2, name="delta_user")
    >>> _ = user.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2]))
    >>> exporter = DeltaExporter([user], tempfile.mkdtemp())
    >>> info = exporter.export()      # 000000: everything
    >>> info.sequence, info.full, info.upserts
    (0, True, 3)
    >>> _ = user.upsert(tf.constant([1], tf.int64), tf.zeros([1, 2]))   # training
    >>> _ = user.remove(tf.constant([3], tf.int64))
    >>> info = exporter.export()      # 000001: changes only
    >>> info.sequence, info.full, info.upserts, info.removals
    (1, False, 1, 1)
"""

import dataclasses
import json
import os

import numpy as np
import tensorflow as tf

CHUNK_ROWS = 65536
FINGERPRINTS = "fingerprints"
DONE = "DONE"


@dataclasses.dataclass
class ExportInfo:
    """What one export wrote."""

    path: str
    sequence: int
    full: bool
    upserts: int
    removals: int
    bytes: int


FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def _row_hashes(values):
    """A 64-bit hash of every row's bytes (FNV-1a over its 32-bit words, or its bytes for
    2- and 8-byte values)."""
    values = np.ascontiguousarray(values)
    words = values.reshape(len(values), int(np.prod(values.shape[1:])))   # also with no rows
    words = words.view(np.uint32) if words.dtype.itemsize == 4 else words.view(np.uint8)
    h = np.full(len(words), FNV_OFFSET, np.uint64)
    prime = np.uint64(FNV_PRIME)
    with np.errstate(over="ignore"):
        for column in words.T:
            h = (h ^ column.astype(np.uint64)) * prime
    return h


def _row_hashes_tf(values):
    """`_row_hashes` in TensorFlow ops (the same numbers), to run on the table's device."""
    n = tf.shape(values)[0]
    if values.dtype.size == 4:
        words = tf.bitcast(values, tf.uint32)
    else:
        words = tf.reshape(tf.bitcast(values, tf.uint8), [n, -1])
    prime = tf.constant(FNV_PRIME, tf.uint64)
    return tf.foldl(lambda h, column: tf.bitwise.bitwise_xor(h, tf.cast(column, tf.uint64)) * prime,
                    tf.transpose(words), initializer=tf.fill([n], tf.constant(FNV_OFFSET, tf.uint64)))


def _fingerprint_fn(table):
    """A function returning (keys, row hashes) of a table shard, run where the shard lives: its
    rows never leave that device."""
    @tf.function
    def fingerprint():
        with tf.device(table.device):
            keys, values = table.export()
            return keys, _row_hashes_tf(values)
    return fingerprint


def _file_name(table, shard):
    return f"{table.replace('/', '.')}.shard{shard}"


class DeltaExporter:
    """Writes full and delta exports of `variables` (de.Variables) into `directory`.

    Args:
      variables: the de.Variables to export (names must be distinct).
      directory: where numbered exports go; an exporter resumes from the fingerprints and the
        last complete export found there.
    """

    def __init__(self, variables, directory):
        self.variables = list(variables)
        names = [v.name for v in self.variables]
        if len(set(names)) != len(names):
            raise ValueError(f"variables must have distinct names; got {names}")
        if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
            raise ValueError(f"directory must be a path; got {directory!r}")
        self.directory = os.fspath(directory)
        self._key_dtypes = {_file_name(v.name, i): v.key_dtype for v in self.variables
                            for i in range(v.shard_num)}
        self._fingerprints = {}   # table shard name -> its fingerprint function
        os.makedirs(os.path.join(self.directory, FINGERPRINTS), exist_ok=True)
        done = complete_exports(self.directory)
        self.next_sequence = done[-1] + 1 if done else 0

    def export(self):
        """Writes the next export (full if it is the first); returns its `ExportInfo`."""
        sequence = self.next_sequence
        path = os.path.join(self.directory, f"{sequence:06d}")
        os.makedirs(path, exist_ok=True)
        upserts = removals = 0
        fingerprints = []
        for var in self.variables:
            for shard, table in enumerate(var.shards.tables):
                name = _file_name(var.name, shard)
                old = self._fingerprint(name) if sequence else None
                if old is None:   # a full export: every row comes over
                    keys, values = (t.numpy() for t in table.export())
                    hashes, new_keys, new_values, removed = _row_hashes(values), keys, values, keys[:0]
                else:
                    keys, hashes, new_keys, new_values, removed = self._changes(name, table, *old)
                _write_shard(os.path.join(path, name + ".tfrecord"), var, shard,
                             new_keys, new_values, removed, full=sequence == 0)
                upserts += len(new_keys)
                removals += len(removed)
                fingerprints.append((name, keys, hashes))
        with open(os.path.join(path, DONE), "w", encoding="utf-8") as f:
            f.write("complete\n")
        # Fingerprints move on only once the export is complete: a crash repeats this export.
        for name, keys, hashes in fingerprints:
            target = os.path.join(self.directory, FINGERPRINTS, name)
            # Keys as a serialized tensor (string keys keep every byte), hashes as .npy.
            tf.io.write_file(target + ".keys.tmp", tf.io.serialize_tensor(tf.constant(keys)))
            np.save(target + ".hashes.tmp.npy", hashes)
            os.replace(target + ".keys.tmp", target + ".keys")
            os.replace(target + ".hashes.tmp.npy", target + ".hashes.npy")
        self.next_sequence = sequence + 1
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        return ExportInfo(path, sequence, sequence == 0, upserts, removals, size)

    def _fingerprint(self, name):
        """(keys, hashes) of a shard's previous export, or None."""
        path = os.path.join(self.directory, FINGERPRINTS, name)
        if not os.path.exists(path + ".keys"):
            return None
        keys = tf.io.parse_tensor(tf.io.read_file(path + ".keys"),
                                  self._key_dtypes[name]).numpy()
        return keys, np.load(path + ".hashes.npy", allow_pickle=False)

    def _changes(self, name, table, old_keys, old_hashes):
        """A shard's delta against its previous export: (keys, hashes) of the shard now (the
        next fingerprint), the upserted keys and their rows, the removed keys. The rows are
        hashed on the table's device; only the changed ones are fetched."""
        if name not in self._fingerprints:
            self._fingerprints[name] = _fingerprint_fn(table)
        keys, hashes = (t.numpy() for t in self._fingerprints[name]())
        changed = np.ones(len(keys), bool)
        if len(old_keys):
            order = np.argsort(old_keys, kind="stable")
            position = np.minimum(np.searchsorted(old_keys[order], keys), len(old_keys) - 1)
            found = old_keys[order][position] == keys
            changed = ~(found & (old_hashes[order][position] == hashes))
        removed = old_keys[~np.isin(old_keys, keys)]
        if not changed.any():
            no_rows = np.zeros([0, table.dim], table.value_dtype.as_numpy_dtype)
            return keys, hashes, keys[:0], no_rows, removed
        at = np.flatnonzero(changed)
        rows, exists = table.lookup_with_exists(tf.constant(keys[at], table.key_dtype),
                                                tf.zeros([len(at), table.dim], table.value_dtype))
        rows, exists = rows.numpy(), exists.numpy()
        # Training goes on meanwhile: a row fetched is the one exported and fingerprinted; a key
        # gone since the hashing is not upserted, and is a removal if the last export had it.
        hashes[at[exists]] = _row_hashes(rows[exists])
        gone = keys[at[~exists]]
        removed = np.concatenate([removed, gone[np.isin(gone, old_keys)]])
        kept = np.ones(len(keys), bool)
        kept[at[~exists]] = False
        return keys[kept], hashes[kept], keys[at[exists]], rows[exists], removed


def _write_shard(path, var, shard, keys, values, removed, full):
    header = {"table": var.name, "shard": shard, "full": full, "key_dtype": var.key_dtype.name,
              "value_dtype": var.value_dtype.name, "dim": var.dim, "upserts": len(keys),
              "removals": len(removed), "chunk_rows": CHUNK_ROWS}
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(json.dumps(header).encode())
        for start in range(0, len(keys), CHUNK_ROWS):
            writer.write(tf.io.serialize_tensor(
                tf.constant(keys[start:start + CHUNK_ROWS], var.key_dtype)).numpy())
            writer.write(tf.io.serialize_tensor(
                tf.constant(values[start:start + CHUNK_ROWS], var.value_dtype)).numpy())
        for start in range(0, len(removed), CHUNK_ROWS):
            writer.write(tf.io.serialize_tensor(
                tf.constant(removed[start:start + CHUNK_ROWS], var.key_dtype)).numpy())


def complete_exports(directory):
    """The sequence numbers of the complete exports in `directory`, in order."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory)
                  if name.isdigit() and os.path.exists(os.path.join(directory, name, DONE)))


def read_export(path):
    """{table: (keys, values, removed, full)} of one export directory (all shards joined)."""
    if not os.path.exists(os.path.join(path, DONE)):
        raise ValueError(f"export {path!r} is incomplete (no {DONE} file)")
    tables = {}
    for name in sorted(os.listdir(path)):
        if not name.endswith(".tfrecord"):
            continue
        records = iter(tf.data.TFRecordDataset(os.path.join(path, name)).as_numpy_iterator())
        header = json.loads(next(records))
        key_dtype, value_dtype = tf.as_dtype(header["key_dtype"]), tf.as_dtype(
            header["value_dtype"])
        chunks = -(-header["upserts"] // header["chunk_rows"])
        keys, values, removed = [], [], []
        for _ in range(chunks):
            keys.append(tf.io.parse_tensor(next(records), key_dtype).numpy())
            values.append(tf.io.parse_tensor(next(records), value_dtype).numpy())
        for record in records:
            removed.append(tf.io.parse_tensor(record, key_dtype).numpy())
        entry = tables.setdefault(header["table"], [[], [], [], header["full"], header])
        entry[0] += keys
        entry[1] += values
        entry[2] += removed
    out = {}
    for table, (keys, values, removed, full, header) in tables.items():
        empty_keys = np.zeros([0], tf.as_dtype(header["key_dtype"]).as_numpy_dtype)
        if header["key_dtype"] == "string":
            empty_keys = np.zeros([0], object)
        out[table] = (np.concatenate(keys) if keys else empty_keys,
                      np.concatenate(values) if values else np.zeros(
                          [0, header["dim"]], tf.as_dtype(header["value_dtype"]).as_numpy_dtype),
                      np.concatenate(removed) if removed else empty_keys, full)
    return out


def replay(directory, variables, upto=None, var_name_to_prev_var_name=None, keep_keys=None):
    """Applies the complete exports of `directory` in order (up to sequence `upto`) to
    `variables`: a full export replaces a table's rows, a delta upserts and removes. Also a warm
    start from another model's exports: any shard count (rows go where each variable's
    partitioner puts them), renamed tables, a subset of keys.

    Args:
      directory: a `DeltaExporter` directory.
      variables: de.Variables; each takes the exported table of its own name, or of
        `var_name_to_prev_var_name[name]`. Exported tables no variable takes are skipped.
      upto: the last sequence number to apply (None: all).
      var_name_to_prev_var_name: {variable name: exported table name}.
      keep_keys: None or `fn(keys: np.ndarray) -> bool mask`: only those keys are written
        (removals always apply).

    Example:
        >>> import tempfile
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> user = de.Variable(dim=2, name="replay_user")
        >>> _ = user.upsert(tf.constant([10, 11, 20], tf.int64), tf.ones([3, 2]))
        >>> folder = tempfile.mkdtemp()
        >>> _ = DeltaExporter([user], folder).export()
        >>> new_user = de.Variable(dim=2, name="replay_new_user", devices=["/CPU:0"] * 2)
        >>> renames = {"replay_new_user": "replay_user"}
        >>> _ = replay(folder, [new_user], var_name_to_prev_var_name=renames,
        ...            keep_keys=lambda keys: keys % 10 == 0)
        >>> sorted(new_user.export()[0].numpy().tolist())
        [10, 20]
    """
    renames = dict(var_name_to_prev_var_name or {})
    by_table = {renames.get(v.name, v.name): v for v in variables}
    unknown = sorted(set(renames) - {v.name for v in variables})
    if unknown:
        raise ValueError(f"var_name_to_prev_var_name names variables not given: {unknown}")
    applied = set()
    for sequence in complete_exports(directory):
        if upto is not None and sequence > upto:
            break
        for table, (keys, values, removed, full) in read_export(
                os.path.join(directory, f"{sequence:06d}")).items():
            var = by_table.get(table)
            if var is None:
                continue
            _check_replayable(var, table, keys, values, removed)
            applied.add(table)
            if full:
                var.clear()
            if keep_keys is not None and len(keys):
                mask = np.asarray(keep_keys(keys), bool)
                keys, values = keys[mask], values[mask]
            if len(keys):
                var.upsert(tf.constant(keys, var.key_dtype), tf.constant(values, var.value_dtype))
            if len(removed):
                var.remove(tf.constant(removed, var.key_dtype))
    missing = sorted(set(by_table) - applied)
    if missing:
        raise ValueError(f"{directory!r} has no export of tables {missing}")


def _check_replayable(var, table, keys, values, removed):
    """Raises unless `var` can take the exported rows of `table` as they are (checked before
    a full export clears the variable, so a mismatch changes nothing)."""
    if values.shape[1] != var.dim:
        raise ValueError(f"export of table {table!r} has rows of dim {values.shape[1]}; "
                         f"variable {var.name!r} has dim {var.dim}")
    string_keys = keys.dtype == object or removed.dtype == object
    if string_keys != (var.key_dtype == tf.string):
        raise TypeError(f"export of table {table!r} has {'string' if string_keys else 'integer'} "
                        f"keys; variable {var.name!r} has key_dtype {var.key_dtype.name}")
    if not string_keys:
        limits = np.iinfo(var.key_dtype.as_numpy_dtype)
        for given in (keys, removed):
            if len(given) and (given.min() < limits.min or given.max() > limits.max):
                raise ValueError(f"export of table {table!r} has keys outside "
                                 f"{var.key_dtype.name} (from {given.min()} to {given.max()}); "
                                 f"variable {var.name!r} cannot hold them")


def add_apply_delta_signature(module, variables):
    """Adds `apply_delta` to a serving `module` whose built-in `variables` it holds: inputs
    `<i>_keys`, `<i>_values`, `<i>_removed` per variable i (in order), outputs the new sizes.
    Returns the signature function, for `tf.saved_model.save(..., signatures=...)`."""
    signature = {}
    for i, var in enumerate(variables):
        signature[f"t{i}_keys"] = tf.TensorSpec([None], var.key_dtype, name=f"t{i}_keys")
        signature[f"t{i}_values"] = tf.TensorSpec([None, var.dim], var.value_dtype,
                                                  name=f"t{i}_values")
        signature[f"t{i}_removed"] = tf.TensorSpec([None], var.key_dtype, name=f"t{i}_removed")

    @tf.function(input_signature=[signature])
    def apply_delta(inputs):
        sizes = {}
        for i, var in enumerate(variables):
            upsert = var.upsert(inputs[f"t{i}_keys"], inputs[f"t{i}_values"])
            with tf.control_dependencies([upsert] if upsert is not None else []):
                remove = var.remove(inputs[f"t{i}_removed"])
            with tf.control_dependencies([remove] if remove is not None else []):
                sizes[f"t{i}_size"] = var.size()
        return sizes

    module.apply_delta = apply_delta
    return apply_delta


def apply_delta(loaded, export_path, table_names):
    """Calls a loaded SavedModel's `apply_delta` signature with one delta export (not a full
    one); `table_names` lists the exported tables in the signature's order. Returns the sizes."""
    tables = read_export(export_path)
    function = loaded.signatures["apply_delta"]
    inputs = {}
    specs = function.structured_input_signature[1]
    for i, name in enumerate(table_names):
        keys_spec, values_spec = specs[f"t{i}_keys"], specs[f"t{i}_values"]
        keys, values, removed, full = tables.get(name, (None, None, None, False))
        if full:
            raise ValueError(f"{export_path!r} is a full export; apply_delta takes deltas")
        dim = values_spec.shape[1]
        inputs[f"t{i}_keys"] = tf.constant(keys if keys is not None else [], keys_spec.dtype)
        inputs[f"t{i}_values"] = (tf.constant(values, values_spec.dtype) if values is not None
                                  else tf.zeros([0, dim], values_spec.dtype))
        inputs[f"t{i}_removed"] = tf.constant(removed if removed is not None else [],
                                              keys_spec.dtype)
    return {k: int(v) for k, v in function(**inputs).items()}
