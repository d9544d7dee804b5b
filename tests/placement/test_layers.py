"""The planner's layering, read from the source with `ast` (nothing is imported).

Every `from tfra_dynamic_embedding.placement... import` and `import tfra_dynamic_embedding.placement...`
statement counts, at module level or inside a function: a function-level import still makes the
importing module depend on the imported one.
"""

import ast
import os

import tfra_dynamic_embedding

from tests.placement.helpers import run_python

PACKAGE = "tfra_dynamic_embedding.placement"
ROOT = os.path.join(os.path.dirname(tfra_dynamic_embedding.__file__), "placement")
# Consumers sit above the stages, beside evaluate.py, and may read it: the package facade and
# the training command (it plots and scores while it trains).
EVALUATE_READERS = {PACKAGE, f"{PACKAGE}.train"}


def _modules():
    """{dotted name: path} of every module of the package (a package is its __init__)."""
    out = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join([PACKAGE] + rel)] = os.path.join(folder, name)
    return out


def _imports(path, modules):
    """(module, line) pairs of the placement modules `path` imports, anywhere in the file."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from pkg import sub` imports the submodule; `from pkg import name` the package.
            targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                       else node.module for alias in node.names]
        else:
            continue
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                while target not in modules:   # `import a.b.c` of an attribute: its module
                    target = target.rsplit(".", 1)[0]
                found.append((target, node.lineno))
    return found


def _graph():
    modules = _modules()
    return {name: sorted({t for t, _ in _imports(path, modules) if t != name})
            for name, path in modules.items()}


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycles():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(m[len(PACKAGE) + 1:] or "__init__"
                                                         for m in cycle)


def test_nothing_imports_evaluate_back():
    evaluate = f"{PACKAGE}.evaluate"
    readers = sorted(m for m, deps in _graph().items() if evaluate in deps)
    assert set(readers) <= EVALUATE_READERS, (
        f"stage modules import evaluate.py (reporting only): {sorted(set(readers) - EVALUATE_READERS)}")


def test_stages_do_not_import_the_package_facade():
    readers = sorted(m for m, deps in _graph().items() if PACKAGE in deps)
    assert not readers, f"modules importing names from placement/__init__.py: {readers}"


def test_init_imports_only_what_it_exports():
    """No import in placement/__init__.py is there for a side effect (such as registering)."""
    path = os.path.join(ROOT, "__init__.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    exported = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__"
                                                for t in node.targets):
            exported = set(ast.literal_eval(node.value))
    assert exported, "placement/__init__.py must define __all__"
    bound = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound += [(alias.asname or alias.name).split(".")[0] for alias in node.names]
    unused = sorted(set(bound) - exported)
    assert not unused, f"imported by placement/__init__.py but not exported: {unused}"
    assert len(exported) <= 8, f"the public surface should stay small; got {len(exported)} names"


def test_registries_are_tables_resolved_on_first_use():
    """Importing the planner registers nothing and loads no TensorFlow; the "learned" and
    "measured-cpu" entries are imported when first asked for."""
    script = ("import sys\n"
              "from tfra_dynamic_embedding import placement\n"
              "from tfra_dynamic_embedding.placement import estimators, proposers\n"
              "lazy = ('placement.policy', 'placement.benchmark.tf_cpu')\n"
              "assert not [m for m in sys.modules if m.endswith(lazy)], sorted(sys.modules)\n"
              "assert proposers.list_strategies()[-1] == 'learned'\n"
              "assert {'analytic', 'learned', 'measured-cpu'} <= set(estimators.list_estimators())\n"
              "assert proposers.get_strategy('learned').__module__.endswith('placement.policy')\n"
              "est = estimators.get_estimator('measured-cpu', batch_size=16)\n"
              "assert type(est).__module__.endswith('benchmark.tf_cpu'), type(est)\n"
              "assert 'tensorflow' not in sys.modules\n"
              "print('ok')\n")
    assert run_python(script) == "ok"
