"""numpy arrays <-> TensorProtos for the gRPC paths, without TensorFlow's general converters.

`tf.make_tensor_proto` and `tf.make_ndarray` accept anything and check everything; a shard call
converts dozens of small arrays each way (ids, segments and counts per table piece), where their
per-call cost adds up to milliseconds. Numbers here go as one `tensor_content` buffer (the layout
TF Serving and `tf.make_ndarray` read), strings as `string_val`; protos from other writers (e.g.
`float_val` from a client that filled them by hand) are read by `tf.make_ndarray`.

Example:
    >>> import numpy as np
    >>> from tensorflow.core.framework import tensor_pb2
    >>> proto = tensor_pb2.TensorProto()
    >>> fill(proto, np.array([[1, 2], [3, 4]], np.int64))
    >>> to_array(proto)
    array([[1, 2],
           [3, 4]])
    >>> fill(proto, np.array(["a", "bc"]))
    >>> to_array(proto)
    array([b'a', b'bc'], dtype=object)
"""

import sys

import numpy as np

# numpy dtype -> TensorFlow's DataType enum value (types.proto): the dtypes sent as bytes.
_NUMERIC = {np.dtype(np.float32): 1, np.dtype(np.float64): 2, np.dtype(np.int32): 3,
            np.dtype(np.uint8): 4, np.dtype(np.int16): 5, np.dtype(np.int8): 6,
            np.dtype(np.int64): 9, np.dtype(np.bool_): 10, np.dtype(np.uint16): 17,
            np.dtype(np.float16): 19, np.dtype(np.uint32): 22, np.dtype(np.uint64): 23}
_BY_ENUM = {enum: dtype for dtype, enum in _NUMERIC.items()}
DT_STRING = 7
_LITTLE = sys.byteorder == "little"


def fill(proto, value):
    """Writes array-like `value` into TensorProto `proto` (cleared first)."""
    array = np.asarray(value)
    proto.Clear()
    for size in array.shape:
        proto.tensor_shape.dim.add().size = size
    enum = _NUMERIC.get(array.dtype)
    if enum is not None and _LITTLE:
        proto.dtype = enum
        proto.tensor_content = np.ascontiguousarray(array).tobytes()
        return
    if array.dtype.kind in "SUO":
        proto.dtype = DT_STRING
        proto.string_val.extend(item.encode() if isinstance(item, str) else bytes(item)
                                for item in array.reshape(-1).tolist())
        return
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    proto.CopyFrom(tf.make_tensor_proto(array))   # any other dtype, or a big-endian host


def to_array(proto):
    """The np.ndarray of TensorProto `proto` (strings as an object array of bytes)."""
    shape = [dim.size for dim in proto.tensor_shape.dim]
    dtype = _BY_ENUM.get(proto.dtype)
    if dtype is not None and _LITTLE and proto.tensor_content:
        return np.frombuffer(proto.tensor_content, dtype).reshape(shape).copy()
    if proto.dtype == DT_STRING and len(proto.string_val) == int(np.prod(shape)):
        values = np.empty(len(proto.string_val), object)
        values[:] = list(proto.string_val)
        return values.reshape(shape)
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.make_ndarray(proto)
