"""The table creators of TFRA's API: `default_kv_creator` and `de.CuckooHashTableCreator`
(this package's default tables). TFRA's `de.HkvHashTableCreator` (the same tables, bounded by an
eviction) is in online/hkv.py.

Example:
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> w = de.Variable(dim=16, kv_creator=de.CuckooHashTableCreator())
    >>> w.lookup(tf.constant([1], tf.int64)).shape
    TensorShape([1, 16])
"""

import tensorflow as tf

from tfra_dynamic_embedding import checkpoint
from tfra_dynamic_embedding.tables import native
from tfra_dynamic_embedding.tables.base import KVCreator
from tfra_dynamic_embedding.tables.builtin import BuiltinKVCreator


def default_kv_creator(value_dtype=None, key_dtype=None):
    """The native backend when its op library loads and the dtypes (when given) are ones it
    holds -- floating values, int32/int64/string keys -- else the built-in one."""
    fits = ((value_dtype is None or tf.as_dtype(value_dtype) in native.VALUE_DTYPES)
            and (key_dtype is None or tf.as_dtype(key_dtype) in native.KEY_DTYPES))
    return native.NativeKVCreator() if native.is_available() and fits else BuiltinKVCreator()


class CuckooHashTableConfig:
    """TFRA's config of its default table. It has no settings; it exists so that TFRA code
    (`de.CuckooHashTableCreator(config=de.CuckooHashTableConfig())`) runs unchanged."""


class CuckooHashTableCreator(KVCreator):
    """TFRA's name for the default backend: this project's native table when its op library
    is built, else the built-in one (`default_kv_creator`).

    Example:
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> w = de.Variable(dim=8, kv_creator=de.CuckooHashTableCreator(de.CuckooHashTableConfig()))
        >>> w = de.Variable(dim=8, kv_creator=de.CuckooHashTableCreator(saver=de.FileSystemSaver()))
        >>> CuckooHashTableCreator(config=3)
        Traceback (most recent call last):
        ...
        TypeError: config must be a de.CuckooHashTableConfig; got 3
    """

    config_class = CuckooHashTableConfig   # what `config` must be; its default when None

    def __init__(self, config=None, saver=None):
        if config is not None and not isinstance(config, self.config_class):
            raise TypeError(f"config must be a de.{self.config_class.__name__}; got {config!r}")
        if saver is not None and not isinstance(saver, checkpoint.DynamicEmbeddingSaver):
            raise TypeError(f"saver must be None or a de.FileSystemSaver; got {saver!r}")
        self.config = config or self.config_class()
        # With a de.FileSystemSaver, checkpoints write the variable's tables to files
        # (checkpoint.py).
        self.saver = saver

    def create(self, key_dtype, value_dtype, dim, name, device="", shared_name=None, init_size=0):
        return default_kv_creator(value_dtype, key_dtype).create(
            key_dtype, value_dtype, dim, name, device, shared_name, init_size)
