"""`DynamicEmbeddingOptimizer(opt)`: lets any TensorFlow optimizer train `de.Variable`s.

The optimizer keeps its class, hyper-parameters and update math; `DynamicEmbeddingOptimizer`
re-classes it to a subclass that, for each `TrainableWrapper` among the variables:

1. creates the optimizer's slots for it as `de.Variable`s (same dim, devices, partitioner and
   backend as the embedding, named `<embedding>/<optimizer>/<slot>`), plus per-lookup slot
   buffers that hold the slot rows of the batch's ids;
2. before the update, loads the slot rows of the batch's ids into the buffers (new ids start at
   the slot's initial value: zeros, Adagrad's `initial_accumulator_value`, RMSProp's ones, ...);
3. runs the optimizer's own update on the wrapper and buffers, like on any dense variable;
4. writes the trained rows and every slot's rows back to their tables. Only this creates rows.

Updates are lazy: rows and slot rows of ids not in the batch are untouched, so optimizers whose
sparse update is row-local (SGD, Momentum, Adagrad, RMSProp, Ftrl, ...) match a dense embedding
exactly, and Adam-like optimizers match their lazy variant (bias correction uses the optimizer's
global step). Repeated ids in a batch have their gradients summed, as the dense path does.

Supported families: `tf.compat.v1.train` optimizers (graph and eager), Keras 3 optimizers (the
default `tf.keras`) and tf_keras optimizers, legacy and new.

Example:
    >>> import tensorflow as tf
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> w = de.Variable(dim=2, initializer=1.0)
    >>> ids = tf.constant([1, 2], tf.int64)
    >>> opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.25))
    >>> with tf.GradientTape() as tape:
    ...     emb, wrapper = de.embedding_lookup(w, ids, return_trainable=True)
    ...     loss = tf.reduce_sum(emb ** 2)
    >>> _ = opt.apply_gradients(zip(tape.gradient(loss, [wrapper]), [wrapper]))
    >>> de.embedding_lookup(w, ids).numpy()      # 1 - 0.25 * 2
    array([[0.5, 0.5],
           [0.5, 0.5]], dtype=float32)
"""

import contextlib
import importlib
import sys

import numpy as np
import tensorflow as tf

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding import checkpoint as checkpoint_lib
from tfra_dynamic_embedding import table_updates
from tfra_dynamic_embedding import trainable as trainable_lib
from tfra_dynamic_embedding import variable as variable_lib


# pylint: disable-next=invalid-name  (TFRA's public name)
def DynamicEmbeddingOptimizer(self, bp_v2=None, synchronous=False, apply_in_tables=True):
    """Returns `self`, re-classed so that it also trains `de.Variable`s (see module docstring).

    bp_v2: None (each variable's own `bp_v2`), or True / False for every variable it trains:
      True adds each step's row updates to the tables instead of overwriting the rows.
    synchronous: TFRA's synchronous Horovod training: every step sums the dense (non-embedding)
      gradients over the Horovod ranks (`hvd.allreduce`) before applying them; embedding rows
      are each rank's own. With one rank nothing is summed; without Horovod the step raises.
    apply_in_tables: apply the update where the tables live, sending only ids and gradients
      (table_updates.py), for the optimizers and variables that path serves; False keeps every
      update on the trainer (read rows and slots, update, write back).
    """
    if bp_v2 is not None and not isinstance(bp_v2, bool):
        raise ValueError(f"bp_v2 must be None or a bool; got {bp_v2!r}")
    if not isinstance(synchronous, bool):
        raise ValueError(f"synchronous must be a bool; got {synchronous!r}")
    if not isinstance(apply_in_tables, bool):
        raise ValueError(f"apply_in_tables must be a bool; got {apply_in_tables!r}")
    if not isinstance(self, _DynamicEmbeddingMixin):
        self.__class__ = _wrapped_class(_mixin_for(self), type(self))
        object.__setattr__(self, "_de_slot_tables", {})   # (embedding, slot) -> slot de.Variable
        object.__setattr__(self, "_de_buffers", {})       # wrapper -> [slot TrainableWrapper]
    object.__setattr__(self, "_de_bp_v2", bp_v2)
    object.__setattr__(self, "_de_synchronous", synchronous)
    object.__setattr__(self, "_de_in_tables", apply_in_tables)
    object.__setattr__(self, "_de_fused", frozenset())   # refs of wrappers updated in tables
    object.__setattr__(self, "_de_pending", [])          # their table_updates.Pending
    return self


def _horovod():
    """`horovod.tensorflow` for `synchronous=True`, imported only then (it loads MPI); a
    ValueError when Horovod is missing. (TFRA's other Horovod utilities: compat/horovod.py.)"""
    try:
        return importlib.import_module("horovod.tensorflow")
    except ImportError as error:
        raise ValueError("Horovod is not installed (`import horovod.tensorflow` failed); "
                         "DynamicEmbeddingOptimizer(synchronous=True) needs it: install Horovod "
                         "built for this TensorFlow, or train across processes with parameter "
                         "servers (docs/distributed.md)") from error


def _summed_over_horovod_ranks(grads_and_vars):
    """`synchronous=True`: dense gradients summed over the Horovod ranks (as dense tensors, as
    TFRA does), wrappers' gradients left as they are; unchanged with one rank."""
    hvd = _horovod()
    if hvd.size() <= 1:
        return grads_and_vars
    summed = []
    for g, v in grads_and_vars:
        if g is not None and not isinstance(v, trainable_lib.TrainableWrapper):
            with tf.device(v.device):
                g = hvd.allreduce(tf.convert_to_tensor(g), op=hvd.Sum)
        summed.append((g, v))
    return summed


_WRAPPED = {}   # (mixin, optimizer class) -> their subclass
REGISTERED_PACKAGE = "tfra_dynamic_embedding"   # Keras' registry: "<package>>Adam"


def _wrapped_class(mixin, base):
    """`base`'s subclass with `mixin`, made once. It keeps `base`'s name and module, so configs and
    logs read as before; a Keras optimizer's is registered with its Keras under
    "tfra_dynamic_embedding>" + the name, so a saved model's optimizer loads wrapped again."""
    key = (mixin, base)
    if key not in _WRAPPED:
        wrapped = type(base.__name__, (mixin, base),
                       {"__module__": base.__module__, "__qualname__": base.__qualname__})
        package = base.__module__.split(".")[0]
        if package in ("keras", "tf_keras"):
            # tf_keras' legacy and new optimizers share names in one registry.
            legacy = mixin is _LegacyKerasMixin and package == "tf_keras"
            sys.modules[package].saving.register_keras_serializable(
                package=REGISTERED_PACKAGE,
                name=("legacy." if legacy else "") + base.__name__)(wrapped)
        _WRAPPED[key] = wrapped
    return _WRAPPED[key]


def register_keras_optimizers():
    """Registers the wrapped class of every optimizer of each installed Keras (Keras 3, tf_keras
    and its legacy ones) now, so that a process that loads a saved model before wrapping any
    optimizer (`tf.keras.models.load_model` of a compiled model) finds them."""
    families = [("keras", "keras.optimizers", _Keras3Mixin),
                ("tf_keras", "tf_keras.optimizers", _NewTfKerasMixin),
                ("tf_keras", "tf_keras.optimizers.legacy", _LegacyKerasMixin)]
    for package, module_name, mixin in families:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if package == "keras" and not getattr(sys.modules["keras"], "__version__",
                                                "").startswith("3."):
            continue
        base = module.Optimizer
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, base) and value is not base
                    and value.__module__.split(".")[0] == package
                    and "LossScale" not in value.__name__):
                _wrapped_class(mixin, value)


class _DynamicEmbeddingMixin:
    """What every family shares: slot tables, slot buffers, prefetch and write-back."""

    def _lookup_dependency(self, name, cached_dependencies=None):
        found = super()._lookup_dependency(name, cached_dependencies)
        if found is None:   # a slot as TFRA's checkpoints name it (checkpoint.py)
            found = next((table for (params, slot_name), table
                          in getattr(self, "_de_slot_tables", {}).items()
                          if checkpoint_lib.names_tfra_slot(name, params.name, slot_name)), None)
        return found

    def _de_slot_buffer(self, wrapper, slot_name, initializer, track=True):
        """The buffer holding `slot_name` rows of `wrapper`'s ids, creating its table if new."""
        params = wrapper.params
        key = (params, slot_name)   # the object, not its id: a later variable may reuse an id
        table = self._de_slot_tables.get(key)
        if table is None:
            fill = _fill_value(initializer, params.value_dtype, params.dim)
            name = (f"{params.name}/{slot_name}" if params.short_file_name
                    else f"{params.name}/{_optimizer_name(self)}/{slot_name}")
            table = variable_lib.Variable(
                key_dtype=params.key_dtype, value_dtype=params.value_dtype, dim=params.dim,
                devices=params.devices, partitioner=params.partition_fn, name=name,
                initializer=fill, trainable=False, checkpoint=params.checkpoint,
                kv_creator=params.slot_creator(fill))
            table.set_slot_of(params)
            self._de_slot_tables[key] = table
            # A checkpoint dependency of the optimizer, restored on creation if restore() ran.
            self._track_trackable(table, name=f"de_slot/{params.name}/{slot_name}")
            for deferred in list(getattr(self, "_deferred_dependencies", {})):
                if checkpoint_lib.names_tfra_slot(deferred, params.name, slot_name):
                    self._handle_deferred_dependencies(name=deferred, trackable=table)
            if params.restrict_policy is not None:   # evictions remove the slot's rows too
                params.restrict_policy.track_slots([table])
        # A tf.compat.v1 graph: the buffer lives with its wrapper (a worker's own cache), not
        # where the enclosing scope sends variables (a replica_device_setter's PS, where every
        # worker's graph would share one buffer).
        in_graph = (not tf.executing_eagerly()
                    and not tf.compat.v1.get_default_graph().building_function)
        with (tf.compat.v1.device(wrapper.device or None) if in_graph
              else contextlib.nullcontext()):
            buffer = trainable_lib.TrainableWrapper(
                table, name=f"{wrapper.name.split(':')[0]}/{slot_name}", trainable=False,
                track=track, ps_strategy=wrapper.ps_strategy)  # worker-local as its wrapper
        self._de_buffers.setdefault(wrapper.ref(), []).append(buffer)
        return buffer

    def _de_filed_slot(self, slots, key, wrapper, slot_name, initializer):
        """The buffer at `slots[key]`, made if new, for optimizers (tf.compat.v1, tf_keras
        legacy) that checkpoint slots themselves as slot variables of the primary variable."""
        if key not in slots:
            if _is_restore_request(initializer):
                return None  # the optimizer then defers the restore until a step makes the slot
            buffer = self._de_slot_buffer(wrapper, slot_name, initializer, track=False)
            self._restore_slot_variable(slot_name=slot_name, variable=wrapper,
                                        slot_variable=buffer)
            slots[key] = buffer
        return slots[key]

    def _de_apply(self, grads_and_vars, create_slots, apply):
        """Runs `apply(grads_and_vars)` between prefetching slot rows and writing rows back."""
        grads_and_vars = list(grads_and_vars)
        if getattr(self, "_de_synchronous", False):
            grads_and_vars = _summed_over_horovod_ranks(grads_and_vars)
        wrappers = []
        for g, v in grads_and_vars:
            if not isinstance(v, trainable_lib.TrainableWrapper):
                continue
            if g is None:   # a wrapper the loss skipped this step: its step ends too
                v.end_step()
                continue
            # TF's v1 kernels abort the process on a mismatch (a CHECK), so refuse it here.
            if tf.as_dtype(g.dtype).base_dtype != v.dtype.base_dtype:
                raise TypeError(f"the gradient of {v.name} (rows of {v.params.name}) must be "
                                f"{v.dtype.base_dtype.name} like its rows; got "
                                f"{tf.as_dtype(g.dtype).name}")
            wrappers.append(v)
        if not wrappers:
            return apply(grads_and_vars)
        create_slots([v for g, v in grads_and_vars if g is not None])
        rule = self._de_rule() if getattr(self, "_de_in_tables", True) else None
        fused = frozenset(w.ref() for w in wrappers
                          if table_updates.takes_path(w, rule, self._de_slot_tables))
        in_tables = [w for w in wrappers if w.ref() in fused]
        wrappers = [w for w in wrappers if w.ref() not in fused]
        # Slots kept in their variable's records (native backend) are read with one probe
        # per key for all of them, and written back with the rows in one more.
        groups = {w.ref(): w.params.slot_groups(
            [b.params for b in self._de_buffers.get(w.ref(), [])]) for w in wrappers}
        prefetch = []
        for w in wrappers:
            buffers = self._de_buffers.get(w.ref(), [])
            if buffers and groups[w.ref()] is not None:
                ids = w.batch_ids()
                rows = w.params.lookup_groups(ids, groups[w.ref()])
                prefetch += [b.hold(ids, r) for b, r in zip(buffers, rows)]
            else:
                ids = w.batch_ids()
                prefetch += [b.hold(ids, b.params.lookup(ids)) for b in buffers]
        # bp_v2 writes back the change: keep the rows as looked up, read before the update.
        looked_up = {w.ref(): tf.identity(w.held_rows()) for w in wrappers
                     if (w.params.bp_v2 if self._de_bp_v2 is None else self._de_bp_v2)}
        # A wrapper holds exactly the batch's unique rows, so the optimizer's dense update of
        # them, with repeated ids' gradients summed, is its sparse update with repeated indices
        # combined (what the dense path does; Keras 3 and tf_keras would not combine them), run
        # as one fused apply op per variable instead of dedup, decay and scatter ops per slot.
        grads_and_vars = [
            (_summed_rows(g, v) if isinstance(v, trainable_lib.TrainableWrapper) else g, v)
            for g, v in grads_and_vars]
        object.__setattr__(self, "_de_fused", fused)
        object.__setattr__(self, "_de_step_rule", rule)   # read by the families' hooks
        object.__setattr__(self, "_de_hypers", {})
        try:
            with tf.control_dependencies(prefetch + list(looked_up.values())):
                result = apply(grads_and_vars)
            pending, self._de_pending[:] = list(self._de_pending), []
        finally:
            object.__setattr__(self, "_de_fused", frozenset())
            object.__setattr__(self, "_de_hypers", {})
        after = [result] if isinstance(result, (tf.Operation, tf.Tensor)) else []
        with tf.control_dependencies(after):
            online = {w.ref(): self._de_online(w) for w in wrappers + in_tables}
            keep = {ref: mask for ref, (mask, _, _) in online.items()}
            room = [op for _, ops, _ in online.values() for op in ops if op is not None]
        with tf.control_dependencies(after + room):
            # The updates in tables: one op per device (all its tables), ids and gradients sent.
            writes = table_updates.apply_pending(pending, self._de_slot_tables, keep)
            for w in in_tables:
                w.end_step()
            for w in wrappers:
                buffers = self._de_buffers.get(w.ref(), [])
                if buffers and groups[w.ref()] is not None and w.ref() not in looked_up:
                    writes.append(_write_back_in_records(w, buffers, groups[w.ref()],
                                                         keep[w.ref()]))
                else:
                    row_write = w.write_back(looked_up.get(w.ref()), keep[w.ref()])
                    writes.append(row_write)
                    # Slots in the rows' records (bp_v2 here) are other resources of the same
                    # records: written first, they would create a new key's record, and the
                    # row's write-back would then add its change to a blank row.
                    shared = groups[w.ref()] is not None and row_write is not None
                    with tf.control_dependencies([row_write] if shared else []):
                        writes += [b.write_back(keep=keep[w.ref()]) for b in buffers]
            writes += [self._de_restrict_update(w, keep[w.ref()]) for w in wrappers + in_tables]
        with tf.control_dependencies([op for op in writes if op is not None]):
            writes += [trim() for _, _, trim in online.values() if trim is not None]
        if tf.compat.v1.executing_eagerly_outside_functions():
            return result  # eager runs in order; tf.function orders and runs stateful ops itself
        # A tf.compat.v1 graph: the returned op must also run the write-back.
        with tf.control_dependencies([op for op in writes if op is not None]):
            return tf.identity(result) if isinstance(result, tf.Tensor) else tf.group(*after)

    def _de_rule(self):
        """This optimizer's `table_updates.Rule`, or None (its updates stay on the trainer)."""
        return table_updates.rule_of(self, type(self).__bases__[-1], self._de_family)

    def _de_in_table(self, var):
        """The wrapper `var` when this step applies its update in its tables, else None."""
        if (isinstance(var, trainable_lib.TrainableWrapper)
                and var.ref() in getattr(self, "_de_fused", ())):
            return var
        return None

    def _de_hyper_cache(self, key, make):
        """This step's hyper-parameter vector for `key` (e.g. the dtype), made once by `make`, so
        that the tables sharing it go into one op."""
        cache = self._de_hypers
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def _de_defer(self, wrapper, grad, hyper):
        """Queues `wrapper`'s update for `_de_apply` (which groups them per device); returns an
        op that reads this step's hyper-parameters (before the optimizer moves its counters)."""
        self._de_pending.append(table_updates.Pending(wrapper, grad, self._de_step_rule, hyper))
        return tf.group(hyper)

    def _de_online(self, wrapper):
        """(keep mask over the batch ids or None, ops to run before the write-back, None or
        a function making the op to run after it): the variable's admission filter (held and
        newly admitted ids are written) and its `de.Eviction` (room made in the variable, its
        slot tables and its restrict status, sharing one presence lookup of the step's ids;
        after the write-back, the bound restored where concurrent steps went over it)."""
        params = wrapper.params
        admission, eviction = params.admission_filter, params.eviction_state
        if admission is None and eviction is None:
            return None, [], None
        ids, exists, keep, ops = wrapper.batch_ids(), None, None, []
        if admission is not None or eviction.caps is not None:
            exists = params.contains(ids)
        if admission is not None:
            keep, update = admission.admit(ids, exists)
            ops.append(update)
            ids, exists = tf.boolean_mask(ids, keep), tf.boolean_mask(exists, keep)
        if eviction is not None:
            # Slots kept in the variable's records lose the evicted keys with it.
            companions = [table for (slot_params, _), table in self._de_slot_tables.items()
                          if slot_params is params and params.slot_groups([table]) is None]
            if params.restrict_policy is not None:
                companions.append(params.restrict_policy.status)
            ops.append(eviction.make_room(ids, companions, exists))
            if eviction.caps is not None:
                return keep, ops, lambda: eviction.trim(ids, companions)
        return keep, ops, None

    def _de_restrict_update(self, wrapper, keep=None):
        """Updates the restrict policy's status of the trained ids (None without a policy; its
        slot tables were given to it when `_de_slot_buffer` made them)."""
        policy = wrapper.params.restrict_policy
        if policy is None:
            return None
        ids = wrapper.batch_ids()
        return policy.after_write(ids if keep is None else tf.boolean_mask(ids, keep))

    def get_slot_variables(self, params):
        """The slot `de.Variable`s this optimizer created for embedding `params`."""
        return [t for (owner, _), t in self._de_slot_tables.items() if owner is params]


class _V1Mixin(_DynamicEmbeddingMixin):
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
            return super(_V1Mixin, self).apply_gradients(pairs, global_step, name, **kwargs)

        return self._de_apply(grads_and_vars, create_slots, apply)


class _KerasConfigMixin:
    """A Keras optimizer's config names it wrapped (see `_wrapped_class`); `from_config` wraps
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
        plain = cls.__bases__[-1]   # the optimizer's own class (see _wrapped_class)
        return DynamicEmbeddingOptimizer(plain.from_config(config, custom_objects=custom_objects),
                                         bp_v2=bp_v2, synchronous=synchronous)


class _KerasUpdateMixin:
    """Keras 3 and tf_keras (non-legacy): a wrapper updated in its tables takes its weight
    decay there too (the factor goes with the step's numbers)."""

    def _use_weight_decay(self, variable):
        if self._de_in_table(variable) is not None:
            return False
        return super()._use_weight_decay(variable)

    def _de_keras_update(self, wrapper, gradient, learning_rate):
        dtype = wrapper.dtype.base_dtype
        decays = (self.weight_decay is not None
                  and super(_KerasUpdateMixin, self)._use_weight_decay(wrapper))

        def make():
            decay = (tf.cast(learning_rate, dtype) * tf.cast(self.weight_decay, dtype)
                     if decays else 0.0)
            return table_updates.keras_hyper(self, self._de_step_rule, dtype, learning_rate, decay)

        return self._de_defer(wrapper, gradient, self._de_hyper_cache((dtype, decays), make))


class _Keras3Mixin(_KerasConfigMixin, _KerasUpdateMixin, _DynamicEmbeddingMixin):
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
            return super(_Keras3Mixin, self).apply([g for g, _ in grads_and_vars],
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


class _LegacyKerasMixin(_KerasConfigMixin, _DynamicEmbeddingMixin):
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
            return super(_LegacyKerasMixin, self).apply_gradients(pairs, name=name, **kwargs)

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


class _NewTfKerasMixin(_KerasConfigMixin, _KerasUpdateMixin, _DynamicEmbeddingMixin):
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
            return super(_NewTfKerasMixin, self).apply_gradients(pairs, name=name, **kwargs)

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


def _mixin_for(optimizer):
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return _V1Mixin
    keras = sys.modules.get("keras")
    if keras is not None and isinstance(optimizer, keras.optimizers.Optimizer):
        return _Keras3Mixin
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None:
        if isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
            return _LegacyKerasMixin
        if isinstance(optimizer, tf_keras.optimizers.Optimizer):
            return _NewTfKerasMixin
    # TF's own frozen copy of the Keras 2 optimizers (tensorflow.python.keras, TF <= 2.21):
    # TFRA code and tests import optimizers from there; the API is tf_keras' legacy one.
    tf_optimizer_v2 = _tf_private.loaded_tf_keras_optimizer_v2_class()
    if tf_optimizer_v2 is not None and isinstance(optimizer, tf_optimizer_v2):
        return _LegacyKerasMixin
    raise TypeError(
        f"DynamicEmbeddingOptimizer needs a tf.compat.v1.train, Keras 3 or tf_keras optimizer; "
        f"got {type(optimizer).__module__}.{type(optimizer).__name__}")


def _write_back_in_records(wrapper, buffers, groups, keep):
    """Writes the wrapper's rows and its slot buffers' rows into the records of its variable
    (slot `groups`), one probe per key; `keep` (a bool mask or None) as in `write_back`."""
    ids = wrapper.batch_ids()
    rows = [held.held_rows() for held in [wrapper] + buffers]
    for held in [wrapper] + buffers:
        held.end_step()
    if keep is not None:
        ids, rows = tf.boolean_mask(ids, keep), [tf.boolean_mask(r, keep) for r in rows]
    return wrapper.params.upsert_groups(ids, rows, [0] + list(groups))


def _summed_rows(grad, wrapper):
    """A gradient over wrapper rows as a dense `[rows, dim]` tensor, repeated rows summed."""
    if isinstance(grad, tf.IndexedSlices):
        rows = tf.shape(wrapper, out_type=grad.indices.dtype)[0]
        return tf.math.unsorted_segment_sum(grad.values, grad.indices, rows)
    return grad


def _is_restore_request(initializer):
    """Whether a slot is being made only to receive a checkpoint value (on restore).

    A wrapper's slot buffer needs the slot's start value, which only the optimizer's own slot
    creation gives, so these requests are declined and the optimizer queues the restore.
    """
    return isinstance(initializer, _tf_private.CheckpointInitialValueCallable)


def _v1_var_key(var):
    # The key tf.compat.v1.train.Optimizer files slots under (its private `_var_key`).
    if hasattr(var, "op") and not tf.executing_eagerly():
        return (var.op.graph, var.op.name)
    return _tf_private.variable_unique_id(var)


def _legacy_keras_var_key(var):
    return _tf_private.variable_unique_id(var)  # tf_keras' slot key


def _optimizer_name(optimizer):
    name = getattr(optimizer, "_name", None) or getattr(optimizer, "name", None)
    return str(name or type(optimizer).__name__)


_NAMED_FILLS = {"zeros": 0.0, "ones": 1.0}


def _fill_value(initializer, dtype, dim):
    """The constant an optimizer fills a new slot with; new keys' slot rows start from it.

    Optimizers describe a slot's start as an initializer object or name, a zero-argument
    callable, or a tensor shaped like the variable; all of them fill with one constant.
    """
    value = initializer
    if isinstance(value, str):
        value = _NAMED_FILLS[value] if value in _NAMED_FILLS else tf.keras.initializers.get(value)
    if callable(value) and not isinstance(value, (tf.Tensor, tf.Variable)):
        # Evaluated eagerly even while a graph or tf.function is being built: the initializer
        # only makes constants, and an eager result is a plain number to read.
        with _tf_private.eager_mode():
            try:
                value = value(shape=[1, dim], dtype=dtype)
            except TypeError:
                value = value()
    static = _static_value(value)
    if static is not None:
        distinct = np.unique(np.asarray(static, dtype=np.float64))
        if distinct.size == 1:
            return float(distinct[0])
    raise ValueError(
        f"optimizer slot initializer {initializer!r} must fill the slot with one constant for "
        f"dynamic embeddings (new keys' slot rows start from it)")


def _static_value(value):
    """A numpy value for a constant tensor, following Cast/Fill/OnesLike/ZerosLike in graphs."""
    if isinstance(value, (int, float, np.ndarray, np.number)):
        return np.asarray(value)
    if hasattr(value, "numpy") and tf.executing_eagerly():
        return value.numpy()
    static = tf.get_static_value(value)
    if static is not None:
        return static
    op = getattr(value, "op", None)
    while op is not None and op.type in ("Cast", "Identity"):
        op = op.inputs[0].op
    if op is None:
        return None
    if op.type == "OnesLike":
        return np.ones(1)
    if op.type == "ZerosLike":
        return np.zeros(1)
    if op.type == "Fill":
        return tf.get_static_value(op.inputs[1])
    return None
