"""Key-value backends behind the `KVTable` interface (see base.py)."""

__all__ = ["BuiltinKVCreator", "BuiltinKVTable", "KVCreator", "KVTable", "default_kv_creator"]

from tfra_dynamic_embedding.tables import native
from tfra_dynamic_embedding.tables.base import KVCreator, KVTable
from tfra_dynamic_embedding.tables.builtin import BuiltinKVCreator, BuiltinKVTable


def default_kv_creator():
    """The native backend when its op library loads, else the built-in one."""
    return native.NativeKVCreator() if native.is_available() else BuiltinKVCreator()
