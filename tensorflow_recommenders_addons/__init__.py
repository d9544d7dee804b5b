"""Alias package: `import tensorflow_recommenders_addons.dynamic_embedding as de`.

`dynamic_embedding` is `tfra_dynamic_embedding` itself. Importing it does what TFRA's import
does, all in `tfra_dynamic_embedding.compat.install()`: registers this package's kernels with
TensorFlow (so that a plain `tf.distribute.Server` in the same process, a parameter server, can
host native tables placed on it by remote clients), its Keras layers and wrapped optimizers with
Keras (so that saved models load), patches `tf.TensorShape.as_list` as TFRA does, makes TFRA's
module paths (`tensorflow_recommenders_addons.dynamic_embedding.python.*`) importable and gives
`de.Variable` TFRA's method forms. (`import tfra_dynamic_embedding` alone does none of this:
`tfra-de` commands that need no TensorFlow start fast.)
"""

import sys

import tfra_dynamic_embedding as dynamic_embedding
from tfra_dynamic_embedding import compat as _compat

# Register the alias so `import tensorflow_recommenders_addons.dynamic_embedding` (and its
# submodules such as `.keras`) resolve to the real package's module objects.
sys.modules[__name__ + ".dynamic_embedding"] = dynamic_embedding

_compat.install()

__version__ = dynamic_embedding.__version__

__all__ = ["dynamic_embedding"]
