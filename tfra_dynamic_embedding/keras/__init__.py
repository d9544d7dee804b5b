"""Keras integration: `de.keras.layers.Embedding`.

The layers subclass the `tf.keras` in use: Keras 3 by default, tf_keras when
`TF_USE_LEGACY_KERAS=1` is set before TensorFlow's Keras is first loaded.
"""

from tfra_dynamic_embedding.keras import layers

__all__ = ["layers"]
