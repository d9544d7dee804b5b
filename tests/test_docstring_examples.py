"""The docstring examples of the package (every module of tfra_dynamic_embedding) are doctests,
and they run: every module is imported and its doctests pass (NORMALIZE_WHITESPACE, ELLIPSIS).

An "Example:" section of a docstring there must hold `>>>` lines, so examples that never run
cannot come back. Usage that does not fit a test (a cluster, a GPU, a download, minutes of
compute) is shown by a docs/ page instead, and the docstring names it.
"""

import ast
import doctest
import importlib
import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "tfra_dynamic_embedding"
SCOPE = ("__init__.py", "_tf_private.py", "variable.py", "embedding_ops.py", "trainable.py",
         "optimizer", "initializers.py", "scopes.py", "checkpoint.py", "hooks.py", "cli.py",
         "table_updates.py", "grouped_lookup.py", "devices.py", "typed_inputs.py",
         "variable_files.py",
         "tables", "online", "compat", "keras", "placement", "inference", "distributed", "demo")
OPTIONS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS

# Modules that cannot be imported without an optional dependency: {module: (dependency, why)}.
# The test checks that each dependency is really missing here; where it is installed, the module
# is imported and its doctests run like the others'.
NEEDS_OPTIONAL = {}


def _source_files():
    out = []
    for entry in SCOPE:
        path = os.path.join(ROOT, PACKAGE, entry)
        if entry.endswith(".py"):
            out.append(path)
            continue
        for folder, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            out += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
    return out


def _module_name(path):
    name = os.path.relpath(path, ROOT)[:-len(".py")].replace(os.sep, ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


FILES = _source_files()
MODULES = [_module_name(path) for path in FILES]


def test_the_scope_is_found():
    assert len(MODULES) > 40 and f"{PACKAGE}.cli" in MODULES
    assert f"{PACKAGE}.placement.types" in MODULES and f"{PACKAGE}.inference.export" in MODULES
    assert set(NEEDS_OPTIONAL) <= set(MODULES)


def _import(name):
    if name in NEEDS_OPTIONAL:
        dependency, why = NEEDS_OPTIONAL[name]
        if importlib.util.find_spec(dependency) is None:
            with pytest.raises(ImportError):
                importlib.import_module(name)
            pytest.skip(f"{name} needs {dependency}, not installed: {why}")
    return importlib.import_module(name)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_pass(name):
    module = _import(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    for test in finder.find(module, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctest examples of " \
                               f"{name} failed (their output is above)"


def _docstrings(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    for node in nodes:
        text = ast.get_docstring(node, clean=True)
        if text:
            yield getattr(node, "name", "<module>"), text


_HEAD = re.compile(r"Examples?(?: \(.*\))?:")


def old_style_examples(text):
    """The "Example" sections of docstring `text` whose code is not a doctest. A line that
    starts with "Example", or says "Example:" anywhere, must be "Example:" alone ("Examples:",
    "Example (what it shows):" too), and the next non-blank line a `>>>` line."""
    lines = text.splitlines()
    bad = []
    for i, line in enumerate(lines):
        head = line.strip()
        if not (head.startswith("Example") or re.search(r"\bExamples?:", head)):
            continue
        rest = [x.strip() for x in lines[i + 1:] if x.strip()]
        if not _HEAD.fullmatch(head) or not rest or not rest[0].startswith(">>>"):
            bad.append("\n".join([head] + rest[:1]))
    return bad


def test_the_old_style_check_catches_them():
    assert old_style_examples("Does x.\n\nExample:\n    >>> 1 + 1\n    2\n") == []
    assert old_style_examples("Example (a sum):\n\n    >>> 1 + 1\n    2\n") == []
    assert old_style_examples("Does x. Example:\n    >>> 1 + 1\n    2\n")
    assert old_style_examples("Does x.\n\nExample: f(2) -> 4\n")
    assert old_style_examples("Does x.\n\nExample:\n    f(2)   # 4\n")
    assert old_style_examples("Does x.\n\n    Examples:\n        y = f(2)\n        >>> y\n")


@pytest.mark.parametrize("path", FILES, ids=MODULES)
def test_examples_are_doctests(path):
    found = [f"{where}: {section}" for where, text in _docstrings(path)
             for section in old_style_examples(text)]
    assert not found, f"{os.path.relpath(path, ROOT)}: write these examples as doctests " \
                      f"(`>>>` lines), or name the docs/ page that shows the usage:\n" + \
                      "\n".join(found)
