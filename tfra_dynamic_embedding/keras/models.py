"""TFRA's `de.keras.models.save_model`: a Keras model with dynamic embeddings as a SavedModel.

Works for tf_keras models (tf_keras's own SavedModel writer) and Keras 3 models (Keras 3 writes
only `.keras` files itself, so the model goes through `tf.saved_model.save`). Either way the
embedding tables are saved with their rows, and the SavedModel loads with
`tf.saved_model.load` (and, for tf_keras, `tf_keras.models.load_model`).

Example (serving the export: docs/serving.md):
    >>> import os, tempfile
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    >>> model = tf.keras.Model(ids, de.keras.layers.Embedding(2, pooling="sum", name="m_emb")(ids))
    >>> export = os.path.join(tempfile.mkdtemp(), "1")
    >>> de.keras.models.save_model(model, export, include_optimizer=False)
    >>> sorted(os.listdir(export))
    [...'saved_model.pb', 'variables']
"""

import importlib
import os

import tensorflow as tf
from absl import logging

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding import variable as variable_lib
from tfra_dynamic_embedding.keras import binding

__all__ = ["save_model", "de_save_model", "de_hvd_save_model", "refuse_legacy_hdf5",
           "export_with_stock_tables"]

# Ops of a `TFRA>` namespace must be allowed in a SavedModel (TFRA's custom ops); ours carry no
# namespace, but TFRA user code passes this list, and adding it keeps options TFRA-shaped.
NAMESPACE = "TFRA"


def de_save_model(model, filepath, overwrite=True, include_optimizer=True, signatures=None,
                  options=None, save_traces=True, save_format=None, stock_tables=False):
    """Saves `model` (tf_keras or Keras 3) to the SavedModel directory `filepath`.

    By default the model is saved as it is, as TFRA saves it: tf_keras' `load_model` restores
    it (training resumes), and with native tables the SavedModel needs this package where it is
    loaded. `stock_tables=True`: a model whose tables are not stock TensorFlow already (the
    default native backend, Redis) is saved for serving: its signatures read stock snapshots of
    the tables (`inference.stock_saved_model`), so stock TensorFlow and TF Serving load it without
    this package; the optimizer, Keras' metadata and `save_traces` are left out. (Keras'
    `model.export`, an inference-only artifact anyway, writes stock tables by default.)

    `include_optimizer=False` leaves the optimizer (and its slot tables) out, as for serving.
    `signatures`: as `tf.saved_model.save`'s. Left out, a Keras 3 functional model gets a
    `serving_default` over its inputs; a Keras 3 subclassed model gets Keras's own, which Keras
    traces with float inputs, so integer ids need `signatures`. `options`: a
    `tf.saved_model.SaveOptions`; "TFRA" is added to its namespace whitelist. `save_format`:
    TFRA passes it on to Keras; a SavedModel ("tf", or None) is the one format written here.

    The module docstring shows it at work.
    """
    if save_format not in (None, "tf"):
        raise ValueError(f"save_format must be None or 'tf' (a SavedModel); got "
                         f"{save_format!r}")
    filepath = os.fspath(filepath)
    if not overwrite and tf.io.gfile.exists(filepath):
        raise FileExistsError(f"filepath {filepath!r} exists and overwrite is False")
    options = _with_namespace(options)
    package = binding.package_of(model)
    if stock_tables and package in binding.PACKAGES:
        from tfra_dynamic_embedding.inference import stock_saved_model  # pylint: disable=import-outside-toplevel
        if stock_saved_model.needs_stock_copy(model):
            if signatures is None:
                try:
                    signatures = stock_saved_model.default_signatures(model)
                except ValueError as error:
                    raise ValueError(
                        f"signatures is required to save {type(model).__name__} model "
                        f"{model.name!r} with stock tables: {error}") from error
            if stock_saved_model.retraceable(signatures):
                stock_saved_model.save(filepath, signatures, options=options)
                return
            # A traced ConcreteFunction (TFRA's demos pass one) cannot be traced again.
            logging.warning(
                "de.keras.models.save_model: a signature is a ConcreteFunction, which cannot be "
                "retraced with stock tables; %r keeps the native tables and needs "
                "tfra_dynamic_embedding where it is loaded (pass tf.functions with an "
                "input_signature for a stock SavedModel)", filepath)
    if package == binding.TF_KERAS:
        binding.keras_module(package).models.save_model(
            model, filepath, overwrite=overwrite, include_optimizer=include_optimizer,
            save_format="tf", signatures=signatures, options=options, save_traces=save_traces)
        return
    if package != binding.KERAS3:
        raise TypeError(f"model must be a Keras 3 or tf_keras model; got {type(model).__name__}")
    if signatures is None:
        signatures = _functional_signature(model)
        if signatures is None and not include_optimizer:
            raise ValueError(
                f"signatures is required to save Keras 3 model {model.name!r} without its "
                f"optimizer: it is not functional, so its inputs' dtypes are unknown")
    root = model if include_optimizer else _layers_only(model)
    try:
        tf.saved_model.save(root, filepath, signatures=signatures, options=options)
    except (TypeError, ValueError) as error:
        if signatures is not None:
            raise
        raise ValueError(
            f"could not trace a serving signature for Keras 3 model {model.name!r} from the "
            f"input spec Keras recorded ({error}); pass signatures={{'serving_default': "
            f"tf.function(lambda ids: model(ids), input_signature=[tf.TensorSpec(...)])}}"
        ) from error


save_model = de_save_model
# TFRA's Horovod variant; without Horovod every process saves the whole model alike.
de_hvd_save_model = de_save_model


def _with_namespace(options):
    if options is None:
        return tf.saved_model.SaveOptions(namespace_whitelist=[NAMESPACE])
    if not isinstance(options, tf.saved_model.SaveOptions):
        raise TypeError(f"options must be a tf.saved_model.SaveOptions; got {options!r}")
    whitelist = list(options.namespace_whitelist or [])
    if NAMESPACE not in whitelist:
        options.namespace_whitelist = whitelist + [NAMESPACE]
    return options


def _functional_signature(model):
    """A `serving_default` over a functional model's inputs (their real dtypes), else None."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return None
    specs = [tf.TensorSpec(i.shape, i.dtype, name=i.name) for i in inputs]

    @tf.function(input_signature=specs)
    def serve(*args):
        outputs = model(list(args) if len(args) > 1 else args[0], training=False)
        if isinstance(outputs, dict):
            return outputs
        if isinstance(outputs, (list, tuple)):
            return {f"output_{i}": out for i, out in enumerate(outputs)}
        return {"output_0": outputs}

    return {"serving_default": serve}


def _layers_only(model):
    """A module holding `model`'s layers but not its optimizer, for include_optimizer=False."""
    root = tf.Module()
    root.layers = list(model.layers)
    return root


def export_with_stock_tables(package):
    """Makes `package`'s ("keras" or "tf_keras") `model.export(DIR)` write a SavedModel with stock
    tables for a model with dynamic embeddings (`inference.stock_saved_model`)."""
    from tfra_dynamic_embedding.inference import stock_saved_model  # pylint: disable=import-outside-toplevel
    stock_saved_model.install_keras_export(package)


# Each Keras' writer of the legacy HDF5 format (`.h5`), by package.
_LEGACY_HDF5 = {binding.TF_KERAS: "tf_keras.src.saving.legacy.hdf5_format",
                binding.KERAS3: "keras.src.legacy.saving.legacy_h5_format"}


def refuse_legacy_hdf5(package):
    """Makes `package`'s ("keras" or "tf_keras") legacy HDF5 writer (`model.save("m.h5")`;
    tf_keras' `save_weights("w.h5")`) refuse a model holding dynamic-embedding layers: the format
    keeps fixed-shape weights only, so tf_keras wrote the model without its tables and said
    nothing (Keras 3 failed on an attribute). Other formats hold them (`.keras`, `.weights.h5`,
    a SavedModel, a TF checkpoint). `de.keras.layers` installs this for a Keras when it makes
    its first layer of that Keras."""
    try:
        hdf5 = importlib.import_module(_LEGACY_HDF5[package])
    except ImportError:
        return
    original = hdf5.save_weights_to_hdf5_group
    if getattr(original, "refuses_dynamic_embeddings", False):
        return

    def save_weights_to_hdf5_group(f, model):
        layers = _tf_private.flatten_layers(model)
        names = [layer.name for layer in layers
                 if isinstance(getattr(layer, "params", None), variable_lib.Variable)]
        if names:
            raise ValueError(
                f"the legacy HDF5 format (.h5) cannot hold the tables of dynamic-embedding layers "
                f"{names}; save to a '.keras' or '.weights.h5' file, with save_format='tf' "
                f"(tf_keras), or with de.keras.models.save_model")
        return original(f, model)

    save_weights_to_hdf5_group.refuses_dynamic_embeddings = True
    hdf5.save_weights_to_hdf5_group = save_weights_to_hdf5_group
