"""tfra_dynamic_embedding: dynamic hash-table embeddings for TensorFlow.

The public API, also importable as `tensorflow_recommenders_addons.dynamic_embedding`:

    import tensorflow_recommenders_addons.dynamic_embedding as de
    w = de.get_variable("user_emb", dim=16, initializer=tf.random_normal_initializer(0, 0.01))
    emb = de.embedding_lookup(w, user_ids)
"""

from tfra_dynamic_embedding.embedding_ops import (
    embedding_lookup,
    embedding_lookup_sparse,
    safe_embedding_lookup_sparse,
)
from tfra_dynamic_embedding.optimizer import DynamicEmbeddingOptimizer
from tfra_dynamic_embedding.tables import BuiltinKVCreator, KVCreator, KVTable
from tfra_dynamic_embedding.trainable import TrainableWrapper
from tfra_dynamic_embedding.variable import (
    Variable,
    default_partition_fn,
    get_variable,
)

__version__ = "0.1.0"


def __getattr__(name):
    # `de.keras` loads tf.keras, so it is imported on first use: TF_USE_LEGACY_KERAS can still
    # be set after `import tensorflow_recommenders_addons.dynamic_embedding`.
    if name == "keras":
        import importlib  # pylint: disable=import-outside-toplevel
        return importlib.import_module("tfra_dynamic_embedding.keras")
    raise AttributeError(f"module 'tfra_dynamic_embedding' has no attribute {name!r}")

__all__ = [
    "BuiltinKVCreator",
    "DynamicEmbeddingOptimizer",
    "KVCreator",
    "KVTable",
    "TrainableWrapper",
    "Variable",
    "default_partition_fn",
    "embedding_lookup",
    "embedding_lookup_sparse",
    "get_variable",
    "keras",
    "safe_embedding_lookup_sparse",
]
