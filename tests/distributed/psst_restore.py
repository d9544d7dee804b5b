"""Restores the checkpoint psst_train.py wrote, in one local process (no cluster, no strategy).

    psst_restore.py <work dir> <backends, e.g. native,builtin>

Builds the same Keras model and optimizer, restores <work dir>/ckpt, builds the optimizer's
slots (restored on creation), and compares every table's rows and slots with
<work dir>/tables.npz exactly. Prints one JSON line last.
"""

import json
import os
import sys

os.environ.pop("TF_CONFIG", None)   # a plain local process
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tensorflow_recommenders_addons.dynamic_embedding as de  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from psst_train import build_model, export  # noqa: E402  pylint: disable=wrong-import-position


def main(work_dir, backends):
    model, layers = build_model(backends)
    adam = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05))
    status = tf.train.Checkpoint(model=model, optimizer=adam).read(
        os.path.join(work_dir, "ckpt"))
    adam.build(model.trainable_variables)   # makes the slot tables, which restore on creation
    status.assert_existing_objects_matched()
    saved = np.load(os.path.join(work_dir, "tables.npz"))
    result = {"iterations": int(adam.iterations.numpy()), "tables": {}, "devices": {}}
    for layer in layers:
        for variable in [layer.params] + adam.get_slot_variables(layer.params):
            keys, values = export(variable)
            name = variable.name
            result["devices"][name] = variable.devices
            result["tables"][name] = {
                "size": int(keys.size),
                "keys_equal": bool(np.array_equal(keys, saved[name + "/keys"])),
                "values_equal": bool(np.array_equal(values, saved[name + "/values"])),
            }
    result["saved_tables"] = sorted(saved.files)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","))
