"""Keras integration: `de.keras.layers.Embedding`, `SquashedEmbedding`, `FieldWiseEmbedding`,
`LayerNormalization`; `de.keras.models.save_model` (a SavedModel of either Keras's model);
`de.keras.callbacks.ModelCheckpoint`.

Each layer is a layer of one Keras, chosen when it is constructed (`binding.resolve`): `keras=`
("keras" for Keras 3, "tf_keras"), else the Keras of Keras objects among its arguments (e.g. a
tf_keras initializer), else the Keras `tf.keras` is (tf_keras when `TF_USE_LEGACY_KERAS=1` was
set before TensorFlow's Keras loaded, else Keras 3).

Example:
    >>> import tf_keras
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> layer = de.keras.layers.Embedding(8, keras="tf_keras")   # for a tf_keras.Model
    >>> isinstance(layer, tf_keras.layers.Layer)
    True
"""

from tfra_dynamic_embedding.keras import callbacks
from tfra_dynamic_embedding.keras import layers
from tfra_dynamic_embedding.keras import models

__all__ = ["callbacks", "layers", "models"]
