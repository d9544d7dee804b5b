"""A SavedModel of a model with dynamic embeddings that stock TensorFlow and TF Serving load.

`save` traces the serving functions with every `de.Variable` read from a stock snapshot of its
rows (`tables.stock_lookups`) and saves a module holding those snapshots
(`tables.stock_table.StockTable`), the dense variables the functions read and the functions: no
op of this package for tables of the native backend (Redis tables stay: they serve
the rows training keeps writing). Keras 3's `model.export(DIR)` and tf_keras'
`model.export(DIR)` write this by default for a model whose tables are not stock already
(`install_keras_export`), `de.keras.models.save_model(..., stock_tables=True)` on request
(`keras/models.py`; by default it saves the model as it is, as TFRA does). Keys a table does not
hold get the initializer's rows, drawn by stock ops, as the model's own lookups give them.

A SavedModel that keeps the native tables (`stock_tables=False`) needs this package where
it is loaded; stock TensorFlow then fails with its own `Op type not registered 'TfraDe...'` (the
op registry's message, which a SavedModel cannot extend: see docs/serving.md). `load` is
`tf.saved_model.load` that names the package and the fix when the op library is missing.

Example:
    >>> import os, tempfile, keras
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> ids = keras.Input(shape=(2,), dtype="int64", name="ids")
    >>> model = keras.Model(ids, de.keras.layers.Embedding(3, pooling="sum", name="e")(ids))
    >>> export = os.path.join(tempfile.mkdtemp(), "1")
    >>> save(export, default_signatures(model))
    >>> native_ops_in(export)
    []
"""

import os
import re

import tensorflow as tf

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding.tables import stock_lookups

PACKAGE = "tfra_dynamic_embedding"
NATIVE_OP_PREFIX = "TfraDe"   # every op of this package's op libraries
SERVING_DEFAULT = "serving_default"


def dynamic_embeddings_of(model):
    """The de.Variables of `model`'s layers (nested ones included), in layer order."""
    from tfra_dynamic_embedding import _tf_private  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding import variable as variable_lib  # pylint: disable=import-outside-toplevel
    found = []
    for layer in _tf_private.flatten_layers(model):
        params = getattr(layer, "params", None)
        if isinstance(params, variable_lib.Variable) and all(p is not params for p in found):
            found.append(params)
    return found


def needs_stock_copy(model):
    """Whether some table of `model` is on the native backend: its SavedModel then serves stock
    snapshots. Built-in tables are stock already; Redis tables stay Redis tables, so that the
    SavedModel reads the rows training keeps writing (docs/redis.md, "Serving from Redis")."""
    from tfra_dynamic_embedding.tables import native  # pylint: disable=import-outside-toplevel
    return any(isinstance(table, native.NativeKVTable)
               for variable in dynamic_embeddings_of(model) for table in variable.shards.tables)


def default_signatures(model, input_signature=None):
    """{"serving_default": tf.function} calling `model` on its request (a functional model's
    inputs, its `input_signature`, tf_keras' recorded spec, or `input_signature`: see
    `model_cut`); outputs as a dict (one output: "output_0")."""
    from tfra_dynamic_embedding.inference import model_cut  # pylint: disable=import-outside-toplevel
    request = model_cut.request_of(model, input_signature)

    @tf.function(input_signature=[dict(request.specs)], autograph=False)
    def serve(inputs):
        outputs = model(request.model_args(inputs), training=False)
        if isinstance(outputs, dict):
            return outputs
        return {f"output_{i}": out for i, out in enumerate(tf.nest.flatten(outputs))}

    return {SERVING_DEFAULT: serve}


def retraceable(signatures):
    """Whether `save` can trace `signatures` again: tf.functions with an input_signature (not
    ConcreteFunctions, whose Python function is gone)."""
    functions = signatures.values() if isinstance(signatures, dict) else [signatures]
    return all(getattr(f, "python_function", None) is not None
               and getattr(f, "input_signature", None) is not None for f in functions)


def _retraceable(name, function):
    """A fresh tf.function of `function` (a tf.function with an input_signature): the caller's
    may hold traces that read the training tables."""
    signature = getattr(function, "input_signature", None)
    python = getattr(function, "python_function", None)
    if python is None or signature is None:
        raise ValueError(
            f"signature {name!r}: a SavedModel with stock tables retraces its functions, so "
            f"each must be a tf.function with an input_signature; got {type(function).__name__} "
            f"(or save with stock_tables=False to keep this package's native tables)")
    return tf.function(python, input_signature=signature, autograph=False)


def save(export_dir, signatures, options=None, default=None):
    """Writes the SavedModel of `signatures` ({name: tf.function with an input_signature}, or
    one such function: "serving_default") with stock tables (see the module docstring).

    `default`: the signature also saved as "serving_default" (as Keras' `export` aliases its
    first endpoint). The saved root has the functions as methods and `variables`,
    `trainable_variables`, `non_trainable_variables` (the dense ones), as Keras' export has.
    """
    if callable(signatures) and not isinstance(signatures, dict):
        signatures = {SERVING_DEFAULT: signatures}
    if not isinstance(signatures, dict) or not signatures:
        raise ValueError(f"signatures must be a non-empty dict of tf.functions; got "
                         f"{signatures!r}")
    functions = {name: _retraceable(name, fn) for name, fn in signatures.items()}
    lookups = stock_lookups.StockLookups()
    concrete = {}
    with lookups.active():
        for name, function in functions.items():
            concrete[name] = function.get_concrete_function()
    if default is not None and SERVING_DEFAULT not in concrete:
        concrete[SERVING_DEFAULT] = concrete[default]
    root = _tf_private.AutoTrackable()   # a tf.Module's `variables` is read-only
    root.tables = lookups.tables
    table_variables = {table.rows.ref() for table in lookups.tables}
    dense = []
    for function in concrete.values():
        for variable in function.variables:
            if variable.ref() not in table_variables and all(v is not variable for v in dense):
                dense.append(variable)
    root.variables = dense
    root.trainable_variables = [v for v in dense if v.trainable]
    root.non_trainable_variables = [v for v in dense if not v.trainable]
    root.resources = _other_resources(concrete.values(), lookups, signatures)
    for name, function in functions.items():
        if name.isidentifier() and not hasattr(root, name):
            setattr(root, name, function)
    # Saving retraces the methods (TF keys traces by the save context too): they read the
    # same snapshots.
    with lookups.active():
        tf.saved_model.save(root, os.fspath(export_dir), signatures=concrete, options=options)
    left = native_ops_in(export_dir)
    if left:   # a read that bypassed Variable.lookup: say so rather than ship a broken model
        raise ValueError(f"the SavedModel in {export_dir!r} still holds ops of {PACKAGE} "
                         f"({left}): some table is read outside de.Variable lookups")


def _other_resources(functions, lookups, signatures):
    """Resources the functions read besides the snapshots and variables (e.g. a Keras
    StringLookup's table), found among the objects the signatures' owners track."""
    tracked = {t.index.resource_handle.ref() for t in lookups.tables}
    stray = []
    for function in functions:
        handles = {v.handle.ref() for v in function.variables}
        stray += [t for t in function.captured_inputs if t.dtype == tf.resource
                  and t.ref() not in handles and t.ref() not in tracked]
    if not stray:
        return []
    wanted = {t.ref() for t in stray}
    found = []
    owners = [getattr(fn.python_function, "__self__", None) for fn in signatures.values()
              if hasattr(fn, "python_function")]
    for owner in [o for o in owners if o is not None]:
        for obj in tf.train.TrackableView(owner).descendants():
            handle = getattr(obj, "resource_handle", None) if isinstance(
                obj, tf.saved_model.experimental.TrackableResource) else None
            if handle is not None and handle.ref() in wanted and all(o is not obj for o in found):
                found.append(obj)
    return found


def native_ops_in(export_dir):
    """The sorted op types of this package's op libraries a SavedModel uses ([] for a stock
    one)."""
    from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=import-outside-toplevel
    proto = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(os.path.join(os.fspath(export_dir), "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    ops = set()
    for meta_graph in proto.meta_graphs:
        ops.update(node.op for node in meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            ops.update(node.op for node in function.node_def)
    return sorted(op for op in ops if op.startswith(NATIVE_OP_PREFIX))


def missing_package_message(export_dir, op):
    """What to do about a SavedModel that needs this package's op `op` where it is missing."""
    from tfra_dynamic_embedding.tables import native  # pylint: disable=import-outside-toplevel
    return (f"the SavedModel {os.fspath(export_dir)!r} holds tables of {PACKAGE} (op {op!r} is "
            f"one of its native ops) and needs that package's op library, which did not load "
            f"here ({native.load_error()}): build it (python tools/build_ops.py) and `import "
            f"{PACKAGE}` before loading, or export the model again with stock tables (the "
            f"default of model.export and de.keras.models.save_model, or `tfra-de export "
            f"--plain`), which stock TensorFlow loads without {PACKAGE}")


def load(export_dir, tags=None, options=None):
    """`tf.saved_model.load`, whose error for a SavedModel needing this package's missing op
    library names the package and the fix (a RuntimeError from the original)."""
    try:
        return tf.saved_model.load(os.fspath(export_dir), tags=tags, options=options)
    except Exception as error:   # pylint: disable=broad-except  (TF raises several types)
        found = re.search(r"Op type not registered '(" + NATIVE_OP_PREFIX + r"\w*)'", str(error))
        if found is None:
            raise
        raise RuntimeError(missing_package_message(export_dir, found.group(1))) from error


# -- Keras' own `model.export`: stock tables by default -----------------------------------------
def _keras3_export(original):
    def export_saved_model(model, filepath, verbose=None, input_signature=None, **kwargs):
        stock = kwargs.pop("stock_tables", True)
        if not stock or kwargs or not needs_stock_copy(model):
            return original(model, filepath, verbose, input_signature=input_signature, **kwargs)
        from keras.src import tree  # pylint: disable=import-outside-toplevel
        from keras.src.export import export_utils  # pylint: disable=import-outside-toplevel
        if input_signature is None:
            input_signature = export_utils.get_input_signature(model)
        input_signature = tree.map_structure(export_utils.make_tf_tensor_spec, input_signature)
        serve = tf.function(model.__call__, input_signature=input_signature, autograph=False)
        save(filepath, {"serve": serve}, default="serve")
        if verbose is None or verbose:
            print(f"Saved artifact at '{filepath}' with stock TensorFlow tables (no op of "
                  f"{PACKAGE}); endpoint 'serve' (also 'serving_default').")
        return None
    return export_saved_model


def _tf_keras_export(original):
    def export_model(model, filepath, stock_tables=True):
        if not stock_tables or not needs_stock_copy(model):
            return original(model, filepath)
        serve = default_signatures(model)[SERVING_DEFAULT]
        save(filepath, {"serve": serve}, default="serve")
        return None
    return export_model


_KERAS_EXPORTS = {"keras": ("keras.src.export", "export_saved_model", _keras3_export),
                  "tf_keras": ("tf_keras.src.export.export_lib", "export_model",
                               _tf_keras_export)}


def install_keras_export(package):
    """Makes `package`'s ("keras" or "tf_keras") `model.export(DIR)` write stock tables for a
    model with dynamic embeddings (`model.export(DIR, stock_tables=False)` on Keras 3 keeps
    Keras' own export and this package's native tables). `de.keras.layers` installs it when it
    makes its first layer of that Keras."""
    import importlib  # pylint: disable=import-outside-toplevel
    module_name, attribute, wrap = _KERAS_EXPORTS[package]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return
    original = getattr(module, attribute, None)
    if original is None or getattr(original, "stock_tables", False):
        return
    wrapped = wrap(original)
    wrapped.stock_tables = True
    wrapped.__doc__ = original.__doc__
    setattr(module, attribute, wrapped)
