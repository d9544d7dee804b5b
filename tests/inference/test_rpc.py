"""Shards over TF RPC (inference/rpc.py): a SavedModel's signatures served by its own processes,
called on replicas round-robin; a dead replica is skipped, a dead shard fails fast naming
itself, a restarted replica is used again. Every server is a subprocess killed by pid."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.inference.lines import wait_for_line
import tfra_dynamic_embedding
from tfra_dynamic_embedding.distributed.cluster import free_port
from tfra_dynamic_embedding.inference import rpc

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tfra_dynamic_embedding.__file__)))
KEYS = np.array([3, 5, 8, 13], np.int64)
ROWS = np.arange(8, dtype=np.float32).reshape(4, 2) + 1.0


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A stock-TF SavedModel: a built-in hash table and a pooling `lookup` signature."""
    path = str(tmp_path_factory.mktemp("rpc") / "shard")
    module = tf.Module()
    module.table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, [0.0, 0.0])
    module.table.insert(KEYS, ROWS)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids"),
                                  tf.TensorSpec([None], tf.int32, name="segments"),
                                  tf.TensorSpec([], tf.int32, name="num_segments")])
    def lookup(ids, segments, num_segments):
        rows = module.table.lookup(ids)
        return {"pooled": tf.math.unsorted_segment_sum(rows, segments, num_segments),
                "found": tf.reduce_sum(tf.cast(tf.reduce_any(rows != 0, 1), tf.int32))}

    tf.saved_model.save(module, path, signatures={"lookup": lookup})
    return path


class Servers:
    """Shard server processes on loopback, each killed by pid at the end."""

    def __init__(self, saved_model):
        self.saved_model = saved_model
        self.procs = {}

    def start(self, address=None):
        address = address or f"localhost:{free_port()}"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
            p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p))
        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-m", "tfra_dynamic_embedding.inference.rpc", "--saved-model",
             self.saved_model, "--address", address, "--parent-pid", str(os.getpid())],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.procs[address] = proc
        wait_for_line(proc, rpc.READY, timeout=60)
        return address

    def kill(self, address):
        proc = self.procs.pop(address)
        proc.kill()
        proc.wait()

    def close(self):
        for address in list(self.procs):
            self.kill(address)


@pytest.fixture
def servers(saved_model):
    started = Servers(saved_model)
    try:
        yield started
    finally:
        started.close()


def request(ids, segments, num_segments):
    return {"ids": tf.constant(ids, tf.int64), "segments": tf.constant(segments, tf.int32),
            "num_segments": tf.constant(num_segments, tf.int32)}


def test_served_signature_equals_the_saved_model(servers, saved_model):
    client = rpc.ShardClient("shard_0", [servers.start()])
    inputs = request([5, 3, 99, 13, 5], [0, 0, 1, 2, 2], 4)
    served = client.call("lookup", inputs).result()
    direct = tf.saved_model.load(saved_model).signatures["lookup"](**inputs)
    np.testing.assert_array_equal(served["pooled"].numpy(), direct["pooled"].numpy())
    assert served["pooled"].numpy().tolist() == [[4, 6], [0, 0], [10, 12], [0, 0]]
    assert int(served["found"]) == 4


def test_calls_in_flight_on_several_shards_at_once(servers):
    shards = [rpc.ShardClient(f"shard_{i}", [servers.start()]) for i in range(2)]
    pending = [shard.call("lookup", request([3, 8], [0, 1], 2)) for shard in shards]
    for call in pending:
        assert call.result()["pooled"].numpy().tolist() == [[1, 2], [5, 6]]


def test_replicas_round_robin_skip_a_dead_one_and_take_a_restarted_one_back(servers):
    first, second = servers.start(), servers.start()
    client = rpc.ShardClient("shard_0", [first, second], timeout=5.0, retry_after=0.5)
    for _ in range(4):
        client.call("lookup", request([3], [0], 1)).result()
    assert client.calls == [2, 2]

    servers.kill(first)
    began = time.monotonic()
    for _ in range(4):
        assert client.call("lookup", request([3], [0], 1)).result()["pooled"].numpy()[0, 0] == 1
    assert time.monotonic() - began < 10
    assert client.calls[1] == 6

    servers.start(first)          # the same address again
    time.sleep(0.6)               # past retry_after
    for _ in range(4):
        client.call("lookup", request([3], [0], 1)).result()
    assert client.calls[0] > 2


def test_a_dead_shard_fails_fast_naming_itself(servers):
    address = servers.start()
    client = rpc.ShardClient("shard_7", [address], timeout=2.0)
    client.call("lookup", request([3], [0], 1)).result()
    servers.kill(address)
    began = time.monotonic()
    with pytest.raises(tf.errors.UnavailableError, match=f"shard 'shard_7'.*{address}"):
        client.call("lookup", request([3], [0], 1)).result()
    assert time.monotonic() - began < 10
    # Never started at all: the same error, bounded by the connection timeout.
    nobody = rpc.ShardClient("shard_8", [f"localhost:{free_port()}"], timeout=1.0)
    began = time.monotonic()
    with pytest.raises(tf.errors.UnavailableError, match="shard 'shard_8'"):
        nobody.call("lookup", request([3], [0], 1)).result()
    assert time.monotonic() - began < 10


def test_bad_arguments_name_themselves(servers):
    with pytest.raises(ValueError, match="addresses"):
        rpc.ShardClient("s", "localhost:1")
    with pytest.raises(ValueError, match="timeout"):
        rpc.ShardClient("s", ["localhost:1"], timeout=0)
    client = rpc.ShardClient("shard_0", [servers.start()])
    with pytest.raises(ValueError, match="no method 'predict'"):
        client.call("predict", request([3], [0], 1))
    with pytest.raises(tf.errors.InvalidArgumentError, match="shard 'shard_0'"):
        client.call("lookup", request([3], [0], 0)).result()   # segment 0 >= 0 segments
