"""Cutting a model at its embedding outputs: the features (sparse part) and the dense part.

Any Keras model (Keras 3 or tf_keras; functional, Sequential or subclassed, the demo's DLRM
included) is cut by tracing its own `call` twice with every `de.keras.layers.Embedding` call
intercepted (`layers.intercept_calls`):
  * a probe trace records the ids each layer is called on; they must be a request input or one
    column of one (`inputs["ids"][:, i]`), maybe cast to another integer type, so that a router
    can read them off the request;
  * the dense trace feeds each layer's output in as a tensor: the dense part, which reads no
    table. Request inputs the outputs still depend on (besides the embeddings) become main's
    inputs.

The request is the model's input signature: a functional model's inputs, `model.input_signature`
(a method or attribute, as the demo's DLRM has), tf_keras' recorded save spec, or the
`input_signature` argument (a TensorSpec, or a flat dict / list of them).

Example:
    >>> import keras
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> user = keras.Input(shape=(), dtype="int64", name="user")
    >>> x = keras.Input(shape=(1,), name="x")
    >>> emb = de.keras.layers.Embedding(4, initializer=1.0, name="user_table")(user)
    >>> out = keras.layers.Dense(1, kernel_initializer="ones")(
    ...     keras.layers.Concatenate()([emb, x]))
    >>> cut = cut_model(keras.Model({"user": user, "x": x}, out))
    >>> [(f.name, f.input) for f in cut.features], list(cut.dense_inputs), cut.outputs
    ([('user_table', 'user')], ['x'], ['prediction'])
    >>> pooled = {"user_table": tf.ones([1, 4])}                  # the prediction from pooled rows
    >>> cut.dense_call({"x": tf.ones([1, 1])}, pooled)["prediction"].numpy()
    array([[5.]], dtype=float32)
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


@dataclasses.dataclass
class Request:
    """The request's specs by name and how the model takes them (a dict, a list or one tensor)."""

    specs: Dict[str, tf.TensorSpec]
    form: str   # "dict" | "list" | "single"

    def model_args(self, tensors):
        if self.form == "dict":
            return dict(tensors)
        values = [tensors[name] for name in self.specs]
        return values if self.form == "list" else values[0]


def cut_model(model, input_signature=None):
    """The `ModelCut` of a trained model; raises ValueError naming what the sharded export
    cannot serve."""
    request = request_of(model, input_signature)
    features = _probe(model, request)
    if not features:
        raise ValueError(f"model {model.name!r} calls no de.keras.layers.Embedding layer: "
                         f"nothing to shard")
    return _dense_part(model, request, features)


def _kind(model):
    if getattr(model, "_is_graph_network", False) or type(model).__name__ in (
            "Functional", "Sequential"):
        return "functional"
    return type(model).__name__


def _spec(shape, dtype, name):
    return tf.TensorSpec(tf.TensorShape(shape), tf.as_dtype(dtype), name=name)


def request_of(model, input_signature):
    """The `Request` the model's `call` takes: from `input_signature`, else the model's own."""
    structure, source = input_signature, "input_signature"
    if structure is None and hasattr(model, "input_signature"):
        structure, source = model.input_signature, "model.input_signature"
        structure = structure() if callable(structure) else structure
    if structure is None and getattr(model, "inputs", None):
        try:
            structure = model.input   # a dict when the model takes a dict
        except AttributeError:        # a Keras 3 Sequential has `inputs` only
            structure = list(model.inputs)
            structure = structure[0] if len(structure) == 1 else structure
        source = "the model's inputs"
    if structure is None and callable(getattr(model, "save_spec", None)):
        saved = model.save_spec(dynamic_batch=True)   # tf_keras: recorded at the first call
        if saved and saved[0]:
            structure, source = saved[0][0], "the model's recorded input spec"
    if structure is None:
        raise ValueError(f"model {getattr(model, 'name', model)!r} ({type(model).__name__}) has "
                         f"no known request signature; pass input_signature (a tf.TensorSpec, "
                         f"or a dict / list of them, as the model's call takes its inputs)")
    if isinstance(structure, dict):
        items, form = list(structure.items()), "dict"
    elif isinstance(structure, (list, tuple)):
        items = [(getattr(t, "name", None) or f"input_{i}", t) for i, t in enumerate(structure)]
        form = "list"
    else:
        items, form = [(getattr(structure, "name", None) or "input", structure)], "single"
    specs = {}
    for name, tensor in items:
        name = name.split(":")[0]
        if isinstance(tensor, (dict, list, tuple)):
            raise ValueError(f"{source}: input {name!r} is nested; the sharded export "
                                      f"takes a flat dict or list of tensors")
        type_spec = getattr(tensor, "type_spec", tensor)
        if (getattr(tensor, "sparse", False) or getattr(tensor, "ragged", False)
                or isinstance(type_spec, (tf.SparseTensorSpec, tf.RaggedTensorSpec))):
            raise ValueError(f"{source}: input {name!r} is sparse/ragged; the sharded "
                                      f"export takes dense ids")
        if name in specs:
            raise ValueError(f"{source}: two inputs are named {name!r}")
        specs[name] = _spec(tensor.shape, tensor.dtype, name)
    return Request(specs, form)


def _placeholders(request, values):
    """{graph tensor ref: input name} of the request tensors a trace was called on."""
    return {values[name].ref(): name for name in request.specs}


def _probe(model, request):
    """Traces the model once, recording each embedding layer's ids: [FeatureCut]."""
    calls = []

    def record(layer, ids):
        if isinstance(layer, (de_layers.SquashedEmbedding, de_layers.FieldWiseEmbedding)):
            raise ValueError(f"layer {layer.name!r}: {type(layer).__name__} is not "
                                      f"supported by the sharded export (use "
                                      f"de.keras.layers.Embedding with pooling)")
        if layer.max_norm is not None:
            raise ValueError(f"layer {layer.name!r}: max_norm is not supported by the "
                                      f"sharded export")
        if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
            raise ValueError(f"layer {layer.name!r} is called on a "
                                      f"{type(ids).__name__}; the sharded export takes dense ids")
        ids = tf.convert_to_tensor(ids)
        cells = ids.shape if layer.pooling is None else ids.shape[:-1]
        if layer.pooling is not None and ids.shape.rank is not None and ids.shape.rank < 1:
            raise ValueError(f"layer {layer.name!r} pools scalar ids")
        calls.append((layer, ids))
        dynamic = tf.shape(ids) if layer.pooling is None else tf.shape(ids)[:-1]
        rows = tf.zeros(tf.concat([dynamic, [layer.params.dim]], 0), layer.params.value_dtype)
        rows.set_shape(cells.concatenate([layer.params.dim]))
        return rows

    traced = {}

    def probe(values):
        traced["values"] = values
        with de_layers.intercept_calls(record):
            return model(request.model_args(values), training=False)

    tf.function(probe).get_concrete_function(dict(request.specs))
    sources = _placeholders(request, traced["values"])
    features, seen = [], {}
    for layer, ids in calls:
        if id(layer) in seen:
            count = sum(1 for other, _ in calls if other is layer)
            raise ValueError(
                f"layer {layer.name!r} is called {count} times in model {model.name!r} (a "
                f"shared table); the sharded export needs one call per embedding layer")
        if any(f.name == layer.name for f in features):
            raise ValueError(f"model {model.name!r} has two embedding layers named "
                             f"{layer.name!r}; the sharded export names features by layer")
        seen[id(layer)] = layer
        name, column = _ids_source(layer, ids, sources)
        shape = ids.shape if layer.pooling is None else ids.shape[:-1]
        features.append(FeatureCut(
            layer.name, layer, name, column, layer.pooling,
            _spec(shape.concatenate([layer.params.dim]), layer.params.value_dtype, layer.name)))
    return features


def _ids_source(layer, ids, sources):
    """(request input, column or None) that `ids` are read from, through casts and identities."""
    tensor, column = ids, None
    while tensor.ref() not in sources:
        op = tensor.op
        if op.type == "Identity" or (op.type == "Cast" and op.inputs[0].dtype.is_integer
                                     and tensor.dtype.is_integer):
            tensor = op.inputs[0]
            continue
        if op.type == "StridedSlice" and column is None:
            column = _column_of(op)
            if column is not None:
                tensor = op.inputs[0]
                continue
        raise ValueError(
            f"layer {layer.name!r} looks up ids computed inside the model (op {op.name!r} "
            f"of type {op.type}): the sharded export needs ids read from a request input or one "
            f"column of it (inputs['ids'][:, i]); compute ids before the request instead")
    return sources[tensor.ref()], column


def _column_of(op):
    """i when the StridedSlice `op` is x[:, i] (x of rank >= 2), else None."""
    begin, end, strides = (tf.get_static_value(t) for t in op.inputs[1:4])
    if begin is None or end is None or strides is None or len(begin) != 2:
        return None
    masks = {name: op.get_attr(name) for name in ("begin_mask", "end_mask", "ellipsis_mask",
                                                  "new_axis_mask", "shrink_axis_mask")}
    if (masks["begin_mask"] & 1 == 0 or masks["end_mask"] & 1 == 0 or masks["ellipsis_mask"]
            or masks["new_axis_mask"] or masks["shrink_axis_mask"] != 2
            or list(strides) != [1, 1]):
        return None
    column = int(begin[1])
    if column < 0:
        width = op.inputs[0].shape[1] if op.inputs[0].shape.rank else None
        if width is None:
            return None
        column += int(width)
    return column


def _output_names(structure):
    if isinstance(structure, dict):
        return list(structure)
    flat = tf.nest.flatten(structure)
    return ["prediction"] if len(flat) == 1 else [f"output_{i}" for i in range(len(flat))]


def _as_dict(names, outputs):
    if isinstance(outputs, dict):
        return {name: outputs[name] for name in names}
    return dict(zip(names, tf.nest.flatten(outputs)))


def _dense_part(model, request, features):
    """Traces the model with the embedding outputs fed in; finds the request inputs main needs."""
    pooled_specs = {f.name: f.output_spec for f in features}

    def feed(pooled):
        def interceptor(layer, _):
            if layer.name not in pooled:
                raise ValueError(f"layer {layer.name!r} was not called in the probe trace; the "
                                 f"model's call must look up the same layers every time")
            return pooled[layer.name]
        return interceptor

    traced = {}

    def dense(values, pooled):
        with de_layers.intercept_calls(feed(pooled)):
            outputs = model(request.model_args(values), training=False)
        traced.update(values=values, outputs=outputs)
        return outputs

    concrete = tf.function(dense).get_concrete_function(dict(request.specs), pooled_specs)
    needed = _inputs_reached(tf.nest.flatten(traced["outputs"]),
                             _placeholders(request, traced["values"]))
    main_inputs = {name: spec for name, spec in request.specs.items() if name in needed}
    variables = list(concrete.variables)
    handles = {v.handle.ref() for v in variables}
    stray = [t for t in concrete.captured_inputs
             if t.dtype == tf.resource and t.ref() not in handles]
    if stray:
        raise ValueError(f"model {model.name!r} reads a table or resource outside its "
                                  f"de.keras.layers.Embedding layers ({len(stray)} captured); "
                                  f"the main shard holds dense variables only")
    names = _output_names(traced["outputs"])

    def dense_call(dense_inputs, pooled):
        # Inputs main does not get reach no output: any value of their dtype stands in.
        values = {name: dense_inputs[name] if name in main_inputs else _stand_in(spec)
                  for name, spec in request.specs.items()}
        with de_layers.intercept_calls(feed(pooled)):
            return _as_dict(names, model(request.model_args(values), training=False))

    return ModelCut(features, dict(request.specs), main_inputs, names, dense_call, variables,
                    _kind(model))


def _inputs_reached(outputs, sources):
    """The names of the request inputs that `outputs` depend on (walking the trace's graph)."""
    reached, stack, visited = set(), [t.op for t in outputs if hasattr(t, "op")], set()
    for tensor in outputs:
        if hasattr(tensor, "ref") and tensor.ref() in sources:
            reached.add(sources[tensor.ref()])
    while stack:
        op = stack.pop()
        if op.name in visited:
            continue
        visited.add(op.name)
        for tensor in op.inputs:
            if tensor.ref() in sources:
                reached.add(sources[tensor.ref()])
            stack.append(tensor.op)
        stack.extend(op.control_inputs)
    return reached


def _stand_in(spec):
    if spec.shape.rank is None:
        raise ValueError(f"input {spec.name!r} has an unknown rank; give its rank in "
                                  f"input_signature")
    shape = [1 if d is None else d for d in spec.shape.as_list()]
    if spec.dtype == tf.string:
        return tf.fill(shape, "")
    return tf.zeros(shape, spec.dtype)
