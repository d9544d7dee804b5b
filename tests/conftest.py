"""Test session setup: 4 logical CPU devices (for sharded variables) and backend fixtures."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

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
