"""tfra_dynamic_embedding: dynamic hash-table embeddings for TensorFlow.

The public API, also importable as `tensorflow_recommenders_addons.dynamic_embedding`:

    import tensorflow_recommenders_addons.dynamic_embedding as de
    w = de.get_variable("user_emb", dim=16, initializer=tf.random_normal_initializer(0, 0.01))
    emb = de.embedding_lookup(w, user_ids)

Names are loaded on first use, so that `import tfra_dynamic_embedding` (and the `tfra-de`
placement commands) do not pay for importing TensorFlow, and `de.keras` can follow
`TF_USE_LEGACY_KERAS` set after this import. TFRA's shims, patches and registrations live in
`compat/`, which the alias package's import applies (`compat.install()`); this import does not.
"""

import importlib as _importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "BuiltinKVCreator": "tfra_dynamic_embedding.tables",
    "CuckooHashTable": "tfra_dynamic_embedding.tables",
    "CuckooHashTableConfig": "tfra_dynamic_embedding.tables",
    "CuckooHashTableCreator": "tfra_dynamic_embedding.tables",
    "DEResourceVariable": "tfra_dynamic_embedding.trainable",
    "DynamicEmbeddingOptimizer": "tfra_dynamic_embedding.optimizer",
    "BloomAdmission": "tfra_dynamic_embedding.online.admission",
    "CountAdmission": "tfra_dynamic_embedding.online.admission",
    "Eviction": "tfra_dynamic_embedding.online.eviction",
    "ProbabilityAdmission": "tfra_dynamic_embedding.online.admission",
    "FileSystemSaver": "tfra_dynamic_embedding.checkpoint",
    "GraphKeys": "tfra_dynamic_embedding.variable",
    "HkvEvictStrategy": "tfra_dynamic_embedding.online.hkv",
    "HkvHashTableConfig": "tfra_dynamic_embedding.online.hkv",
    "HkvHashTableCreator": "tfra_dynamic_embedding.online.hkv",
    "KVCreator": "tfra_dynamic_embedding.tables",
    "KVTable": "tfra_dynamic_embedding.tables",
    "NativeKVCreator": "tfra_dynamic_embedding.tables",
    "ModelMode": "tfra_dynamic_embedding.trainable",
    "RedisKVCreator": "tfra_dynamic_embedding.tables",
    "RedisTableConfig": "tfra_dynamic_embedding.tables",
    "RedisTableCreator": "tfra_dynamic_embedding.tables",
    "FrequencyRestrictPolicy": "tfra_dynamic_embedding.online.restrict_policies",
    "RestrictPolicy": "tfra_dynamic_embedding.online.restrict_policies",
    "TimestampRestrictPolicy": "tfra_dynamic_embedding.online.restrict_policies",
    "TrainableWrapper": "tfra_dynamic_embedding.trainable",
    "enable_inference_mode": "tfra_dynamic_embedding.trainable",
    "enable_train_mode": "tfra_dynamic_embedding.trainable",
    "get_model_mode": "tfra_dynamic_embedding.trainable",
    "trainable_wrapper_filter": "tfra_dynamic_embedding.trainable",
    "Variable": "tfra_dynamic_embedding.variable",
    "default_partition_fn": "tfra_dynamic_embedding.devices",
    "embedding_lookup": "tfra_dynamic_embedding.embedding_ops",
    "embedding_lookup_sparse": "tfra_dynamic_embedding.embedding_ops",
    "embedding_lookup_unique": "tfra_dynamic_embedding.embedding_ops",
    "embedding_lookups": "tfra_dynamic_embedding.embedding_ops",
    "get_variable": "tfra_dynamic_embedding.scopes",
    "patch_on_tf": "tfra_dynamic_embedding.compat.tf_patch",
    "safe_embedding_lookup_sparse": "tfra_dynamic_embedding.embedding_ops",
    "warm_start": "tfra_dynamic_embedding.compat.warm_start_util",
    "WarmStartHook": "tfra_dynamic_embedding.compat.warm_start_util",
}
# public submodule name -> module
_SUBMODULES = {"data_flow": "tfra_dynamic_embedding.compat.data_flow",
               "keras": "tfra_dynamic_embedding.keras",
               "math": "tfra_dynamic_embedding.compat.math_ops",
               "shadow_ops": "tfra_dynamic_embedding.compat.shadow_ops",
               "train": "tfra_dynamic_embedding.compat.train"}

__all__ = sorted(_EXPORTS) + list(_SUBMODULES)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(_importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = _importlib.import_module(_SUBMODULES[name])
    else:
        raise AttributeError(f"module 'tfra_dynamic_embedding' has no attribute {name!r}")
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
