"""A package's import graph read from its source with `ast` (nothing is imported), for the tests
that check layering rules (tests/test_layering.py, tests/placement/test_layers.py).

Every import statement counts, at module level or inside a function: a function-level import
still makes the importing module depend on the imported one.

Example:
    >>> find_cycle({"a": {"b"}, "b": {"a"}})
    ['a', 'b', 'a']
"""

import ast
import os


def modules(root, package):
    """{dotted name: path} of every module under `root`, the folder of `package` (a package is
    its __init__)."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, name), root)[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join([package] + rel)] = os.path.join(folder, name)
    return out


def imports(path, known, package):
    """The modules of `package` (names in `known`) that the file at `path` imports."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from pkg import sub` imports the submodule; `from pkg import name` the package.
            targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known
                       else node.module for alias in node.names]
        else:
            continue
        for target in targets:
            if target == package or target.startswith(package + "."):
                while target not in known:   # `import a.b.c` of an attribute: its module
                    target = target.rsplit(".", 1)[0]
                found.add(target)
    return found


def import_graph(root, package):
    """{module: set of the package's modules it imports (itself excluded)}."""
    known = modules(root, package)
    return {name: imports(path, known, package) - {name} for name, path in known.items()}


def find_cycle(graph):
    """One import cycle of `graph` as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
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
