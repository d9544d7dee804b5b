"""TFRA's module paths, `tensorflow_recommenders_addons.dynamic_embedding.python.*`, for code
that imports from them instead of the public `de` namespace:

    from tensorflow_recommenders_addons.dynamic_embedding.python.ops import data_flow_ops
    from tensorflow_recommenders_addons.dynamic_embedding.python.keras.callbacks import \\
        DEHvdBroadcastGlobalVariablesCallback

Each path TFRA has is a module whose names come from this package's module(s) of the same
role (`MODULES`), then from `de` itself; a name neither has raises AttributeError (so an
ImportError in `from ... import name`). Paths TFRA does not have are not importable.
`install()` (run by `compat.install()`, which the alias package's import calls) makes them
importable.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types

PREFIX = "tensorflow_recommenders_addons.dynamic_embedding."

# TFRA module (under PREFIX) -> this package's modules that hold its names, searched in order
MODULES = {
    "python": (),
    "python.keras": ("tfra_dynamic_embedding.keras",),
    "python.keras.callbacks": ("tfra_dynamic_embedding.keras.callbacks",),
    "python.keras.layers": ("tfra_dynamic_embedding.keras.layers",),
    "python.keras.layers.dynamic_layer_normalization": ("tfra_dynamic_embedding.keras.layers",),
    "python.keras.layers.embedding": ("tfra_dynamic_embedding.keras.layers",),
    "python.keras.models": ("tfra_dynamic_embedding.keras.models",),
    "python.ops": (),
    "python.ops.cuckoo_hashtable_ops": ("tfra_dynamic_embedding.tables.cuckoo_table",),
    "python.ops.data_flow_grad": ("tfra_dynamic_embedding.compat.data_flow",),
    "python.ops.data_flow_ops": ("tfra_dynamic_embedding.compat.data_flow",),
    "python.ops.dynamic_embedding_creator": ("tfra_dynamic_embedding.tables.creators",
                                             "tfra_dynamic_embedding.online.hkv",
                                             "tfra_dynamic_embedding.tables.redis",
                                             "tfra_dynamic_embedding.checkpoint"),
    "python.ops.dynamic_embedding_ops": ("tfra_dynamic_embedding.embedding_ops",),
    "python.ops.dynamic_embedding_optimizer": ("tfra_dynamic_embedding.optimizer",),
    "python.ops.dynamic_embedding_variable": ("tfra_dynamic_embedding.variable",
                                              "tfra_dynamic_embedding.scopes"),
    "python.ops.embedding_weights": ("tfra_dynamic_embedding.trainable",),
    "python.ops.hkv_hashtable_ops": ("tfra_dynamic_embedding.online.hkv",),
    "python.ops.math_grad": ("tfra_dynamic_embedding.compat.math_ops",),
    "python.ops.math_ops": ("tfra_dynamic_embedding.compat.math_ops",),
    "python.ops.ragged_embedding_ops": ("tfra_dynamic_embedding.embedding_ops",),
    "python.ops.redis_table_ops": ("tfra_dynamic_embedding.tables.redis",
                                   "tfra_dynamic_embedding.tables.redis_config"),
    "python.ops.restrict_policies": ("tfra_dynamic_embedding.online.restrict_policies",),
    "python.ops.shadow_embedding_ops": ("tfra_dynamic_embedding.compat.shadow_ops",),
    "python.ops.tf_patch": ("tfra_dynamic_embedding.compat.tf_patch",),
    "python.ops.warm_start_util": ("tfra_dynamic_embedding.compat.warm_start_util",),
    "python.train": ("tfra_dynamic_embedding.compat.train",),
    "python.train.checkpoint": ("tfra_dynamic_embedding.compat.train",),
    "python.train.saver": ("tfra_dynamic_embedding.compat.train",),
}
# TFRA's packages among them (they hold submodules)
PACKAGES = {"python", "python.keras", "python.keras.layers", "python.ops", "python.train"}


class TfraModule(types.ModuleType):
    """A TFRA module path: its names are looked up in `sources`, then in `de`."""

    def __init__(self, name, sources):
        super().__init__(name, f"TFRA's module {name}: names from {', '.join(sources) or 'de'}")
        self._sources = sources

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        for source in self._sources + ("tfra_dynamic_embedding",):
            module = importlib.import_module(source)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r} here: "
                             f"neither {', '.join(self._sources + ('de',))} has it")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and makes the modules of `MODULES`."""

    def find_spec(self, fullname, path=None, target=None):
        suffix = fullname[len(PREFIX):] if fullname.startswith(PREFIX) else None
        if suffix not in MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=suffix in PACKAGES)

    def create_module(self, spec):
        return TfraModule(spec.name, MODULES[spec.name[len(PREFIX):]])

    def exec_module(self, module):
        pass


_FINDER = _Finder()


def install():
    """Makes TFRA's module paths importable (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
