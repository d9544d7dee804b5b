"""How a `de.Variable` is saved and restored.

A variable saves two tensors, all keys and all values of its shards, under fixed names; restoring
imports them re-partitioned over the shards the restoring variable has, so a checkpoint written
with 4 shards restores into 3 (or 1 into 4). TF2 `tf.train.Checkpoint` calls the variable's
`_serialize_to_tensors` / `_restore_from_tensors`; a `tf.compat.v1.train.Saver` in graph mode
finds the variable through the SAVEABLE_OBJECTS collection (`register_graph_saveable`).

A variable made with `kv_creator=de.CuckooHashTableCreator(saver=de.FileSystemSaver())` is
saved to files instead (TFRA's FileSystemSaver): the checkpoint holds only its shard count, and its
tables go to `save_path`, else to `TFRADynamicEmbedding/` next to the checkpoint files, with
`save_to_file_system` (all shards committed at once, see tables/files.py); a restore loads them
re-partitioned over the restoring variable's shards (`load_from_file_system_with_restore_function`).

Keras 3 `.keras` / `.weights.h5` files hold a variable's rows in the layer's (or optimizer's)
weights store: `save_to_keras_store` / `load_from_keras_store`.

TF2 checkpoints that TFRA wrote (`tf.train.Checkpoint`, Keras `save_weights`) restore too: their
per-shard tables and optimizer slots are read at the end of this module.

Example (TF2; a tf.compat.v1.train.Saver in graph mode: docs/guide.md):
    >>> import os, tempfile
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> w = de.Variable(dim=2, devices=["/CPU:0"] * 4)
    >>> _ = w.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2]))
    >>> path = tf.train.Checkpoint(emb=w).save(os.path.join(tempfile.mkdtemp(), "ckpt"))
    >>> w3 = de.Variable(dim=2, devices=["/CPU:0"] * 3)          # 4 shards restore into 3
    >>> _ = tf.train.Checkpoint(emb=w3).restore(path)
    >>> int(w3.size())
    3
"""

import os
import threading

import numpy as np
import tensorflow as tf

# SaveableObject/SaveSpec (the v1 Saver's) and register_checkpoint_saver (tf.train.Checkpoint's
# hook that passes a saver the checkpoint prefix) are private TF API: see _tf_private.py.
from tfra_dynamic_embedding import _tf_private

KEYS = "keys"
VALUES = "values"


def check_ranks(proc_size, proc_rank):
    """Raises ValueError naming the argument unless 0 <= proc_rank < proc_size (ints): the
    process ranks of file-system saves."""
    if isinstance(proc_size, bool) or not isinstance(proc_size, int) or proc_size < 1:
        raise ValueError(f"proc_size must be an int >= 1; got {proc_size!r}")
    if (isinstance(proc_rank, bool) or not isinstance(proc_rank, int)
            or not 0 <= proc_rank < proc_size):
        raise ValueError(f"proc_rank must be an int in [0, proc_size={proc_size}); "
                         f"got {proc_rank!r}")


def _tensor_of(value):
    """A tensor, or the tensor of a SaveSpec (made now: in a graph, the op runs when saved)."""
    return value.tensor if isinstance(value, _tf_private.SaveSpec) else value


class GraphSaveable(_tf_private.SaveableObject):
    """The v1 `Saver` view of a variable: `<name>-keys` and `<name>-values`."""

    def __init__(self, variable, name):
        self._variable = variable
        # The trackable's own tensors: joined on the task of the variable's first shard, so a
        # sharded Saver writes them there (a PS), not where the saving session runs.
        tensors = variable._serialize_to_tensors()  # pylint: disable=protected-access
        # keys and values; other names where the rows stay outside (Redis table_store_mode)
        self._names = [KEYS, VALUES] if KEYS in tensors else sorted(tensors)
        specs = [_tf_private.SaveSpec(_tensor_of(tensors[n]), "", f"{name}-{n}")
                 for n in self._names]
        super().__init__(variable, specs, name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes  # The shapes come from the saved tensors themselves.
        return self._variable._restore_from_tensors(  # pylint: disable=protected-access
            dict(zip(self._names, restored_tensors)))


def register_graph_saveable(variable, name):
    """Graph mode: make `tf.compat.v1.train.Saver()` save `variable` under `name`."""
    saver = file_system_saver_of(variable)
    saveable = (FileSystemGraphSaveable(variable, name, saver) if saver is not None
                else GraphSaveable(variable, name))
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, saveable)


def v1_saveable_factories(variable, name):
    """`_gather_saveables_for_checkpoint` of a variable, which `Saver(var_list=[w])` asks first:
    its file-system saveable, or nothing (then TF uses `_serialize_to_tensors`)."""
    saver = file_system_saver_of(variable)
    if saver is None:
        return {}
    return {"file_system": lambda name=name: FileSystemGraphSaveable(variable, name, saver)}


# -- FileSystemSaver (TFRA's de.FileSystemSaver) -------------------------------------------------

DIR_NAME = "TFRADynamicEmbedding"
# TFRA's override of every file-system save and load directory (tables/files.py ENV_DIR; not
# imported from there: tables/ imports this module).
_ENV_DIR = "TFRA_SAVED_KV"


class DynamicEmbeddingSaver:
    """TFRA's base class of the `saver=` of a KVCreator; `de.FileSystemSaver` is the one kind."""


class FileSystemSaverConfig:
    """Settings of a `FileSystemSaver` (TFRA's names): proc_size, proc_rank, save_path,
    buffer_size."""

    def __init__(self, proc_size=None, proc_rank=None, save_path=None, buffer_size=4096):
        if (proc_size is None) != (proc_rank is None):
            raise TypeError(f"proc_size and proc_rank must both be set or both be None; got "
                            f"proc_size={proc_size!r}, proc_rank={proc_rank!r}")
        proc_size = 1 if proc_size is None else proc_size
        proc_rank = 0 if proc_rank is None else proc_rank
        check_ranks(proc_size, proc_rank)
        if save_path is not None and (not isinstance(save_path, str) or not save_path):
            raise ValueError(f"save_path must be None or a non-empty string; got {save_path!r}")
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size must be a positive int; got {buffer_size!r}")
        self.proc_size = proc_size
        self.proc_rank = proc_rank
        self.save_path = save_path
        self.buffer_size = buffer_size


class FileSystemSaver(DynamicEmbeddingSaver):
    """Checkpoints write a variable's tables to files instead of into the checkpoint (TFRA).

    The tables go to `save_path`, else to `TFRADynamicEmbedding/` in the checkpoint's directory
    (`TFRADynamicEmbedding-<step>/` for `tf.compat.v1.train.Saver.save(..., global_step=step)`),
    as `save_to_file_system(dir, proc_size, proc_rank)` writes them; restoring reads whatever
    shard count and ranks wrote them. `$TFRA_SAVED_KV` overrides the directory, as in TFRA.
    Works with tf.train.Checkpoint (eager, tf.function; a v1-graph `Checkpoint.restore` cannot
    run registered restores, use tf.compat.v1.train.Saver there) and tf.compat.v1.train.Saver.
    Note the files hold the latest save: restoring an older checkpoint of the same directory
    reads the newer tables (TFRA's layout; use `save_path` per checkpoint to keep several).

    Args:
      proc_size, proc_rank: this process's rank among `proc_size` processes that each save
        their own part of the variable (e.g. Horovod); both or neither.
      save_path: directory of the table files (default: next to the checkpoint).
      buffer_size: accepted for TFRA compatibility (native files stream in ~1 MB blocks).

    Example:
        >>> import os, tempfile
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> w = de.Variable(dim=8, name="fs_emb",
        ...                 kv_creator=de.CuckooHashTableCreator(saver=de.FileSystemSaver()))
        >>> _ = w.upsert(tf.constant([1], tf.int64), tf.ones([1, 8]))
        >>> folder = tempfile.mkdtemp()
        >>> _ = tf.train.Checkpoint(emb=w).save(os.path.join(folder, "model"))
        >>> sorted(os.listdir(folder))       # tables in TFRADynamicEmbedding/
        ['TFRADynamicEmbedding', 'checkpoint', 'model-1.data-...', 'model-1.index']
    """

    def __init__(self, proc_size=None, proc_rank=None, save_path=None, buffer_size=4096):
        self.config = FileSystemSaverConfig(proc_size, proc_rank, save_path, buffer_size)
        _register_checkpoint_saver()

    def __repr__(self):
        c = self.config
        return (f"FileSystemSaver(proc_size={c.proc_size}, proc_rank={c.proc_rank}, "
                f"save_path={c.save_path!r})")


def file_system_saver_of(variable):
    """The `FileSystemSaver` a checkpointed de.Variable was made with, else None."""
    saver = getattr(getattr(variable, "kv_creator", None), "saver", None)
    if (isinstance(saver, FileSystemSaver) and getattr(variable, "checkpoint", False)
            and hasattr(variable, "save_to_file_system")):
        return saver
    return None


def _sibling_dir(prefix, step_suffix=False):
    """`<dirname(prefix)>/TFRADynamicEmbedding` (string tensor); with `step_suffix`, the Saver's
    `-<step>` ending of `prefix` is appended as TFRA's Saver does."""
    prefix = tf.convert_to_tensor(prefix, tf.string)
    parent = tf.where(tf.strings.regex_full_match(prefix, ".*/.*"),
                      tf.strings.regex_replace(prefix, "/[^/]*$", ""), ".")
    directory = tf.strings.join([parent, DIR_NAME], separator="/")
    if not step_suffix:
        return directory
    has_step = tf.strings.regex_full_match(prefix, r"(.*/)?[^/]*-\d+")
    step = tf.strings.regex_replace(prefix, r"^.*-(\d+)$", r"\1")
    return tf.where(has_step, tf.strings.join([directory, "-", step]), directory)


def _directory(saver, prefix, step_suffix=False):
    return saver.config.save_path or _sibling_dir(prefix, step_suffix)


def _save(variable, saver, directory):
    c = saver.config
    return variable.save_to_file_system(directory, proc_size=c.proc_size, proc_rank=c.proc_rank)


def _restore(variable, saver, directory):
    c = saver.config
    return variable.load_from_file_system_with_restore_function(
        os.environ.get(_ENV_DIR) or directory, proc_size=c.proc_size, proc_rank=c.proc_rank)


def _global_shard_num(variable, saver):
    return tf.constant(variable.shard_num * saver.config.proc_size, tf.int32)


# tf.train.Checkpoint: a registered saver gets the checkpoint prefix; it writes the tables, then
# (as TF's contract asks) a small SaveV2 shard that the checkpoint merge waits for, so the table
# writes run in v1 graphs too.
_SHARD_NUM_KEY = "/.TFRA_DE_FILE_SYSTEM/global_shard_num"
_registered = False
_register_lock = threading.Lock()


def _register_checkpoint_saver():
    global _registered
    with _register_lock:
        if not _registered:
            _tf_private.register_checkpoint_saver(
                package="tfra_dynamic_embedding", name="FileSystemSaver",
                predicate=lambda obj: file_system_saver_of(obj) is not None,
                save_fn=_checkpoint_save, restore_fn=_checkpoint_restore,
                # A SavedModel loaded without this package revives no de.Variable: let it load.
                strict_predicate_restore=False)
            _registered = True


def _live(variable):
    """The variable itself, or for a SavedModel's export copy the variable it copies."""
    return getattr(variable, "_exported_from", variable)


def _checkpoint_save(trackables, file_prefix):
    names, counts, writes = [], [], []
    for object_name, variable in sorted(trackables.items()):
        variable = _live(variable)
        saver = file_system_saver_of(variable)
        writes.append(_save(variable, saver, _directory(saver, file_prefix)))
        names.append(object_name + _SHARD_NUM_KEY)
        counts.append(_global_shard_num(variable, saver))
    with tf.control_dependencies(writes), tf.device("/CPU:0"):
        written = tf.raw_ops.SaveV2(prefix=file_prefix, tensor_names=names,
                                    shape_and_slices=[""] * len(names), tensors=counts)
        with tf.control_dependencies([written] if written is not None else []):
            return [tf.identity(file_prefix)]


def _checkpoint_restore(trackables, merged_prefix):
    # Returns nothing: TF ignores the result, and a SavedModel traces this into a function,
    # whose outputs may not be ops (the ops run as the function's stateful ops).
    for object_name, variable in trackables.items():
        variable = _live(variable)
        saver = file_system_saver_of(variable)
        if saver is None:
            continue
        if "/.ATTRIBUTES/" in object_name:
            # A checkpoint that holds the rows (saved without FileSystemSaver): TF hands the
            # object over by its first checkpoint key. Read the rows from the checkpoint.
            base = object_name.rsplit("/.ATTRIBUTES/", 1)[0] + "/.ATTRIBUTES/"
            with tf.device("/CPU:0"):
                keys, values = tf.raw_ops.RestoreV2(
                    prefix=merged_prefix, tensor_names=[base + KEYS, base + VALUES],
                    shape_and_slices=["", ""],
                    dtypes=[variable.key_dtype, variable.value_dtype])
            variable.import_(keys, values)
        else:
            _restore(variable, saver, _directory(saver, merged_prefix))


# tf.compat.v1.train.Saver: a SaveableObject has no view of the file name, but the Saver builds
# its save and restore ops inside its own name scope, next to its file name placeholder.
def _v1_saver_filename():
    graph = tf.compat.v1.get_default_graph()
    scope = graph.get_name_scope()
    try:
        filename = graph.get_tensor_by_name(f"{scope}/Const:0")
    except (KeyError, ValueError):
        filename = None
    if filename is None or filename.op.type != "PlaceholderWithDefault":
        raise ValueError(
            f"a de.FileSystemSaver variable can be saved by tf.compat.v1.train.Saver or "
            f"tf.train.Checkpoint; the saver building name scope {scope!r} is neither")
    return filename


class FileSystemGraphSaveable(_tf_private.SaveableObject):
    """The v1 `Saver` view of a FileSystemSaver variable: its global shard count goes into the
    checkpoint (`<name>-prev_global_shard_num`, as TFRA), its tables to files."""

    def __init__(self, variable, name, saver):
        self._variable = variable
        self._saver = saver
        spec = _tf_private.SaveSpec(self._save_tables, "", f"{name}-prev_global_shard_num",
                                        dtype=tf.int32, device="/device:CPU:0")
        super().__init__(variable, [spec], name)

    def _save_tables(self):
        directory = _directory(self._saver, _v1_saver_filename(), step_suffix=True)
        with tf.control_dependencies([_save(self._variable, self._saver, directory)]):
            return tf.identity(_global_shard_num(self._variable, self._saver))

    def restore(self, restored_tensors, restored_shapes):
        del restored_tensors, restored_shapes  # the tables come from the files
        saver = self._saver
        if saver.config.save_path:
            return _restore(self._variable, saver, saver.config.save_path)
        filename = _v1_saver_filename()
        # TFRA's Saver: `TFRADynamicEmbedding-<step>` when that exists, else the plain one.
        stepped = _sibling_dir(filename, step_suffix=True)
        exists = tf.size(tf.io.matching_files(tf.strings.regex_replace(
            stepped, r"([*?\[\\])", r"\\\1"))) > 0
        return _restore(self._variable, saver, tf.where(exists, stepped, _sibling_dir(filename)))


# -- Keras 3 weights stores ----------------------------------------------------------------------
# `save_own_variables` / `load_own_variables` of a layer or optimizer get a store of named numeric
# arrays (`.keras` and `.weights.h5` files): a variable goes in as `<prefix>keys` and
# `<prefix>values`. Keras' H5 store holds numeric arrays only, so string keys go as their bytes
# joined (uint8) plus each key's length (`<prefix>key_lengths`, int64).
def save_to_keras_store(store, prefix, variable):
    """Writes all keys and rows of `variable` (a de.Variable) into `store` under `prefix`.

    Example (a layer calls it in save_own_variables):
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> w = de.Variable(dim=2)
        >>> _ = w.upsert(tf.constant([5], tf.int64), tf.ones([1, 2]))
        >>> store = {}
        >>> save_to_keras_store(store, "emb/", w)
        >>> sorted(store), store["emb/keys"]
        (['emb/keys', 'emb/values'], array([5]))
    """
    keys, values = variable.export()
    keys = keys.numpy()
    if keys.dtype == object:   # string keys: bytes objects
        store[prefix + "keys"] = np.frombuffer(b"".join(keys), np.uint8)
        store[prefix + "key_lengths"] = np.array([len(k) for k in keys], np.int64)
    else:
        store[prefix + "keys"] = keys
    store[prefix + "values"] = values.numpy()


def load_from_keras_store(store, prefix, variable):
    """Replaces the content of `variable` with what `save_to_keras_store` wrote under `prefix`."""
    keys = np.asarray(store[prefix + "keys"])
    if prefix + "key_lengths" in store.keys():
        ends = np.cumsum(np.asarray(store[prefix + "key_lengths"]))
        data = keys.tobytes()
        keys = np.array([data[end - n:end] for end, n in
                         zip(ends, np.diff(np.concatenate([[0], ends])))], dtype=object)
    variable.import_(tf.constant(keys, dtype=variable.key_dtype),
                     tf.constant(np.asarray(store[prefix + "values"]),
                                 dtype=variable.value_dtype))


# -- TF2 checkpoints that TFRA wrote ------------------------------------------------------------
# TFRA saves a de.Variable as its shard tables: the variable's checkpoint node has a child
# `tables_of_<name>` listing them, each table saving the attribute `table` as `table-keys` and
# `table-values`. Such a child has no object here (a variable saves one keys/values pair), so
# `Variable._lookup_dependency` hands it a `TfraShardTables`, whose shards insert their rows into
# the variable (`upsert`, re-partitioned over its own shards): restore into a new model, as when
# moving from TFRA; keys the checkpoint lacks are kept. The optimizer matches TFRA's slot children
# to its slot variables with `names_tfra_slot`. (TFRA's `tf.compat.v1.train.Saver` checkpoints
# name the tables `<name>_mht_<i>of<n>`: `de.warm_start` reads those.)
_TFRA_TABLES_PREFIX = "tables_of_"   # TFRA's child holding a variable's shard tables
_TABLE_ATTRIBUTE = "table"          # a shard table's saved attribute: `table-keys`, `table-values`


def is_tfra_tables(name):
    """Whether `name` is the checkpoint child under which TFRA saved a variable's tables."""
    return name.startswith(_TFRA_TABLES_PREFIX)


def names_tfra_slot(child_name, variable_name, slot_name):
    """Whether the optimizer's checkpoint child `child_name` is TFRA's slot `slot_name` of the
    variable `variable_name`: `<variable>/.../<slot>`, where a Keras layer's variable is
    `<layer>-parameter` in TFRA (here: named as the layer).

    Example:
        >>> names_tfra_slot("emb-parameter/DynamicEmbedding/emb-shadow/m", "emb", "m")
        True
        >>> names_tfra_slot("emb-parameter/DynamicEmbedding/emb-shadow/v", "emb", "m")
        False
    """
    head, _, last = child_name.rpartition("/")
    return last == slot_name and any(
        head.startswith(prefix + "/") for prefix in (variable_name, variable_name + "-parameter"))


class TfraShardTables(_tf_private.AutoTrackable):
    """TFRA's list of a variable's shard tables, as a restore finds it; child `i` is shard i."""

    def __init__(self, variable):
        self._variable = variable
        self._shards = {}

    def _lookup_dependency(self, name, cached_dependencies=None):
        if not name.isdigit():
            return super()._lookup_dependency(name, cached_dependencies)
        if name not in self._shards:
            self._shards[name] = _ShardTable(self._variable)
        return self._shards[name]


class _ShardTable(_tf_private.AutoTrackable):
    """One of TFRA's shard tables: restoring it inserts its rows into the variable."""

    def __init__(self, variable):
        self._variable = variable

    def _gather_saveables_for_checkpoint(self):
        return {_TABLE_ATTRIBUTE: lambda name: _ShardSaveable(self._variable, name)}


class _ShardSaveable(_tf_private.SaveableObject):
    """Reads `<name>-keys` / `<name>-values` (TFRA's spec names) and inserts them. It saves
    nothing of its own: this package's checkpoints save the variable whole."""

    def __init__(self, variable, name):
        self._variable = variable
        specs = [_tf_private.SaveSpec(tf.zeros([0], variable.key_dtype), "", f"{name}-keys"),
                 _tf_private.SaveSpec(tf.zeros([0, variable.dim], variable.value_dtype), "",
                                      f"{name}-values")]
        super().__init__(None, specs, name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        keys, values = restored_tensors
        return self._variable.upsert(keys, values)
