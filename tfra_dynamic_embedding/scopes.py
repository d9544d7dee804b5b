"""`de.get_variable` and placement scopes: where variables are found and where they are put.

`get_variable` keeps variables in a store of the default graph, like TensorFlow's own variable
store: `tf.compat.v1.variable_scope` reuse rules apply, and `tf.compat.v1.reset_default_graph()`
(or a new `tf.Graph()`) starts an empty store, in eager mode too. `placement_scope` lets a
placement plan (placement/apply.py) choose the devices of the variables made inside it; this
module never imports placement.

Example:
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> with tf.compat.v1.variable_scope("ctr", reuse=tf.compat.v1.AUTO_REUSE):
    ...     w = de.get_variable("scopes_user", dim=8)
    >>> w.name
    'ctr/scopes_user'
"""

import contextlib
import threading
import weakref

import tensorflow as tf

from tfra_dynamic_embedding.variable import Variable, default_partition_fn


# -- placement hook: placement/apply.py pushes resolvers ---------------------------------------
_placement = threading.local()


@contextlib.contextmanager
def placement_scope(resolver):
    """Within the scope `get_variable(name)` asks `resolver(full_name)` for its placement.

    `resolver` returns None (no opinion) or `(devices, partitioner_or_None)`; the innermost
    scope with an opinion wins.
    """
    stack = _placement.__dict__.setdefault("stack", [])
    stack.append(resolver)
    try:
        yield
    finally:
        stack.pop()


def resolve_placement(full_name):
    """`(devices, partitioner_or_None)` from the innermost placement scope with an opinion."""
    for resolver in reversed(_placement.__dict__.get("stack", [])):
        placed = resolver(full_name)
        if placed is not None:
            return placed
    return None


# -- get_variable: tf.compat.v1.variable_scope reuse semantics ------------------------------
# One store per default graph, as TF's own variable store: in eager mode too, the default graph
# is the one `tf.compat.v1.reset_default_graph()` replaces, so a reset (or a new `tf.Graph()`)
# starts with no variables, and a rebuilt model never trains on an earlier model's rows.
_stores = weakref.WeakKeyDictionary()   # graph -> {full name: Variable}


def get_variable(name,
                 key_dtype=tf.int64,
                 value_dtype=tf.float32,
                 dim=1,
                 devices=None,
                 partitioner=default_partition_fn,
                 shared_name="get_variable",
                 initializer=None,
                 trainable=True,
                 checkpoint=True,
                 init_size=0,
                 kv_creator=None,
                 restrict_policy=None,
                 bp_v2=False,
                 short_file_name=False,
                 eviction=None,
                 admission=None):
    """Gets an existing `de.Variable` or creates a new one, honouring the variable scope.

    `short_file_name=True` (TFRA's option) names the variable `name` without the scope prefix,
    keeping file and checkpoint names short.

    Variables live in a store of the default graph, like TF's own variables: an existing name
    is returned under `reuse=True` or `reuse=tf.compat.v1.AUTO_REUSE` (always, in eager mode)
    and raises ValueError otherwise; a new name is created (also under `reuse=True`, as TFRA
    does). `tf.compat.v1.reset_default_graph()` or a new `tf.Graph()` starts an empty store.
    `shared_name` names the tables in graph mode (workers of one cluster share them); eager
    tables belong to their variable. Inside a placement scope (placement/apply.py) the plan
    chooses `devices` and, for row-sliced tables, the partitioner.

    Example:
        >>> with tf.compat.v1.variable_scope("ctr", reuse=tf.compat.v1.AUTO_REUSE):
        ...     w = get_variable("get_variable_user", dim=8)
        ...     again = get_variable("get_variable_user", dim=8)
        >>> w.name, again is w
        ('ctr/get_variable_user', True)
    """
    scope = tf.compat.v1.get_variable_scope()
    full_name = f"{scope.name}/{name}" if scope.name and not short_file_name else name
    reuse = scope.reuse
    with tf.init_scope():  # inside a tf.function: eager or not as the code that runs it
        eager = tf.executing_eagerly()
    registry = _stores.setdefault(_outermost_graph(), {})
    if eager and reuse is not True:  # TF's own eager scopes always AUTO_REUSE
        reuse = tf.compat.v1.AUTO_REUSE
    existing = registry.get(full_name)
    if existing is not None:
        if reuse is False or reuse is None:
            raise ValueError(
                f"de.Variable {full_name} already exists, disallowed. Did you mean to set "
                f"reuse=True or reuse=tf.compat.v1.AUTO_REUSE in the variable scope?")
        return existing
    # reuse=True with a new name creates it, as TFRA does.
    if eager:
        # Eager tables are owned by their Variable and die with it. A shared name would keep
        # the table alive in the resource manager under its name, and a variable re-created
        # after a graph reset would see the old rows.
        shared_name = None
    placed = resolve_placement(full_name)
    if placed is not None:
        devices = placed[0]
        partitioner = placed[1] or partitioner
    variable = Variable(
        key_dtype=key_dtype, value_dtype=value_dtype, dim=dim, devices=devices,
        partitioner=partitioner, shared_name=f"{shared_name}/{full_name}" if shared_name else None,
        name=full_name, initializer=initializer, trainable=trainable, checkpoint=checkpoint,
        init_size=init_size, kv_creator=kv_creator, restrict_policy=restrict_policy,
        bp_v2=bp_v2, short_file_name=short_file_name, eviction=eviction,
        admission=admission)
    registry[full_name] = variable
    return variable


def _outermost_graph():
    """The default graph outside every tf.function being traced (a function's variables belong
    to the graph, or eager default graph, that runs it)."""
    graph = tf.compat.v1.get_default_graph()
    while getattr(graph, "outer_graph", None) is not None:
        graph = graph.outer_graph
    return graph
