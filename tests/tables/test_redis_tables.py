"""Redis tables (tables/redis.py, cc/redis/) against a real redis-server (tests/redis_server.py):
every Variable operation equals the in-memory native backend's result exactly, training with
Adam equals it, checkpoints round-trip, the layout is TFRA's (read and written here with a raw
RESP client, not through the package), and a dead, frozen or misconfigured server gives a clear
error in bounded time -- and the table works again once the server is back."""

import json
import os
import signal
import socket
import struct
import time

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests import redis_server
from tests.conftest import CPUS
from tfra_dynamic_embedding.tables import native
from tfra_dynamic_embedding.tables import redis as redis_tables
from tfra_dynamic_embedding.tables import redis_config as rc

# Skipped where the libraries are not built; under CI (which installs hiredis) they must be.
pytestmark = pytest.mark.skipif(
    not os.environ.get("CI") and not (redis_tables.is_available() and native.is_available()),
    reason="Redis or native op library not built (`make ops` with libhiredis-dev installed)")

# Each test uses its own model tag, so tests sharing the module's server never see each
# other's hashes.
_tags = iter(range(10**6))


@pytest.fixture(scope="module")
def server():
    redis_server.require_redis()
    with redis_server.StandaloneRedis() as redis:
        yield redis


def write_config(directory, port, **fields):
    doc = {"redis_connection_mode": 2, "redis_host_ip": ["127.0.0.1"], "redis_host_port": [port],
           "model_tag_runtime": f"t{next(_tags)}", "redis_socket_timeout": 1000,
           "redis_connect_timeout": 1000}
    doc.update(fields)
    path = os.path.join(str(directory), f"redis_{doc['model_tag_runtime']}.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


@pytest.fixture
def creator(server, tmp_path):
    return de.RedisTableCreator(de.RedisTableConfig(
        redis_config_abs_dir=write_config(tmp_path, server.port, keys_sending_size=7)))


def resp(port, *args):
    """One command over a raw socket (RESP), its reply parsed: bytes, int, list or None."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(out)
        f = s.makefile("rb")

        def read():
            line = f.readline()[:-2]
            kind, rest = line[:1], line[1:]
            if kind == b"+":
                return rest
            if kind == b"-":
                raise RuntimeError(rest.decode())
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                if n < 0:
                    return None
                data = f.read(n + 2)[:-2]
                return data
            if kind == b"*":
                n = int(rest)
                return None if n < 0 else [read() for _ in range(n)]
            raise RuntimeError(f"bad reply {line!r}")
        return read()


def _sorted(keys, values):
    keys, values = keys.numpy(), values.numpy()
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


def _keys(key_dtype, values):
    if key_dtype == tf.string:
        return tf.constant([f"id{v}" for v in values], tf.string)
    return tf.constant(values, key_dtype)


def _bits(x):
    """An array's bytes: exact comparison for every float type (NaN-safe); strings as a list."""
    x = np.asarray(x)
    return x.tolist() if x.dtype == object else x.tobytes()


# --- every Variable operation, equal to the native backend -----------------------------------

@pytest.mark.parametrize("key_dtype,value_dtype", [
    (tf.int64, tf.float32), (tf.int32, tf.float64), (tf.string, tf.float16),
    (tf.int64, tf.bfloat16)])
def test_every_variable_operation_equals_native(creator, key_dtype, value_dtype):
    init = tf.keras.initializers.RandomNormal(0.0, 0.5, seed=3)   # rows keyed by (seed, key)
    kwargs = dict(key_dtype=key_dtype, value_dtype=value_dtype, dim=5, initializer=init)
    red = de.Variable(name="every_op", kv_creator=creator, **kwargs)
    nat = de.Variable(name="every_op_native", kv_creator=de.NativeKVCreator(), **kwargs)
    red.clear()
    rng = np.random.default_rng(0)
    stored = _keys(key_dtype, np.arange(0, 40, 2))
    rows = tf.cast(rng.normal(size=(20, 5)), value_dtype)
    probe = _keys(key_dtype, [0, 1, 2, 3, 38, 39, 100, 2])
    deltas = tf.cast(rng.normal(size=(8, 5)) * 0.25, value_dtype)
    gone = _keys(key_dtype, [4, 5, 6, 4])
    for var in (red, nat):
        var.upsert(stored, rows)

    def same(a, b):
        assert _bits(a) == _bits(b), (a, b)

    same(red.lookup(probe), nat.lookup(probe))                     # initializer rows for misses
    r_rows, r_exists = red.lookup(probe, return_exists=True)
    n_rows, n_exists = nat.lookup(probe, return_exists=True)
    same(r_rows, n_rows)
    same(r_exists, n_exists)
    same(red.contains(probe), nat.contains(probe))
    for var in (red, nat):
        var.accum(probe, deltas)        # present and absent keys, key 2 twice
    same(red.lookup(probe), nat.lookup(probe))
    assert int(red.remove(gone)) == int(nat.remove(gone)) == 2    # 4 (twice) and 6
    assert int(red.size()) == int(nat.size()) == 20 + 4 - 2
    same(*[_sorted(*v.export())[0] for v in (red, nat)])
    same(*[_sorted(*v.export())[1] for v in (red, nat)])
    f_red, e_red = red.find_or_insert(_keys(key_dtype, [7, 8, 9, 7]))
    f_nat, e_nat = nat.find_or_insert(_keys(key_dtype, [7, 8, 9, 7]))
    same(f_red, f_nat)
    same(e_red, e_nat)
    assert int(red.size()) == int(nat.size()) == 24
    red.clear()
    assert int(red.size()) == 0
    keys, values = red.export()
    assert keys.shape == (0,) and values.shape == (0, 5)


@pytest.mark.parametrize("initializer", [
    tf.keras.initializers.VarianceScaling(seed=4), tf.keras.initializers.TruncatedNormal(seed=2),
    tf.keras.initializers.RandomUniform(-1, 1, seed=3), [0.5, -0.5, 1.0], 2.0])
def test_initial_rows_equal_native(creator, initializer):
    """Seeded and constant initializers: lookups and find_or_insert give the native backend's
    rows (drawn in C++ by the same kernel, or by the same TF ops for a VarianceScaling)."""
    kwargs = dict(dim=3, initializer=initializer)
    red = de.Variable(name="init_rows", kv_creator=creator, **kwargs)
    nat = de.Variable(name="init_rows_native", kv_creator=de.NativeKVCreator(), **kwargs)
    red.clear()
    keys = tf.constant([3, 1, 4, 1, 5, 9, 2, 6], tf.int64)
    for var in (red, nat):
        var.upsert(keys[:2], tf.ones([2, 3]))
    np.testing.assert_array_equal(red.lookup(keys).numpy(), nat.lookup(keys).numpy())
    r_rows, r_exists = red.find_or_insert(keys)
    n_rows, n_exists = nat.find_or_insert(keys)
    np.testing.assert_array_equal(r_rows.numpy(), n_rows.numpy())
    np.testing.assert_array_equal(r_exists.numpy(), n_exists.numpy())
    np.testing.assert_array_equal(_sorted(*red.export())[1], _sorted(*nat.export())[1])


def test_table_ops_on_many_keys_in_small_commands(creator):
    """20,000 keys in commands of 7 (keys_sending_size): parallel lanes where the machine has
    >= 8 CPUs (a lane per 4), with a duplicate of every key in the same upsert (the last row
    wins, as in memory)."""
    red = de.Variable(name="many", dim=3, kv_creator=creator)
    nat = de.Variable(name="many_native", dim=3, kv_creator=de.NativeKVCreator())
    red.clear()
    keys = tf.constant(np.concatenate([np.arange(10000), np.arange(10000)]) * 7919, tf.int64)
    rows = tf.random.stateless_normal([20000, 3], seed=[1, 2])
    for var in (red, nat):
        var.upsert(keys, rows)
        var.accum(keys, rows)
    assert int(red.size()) == 10000
    np.testing.assert_array_equal(red.lookup(keys).numpy(), nat.lookup(keys).numpy())
    table = red.tables[0].kv_table
    assert int(table.remove(keys)) == 10000           # each present key counted once
    assert int(red.size()) == 0


def test_sharded_variable_keeps_each_shard_in_its_own_hash(server, creator):
    """TFRA puts every shard of a variable into one hash, so its size() counts each key once per
    shard; here shard i of n is `<name>_mht_<i>of<n>`."""
    var = de.Variable(name="sharded", dim=2, devices=CPUS[:3], kv_creator=creator)
    var.clear()
    keys = tf.range(30, dtype=tf.int64)
    var.upsert(keys, tf.ones([30, 2]))
    assert int(var.size()) == 30
    assert [int(var.size(i)) for i in range(3)] == [10, 10, 10]
    exported, _ = var.export()
    assert sorted(exported.numpy().tolist()) == list(range(30))
    tag = var.tables[0].kv_table.config.model_tag_runtime
    names = sorted(resp(server.port, "KEYS", f"{tag}:*"))
    assert names == [f"{tag}:sharded_mht_{i}of3{{{rc.slot_tag(0)}}}".encode() for i in (1, 2, 3)]
    assert [resp(server.port, "HLEN", n) for n in names] == [10, 10, 10]


# --- TFRA's layout ------------------------------------------------------------------------------

def test_layout_is_tfras_both_ways(server, creator):
    """field = the key's little-endian bytes, value = the row's; hash `<tag>:<name>{<tag>}`."""
    var = de.Variable(name="layout/emb", dim=3, kv_creator=creator)
    var.clear()
    var.upsert(tf.constant([5, -1], tf.int64), [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    tag = var.tables[0].kv_table.config.model_tag_runtime
    hash_name = f"{tag}:layout_emb{{{rc.slot_tag(0)}}}".encode()
    assert var.tables[0].kv_table.hash_names == [hash_name]
    raw = resp(server.port, "HGETALL", hash_name)
    got = {struct.unpack("<q", raw[i])[0]: struct.unpack("<3f", raw[i + 1])
           for i in range(0, len(raw), 2)}
    assert got == {5: (1.0, 2.0, 3.0), -1: (4.0, 5.0, 6.0)}
    # Written by hand in that layout, read by the table.
    resp(server.port, "HSET", hash_name, struct.pack("<q", 2**40), struct.pack("<3f", 7, 8, 9))
    rows, exists = var.lookup(tf.constant([2**40, 6], tf.int64), return_exists=True)
    np.testing.assert_array_equal(rows.numpy()[0], [7, 8, 9])
    assert exists.numpy().tolist() == [True, False]
    # A row of another width under the name is named in the error, not misread.
    resp(server.port, "HSET", hash_name, struct.pack("<q", 3), b"\0" * 8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="row of 8 bytes, not dim"):
        var.lookup(tf.constant([3], tf.int64))


def test_lookup_replies_parsed_into_the_tensor(server, creator):
    """HMGET replies go straight into the output (no reply object per key): present, absent and
    duplicate keys over many commands equal native's; an error reply (the hash name holding a
    string) and a row of another width are named, and the next lookup works."""
    red = de.Variable(name="parsed", dim=4, kv_creator=creator,
                      initializer=tf.keras.initializers.Constant(-2.0))
    nat = de.Variable(name="parsed_native", dim=4, kv_creator=de.NativeKVCreator(),
                      initializer=tf.keras.initializers.Constant(-2.0))
    red.clear()
    stored = tf.constant(np.arange(0, 3000, 3), tf.int64)
    rows = tf.random.stateless_normal([1000, 4], seed=[4, 4])
    for var in (red, nat):
        var.upsert(stored, rows)
    query = tf.constant(np.concatenate([np.arange(3000), np.arange(0, 3000, 6)]), tf.int64)
    got, exists = red.lookup(query, return_exists=True)
    want, want_exists = nat.lookup(query, return_exists=True)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_array_equal(exists.numpy(), want_exists.numpy())
    name = red.tables[0].kv_table.hash_names[0]
    resp(server.port, "RENAME", name, name + b"_moved")
    resp(server.port, "SET", name, b"not a hash")
    with pytest.raises(tf.errors.FailedPreconditionError, match="WRONGTYPE"):
        red.lookup(query)
    resp(server.port, "DEL", name)
    resp(server.port, "RENAME", name + b"_moved", name)
    np.testing.assert_array_equal(red.lookup(query).numpy(), want.numpy())


def test_md5_prefix_names_and_slices(server, tmp_path):
    """using_md5_prefix_name: a binary hash name (TFRA's digest may hold a NUL byte, which broke
    its size() and export()); standalone with storage_slice 2: every key in slice 0, as TFRA."""
    for tag in range(40):       # a model tag whose digest has a NUL byte
        name = f"md5_{tag}"
        if b"\0" in rc.tfra_md5(f"{name}:hashed".encode()):
            break
    else:
        pytest.skip("no digest with a NUL byte among 40 tags")
    creator = de.RedisTableCreator(de.RedisTableConfig(redis_config_abs_dir=write_config(
        tmp_path, server.port, using_md5_prefix_name=True, storage_slice=2,
        model_tag_runtime=name)))
    var = de.Variable(name="hashed", dim=2, kv_creator=creator)
    table = var.tables[0].kv_table
    assert table.hash_names == [rc.tfra_md5(f"{name}:hashed".encode()) + t.encode()
                                for t in rc.hash_tags(2)]
    var.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2]))
    assert int(var.size()) == 3
    assert sorted(var.export()[0].numpy().tolist()) == [1, 2, 3]
    assert resp(server.port, "HLEN", table.hash_names[0]) == 3
    assert resp(server.port, "EXISTS", table.hash_names[1]) == 0
    with pytest.raises(tf.errors.InvalidArgumentError, match="\\\\x"):   # named, escaped
        resp(server.port, "HSET", table.hash_names[0], b"short", b"x")
        var.export()


def test_optimizer_slots_get_hashes_of_their_own(server, creator):
    var = de.get_variable("slotted", dim=2, kv_creator=creator,
                          initializer=tf.keras.initializers.Constant(0.5))
    var.clear()
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
    ids = tf.constant([1, 2], tf.int64)
    with tf.GradientTape() as tape:
        rows, trainable = de.embedding_lookup(var, ids, return_trainable=True)
        loss = tf.reduce_sum(rows * rows)
    opt.apply_gradients([(tape.gradient(loss, trainable), trainable)])
    tag = var.tables[0].kv_table.config.model_tag_runtime
    names = sorted((n.decode() for n in resp(server.port, "KEYS", f"{tag}:*")),
                   key=lambda n: n.split("{")[0])
    # <variable>_<optimizer name>_<slot>: Keras 3 names an Adam "adam" ("adam_<n>" when the
    # process made others before) and its slots momentum and velocity.
    assert [n.split("{")[0] for n in names] == [
        f"{tag}:slotted", f"{tag}:slotted_{opt.name}_momentum", f"{tag}:slotted_{opt.name}_velocity"]
    assert all(resp(server.port, "HLEN", n) == 2 for n in names)
    slot_hashes = sorted(h.decode() for slot in var.get_slot_variables(opt)
                         for h in slot.tables[0].kv_table.hash_names)
    assert slot_hashes == names[1:]


# --- training and checkpoints ------------------------------------------------------------------

def _train(kv_creator, name, steps=4):
    var = de.get_variable(name, dim=4, kv_creator=kv_creator,
                          initializer=tf.keras.initializers.RandomNormal(0, 0.1, seed=9))
    var.clear()
    dense = tf.Variable(tf.reshape(tf.range(8, dtype=tf.float32) / 10.0, [4, 2]))
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05))
    batches = [tf.constant([[1, 2, 3], [3, 4, 1]], tf.int64),
               tf.constant([[5, 1, 1], [2, 6, 7]], tf.int64)]
    for step in range(steps):
        ids = batches[step % 2]
        with tf.GradientTape() as tape:
            rows, trainable = de.embedding_lookup(var, ids, return_trainable=True)
            logits = tf.matmul(tf.reduce_sum(rows, 1), dense)
            loss = tf.reduce_sum(tf.square(logits - 1.0))
        grads = tape.gradient(loss, [trainable, dense])
        opt.apply_gradients(zip(grads, [trainable, dense]))
    keys, values = _sorted(*var.export())
    return keys, values, dense.numpy(), opt


def test_adam_training_equals_native(creator):
    r_keys, r_values, r_dense, _ = _train(creator, "trained")
    n_keys, n_values, n_dense, _ = _train(de.NativeKVCreator(), "trained_native")
    np.testing.assert_array_equal(r_keys, n_keys)
    np.testing.assert_array_equal(r_values, n_values)
    np.testing.assert_array_equal(r_dense, n_dense)


def test_checkpoint_round_trip(creator, tmp_path):
    var = de.Variable(name="ckpt", dim=3, kv_creator=creator)
    var.clear()
    keys = tf.constant([3, 1, 4, 15, 9], tf.int64)
    var.upsert(keys, tf.reshape(tf.range(15, dtype=tf.float32), [5, 3]))
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
    saved = _sorted(*var.export())
    var.remove(keys[:2])
    var.upsert(tf.constant([99], tf.int64), tf.ones([1, 3]))
    tf.train.Checkpoint(emb=var).restore(path).assert_consumed()
    restored = _sorted(*var.export())
    np.testing.assert_array_equal(restored[0], saved[0])
    np.testing.assert_array_equal(restored[1], saved[1])
    # Into native tables (and back): the checkpoint holds plain keys and rows.
    other = de.Variable(name="ckpt_native", dim=3, kv_creator=de.NativeKVCreator())
    tf.train.Checkpoint(emb=other).restore(path)
    np.testing.assert_array_equal(_sorted(*other.export())[1], saved[1])


def test_bp_v2_training_adds_up_on_the_server_as_native(creator):
    """bp_v2 writes each step's change with accum (a server-side script here): two optimizers
    stepping on the same rows both count, as on the native backend."""
    def run(kv_creator, name):
        var = de.Variable(name=name, dim=2, bp_v2=True, kv_creator=kv_creator,
                          initializer=tf.keras.initializers.Constant(1.0))
        var.clear()
        ids = tf.constant([1, 2, 1], tf.int64)
        opts = [de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5)) for _ in range(2)]
        tapes = []
        for _ in opts:      # both look up before either writes: two asynchronous workers
            with tf.GradientTape() as tape:
                rows, trainable = de.embedding_lookup(var, ids, return_trainable=True)
                loss = tf.reduce_sum(rows * tf.constant([[1.0, 2.0]]))
            tapes.append((tape.gradient(loss, trainable), trainable))
        for opt, grad in zip(opts, tapes):
            opt.apply_gradients([grad])
        return _sorted(*var.export())
    r_keys, r_values = run(creator, "bp")
    n_keys, n_values = run(de.NativeKVCreator(), "bp_native")
    np.testing.assert_array_equal(r_keys, n_keys)
    np.testing.assert_array_equal(r_values, n_values)
    np.testing.assert_array_equal(r_values, [[-1.0, -3.0], [0.0, -1.0]])   # 1 - 2 steps


def test_keras_fit_equals_native(creator):
    def fit(kv_creator, name):
        tf.keras.utils.set_random_seed(1)
        emb = de.keras.layers.Embedding(
            4, kv_creator=kv_creator, name=name, combiner="mean",
            initializer=tf.keras.initializers.RandomNormal(0, 0.1, seed=5))
        emb.params.clear()
        ids = tf.keras.Input(shape=(3,), dtype=tf.int64)
        out = tf.keras.layers.Dense(1, kernel_initializer="ones")(emb(ids))
        model = tf.keras.Model(ids, out)
        model.compile(de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.01)), "mse")
        x = np.arange(48, dtype=np.int64).reshape(16, 3) % 11
        model.fit(x, np.ones([16, 1]), batch_size=4, epochs=2, verbose=0, shuffle=False)
        return _sorted(*emb.params.export())
    r_keys, r_values = fit(creator, "kemb")
    n_keys, n_values = fit(de.NativeKVCreator(), "kemb_native")
    np.testing.assert_array_equal(r_keys, n_keys)
    np.testing.assert_array_equal(r_values, n_values)


def test_tf1_graph_session_and_saver(creator, tmp_path):
    with tf.Graph().as_default():
        var = de.get_variable("graph_emb", dim=2, kv_creator=creator,
                              initializer=tf.keras.initializers.Constant(-1.0))
        keys = tf.constant([10, 20], tf.int64)
        clear = var.clear()
        upsert = var.upsert(keys, [[1.0, 2.0], [3.0, 4.0]])
        lookup = var.lookup(tf.constant([10, 30], tf.int64))
        size = var.size()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(clear)
            sess.run(upsert)
            np.testing.assert_array_equal(sess.run(lookup), [[1, 2], [-1, -1]])
            path = saver.save(sess, str(tmp_path / "model"))
            sess.run(clear)
            assert sess.run(size) == 0
            saver.restore(sess, path)
            assert sess.run(size) == 2
            np.testing.assert_array_equal(sess.run(lookup), [[1, 2], [-1, -1]])


def test_save_to_file_system_round_trip(creator, tmp_path):
    var = de.Variable(name="files", dim=2, devices=CPUS[:2], kv_creator=creator)
    var.clear()
    var.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2]))
    var.save_to_file_system(str(tmp_path / "tables"))
    var.clear()
    var.load_from_file_system(str(tmp_path / "tables"))
    assert int(var.size()) == 3
    np.testing.assert_array_equal(var.lookup(tf.constant([2], tf.int64)).numpy(), [[1, 1]])


def test_empty_batches(creator):
    var = de.Variable(name="empty", dim=2, kv_creator=creator)
    var.clear()
    none = tf.zeros([0], tf.int64)
    var.upsert(none, tf.zeros([0, 2]))
    var.accum(none, tf.zeros([0, 2]))
    assert var.lookup(none).shape == (0, 2)
    assert int(var.remove(none)) == 0
    assert int(var.size()) == 0


# --- failures: bounded in time, named, recoverable ----------------------------------------------

def _timed(fn):
    start = time.monotonic()
    with pytest.raises(tf.errors.OpError) as info:
        fn()
    return time.monotonic() - start, info.value


def test_killed_server_fails_fast_and_restart_recovers(tmp_path):
    redis_server.require_redis()
    with redis_server.StandaloneRedis(extra_args=("--appendonly", "yes", "--appendfsync",
                                                  "always")) as redis:
        creator = de.RedisTableCreator(de.RedisTableConfig(
            redis_config_abs_dir=write_config(tmp_path, redis.port)))
        var = de.Variable(name="killed", dim=2, kv_creator=creator)
        keys = tf.constant([1, 2], tf.int64)
        var.upsert(keys, tf.ones([2, 2]))
        opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))

        def train_step():
            with tf.GradientTape() as tape:
                rows, trainable = de.embedding_lookup(var, keys, return_trainable=True)
                loss = tf.reduce_sum(rows)
            opt.apply_gradients([(tape.gradient(loss, trainable), trainable)])
        train_step()
        os.kill(redis.pid, signal.SIGKILL)
        redis.proc.wait(timeout=10)
        for op in (lambda: var.lookup(keys), lambda: var.upsert(keys, tf.ones([2, 2])),
                   lambda: var.size(), lambda: var.export(), train_step):
            seconds, error = _timed(op)
            assert seconds < 10, seconds
            assert f"127.0.0.1:{redis.port}" in str(error), str(error)
            assert isinstance(error, tf.errors.UnavailableError), repr(error)
        redis.proc = None
        redis.start()                        # same port, same directory: the AOF comes back
        np.testing.assert_array_equal(var.lookup(keys).numpy(), np.full([2, 2], 0.5))
        train_step()                         # training resumes
        np.testing.assert_array_equal(var.lookup(keys).numpy(), np.zeros([2, 2]))
        var.upsert(tf.constant([3], tf.int64), [[3.0, 3.0]])
        assert int(var.size()) == 3


def test_frozen_server_times_out(tmp_path):
    redis_server.require_redis()
    with redis_server.StandaloneRedis() as redis:
        creator = de.RedisTableCreator(de.RedisTableConfig(redis_config_abs_dir=write_config(
            tmp_path, redis.port, redis_socket_timeout=500)))
        var = de.Variable(name="frozen", dim=2, kv_creator=creator)
        keys = tf.constant([1, 2], tf.int64)
        var.upsert(keys, tf.ones([2, 2]))
        os.kill(redis.pid, signal.SIGSTOP)
        try:
            seconds, error = _timed(lambda: var.lookup(keys))
        finally:
            os.kill(redis.pid, signal.SIGCONT)
        assert seconds < 5, seconds
        assert "redis_socket_timeout 500 ms" in str(error) and str(redis.port) in str(error)
        np.testing.assert_array_equal(var.lookup(keys).numpy(), np.ones([2, 2]))


def test_wrong_password_unreachable_host_and_wrong_db_fail_at_creation(tmp_path):
    redis_server.require_redis()
    with redis_server.StandaloneRedis() as redis:
        redis.cli("CONFIG", "SET", "requirepass", "s3cret")   # after the helper's ready PING

        def make(**fields):
            path = write_config(tmp_path, fields.pop("port", redis.port), **fields)
            return lambda: de.Variable(name="bad", dim=2, kv_creator=de.RedisTableCreator(
                de.RedisTableConfig(redis_config_abs_dir=path)))

        seconds, error = _timed(make(redis_password="wrong"))
        assert isinstance(error, tf.errors.PermissionDeniedError), repr(error)
        assert "refused the password" in str(error) and str(redis.port) in str(error)
        seconds, error = _timed(make())                             # no password at all
        assert isinstance(error, tf.errors.PermissionDeniedError), repr(error)
        assert "NOAUTH" in str(error)
        seconds, error = _timed(make(redis_password="s3cret", redis_db=999))
        assert isinstance(error, tf.errors.InvalidArgumentError), repr(error)
        assert "redis_db 999" in str(error)
        closed = redis_server.free_port()
        seconds, error = _timed(make(port=closed, redis_connect_timeout=300))
        assert seconds < 5 and isinstance(error, tf.errors.UnavailableError), repr(error)
        assert f"127.0.0.1:{closed}" in str(error)
        # 192.0.2.1 (TEST-NET-1) is never routed: the connect timeout bounds the wait.
        seconds, error = _timed(make(redis_host_ip=["192.0.2.1"], redis_connect_timeout=300))
        assert seconds < 5 and isinstance(error, tf.errors.UnavailableError), repr(error)
        assert "192.0.2.1" in str(error)
        # The right password and a db: the table lives in that db only, and the password
        # is in no attribute of the graph.
        good = write_config(tmp_path, redis.port, redis_password="s3cret", redis_db=3)
        var = de.Variable(name="good", dim=2, kv_creator=de.RedisTableCreator(
            de.RedisTableConfig(redis_config_abs_dir=good)))
        var.upsert(tf.constant([1], tf.int64), [[1.0, 2.0]])
        assert int(var.size()) == 1
        assert redis.cli("-a", "s3cret", "-n", "3", "DBSIZE").endswith("1")
        assert redis.cli("-a", "s3cret", "-n", "0", "DBSIZE").endswith("0")

        @tf.function
        def size():
            return var.size()
        graph = size.get_concrete_function().graph.as_graph_def()
        assert b"s3cret" not in graph.SerializeToString()


def test_sentinel_mode_follows_a_failover(tmp_path):
    """Mode 1: the master is asked of the sentinel; when it dies, ops fail fast until the
    sentinel has promoted the replica, then the table works on the new master."""
    redis_server.require_redis()
    with redis_server.StandaloneRedis() as master, \
            redis_server.StandaloneRedis(extra_args=("--replicaof", "127.0.0.1",
                                                     str(master.port))) as replica, \
            redis_server.RedisSentinel(master.port, name="mymaster") as sentinel:
        path = write_config(tmp_path, sentinel.port, redis_connection_mode=1,
                            redis_master_name="mymaster")
        var = de.Variable(name="watched", dim=2, kv_creator=de.RedisTableCreator(
            de.RedisTableConfig(redis_config_abs_dir=path)))
        keys = tf.constant([1, 2], tf.int64)
        var.upsert(keys, [[1.0, 1.0], [2.0, 2.0]])
        assert master.cli("WAIT", 1, 5000) == "1"          # the replica has the rows
        deadline = time.monotonic() + 20                    # the sentinel knows the replica
        while str(replica.port) not in sentinel.cli("SENTINEL", "replicas", "mymaster"):
            assert time.monotonic() < deadline, sentinel.log()
            time.sleep(0.1)
        os.kill(master.pid, signal.SIGKILL)
        master.proc.wait(timeout=10)
        seconds, error = _timed(lambda: var.lookup(keys))
        assert seconds < 10 and f"127.0.0.1:{master.port}" in str(error), str(error)
        deadline = time.monotonic() + 30
        while True:     # errors (no failover yet), then the promoted replica's rows
            try:
                rows = var.lookup(keys)
                break
            except tf.errors.OpError:
                assert time.monotonic() < deadline, sentinel.log()
                time.sleep(0.2)
        np.testing.assert_array_equal(rows.numpy(), [[1, 1], [2, 2]])
        var.upsert(tf.constant([3], tf.int64), [[3.0, 3.0]])
        assert int(var.size()) == 3
        assert replica.cli("ROLE").startswith("master")
        master.proc = None


def test_bad_arguments_are_named(creator, tmp_path, server):
    with pytest.raises(TypeError, match="value_dtype of a Redis table must be one of"):
        de.Variable(name="ints", dim=2, value_dtype=tf.int32, kv_creator=creator)
    with pytest.raises(TypeError, match="config must be a de.RedisTableConfig"):
        de.RedisTableCreator(config={"redis_host_ip": ["127.0.0.1"]})
    # TFRA's demo config: sentinel mode (TFRA's default), pointed at a plain server.
    sentinel = write_config(tmp_path, server.port, redis_connection_mode=1)
    with pytest.raises(tf.errors.FailedPreconditionError, match="not a sentinel"):
        de.Variable(name="s", dim=2, kv_creator=de.RedisTableCreator(
            de.RedisTableConfig(redis_config_abs_dir=sentinel)))
    with pytest.raises(ValueError, match="redis_host_port"):
        de.Variable(name="s", dim=2, kv_creator=de.RedisTableCreator(de.RedisTableConfig(
            redis_config_abs_dir=write_config(tmp_path, server.port, redis_host_port=[1, 2]))))
    table = creator.create(tf.int64, tf.float32, 3, "direct")
    with pytest.raises(tf.errors.InvalidArgumentError, match="values must have shape \\[2, 3\\]"):
        table.insert(tf.constant([1, 2], tf.int64), tf.ones([2, 4]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="keys must be a 1-D tensor"):
        table.lookup(tf.constant([[1]], tf.int64), tf.zeros([3]))


def test_tfra_names_are_exported():
    from tensorflow_recommenders_addons.dynamic_embedding.python.ops.dynamic_embedding_creator \
        import RedisTableCreator
    from tensorflow_recommenders_addons.dynamic_embedding.python.ops.redis_table_ops import \
        RedisTableConfig
    assert de.RedisTableCreator is redis_tables.RedisTableCreator is RedisTableCreator
    assert de.RedisTableConfig is rc.RedisTableConfig is RedisTableConfig
    assert issubclass(de.RedisTableCreator, de.KVCreator)
