"""`de.shadow_ops`: a TrainableWrapper the user creates once, for tf.Module / Keras style models.

`de.embedding_lookup(..., return_trainable=True)` makes a lookup's TrainableWrapper itself, by the
lookup's name. A `ShadowVariable` is the same kind of variable made explicitly, as a model
attribute, so that the model (and `tf.function`s over it) owns it from the start:
`shadow_ops.embedding_lookup(shadow, ids)` loads the rows of the batch's unique ids from
`shadow.params` into it (initializer rows for missing ids, nothing inserted) and gathers them;
an optimizer wrapped by `de.DynamicEmbeddingOptimizer` trains it and writes rows and slots back,
exactly as it trains the wrappers of `de.embedding_lookup`. Works in eager mode, in `tf.function`
and in tf.compat.v1 graphs (TFRA's own allows eager mode only).

Example:
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> class Model(tf.Module):
    ...     def __init__(self):
    ...         self.emb = de.Variable(dim=2, initializer=1.0)
    ...         self.shadow = de.shadow_ops.ShadowVariable(self.emb)
    ...     @tf.function
    ...     def __call__(self, ids):
    ...         return de.shadow_ops.embedding_lookup(self.shadow, ids)
    >>> model = Model()
    >>> ids = tf.constant([1, 2], tf.int64)
    >>> opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.25))
    >>> with tf.GradientTape() as tape:
    ...     loss = tf.reduce_sum(model(ids) ** 2)
    >>> _ = opt.apply_gradients([(tape.gradient(loss, model.shadow), model.shadow)])
    >>> model.emb.lookup(ids).numpy()        # 1 - 0.25 * 2
    array([[0.5, 0.5],
           [0.5, 0.5]], dtype=float32)
"""

import tensorflow as tf

from tfra_dynamic_embedding import trainable as trainable_lib
from tfra_dynamic_embedding import variable as variable_lib

__all__ = ["ShadowVariable", "embedding_lookup", "embedding_lookup_unique"]


class ShadowVariable(trainable_lib.TrainableWrapper):
    """The rows of `params` a model's last lookup loaded, trainable like any variable.

    A `TrainableWrapper` (so `de.DynamicEmbeddingOptimizer` trains it and writes it back) that
    the user creates once, e.g. in a `tf.Module`'s `__init__`, and passes to
    `shadow_ops.embedding_lookup`. Its value holds the rows of the unique ids of the last step's
    lookups (`shadow.ids`), `[0, dim]` before any. The rows are a cache of the table: restoring a
    checkpoint leaves them alone (the next lookup reloads them), and `de.train.DECheckpoint`
    empties the shadow before it saves, as TFRA's does.

    Args:
      params: the `de.Variable` the rows come from and are written back to.
      name: the variable's name (also its key in `params.trainable_store`).
      max_norm: if not None, `embedding_lookup` clips each looked-up row to this l2-norm.
      trainable: whether optimizers (and `tf.Module.trainable_variables`) train it.
      distribute_strategy: None, or the `tf.distribute.ParameterServerStrategy` whose workers
        each hold their own rows (the current one is used when created in its scope).

    Example:
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> w = de.Variable(dim=2)
        >>> shadow = ShadowVariable(w, name="user_shadow")
        >>> emb = embedding_lookup(shadow, tf.constant([3, 1, 3], tf.int64))
        >>> shadow.ids.numpy()                        # unique(ids)
        array([3, 1])
    """

    # `de.embedding_lookup(shadow, ids)` reads the rows of `shadow.params` through it.
    STANDS_FOR_PARAMS = True
    # TFRA's users read the trained rows from it after a step.
    HOLDS_TRAINED_ROWS = True

    def __init__(self, params, name="ShadowVariable", max_norm=None, trainable=True,
                 distribute_strategy=None, **kwargs):
        if kwargs:
            # TFRA's internal buffers (`ids`, `exists`, `model_mode`, ...): ours are built in.
            raise TypeError(f"ShadowVariable got unsupported keyword arguments "
                            f"{sorted(kwargs)}; it makes its own ids buffer and follows "
                            f"de.enable_train_mode / de.enable_inference_mode")
        if not isinstance(params, variable_lib.Variable):
            raise TypeError(f"params must be a de.Variable; got {type(params).__name__}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string; got {name!r}")
        if max_norm is not None and (isinstance(max_norm, bool)
                                     or not isinstance(max_norm, (int, float))
                                     or max_norm <= 0):
            raise ValueError(f"max_norm must be None or a positive number; got {max_norm!r}")
        super().__init__(params, name=name, trainable=bool(trainable),
                         ps_strategy=_check_strategy(distribute_strategy))
        self.max_norm = max_norm
        # Found by name as TFRA's are (`params.get_trainable_by_name`, `trainable_store`).
        params.store_trainable(name, self)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        # A model's functions capture the ids buffer with the shadow, so a SavedModel must hold
        # it; checkpoints leave it out (a restore skips the rows too; `save_type` is a str enum).
        if save_type == "savedmodel":
            children["ids"] = self.ids
        return children

    def _reset_ids(self, ids):
        """Holds `ids` (TFRA's method): `read_value(do_prefetch=True)` then loads their rows."""
        return self.ids.assign(variable_lib.typed_tensor(ids, self.params.key_dtype, "ids"),
                               read_value=False)

    def clear(self):
        """Holds no rows (`[0, dim]`), as `de.train.DECheckpoint` leaves it when saving (TFRA)."""
        self.end_step()
        return self.hold(tf.zeros([0], self.params.key_dtype),
                         tf.zeros([0, self.params.dim], self.params.value_dtype))

    def embedding_lookup(self, ids, name=None, max_norm=None, return_trainable=False):
        """`shadow_ops.embedding_lookup(self, ids)`; `(embeddings, self)` with
        `return_trainable` (TFRA's method)."""
        emb = embedding_lookup(self, ids, name=name, max_norm=max_norm)
        return (emb, self) if return_trainable else emb


def _check_strategy(strategy):
    """The ParameterServerStrategy to make the shadow worker-local for, or None."""
    if strategy is None:
        return None
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(f"distribute_strategy must be None or a tf.distribute.Strategy; got "
                        f"{type(strategy).__name__}")
    if isinstance(strategy, (tf.distribute.ParameterServerStrategy,
                             tf.distribute.experimental.ParameterServerStrategy)):
        return strategy
    if strategy is tf.distribute.get_strategy() and not tf.distribute.has_strategy():
        return None   # the default (no) strategy
    raise ValueError(f"distribute_strategy must be None or a ParameterServerStrategy; got "
                     f"{type(strategy).__name__}")


def embedding_lookup(shadow, ids, partition_strategy=None, name=None, validate_indices=None,
                     max_norm=None):
    """The rows of `shadow.params` for `ids` (any shape) -> `ids.shape + [dim]`, read through
    `shadow`.

    In train mode (`de.enable_train_mode`, the default) it loads the rows of the unique ids into
    `shadow` (initializer rows for missing ids; nothing is inserted) and gathers them from it,
    so gradients reach `shadow`; in inference mode it reads `shadow.params` directly. Lookups of
    one step (a tf.function trace, or eager lookups under one GradientTape) share the shadow,
    as for `de.embedding_lookup`. `partition_strategy` and `validate_indices` are accepted for
    `tf.nn.embedding_lookup` compatibility and ignored; `max_norm` (default `shadow.max_norm`)
    clips each row's l2-norm.

    Example:
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> shadow = ShadowVariable(de.Variable(dim=8))
        >>> embedding_lookup(shadow, tf.constant([[1, 2], [2, 3]], tf.int64)).shape
        TensorShape([2, 2, 8])
    """
    del partition_strategy, validate_indices
    if not isinstance(shadow, ShadowVariable):
        raise TypeError(f"shadow must be a de.shadow_ops.ShadowVariable; got "
                        f"{type(shadow).__name__}")
    params = shadow.params
    ids = variable_lib.typed_tensor(ids, params.key_dtype, "ids")
    max_norm = shadow.max_norm if max_norm is None else max_norm
    with tf.name_scope(name or "shadow_embedding_lookup"):
        unique_ids, index = tf.unique(tf.reshape(ids, [-1]))
        if trainable_lib.get_model_mode() == trainable_lib.ModelMode.INFERENCE:
            rows, positions = params.lookup(unique_ids), None
        else:
            loaded, positions = shadow.load_lookup(unique_ids)
            with tf.control_dependencies([loaded] if loaded is not None else []):
                rows = shadow.held_rows()
        embeddings = tf.gather(rows, index if positions is None else tf.gather(positions, index))
        if max_norm is not None:
            embeddings = tf.clip_by_norm(embeddings, max_norm, axes=[1])
        embeddings = tf.reshape(embeddings, tf.concat([tf.shape(ids), [params.dim]], 0))
        embeddings.set_shape(ids.shape.concatenate([params.dim]))
        return embeddings


def embedding_lookup_unique(shadow, ids, embedding_size, with_unique=True, name=None):
    """`embedding_lookup(shadow, ids)` for dense or ragged `ids`: a tensor `ids.shape +
    [embedding_size]`, or a RaggedTensor with `ids`' row structure.

    `embedding_size` must equal `shadow.params.dim`. `with_unique` is accepted for TFRA
    compatibility: the lookup always loads each unique id once.

    Example:
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> shadow = ShadowVariable(de.Variable(dim=8))
        >>> ragged = tf.ragged.constant([[2, 3], [4, 5, 1]], tf.int64)
        >>> embedding_lookup_unique(shadow, ragged, 8).shape
        TensorShape([2, None, 8])
    """
    del with_unique
    if not isinstance(shadow, ShadowVariable):
        raise TypeError(f"shadow must be a de.shadow_ops.ShadowVariable; got "
                        f"{type(shadow).__name__}")
    if embedding_size != shadow.params.dim:
        raise ValueError(f"embedding_size must equal the dim of {shadow.params.name} "
                         f"({shadow.params.dim}); got {embedding_size!r}")
    name = name or "shadow_embedding_lookup_unique"
    if isinstance(ids, tf.RaggedTensor):
        values = embedding_lookup(shadow, ids.flat_values, name=name)
        return ids.with_flat_values(values)
    return embedding_lookup(shadow, ids, name=name)
