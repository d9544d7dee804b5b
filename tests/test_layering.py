"""The core's layering, read from the source with `ast` (DESIGN.md, "Rules of the house").

Every import statement counts, at module level or inside a function: a function-level import
still makes the importing module depend on the imported one. The core is the data plane and
what trains it; compat/ (TFRA's shims) sits on top of it and only the alias package applies it.
"""

import os
import subprocess
import sys

import tfra_dynamic_embedding
from tests import import_graph

PACKAGE = "tfra_dynamic_embedding"
ROOT = os.path.dirname(tfra_dynamic_embedding.__file__)
# The core: these modules and everything under these packages.
CORE = ("_tf_private", "hooks", "tables", "initializers", "variable", "scopes", "embedding_ops",
        "trainable", "optimizer", "checkpoint", "online", "table_updates", "grouped_lookup",
        "devices", "typed_inputs", "variable_files")
# What variable.py may import: only what sits below it.
BELOW_VARIABLE = ("_tf_private", "hooks", "tables", "initializers", "trainable", "checkpoint",
                  "devices", "typed_inputs", "variable_files")


def _graph():
    return import_graph.import_graph(ROOT, PACKAGE)


def _short(module):
    return module[len(PACKAGE) + 1:] or "__init__"


def _in(module, parts):
    """Whether `module` is one of `parts` (relative to the package) or inside one of them."""
    return any(module == f"{PACKAGE}.{p}" or module.startswith(f"{PACKAGE}.{p}.") for p in parts)


def test_variable_imports_only_what_sits_below_it():
    """Not online/ (its features attach through hooks), not compat/, not embedding_ops or
    shadow_ops (they build on the variable)."""
    above = sorted(_short(m) for m in _graph()[f"{PACKAGE}.variable"]
                   if not _in(m, BELOW_VARIABLE))
    assert not above, f"variable.py imports modules above it: {above}"


def test_no_core_module_imports_compat():
    graph = _graph()
    found = sorted(f"{_short(m)} -> {_short(d)}" for m, deps in graph.items() if _in(m, CORE)
                   for d in deps if _in(d, ("compat",)))
    assert not found, f"core modules import compat/: {found}"


def test_core_modules_do_not_import_the_package_root():
    """Its lazy table of public names would hide which module a core module uses."""
    graph = _graph()
    found = sorted(_short(m) for m, deps in graph.items() if _in(m, CORE) and PACKAGE in deps)
    assert not found, f"core modules import tfra_dynamic_embedding itself: {found}"


def test_no_import_cycles_among_the_core_modules():
    graph = _graph()
    core = {m: {d for d in deps if _in(d, CORE)} for m, deps in graph.items() if _in(m, CORE)}
    cycle = import_graph.find_cycle(core)
    assert cycle is None, "import cycle: " + " -> ".join(_short(m) for m in cycle)


# Imports the core, checks that nothing was applied, then imports the alias package.
_PLAIN_IMPORT = """
import sys
import keras
import tensorflow as tf
as_list, finders = tf.TensorShape.as_list, list(sys.meta_path)
import tfra_dynamic_embedding as de
from tfra_dynamic_embedding import embedding_ops, optimizer, scopes, variable
from tfra_dynamic_embedding.online import admission, eviction, hkv, restrict_policies
compat = sorted(m for m in sys.modules if m.startswith("tfra_dynamic_embedding.compat"))
assert not compat, compat
# de.keras holds TFRA's Horovod classes too: it may load compat.horovod, and registers nothing.
from tfra_dynamic_embedding.keras import callbacks, layers

from tfra_dynamic_embedding.tables import native

def applied():
    return {"patch": tf.TensorShape.as_list is not as_list,
            "finder": list(sys.meta_path) != finders,
            "keras": keras.saving.get_registered_object(
                "tfra_dynamic_embedding>Embedding") is not None,
            "optimizers": keras.saving.get_registered_object(
                "tfra_dynamic_embedding>Adam") is not None,
            "methods": hasattr(de.Variable, "embedding_lookup")}

plain = applied()
assert not any(plain.values()), plain
import tensorflow_recommenders_addons.dynamic_embedding
alias = applied()
alias["kernels"] = native._load_tried   # loaded (or tried: a warning when not built)
assert all(alias.values()), alias
print("ok")
"""


def test_only_the_alias_import_registers_and_patches():
    """`import tfra_dynamic_embedding` (and its core modules) registers nothing with Keras,
    patches nothing and installs no import finder; the alias package's import does all of it
    (compat.install)."""
    result = subprocess.run([sys.executable, "-c", _PLAIN_IMPORT], capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "ok"
