"""Warm start: fill `de.Variable`s from another model's checkpoint (TFRA's `de.warm_start`).

A checkpoint holds each variable as two tensors, all its keys and all its values (checkpoint.py),
so a warm start reads those two tensors and imports them re-partitioned over the shards of the
variable being filled: a checkpoint written with 2 shards warm-starts a variable with 3.

Where a variable is found in the checkpoint:
- `tf.compat.v1.train.Saver` (graph mode) saves a variable as `<X>-keys` / `<X>-values`, where X
  is its name with `/` turned into `_`, inside the name scope it was created in
  (`ctr/ctr_user` for `ctr/user` made under `variable_scope("ctr")`). A variable matches the
  entry its own graph would write, else the one entry whose last part is its cleaned name.
- `tf.train.Checkpoint` saves it under its object path (`emb/.ATTRIBUTES/keys` for
  `Checkpoint(emb=w)`), which holds no variable name: pass the path as the previous name,
  `var_name_to_prev_var_name={w.name: "emb"}`. (TFRA's warm start reads Saver checkpoints only.)
- TFRA's per-shard tables (`<X>_mht_<i>of<n>-keys`, i = 1..n, as `Saver(w.tables)` writes them)
  are read together as the entry `<X>`, whatever n is.

Example (eager: the rows are restored at once; in graph mode run the op returned):
    >>> import os, tempfile
    >>> import tensorflow as tf
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> old = de.Variable(dim=2, name="ws_user_emb")
    >>> _ = old.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
    >>> folder = tempfile.mkdtemp()
    >>> _ = tf.train.Checkpoint(user_emb=old).save(os.path.join(folder, "ckpt"))
    >>> w = de.Variable(dim=2, name="ws_user_emb_v2")
    >>> de.warm_start(folder, vars_to_warm_start=[w],
    ...               var_name_to_prev_var_name={w.name: "user_emb"})
    >>> int(w.size())
    2
"""

import collections.abc
import re

from absl import logging
import tensorflow as tf

from tfra_dynamic_embedding import checkpoint as checkpoint_lib
from tfra_dynamic_embedding import variable as variable_lib

_SAVER_SUFFIX = {checkpoint_lib.KEYS: f"-{checkpoint_lib.KEYS}",
                 checkpoint_lib.VALUES: f"-{checkpoint_lib.VALUES}"}
_OBJECT_SUFFIX = {checkpoint_lib.KEYS: f"/.ATTRIBUTES/{checkpoint_lib.KEYS}",
                  checkpoint_lib.VALUES: f"/.ATTRIBUTES/{checkpoint_lib.VALUES}"}
# TFRA's shard table names: <variable>_mht_<i>of<n>, i from 1.
_SHARD_NAME = re.compile(r"(.+)_mht_(\d+)of(\d+)")


class NotInCheckpointError(ValueError, tf.errors.NotFoundError):
    """A variable to warm-start has no entry in the checkpoint: a ValueError raised when the op is
    built, and also the NotFoundError that TFRA's restore op raises when it runs."""

    def __init__(self, message):
        tf.errors.NotFoundError.__init__(self, None, None, message)


def warm_start(ckpt_to_initialize_from, vars_to_warm_start=".*", var_name_to_prev_var_name=None):
    """Op that replaces the content of `de.Variable`s with their rows in a checkpoint.

    Args:
      ckpt_to_initialize_from: a checkpoint prefix, or a directory (its latest checkpoint).
      vars_to_warm_start: which variables, as in TFRA:
        - a regex string: the variables in the `de.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES`
          collection whose name it matches (`re.match`); None: all of them;
        - a list of regex strings: the union of their matches;
        - a list of `de.Variable`s (e.g. `[w] + w.get_slot_variables(opt)` for the slots), or
          one `de.Variable`.
        Variables are only in the collection when added to it by hand (as in TFRA).
      var_name_to_prev_var_name: `{name: name in the checkpoint}` for renamed variables. A name
        also renames what lies under it, so `{"new": "old"}` maps slot `new/Adam/m` to
        `old/Adam/m`. For a `tf.train.Checkpoint`, the previous name is the object path.

    Returns:
      In graph mode a grouped op (run it once, after the session is created); eagerly the
      variables are filled at once and None is returned.

    Raises:
      ValueError: a bad argument, or a variable whose checkpoint entry is missing
        (`NotInCheckpointError`) or has another dtype or `dim`.

    Example (a checkpoint of variables named by regular expressions: docs/guide.md):
        >>> import os, tempfile
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> user_v1 = de.Variable(dim=2, name="user_v1")
        >>> _ = user_v1.upsert(tf.constant([7], tf.int64), tf.ones([1, 2]))
        >>> folder = tempfile.mkdtemp()
        >>> _ = tf.train.Checkpoint(user_v1=user_v1).save(os.path.join(folder, "ckpt"))
        >>> user_v2 = de.Variable(dim=2, name="user_v2")
        >>> warm_start(folder, [user_v2], {"user_v2": "user_v1"})
        >>> user_v2.lookup(tf.constant([7], tf.int64)).numpy()
        array([[1., 1.]], dtype=float32)
    """
    prefix = _checkpoint_prefix(ckpt_to_initialize_from)
    renames = _checked_renames(var_name_to_prev_var_name)
    variables = _select_variables(vars_to_warm_start)
    logging.info("Warm-starting %d de.Variable(s) from %s", len(variables), prefix)
    if not variables:
        logging.warning(
            "de.warm_start: vars_to_warm_start=%r selects no de.Variable (variables are in "
            "de.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES only when added by hand; or pass a list "
            "of variables)", vars_to_warm_start)
    _warn_unused_renames(renames, variables)

    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    entries = _variable_entries(shapes)
    restores = []
    with tf.name_scope("warm_start"):
        for variable in variables:
            prev_name = _prev_name(variable.name, renames)
            keys_names, values_names = _find_entry(variable, prev_name, entries, prefix)
            _check_entry(variable, keys_names, values_names, shapes, dtypes)
            # Read where the first shard lives (its host's CPU: RestoreV2 has only a CPU kernel),
            # so a parameter server reads its own tables' rows, as the Saver would.
            with tf.device(_cpu_of(variable.devices[0])):
                n = len(keys_names)
                tensors = tf.raw_ops.RestoreV2(
                    prefix=prefix, tensor_names=keys_names + values_names,
                    shape_and_slices=[""] * (2 * n),
                    dtypes=[variable.key_dtype] * n + [variable.value_dtype] * n)
                keys = tensors[0] if n == 1 else tf.concat(tensors[:n], 0)
                values = tensors[n] if n == 1 else tf.concat(tensors[n:], 0)
            restores.append(variable.import_(keys, values))
    return tf.group(*restores)


class WarmStartHook(tf.compat.v1.train.SessionRunHook):
    """`tf.compat.v1.train.SessionRunHook` running `de.warm_start` when a session is created.

    Arguments are `de.warm_start`'s. As in TFRA it warm-starts every time the monitored session
    creates a session, also after restoring the job's own checkpoint, which it then overwrites:
    give it to the first run of a job only.

    Usage with a `tf.compat.v1.train.MonitoredTrainingSession`: docs/guide.md ("Warm start from another model").
    """

    def __init__(self, ckpt_to_initialize_from, vars_to_warm_start,
                 var_name_to_prev_var_name=None):
        self._ckpt_to_initialize_from = ckpt_to_initialize_from
        self._vars_to_warm_start = vars_to_warm_start
        self._var_name_to_prev_var_name = var_name_to_prev_var_name
        self._restore_op = None

    def begin(self):
        # Built here, before the monitored session finalizes the graph.
        self._restore_op = warm_start(self._ckpt_to_initialize_from, self._vars_to_warm_start,
                                      self._var_name_to_prev_var_name)

    def after_create_session(self, session, coord):
        del coord
        session.run(self._restore_op)


# -- arguments ------------------------------------------------------------------------------
def _checkpoint_prefix(ckpt):
    if not isinstance(ckpt, (str, bytes)) and not hasattr(ckpt, "__fspath__"):
        raise ValueError(f"ckpt_to_initialize_from must be a checkpoint path or directory; "
                         f"got {ckpt!r}")
    path = tf.compat.as_str(ckpt if isinstance(ckpt, (str, bytes)) else ckpt.__fspath__())
    prefix = tf.train.latest_checkpoint(path) if tf.io.gfile.isdir(path) else path
    if prefix is None or not tf.io.gfile.exists(prefix + ".index"):
        raise ValueError(f"ckpt_to_initialize_from={ckpt!r} names no checkpoint (a prefix with a "
                         f".index file, or a directory with a 'checkpoint' file)")
    return prefix


def _checked_renames(renames):
    if renames is None:
        return {}
    if not isinstance(renames, collections.abc.Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in renames.items()):
        raise ValueError(f"var_name_to_prev_var_name must be a dict of variable name -> name in "
                         f"the checkpoint (strings); got {renames!r}")
    return dict(renames)


def _select_variables(selection):
    """TFRA's selection rules; each variable once, in order."""
    def collected(scope):
        try:
            re.compile(scope)
        except re.error as error:
            raise ValueError(f"vars_to_warm_start: {scope!r} is not a valid regex: "
                             f"{error}") from error
        return tf.compat.v1.get_collection(
            variable_lib.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES, scope=scope)

    if selection is None or isinstance(selection, str):
        found = collected(selection) if selection is not None else tf.compat.v1.get_collection(
            variable_lib.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES)
    elif isinstance(selection, variable_lib.Variable):
        found = [selection]
    elif isinstance(selection, (list, tuple)):
        if all(isinstance(s, str) for s in selection):
            found = [v for scope in selection for v in collected(scope)]
        elif all(isinstance(s, variable_lib.Variable) for s in selection):
            found = list(selection)
        else:
            raise ValueError(f"vars_to_warm_start as a list must hold only regex strings or only "
                             f"de.Variables; got {selection!r}")
    else:
        raise ValueError(f"vars_to_warm_start must be a regex string, None, or a list of regex "
                         f"strings or de.Variables; got {selection!r}")
    # The collection may also hold other objects someone put there; only de.Variables count.
    unique = {id(v): v for v in found if isinstance(v, variable_lib.Variable)}
    return list(unique.values())


def _prev_name(name, renames):
    if name in renames:
        return renames[name]
    # The longest renamed prefix wins: slot `new/Adam/m` follows its embedding `new`.
    parents = [k for k in renames if name.startswith(k + "/")]
    if parents:
        parent = max(parents, key=len)
        return renames[parent] + name[len(parent):]
    return name


def _warn_unused_renames(renames, variables):
    names = [v.name for v in variables]
    for key in renames:
        if not any(n == key or n.startswith(key + "/") for n in names):
            logging.warning("de.warm_start: var_name_to_prev_var_name key %r names no variable "
                            "being warm-started", key)


# -- finding a variable in the checkpoint --------------------------------------------------
def _variable_entries(shapes):
    """{entry name: ([keys tensor names], [values tensor names])} of every saved de.Variable.

    Whole variables (`<X>-keys`, `<X>/.ATTRIBUTES/keys`), and TFRA's per-shard tables
    (`<X>_mht_<i>of<n>-keys` for i = 1..n, e.g. `Saver(w.tables)`) as one entry `<X>`.
    """
    entries, shards = {}, {}
    for tensor_name in shapes:
        for suffixes in (_SAVER_SUFFIX, _OBJECT_SUFFIX):
            keys_suffix = suffixes[checkpoint_lib.KEYS]
            if not tensor_name.endswith(keys_suffix):
                continue
            base = tensor_name[:-len(keys_suffix)]
            values_name = base + suffixes[checkpoint_lib.VALUES]
            if values_name not in shapes:
                continue
            entries[base] = ([tensor_name], [values_name])
            shard = _SHARD_NAME.fullmatch(base)
            if shard and suffixes is _SAVER_SUFFIX:
                shards.setdefault((shard.group(1), int(shard.group(3))), {})[
                    int(shard.group(2))] = (tensor_name, values_name)
    for (base, count), found in shards.items():
        # Only a complete set of shards is a variable; a whole-variable entry of the same name wins.
        if sorted(found) == list(range(1, count + 1)) and base not in entries:
            entries[base] = ([found[i][0] for i in sorted(found)],
                             [found[i][1] for i in sorted(found)])
    return entries


def _find_entry(variable, prev_name, entries, prefix):
    own_entry = getattr(variable, "saver_name", None)  # what a Saver of this graph would write
    if prev_name == variable.name and own_entry in entries:
        return entries[own_entry]
    if prev_name in entries:   # a Saver entry or object path given as it is in the checkpoint
        return entries[prev_name]
    cleaned = variable_lib.scope_name(prev_name)
    matches = sorted(e for e in entries if e.split("/")[-1] == cleaned)
    if len(matches) == 1:
        return entries[matches[0]]
    if len(matches) > 1:
        # Prefer the name scope this variable has in its own graph.
        scope = own_entry.rpartition("/")[0] if own_entry else ""
        preferred = f"{scope}/{cleaned}" if scope else cleaned
        if preferred in matches:
            return entries[preferred]
        raise ValueError(f"de.warm_start: de.Variable {variable.name!r} (as {prev_name!r}) matches "
                         f"several entries of checkpoint {prefix}: {matches}; name one in "
                         f"var_name_to_prev_var_name")
    shown = sorted(entries)
    listing = ", ".join(shown[:20]) + (f", ... ({len(shown)} in all)" if len(shown) > 20 else "")
    raise NotInCheckpointError(
        f"de.warm_start: de.Variable {variable.name!r}"
        + (f" (previous name {prev_name!r})" if prev_name != variable.name else "")
        + f" is not in checkpoint {prefix}; its de.Variable entries: [{listing}]. Map the name "
        f"with var_name_to_prev_var_name, or leave the variable out of vars_to_warm_start")


def _check_entry(variable, keys_names, values_names, shapes, dtypes):
    for names, want in ((keys_names, variable.key_dtype), (values_names, variable.value_dtype)):
        for tensor_name in names:
            if dtypes[tensor_name] != want:
                raise ValueError(f"de.warm_start: checkpoint tensor {tensor_name!r} has dtype "
                                 f"{dtypes[tensor_name].name}; de.Variable {variable.name!r} "
                                 f"needs {want.name}")
    for values_name in values_names:
        values_shape = shapes[values_name]
        if len(values_shape) != 2 or values_shape[1] != variable.dim:
            raise ValueError(f"de.warm_start: checkpoint tensor {values_name!r} has shape "
                             f"{values_shape}; de.Variable {variable.name!r} has dim "
                             f"{variable.dim} (rows [n, {variable.dim}])")


def _cpu_of(device):
    if not device:
        return ""
    return tf.DeviceSpec.from_string(device).replace(device_type="CPU",
                                                     device_index=0).to_string()
