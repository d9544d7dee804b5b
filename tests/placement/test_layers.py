"""The planner's layering, read from the source with `ast` (nothing is imported).

Every `from tfra_dynamic_embedding.placement... import` and `import tfra_dynamic_embedding.placement...`
statement counts, at module level or inside a function: a function-level import still makes the
importing module depend on the imported one.
"""

import ast
import os

import tfra_dynamic_embedding

from tests import import_graph
from tests.placement.helpers import run_python

PACKAGE = "tfra_dynamic_embedding.placement"
ROOT = os.path.join(os.path.dirname(tfra_dynamic_embedding.__file__), "placement")
# Consumers sit above the stages, beside evaluate.py, and may read it: the package facade and
# the training command (it plots and scores while it trains).
EVALUATE_READERS = {PACKAGE, f"{PACKAGE}.train"}


def _graph():
    return import_graph.import_graph(ROOT, PACKAGE)


def test_no_import_cycles():
    cycle = import_graph.find_cycle(_graph())
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
