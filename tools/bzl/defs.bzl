"""Bazel macros for tfra_dynamic_embedding.

tfra_ops_library:       the native op library from cc/ops/*.cc, only when there are sources.
tfra_redis_ops_library: the Redis tables' op library from cc/redis/*.cc, only with hiredis.
pytest_tests:           one py_test per pytest file, run through tools/bzl/pytest_runner.py.
"""

load("@local_hiredis//:defs.bzl", "HIREDIS_AVAILABLE")

_OPS_COPTS = [
    "-std=c++17",
    "-O3",
    "-ffp-contract=off",  # as tools/build_ops.py: keyed initial rows equal TF's (cc/ops/de_keyed.h)
    "-Wno-deprecated-declarations",
    "-Wno-interference-size",
]

def tfra_ops_library(name, library_name):
    """Declares `library_name` (cc_binary, linkshared) from cc/ops/*.cc and a filegroup `name`.

    The filegroup holds the library, or nothing while cc/ops has no sources yet, so tests can
    always depend on `name`. Must be called from the root BUILD (globs are package-relative; a
    BUILD file under cc/ would hide the sources from this glob).
    """
    srcs = native.glob(["cc/ops/*.cc"])
    hdrs = native.glob(["cc/**/*.h", "cc/**/*.hpp", "cc/**/*.inc"], exclude = ["cc/redis/**"])
    if srcs:
        native.cc_binary(
            name = library_name,
            srcs = srcs + hdrs,
            copts = _OPS_COPTS,
            linkshared = 1,
            deps = [
                "@local_tf//:tf_framework",
                "@local_tf//:tf_headers",
            ],
        )
    native.filegroup(
        name = name,
        srcs = [":" + library_name] if srcs else [],
    )

def tfra_redis_ops_library(name, library_name):
    """Declares `library_name` (cc_binary, linkshared) from cc/redis/*.cc, linked with hiredis,
    and a filegroup `name` holding it; where hiredis is not installed (HIREDIS_AVAILABLE, from
    third_party/local_hiredis.bzl) only the empty filegroup. A library of its own, so that the
    main one never needs libhiredis. Must be called from the root BUILD (as tfra_ops_library).
    """
    srcs = native.glob(["cc/redis/*.cc"])
    hdrs = native.glob(["cc/redis/*.h"]) + ["cc/ops/de_util.h"]  # Mix64 (lane hash)
    declared = bool(srcs) and HIREDIS_AVAILABLE
    if declared:
        native.cc_binary(
            name = library_name,
            srcs = srcs + hdrs,
            copts = _OPS_COPTS,
            linkshared = 1,
            deps = [
                "@local_hiredis//:hiredis",
                "@local_tf//:tf_framework",
                "@local_tf//:tf_headers",
            ],
        )
    native.filegroup(
        name = name,
        srcs = [":" + library_name] if declared else [],
    )

def pytest_tests(name, srcs, deps = [], data = [], sizes = {}, default_size = "large", tags = {}, **kwargs):
    """One py_test per file in `srcs` (target name = path without .py), plus test_suite `name`.

    Args:
      name: name of the test_suite holding all generated tests.
      srcs: pytest files (e.g. glob(["**/test_*.py"])).
      deps: py_library deps of every test (e.g. the package).
      data: runfiles of every test (conftest.py, helpers, data files, the op library).
      sizes: {file: size} overrides of default_size ("small", "medium", "large", "enormous").
      default_size: Bazel size of a test (timeout: medium 300 s, large 900 s).
      tags: {file: [tags]} extra tags per file (e.g. ["manual"]).
      **kwargs: passed to every py_test (e.g. env, shard_count).
    """
    runner = "//tools/bzl:pytest_runner.py"
    tests = []
    for src in srcs:
        test_name = src[:-3] if src.endswith(".py") else src
        native.py_test(
            name = test_name,
            srcs = [runner, src],
            main = runner,
            args = ["$(rootpath %s)" % src],
            data = data,
            deps = deps,
            # No __init__.py files invented in the runfiles: tests see the same package layout
            # (and pytest the same rootdir/module names) as in the source tree.
            legacy_create_init = False,
            python_version = "PY3",
            srcs_version = "PY3",
            size = sizes.get(src, default_size),
            tags = tags.get(src, []),
            **kwargs
        )
        tests.append(":" + test_name)
    native.test_suite(name = name, tests = tests)
