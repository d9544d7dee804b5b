"""Tables to and from files on any TensorFlow filesystem (TFRA's `save_to_file_system`).

One file (native tables) or one pair of files (built-in tables: `<prefix>-keys`,
`<prefix>-values`, serialized tensors) per shard table, named by `shard_file_name` as TFRA names
them: `<variable>_mht_<i>of<n>_rank<r>_size<s>`. A native file streams in checksummed blocks;
loading one replaces the shard's content atomically (a truncated or corrupt file raises
`DataLossError` and changes nothing).

Example:
    w.save_to_file_system("/ckpt/kv")           # one file per shard of de.Variable `w`
    w.load_from_file_system("/ckpt/kv")         # the same shard count
    w.load_from_file_system("/ckpt/kv", load_entire_dir=True)  # any shard count: re-partitioned
"""

import os
import re

import tensorflow as tf

from tfra_dynamic_embedding.tables import base, native

ENV_DIR = "TFRA_SAVED_KV"
_SHARD_SUFFIX = re.compile(r"_mht_(\d+)of(\d+)_rank(\d+)_size(\d+)(-keys)?$")


def resolve_dir(dirpath, dirpath_env=ENV_DIR):
    """The save directory: `$dirpath_env` when set (TFRA gives it priority), else `dirpath`."""
    resolved = (os.environ.get(dirpath_env) if dirpath_env else None) or dirpath
    if not resolved:
        raise ValueError(f"dirpath must name a directory; got {dirpath!r}")
    return resolved


def shard_file_name(name, index, shard_num, proc_rank=0, proc_size=1):
    """TFRA's file name of shard `index` (0-based) of `shard_num`."""
    return f"{base.op_name(name)}_mht_{index + 1}of{shard_num}_rank{proc_rank}_size{proc_size}"


def save_table(table, prefix):
    """Op writing a `KVTable`'s whole content under `prefix`."""
    tf.io.gfile.makedirs(os.path.dirname(prefix) or ".")
    if isinstance(table, native.NativeKVTable):
        return table.save_to(prefix)
    keys, values = table.export()
    return tf.group(tf.io.write_file(prefix + "-keys", tf.io.serialize_tensor(keys)),
                    tf.io.write_file(prefix + "-values", tf.io.serialize_tensor(values)))


def load_table(table, prefix):
    """Op replacing a `KVTable`'s content with what `save_table` wrote under `prefix`."""
    if isinstance(table, native.NativeKVTable):
        return table.load_from(prefix)
    keys, values = read_builtin_file(prefix, table.key_dtype, table.value_dtype, table.dim)
    return table.import_(keys, values)


def read_builtin_file(prefix, key_dtype, value_dtype, dim):
    """(keys `[n]`, values `[n, dim]`) of a built-in table's `<prefix>-keys` / `-values`."""
    keys = tf.io.parse_tensor(tf.io.read_file(prefix + "-keys"), key_dtype)
    values = tf.io.parse_tensor(tf.io.read_file(prefix + "-values"), value_dtype)
    return tf.reshape(keys, [-1]), tf.reshape(values, [-1, dim])


def read_file(prefix, key_dtype, value_dtype, dim):
    """(keys, values) tensors of a file written by `save_table`, whichever backend wrote it."""
    if tf.io.gfile.exists(prefix + "-keys"):
        return read_builtin_file(prefix, key_dtype, value_dtype, dim)
    # A native file: stage it in a private native table, then export.
    staging = native.NativeKVTable(key_dtype, value_dtype, dim, "file_staging")
    with tf.control_dependencies([staging.load_from(prefix)]):
        return staging.export()


def variable_files(dirpath, name):
    """Prefixes of every shard file of variable `name` in `dirpath` (any shard count, any rank),
    sorted."""
    stem = base.op_name(name)
    found = set()
    for path in tf.io.gfile.glob(os.path.join(dirpath, f"{stem}_mht_*")):
        base_name = os.path.basename(path)
        match = _SHARD_SUFFIX.search(base_name)
        if match and base_name[:match.start()] == stem:
            found.add(os.path.join(dirpath, base_name[:match.start(5)] if match.group(5)
                                   else base_name))
    return sorted(found)
