"""tfra_dynamic_embedding/_tf_private.py: every private TF name it exposes still resolves (this
fails first, naming the name, when a TF release moves one), and no other module of the package
reaches private TF API on its own (house rule, DESIGN.md)."""

import ast
import inspect
import pathlib
import sys
import types

import pytest
import tensorflow as tf

from tfra_dynamic_embedding import _tf_private

PACKAGE = pathlib.Path(_tf_private.__file__).parent

# Every public name of _tf_private and what it must be.
EXPECTED = {
    "eager_mode": "callable",
    "eager_device_name": "function",
    "set_operation_timeout_in_ms": "function",
    "could_possibly_record": "callable",
    "ResourceVariable": "class",
    "register_checkpoint_saver": "callable",
    "SaveableObject": "class",
    "SaveSpec": "class",
    "AutoTrackable": "class",
    "CheckpointInitialValueCallable": "class",
    "variable_unique_id": "function",
    "TF_KERAS_OPTIMIZER_V2_MODULE": "str",
    "loaded_tf_keras_optimizer_v2_class": "function",
    "dispatched_worker_index": "function",
    "cluster_connection": "function",
    "copy_handle_data": "callable",
    "saving_without_devices": "function",
    "saving_saved_model": "function",
    "resource_variable_handle": "function",
    "recreate_resource": "function",
    "trainable_weight_list": "function",
    "flatten_layers": "function",
}


def _public_names():
    return {name for name, value in vars(_tf_private).items()
            if not name.startswith("_") and not isinstance(value, types.ModuleType)}


def test_every_exposed_name_is_listed():
    assert _public_names() == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_name_resolves_with_expected_kind(name):
    value = getattr(_tf_private, name)
    kind = EXPECTED[name]
    if kind == "class":
        assert inspect.isclass(value), name
    elif kind == "function":
        assert inspect.isfunction(value) and value.__module__ == _tf_private.__name__, name
    elif kind == "callable":
        assert callable(value) and not inspect.isclass(value), name
    else:
        assert isinstance(value, str), name


def test_saving_without_devices_follows_the_save_options(tmp_path):
    seen = []

    class Probe(tf.Module):
        def _trackable_children(self, save_type="checkpoint", **kwargs):
            if save_type == "savedmodel":
                seen.append(_tf_private.saving_without_devices())
            return super()._trackable_children(save_type, **kwargs)

    assert not _tf_private.saving_without_devices()
    tf.saved_model.save(Probe(), str(tmp_path / "default"))
    keep = tf.saved_model.SaveOptions(
        experimental_variable_policy=tf.saved_model.experimental.VariablePolicy
        .SAVE_VARIABLE_DEVICES)
    tf.saved_model.save(Probe(), str(tmp_path / "devices"), options=keep)
    assert seen and seen[0] is True and seen[-1] is False


def test_names_behave_as_used():
    # Classes the package subclasses or checks against are what TF itself uses.
    assert issubclass(_tf_private.ResourceVariable, tf.Variable)
    assert isinstance(tf.Variable(1.0), _tf_private.ResourceVariable)
    assert isinstance(tf.Module(), _tf_private.AutoTrackable)
    spec = _tf_private.SaveSpec(tf.constant(1), "", "n")
    assert spec.name == "n" and spec.dtype == tf.int32
    assert issubclass(_tf_private.SaveableObject, object)
    assert "predicate" in inspect.signature(_tf_private.register_checkpoint_saver).parameters
    # Tape recording, eager mode and the eager device scope.
    assert not _tf_private.could_possibly_record()
    with tf.GradientTape():
        assert _tf_private.could_possibly_record()
    with tf.Graph().as_default(), _tf_private.eager_mode():
        assert tf.executing_eagerly()
    assert _tf_private.eager_device_name() == ""
    with tf.device("/CPU:0"):
        assert _tf_private.eager_device_name().endswith("CPU:0")
    # A variable's unique id: distinct per variable, stable for one.
    a, b = tf.Variable(1.0), tf.Variable(1.0)
    assert _tf_private.variable_unique_id(a) == _tf_private.variable_unique_id(a)
    assert _tf_private.variable_unique_id(a) != _tf_private.variable_unique_id(b)
    # The eager context exposes the timeout (set only before it is initialized; not set here).
    context = sys.modules["tensorflow.python.eager.context"]
    assert isinstance(getattr(type(context.context()), "operation_timeout_in_ms"), property)
    # No ClusterCoordinator dispatching here; handle data (dtype and shape) copies over.
    assert _tf_private.dispatched_worker_index() is None
    # The connection marker is the context's device list, the same object until a reconnect.
    tf.constant(0)   # the context is initialized
    assert _tf_private.cluster_connection() is _tf_private.cluster_connection()
    assert any("CPU" in device for device in _tf_private.cluster_connection())
    variable = tf.Variable(tf.zeros([0, 3]), shape=tf.TensorShape([None, 3]))

    shapes = []

    @tf.function
    def read_through_a_bare_placeholder():
        bare = tf.raw_ops.Placeholder(dtype=tf.resource, shape=[])
        shapes.append(tf.raw_ops.ReadVariableOp(resource=bare, dtype=tf.float32).shape)
        _tf_private.copy_handle_data(variable.handle, bare)
        shapes.append(tf.raw_ops.ReadVariableOp(resource=bare, dtype=tf.float32).shape)
        return tf.constant(0)

    read_through_a_bare_placeholder.get_concrete_function()
    assert shapes[0].rank is None and shapes[1].as_list() == [None, 3]


def test_frozen_keras_optimizer_v2_module():
    # TF still ships its frozen Keras 2 optimizers; _tf_private only recognizes a loaded one.
    module = pytest.importorskip(_tf_private.TF_KERAS_OPTIMIZER_V2_MODULE)
    assert _tf_private.loaded_tf_keras_optimizer_v2_class() is module.OptimizerV2
    assert inspect.isclass(module.OptimizerV2)


def _private_tf_uses(path):
    """(line, what) for each import of tensorflow.python, module-name string naming it, or
    `tf.__internal__` attribute in `path` (comments and prose in docstrings do not count)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names
                      if a.name.startswith("tensorflow.python")]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").startswith("tensorflow.python") or (
                    node.module == "tensorflow" and any(a.name == "python" for a in node.names)):
                found.append((node.lineno, f"from {node.module}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith("tensorflow.python"):
                found.append((node.lineno, repr(node.value)))
        elif isinstance(node, ast.Attribute) and node.attr == "__internal__":
            found.append((node.lineno, "__internal__"))
    return found


def test_only_tf_private_reaches_private_tf_api():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_tf_private.py" and path.parent == PACKAGE:
            continue
        uses = _private_tf_uses(path)
        if uses:
            offenders[str(path.relative_to(PACKAGE))] = uses
    assert not offenders, f"import private TF API through _tf_private.py: {offenders}"


def test_the_checker_finds_private_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Mentions tensorflow.python in prose."""\n'
                      "# from tensorflow.python.eager import context  (a comment)\n"
                      "from tensorflow.python.eager import context\n"
                      "import tensorflow.python.ops.array_ops\n"
                      "import tensorflow as tf\n"
                      "x = tf.__internal__.tracking\n"
                      "m = 'tensorflow.python.keras'\n")
    assert sorted(line for line, _ in _private_tf_uses(sample)) == [3, 4, 6, 7]
