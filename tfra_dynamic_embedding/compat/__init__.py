"""TFRA's surface that is not the core: what `tensorflow_recommenders_addons` users rely on.

Modules: shims of TFRA's API built on the core (`shadow_ops`, `warm_start_util`, `train`,
`horovod`, `math_ops`, `data_flow`), TFRA's patch of TensorFlow (`tf_patch`), TFRA's module
paths (`module_paths`) and TFRA's method forms on core classes (`methods`). The core never
imports this package.

`install()` applies what TFRA's import does, in one place; the alias package's import
(`import tensorflow_recommenders_addons.dynamic_embedding as de`) calls it, and nothing else
does: `import tfra_dynamic_embedding` alone registers, patches and loads nothing.

Example:
    >>> from tfra_dynamic_embedding import compat
    >>> compat.install()      # idempotent
    >>> compat.install()
"""

import importlib

# What TFRA's import does, in order: (module, function) of each step.
INSTALL_STEPS = (
    # This package's kernels, so that a plain tf.distribute.Server in this process (a parameter
    # server) can host native tables that remote clients place on it.
    ("tfra_dynamic_embedding.tables.native", "is_available"),
    # The Redis tables' kernels where they were built: a SavedModel of Redis-backed variables
    # loads in a process that has only imported the package (docs/redis.md).
    ("tfra_dynamic_embedding.tables.redis", "load_if_built"),
    # Keras knows the de.keras layers and the wrapped optimizers by name, so that
    # `load_model` of a saved model finds them in a new process.
    ("tfra_dynamic_embedding.optimizer", "register_keras_optimizers"),
    ("tfra_dynamic_embedding.keras.layers", "register_keras_layers"),
    # An unknown-rank TensorShape lists as [] (TFRA code leans on it).
    ("tfra_dynamic_embedding.compat.tf_patch", "patch_on_tf"),
    # `tensorflow_recommenders_addons.dynamic_embedding.python.*` import.
    ("tfra_dynamic_embedding.compat.module_paths", "install"),
    # `de.Variable.embedding_lookup`, TFRA's method form of `de.embedding_lookup`.
    ("tfra_dynamic_embedding.compat.methods", "install"),
)


def install():
    """Applies every step of `INSTALL_STEPS` (each is idempotent)."""
    for module, function in INSTALL_STEPS:
        getattr(importlib.import_module(module), function)()
