"""Key-value backends behind the `KVTable` interface (see base.py)."""

from tfra_dynamic_embedding.tables.base import KVCreator, KVTable
from tfra_dynamic_embedding.tables.builtin import BuiltinKVCreator, BuiltinKVTable


def default_kv_creator():
    """The native backend when its op library loads, else the built-in one."""
    try:
        from tfra_dynamic_embedding.tables import native  # pylint: disable=import-outside-toplevel
    except ImportError:  # the native backend module is not part of this build
        return BuiltinKVCreator()
    return native.NativeKVCreator() if native.is_available() else BuiltinKVCreator()
