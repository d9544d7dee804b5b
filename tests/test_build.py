"""The test scheduling metadata stays consistent: Bazel's tags (tests/BUILD) and pytest's markers
name the same exclusive files, and conftest's longest-first list names files that exist."""

import ast
import os
import re

from tests import conftest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def _build_tags():
    """{file: [tags]} of the `tags = {...}` argument in tests/BUILD."""
    with open(os.path.join(TESTS, "BUILD")) as f:
        text = f.read()
    match = re.search(r"^\s*tags = (\{.*?^\s*\}),", text, re.M | re.S)
    assert match, "tests/BUILD has no tags = {...} argument"
    return ast.literal_eval(match.group(1))


def _test_files():
    for folder, _, files in os.walk(TESTS):
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                yield os.path.relpath(os.path.join(folder, name), TESTS)


def _marked_exclusive():
    marked = set()
    for path in _test_files():
        with open(os.path.join(TESTS, path)) as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if (isinstance(node, ast.Assign)
                    and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
                    and "exclusive" in ast.unparse(node.value)):
                marked.add(path)
    return marked


def test_bazel_exclusive_tags_and_pytest_markers_name_the_same_files():
    tags = _build_tags()
    tagged = {path for path, names in tags.items() if "exclusive" in names}
    assert tagged, "tests/BUILD tags no file exclusive"
    assert tagged == _marked_exclusive()
    missing = [path for path in tags if not os.path.exists(os.path.join(TESTS, path))]
    assert not missing, f"tests/BUILD tags files that do not exist: {missing}"


def test_longest_files_first_names_existing_test_files():
    missing = [path for path in conftest.LONGEST_FILES_FIRST
               if not os.path.exists(os.path.join(ROOT, path))]
    assert not missing, f"tests/conftest.py LONGEST_FILES_FIRST names missing files: {missing}"
    assert len(set(conftest.LONGEST_FILES_FIRST)) == len(conftest.LONGEST_FILES_FIRST)


def test_no_build_file_below_the_root_globs():
    """A BUILD file in a subfolder of tests/ or of the packages would cut its files out of the
    root globs (tests/BUILD, BUILD), so Bazel would silently stop running or shipping them."""
    found = []
    for top in ("tests", "tfra_dynamic_embedding", "tensorflow_recommenders_addons", "cc"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            if folder != TESTS and ({"BUILD", "BUILD.bazel"} & set(files)):
                found.append(os.path.relpath(folder, ROOT))
    assert not found, f"BUILD files below the root globs: {found}"
