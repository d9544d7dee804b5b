"""The optimizer families' hooks: where each family (tf.compat.v1.train, Keras 3, tf_keras and
tf_keras legacy) makes slots, runs its per-variable update and applies a step -- each routed to
`DynamicEmbeddingMixin` (base.py) for the wrappers of `de.Variable`s. `mixin_for(optimizer)`
picks the family of an optimizer.

Example:
    >>> import tensorflow as tf
    >>> mixin_for(tf.compat.v1.train.AdagradOptimizer(0.1)).__name__
    'V1Mixin'
"""

import sys

import numpy as np
import tensorflow as tf

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding import checkpoint as checkpoint_lib
from tfra_dynamic_embedding import table_updates
from tfra_dynamic_embedding import trainable as trainable_lib
from tfra_dynamic_embedding.optimizer.base import DynamicEmbeddingMixin, wrap


class V1Mixin(DynamicEmbeddingMixin):
    """tf.compat.v1.train optimizers: slots come from `_zeros_slot` / `_get_or_make_slot*`."""

    _de_family = "v1"

    def _resource_apply_dense(self, grad, handle):
        wrapper = self._de_in_table(handle)
        if wrapper is None:
            return super()._resource_apply_dense(grad, handle)
        dtype = wrapper.dtype.base_dtype
        hyper = self._de_hyper_cache(
            (dtype,), lambda: table_updates.v1_hyper(self, self._de_step_rule, dtype))
        return self._de_defer(wrapper, grad, hyper)

    def _zeros_slot(self, var, slot_name, op_name):
        if _wrapper_of(var) is not None:
            return self._de_v1_slot(var, slot_name, 0.0)
        return super()._zeros_slot(var, slot_name, op_name)

    def _get_or_make_slot(self, var, val, slot_name, op_name):
        if _wrapper_of(var) is not None:
            return self._de_v1_slot(var, slot_name, val)
        return super()._get_or_make_slot(var, val, slot_name, op_name)

    def _get_or_make_slot_with_initializer(self, var, initializer, shape, dtype, slot_name,
                                           op_name):
        if _wrapper_of(var) is not None:
            return self._de_v1_slot(var, slot_name, initializer)
        return super()._get_or_make_slot_with_initializer(var, initializer, shape, dtype,
                                                          slot_name, op_name)

    def _de_v1_slot(self, var, slot_name, initializer):
        wrapper = _wrapper_of(var)
        return self._de_filed_slot(self._slot_dict(slot_name), _v1_var_key(wrapper), wrapper,
                                   slot_name, initializer)

    def _create_slots(self, var_list):
        # Some optimizers size slots statically (ProximalAdagrad: tf.constant(c, shape=...)).
        return super()._create_slots(_static_views(var_list))

    def _create_non_slot_variable(self, initial_value, name, colocate_with):
        # Optimizers put non-slot variables (Adam's beta powers) next to the first variable by
        # name. In a tf.compat.v1 graph a wrapper is the worker's own cache, so they would be
        # worker-local: every worker would count its own steps, and a non-chief worker of
        # between-graph training would wait forever for the chief to initialize them. They go
        # next to the embedding's first table shard instead (on a PS when the tables are).
        wrapper = _wrapper_of(colocate_with)
        if wrapper is not None and not tf.compat.v1.executing_eagerly_outside_functions():
            colocate_with = _ColocateWith(wrapper.params.shards.tables[0].resource_handle)
        return super()._create_non_slot_variable(initial_value, name, colocate_with)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None, **kwargs):
        def create_slots(var_list):
            with tf.init_scope():
                self._create_slots(var_list)

        def apply(pairs):
            return super(V1Mixin, self).apply_gradients(pairs, global_step, name, **kwargs)

        return self._de_apply(grads_and_vars, create_slots, apply)


class KerasConfigMixin:
    """A Keras optimizer's config names it wrapped (see `wrapped_class`); `from_config` wraps
    the plain optimizer again with the same `bp_v2` and `synchronous`."""

    def get_config(self):
        config = dict(super().get_config(), de_bp_v2=self._de_bp_v2)
        if self._de_synchronous:
            config["de_synchronous"] = True
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        bp_v2 = config.pop("de_bp_v2", None)
        synchronous = config.pop("de_synchronous", False)
        mixin, plain = cls.__bases__   # this family's mixin, the optimizer's own class
        return wrap(plain.from_config(config, custom_objects=custom_objects), mixin,
                    bp_v2=bp_v2, synchronous=synchronous, apply_in_tables=True)


class KerasUpdateMixin:
    """Keras 3 and tf_keras (non-legacy): a wrapper updated in its tables takes its weight
    decay there too (the factor goes with the step's numbers)."""

    def _use_weight_decay(self, variable):
        if self._de_in_table(variable) is not None:
            return False
        return super()._use_weight_decay(variable)

    def _de_keras_update(self, wrapper, gradient, learning_rate):
        dtype = wrapper.dtype.base_dtype
        decays = (self.weight_decay is not None
                  and super(KerasUpdateMixin, self)._use_weight_decay(wrapper))

        def make():
            decay = (tf.cast(learning_rate, dtype) * tf.cast(self.weight_decay, dtype)
                     if decays else 0.0)
            return table_updates.keras_hyper(self, self._de_step_rule, dtype, learning_rate, decay)

        return self._de_defer(wrapper, gradient, self._de_hyper_cache((dtype, decays), make))


class Keras3Mixin(KerasConfigMixin, KerasUpdateMixin, DynamicEmbeddingMixin):
    """Keras 3 optimizers: slots come from `add_variable_from_reference`."""

    _de_family = "keras3"

    def update_step(self, gradient, variable, learning_rate):
        wrapper = self._de_in_table(variable)
        if wrapper is None:
            return super().update_step(gradient, variable, learning_rate)
        return self._de_keras_update(wrapper, gradient, learning_rate)

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        if isinstance(reference_variable, trainable_lib.TrainableWrapper):
            return self._de_slot_buffer(reference_variable, name or "var", initializer)
        return super().add_variable_from_reference(reference_variable, name=name,
                                                   initializer=initializer)

    # `apply_gradients` calls this; so does a LossScaleOptimizer (mixed precision: Keras wraps
    # the compiled optimizer in one) that holds this optimizer.
    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            if not self.built:
                return super().apply(grads)   # Keras says what is missing
            trainable_variables = self._trainable_variables   # Keras' default: those built

        def create_slots(var_list):
            if not self.built:
                self.build(var_list)

        def apply_pairs(grads_and_vars):
            return super(Keras3Mixin, self).apply([g for g, _ in grads_and_vars],
                                                   [v for _, v in grads_and_vars])

        return self._de_apply(zip(grads, trainable_variables), create_slots, apply_pairs)

    # A `.keras` file holds the optimizer's variables by index; the slot tables (all keys' rows
    # of each slot) go beside them, named by their variable, and come back by name on loading
    # (Keras builds the optimizer, and so its slot tables, before it loads them).
    def save_own_variables(self, store):
        super().save_own_variables(store)
        for i, table in enumerate(sorted(self._de_slot_tables.values(), key=lambda t: t.name)):
            store[f"de_slot{i}_name"] = np.frombuffer(table.name.encode(), np.uint8)
            checkpoint_lib.save_to_keras_store(store, f"de_slot{i}_", table)

    def load_own_variables(self, store):
        names = [k for k in store.keys() if k.startswith("de_slot") and k.endswith("_name")]
        super().load_own_variables(
            {k: store[k] for k in store.keys() if not k.startswith("de_slot")})
        if not self.built:
            # As Keras does for the optimizer's own variables (it warned above): an optimizer
            # not built yet (`load_weights` into a model not trained yet) starts afresh.
            return
        tables = {t.name: t for t in self._de_slot_tables.values()}
        for name_key in names:
            prefix = name_key[:-len("name")]
            name = np.asarray(store[name_key]).tobytes().decode()
            if name not in tables:
                raise ValueError(f"the saved optimizer has slot table {name!r}, which this "
                                 f"optimizer does not (it has {sorted(tables)})")
            checkpoint_lib.load_from_keras_store(store, prefix, tables[name])


class LegacyKerasMixin(KerasConfigMixin, DynamicEmbeddingMixin):
    """tf_keras legacy (OptimizerV2) optimizers: slots come from `add_slot`."""

    _de_family = "legacy"

    def _resource_apply_dense(self, grad, var, apply_state=None):
        wrapper = self._de_in_table(var)
        if wrapper is None:
            return super()._resource_apply_dense(grad, var, apply_state)
        device, dtype = var.device, var.dtype.base_dtype

        def make():
            coefficients = ((apply_state or {}).get((device, dtype))
                            or self._fallback_apply_state(device, dtype))
            return table_updates.legacy_hyper(self, self._de_step_rule, dtype, coefficients)

        return self._de_defer(wrapper, grad, self._de_hyper_cache((device, dtype), make))

    def add_slot(self, var, slot_name, initializer="zeros", shape=None):
        if isinstance(var, trainable_lib.TrainableWrapper):
            slots = self._slots.setdefault(_legacy_keras_var_key(var), {})
            return self._de_filed_slot(slots, slot_name, var, slot_name, initializer)
        return super().add_slot(var, slot_name, initializer=initializer, shape=shape)

    def apply_gradients(self, grads_and_vars, name=None, **kwargs):
        def apply(pairs):
            return super(LegacyKerasMixin, self).apply_gradients(pairs, name=name, **kwargs)

        def create_slots(var_list):
            with tf.init_scope():  # as tf_keras itself: outside any function or replica context
                self._create_all_weights(var_list)

        return self._de_apply(grads_and_vars, create_slots, apply)

    def _aggregate_gradients(self, grads_and_vars):
        # A wrapper's gradient is for its own replica's batch rows: it is never summed across
        # replicas (under a ParameterServerStrategy a wrapper is worker-local and has no device
        # to reduce to). Dense variables are aggregated as usual.
        pairs = list(grads_and_vars)
        dense = [(g, v) for g, v in pairs if not isinstance(v, trainable_lib.TrainableWrapper)]
        reduced = iter(super()._aggregate_gradients(dense) if dense else [])
        return [(g, v) if isinstance(v, trainable_lib.TrainableWrapper) else next(reduced)
                for g, v in pairs]


class NewTfKerasMixin(KerasConfigMixin, KerasUpdateMixin, DynamicEmbeddingMixin):
    """tf_keras (non-legacy) optimizers: slots come from `add_variable_from_reference`."""

    _de_family = "tf_keras"

    def update_step(self, gradient, variable):
        wrapper = self._de_in_table(variable)
        if wrapper is None:
            return super().update_step(gradient, variable)
        return self._de_keras_update(wrapper, gradient, self.learning_rate)

    def add_variable_from_reference(self, model_variable, variable_name, shape=None,
                                    initial_value=None):
        if isinstance(model_variable, _StaticShapeView):
            return self._de_slot_buffer(model_variable.wrapper, variable_name,
                                        0.0 if initial_value is None else initial_value)
        return super().add_variable_from_reference(model_variable, variable_name, shape=shape,
                                                   initial_value=initial_value)

    def apply_gradients(self, grads_and_vars, name=None, **kwargs):
        def create_slots(var_list):
            if not getattr(self, "_built", False):
                with tf.init_scope():
                    self.build(_static_views(var_list))

        def apply(pairs):
            return super(NewTfKerasMixin, self).apply_gradients(pairs, name=name, **kwargs)

        return self._de_apply(grads_and_vars, create_slots, apply)


class _StaticShapeView:
    """A wrapper seen with a one-row static shape.

    Some optimizers size new slots from the variable's static shape (`tf.fill(var.shape, c)`,
    `tf.constant(c, shape=var.get_shape())`), which a wrapper only knows per batch. They create
    slots from this view; the slot hooks map it back to the wrapper and keep only the constant.
    """

    def __init__(self, wrapper):
        self.wrapper = wrapper
        self.shape = tf.TensorShape([1, wrapper.params.dim])

    def get_shape(self):
        return self.shape

    def __getattr__(self, name):
        return getattr(self.wrapper, name)


class _ColocateWith:
    """A resource handle seen as a resource variable by `colocate_with` (its handle's op) and
    by tf.compat.v1 optimizers (which then make resource variables next to it)."""

    _should_act_as_resource_variable = True

    def __init__(self, handle):
        self.handle = handle
        self.device = handle.device
        self.name = handle.name
        self.graph = handle.graph


def _static_views(var_list):
    return [_StaticShapeView(v) if isinstance(v, trainable_lib.TrainableWrapper) else v
            for v in var_list]


def _wrapper_of(var):
    """The TrainableWrapper behind `var` (itself or a static view of it), else None."""
    if isinstance(var, _StaticShapeView):
        return var.wrapper
    return var if isinstance(var, trainable_lib.TrainableWrapper) else None


def mixin_for(optimizer):
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return V1Mixin
    keras = sys.modules.get("keras")
    if keras is not None and isinstance(optimizer, keras.optimizers.Optimizer):
        return Keras3Mixin
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None:
        if isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
            return LegacyKerasMixin
        if isinstance(optimizer, tf_keras.optimizers.Optimizer):
            return NewTfKerasMixin
    # TF's own frozen copy of the Keras 2 optimizers (tensorflow.python.keras, TF <= 2.21):
    # TFRA code and tests import optimizers from there; the API is tf_keras' legacy one.
    tf_optimizer_v2 = _tf_private.loaded_tf_keras_optimizer_v2_class()
    if tf_optimizer_v2 is not None and isinstance(optimizer, tf_optimizer_v2):
        return LegacyKerasMixin
    raise TypeError(
        f"DynamicEmbeddingOptimizer needs a tf.compat.v1.train, Keras 3 or tf_keras optimizer; "
        f"got {type(optimizer).__module__}.{type(optimizer).__name__}")


def _v1_var_key(var):
    # The key tf.compat.v1.train.Optimizer files slots under (its private `_var_key`).
    if hasattr(var, "op") and not tf.executing_eagerly():
        return (var.op.graph, var.op.name)
    return _tf_private.variable_unique_id(var)


def _legacy_keras_var_key(var):
    return _tf_private.variable_unique_id(var)  # tf_keras' slot key
