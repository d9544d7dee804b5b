"""Key-value backends behind the `KVTable` interface (see base.py)."""

__all__ = ["BuiltinKVCreator", "BuiltinKVTable", "CuckooHashTable", "CuckooHashTableConfig",
           "CuckooHashTableCreator", "InitSpec", "KVCreator", "KVTable", "NativeKVCreator",
           "RedisKVCreator", "RedisKVTable", "RedisTableConfig", "RedisTableCreator",
           "default_kv_creator"]

from tfra_dynamic_embedding.tables.base import InitSpec, KVCreator, KVTable
from tfra_dynamic_embedding.tables.builtin import BuiltinKVCreator, BuiltinKVTable
from tfra_dynamic_embedding.tables.creators import (CuckooHashTableConfig, CuckooHashTableCreator,
                                                    default_kv_creator)
from tfra_dynamic_embedding.tables.cuckoo_table import CuckooHashTable
from tfra_dynamic_embedding.tables.native import NativeKVCreator
from tfra_dynamic_embedding.tables.redis import RedisKVCreator, RedisKVTable, RedisTableCreator
from tfra_dynamic_embedding.tables.redis_config import RedisTableConfig
