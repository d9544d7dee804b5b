"""Tables to and from files on any TensorFlow filesystem (TFRA's `save_to_file_system`).

One table, one file: a native table streams one checksummed file (written under a temporary name
and renamed, so it appears whole); a built-in table writes `<prefix>-keys` and `<prefix>-values`
(serialized tensors). Loads also read TFRA's own files, a `-keys`/`-values` pair of raw arrays,
into either backend. Shard i of n of variable V saved by process `proc_rank` of `proc_size` is
named as TFRA names it: `V_mht_<i>of<n>_rank<r>_size<s>`. Loading a native file replaces the
table's content atomically (a truncated or corrupt file raises `DataLossError`, changes nothing).

A variable's save is all-or-nothing over its shards. It writes the shard files into a new
generation directory and then commits them with one atomic rename of a small record file:

    <dir>/V_rank<r>_size<s>.commit                   names the committed generation (one line)
    <dir>/V_rank<r>_size<s>.gen-<micros>-<token>/    one save: V_mht_1of2_rank<r>_size<s>, ...

A load reads the committed generation only, so it sees one whole save: the last one committed when
the load op ran (never a mix of two saves, nor a save cut short by a crash). Each (rank, size) has
its own record, so processes saving their own ranks into one directory do not touch each other's
saves. A commit keeps the previously committed generation (a reader that resolved it just before
may still be reading it) and deletes older generations, uncommitted ones left by interrupted saves
and stale `*.tmp-*` records; a reader slower than two commits gets an error (NotFoundError, or
InvalidArgumentError "incomplete"), never a mix: a load checks that all the files of a save are
there before it replaces any shard.
Where no record exists for a (rank, size), loads read plain TFRA-layout files `<dir>/V_mht_...`
(written by TFRA, by older versions of this package, or by the per-table methods).
The commit is the native op `TfraDeCommitSave` (cc/ops/de_commit.cc); without the op library
it runs as a `tf.py_function` (graphs and tf.function work, in the Python process that runs them).
Renames are atomic on local and POSIX filesystems; on object stores (S3, GCS) a rename is a copy.
One writer per (variable, rank, size) and directory at a time.

Example:
    >>> import tempfile
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> folder = tempfile.mkdtemp()
    >>> w = de.Variable(dim=2, devices=["/CPU:0"] * 2, name="files_kv")
    >>> _ = w.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2]))
    >>> _ = w.save_to_file_system(folder)    # every shard of `w`, committed at once
    >>> same = de.Variable(dim=2, devices=["/CPU:0"] * 2, name="files_kv")
    >>> _ = same.load_from_file_system(folder)    # the same shard count
    >>> other = de.Variable(dim=2, devices=["/CPU:0"] * 3, name="files_kv")
    >>> _ = other.load_from_file_system(folder, load_entire_dir=True)  # re-partitioned
    >>> int(same.size()), int(other.size())
    (3, 3)
"""

import os
import re

import tensorflow as tf

from tfra_dynamic_embedding.tables import base, native

ENV_DIR = "TFRA_SAVED_KV"
RECORD_SUFFIX = ".commit"
GENERATION_MARK = ".gen-"
_TMP_MARK = ".tmp-"


# -- names and paths ----------------------------------------------------------------------------

def resolve_dir(dirpath, dirpath_env=ENV_DIR):
    """The save directory: `$dirpath_env` when set (TFRA gives it priority), else `dirpath` (a
    string or a string tensor)."""
    resolved = (os.environ.get(dirpath_env) if dirpath_env else None) or dirpath
    if isinstance(resolved, (str, bytes)) or resolved is None:
        if not resolved:
            raise ValueError(f"dirpath must name a directory; got {dirpath!r}")
        resolved = resolved.decode() if isinstance(resolved, bytes) else resolved
        return resolved.rstrip("/") or "/"
    resolved = tf.convert_to_tensor(resolved, tf.string)
    if resolved.shape.rank not in (None, 0):
        raise ValueError(f"dirpath must be a scalar string; got shape {resolved.shape}")
    return tf.strings.regex_replace(resolved, "(.)/+$", "\\1")


def shard_file_name(name, index, shard_num, proc_rank=0, proc_size=1):
    """TFRA's file name of shard `index` (0-based) of `shard_num`."""
    return f"{base.op_name(name)}_mht_{index + 1}of{shard_num}_rank{proc_rank}_size{proc_size}"


def record_stem(name, proc_rank=0, proc_size=1):
    """`<variable>_rank<r>_size<s>`: + `.commit` is the commit record, + `.gen-*` a generation."""
    return f"{base.op_name(name)}_rank{proc_rank}_size{proc_size}"


def join(directory, name):
    """`directory/name`, as a Python string when both are, else as a string tensor."""
    if isinstance(directory, str) and isinstance(name, str):
        return directory + name if directory.endswith("/") else f"{directory}/{name}"
    return tf.strings.join([directory, name], separator="/")


def glob_escape(path):
    """`path` with glob metacharacters escaped, for `tf.io.matching_files`."""
    if isinstance(path, str):
        return re.sub(r"([*?\[\\])", r"\\\1", path)
    return tf.strings.regex_replace(path, r"([*?\[\\])", r"\\\1")


def _re_escape(text):
    """A literal RE2 pattern for `text` (names here hold only [A-Za-z0-9._-])."""
    return "".join(c if c.isalnum() or c == "_" else "\\" + c for c in text)


def _basename(paths):
    return tf.strings.regex_replace(paths, "^.*/", "")


def _first_line(content):
    return tf.strings.strip(tf.strings.regex_replace(content, "(?s)[\r\n].*", ""))


def _at_run_time(path):
    """`path` as a string tensor computed when the op runs. ReadFile and MatchingFiles are not
    stateful ops: on constant inputs Grappler folds them once into the graph, and a graph run
    again would read the directory as it was the first time."""
    never_folded = tf.strings.substr(tf.strings.as_string(tf.timestamp()), 0, 0)  # ""
    return tf.strings.join([path, never_folded])


def _cpu(device):
    """The CPU of `device`'s task (file and commit ops have CPU kernels only)."""
    if not device:
        return ""
    return tf.DeviceSpec.from_string(device).replace(device_type="CPU", device_index=0).to_string()


# -- one table, one file ------------------------------------------------------------------------

def save_table(table, prefix):
    """Op writing a `KVTable`'s whole content under `prefix` (a string or string tensor); the
    directory is created when the op runs."""
    if isinstance(table, native.NativeKVTable):
        return table.save_to(prefix)
    keys, values = table.export()
    return tf.group(tf.io.write_file(_suffixed(prefix, "-keys"), tf.io.serialize_tensor(keys)),
                    tf.io.write_file(_suffixed(prefix, "-values"), tf.io.serialize_tensor(values)))


def _suffixed(prefix, suffix):
    return prefix + suffix if isinstance(prefix, str) else tf.strings.join([prefix, suffix])


def load_table(table, prefix):
    """Op replacing a `KVTable`'s content with what `save_table` wrote under `prefix`."""
    if isinstance(table, native.NativeKVTable):
        return table.load_from(prefix)
    keys, values = read_builtin_file(prefix, table.key_dtype, table.value_dtype, table.dim)
    return table.import_(keys, values)


def read_builtin_file(prefix, key_dtype, value_dtype, dim):
    """(keys `[n]`, values `[n, dim]`) of a `<prefix>-keys` / `-values` pair: a built-in table's
    (serialized tensors) or TFRA's (raw little-endian arrays, as its CPU tables write them)."""
    prefix = _at_run_time(prefix)
    keys = _decode_tensor_file(tf.io.read_file(_suffixed(prefix, "-keys")),
                               tf.as_dtype(key_dtype))
    values = tf.reshape(_decode_tensor_file(tf.io.read_file(_suffixed(prefix, "-values")),
                                            tf.as_dtype(value_dtype)), [-1, dim])
    with tf.control_dependencies([tf.debugging.assert_equal(
            tf.size(keys), tf.shape(values)[0],
            message="the -keys and -values files hold different numbers of rows")]):
        return tf.identity(keys), values


def _decode_tensor_file(data, dtype):
    """The 1-D tensor of a `-keys` or `-values` file: a serialized `TensorProto` (this package)
    or raw values (TFRA). A TensorProto starts with its dtype field and then its shape field;
    raw keys would need a first key with exactly those three bytes and raw values likewise."""
    if dtype == tf.string:   # TFRA writes numeric keys only
        return tf.reshape(tf.io.parse_tensor(data, dtype), [-1])
    header = bytes([0x08, dtype.as_datatype_enum, 0x12])
    return tf.cond(tf.equal(tf.strings.substr(data, 0, 3), header),
                   lambda: tf.reshape(tf.io.parse_tensor(data, dtype), [-1]),
                   lambda: tf.io.decode_raw(data, dtype, little_endian=True))


def save_file(table, dirpath, file_name=None, dirpath_env=ENV_DIR, append_to_file=False):
    """TFRA's per-table `save_to_file_system`: op writing `table` to `<dir>/<file_name>` (default:
    the table's name), a plain file outside any generation."""
    if append_to_file:
        raise ValueError("append_to_file=True is not supported: every save writes a whole, "
                         "checksummed file")
    return save_table(table, join(resolve_dir(dirpath, dirpath_env),
                                  _checked_file_name(file_name, table)))


def load_file(table, dirpath, file_name=None, dirpath_env=ENV_DIR, load_entire_dir=False):
    """TFRA's per-table `load_from_file_system`: op replacing `table`'s content with
    `<dir>/<file_name>`, or with `load_entire_dir=True` with every shard file of the same variable
    (the name before `_mht_`) in the directory, committed saves first (see the module doc)."""
    directory = resolve_dir(dirpath, dirpath_env)
    file_name = _checked_file_name(file_name, table)
    if not load_entire_dir:
        return load_table(table, join(directory, file_name))
    stem = file_name[:file_name.rfind("_mht_")] if "_mht_" in file_name else file_name
    keys, values = read_files(variable_files(directory, stem), table.key_dtype,
                              table.value_dtype, table.dim)
    return table.import_(keys, values)


def _checked_file_name(file_name, table):
    if file_name is None:
        return base.op_name(table.name)
    if not isinstance(file_name, str) or not file_name:
        raise ValueError(f"file_name must be a non-empty string; got {file_name!r}")
    return base.op_name(file_name)


# -- a variable: generations and commit records --------------------------------------------------

def save_shards(tables, directory, name, file_names, proc_rank=0, proc_size=1):
    """Op saving `tables[i]` as `file_names[i]` into a new generation of variable `name`, then
    committing it (ordered after every shard write). `directory` may be a string tensor."""
    stem = record_stem(name, proc_rank, proc_size)
    with tf.device(_cpu(tables[0].device)):
        # The time is read when the op runs (each run of a graph's save op writes a fresh
        # generation); the token tells apart ops built by different processes or calls. (No TF
        # random op: it would shift the random sequence of a user's seeded program.)
        micros = tf.cast(tf.timestamp() * 1e6, tf.int64)
        token = f"-{os.getpid():x}{os.urandom(4).hex()}"
        generation = tf.strings.join([stem + GENERATION_MARK,
                                      tf.strings.as_string(micros, width=17, fill="0"), token])
        generation_dir = join(directory, generation)
    writes, expected = [], []
    for table, file_name in zip(tables, file_names):
        writes.append(save_table(table, join(generation_dir, file_name)))
        expected += ([file_name] if isinstance(table, native.NativeKVTable)
                     else [file_name + "-keys", file_name + "-values"])
    with tf.control_dependencies(writes):
        with tf.device(_cpu(tables[0].device)):
            return commit(directory, stem + RECORD_SUFFIX, generation, expected)


def commit(directory, record, generation, expected_files):
    """Op pointing `<directory>/<record>` at `<directory>/<generation>` after checking that it
    holds `expected_files` (see the module doc); native op, else a `tf.py_function`."""
    if native.is_available():
        return native.commit_save(directory, record, generation, expected_files)
    done = tf.py_function(_commit_in_python,
                          [directory, record, generation,
                           tf.convert_to_tensor(list(expected_files), tf.string)],
                          Tout=tf.bool, name="commit_save")
    return tf.group(done)


def _commit_in_python(directory, record, generation, expected_files):
    """The commit of cc/ops/de_commit.cc with tf.io.gfile, for builds without the op library."""
    directory, record, generation = (t.numpy().decode() for t in (directory, record, generation))
    stem = record[:-len(RECORD_SUFFIX)]
    generation_dir = join(directory, generation)
    for name in expected_files.numpy():
        path = join(generation_dir, name.decode())
        if not tf.io.gfile.exists(path):
            raise tf.errors.NotFoundError(None, None, f"commit_save: '{path}' is missing, so the "
                                          f"save of '{stem}' was not committed")
    record_path = join(directory, record)
    previous = ""
    if tf.io.gfile.exists(record_path):
        with tf.io.gfile.GFile(record_path) as f:
            previous = f.read().split("\n", 1)[0].strip()
    tmp = f"{record_path}{_TMP_MARK}{os.getpid()}-{os.urandom(8).hex()}"
    try:
        with tf.io.gfile.GFile(tmp, "w") as f:
            f.write(generation + "\n")
        tf.io.gfile.rename(tmp, record_path, overwrite=True)
    except Exception:
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.remove(tmp)
        raise
    for child in tf.io.gfile.listdir(directory):
        child = child.rstrip("/")
        if child in (generation, previous):
            continue
        path = join(directory, child)
        try:
            if child.startswith(stem + GENERATION_MARK):
                tf.io.gfile.rmtree(path)
            elif child.startswith(record + _TMP_MARK):
                tf.io.gfile.remove(path)
        except tf.errors.OpError:
            pass  # cleanup is best effort: the save is committed
    return True


def _describe(directory):
    return repr(directory) if isinstance(directory, str) else "dirpath"


def _committed_generation(directory, stem):
    """String tensor: `directory/<generation>` when `<stem>.commit` exists, else `directory`."""
    where = _describe(directory)
    directory = _at_run_time(directory)
    record = join(directory, stem + RECORD_SUFFIX)
    found = tf.io.matching_files(glob_escape(record))

    def committed():
        generation = _first_line(tf.io.read_file(record))
        valid = tf.strings.regex_full_match(
            generation, _re_escape(stem + GENERATION_MARK) + "[0-9A-Za-z-]+")
        with tf.control_dependencies([tf.debugging.assert_equal(
                valid, True, message=f"corrupt commit record {stem + RECORD_SUFFIX} in "
                                     f"{where}: it must name a generation "
                                     f"{stem + GENERATION_MARK}<id>")]):
            return tf.identity(join(directory, generation))

    return tf.cond(tf.size(found) > 0, committed, lambda: tf.identity(directory))


def shard_prefixes(directory, name, file_names, proc_rank=0, proc_size=1):
    """String tensors `<dir>[/<committed generation>]/<file_names[i]>`, resolved when the ops run
    (a graph built once loads whatever save is committed when it runs)."""
    base_dir = _committed_generation(directory, record_stem(name, proc_rank, proc_size))
    return [join(base_dir, n) for n in file_names]


def load_shards(tables, prefixes):
    """Op loading `tables[i]` from `prefixes[i]`, all or nothing as far as it can: every file must
    be there before any table is replaced (else NotFoundError naming it), every `-keys`/`-values`
    pair (a built-in table's, or TFRA's for either backend) is read before any table is replaced,
    and each native file load is atomic. (A native file failing its
    checksum halfway leaves the shards before it loaded.)"""
    # A native table reads its own file, else a `-keys`/`-values` pair as a built-in table does
    # (TFRA's files, or a built-in table's of the same variable).
    own_file = [_exists(p) if isinstance(t, native.NativeKVTable) else None
                for t, p in zip(tables, prefixes)]
    expected, present = [], []
    for prefix, own in zip(prefixes, own_file):
        pair = [_suffixed(prefix, "-keys"), _suffixed(prefix, "-values")]
        if own is None:
            expected += pair
            present += [_exists(path) for path in pair]
        else:
            expected.append(prefix)
            present.append(tf.logical_or(own, tf.logical_and(*[_exists(p) for p in pair])))
    expected, present = tf.stack(expected), tf.stack(present)

    def first_missing():  # reading it raises TF's own NotFoundError, naming the file
        missing = tf.boolean_mask(expected, tf.logical_not(present))
        return tf.strings.length(tf.io.read_file(missing[0])) >= 0

    checked = tf.cond(tf.reduce_all(present), lambda: tf.constant(True), first_missing)
    with tf.control_dependencies([checked]):
        reads = [_read_pair(t, tf.identity(p), own)
                 for t, p, own in zip(tables, prefixes, own_file)]
        ready = [checked] + [tensor for read in reads for tensor in read]
    loads = []
    with tf.control_dependencies(ready):
        for table, prefix, read, own in zip(tables, prefixes, reads, own_file):
            loads.append(table.import_(*read) if own is None
                         else _load_native(table, tf.identity(prefix), own, read))
    return tf.group(*loads)


def _exists(path):
    return tf.size(tf.io.matching_files(glob_escape(path))) > 0


def _read_pair(table, prefix, own_file):
    """(keys, values) of the `-keys`/`-values` pair at `prefix`; none for a native table that
    has its own file."""
    def read():
        return read_builtin_file(prefix, table.key_dtype, table.value_dtype, table.dim)

    if own_file is None:
        return read()
    return tf.cond(own_file, lambda: (tf.zeros([0], table.key_dtype),
                                      tf.zeros([0, table.dim], table.value_dtype)), read)


def _load_native(table, prefix, own_file, pair):
    """Op loading a native table from its own file, or else from the rows of its pair."""
    def from_own_file():
        with tf.control_dependencies([table.load_from(prefix)]):
            return tf.constant(True)

    def from_pair():
        with tf.control_dependencies([table.import_(*pair)]):
            return tf.constant(True)

    return tf.cond(own_file, from_own_file, from_pair)


def variable_files(directory, name):
    """(native prefixes, built-in prefixes), 1-D string tensors: the shard files of variable
    `name` in `directory`, any shard count and rank. Per (rank, size): its committed generation's
    files when it has a commit record, else the plain TFRA-layout files. Found when the op runs."""
    stem = base.op_name(name)
    where = _describe(directory)
    directory = _at_run_time(directory)
    pattern_dir = glob_escape(directory)
    records = tf.io.matching_files(join(pattern_dir, glob_escape(stem) + "_rank*_size*.commit"))
    records = tf.boolean_mask(records, tf.strings.regex_full_match(
        _basename(records), _re_escape(stem) + r"_rank\d+_size\d+" + _re_escape(RECORD_SUFFIX)))
    record_keys = tf.strings.regex_replace(_basename(records), r"^.*_(rank\d+_size\d+)\.commit$",
                                           r"\1")
    generations = tf.map_fn(lambda r: _first_line(tf.io.read_file(r)), records,
                            fn_output_signature=tf.string)
    valid = tf.strings.regex_full_match(
        generations, _re_escape(stem) + r"_rank\d+_size\d+" + _re_escape(GENERATION_MARK)
        + "[0-9A-Za-z-]+")
    with tf.control_dependencies([tf.debugging.assert_equal(
            tf.reduce_all(valid), True,
            message=f"corrupt commit record of {stem} in {where}: it must name a generation")]):
        committed = tf.io.matching_files(tf.strings.join(
            [pattern_dir, "/", glob_escape(generations), "/", glob_escape(stem), "_mht_*"]))
    committed = tf.boolean_mask(committed, tf.strings.regex_full_match(
        _basename(committed), _re_escape(stem) + r"_mht_\d+of\d+_rank\d+_size\d+(-keys|-values)?"))
    with tf.control_dependencies([_check_complete(committed, tf.size(records), stem, where)]):
        committed = tf.identity(committed)
    plain = tf.io.matching_files(join(pattern_dir, glob_escape(stem) + "_mht_*"))
    plain_keys = tf.strings.regex_replace(
        _basename(plain), r"^.*_mht_\d+of\d+_(rank\d+_size\d+)(-keys|-values)?$", r"\1")
    # Per-table names carry no rank: a single process's save.
    plain_keys = tf.strings.regex_replace(plain_keys, r"^.*_mht_\d+of\d+(-keys|-values)?$",
                                          "rank0_size1")
    superseded = tf.reduce_any(tf.equal(plain_keys[:, None], record_keys[None, :]), axis=1)
    paths = tf.concat([committed, tf.boolean_mask(plain, tf.logical_not(superseded))], 0)
    paths = tf.boolean_mask(paths, tf.strings.regex_full_match(
        _basename(paths), _re_escape(stem) + r"_mht_\d+of\d+(_rank\d+_size\d+)?(-keys|-values)?"))
    with tf.control_dependencies([tf.debugging.assert_positive(
            tf.size(paths), message=f"no shard files of variable {stem!r} in {where}")]):
        paths = tf.identity(paths)
    is_keys = tf.strings.regex_full_match(paths, ".*-keys")
    is_values = tf.strings.regex_full_match(paths, ".*-values")
    builtin = tf.strings.regex_replace(tf.boolean_mask(paths, is_keys), "-keys$", "")
    native_files = tf.boolean_mask(paths, tf.logical_not(tf.logical_or(is_keys, is_values)))
    return native_files, builtin


def _check_complete(paths, num_generations, stem, where):
    """Op failing unless `paths` hold every shard (`_mht_<i>of<n>`, i = 1..n) of each of the
    `num_generations` committed generations: a reader slower than two commits may see a
    generation being deleted, which must be an error, never a partial load."""
    prefixes, _ = tf.unique(tf.strings.regex_replace(paths, "-(keys|values)$", ""))
    generation_of = tf.strings.regex_replace(prefixes, "/[^/]*$", "")
    shard_num = tf.strings.to_number(tf.strings.regex_replace(
        _basename(prefixes), r"^.*_mht_\d+of(\d+)_rank.*$", r"\1"), tf.int32)
    generations, index, found = tf.unique_with_counts(generation_of)
    wanted = tf.math.unsorted_segment_max(shard_num, index, tf.size(generations))
    message = (f"a committed save of {stem!r} in {where} is incomplete (deleted by newer saves "
               f"while this load read it?)")
    return tf.group(tf.debugging.assert_equal(tf.size(generations), num_generations,
                                              message=message),
                    tf.debugging.assert_equal(found, wanted, message=message))


def read_files(prefixes, key_dtype, value_dtype, dim):
    """(keys `[n]`, values `[n, dim]`) of every file in `prefixes` = (native prefixes, built-in
    prefixes) as `variable_files` returns them, whichever backend wrote them."""
    native_prefixes, builtin_prefixes = prefixes
    key_dtype, value_dtype = tf.as_dtype(key_dtype), tf.as_dtype(value_dtype)
    # Unknown-length starts: with static [0] starts Grappler's constant folding takes the loop
    # results for empty too (tf.size of them folded to 0).
    empty = (tf.compat.v1.placeholder_with_default(tf.zeros([0], key_dtype), [None]),
             tf.compat.v1.placeholder_with_default(tf.zeros([0, dim], value_dtype), [None, dim]))
    keys, values = _read_each(builtin_prefixes, empty,
                              lambda p: read_builtin_file(p, key_dtype, value_dtype, dim))
    if native.is_available():
        # Each native file is staged in a private native table, then exported.
        staging = native.NativeKVTable(key_dtype, value_dtype, dim, "file_staging")

        def read_native(prefix):
            with tf.control_dependencies([staging.load_from(prefix)]):
                return staging.export()

        keys, values = _read_each(native_prefixes, (keys, values), read_native)
    else:
        with tf.control_dependencies([tf.debugging.assert_equal(
                tf.size(native_prefixes), 0,
                message="native table files need the native op library (`make ops`)")]):
            keys = tf.identity(keys)
    return keys, values


def _read_each(prefixes, initial, read):
    """Concatenates `read(prefix)` over a 1-D tensor of prefixes, one file after another."""
    def body(i, keys, values):
        # The previous file's rows are inputs of this read: one staging table, in order.
        with tf.control_dependencies([keys, values]):
            prefix = tf.identity(prefixes[i])
        new_keys, new_values = read(prefix)
        return i + 1, tf.concat([keys, new_keys], 0), tf.concat([values, new_values], 0)

    _, keys, values = tf.while_loop(
        lambda i, *_: i < tf.size(prefixes), body, (tf.constant(0), *initial),
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None]),
                          tf.TensorShape([None, initial[1].shape[1]])),
        parallel_iterations=1)
    return keys, values
