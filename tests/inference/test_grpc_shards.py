"""Shards over gRPC with TF Serving's API (inference/grpc_shards.py): a SavedModel served by its
own processes as a PredictionService, called on replicas round-robin from many threads; a dead
replica is skipped, a dead shard fails fast naming itself, a restarted replica is used again;
a stock TF Serving client (its stubs and messages, nothing of this package) gets the same
answers. Every server is a subprocess killed by pid."""

import concurrent.futures
import os
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from tests.inference.lines import wait_for_line
import tfra_dynamic_embedding
from tfra_dynamic_embedding.distributed.cluster import free_port
from tfra_dynamic_embedding.inference import grpc_shards

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tfra_dynamic_embedding.__file__)))
KEYS = np.array([3, 5, 8, 13], np.int64)
ROWS = np.arange(8, dtype=np.float32).reshape(4, 2) + 1.0
MODEL = "shard_0"   # the SavedModel's directory name: the server's default model name


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A stock-TF SavedModel: a built-in hash table and a pooling `lookup` signature."""
    path = str(tmp_path_factory.mktemp("grpc") / MODEL)
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

    @tf.function(input_signature=[])
    def size():
        return {"size": module.table.size()}

    tf.saved_model.save(module, path, signatures={"lookup": lookup, "serving_default": size})
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
            [sys.executable, "-m", "tfra_dynamic_embedding.inference.grpc_shards",
             "--saved-model", self.saved_model, "--address", address,
             "--parent-pid", str(os.getpid())],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env)
        self.procs[address] = proc
        wait_for_line(proc, grpc_shards.READY, timeout=90)
        return address

    def kill(self, address):
        proc = self.procs.pop(address)
        proc.kill()
        proc.wait(30)

    def close(self):
        for address in list(self.procs):
            self.kill(address)


@pytest.fixture
def servers(saved_model):
    started = Servers(saved_model)
    clients = []
    started.client = lambda *a, **k: clients.append(grpc_shards.ShardClient(*a, **k)) or \
        clients[-1]
    try:
        yield started
    finally:
        for client in clients:
            client.close()
        started.close()


def request(ids, segments, num_segments):
    return {"ids": np.array(ids, np.int64), "segments": np.array(segments, np.int32),
            "num_segments": np.int32(num_segments)}


def test_served_signature_equals_the_saved_model(servers, saved_model):
    client = servers.client(MODEL, [servers.start()])
    inputs = request([5, 3, 99, 13, 5], [0, 0, 1, 2, 2], 4)
    served = client.call("lookup", inputs).result()
    direct = tf.saved_model.load(saved_model).signatures["lookup"](
        **{k: tf.constant(v) for k, v in inputs.items()})
    np.testing.assert_array_equal(served["pooled"], direct["pooled"].numpy())
    assert served["pooled"].tolist() == [[4, 6], [0, 0], [10, 12], [0, 0]]
    assert served["pooled"].dtype == np.float32 and int(served["found"]) == 4
    assert client.predict("serving_default", {}) == {"size": 4}
    assert client.predict("", {}) == {"size": 4}   # empty: serving_default, as TF Serving


def test_calls_in_flight_on_several_shards_at_once(servers):
    shards = [servers.client(f"shard_{i}", [servers.start()], model_name=MODEL)
              for i in range(2)]
    pending = [shard.call("lookup", request([3, 8], [0, 1], 2)) for shard in shards]
    for call in pending:
        assert call.result()["pooled"].tolist() == [[1, 2], [5, 6]]


def test_many_threads_share_one_client(servers):
    client = servers.client(MODEL, [servers.start(), servers.start()])

    def one(k):
        ids = KEYS[[k % 4, (k + 1) % 4]]
        return client.predict("lookup", request(ids, [0, 0], 1))["pooled"], ids

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(200)))
    for pooled, ids in results:
        expected = ROWS[np.searchsorted(KEYS, ids)].sum(0)
        np.testing.assert_array_equal(pooled, [expected])
    assert sum(client.calls) == 200 and min(client.calls) > 0


def test_replicas_round_robin_skip_a_dead_one_and_take_a_restarted_one_back(servers):
    first, second = servers.start(), servers.start()
    client = servers.client(MODEL, [first, second], timeout=5.0, retry_after=0.5)
    for _ in range(4):
        client.call("lookup", request([3], [0], 1)).result()
    assert client.calls == [2, 2]

    servers.kill(first)
    began = time.monotonic()
    for _ in range(4):
        assert client.call("lookup", request([3], [0], 1)).result()["pooled"][0, 0] == 1
    assert time.monotonic() - began < 10
    assert client.calls[1] == 6

    servers.start(first)          # the same address again
    deadline = time.monotonic() + 20   # a probe every retry_after finds it back
    while client.calls[0] == 2:
        assert time.monotonic() < deadline, client.calls
        client.call("lookup", request([3], [0], 1)).result()
        time.sleep(0.1)


def test_a_replica_back_at_its_address_answers_while_its_channel_backs_off(servers):
    """The replica's channel waits out its reconnect backoff (up to `retry_after`) after failed
    connects; a request arriving meanwhile waits for the reconnect instead of failing."""
    address = f"localhost:{free_port()}"
    client = servers.client(MODEL, [address], timeout=20.0, retry_after=4.0)
    began = time.monotonic()
    with pytest.raises(tf.errors.UnavailableError, match=address):
        client.call("lookup", request([5], [0], 1)).result()
    assert time.monotonic() - began < 4.0 + 1 + 3   # one reconnect backoff, not the deadline
    servers.start(address)
    for _ in range(3):
        assert client.predict("lookup", request([5], [0], 1))["pooled"].tolist() == [[3, 4]]


def test_a_dead_shard_fails_fast_naming_itself(servers):
    address = servers.start()
    client = servers.client("shard_7", [address], timeout=2.0, model_name=MODEL)
    client.call("lookup", request([3], [0], 1)).result()
    servers.kill(address)
    began = time.monotonic()
    with pytest.raises(tf.errors.UnavailableError, match=f"shard 'shard_7'.*{address}"):
        client.call("lookup", request([3], [0], 1)).result()
    assert time.monotonic() - began < 10
    # Never started at all: the same error, within the deadline.
    nobody = servers.client("shard_8", [f"localhost:{free_port()}"], timeout=1.0)
    began = time.monotonic()
    with pytest.raises(tf.errors.UnavailableError, match="shard 'shard_8'"):
        nobody.call("lookup", request([3], [0], 1)).result()
    assert time.monotonic() - began < 10


def test_a_hung_replica_costs_one_deadline_then_is_set_aside(servers):
    hung, live = servers.start(), servers.start()
    client = servers.client(MODEL, [hung, live], timeout=1.0, retry_after=60)
    servers.procs[hung].send_signal(19)   # SIGSTOP: connected, never answers
    try:
        began = time.monotonic()
        for _ in range(4):
            assert client.predict("lookup", request([5], [0], 1))["pooled"].tolist() == [[3, 4]]
        assert time.monotonic() - began < 1.0 * 2 + 3   # one deadline, not one per request
        assert client.calls == [0, 4]
    finally:
        servers.procs[hung].send_signal(18)   # SIGCONT, so that kill reaps it


def test_bad_arguments_and_requests_name_themselves(servers):
    with pytest.raises(ValueError, match="addresses"):
        grpc_shards.ShardClient("s", "localhost:1")
    with pytest.raises(ValueError, match="timeout"):
        grpc_shards.ShardClient("s", ["localhost:1"], timeout=0)
    with pytest.raises(ValueError, match="retry_after"):
        grpc_shards.ShardClient("s", ["localhost:1"], retry_after=-1)
    address = servers.start()
    client = servers.client(MODEL, [address])
    with pytest.raises(tf.errors.InvalidArgumentError, match="signature_name 'predict'"):
        client.call("predict", request([3], [0], 1)).result()
    with pytest.raises(tf.errors.InvalidArgumentError, match="shard 'shard_0'"):
        client.call("lookup", request([3], [0], 0)).result()   # segment 0 >= 0 segments
    with pytest.raises(tf.errors.InvalidArgumentError, match="'ids'.*must be int64; got int32"):
        client.call("lookup", {**request([3], [0], 1), "ids": np.int32([3])}).result()
    with pytest.raises(tf.errors.InvalidArgumentError, match="'segments'.*shape"):
        client.call("lookup", {**request([3], [0], 1), "segments": np.int32([[0]])}).result()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"lacks inputs \['num_segments'\]"):
        client.call("lookup", {"ids": np.int64([3]), "segments": np.int32([0])}).result()
    with pytest.raises(tf.errors.InvalidArgumentError, match="'extra' is not an input"):
        client.call("lookup", {**request([3], [0], 1), "extra": np.int32(1)}).result()
    wrong = servers.client(MODEL, [address], model_name="other")
    with pytest.raises(tf.errors.NotFoundError, match="'other' not served here"):
        wrong.predict("lookup", request([3], [0], 1))
    assert client.calls == [0] and wrong.calls == [0]   # answers that are errors: no failover


def test_a_stock_tf_serving_client_calls_a_shard(servers):
    """Only TF Serving's messages and stubs: what any TF Serving client sends."""
    channel = grpc.insecure_channel(servers.start())
    try:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        req = predict_pb2.PredictRequest()
        req.model_spec.name = MODEL
        req.model_spec.signature_name = "lookup"
        req.inputs["ids"].CopyFrom(tf.make_tensor_proto([13, 8, 4], tf.int64))
        req.inputs["segments"].CopyFrom(tf.make_tensor_proto([1, 1, 0], tf.int32))
        req.inputs["num_segments"].CopyFrom(tf.make_tensor_proto(2, tf.int32))
        req.output_filter.append("pooled")
        reply = stub.Predict(req, timeout=30)
        assert list(reply.outputs) == ["pooled"]
        assert tf.make_ndarray(reply.outputs["pooled"]).tolist() == [[0, 0], [12, 14]]
        assert (reply.model_spec.name, reply.model_spec.version.value,
                reply.model_spec.signature_name) == (MODEL, 1, "lookup")

        req.model_spec.version.value = 2
        with pytest.raises(grpc.RpcError) as raised:
            stub.Predict(req, timeout=30)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        assert "version 2" in raised.value.details()

        status_request = get_model_status_pb2.GetModelStatusRequest()
        status_request.model_spec.name = MODEL
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            status_request, timeout=30)
        assert [(s.version, s.state) for s in status.model_version_status] == [
            (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]

        meta_request = get_model_metadata_pb2.GetModelMetadataRequest()
        meta_request.model_spec.name = MODEL
        meta_request.metadata_field.append("signature_def")
        meta = stub.GetModelMetadata(meta_request, timeout=30)
        defs = get_model_metadata_pb2.SignatureDefMap()
        assert meta.metadata["signature_def"].Unpack(defs)
        # As TF Serving: the SavedModel's signature_def map, its init op's entry included.
        assert {"lookup", "serving_default"} <= set(defs.signature_def)
        assert sorted(defs.signature_def["lookup"].inputs) == ["ids", "num_segments", "segments"]
    finally:
        channel.close()
