"""SavedModels that TFRA itself exported load and serve here (tests/data/tfra_checkpoints/
{savedmodel, keras_savedmodel}, written by tools/write_tfra_checkpoints.py with TFRA 0.8.1).
Their graphs name TFRA's ops (TFRA>CuckooHashTable*, TFRA>DynamicPartition, ...), which this
package's op library registers over its native table (cc/ops/de_tfra_ops.cc,
de_tfra_data_flow.cc); TFRA's rows come back from the SavedModel's own checkpoint."""

import json
import os

import numpy as np
import tensorflow as tf
import tf_keras
from tensorflow.core.protobuf import saved_model_pb2

import tensorflow_recommenders_addons.dynamic_embedding as de  # noqa: F401  (registers the ops)

DATA = os.path.join(os.path.dirname(__file__), "data", "tfra_checkpoints")
KEYS = np.arange(1, 21, dtype=np.int64)


def _saved(fmt):
    with open(os.path.join(DATA, f"{fmt}.json")) as f:
        return json.load(f)


def test_tfras_exported_module_serves_its_rows_and_defaults():
    saved = _saved("savedmodel")
    rows = {int(k): v for k, v in zip(saved["keys"], saved["values"])}
    items = dict(zip(*saved["slots"]["item"]))
    model = tf.saved_model.load(os.path.join(DATA, "savedmodel"))
    out = model.signatures["serving_default"](ids=tf.constant([1, 7, 20, 999, -5], tf.int64),
                                              names=tf.constant(["a", "e", "zz"]))
    user, item = out["user"].numpy(), out["item"].numpy()
    np.testing.assert_array_equal(user[:3], np.float32([rows[1], rows[7], rows[20]]))
    np.testing.assert_array_equal(user[3:], -np.ones([2, 4], np.float32))  # TFRA's default
    np.testing.assert_array_equal(item[:2], np.float32([items["a"], items["e"]]))
    np.testing.assert_array_equal(item[2], [-2.0, -2.0])
    # Every one of TFRA's 20 rows came back (keys 1..20 in two shards).
    every = model.signatures["serving_default"](ids=tf.constant(KEYS),
                                                names=tf.constant(list(items)))
    np.testing.assert_array_equal(every["user"].numpy(), np.float32([rows[k] for k in KEYS]))
    np.testing.assert_array_equal(every["item"].numpy(), np.float32(list(items.values())))


def _table_value_dtypes(path):
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    return {tf.dtypes.as_dtype(node.attr["value_dtype"].type)
            for graph in saved_model.meta_graphs for fn in graph.graph_def.library.function
            for node in fn.node_def if node.op == "TFRA>CuckooHashTableOfTensors"}


def test_tfras_exported_keras_model_predicts_as_tfra_did():
    want = np.array(_saved("keras_savedmodel")["slots"]["predict"], np.float32)
    # Ids 1..10 were trained one step, 11..20 never: restored rows must tell them apart.
    assert not np.allclose(want[:10], want[10:])
    path = os.path.join(DATA, "keras_savedmodel")
    # The layer's FrequencyRestrictPolicy keeps int32 status tables beside the float rows.
    assert _table_value_dtypes(path) == {tf.float32, tf.int32}
    served = tf.saved_model.load(path).signatures["serving_default"](
        ids=tf.constant(KEYS.reshape(-1, 1)))
    np.testing.assert_allclose(next(iter(served.values())).numpy(), want, rtol=1e-6)
    model = tf_keras.models.load_model(path)
    np.testing.assert_allclose(model.predict(KEYS.reshape(-1, 1), verbose=0), want, rtol=1e-6)
