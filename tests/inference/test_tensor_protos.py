"""inference/tensor_protos.py: its TensorProtos are what TensorFlow's converters read and write,
for every dtype and shape the gRPC paths send (numbers as bytes, strings, scalars, empty)."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from tfra_dynamic_embedding.inference import tensor_protos

VALUES = [np.arange(12, dtype=np.int64).reshape(3, 4) - 6, np.int32(7),
          np.array([[0.5, -1.25]], np.float32), np.array([1e300, -0.0], np.float64),
          np.array([True, False, True]), np.zeros([0, 3], np.float32),
          np.array([2 ** 63 - 1, -2 ** 63], np.int64), np.array([1, 2], np.uint8),
          np.array([1.5], np.float16), np.array([[b"a", b""], [b"\x00\xff", b"xyz"]]),
          np.array(["caf\u00e9", "t1"]), np.array([b"x"], object), np.array(b"scalar"),
          np.zeros([0], object)]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: f"{np.asarray(v).dtype}{np.shape(v)}")
def test_round_trips_equal_tensorflows_converters(value):
    proto = tensor_pb2.TensorProto()
    tensor_protos.fill(proto, value)
    expected = tf.make_ndarray(tf.make_tensor_proto(value))
    for read in (tensor_protos.to_array(proto), tf.make_ndarray(proto)):
        assert read.shape == expected.shape
        assert read.dtype == expected.dtype
        np.testing.assert_array_equal(read, expected)
    # And a proto written by TensorFlow reads back the same.
    np.testing.assert_array_equal(tensor_protos.to_array(tf.make_tensor_proto(value)), expected)


def test_protos_filled_value_by_value_are_read_too():
    proto = tensor_pb2.TensorProto(dtype=1, float_val=[1.5, 2.5])
    proto.tensor_shape.dim.add().size = 2
    np.testing.assert_array_equal(tensor_protos.to_array(proto), [1.5, 2.5])


def test_a_proto_of_the_wrong_length_is_a_value_error():
    proto = tensor_pb2.TensorProto(dtype=9, tensor_content=b"\x00" * 12)
    proto.tensor_shape.dim.add().size = 2
    with pytest.raises(ValueError):
        tensor_protos.to_array(proto)
