"""`de.keras.layers.Embedding` (alias `BasicEmbedding`), `SquashedEmbedding` and
`FieldWiseEmbedding`: Keras layers over a `de.Variable`, for Keras 3 and for tf_keras
(`HvdAllToAllEmbedding`, TFRA's Horovod layer, refuses with a clear error).

Looks up int or string ids of any shape (dense, `tf.RaggedTensor` or `tf.SparseTensor`), trains
through `model.fit` with a `de.DynamicEmbeddingOptimizer`-wrapped optimizer, and is saved by
`model.save_weights` / `tf.train.Checkpoint`. Ids never seen get initializer rows and no table
entry until an optimizer step writes them.

These classes hold the layer logic and name no Keras: constructing one gives a layer of the Keras
chosen by `binding.resolve` (`keras=`, else the Keras of Keras objects among the arguments, else
the Keras `tf.keras` is), an instance of both the class and that Keras' `layers.Layer`.

Example:
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> ids = tf.keras.Input(shape=(3,), dtype=tf.int64)
    >>> pooled = de.keras.layers.Embedding(8, pooling="mean", name="user")(ids)
    >>> pooled.shape
    (None, 8)
    >>> model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(pooled))
    >>> model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam()),
    ...               loss="mse")
    >>> model(tf.constant([[1, 2, 3]], tf.int64)).shape
    TensorShape([1, 1])
"""

import contextlib
import contextvars
import numbers
import sys

import numpy as np
import tensorflow as tf

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding import checkpoint as checkpoint_lib
from tfra_dynamic_embedding import embedding_ops
from tfra_dynamic_embedding import scopes
from tfra_dynamic_embedding import trainable as trainable_lib
from tfra_dynamic_embedding import variable as variable_lib
from tfra_dynamic_embedding.compat import horovod
from tfra_dynamic_embedding.keras import binding
from tfra_dynamic_embedding.keras import models
from tfra_dynamic_embedding.online import restrict_policies

POOLINGS = ("sum", "mean", "sqrtn")
# A restrict policy in a layer's config, by class name.
_RESTRICT_POLICIES = {cls.__name__: cls for cls in (restrict_policies.TimestampRestrictPolicy,
                                                    restrict_policies.FrequencyRestrictPolicy)}
_KERAS_NAMES = {binding.KERAS3: "Keras 3", binding.TF_KERAS: "tf_keras"}
_CALL_INTERCEPTOR = contextvars.ContextVar("tfra_de_embedding_call_interceptor", default=None)
# {layer id: its output} while `call_grouped` calls layers whose rows it already read.
_GROUPED_OUTPUTS = contextvars.ContextVar("tfra_de_grouped_outputs", default=None)


@contextlib.contextmanager
def intercept_calls(interceptor):
    """Within the block, calling any embedding layer returns `interceptor(layer, ids)` and reads
    no table: how a sharded export traces a model's dense part apart from its tables.

    Example:
        >>> layer = Embedding(4, name="intercepted")
        >>> with intercept_calls(lambda layer, ids: tf.zeros([2, 4])):
        ...     rows = layer(tf.constant([1, 2], tf.int64))
        >>> float(tf.reduce_sum(rows)), int(layer.params.size())
        (0.0, 0)
    """
    token = _CALL_INTERCEPTOR.set(interceptor)
    try:
        yield
    finally:
        _CALL_INTERCEPTOR.reset(token)


def call_grouped(layers, inputs):
    """`[layer(x) for layer, x in zip(layers, inputs)]` for embedding layers, with the tables of
    all of them read together (`de.embedding_lookups`): one lookup op per device and step, e.g.
    per parameter server, instead of one per layer and device. The outputs are equal.

    Layers of plain lookups of dense ids are grouped (inside `tf.function`, `model.fit` and
    eager code); layers with pooling, sparse or ragged ids, a `max_norm` that differs between
    them, symbolic Keras inputs or a tf.compat.v1 graph are called one by one.

    Example:
        >>> user, item = Embedding(4, name="user_g"), Embedding(4, name="item_g")
        >>> u, i = call_grouped([user, item], [tf.constant([1, 2], tf.int64),
        ...                                    tf.constant([[3, 4]], tf.int64)])
        >>> u.shape, i.shape
        (TensorShape([2, 4]), TensorShape([1, 2, 4]))
    """
    layers, inputs = list(layers), list(inputs)
    if len(layers) != len(inputs):
        raise ValueError(f"call_grouped needs one input per layer; got {len(layers)} layers and "
                         f"{len(inputs)} inputs")
    inputs = [tf.convert_to_tensor(x) if isinstance(x, np.ndarray) else x for x in inputs]
    if not _groupable(layers, inputs):
        return [layer(x) for layer, x in zip(layers, inputs)]
    keys = [layer._keys(x) for layer, x in zip(layers, inputs)]  # pylint: disable=protected-access
    outputs = embedding_ops.embedding_lookups([layer.params for layer in layers], keys,
                                              names=[layer.name for layer in layers],
                                              max_norm=layers[0].max_norm)
    token = _GROUPED_OUTPUTS.set({id(layer): out for layer, out in zip(layers, outputs)})
    try:   # through Keras' __call__ (build, name scopes), which returns the rows read above
        return [layer(x) for layer, x in zip(layers, keys)]
    finally:
        _GROUPED_OUTPUTS.reset(token)


def _groupable(layers, inputs):
    graph = tf.compat.v1.get_default_graph()
    return (len(layers) > 1 and _CALL_INTERCEPTOR.get() is None
            and (tf.executing_eagerly() or graph.building_function)
            # plain Embedding layers (SquashedEmbedding and others compute more in `call`)
            and all(isinstance(layer, Embedding) and type(layer).call is Embedding.call
                    and layer.pooling is None for layer in layers)
            and len({id(layer) for layer in layers}) == len(layers)
            and len({repr(layer.max_norm) for layer in layers}) == 1
            and all(isinstance(x, tf.Tensor) for x in inputs))


class Embedding:
    """Embeddings of dynamic ids, one `[embedding_size]` row per id.

    A Keras layer of the Keras chosen at construction (see the module docstring): with
    `import tf_keras` in a process where `tf.keras` is Keras 3, pass a tf_keras initializer or
    `keras="tf_keras"` to put the layer in a tf_keras model.

    Args:
      embedding_size: row length (the variable's dim).
      key_dtype: tf.int64, tf.int32 or tf.string; integer inputs are cast to it.
      value_dtype: dtype of the rows.
      combiner: TFRA's argument, kept for subclasses (`SquashedEmbedding`, `FieldWiseEmbedding`);
        as in TFRA, this layer's output is `ids.shape + [embedding_size]` whatever it is.
      initializer: initializer of new rows (default: Keras' `RandomNormal()`, as TFRA's), as
        `de.Variable` takes it.
      devices: devices of the shard tables (default: the placement plan in scope, else the
        current device).
      name: the layer's name, also its variable's.
      with_unique: TFRA's switch (lookups here always fetch each unique id once).
      short_file_name: name the optimizer's slot variables `<name>/<slot>` (see `de.Variable`).
      kv_creator: the table backend (default: native if built, else built-in).
      restrict_policy: a `de.RestrictPolicy` class (e.g. `de.FrequencyRestrictPolicy`); then
        `layer.params.restrict(n)` evicts down to n keys.
      bp_v2: training adds row updates instead of overwriting rows (see `de.Variable`).
      eviction: None or a `de.Eviction` (a capacity bound / time to live while training).
      admission: None or a `de.CountAdmission` / `de.BloomAdmission` / `de.ProbabilityAdmission`.
      keras: the layer's Keras, "keras" (Keras 3), "tf_keras" or the module; None to choose by
        the other arguments, else `tf.keras`.
      keep_distribution: TFRA's switch: `get_config()` also holds the `kv_creator` (devices
        are always kept here).
      distribute_strategy: the strategy to make the layer's variables in when the layer is
        made outside any strategy's scope (TFRA's argument).
      pooling: None, or "sum"/"mean"/"sqrtn" to pool the rows over the last id axis (dense or
        ragged ids): output `ids.shape[:-1] + [embedding_size]`. SparseTensor ids are always
        pooled, by default with "mean".

    Example:
        >>> import tf_keras
        >>> layer = Embedding(4, initializer=tf_keras.initializers.Constant(0.1))
        >>> isinstance(layer, tf_keras.layers.Layer), layer.keras
        (True, 'tf_keras')
    """

    def __new__(cls, *args, **kwargs):
        layer_class, package = binding.class_for(cls, args, kwargs)   # also checks `keras=`
        models.refuse_legacy_hdf5(package)
        models.export_with_stock_tables(package)
        # The Keras Layer's own __new__ (both Kerases set up the instance there).
        return super(Embedding, layer_class).__new__(layer_class, *args, **kwargs)

    # TFRA's positional order up to short_file_name; the rest are keyword arguments there.
    def __init__(self, embedding_size, key_dtype=tf.int64, value_dtype=tf.float32,
                 combiner="sum", initializer=None, devices=None, name="DynamicEmbeddingLayer",
                 with_unique=True, short_file_name=False, kv_creator=None, restrict_policy=None,
                 bp_v2=False, init_capacity=0, partitioner=None, checkpoint=True, max_norm=None,
                 keras=None, eviction=None, admission=None, keep_distribution=False,
                 distribute_strategy=None, pooling=None, **kwargs):
        del keras   # chose the class in __new__
        if isinstance(restrict_policy, str):   # from get_config
            restrict_policy = _RESTRICT_POLICIES.get(restrict_policy, restrict_policy)
        kwargs.setdefault("dtype", tf.as_dtype(value_dtype).name)
        super().__init__(name=name, **kwargs)
        if pooling is not None and pooling not in POOLINGS:
            raise ValueError(f"pooling must be None or one of {list(POOLINGS)}; got {pooling!r}")
        self.embedding_size = _whole_number("embedding_size", embedding_size)
        self.combiner = combiner
        self.pooling = pooling
        self.with_unique = with_unique   # lookups always fetch each unique id once
        self.max_norm = max_norm
        self.supports_jit = False  # hash-table kernels have no XLA implementation
        if isinstance(initializer, dict):   # a serialized Keras initializer (from get_config)
            initializer = binding.keras_module(self.keras).initializers.get(initializer)
        if initializer is None:   # TFRA's default
            initializer = binding.keras_module(self.keras).initializers.RandomNormal()
        partitioner = partitioner or variable_lib.default_partition_fn
        placed = scopes.resolve_placement(self.name) if devices is None else None
        if placed is not None:  # inside a placement plan's scope (placement/apply.py)
            devices, partitioner = placed[0], placed[1] or partitioner
        self.keep_distribution = bool(keep_distribution)
        if distribute_strategy is not None and not isinstance(distribute_strategy,
                                                              tf.distribute.Strategy):
            raise TypeError(f"distribute_strategy must be None or a tf.distribute.Strategy; got "
                            f"{type(distribute_strategy).__name__}")
        # TFRA's argument: the strategy the layer's variables belong to when the layer is made
        # outside its scope (inside a scope, that scope's strategy).
        in_strategy = (distribute_strategy.scope() if distribute_strategy is not None
                       and not tf.distribute.has_strategy() else contextlib.nullcontext())
        with in_strategy:
            self.params = variable_lib.Variable(
                key_dtype=key_dtype, value_dtype=value_dtype, dim=self.embedding_size,
                devices=devices, partitioner=partitioner, name=self.name,
                initializer=initializer,
                kv_creator=kv_creator, trainable=kwargs.get("trainable", True),
                checkpoint=checkpoint, init_size=int(init_capacity),
                restrict_policy=restrict_policy, bp_v2=bp_v2, short_file_name=short_file_name,
                eviction=eviction, admission=admission)
            # The lookup's TrainableWrapper is one of the layer's trainable weights from the
            # start (model.fit hands its gradient to the optimizer, and checkpoints see the
            # same weights before and after training). It is transient: save_own_variables
            # stores the table.
            wrapper = trainable_lib.wrapper_for(
                self.params, trainable_lib.wrapper_name(self.name))
        wrapper.regularizer = None  # Keras reads it off every trainable weight
        if self.params.trainable:
            _tf_private.trainable_weight_list(self).append(wrapper)

    @property
    def keras(self):
        """The layer's Keras: "keras" (Keras 3) or "tf_keras"."""
        return binding.package_of(type(self))

    @classmethod
    def from_config(cls, config):
        if binding.package_of(cls) is None:   # called on the logic class: pick the Keras first
            cls = binding.bound_class(cls, binding.resolve(cls, (), config))
        return super(Embedding, cls).from_config(config)

    def __call__(self, *args, **kwargs):
        interceptor = _CALL_INTERCEPTOR.get()
        if interceptor is not None:
            return interceptor(self, args[0] if args else kwargs.get("inputs", kwargs.get("ids")))
        # A layer of one Keras called on the other Keras' symbolic inputs would be traced as
        # that Keras' op layers and fail deep inside the lookup: say what to do instead.
        inputs = args[0] if args else kwargs.get("inputs", kwargs.get("ids"))
        for tensor in tf.nest.flatten(inputs):
            package = binding.package_of(tensor)
            if package is not None and package != self.keras:
                raise TypeError(
                    f"layer {self.name!r} is a {_KERAS_NAMES[self.keras]} layer but was called "
                    f"on a {_KERAS_NAMES[package]} tensor ({type(tensor).__name__}); construct "
                    f"it with keras={package!r} or a {_KERAS_NAMES[package]} initializer"
                    + (", or set TF_USE_LEGACY_KERAS=1 before TensorFlow's Keras loads"
                       if package == binding.TF_KERAS else ""))
        return super().__call__(*args, **kwargs)

    def call(self, ids):
        grouped = _GROUPED_OUTPUTS.get()
        if grouped is not None and id(self) in grouped:   # read by call_grouped
            return grouped[id(self)]
        if isinstance(ids, tf.SparseTensor):
            return self._lookup_sparse(ids)
        if isinstance(ids, tf.RaggedTensor):
            rows = ids.with_flat_values(self._lookup(self._keys(ids.flat_values)))
        else:
            rows = self._lookup(self._keys(tf.convert_to_tensor(ids)))
        return rows if self.pooling is None else _pool(rows, self.pooling)

    def _keys(self, ids):
        # Float ids are cast as Keras' own Embedding does: Keras 3 feeds a Sequential model built
        # without an `Input` as float32.
        key_dtype = self.params.key_dtype
        if ids.dtype != key_dtype and key_dtype.is_integer and (ids.dtype.is_integer
                                                                or ids.dtype.is_floating):
            ids = tf.cast(ids, key_dtype)
        return ids

    def _lookup(self, ids):
        return embedding_ops.embedding_lookup(self.params, ids, name=self.name,
                                              max_norm=self.max_norm)

    def _lookup_sparse(self, sp_ids):
        sp_ids = tf.SparseTensor(sp_ids.indices, self._keys(sp_ids.values), sp_ids.dense_shape)
        return embedding_ops.pooled_lookup(
            self.params, sp_ids, None, self.pooling or "mean", None, self.name, None, False,
            lookup_name=self.name)

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        if self.pooling is not None:
            shape = shape[:-1]
        return self._shape(tuple(shape) + (self.embedding_size,))

    def _shape(self, shape):
        """An output shape as this layer's Keras wants it (tf_keras: a TensorShape)."""
        return tf.TensorShape(shape) if self.keras == binding.TF_KERAS else tuple(shape)

    def get_config(self):
        config = super().get_config()
        config.update(embedding_size=self.embedding_size,
                      key_dtype=self.params.key_dtype.name,
                      value_dtype=self.params.value_dtype.name,
                      combiner=self.combiner, pooling=self.pooling,
                      devices=self.params.devices,
                      bp_v2=self.params.bp_v2, init_capacity=self.params.init_size,
                      with_unique=self.with_unique, max_norm=self.max_norm,
                      short_file_name=self.params.short_file_name,
                      keep_distribution=self.keep_distribution,
                      # from_config on the logic class makes a layer of the same Keras
                      keras=self.keras)
        initializer = self._initializer_config()
        if initializer is not None:
            config["initializer"] = initializer
        policy = self.params.restrict_policy
        if policy is not None:
            config["restrict_policy"] = type(policy).__name__
        if self.keep_distribution:
            # The object, as TFRA's config holds it: from_config round trips, JSON does not.
            config["kv_creator"] = self.params.kv_creator
        return config

    def _initializer_config(self):
        """The initializer as a config value: a number, name, `[dim]` list or a serialized
        initializer of this layer's Keras; None when it has no such form (then omitted, and
        from_config uses the default)."""
        initializer = self.params.initializer
        if isinstance(initializer, (numbers.Number, str)) and not isinstance(initializer, bool):
            return initializer
        if isinstance(initializer, (np.ndarray, list, tuple)):
            return np.asarray(initializer).tolist()
        if binding.package_of(initializer) == self.keras:
            return binding.keras_module(self.keras).initializers.serialize(initializer)
        return None

    # Keras 3 `save_weights` / `load_weights`: the whole table, re-sharded on load.
    def save_own_variables(self, store):
        checkpoint_lib.save_to_keras_store(store, "", self.params)

    def load_own_variables(self, store):
        checkpoint_lib.load_from_keras_store(store, "", self.params)


# TFRA's name of the plain layer.
BasicEmbedding = Embedding


def reduce_pooling(x, combiner="sum"):
    """Reduces `[batch, ..., dim]` rows to `[batch, dim]` (a 2-D `[n, dim]` to `[dim]`) with
    `tf.math.reduce_<combiner>` (TFRA's `reduce_pooling`).

    Example:
        >>> pooled = reduce_pooling(tf.ones([3, 2, 8]), "mean")
        >>> pooled.shape, float(tf.reduce_min(pooled)), float(tf.reduce_max(pooled))
        (TensorShape([3, 8]), 1.0, 1.0)
    """
    reduce = _reduce_method(combiner)
    if x.shape.rank is None or x.shape.rank < 2:
        raise ValueError(f"x must have rank >= 2 (rows of ids); got shape {x.shape}")
    if x.shape.rank == 2:
        return reduce(x, axis=0)
    # One id axis at a time, as TFRA does (for "std" this differs from one joint reduction).
    for _ in range(x.shape.rank - 2):
        x = reduce(x, axis=1)
    return x


def _reduce_method(combiner):
    """`tf.math.reduce_<combiner>` ("sum", "mean", "max", "min", "prod", "std", ...)."""
    method = getattr(tf.math, f"reduce_{combiner}", None) if isinstance(combiner, str) else None
    if method is None:
        raise ValueError(f"combiner must name a tf.math.reduce_* method (e.g. 'sum', 'mean', "
                         f"'max', 'std'); got {combiner!r}")
    return method


class SquashedEmbedding(Embedding):
    """Looks up ids of any shape and reduces every axis but the first with `combiner`
    (`reduce_pooling`): a `[batch, ...]` input gives `[batch, embedding_size]`, a 1-D input
    `[embedding_size]`. Arguments as `Embedding`'s.

    Example:
        >>> layer = SquashedEmbedding(8)          # combiner "sum"
        >>> layer(tf.constant([[15, 2], [4, 92], [22, 4]], tf.int64)).shape
        TensorShape([3, 8])
    """

    def __init__(self, embedding_size, key_dtype=tf.int64, value_dtype=tf.float32,
                 combiner="sum", *args, **kwargs):
        _reduce_method(combiner)   # a clear error now rather than at the first call
        if kwargs.get("pooling") is not None:
            raise ValueError(f"SquashedEmbedding pools with combiner; got pooling="
                             f"{kwargs['pooling']!r}")
        super().__init__(embedding_size, key_dtype, value_dtype, combiner, *args, **kwargs)

    def call(self, ids):
        ids = tf.convert_to_tensor(_dense_ids(ids, self))
        if ids.shape.rank is not None and ids.shape.rank < 1:
            raise ValueError(f"ids must have rank >= 1; got shape {ids.shape}")
        return reduce_pooling(self._lookup(self._keys(ids)), self.combiner)

    def compute_output_shape(self, input_shape):
        if len(input_shape) == 1:
            return self._shape((self.embedding_size,))
        return self._shape((input_shape[0], self.embedding_size))


class FieldWiseEmbedding(Embedding):
    """Ids of `[batch, n]` mapped to `nslots` fields by `slot_map_fn` (an element-wise
    function of the ids giving ints in [0, nslots)); the rows of each field are combined
    ("sum", "mean" or "sqrtn"), giving `[batch, nslots, embedding_size]` (empty fields: zeros).

    Example:
        >>> layer = FieldWiseEmbedding(4, 3, slot_map_fn=lambda x: x % 3)
        >>> layer(tf.constant([[23, 12, 0], [9, 13, 10]], tf.int64)).shape
        TensorShape([2, 3, 4])
    """

    # "sqrt_n" is TFRA's name (tf.sparse.segment_sqrt_n), "sqrtn" tf.nn's.
    SEGMENT = {"sum": tf.math.unsorted_segment_sum, "mean": tf.math.unsorted_segment_mean,
               "sqrtn": tf.math.unsorted_segment_sqrt_n, "sqrt_n": tf.math.unsorted_segment_sqrt_n}

    def __init__(self, embedding_size, nslots, slot_map_fn=None, key_dtype=tf.int64,
                 value_dtype=tf.float32, combiner="sum", initializer=None, devices=None,
                 name="SlotDynamicEmbeddingLayer", with_unique=True, **kwargs):
        if not callable(slot_map_fn):
            raise ValueError(f"slot_map_fn must be callable; got {slot_map_fn!r}")
        self.nslots = _whole_number("nslots", nslots)
        if self.nslots < 1:
            raise ValueError(f"nslots must be >= 1; got {nslots!r}")
        if combiner not in self.SEGMENT:
            raise ValueError(f"combiner must be one of {sorted(self.SEGMENT)}; got {combiner!r}")
        self.slot_map_fn = slot_map_fn
        super().__init__(embedding_size, key_dtype, value_dtype, combiner, initializer, devices,
                         name, with_unique, **kwargs)

    def call(self, ids):
        ids = self._keys(tf.convert_to_tensor(_dense_ids(ids, self)))
        if ids.shape.rank != 2:
            raise ValueError(f"ids must be [batch, n]; got shape {ids.shape}")
        rows = self._lookup(tf.reshape(ids, [-1]))
        slots = tf.cast(self.slot_map_fn(ids), tf.int64)
        checks = [tf.debugging.assert_non_negative(slots, message="slot_map_fn gave a slot < 0"),
                  tf.debugging.assert_less(slots, tf.constant(self.nslots, tf.int64),
                                           message=f"slot_map_fn gave a slot >= nslots "
                                                   f"({self.nslots})")]
        batch = tf.shape(ids, out_type=tf.int64)[0]
        with tf.control_dependencies(checks):
            segments = slots + tf.range(batch)[:, None] * self.nslots
        pooled = self.SEGMENT[self.combiner](rows, tf.reshape(segments, [-1]),
                                             batch * self.nslots)
        return tf.reshape(pooled, [-1, self.nslots, self.embedding_size])

    def compute_output_shape(self, input_shape):
        return self._shape((input_shape[0], self.nslots, self.embedding_size))

    def get_config(self):
        config = super().get_config()
        # the function itself, as TFRA does: from_config round trips, JSON does not
        config.update(nslots=self.nslots, slot_map_fn=self.slot_map_fn)
        return config


class HvdAllToAllEmbedding:
    """TFRA's Horovod embedding (each rank holds a shard of the table; ids travel between ranks
    by all-to-all). Not provided: this package shards tables over parameter servers with
    TensorFlow's runtime. Constructing one raises a ValueError without Horovod (as TFRA's does)
    and a NotImplementedError with it, naming what to use instead.

    Instead: `de.keras.layers.Embedding(8, devices=[ps devices])`, shown in docs/distributed.md.
    """

    def __new__(cls, *args, **kwargs):
        horovod.require("de.keras.layers.HvdAllToAllEmbedding")
        raise NotImplementedError(
            "de.keras.layers.HvdAllToAllEmbedding (tables sharded over Horovod ranks) is not "
            "provided: shard the tables over parameter servers with de.keras.layers.Embedding("
            "..., devices=[ps devices]) under tf.distribute.ParameterServerStrategy or "
            "tf.compat.v1 between-graph training (docs/distributed.md)")


class LayerNormalization:
    """Keras' `LayerNormalization` (of the Keras chosen as for `Embedding`) that also takes
    inputs whose shape is only known at run time and `tf.RaggedTensor`s, normalized over the
    values of each row (TFRA's `de.keras.layers.LayerNormalization`). Arguments as Keras'.

    Example:
        >>> inputs = tf.keras.Input(shape=(None, 10))
        >>> LayerNormalization()(inputs).shape      # any sequence length
        (None, None, 10)
    """

    def __new__(cls, *args, **kwargs):
        layer_class, _ = binding.class_for(cls, args, kwargs, base="LayerNormalization")
        kwargs.pop("keras", None)
        return super(LayerNormalization, layer_class).__new__(layer_class, *args, **kwargs)

    def __init__(self, *args, keras=None, **kwargs):
        del keras   # chose the class in __new__
        super().__init__(*args, **kwargs)

    @classmethod
    def from_config(cls, config):
        if binding.package_of(cls) is None:
            cls = binding.bound_class(cls, binding.resolve(cls, (), config),
                                      base="LayerNormalization")
        return super(LayerNormalization, cls).from_config(config)

    @property
    def keras(self):
        """The layer's Keras: "keras" (Keras 3) or "tf_keras"."""
        return binding.package_of(type(self))

    def get_config(self):
        # from_config on the logic class makes a layer of the same Keras
        return dict(super().get_config(), keras=self.keras)

    def call(self, inputs):
        if not isinstance(inputs, tf.RaggedTensor):
            return super().call(inputs)
        # Padding adds whole rows along the normalized (uniform) axes, which the result drops.
        lengths = inputs.nested_row_lengths()
        dense = super().call(inputs.to_tensor())
        return tf.RaggedTensor.from_tensor(dense, lengths=lengths)


def _dense_ids(ids, layer):
    """`ids`, refusing the sparse and ragged ids that only `Embedding` takes."""
    if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError(
            f"{type(layer).__name__} {layer.name!r} takes dense ids; got a {type(ids).__name__}: "
            f"pool variable-length ids with de.keras.layers.Embedding(..., pooling='sum', "
            f"'mean' or 'sqrtn'), or pad them to a dense tensor")
    return ids


def _whole_number(name, value):
    """`int(value)` (TFRA takes anything convertible), refusing a fraction it would drop."""
    try:
        whole = int(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be convertible to int; got {value!r}") from error
    if isinstance(value, numbers.Real) and whole != value:
        raise ValueError(f"{name} must be a whole number; got {value!r}")
    return whole


def _pool(rows, pooling):
    """Pools `[..., ids, dim]` rows (dense or ragged) over the id axis; empty rows give zeros."""
    ragged = isinstance(rows, tf.RaggedTensor)
    axis = rows.ragged_rank if ragged else -2  # the (innermost ragged) id axis
    total = tf.reduce_sum(rows, axis=axis)
    if pooling == "sum":
        return total
    if ragged:
        count = tf.cast(rows.row_lengths(axis=axis), rows.dtype)
        count = tf.expand_dims(count.to_tensor() if isinstance(count, tf.RaggedTensor)
                               else count, -1)
    else:
        count = tf.cast(tf.shape(rows)[-2], rows.dtype)
    scale = count if pooling == "mean" else tf.sqrt(count)
    return tf.math.divide_no_nan(total, scale)


# Each layer with its Keras base class: `register_keras_layers` makes and registers each one's
# class for every installed Keras.
KERAS_LAYERS = ((Embedding, "Layer"), (SquashedEmbedding, "Layer"), (FieldWiseEmbedding, "Layer"),
                (LayerNormalization, "LayerNormalization"))


def register_keras_layers():
    """Registers the layers with every installed Keras now (a layer registers itself when first
    constructed), so that a process that loads a saved model before constructing any layer
    finds them: the alias package's import does it (compat.install)."""
    binding.register(KERAS_LAYERS)


# TFRA documents its layers under the module `keras.layers.embedding` too
# (`de.keras.layers.embedding.reduce_pooling`); here that module is this one.
embedding = sys.modules[__name__]
