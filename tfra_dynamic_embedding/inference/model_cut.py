"""Cutting a model at its embedding outputs: the features (sparse part) and the dense part.

Supported models:
  * the demo's DLRM (`tfra_dynamic_embedding.demo.dlrm.DLRM`, dynamic tables): feature i reads
    column i of the "ids" input; the dense part is its `dense_part` fed the pooled rows;
  * a Keras 3 functional model whose `de.keras.layers.Embedding` layers (not the Squashed /
    FieldWise variants) each read one dense model input directly, once: the dense part is the
    sub-model from (the other inputs, the embedding outputs) to the model's outputs.

Example:
    cut = cut_model(model)
    [f.name for f in cut.features]               # ['C1', 'C2', ...]
    cut.dense_call({"dense": x}, {"C1": e1, ...})  # the prediction from pooled rows
"""

import dataclasses
from typing import Callable, Dict, List, Optional

import tensorflow as tf

from tfra_dynamic_embedding.keras import layers as de_layers


@dataclasses.dataclass
class FeatureCut:
    """One embedding layer's use: ids = request[input] (or its column `column`)."""

    name: str
    layer: object
    input: str
    column: Optional[int]
    combiner: Optional[str]
    output_spec: tf.TensorSpec   # the pooled value main takes (named `name`)


@dataclasses.dataclass
class ModelCut:
    """The features, the request inputs, main's other inputs and the dense part of a model."""

    features: List[FeatureCut]
    request_inputs: Dict[str, tf.TensorSpec]
    dense_inputs: Dict[str, tf.TensorSpec]
    outputs: List[str]
    dense_call: Callable        # (dense: {name: tensor}, pooled: {feature: tensor}) -> {output: t}
    dense_variables: list
    kind: str


def cut_model(model):
    """The `ModelCut` of a trained model; raises NotImplementedError for unsupported models."""
    from tfra_dynamic_embedding.demo import dlrm  # pylint: disable=import-outside-toplevel
    if isinstance(model, dlrm.DLRM):
        return _cut_dlrm(model)
    if getattr(model, "inputs", None) and getattr(model, "outputs", None) and hasattr(
            model, "layers"):
        return _cut_functional(model)
    raise NotImplementedError(
        f"model {getattr(model, 'name', model)!r} ({type(model).__name__}) cannot be cut for a "
        f"sharded export: supported are the demo's DLRM and Keras functional models whose "
        f"de.keras.layers.Embedding layers read model inputs directly. A subclassed model needs "
        f"to be rebuilt functionally (keras.Input -> de.keras.layers.Embedding -> dense layers)")


def _output_names(structure):
    if isinstance(structure, dict):
        return list(structure)
    flat = tf.nest.flatten(structure)
    return ["prediction"] if len(flat) == 1 else [f"output_{i}" for i in range(len(flat))]


def _as_dict(names, outputs):
    if isinstance(outputs, dict):
        return {name: outputs[name] for name in names}
    return dict(zip(names, tf.nest.flatten(outputs)))


def _cut_dlrm(model):
    if not model.dynamic:
        raise NotImplementedError(f"model {model.name!r} has static tables (vocab_sizes); a "
                                  f"sharded export needs dynamic (de) tables")
    layers = model.embeddings
    key_dtype = layers[0].params.key_dtype if layers else tf.int64
    features = [FeatureCut(layer.name, layer, "ids", i, None,
                           tf.TensorSpec([None, model.embedding_dim], layer.params.value_dtype,
                                         name=layer.name))
                for i, layer in enumerate(layers)]
    request = {"ids": tf.TensorSpec([None, model.num_categorical], key_dtype, name="ids")}
    dense = {}
    if model.num_dense:
        dense["dense"] = tf.TensorSpec([None, model.num_dense], tf.float32, name="dense")
        request = {"dense": dense["dense"], **request}
    def dense_call(dense_inputs, pooled):
        vectors = [pooled[f.name] for f in features]
        return {"prediction": model.dense_part(dense_inputs.get("dense"), vectors)}

    variables = [w for layer in model.dense_layers() for w in layer.weights]
    return ModelCut(features, request, dense, ["prediction"], dense_call, variables, "DLRM")


def _input_names(model):
    structure = model.input
    if isinstance(structure, dict):
        return [(name, tensor) for name, tensor in structure.items()]
    return [(tensor.name, tensor) for tensor in tf.nest.flatten(structure)]


def _spec(tensor, name):
    return tf.TensorSpec(tuple(tensor.shape), tf.as_dtype(tensor.dtype), name=name)


def _calls_per_layer(model):
    """{layer name: times it is called in the functional graph}, from the model's config."""
    try:
        config = model.get_config()
    except Exception:  # pylint: disable=broad-except  (a layer without a config)
        # Keras' own record of a layer's calls (all models it is in: errs on the safe side).
        return {layer.name: len(getattr(layer, "_inbound_nodes", [None])) for layer in
                model.layers}
    return {layer["config"].get("name", layer.get("name")): len(layer.get("inbound_nodes", []))
            for layer in config.get("layers", [])}


def _cut_functional(model):
    import keras  # pylint: disable=import-outside-toplevel
    inputs = _input_names(model)
    embeddings = [layer for layer in model.layers if isinstance(layer, de_layers.Embedding)]
    if not embeddings:
        raise ValueError(f"model {model.name!r} has no de.keras.layers.Embedding layer: "
                         f"nothing to shard")
    calls_in_model = _calls_per_layer(model)
    features, read = [], set()
    for layer in embeddings:
        if isinstance(layer, (de_layers.SquashedEmbedding, de_layers.FieldWiseEmbedding)):
            raise NotImplementedError(f"layer {layer.name!r}: {type(layer).__name__} is not "
                                      f"supported by the sharded export (use "
                                      f"de.keras.layers.Embedding with a combiner)")
        if layer.max_norm is not None:
            raise NotImplementedError(f"layer {layer.name!r}: max_norm is not supported by the "
                                      f"sharded export")
        calls = calls_in_model.get(layer.name, 1)
        if calls != 1:
            raise NotImplementedError(
                f"layer {layer.name!r} is called {calls} times in model {model.name!r} (a "
                f"shared table); the sharded export needs one call per embedding layer")
        source, output = layer.input, layer.output
        if isinstance(source, (list, tuple, dict)):
            raise NotImplementedError(f"layer {layer.name!r} takes several inputs")
        names = [name for name, tensor in inputs if tensor is source]
        if not names:
            raise ValueError(f"layer {layer.name!r} reads {source.name!r}, not a model input: "
                             f"the sharded export needs embedding layers to read model inputs "
                             f"directly")
        if getattr(source, "sparse", False) or getattr(source, "ragged", False):
            raise NotImplementedError(f"layer {layer.name!r} reads a sparse/ragged input "
                                      f"{names[0]!r}; the sharded export takes dense ids")
        if len(source.shape) < (2 if layer.combiner else 1):
            raise NotImplementedError(f"layer {layer.name!r} reads {names[0]!r} of shape "
                                      f"{tuple(source.shape)}: the sharded export needs "
                                      f"[batch, ...] ids ([batch, n, ...] with a combiner)")
        read.add(id(source))
        features.append(FeatureCut(layer.name, layer, names[0], None, layer.combiner,
                                   _spec(output, layer.name)))
    request = {name: _spec(tensor, name) for name, tensor in inputs}
    others = [(name, tensor) for name, tensor in inputs if id(tensor) not in read]
    outputs = [f.layer.output for f in features]
    errors = []
    sub = None
    for candidates in (others, inputs):   # inputs read by embeddings may feed dense layers too
        try:
            sub = keras.Model([t for _, t in candidates] + outputs, model.outputs)
            break
        except Exception as error:  # pylint: disable=broad-except
            errors.append(error)
    if sub is None:
        raise ValueError(f"cannot cut model {model.name!r} at the outputs of its embedding "
                         f"layers {[f.name for f in features]}: {errors[-1]}") from errors[-1]
    dense = {name: _spec(tensor, name) for name, tensor in candidates}
    names = _output_names(model.output)
    dense_order = [name for name, _ in candidates]

    def dense_call(dense_inputs, pooled):
        args = [dense_inputs[name] for name in dense_order] + [pooled[f.name] for f in features]
        return _as_dict(names, sub(args, training=False))

    return ModelCut(features, request, dense, names, dense_call, list(sub.weights), "functional")
