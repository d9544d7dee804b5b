"""What every optimizer family's wrapping shares (see `optimizer/__init__.py`): the class made
for an optimizer (`wrap`), its slot tables and slot buffers, and the step (`_de_apply`): the
update applied in the tables where it can be (table_updates.py), otherwise prefetch of slot rows,
the optimizer's own update and the write-back. The families' hooks are in families.py.

Example:
    >>> import tensorflow as tf
    >>> opt = wrap(tf.keras.optimizers.SGD(0.1), DynamicEmbeddingMixin, None, False, True)
    >>> isinstance(opt, DynamicEmbeddingMixin), type(opt).__name__
    (True, 'SGD')
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


def wrapped_class(mixin, base):
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
            legacy = getattr(mixin, "_de_family", None) == "legacy" and package == "tf_keras"
            sys.modules[package].saving.register_keras_serializable(
                package=REGISTERED_PACKAGE,
                name=("legacy." if legacy else "") + base.__name__)(wrapped)
        _WRAPPED[key] = wrapped
    return _WRAPPED[key]


def wrap(optimizer, mixin, bp_v2, synchronous, apply_in_tables):
    """`optimizer` re-classed with `mixin` (once) and given this package's per-optimizer state;
    returns it. `DynamicEmbeddingOptimizer` checks the arguments and picks the mixin."""
    if not isinstance(optimizer, DynamicEmbeddingMixin):
        optimizer.__class__ = wrapped_class(mixin, type(optimizer))
        object.__setattr__(optimizer, "_de_slot_tables", {})   # (embedding, slot) -> slot de.Variable
        object.__setattr__(optimizer, "_de_buffers", {})       # wrapper -> [slot TrainableWrapper]
    object.__setattr__(optimizer, "_de_bp_v2", bp_v2)
    object.__setattr__(optimizer, "_de_synchronous", synchronous)
    object.__setattr__(optimizer, "_de_in_tables", apply_in_tables)
    object.__setattr__(optimizer, "_de_fused", frozenset())   # refs of wrappers updated in tables
    object.__setattr__(optimizer, "_de_pending", [])          # their table_updates.Pending
    return optimizer


class DynamicEmbeddingMixin:
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
