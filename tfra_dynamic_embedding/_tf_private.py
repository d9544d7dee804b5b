"""Every private TensorFlow API this package uses, in one place (house rule, DESIGN.md).

Each name below has no public equivalent; the comment next to it says what it is needed for.
"Checked" is the TF versions on which the name was seen to resolve and behave as used here:
only the pinned TF 2.21 so far; "noted for 2.16-2.21" marks names this package's earlier
comments already claimed for that range (not re-verified here on 2.16-2.20). When a TF release
moves one, tests/test_tf_private.py fails first, naming it; the fix then belongs here only.
No other module of the package imports `tensorflow.python` or reads `tf.__internal__`
(tests/test_tf_private.py checks that too).

Not routed through here, because they are overrides rather than look-ups: the protected hooks a
subclass of a TF/Keras optimizer implements or calls on `super()` (`_create_slots`,
`_get_or_make_slot`, `_resource_apply_*`, ... in optimizer/) and the Trackable hooks our own
trackables implement (`_serialize_to_tensors`, `_restore_from_tensors`, `_track_trackable`).
"""

import sys

import tensorflow as tf
# Checked: 2.21 (noted for 2.16-2.21). The eager context: its current device scope and its
# ConfigProto's operation_timeout_in_ms have no public getter/setter; neither has eager_mode.
from tensorflow.python.eager import context as _eager_context
# Checked: 2.21. "Could a GradientTape be recording?" has no public API.
from tensorflow.python.eager import record as _record
# Checked: 2.21. Which worker a ClusterCoordinator is dispatching a function to, read eagerly
# when the function's by-reference captures are evaluated (the public
# experimental_get_current_worker_index works only inside a function).
from tensorflow.python.distribute.coordinator import coordinator_context as _coordinator_context
# Checked: 2.21. Copying a resource handle's dtype/shape data onto a placeholder has no public API.
from tensorflow.python.ops import handle_data_util as _handle_data_util
# Checked: 2.21. ResourceVariable (a subclassable variable class) is not public API.
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops
# Checked: 2.21 (noted for 2.16-2.21). TF's registry of custom checkpoint savers: the one hook
# through which tf.train.Checkpoint hands a saver the checkpoint's prefix (FileSystemSaver).
from tensorflow.python.saved_model.registration import registration as _registration
# Checked: 2.21. Whether a SavedModel is being written, and with which options: the public
# API has only the options' class.
from tensorflow.python.saved_model import save_context as _save_context
# Checked: 2.21 (noted for 2.16-2.21). The v1 Saver only understands SaveableObjects, whose
# classes are not public.
from tensorflow.python.training.saving import saveable_object as _saveable_object

# --- tensorflow.python.eager.context -------------------------------------------------------
eager_mode = _eager_context.eager_mode  # run eagerly even while a graph is being built


def eager_device_name():
    """The device of the enclosing eager `tf.device` scope ('' when there is none)."""
    return _eager_context.context().device_name or ""


# --- tensorflow.python.saved_model.save_context --------------------------------------------
def saving_saved_model():
    """Whether a SavedModel is being written (tf.saved_model.save and what calls it)."""
    return _save_context.in_save_context()


def saving_without_devices():
    """Whether a SavedModel is being written that keeps no device placements: TF's default
    variable policy (`SaveOptions(experimental_variable_policy=SAVE_VARIABLE_DEVICES)` keeps
    them)."""
    if not _save_context.in_save_context():
        return False
    policy = _save_context.get_save_options().experimental_variable_policy
    return not policy._save_variable_devices()  # pylint: disable=protected-access


def cluster_connection():
    """An object replaced whenever the eager context (re)connects to its cluster
    (`set_server_def`, and `update_server_def`, which a ClusterCoordinator calls after a worker
    restarted): remote tensors made before a change may be gone with a restarted task, so a cache
    of them is valid only while this object stays the same. Checked: 2.21 (each connection
    rebuilds the context's device list in `_initialize_logical_devices`)."""
    return _eager_context.context()._context_devices  # pylint: disable=protected-access


def set_operation_timeout_in_ms(milliseconds):
    """Sets the eager context's ConfigProto.operation_timeout_in_ms (before it is initialized)."""
    _eager_context.context().operation_timeout_in_ms = int(milliseconds)


# --- tensorflow.python.eager.record ---------------------------------------------------------
could_possibly_record = _record.could_possibly_record

# --- tensorflow.python.distribute.coordinator.coordinator_context ---------------------------
def dispatched_worker_index():
    """The index of the worker a ClusterCoordinator is dispatching to now, or None."""
    dispatch = _coordinator_context.get_current_dispatch_context()
    return None if dispatch is None else dispatch.worker_index


# --- tensorflow.python.ops.handle_data_util -------------------------------------------------
copy_handle_data = _handle_data_util.copy_handle_data

# --- tensorflow.python.ops.resource_variable_ops -------------------------------------------
ResourceVariable = _resource_variable_ops.ResourceVariable

# --- tensorflow.python.saved_model.registration ---------------------------------------------
register_checkpoint_saver = _registration.register_checkpoint_saver

# --- tensorflow.python.training.saving.saveable_object --------------------------------------
SaveableObject = _saveable_object.SaveableObject
SaveSpec = _saveable_object.SaveSpec

# --- tf.__internal__ (exported, but "internal: no compatibility guarantees") ----------------
# Checked: 2.21. The base class of TF's own trackables (tables, variables): tracked by
# tf.train.Checkpoint and tf.saved_model without the Keras/tf.Module attribute machinery.
AutoTrackable = tf.__internal__.tracking.AutoTrackable
# Checked: 2.21. What a slot initializer is while a checkpoint restore is pending.
CheckpointInitialValueCallable = tf.__internal__.tracking.CheckpointInitialValueCallable


# --- private attributes of TF objects -------------------------------------------------------
def variable_unique_id(variable):
    """`variable._unique_id` (checked: 2.21): the key TF's v1 optimizers (eagerly) and tf_keras'
    optimizers file a variable's slots under; there is no public accessor."""
    return variable._unique_id  # pylint: disable=protected-access


def resource_variable_handle(variable):
    """`variable._handle` (checked: 2.21): a ResourceVariable's own handle tensor, whose handle
    data (dtype, shape) a function placeholder copies; `variable.handle` may be a read of it
    under a distribution strategy."""
    return variable._handle  # pylint: disable=protected-access


def recreate_resource(resource):
    """A new handle for a copy of a TrackableResource, kept as its handle (checked: 2.21): what
    `TrackableResource._export_to_saved_model_graph` does for a resource that exports a copy of
    its own; `_create_resource` and `_resource_handle` are its hooks."""
    resource._resource_handle = resource._create_resource()  # pylint: disable=protected-access
    return resource.resource_handle


# --- private attributes of Keras layers (Keras 3 and tf_keras) -------------------------------
def trainable_weight_list(layer):
    """The list a layer's `trainable_weights` is built from, which a layer appends to (checked:
    Keras 3.x as `_trainable_variables`, tf_keras 2.21 as `_trainable_weights`)."""
    if hasattr(layer, "_trainable_variables"):
        return layer._trainable_variables  # pylint: disable=protected-access
    return layer._trainable_weights  # pylint: disable=protected-access


def flatten_layers(model):
    """Every layer of `model`, nested ones included, itself first (checked: tf_keras 2.21 and
    Keras 3.x `_flatten_layers`); [model] where the method is missing."""
    if not hasattr(model, "_flatten_layers"):
        return [model]
    return list(model._flatten_layers())  # pylint: disable=protected-access


# --- TF's frozen copy of the Keras 2 optimizers ---------------------------------------------
# Checked: 2.21 (tensorflow.python.keras, still shipped). TFRA code imports optimizers from
# there; they are never imported here, only recognized when the caller already loaded them.
TF_KERAS_OPTIMIZER_V2_MODULE = "tensorflow.python.keras.optimizer_v2.optimizer_v2"


def loaded_tf_keras_optimizer_v2_class():
    """`tensorflow.python.keras`'s OptimizerV2 class if that module is loaded, else None."""
    module = sys.modules.get(TF_KERAS_OPTIMIZER_V2_MODULE)
    return getattr(module, "OptimizerV2", None) if module is not None else None
