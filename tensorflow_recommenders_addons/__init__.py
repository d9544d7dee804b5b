"""Alias package: `import tensorflow_recommenders_addons.dynamic_embedding as de`.

`dynamic_embedding` is `tfra_dynamic_embedding` itself. As TFRA does, importing it registers
this package's kernels with TensorFlow, so that a plain `tf.distribute.Server` in the same
process (a parameter server) can host native tables placed on it by remote clients, and its
Keras layers and wrapped optimizers with Keras, so that saved models load; it also patches
`tf.TensorShape.as_list` as TFRA does and makes TFRA's module paths
(`tensorflow_recommenders_addons.dynamic_embedding.python.*`) importable.
(`import tfra_dynamic_embedding` alone stays light: `tfra-de` commands that need no TensorFlow
start fast.)
"""

import sys

import tfra_dynamic_embedding as dynamic_embedding
from tfra_dynamic_embedding.tables import native as _native

# Register the alias so `import tensorflow_recommenders_addons.dynamic_embedding` (and its
# submodules such as `.keras`) resolve to the real package's module objects.
sys.modules[__name__ + ".dynamic_embedding"] = dynamic_embedding

_native.is_available()  # loads the op library (a warning, not an error, when it is not built)

# As TFRA's import does: Keras knows the de.keras layers and the wrapped optimizers by name from
# here on, so that `tf.keras.models.load_model` of a saved model finds them in a new process.
from tfra_dynamic_embedding import optimizer as _optimizer  # pylint: disable=wrong-import-position
from tfra_dynamic_embedding.keras import layers as _layers  # pylint: disable=wrong-import-position,unused-import

_optimizer.register_keras_optimizers()

# As TFRA's import does: an unknown-rank TensorShape lists as [] (tfra_dynamic_embedding/tf_patch.py).
from tfra_dynamic_embedding import tf_patch as _tf_patch  # pylint: disable=wrong-import-position

_tf_patch.patch_on_tf()

# TFRA's own module paths (`...dynamic_embedding.python.ops.data_flow_ops`, ...) import too.
from tfra_dynamic_embedding import tfra_module_paths as _tfra_module_paths  # pylint: disable=wrong-import-position

_tfra_module_paths.install()

__version__ = dynamic_embedding.__version__

__all__ = ["dynamic_embedding"]
