"""Test session setup: 4 logical CPU devices (for sharded variables), backend fixtures, and the
order and markers `make test` schedules by (DEVELOPERS.md, "Tests")."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# One temporary directory per test session, inherited by every process a test starts, removed
# at exit: TensorFlow's autograph writes a source file per converted function to the temporary
# directory and deletes it only at a normal exit, so processes a test kills (or that end with
# os._exit) would otherwise leave them in /tmp, thousands per `make test`.
_SESSION_TMP = tempfile.mkdtemp(prefix="tfra_de_tests_")
os.environ["TMPDIR"] = _SESSION_TMP
tempfile.tempdir = _SESSION_TMP
atexit.register(shutil.rmtree, _SESSION_TMP, ignore_errors=True)

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# Must run before TensorFlow initialises its devices: every test sees /CPU:0 ... /CPU:3.
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

CPUS = ["/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3"]

from tfra_dynamic_embedding import tables  # noqa: E402


def _native_creator():
    return tables.native.NativeKVCreator() if tables.native.is_available() else None


@pytest.fixture(params=["builtin", "native"])
def kv_creator(request):
    """Each data-plane test runs once per backend; native skips when its library is not built."""
    if request.param == "builtin":
        return tables.BuiltinKVCreator()
    creator = _native_creator()
    if creator is None:
        pytest.skip("native op library not built (run `make ops`)")
    return creator


@pytest.fixture(autouse=True)
def _fresh_default_graph():
    """Every test starts with an empty default graph, as tf.test.TestCase does: `de.get_variable`
    keeps variables in a store of the default graph (eager mode too), so a name reused by two
    tests must not hand the second test the first one's variable."""
    tf.compat.v1.reset_default_graph()
    yield


# Test files that take longest, longest first. `make test` runs the suite on two pytest-xdist
# workers, one file at a time each (--dist loadfile, in collection order): starting the long
# files first keeps a long file from running alone at the end while the other worker idles.
# Files not named here keep their usual order after these. Rough per-file times: DEVELOPERS.md.
LONGEST_FILES_FIRST = (
    "tests/distributed/test_remote_client.py",
    "tests/placement/test_benchmark.py",
    "tests/keras/test_models.py",
    "tests/test_file_system_atomic.py",
    "tests/placement/test_gpu_profile.py",
    "tests/inference/test_grpc_shards.py",
    "tests/online/test_eviction.py",
    "tests/inference/test_export.py",
    "tests/keras/test_layers.py",
    "tests/demo/test_demo.py",
    "tests/online/test_delta.py",
    "tests/keras/test_xla_auto_jit.py",
    "tests/placement/test_planner.py",
    "tests/distributed/test_server.py",
    "tests/tables/test_fused_init.py",
    "tests/inference/test_serve.py",
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "exclusive: a multi-process test whose processes must have the machine to "
        "themselves (asynchronous workers, bounded-time failure checks); `make test` runs these "
        "files after the others, one test at a time. Mark a whole file (tests/BUILD tags the "
        "same files `exclusive` for Bazel; tests/test_build.py checks the two agree).")


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FILES_FIRST)}
    root = str(config.rootpath)

    def file_rank(item):
        path = os.path.relpath(str(item.path), root)
        return rank.get(path, len(rank))

    items.sort(key=file_rank)  # stable: the order within a file and among the rest is kept
