"""Alias package: `import tensorflow_recommenders_addons.dynamic_embedding as de`.

Holds no logic; `dynamic_embedding` is `tfra_dynamic_embedding` itself.
"""

import sys

import tfra_dynamic_embedding as dynamic_embedding

# Register the alias so `import tensorflow_recommenders_addons.dynamic_embedding` (and its
# submodules such as `.keras`) resolve to the real package's module objects.
sys.modules[__name__ + ".dynamic_embedding"] = dynamic_embedding

__version__ = dynamic_embedding.__version__

__all__ = ["dynamic_embedding"]
