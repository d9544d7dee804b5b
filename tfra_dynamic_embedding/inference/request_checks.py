"""Strict checking of a TF Serving REST predict body against the model's signatures.

TF Serving refuses a request whose values do not fit the signature's TensorSpecs instead of
casting them; a client written against it expects the same refusal from us. `check_predict`
turns a decoded JSON body into one signature's input arrays, or raises `BadRequest` (HTTP 400)
naming the input and what was expected -- in TF Serving's words where it has them -- before
anything (a shard) sees the request:

* dtype: an integer input takes JSON integers only (no `1.5`, no `1.0`, no `true`, no `"1"`) in
  the dtype's range (`2**63` is refused for int64); a float input takes numbers (not bools, not
  strings) that the dtype holds without loss of precision; a bool input takes `true`/`false`; a
  string input takes strings or `{"b64": "..."}` (not numbers).
* shape: the nesting depth is the signature's rank, every list at one level has the same
  length, and the dims the signature knows match.
* names: an input the signature does not have, or one it has that the request lacks, is refused;
  so is a `signature_name` the model does not have.

Example:
    >>> signatures = {"serving_default": Signature(
    ...     {"user": TensorSpec("int64", (None,)), "tags": TensorSpec("string", (None, 2))},
    ...     {"score": TensorSpec("float32", (None, 1))})}
    >>> request = check_predict({"instances": [{"user": 7, "tags": ["a", {"b64": "Yg=="}]}]},
    ...                         signatures, "dlrm")
    >>> request.signature_name, request.row_format, request.inputs["tags"]
    ('serving_default', True, array([[b'a', b'b']], dtype=object))
    >>> check_predict({"instances": [{"user": 1.5, "tags": ["a", "b"]}]}, signatures, "dlrm")
    Traceback (most recent call last):
    ...
    tfra_dynamic_embedding.inference.request_checks.BadRequest: input 'user': JSON Value: 1.5 \
Type: Number is not of expected type: int64
"""

import base64
import binascii
import dataclasses
import itertools
import json
from typing import Optional, Tuple

import numpy as np

SERVING_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"

_INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
# The largest integer each float type holds exactly: TF Serving refuses bigger JSON integers
# for float inputs ("without loss of precision") rather than round them.
_FLOAT_DTYPES = {"float16": (2 ** 11 - 1, "half"), "bfloat16": (2 ** 8 - 1, "bfloat16"),
                 "float32": (2 ** 24 - 1, "float"), "float64": (2 ** 53 - 1, "double")}


class BadRequest(ValueError):
    """A request the signature refuses: HTTP 400 with `{"error": str(error)}`."""


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One signature input or output: dtype name ("int64", "float32", "string", "bool", ...),
    shape (None: unknown rank; a None dim: any size) and its graph tensor name (metadata)."""

    dtype: str
    shape: Optional[Tuple[Optional[int], ...]]
    name: str = ""

    def shape_text(self):
        """The shape as TF Serving prints it: [-1,3] (unknown dims -1), [?] for unknown rank."""
        if self.shape is None:
            return "[?]"
        return "[" + ",".join("-1" if d is None else str(d) for d in self.shape) + "]"


@dataclasses.dataclass
class Signature:
    """A signature's inputs and outputs ({alias: TensorSpec}) and its method name."""

    inputs: dict
    outputs: dict
    method_name: str = PREDICT_METHOD

    @classmethod
    def from_signature_def(cls, signature_def):
        """From a `SignatureDef` proto (a SavedModel's saved_model.pb)."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def spec(info):
            shape = None if info.tensor_shape.unknown_rank else tuple(
                None if d.size < 0 else int(d.size) for d in info.tensor_shape.dim)
            return TensorSpec(tf.dtypes.as_dtype(info.dtype).name, shape, info.name)

        return cls({k: spec(v) for k, v in signature_def.inputs.items()},
                   {k: spec(v) for k, v in signature_def.outputs.items()},
                   signature_def.method_name or PREDICT_METHOD)


@dataclasses.dataclass
class Request:
    """A checked predict request: the signature it runs, its inputs ({alias: np.ndarray} of the
    signature's dtypes; strings as bytes) and whether it came in row format."""

    signature_name: str
    inputs: dict
    row_format: bool


def signature_named(body, signatures, model_name):
    """(name, Signature) of the body's `signature_name` (default serving_default)."""
    if not isinstance(body, dict):
        raise BadRequest(f"JSON Value: {_text(body)} is not a JSON object: the body must be "
                         f"{{\"instances\": [...]}} or {{\"inputs\": ...}}")
    name = body.get("signature_name", SERVING_SIGNATURE)
    if not isinstance(name, str):
        raise BadRequest(f"JSON Value: {_text(name)} not formatted correctly. 'signature_name' "
                         f"key must be a string value.")
    if name not in signatures:
        raise BadRequest(f"Serving signature name: \"{name}\" not found in signature def "
                         f"(model '{model_name}' has {_set(signatures)})")
    return name, signatures[name]


def check_predict(body, signatures, model_name="model"):
    """The checked `Request` of a decoded predict body; raises `BadRequest` (see the module)."""
    name, signature = signature_named(body, signatures, model_name)
    extra = sorted(set(body) - {"signature_name", "instances", "inputs"})
    if extra or ("instances" in body) == ("inputs" in body):
        raise BadRequest("the body must be a JSON object with exactly one of 'instances' (row "
                         "format) or 'inputs' (columnar format), and optionally "
                         f"'signature_name'; got keys {sorted(body)}")
    specs = signature.inputs
    if "instances" in body:
        values = _columns_of_rows(body["instances"], specs, model_name)
        row_format = True
    else:
        values = body["inputs"]
        if not _names_inputs(values, specs):
            if len(specs) != 1:
                raise BadRequest(f"'inputs' must be an object naming the inputs "
                                 f"{_set(specs)} of signature '{name}'")
            values = {next(iter(specs)): values}
        row_format = False
    _check_names(values, specs, model_name)
    return Request(name, {alias: to_array(values[alias], specs[alias], alias, row_format)
                          for alias in specs}, row_format)


def check_examples(body, signature, method):
    """The serialized tf.Examples of a TF Serving :classify / :regress body
    (`{"examples": [{feature: value or list}, ...], "context": {...}}`, the context's features
    added to every example): a 1-D object array of bytes for the signature's one string input.
    A feature's values are int64s (JSON integers), floats (decimals) or bytes (strings,
    `{"b64": ...}`), one kind per feature; anything else is a `BadRequest`.

    Example:
        >>> sig = Signature({"inputs": TensorSpec("string", (None,))}, {}, CLASSIFY_METHOD)
        >>> serialized = check_examples({"examples": [{"age": 3}], "context": {"c": "x"}}, sig,
        ...                             "classify")
        >>> import tensorflow as tf
        >>> tf.train.Example.FromString(serialized[0]).features.feature["c"].bytes_list.value
        [b'x']
    """
    from tensorflow.core.example import example_pb2  # pylint: disable=import-outside-toplevel
    if not isinstance(body, dict) or not isinstance(body.get("examples"), list) \
            or not body["examples"]:
        raise BadRequest(f":{method} takes a JSON object whose 'examples' is a non-empty list of "
                         f"objects (and optionally 'context' and 'signature_name')")
    extra = sorted(set(body) - {"examples", "context", "signature_name"})
    if extra:
        raise BadRequest(f":{method} takes 'examples', 'context' and 'signature_name'; got "
                         f"also {extra}")
    if len(signature.inputs) != 1 or next(iter(signature.inputs.values())).dtype != "string":
        raise BadRequest(f"a {method} signature takes one string input (serialized "
                         f"tf.Examples); this one takes {_set(signature.inputs)}")
    context = body.get("context", {})
    if not isinstance(context, dict):
        raise BadRequest(f"'context' must be an object of features; got {_text(context)}")
    serialized = []
    for index, features in enumerate(body["examples"]):
        if not isinstance(features, dict):
            raise BadRequest(f"item {index} of 'examples' must be an object of features; got "
                             f"{_text(features)}")
        example = example_pb2.Example()
        for name, value in {**context, **features}.items():
            _fill_feature(example.features.feature[name], name, value)
        serialized.append(example.SerializeToString())
    array = np.empty(len(serialized), dtype=object)
    array[:] = serialized
    return array


def _fill_feature(feature, name, value):
    values = value if isinstance(value, list) else [value]
    kinds = {_feature_kind(v) for v in values}
    if None in kinds or len(kinds) > 1:
        raise BadRequest(f"feature '{name}': JSON Value: {_text(value)} must be integers, "
                         f"decimals or strings (or {{\"b64\": ...}}), one kind per feature")
    kind = kinds.pop() if kinds else "bytes"
    if kind == "int64":
        if not all(-2 ** 63 <= v < 2 ** 63 for v in values):
            raise BadRequest(f"feature '{name}': JSON Value: {_text(value)} is out of int64's "
                             f"range")
        feature.int64_list.value.extend(values)
    elif kind == "float":
        feature.float_list.value.extend(values)
    else:
        feature.bytes_list.value.extend(_leaf_converter("string")(v, name) for v in values)


def _feature_kind(value):
    if isinstance(value, bool) or value is None:
        return None
    return {int: "int64", float: "float", str: "bytes", dict: "bytes"}.get(type(value))


def to_array(value, spec, alias, batched_rows=False):
    """The np.ndarray of one input's JSON value, checked against `spec` (dtype, rank, dims).
    `batched_rows`: the value is the list of that input's values of every instance."""
    shape = _shape_of(value, alias, spec, batched_rows)
    array = _fast_array(value, shape, spec.dtype)
    if array is not None:
        return array
    # The slow path finds (and names) the first value that does not fit.
    flat = []
    _flatten(value, 0, shape, flat, alias)
    convert = _leaf_converter(spec.dtype)
    converted = [convert(v, alias) for v in flat]
    if spec.dtype == "string":
        array = np.empty(len(converted), dtype=object)   # bytes as they are: no NUL stripping
        array[:] = converted
        return array.reshape(shape)
    return np.array(converted, dtype=_numpy_dtype(spec.dtype)).reshape(shape)


def _fast_array(value, shape, dtype):
    """The array of a well-formed value of an int / float / bool dtype, converted a level and
    a type at a time (a batch of 1,024 rows of 117 values: ~5x faster than value by value);
    None when anything is unusual (the slow path then names what)."""
    if dtype not in _INT_DTYPES and dtype not in _FLOAT_DTYPES and dtype != "bool":
        return None
    items = [value]
    for size in shape:
        if set(map(type, items)) != {list} or set(map(len, items)) != {size}:
            return None
        items = list(itertools.chain.from_iterable(items))
    kinds = set(map(type, items))
    try:
        if dtype in _INT_DTYPES:
            if not kinds <= {int}:
                return None
            array = np.array(items, dtype=np.int64 if dtype != "uint64" else np.uint64)
            info = np.iinfo(dtype)
            if array.size and (array.min() < info.min or array.max() > info.max):
                return None
        elif dtype == "bool":
            if not kinds <= {bool}:
                return None
            array = np.array(items, dtype=bool)
        else:
            exact = _FLOAT_DTYPES[dtype][0]
            if not kinds <= {int, float} or (int in kinds and max(
                    abs(v) for v in items if isinstance(v, int)) > exact):   # (no bools here)
                return None
            array = np.array(items, dtype=np.float64)
            limit = float(np.finfo(np.float32 if dtype == "bfloat16" else dtype).max)
            finite = array[np.isfinite(array)]
            if finite.size and np.abs(finite).max() > limit:
                return None
    except (OverflowError, ValueError):   # an integer beyond 64 bits
        return None
    return array.astype(_numpy_dtype(dtype)).reshape(shape)


def _columns_of_rows(instances, specs, model_name):
    """{alias: [value of every instance]} of a row-format 'instances' list."""
    if not isinstance(instances, list) or not instances:
        raise BadRequest("'instances' must be a non-empty list")
    named = [_names_inputs(row, specs) for row in instances]
    if not any(named):
        if len(specs) != 1:
            raise BadRequest(f"every item of 'instances' must be an object naming the inputs "
                             f"{_set(specs)}; item 0 is {_text(instances[0])}")
        return {next(iter(specs)): instances}
    for index, row in enumerate(instances):
        if not named[index]:
            raise BadRequest(f"item {index} of 'instances' is {_text(row)}: every item must be "
                             f"an object naming the inputs {_set(specs)}")
        try:
            _check_names(row, specs, model_name)
        except BadRequest as error:
            raise BadRequest(f"item {index} of 'instances': {error}") from None
    return {alias: [row[alias] for row in instances] for alias in specs}


def _names_inputs(value, specs):
    """Whether `value` is an object of named inputs (not a {"b64": ...} string value)."""
    return isinstance(value, dict) and not (_is_b64(value) and "b64" not in specs)


def _check_names(values, specs, model_name):
    unknown = sorted(set(values) - set(specs))
    if unknown:
        raise BadRequest(f"input tensor alias not found in signature: {unknown[0]}. Inputs "
                         f"expected to be in the set {_set(specs)}.")
    missing = sorted(set(specs) - set(values))
    if missing:
        raise BadRequest(f"Request inputs do not match required inputs for model "
                         f"`{model_name}`. Send extra: {{}}. Missing but required: "
                         f"{_set(missing)}.")


def _shape_of(value, alias, spec, batched_rows):
    """The shape of a nested JSON list, read along its first items; checked against `spec`."""
    shape, item = [], value
    while isinstance(item, list):
        shape.append(len(item))
        if not item:
            break
        item = item[0]
    if spec.shape is not None:
        expected = spec.shape
        fits = len(shape) == len(expected) and all(
            want is None or want == got for want, got in zip(expected, shape))
        # An empty list ends the walk early: its missing dims are unknown, not wrong.
        if not fits and shape and shape[-1] == 0 and len(shape) < len(expected):
            fits = all(w is None or w == g for w, g in zip(expected, shape))
            shape += [w or 0 for w in expected[len(shape):]]
        if not fits:
            got = TensorSpec(spec.dtype, tuple(shape)).shape_text()
            rows = (" (the batch of 'instances', then the instance's value)"
                    if batched_rows else "")
            raise BadRequest(f"input '{alias}': got shape {got}{rows}; the signature expects "
                             f"{spec.dtype} of shape {spec.shape_text()}")
    return tuple(shape)


def _flatten(value, level, shape, out, alias):
    """Appends the leaves of `value` to `out`; every list at a level has the size of `shape`."""
    if not isinstance(value, list):
        if level != len(shape):
            raise BadRequest(f"input '{alias}': JSON Value: {_text(value)} found at incorrect "
                             f"level: {level + 1} in the JSON DOM. Expected at level: "
                             f"{len(shape)}")
        out.append(value)
        return
    if level >= len(shape):
        raise BadRequest(f"input '{alias}': Encountered list at unexpected level: {level} "
                         f"expected < {len(shape)}")
    if len(value) != shape[level]:
        raise BadRequest(f"input '{alias}': Encountered list at unexpected size: {len(value)} "
                         f"at level: {level} expected size: {shape[level]}")
    for item in value:
        _flatten(item, level + 1, shape, out, alias)


def _leaf_converter(dtype):
    if dtype in _INT_DTYPES:
        info = np.iinfo(dtype)

        def integer(value, alias):
            # bool is an int in Python; JSON true is not an integer.
            if type(value) is not int:  # pylint: disable=unidiomatic-typecheck
                raise _type_error(value, dtype, alias)
            if not info.min <= value <= info.max:
                raise BadRequest(f"{_type_error(value, dtype, alias)} (out of its range "
                                 f"[{info.min}, {info.max}])")
            return value
        return integer
    if dtype in _FLOAT_DTYPES:
        exact, tf_name = _FLOAT_DTYPES[dtype]
        limit = float(np.finfo(np.float32 if dtype == "bfloat16" else dtype).max)

        def decimal(value, alias):
            if type(value) is int:  # pylint: disable=unidiomatic-typecheck
                if abs(value) > exact:
                    raise _lossy(value, tf_name, alias)
                return float(value)
            if type(value) is not float:  # pylint: disable=unidiomatic-typecheck
                raise _type_error(value, dtype, alias)
            if np.isfinite(value) and abs(value) > limit:
                raise _lossy(value, tf_name, alias)
            return value
        return decimal
    if dtype == "bool":
        def boolean(value, alias):
            if not isinstance(value, bool):
                raise _type_error(value, dtype, alias)
            return value
        return boolean
    if dtype == "string":
        def string(value, alias):
            if isinstance(value, str):
                return value.encode("utf-8")
            if isinstance(value, dict):
                if not _is_b64(value):
                    raise BadRequest(f"input '{alias}': JSON Value: {_text(value)} not "
                                     f"formatted correctly for base64 data")
                try:
                    return base64.b64decode(value["b64"], validate=True)
                except (binascii.Error, ValueError):
                    raise BadRequest(f"input '{alias}': Unable to base64 decode "
                                     f"{_text(value['b64'])}") from None
            raise _type_error(value, dtype, alias)
        return string
    raise BadRequest(f"Conversion of JSON values to type {dtype} is not supported")


def _numpy_dtype(dtype):
    if dtype == "bfloat16":   # numpy has none: TF converts float32 without loss of range
        return np.float32
    return np.dtype(dtype)


def _is_b64(value):
    return isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str)


def _type_error(value, dtype, alias):
    return BadRequest(f"input '{alias}': JSON Value: {_text(value)} Type: {_json_type(value)} "
                      f"is not of expected type: {dtype}")


def _lossy(value, tf_name, alias):
    return BadRequest(f"input '{alias}': Cannot convert JSON value: {_text(value)} to "
                      f"{tf_name} without loss of precision.")


def _json_type(value):
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    return {int: "Number", float: "Number", str: "String", list: "Array",
            dict: "Object"}.get(type(value), type(value).__name__)


def _text(value, limit=80):
    """A JSON value as the client sent it, cut to `limit` characters."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _set(names):
    return "{" + ",".join(sorted(names)) + "}"
