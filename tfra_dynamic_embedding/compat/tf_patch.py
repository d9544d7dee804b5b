"""TFRA's patch of TensorFlow, `de.patch_on_tf()`: an unknown-rank shape lists as [].

TFRA's import patches `tf.TensorShape.as_list` so that a shape of unknown rank returns [] where
TensorFlow raises ValueError, and TFRA code leans on it (its own Keras layers read
`shape.as_list()` of inputs whose rank is unknown). Importing `tensorflow_recommenders_addons`
applies the same patch, so that code runs unchanged; `import tfra_dynamic_embedding` alone
leaves TensorFlow as it is. Shapes of known rank list as before.

Example:
    >>> patch_on_tf()                                  # idempotent
    >>> tf.TensorShape(None).as_list()
    []
"""

import tensorflow as tf

_tf_as_list = tf.TensorShape.as_list


def _as_list(self):
    """TensorShape.as_list, with [] for a shape of unknown rank (TFRA's behaviour)."""
    if self.rank is None:
        return []
    return _tf_as_list(self)


def patch_on_tf():
    """Applies TFRA's patch of TensorFlow (see the module docstring); calling again is a no-op."""
    tf.TensorShape.as_list = _as_list
