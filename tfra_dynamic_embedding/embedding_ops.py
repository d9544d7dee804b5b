"""Embedding lookups on a `de.Variable`, with the semantics of their `tf.nn` namesakes.

Each function looks up the rows of the batch's unique ids once, then runs the `tf.nn` combine on
those rows with ids re-mapped to row positions; the result is what `tf.nn` gives on a dense table
holding the same rows, and gradients w.r.t. the looked-up rows are IndexedSlices.

Example:
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> w = de.Variable(dim=8, initializer=1.0)
    >>> embedding_lookup(w, tf.constant([[3, 7]], tf.int64)).shape
    TensorShape([1, 2, 8])
    >>> sp_ids = tf.sparse.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([3, 7, 9], tf.int64),
    ...                                 dense_shape=[2, 2])
    >>> embedding_lookup_sparse(w, sp_ids, None, combiner="mean").shape
    TensorShape([2, 8])
"""

import numbers

import tensorflow as tf

from tfra_dynamic_embedding import grouped_lookup
from tfra_dynamic_embedding import trainable as trainable_lib
from tfra_dynamic_embedding import variable as variable_lib

COMBINERS = ("mean", "sqrtn", "sum")


def embedding_lookup(params, ids, partition_strategy=None, name=None, validate_indices=None,
                     max_norm=None, return_trainable=False):
    """Like `tf.nn.embedding_lookup`: rows of `params` for `ids` -> `ids.shape + [dim]`.

    `partition_strategy` and `validate_indices` are accepted for signature compatibility and
    ignored (the variable's partitioner decides). Missing ids get initializer rows, not inserted.
    With `return_trainable=True` returns `(embeddings, TrainableWrapper or None)`.
    """
    del partition_strategy, validate_indices
    params, shadow = _check_params(params, "params")
    _check_max_norm(max_norm)
    ids = variable_lib.typed_tensor(ids, params.key_dtype, "ids")
    name = name or "embedding_lookup"
    with tf.name_scope(variable_lib.scope_name(name)):
        flat = tf.reshape(ids, [-1])
        unique_ids, index = tf.unique(flat)
        rows, positions, wrapper = _batch_rows(params, unique_ids, name, return_trainable, ids,
                                                shadow)
        embeddings = tf.gather(rows, index if positions is None else tf.gather(positions, index))
        if max_norm is not None:
            embeddings = tf.clip_by_norm(embeddings, max_norm, axes=[1])
        embeddings = tf.reshape(embeddings, tf.concat([tf.shape(ids), [params.dim]], 0))
        embeddings.set_shape(ids.shape.concatenate([params.dim]))
        return (embeddings, wrapper) if return_trainable else embeddings


def embedding_lookup_unique(params, ids, partition_strategy=None, name=None,
                            validate_indices=None, max_norm=None, return_trainable=False):
    """TFRA's de-duplicating lookup: `embedding_lookup` already fetches each unique id once, so
    this is the same lookup under TFRA's name (default op name "embedding_lookup_unique")."""
    return embedding_lookup(params, ids, partition_strategy, name or "embedding_lookup_unique",
                            validate_indices, max_norm, return_trainable)


def embedding_lookups(params, ids, names=None, max_norm=None, return_trainable=False):
    """Several `embedding_lookup`s in one step, with their tables read together.

    The result equals `[embedding_lookup(p, i, name=n, max_norm=max_norm) for p, i, n in
    zip(params, ids, names)]` (names default to `embedding_lookup`, made unique). The rows of
    every shard on one device -- e.g. a parameter server holding a shard of each of 26 tables --
    are read by one op there, so the device receives the step's keys as one tensor and sends
    the rows back as one (see grouped_lookup.py): a step's work on a PS follows its rows, not
    the number of tables. With `return_trainable=True` returns `(embeddings, wrappers)`.

    Example:
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> user = de.Variable(dim=4, initializer=0.5, name="user")
        >>> item = de.Variable(dim=8, initializer=0.5, name="item")
        >>> u, i = embedding_lookups([user, item], [tf.constant([1, 2], tf.int64),
        ...                                          tf.constant([[7, 8, 9]], tf.int64)])
        >>> u.shape, i.shape
        (TensorShape([2, 4]), TensorShape([1, 3, 8]))
    """
    params, ids = list(params), list(ids)
    if len(params) != len(ids):
        raise ValueError(f"embedding_lookups needs one ids tensor per variable; got "
                         f"{len(params)} params and {len(ids)} ids")
    names = [None] * len(params) if names is None else list(names)
    if len(names) != len(params):
        raise ValueError(f"names must hold one name per variable ({len(params)}); got "
                         f"{len(names)}")
    _check_max_norm(max_norm)
    plans = []
    for p, lookup_ids, name in zip(params, ids, names):
        p, shadow = _check_params(p, "params")
        lookup_ids = variable_lib.typed_tensor(lookup_ids, p.key_dtype, "ids")
        name = name or "embedding_lookup"
        with tf.name_scope(variable_lib.scope_name(name)) as scope:
            unique_ids, index = tf.unique(tf.reshape(lookup_ids, [-1]))
            wrapper, load_ids, positions = _plan_read(p, unique_ids, name, return_trainable,
                                                      lookup_ids, shadow)
        plans.append((p, lookup_ids, scope, index, wrapper, load_ids, positions))
    rows = grouped_lookup.lookup_rows([plan[0] for plan in plans], [plan[5] for plan in plans])
    embeddings, wrappers = [], []
    for (p, lookup_ids, scope, index, wrapper, load_ids, positions), read in zip(plans, rows):
        with tf.name_scope(scope):
            held, positions, wrapper = _held(wrapper, load_ids, read, positions)
            found = tf.gather(held, index if positions is None else tf.gather(positions, index))
            if max_norm is not None:
                found = tf.clip_by_norm(found, max_norm, axes=[1])
            found = tf.reshape(found, tf.concat([tf.shape(lookup_ids), [p.dim]], 0))
            found.set_shape(lookup_ids.shape.concatenate([p.dim]))
        embeddings.append(found)
        wrappers.append(wrapper)
    return (embeddings, wrappers) if return_trainable else embeddings


def embedding_lookup_sparse(params, sp_ids, sp_weights, partition_strategy=None, name=None,
                            combiner="mean", max_norm=None, return_trainable=False):
    """Like `tf.nn.embedding_lookup_sparse`: combines the rows of each row of `sp_ids`.

    `sp_ids` is a 2-D SparseTensor (or RaggedTensor) of keys; `sp_weights` None or a
    SparseTensor (RaggedTensor) with the same indices; `combiner` one of "mean", "sqrtn", "sum" (None means "mean").
    With `return_trainable=True` returns `(embeddings, TrainableWrapper or None)`.
    """
    del partition_strategy
    params, shadow = _check_params(params, "params")
    combiner = _check_combiner(combiner)
    _check_max_norm(max_norm)
    sp_ids = _check_sparse(sp_ids, params.key_dtype, "sp_ids")
    sp_weights = _as_sparse(sp_weights)
    name = name or "embedding_lookup_sparse"
    with tf.name_scope(variable_lib.scope_name(name)):
        checks = _check_weights(sp_ids, sp_weights)
        with tf.control_dependencies(checks):
            # TFRA's name of the inner lookup (and so of its TrainableWrapper)
            rows, position_ids, wrapper = _unique_rows(params, sp_ids, f"{name}/embedding_lookup",
                                                       return_trainable, shadow=shadow)
        embeddings = tf.nn.embedding_lookup_sparse(rows, position_ids, sp_weights,
                                                   combiner=combiner, max_norm=max_norm)
        return (embeddings, wrapper) if return_trainable else embeddings


def safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights=None,
                                 combiner="mean", default_id=None, name=None,
                                 partition_strategy="div", max_norm=None, return_trainable=False):
    """Like `tf.nn.safe_embedding_lookup_sparse`, for a `de.Variable`.

    Every id is a key, negative ones included (hashed ids often are; TFRA documents the same,
    where `tf.nn` prunes them); unless combiner is "sum", ids with weights <= 0 are pruned. A
    row with no ids left gets the row of key `default_id`, or zeros when it is None.
    `sparse_ids` may be N-D (`[d_0, ..., d_n]`); the result is `[d_0, ..., d_{n-1}, dim]`.
    With `return_trainable=True` returns `(embeddings, TrainableWrapper or None)`.
    """
    del partition_strategy
    name = name or "safe_embedding_lookup_sparse"
    return pooled_lookup(embedding_weights, sparse_ids, sparse_weights, combiner, default_id,
                         name, max_norm, return_trainable,
                         lookup_name=f"{name}/embedding_lookup_sparse/embedding_lookup")


def pooled_lookup(embedding_weights, sparse_ids, sparse_weights, combiner, default_id, name,
                  max_norm, return_trainable, lookup_name):
    """`safe_embedding_lookup_sparse` whose rows are read by the lookup called `lookup_name`
    (Keras layers name it after themselves, so their one TrainableWrapper serves dense and
    sparse inputs alike)."""
    params, shadow = _check_params(embedding_weights, "embedding_weights")
    combiner = _check_combiner(combiner)
    _check_max_norm(max_norm)
    sparse_ids = _check_sparse(sparse_ids, params.key_dtype, "sparse_ids")
    sparse_weights = _as_sparse(sparse_weights)
    with tf.name_scope(variable_lib.scope_name(name)):
        checks = _check_weights(sparse_ids, sparse_weights, arg="sparse_weights",
                                ids_arg="sparse_ids")
        with tf.control_dependencies(checks):
            sparse_ids = tf.SparseTensor(tf.identity(sparse_ids.indices), sparse_ids.values,
                                         sparse_ids.dense_shape)
        if sparse_weights is not None and combiner != "sum":
            sparse_ids, sparse_weights = _retain(sparse_ids, sparse_weights,
                                                 sparse_weights.values > 0)
        if default_id is None:
            rows, position_ids, wrapper = _unique_rows(params, sparse_ids, lookup_name,
                                                       return_trainable, shadow=shadow)
            # tf.nn fills empty rows with position 0 and then zeroes them: make sure a row 0
            # exists even when the batch has no ids at all.
            rows = tf.concat([rows, tf.zeros([1, params.dim], rows.dtype)], 0)
            default_position = None
        else:
            default_key = variable_lib.typed_tensor(default_id, params.key_dtype, "default_id")
            # The default key goes first, so unique() gives it position 0.
            rows, position_ids, wrapper = _unique_rows(
                params, sparse_ids, lookup_name, return_trainable, leading_key=default_key,
                shadow=shadow)
            default_position = 0
        embeddings = tf.nn.safe_embedding_lookup_sparse(
            rows, position_ids, sparse_weights, combiner=combiner, default_id=default_position,
            max_norm=max_norm)
        return (embeddings, wrapper) if return_trainable else embeddings


def _batch_rows(params, unique_ids, name, return_trainable, ids, shadow=None):
    """(rows, positions, wrapper): the rows holding `unique_ids` -- `unique_ids[i]`'s row is
    `rows[positions[i]]`, or `rows[i]` when positions is None -- and the lookup's
    TrainableWrapper, or None when no gradient is wanted.

    The rows are read here, through the variable (`params.lookup`: its shard tables draw the
    missing keys' rows). When training they are handed to the lookup's wrapper and read back
    from it, so gradients w.r.t. them reach the wrapper (see trainable.needs_wrapper); a new
    wrapper is placed with the caller's `ids`.
    """
    wrapper, load_ids, positions = _plan_read(params, unique_ids, name, return_trainable, ids,
                                              shadow)
    return _held(wrapper, load_ids, params.lookup(load_ids), positions)


def _plan_read(params, unique_ids, name, return_trainable, ids, shadow=None):
    """(wrapper or None, the ids whose rows the lookup reads, positions): the first half of
    `_batch_rows`, before any table is read."""
    if shadow is not None:   # a ShadowVariable reads its rows through itself (train mode)
        if trainable_lib.get_model_mode() == trainable_lib.ModelMode.INFERENCE:
            return None, unique_ids, None
        wrapper = shadow
    elif not trainable_lib.needs_wrapper(params, return_trainable):
        return None, unique_ids, None
    else:
        wrapper = trainable_lib.wrapper_for(params, trainable_lib.wrapper_name(name), ids=ids)
    load_ids, positions = wrapper.ids_to_load(unique_ids)
    return wrapper, load_ids, positions


def _held(wrapper, load_ids, rows, positions):
    """The second half of `_batch_rows`: `rows` (of `load_ids`) handed to the wrapper."""
    if wrapper is None:
        return rows, None, None
    loaded = wrapper.hold(load_ids, rows)
    with tf.control_dependencies([loaded] if loaded is not None else []):
        return wrapper.held_rows(), positions, wrapper


def _unique_rows(params, sp_ids, name, return_trainable, leading_key=None, shadow=None):
    """Rows of the unique ids of `sp_ids`, `sp_ids` re-mapped to row positions, the wrapper."""
    keys = sp_ids.values
    if leading_key is not None:
        keys = tf.concat([tf.reshape(leading_key, [1]), keys], 0)
    unique_ids, index = tf.unique(keys)
    if leading_key is not None:
        index = index[1:]
    rows, positions, wrapper = _batch_rows(params, unique_ids, name, return_trainable,
                                           sp_ids.values, shadow)
    if positions is not None:   # this lookup's rows, in unique_ids order (tf.nn indexes them)
        rows = tf.gather(rows, positions)
    positions = tf.SparseTensor(sp_ids.indices, tf.cast(index, tf.int64), sp_ids.dense_shape)
    return rows, positions, wrapper


def _retain(sp_ids, sp_weights, keep):
    sp_ids = tf.sparse.retain(sp_ids, keep)
    if sp_weights is not None:
        sp_weights = tf.sparse.retain(sp_weights, keep)
    return sp_ids, sp_weights


def _check_params(params, arg):
    """(the de.Variable, the ShadowVariable given instead of it or None)."""
    if isinstance(params, (list, tuple)):   # TFRA accepts a one-element list, as tf.nn does
        if len(params) != 1:
            raise ValueError(f"{arg} must be a de.Variable or a list of one; got a list of "
                             f"{len(params)}")
        params = params[0]
    # A wrapper the user made to read rows through (de.shadow_ops.ShadowVariable, compat/)
    # stands for its variable: its class says so.
    if isinstance(params, trainable_lib.TrainableWrapper) and params.STANDS_FOR_PARAMS:
        return params.params, params
    if not isinstance(params, variable_lib.Variable):
        raise TypeError(f"{arg} must be a de.Variable or a de.shadow_ops.ShadowVariable; got "
                        f"{type(params).__name__}")
    return params, None


def _check_combiner(combiner):
    if combiner is None:
        return "mean"
    if combiner not in COMBINERS:
        raise ValueError(f"combiner must be one of {list(COMBINERS)}; got {combiner!r}")
    return combiner


def _check_max_norm(max_norm):
    """A number max_norm must be positive: tf.clip_by_norm turns rows into NaN or flips
    them otherwise (a tensor is taken as given, as tf.nn does)."""
    if max_norm is None or isinstance(max_norm, (tf.Tensor, tf.Variable)):
        return
    if (isinstance(max_norm, (bool, str)) or not isinstance(max_norm, numbers.Real)
            or not max_norm > 0):
        raise ValueError(f"max_norm must be None, a positive number or a tensor; got {max_norm!r}")


def _as_sparse(ids_or_weights):
    """A RaggedTensor (TFRA's ragged lookups take them) as the SparseTensor of its entries."""
    if isinstance(ids_or_weights, tf.RaggedTensor):
        return ids_or_weights.to_sparse()
    return ids_or_weights


def _check_sparse(sp, key_dtype, arg):
    sp = _as_sparse(sp)
    if not isinstance(sp, tf.SparseTensor):
        raise TypeError(f"{arg} must be a tf.SparseTensor or tf.RaggedTensor; got "
                        f"{type(sp).__name__}")
    if sp.dtype != key_dtype:
        raise variable_lib.DTypeError(
            f"{arg} must have dtype {key_dtype.name} (the variable's key_dtype); got {sp.dtype.name}")
    return sp


def _check_weights(sp_ids, sp_weights, arg="sp_weights", ids_arg="sp_ids"):
    """Static and runtime checks that the weights sit at the same indices as the ids."""
    if sp_weights is None:
        return []
    if not isinstance(sp_weights, tf.SparseTensor):
        raise TypeError(f"{arg} must be a tf.SparseTensor or None; got {type(sp_weights).__name__}")
    if not sp_weights.dtype.is_floating:
        raise variable_lib.DTypeError(f"{arg} must have a float dtype; got {sp_weights.dtype.name}")
    if not sp_ids.indices.shape.is_compatible_with(sp_weights.indices.shape):
        raise ValueError(f"{arg}.indices must equal {ids_arg}.indices; got shapes "
                         f"{sp_weights.indices.shape} and {sp_ids.indices.shape}")
    message = f"{arg}.indices must equal {ids_arg}.indices"
    return [
        tf.debugging.assert_equal(tf.shape(sp_ids.indices), tf.shape(sp_weights.indices),
                                  message=message),
        tf.debugging.assert_equal(sp_ids.indices, sp_weights.indices, message=message),
    ]
