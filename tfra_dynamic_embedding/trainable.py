"""`TrainableWrapper`: the rows a batch looks up, as a variable any TensorFlow optimizer can train.

A `de.Variable` is a hash table, which optimizers cannot train. Each lookup site of a trainable
`de.Variable` owns a `TrainableWrapper`, a ResourceVariable of shape `[None, dim]`: every lookup
(every `Session.run` in graph mode, every call in eager mode / `tf.function`) assigns it the rows
of the batch's unique ids, and the embeddings are gathered from it. Gradients w.r.t. it are
IndexedSlices over those rows; `de.DynamicEmbeddingOptimizer` trains it and writes the rows back.

A wrapper holds rows; it does not fetch them. A lookup (embedding_ops) asks it which ids to hold
(`ids_to_load`), reads their rows through the variable and its tables, and hands them to `hold`.

Example:
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> w = de.Variable(dim=2, initializer=1.0)
    >>> ids = tf.constant([4, 4, 9], tf.int64)
    >>> with tf.GradientTape() as tape:
    ...     emb, wrapper = de.embedding_lookup(w, ids, return_trainable=True)
    ...     loss = tf.reduce_sum(emb)
    >>> grads = tape.gradient(loss, [wrapper])      # IndexedSlices over wrapper rows
    >>> type(grads[0]).__name__, wrapper.batch_ids().numpy()
    ('IndexedSlices', array([4, 9]))
"""

import contextlib
import itertools
import weakref

import numpy as np
import tensorflow as tf

# could_possibly_record and ResourceVariable have no public API: see _tf_private.py.
from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding.tables import stock_lookups


class _WorkerLocal:
    """A ResourceVariable that, made under a `tf.distribute.ParameterServerStrategy`, is each
    worker's own inside functions: there its handle is a placeholder fed, each time the
    coordinator dispatches the function to a worker, with a handle of that worker's own variable
    (a by-reference capture, as TF's per-worker variables). Workers then never share a batch's
    rows; functions nested in the scheduled one (a model's `@tf.function call`) share its
    placeholder, so gradients taken outside reach reads made inside; and no function captures
    the coordinator's variable (TensorFlow aborts a worker that receives a remote resource
    handle of unknown shape)."""

    def _set_worker_local(self, local):
        self._worker_local_name = f"tfra_de_worker_local/{next(_LOCAL_IDS)}" if local else None
        # worker index -> (cluster connection, that worker's handle), made once per connection
        self._worker_handles = {}

    @property
    def ps_strategy(self):
        """The ParameterServerStrategy whose workers each have their own copy, or None."""
        return self._distribute_strategy if self._worker_local_name else None

    @property
    def handle(self):
        name = self.__dict__.get("_worker_local_name")
        if name is None or tf.executing_eagerly():
            return self._handle
        graph = tf.compat.v1.get_default_graph()
        if not graph.building_function:
            return self._handle
        outer = getattr(graph, "outer_graph", None)
        if type(graph).__name__ in _CONTROL_FLOW_GRAPHS and outer is not None:
            # A tf.cond / tf.while_loop body is built and used within one trace of its caller:
            # it captures the caller's handle directly.
            with outer.as_default():
                caller_handle = self.handle
            return graph.capture(caller_handle)
        return graph.capture_call_time_value(self._dispatched_handle, _WorkerLocalSpec(self),
                                             key=("tfra_de_worker_local", name))

    def _dispatched_handle(self):
        """At each call of a function: the handle of the variable of the worker the coordinator
        dispatches it to (made there, under the dispatch's device scope), else this process's.

        A worker's handle is made once and reused while the cluster connection lasts: making it
        is a remote op, one round trip to the worker per wrapper and step otherwise. A worker
        that restarts comes back through a new connection, and gets a new handle."""
        index = _tf_private.dispatched_worker_index()
        if index is None:
            return self._handle
        connection = _tf_private.cluster_connection()
        cached = self._worker_handles.get(index)
        if cached is not None and cached[0] is connection:
            return cached[1]
        # No static shape: TensorFlow aborts on a remote handle with unknown dimensions, and a
        # made-up one would mislead the worker's graph optimizer. Inside the function the
        # handle has the variable's shape (the spec).
        handle = tf.raw_ops.VarHandleOp(dtype=self.dtype, shape=tf.TensorShape(None),
                                        shared_name=self._worker_local_name)
        self._worker_handles[index] = (connection, handle)
        return handle


_LOCAL_IDS = itertools.count()


class _WorkerLocalSpec(tf.TensorSpec):
    """The spec of a worker-local handle inside a function: a resource scalar whose handle
    data carries the variable's dtype and shape (so reads have a static shape)."""

    def __init__(self, variable):
        super().__init__([], tf.resource)
        self._variable_handle = _tf_private.resource_variable_handle(variable)

    def placeholder_value(self, placeholder_context):
        placeholder = super().placeholder_value(placeholder_context)
        _tf_private.copy_handle_data(self._variable_handle, placeholder)
        return placeholder
# tf.cond / tf.while_loop bodies (control flow v2): graphs inlined into the one trace of their
# caller.
_CONTROL_FLOW_GRAPHS = ("CondBranchFuncGraph", "WhileCondFuncGraph", "WhileBodyFuncGraph")


def _single_device_strategy(params, refuse):
    """The enclosing OneDeviceStrategy, else None. Training under a strategy of replicas
    (MirroredStrategy, even of one device, MultiWorkerMirroredStrategy, TPUStrategy) would need
    rows per replica, which wrappers do not have: `refuse` raises then, instead of a failure
    deep inside the optimizer (lookups alone work)."""
    if not tf.distribute.has_strategy():
        return None
    strategy = tf.distribute.get_strategy()
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return strategy
    if not refuse:
        return None
    raise NotImplementedError(
        f"de.Variable {params.name!r} cannot be trained under {type(strategy).__name__} "
        f"({strategy.num_replicas_in_sync} replicas); use tf.distribute.ParameterServerStrategy "
        f"(tables on the PS tasks, any number of workers), tf.compat.v1 between-graph "
        f"replication, or one replica per process")


def current_ps_strategy():
    """The current strategy (scope or replica context) if it is a ParameterServerStrategy."""
    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    if isinstance(strategy, (tf.distribute.ParameterServerStrategy,
                             tf.distribute.experimental.ParameterServerStrategy)):
        return strategy
    return None


class DEResourceVariable(_WorkerLocal, _tf_private.ResourceVariable):
    """A lookup's helper state, not a model weight: a wrapper's ids (`wrapper.ids`), with
    `_WorkerLocal`'s handle. TFRA's name, so that filters such as
    `[v for v in variables if not isinstance(v, (de.TrainableWrapper, de.DEResourceVariable))]`
    keep the dense weights only.
    """

    def __init__(self, *args, worker_local=False, **kwargs):
        self._set_worker_local(worker_local)
        super().__init__(*args, **kwargs)


class TrainableWrapper(_WorkerLocal, _tf_private.ResourceVariable):
    """The prefetched rows of `params` for the unique ids of one lookup (see module docstring).

    `track=False` leaves it out of `params`' checkpoint dependencies, for optimizers that
    checkpoint it themselves (tf.compat.v1 slot variables).

    Attributes:
      params: the `de.Variable` the rows come from and are written back to.
      ids: a variable holding the unique ids of the rows currently held.
    """

    # Whether lookups take this wrapper in place of `params` and read the rows through it (a
    # wrapper the user makes once: de.shadow_ops.ShadowVariable).
    STANDS_FOR_PARAMS = False
    # Whether it must hold the trained rows after an optimizer step (TFRA's ShadowVariable, whose
    # users read them): its update then runs on the trainer, not in the tables (table_updates.py;
    # there a wrapper keeps the rows as looked up).
    HOLDS_TRAINED_ROWS = False

    def __init__(self, params, name, trainable=True, track=True, ps_strategy=None):
        self.params = params
        # Before init_scope, which may leave the strategy's scope. Optimizers place updates with
        # `strategy.extended.colocate_vars_with(wrapper)`, which accepts only variables of that
        # strategy.
        strategy = ps_strategy or current_ps_strategy()
        local = strategy is not None
        # The variable belongs to the enclosing strategy: tf_keras checks that of every weight.
        owner = strategy if local else _single_device_strategy(params, refuse=trainable)
        self._set_worker_local(local)
        # `name` is the full name (see wrapper_name), not one inside the caller's name scope.
        root_scope = (contextlib.nullcontext() if tf.executing_eagerly()
                      else tf.compat.v1.get_default_graph().name_scope(""))
        # A OneDeviceStrategy's variables live on its device (its updates run there).
        place = (tf.device(owner.extended.worker_devices[0])
                 if isinstance(owner, tf.distribute.OneDeviceStrategy) else contextlib.nullcontext())
        with tf.init_scope(), root_scope, place:
            # Not in GLOBAL_VARIABLES: the content is transient (re-read every step), so Savers
            # and initializers leave it alone; TRAINABLE_VARIABLES lets v1 `minimize` find it.
            super().__init__(
                initial_value=tf.zeros([0, params.dim], params.value_dtype),
                shape=tf.TensorShape([None, params.dim]),
                trainable=trainable,
                name=name,
                collections=[],
                validate_shape=False,
                distribute_strategy=owner)
            # Like the rows, in no collection (`tf.Variable` would ignore `collections` and
            # land in GLOBAL_VARIABLES: a non-chief MonitoredTrainingSession would then wait
            # forever for the chief to initialize this worker-local variable).
            self.ids = DEResourceVariable(
                tf.zeros([0], params.key_dtype), shape=tf.TensorShape([None]), trainable=False,
                name=name + "_ids", validate_shape=False, collections=[], worker_local=local)
        self._open_step = None   # the step (see `load`) whose lookups the held rows serve
        if track:
            # A checkpoint dependency of `params` (saving only a placeholder): a restore then
            # also matches the wrappers that optimizers list among their variables and slots.
            params.track_wrapper(self, name)

    @property
    def shape(self):
        """`[rows held, dim]` in eager mode (so Keras can count parameters), comparing equal to
        any `[rows, dim]` (see `_HeldRowsShape`); `[None, dim]` in graphs, where the number of
        rows is only known per batch."""
        if tf.executing_eagerly():
            return _HeldRowsShape(tf.raw_ops.VariableShape(input=self.handle).numpy())
        return super().shape

    # Keras' `get_weights()` is `[v.numpy() ...]` and `set_weights(w)` is `v.assign(w[i])`:
    # the rows held are only the last batch's cache, so the array handed out remembers the
    # whole table, and assigning it back restores the table (EarlyStopping's
    # restore_best_weights, `model_b.set_weights(model_a.get_weights())`).
    def numpy(self):
        """The rows held, as a new ndarray that also remembers the content of `params` now:
        `assign` of that array (or of `np.asarray` of it) puts that content back.

        Example:
            >>> import tensorflow_recommenders_addons.dynamic_embedding as de
            >>> w = de.Variable(dim=1, initializer=1.0)
            >>> ids = tf.constant([1], tf.int64)
            >>> _ = w.upsert(ids, [[1.0]])
            >>> _, wrapper = de.embedding_lookup(w, ids, return_trainable=True)
            >>> saved = wrapper.numpy()
            >>> _ = w.upsert(ids, [[5.0]])              # training changes the table
            >>> _ = wrapper.assign(saved)               # the table is restored
            >>> w.lookup(ids).numpy()
            array([[1.]], dtype=float32)
        """
        rows = np.array(self.held_rows())   # a new array owning its data (the registry key)
        keys, values = self.params.export()
        _SNAPSHOTS.remember(rows, _TableSnapshot(keys.numpy(), values.numpy()))
        return rows

    def assign(self, value, use_locking=None, name=None, read_value=True):
        snapshot = _SNAPSHOTS.of(value)
        if snapshot is not None:
            snapshot.restore(self.params)
        return super().assign(value, use_locking=use_locking, name=name, read_value=read_value)

    def hold(self, unique_ids, rows):
        """Makes `rows` (those of `unique_ids`, read by the caller) the rows held; returns an
        op (graph mode) that later reads of this wrapper must depend on."""
        with _outside_xla_clusters():
            loaded = tf.group(self.ids.assign(unique_ids, read_value=False),
                              self.assign(rows, read_value=False))
        if loaded is not None:  # graph building: remember it for batch_ids()
            self._loaded = loaded
        return loaded

    def ids_to_load(self, unique_ids):
        """The ids whose rows one lookup of `unique_ids` must hold, and where its own rows will
        sit: (ids, positions). The caller reads the rows of `ids` and hands them to `hold`;
        the wrapper never reads a table.

        The first lookup of a step replaces the rows held (`ids` is `unique_ids`, `positions`
        None: row i is `unique_ids[i]`). Later lookups of the same step -- one name used twice
        in a loss, or a layer shared by two features -- add their ids after the held ones (every
        row is read again, so a held row is the table's current one), and `positions` says
        where their rows sit, so the gradients of every lookup point at their own rows. A step
        is a tf.function trace, or in eager mode the lookups under a recording GradientTape
        until the write-back (or a step whose gradient skipped this wrapper) ends it; a
        tf.compat.v1 graph gives each lookup its own wrapper.

        Example (what a lookup does, outside a step):
            >>> import tensorflow_recommenders_addons.dynamic_embedding as de
            >>> params = de.Variable(dim=2, initializer=0.5)
            >>> _, wrapper = de.embedding_lookup(params, tf.constant([1], tf.int64),
            ...                                  return_trainable=True)
            >>> ids, positions = wrapper.ids_to_load(tf.constant([3, 5], tf.int64))
            >>> ids.numpy(), positions is None
            (array([3, 5]), True)
            >>> _ = wrapper.hold(ids, params.lookup(ids))
            >>> wrapper.batch_ids().numpy()
            array([3, 5])
        """
        step = _step_marker()
        open_step = self._open_step() if self._open_step is not None else None
        if step is None or open_step is not step:
            # A weak reference: a traced graph must not live on in the wrapper.
            self._open_step = None if step is None else weakref.ref(step)
            return unique_ids, None
        held = self.batch_ids()
        all_ids, index = tf.unique(tf.concat([held, unique_ids], 0))
        return all_ids, index[tf.size(held):]

    def load_lookup(self, unique_ids):
        """Loads the rows of one lookup's `unique_ids` (initializer rows for missing ids, not
        inserted); returns (op, positions) as `ids_to_load` and `hold`. (The lookup of
        shadow_ops; embedding_ops reads the rows itself, through the variable.)"""
        ids, positions = self.ids_to_load(unique_ids)
        return self.hold(ids, self.params.lookup(ids)), positions

    def end_step(self):
        """The next lookup starts a new step (replaces the rows held)."""
        self._open_step = None

    def batch_ids(self):
        """The ids of the rows held, read after this step's lookup loaded them."""
        return self._read_loaded(self.ids)

    def held_rows(self):
        """The rows held, read after this step's lookup loaded them (what the lookup returned,
        and what gradients are taken of)."""
        with self._after_load():
            return super().read_value()

    def _read_loaded(self, variable):
        with self._after_load():
            return variable.read_value()

    def _after_load(self):
        """In the graph that loads this wrapper, a context ordering reads after the load."""
        loaded = getattr(self, "_loaded", None)
        if loaded is not None and loaded.graph is tf.compat.v1.get_default_graph():
            return tf.control_dependencies([loaded])
        return contextlib.nullcontext()

    # Every read of the wrapper in its graph -- also a user's own (`loss = wrapper * wrapper`,
    # as TFRA code writes) -- sees this step's rows: the read waits for the load.
    def value(self, do_prefetch=False):
        if do_prefetch:   # TFRA's argument: as read_value's
            return self.read_value(do_prefetch=True)
        with self._after_load():
            return super().value()

    def read_value(self, do_prefetch=True):
        """TFRA's read: `do_prefetch=True` (its default) first loads the held ids' rows again
        from the table, so the result shows writes made since the lookup; `do_prefetch=False`
        reads the rows held (`held_rows()`).

        Example:
            >>> import tensorflow_recommenders_addons.dynamic_embedding as de
            >>> var = de.Variable(dim=1, initializer=0.0)
            >>> ids = tf.constant([7], tf.int64)
            >>> _, wrapper = de.embedding_lookup(var, ids, return_trainable=True)
            >>> _ = var.upsert(ids, [[2.0]])
            >>> wrapper.read_value(do_prefetch=False).numpy()     # the rows held
            array([[0.]], dtype=float32)
            >>> wrapper.read_value().numpy()                      # the new rows (now held)
            array([[2.]], dtype=float32)
        """
        if do_prefetch:
            rows = self.prefetch_values(update=True)
            with tf.control_dependencies([rows]):
                return super().read_value()
        return self.held_rows()

    def prefetch_values(self, update=False):
        """The table's current rows of the ids held; `update=True` also holds them (TFRA's
        method: the rows a read with `do_prefetch` sees)."""
        ids = self.batch_ids()
        rows = self.params.lookup(ids)
        if not update:
            return rows
        loaded = self.hold(ids, rows)
        with tf.control_dependencies([loaded] if loaded is not None else []):
            return tf.identity(rows)

    def size(self):
        """The number of keys of the variable trained through this wrapper (TFRA's method)."""
        return self.params.size()

    def write_back(self, looked_up=None, keep=None):
        """Stores the rows held (e.g. after an optimizer update) into `params`. Given the rows
        as `looked_up` before the update (bp_v2), adds the change instead to the ids the table
        holds now, so concurrent writers' updates add up; ids it lacks get the rows held.
        `keep` (a bool mask over the ids held) writes only those rows (admission)."""
        self.end_step()
        ids, rows = self.batch_ids(), self.held_rows()
        if keep is not None:
            ids, rows = tf.boolean_mask(ids, keep), tf.boolean_mask(rows, keep)
            looked_up = None if looked_up is None else tf.boolean_mask(looked_up, keep)
        if looked_up is None:
            return self.params.upsert(ids, rows)
        # Only bp_v2 pays for this check, at write time: an id another writer inserted since
        # the lookup also gets the change added rather than overwritten.
        exists = self.params.contains(ids)
        before = tf.where(exists[:, None], looked_up, tf.zeros_like(looked_up))
        return self.params.accum(ids, rows - before)

    def update_op(self, v0=None):
        """TFRA's write-back op: stores the rows held into `params` and updates its restrict
        policy's status. A bp_v2 variable needs `v0`, the rows as looked up (the change since
        then is added). Optimizers wrapped by `de.DynamicEmbeddingOptimizer` do this themselves.

        Example (eager; in tf.compat.v1 graphs, `sess.run(wrapper.update_op())`):
            >>> import tensorflow_recommenders_addons.dynamic_embedding as de
            >>> var = de.Variable(dim=1, initializer=3.0)
            >>> _, wrapper = de.embedding_lookup(var, tf.constant([7], tf.int64),
            ...                                  return_trainable=True)
            >>> int(var.size())
            0
            >>> _ = wrapper.update_op()                 # inserts the batch's rows
            >>> int(var.size())
            1
        """
        if self.params.bp_v2 and v0 is None:
            raise ValueError(f"update_op of {self.params.name}, a bp_v2 variable, needs v0 (the "
                             f"rows as looked up); got None")
        write = self.write_back(v0 if self.params.bp_v2 else None)
        policy = self.params.restrict_policy
        if policy is None:
            return write
        with tf.control_dependencies([write] if write is not None else []):
            update = policy.after_write(self.batch_ids())
            return tf.group([op for op in (write, update) if op is not None])

    # Checkpoints and SavedModels keep a variable's standard entry, so the wrapper stays loadable
    # wherever an optimizer lists it, also by stock TensorFlow or Keras, which make a plain
    # variable of it (of its saved shape), and a slot for that or for a new wrapper (of their
    # shape, which must be fully known). The held rows are only the last batch's cache (the
    # tables are what matters, the next lookup reloads them): the entry is saved as a wrapper
    # without rows, shape and value `[0, dim]`, which fits all of these; restoring skips it.
    def _serialize_to_tensors(self):
        return {"VARIABLE_VALUE": tf.zeros([0, self.params.dim], self.dtype)}  # TF's key

    # A function traced with this wrapper (a `@tf.function` model `call` traced in training and
    # reused for a serving signature) captures its `ids` too: a SavedModel keeps them with the
    # wrapper. Checkpoints do not (the ids are the last batch's, like the rows), nor do an
    # optimizer's slot buffers: TF saves slot variables apart from the object tree, so a child
    # of theirs would be missing from it (and only the optimizer's update reads them). TF's save
    # types are strings: "checkpoint", "savedmodel".
    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        if save_type == "savedmodel" and getattr(self.params, "slot_of", None) is None:
            children = dict(children, ids=self.ids)
        return children

    def _write_object_proto(self, proto, options):
        super()._write_object_proto(proto, options)
        proto.variable.shape.CopyFrom(tf.TensorShape([0, self.params.dim]).as_proto())

    def _restore_from_tensors(self, restored_tensors):
        del restored_tensors
        return tf.no_op()


class _HeldRowsShape(tf.TensorShape):
    """A wrapper's eager shape `[rows held, dim]`: the row count is that of the last batch, so
    it compares equal (and compatible) to any 2-D shape with the same `dim`, like the
    variable's `[None, dim]`; Keras' `set_weights` then accepts rows saved at another batch."""

    def _same_dim(self, other):
        try:
            other = tf.TensorShape(other)
        except (TypeError, ValueError):
            return None
        return other.rank == 2 and other[1] == self[1]

    def __eq__(self, other):
        same = self._same_dim(other)
        return NotImplemented if same is None else same

    def __ne__(self, other):
        same = self._same_dim(other)
        return NotImplemented if same is None else not same

    def __hash__(self):
        return hash((None, self[1]))

    def is_compatible_with(self, other):
        return bool(self._same_dim(other)) or tf.TensorShape(other).rank is None


class _TableSnapshot:
    """The keys and rows of a `de.Variable` at one moment (numpy)."""

    def __init__(self, keys, values):
        self.keys, self.values = keys, values

    def restore(self, params):
        """Replaces the content of `params` with the snapshot's."""
        if tf.as_dtype(params.key_dtype).as_numpy_dtype != self.keys.dtype.type and not (
                params.key_dtype == tf.string and self.keys.dtype == object):
            raise ValueError(f"cannot restore rows with keys of dtype {self.keys.dtype} into "
                             f"{params.name}, whose key_dtype is {params.key_dtype.name}")
        if self.values.shape[1:] != (params.dim,):
            raise ValueError(f"cannot restore rows of shape {self.values.shape} into "
                             f"{params.name}, whose dim is {params.dim}")
        params.import_(tf.constant(self.keys, params.key_dtype),
                       tf.constant(self.values, params.value_dtype))


class _SnapshotRegistry:
    """Which table snapshot an array handed out by `TrainableWrapper.numpy` carries: found
    again from that array or any view of it (`np.asarray` may return either), for as long as
    the array lives."""

    def __init__(self):
        self._entries = {}   # id(array) -> (weak reference to the array, snapshot)

    def remember(self, array, snapshot):
        key = id(array)
        self._entries[key] = (weakref.ref(array), snapshot)
        weakref.finalize(array, self._entries.pop, key, None)

    def of(self, value):
        """The snapshot `value` (an array or a view of one) carries, else None."""
        if not isinstance(value, np.ndarray):
            return None
        owner = value if value.base is None else value.base
        entry = self._entries.get(id(owner))
        if entry is None or entry[0]() is not owner:
            return None
        return entry[1]


_SNAPSHOTS = _SnapshotRegistry()


def trainable_wrapper_filter(iterable_object_in, test_unaggregated_function=None):
    """Splits variables (or any items) into (others, TrainableWrappers), both tuples in input
    order (TFRA's function: e.g. to aggregate dense gradients only across workers).
    `test_unaggregated_function(item)` decides instead of "is a TrainableWrapper".

    Example:
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> w = de.Variable(dim=2)
        >>> _, wrapper = de.embedding_lookup(w, tf.constant([1], tf.int64), return_trainable=True)
        >>> bias = tf.Variable([0.0])
        >>> dense, wrappers = trainable_wrapper_filter([bias, wrapper])
        >>> dense == (bias,), wrappers == (wrapper,)
        (True, True)
    """
    test = test_unaggregated_function or (lambda item: isinstance(item, TrainableWrapper))
    dense, wrappers = [], []
    for item in iterable_object_in:
        (wrappers if test(item) else dense).append(item)
    return tuple(dense), tuple(wrappers)


class _EagerStep:
    """The marker of eager steps (a class, so that it can be weakly referenced)."""


_EAGER_STEP = _EagerStep()


def _outside_xla_clusters():
    """Keeps the ops made in it out of XLA's auto-clustering (`TF_XLA_FLAGS=--tf_xla_auto_jit=2`,
    which TFRA's demos set): a wrapper's rows and ids change shape every step, which a compiled
    cluster refuses. Nothing to do in eager mode."""
    if tf.executing_eagerly():
        return contextlib.nullcontext()
    return tf.xla.experimental.jit_scope(compile_ops=False)


def _step_marker():
    """What one training step's lookups share: the tf.function graph being traced, a marker for
    eager lookups under a recording GradientTape, or None (a tf.compat.v1 graph, where lookups
    never share a wrapper, or an eager lookup outside a tape, which replaces the rows held)."""
    if tf.executing_eagerly():
        return _EAGER_STEP if _tf_private.could_possibly_record() else None
    graph = tf.compat.v1.get_default_graph()
    return graph if graph.building_function else None


class ModelMode:
    """What lookups are built for: `TRAIN` (trainable reads) or `INFERENCE` (table reads only).

    `CURRENT_SETTING` is the mode in force, as in TFRA (code may read it directly);
    `de.enable_train_mode()` / `de.enable_inference_mode()` set it.
    """
    TRAIN = "train"
    INFERENCE = "inference"
    CURRENT_SETTING = TRAIN


def enable_train_mode():
    """Lookups of trainable variables may read through TrainableWrappers (the default)."""
    ModelMode.CURRENT_SETTING = ModelMode.TRAIN


def enable_inference_mode():
    """Lookups read the tables directly, e.g. to build a tf.compat.v1 serving graph."""
    ModelMode.CURRENT_SETTING = ModelMode.INFERENCE


def get_model_mode():
    """The current `ModelMode` value (`ModelMode.CURRENT_SETTING`)."""
    return ModelMode.CURRENT_SETTING


def needs_wrapper(params, return_trainable=False):
    """Whether a lookup of `params` should go through a TrainableWrapper.

    Yes for trainable params when the caller asks for it, in tf.compat.v1 graphs (gradients are
    taken after the graph is built) and under a recording GradientTape (eager, tf.function,
    Keras `fit`), unless inference mode is on. Plain inference (`predict`, serving signatures)
    reads the tables directly, so an exported SavedModel holds no wrapper.
    """
    if (not params.trainable or ModelMode.CURRENT_SETTING == ModelMode.INFERENCE
            or stock_lookups.current() is not None):   # traced for a stock SavedModel
        return False
    return (return_trainable or not tf.compat.v1.executing_eagerly_outside_functions()
            or _tf_private.could_possibly_record())


def wrapper_name(lookup_name):
    """The name of the wrapper of the lookup called `lookup_name` (in its variable's store):
    TFRA's `<variable scope>/<lookup name>/<lookup name>` (a tf.compat.v1 graph adds `_1`, `_2`,
    ... for further lookups of that name)."""
    scope = tf.compat.v1.get_variable_scope().name
    return f"{scope}/{lookup_name}/{lookup_name}" if scope else f"{lookup_name}/{lookup_name}"


def wrapper_for(params, name, ids=None):
    """The TrainableWrapper of `params` for the lookup called `name`, created on first use.

    In eager mode and inside `tf.function` a lookup site is known by its name, so every step
    reuses one wrapper; a tf.compat.v1 graph builds each lookup once, so each gets its own,
    placed with the lookup's `ids` (as TFRA: the rows of a batch live with the worker that
    reads them, not on the parameter server).
    """
    graph = tf.compat.v1.get_default_graph()
    in_graph = not tf.executing_eagerly() and not graph.building_function
    if in_graph:
        with graph.name_scope(""):   # unique among full names, as the wrapper will be named
            name = graph.unique_name(name, mark_as_used=False)
    wrapper = params.stored_trainable(name)   # per lookup call: no copy of the store
    if wrapper is None:
        # The ids' device, or none (not the enclosing scope's, e.g. a replica_device_setter
        # sending variables to a parameter server).
        place = (tf.compat.v1.device(ids.device or None) if in_graph and ids is not None
                 else contextlib.nullcontext())
        with place:
            wrapper = TrainableWrapper(params, name=name, trainable=params.trainable)
        params.store_trainable(name, wrapper)
    return wrapper
