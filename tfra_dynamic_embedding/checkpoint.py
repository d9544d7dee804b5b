"""How a `de.Variable` is saved and restored.

A variable saves two tensors, all keys and all values of its shards, under fixed names; restoring
imports them re-partitioned over the shards the restoring variable has, so a checkpoint written
with 4 shards restores into 3 (or 1 into 4). TF2 `tf.train.Checkpoint` calls the variable's
`_serialize_to_tensors` / `_restore_from_tensors`; a `tf.compat.v1.train.Saver` in graph mode
finds the variable through the SAVEABLE_OBJECTS collection (`register_graph_saveable`).

Example:
    tf.train.Checkpoint(emb=w).save("/tmp/ckpt")                 # TF2
    saver = tf.compat.v1.train.Saver(); saver.save(sess, path)    # graph mode
"""

import tensorflow as tf
# The v1 Saver only understands SaveableObjects (TF 2.16-2.21: tensorflow.python.training.saving).
from tensorflow.python.training.saving import saveable_object

KEYS = "keys"
VALUES = "values"


class GraphSaveable(saveable_object.SaveableObject):
    """The v1 `Saver` view of a variable: `<name>-keys` and `<name>-values`."""

    def __init__(self, variable, name):
        self._variable = variable
        keys, values = variable.export()
        specs = [saveable_object.SaveSpec(keys, "", f"{name}-{KEYS}"),
                 saveable_object.SaveSpec(values, "", f"{name}-{VALUES}")]
        super().__init__(variable, specs, name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes  # The shapes come from the saved tensors themselves.
        keys, values = restored_tensors
        return self._variable.import_(keys, values)


def register_graph_saveable(variable, name):
    """Graph mode: make `tf.compat.v1.train.Saver()` save `variable` under `name`."""
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS,
                                   GraphSaveable(variable, name))
