"""Test session setup: 4 logical CPU devices (for sharded variables) and backend fixtures."""

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
