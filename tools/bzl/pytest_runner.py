"""Runs one pytest file as a Bazel py_test: `pytest_runner.py <test file> [pytest args...]`.

- Sets TFRA_DE_OPS_LIBRARY (and TFRA_DE_REDIS_OPS_LIBRARY) to the Bazel-built op library (the
  Redis tables' one) when it is in the runfiles and the variable is not set already, so the
  backends load them instead of pip-built ones.
- Uses the workspace root in the runfiles as pytest's rootdir/confcutdir, so conftest.py files in
  parent directories and any pytest.ini / pyproject.toml / setup.cfg at the root apply.
- Keeps temp files and the pytest cache out of the source tree (Bazel's TEST_TMPDIR), and writes
  a JUnit XML report where Bazel asks for one.
Exit code is pytest's (0 ok, 1 failures, 5 no test collected, ...).
"""

import os
import sys

OPS_LIBRARY_ENV = "TFRA_DE_OPS_LIBRARY"
OPS_LIBRARY_NAME = "_tfra_de_ops.so"
LIBRARIES = ((OPS_LIBRARY_ENV, OPS_LIBRARY_NAME),
             ("TFRA_DE_REDIS_OPS_LIBRARY", "_tfra_de_redis_ops.so"))


def main(argv):
    if len(argv) < 2:
        print("usage: pytest_runner.py TEST_FILE [PYTEST_ARGS...]", file=sys.stderr)
        return 2
    test_file = os.path.abspath(argv[1])
    root = os.getcwd()  # Bazel runs tests from the main workspace's runfiles directory.
    while root != "/" and not os.path.exists(os.path.join(root, "tools", "bzl", "pytest_runner.py")):
        root = os.path.dirname(root)

    for env, name in LIBRARIES:
        if not os.environ.get(env):
            lib = os.path.join(root, name)
            if os.path.exists(lib):
                os.environ[env] = lib
        elif not os.path.isabs(os.environ[env]):
            os.environ[env] = os.path.abspath(os.environ[env])

    tmp = os.environ.get("TEST_TMPDIR")
    if tmp:
        os.environ.setdefault("TMPDIR", tmp)
        if not os.access(os.path.expanduser("~"), os.W_OK):
            os.environ["HOME"] = tmp  # Keras and friends write config files under ~
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import pytest  # noqa: E402  (after the environment is set up)

    args = [test_file, "--rootdir", root, "--confcutdir", root, "-p", "no:cacheprovider", "-ra"]
    if tmp:
        args += ["--basetemp", os.path.join(tmp, "pytest")]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args += ["--junitxml", xml]
    return pytest.main(args + argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
