"""TFRA's Redis table config (tables/redis_config.py): the file's precedence, every field with
TFRA's types and defaults, bad files named in the error, the layout functions checked against
values derived independently (hashlib, a bitwise CRC, numpy, hand-computed slots, a real Redis
Cluster's CLUSTER KEYSLOT, and hash names TFRA 0.8.1 wrote into a real redis-server); and the test helper tests/redis_server.py, which must start a
real standalone server and a 3-master cluster and leave no process behind."""

import hashlib
import json
import os

import numpy as np
import pytest

from tests import redis_server
from tfra_dynamic_embedding.tables import redis_config as rc

# TFRA 0.8.1's defaults, as its C++ struct Redis_Connection_Params declares them.
TFRA_DEFAULTS = {
    "redis_connection_mode": 1, "redis_master_name": "master", "redis_host_ip": ("127.0.0.1",),
    "redis_host_port": (6379,), "redis_user": "default", "redis_password": "", "redis_db": 0,
    "redis_read_access_slave": False, "redis_connect_keep_alive": False,
    "redis_connect_timeout": 1000, "redis_socket_timeout": 1000, "redis_conn_pool_size": 20,
    "redis_wait_timeout": 100000000, "redis_connection_lifetime": 100,
    "redis_sentinel_user": "default", "redis_sentinel_password": "",
    "redis_sentinel_connect_timeout": 1000, "redis_sentinel_socket_timeout": 1000,
    "storage_slice_import": 1, "storage_slice": 1, "using_hash_storage_slice": False,
    "keys_sending_size": 1024, "using_md5_prefix_name": False,
    "redis_hash_tags_hypodispersion": False, "model_tag_import": "test",
    "redis_hash_tags_import": (), "model_tag_runtime": "test", "redis_hash_tags_runtime": (),
    "expire_model_tag_in_seconds": 604800, "table_store_mode": 1, "model_lib_abs_dir": "/tmp/",
}

# A value other than the default for every field.
EVERY_FIELD = {
    "redis_connection_mode": 0, "redis_master_name": "mymaster",
    "redis_host_ip": ["10.0.0.1", "10.0.0.2"], "redis_host_port": [7000, 7001],
    "redis_user": "alice", "redis_password": "secret", "redis_db": 3,
    "redis_read_access_slave": True, "redis_connect_keep_alive": True,
    "redis_connect_timeout": 250, "redis_socket_timeout": 500, "redis_conn_pool_size": 4,
    "redis_wait_timeout": 12345, "redis_connection_lifetime": 7, "redis_sentinel_user": "bob",
    "redis_sentinel_password": "pw", "redis_sentinel_connect_timeout": 111,
    "redis_sentinel_socket_timeout": 222, "storage_slice_import": 2, "storage_slice": 4,
    "using_hash_storage_slice": True, "keys_sending_size": 64, "using_md5_prefix_name": True,
    "redis_hash_tags_hypodispersion": True, "model_tag_import": "v1",
    "redis_hash_tags_import": ["{1}", "{2}"], "model_tag_runtime": "v2",
    "redis_hash_tags_runtime": ["a", "{b}", "c}", "{d"], "expire_model_tag_in_seconds": -1,
    "table_store_mode": 2, "model_lib_abs_dir": "/data/models",
}


def _write(path, doc):
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


@pytest.fixture
def env(monkeypatch):
    for var in ("TFRA_REDIS_CONFIG_PATH", "MY_MODEL_REDIS_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


# --- which file ------------------------------------------------------------------------------


def test_precedence_env_named_then_global_env_then_path(tmp_path, env):
    named = _write(tmp_path / "named.json", {"redis_db": 1})
    global_ = _write(tmp_path / "global.json", {"redis_db": 2})
    direct = _write(tmp_path / "direct.json", {"redis_db": 3})
    config = rc.RedisTableConfig(redis_config_abs_dir=direct,
                                 redis_config_abs_dir_env="MY_MODEL_REDIS_CONFIG")
    assert rc.read_redis_config(config).redis_db == 3
    env.setenv("TFRA_REDIS_CONFIG_PATH", global_)
    assert rc.read_redis_config(config).redis_db == 2
    env.setenv("MY_MODEL_REDIS_CONFIG", named)
    assert rc.read_redis_config(config).redis_db == 1
    assert rc.resolve_config_path(config) == (named, "environment variable MY_MODEL_REDIS_CONFIG")
    # The config object is not changed by reading (TFRA's wrapper overwrote its attribute).
    assert (config.redis_config_abs_dir, config.redis_config_abs_dir_env) == \
        (direct, "MY_MODEL_REDIS_CONFIG")


def test_global_env_beats_path_without_a_named_variable(tmp_path, env):
    env.setenv("TFRA_REDIS_CONFIG_PATH", _write(tmp_path / "g.json", {"redis_db": 2}))
    config = rc.RedisTableConfig(_write(tmp_path / "d.json", {"redis_db": 3}))
    assert rc.read_redis_config(config).redis_db == 2


def test_nothing_named_falls_back_to_tfras_path(env):
    path, where = rc.resolve_config_path(rc.RedisTableConfig())
    assert path == "/tmp/tmp_TFRA_Redis_config_file.json" == rc.FALLBACK_CONFIG_PATH
    assert "fallback" in where
    assert rc.resolve_config_path(rc.RedisTableConfig(), environ={}) == (path, where)


def test_missing_and_empty_files_are_named(tmp_path, env):
    missing = str(tmp_path / "nope.json")
    env.setenv("MY_MODEL_REDIS_CONFIG", missing)
    config = rc.RedisTableConfig(redis_config_abs_dir_env="MY_MODEL_REDIS_CONFIG")
    with pytest.raises(ValueError, match=r"nope\.json.*environment variable MY_MODEL_REDIS_"
                                         r"CONFIG.*cannot be read: No such file"):
        rc.read_redis_config(config)
    empty = _write(tmp_path / "empty.json", "")
    with pytest.raises(ValueError, match=r"empty\.json.*redis_config_abs_dir\) is empty"):
        rc.read_redis_config(rc.RedisTableConfig(empty))
    with pytest.raises(TypeError, match="de.RedisTableConfig"):
        rc.read_redis_config(missing)


def test_config_keeps_tfras_constructor():
    config = rc.RedisTableConfig("/a.json", "ENV")
    assert (config.redis_config_abs_dir, config.redis_config_abs_dir_env) == ("/a.json", "ENV")
    assert vars(rc.RedisTableConfig()) == {"redis_config_abs_dir": None,
                                           "redis_config_abs_dir_env": None}


# --- fields ----------------------------------------------------------------------------------


def test_defaults_are_tfras():
    assert {f: getattr(rc.RedisConfig(), f) for f in TFRA_DEFAULTS} == TFRA_DEFAULTS
    assert rc.parse_redis_config("{}") == rc.RedisConfig()
    assert set(TFRA_DEFAULTS) == {f.name for f in rc.dataclasses.fields(rc.RedisConfig)}


def test_every_field_is_read(tmp_path, env):
    config = rc.read_redis_config(rc.RedisTableConfig(_write(tmp_path / "c.json", EVERY_FIELD)))
    for name, value in EVERY_FIELD.items():
        assert getattr(config, name) == (tuple(value) if isinstance(value, list) else value), name
    with pytest.raises(rc.dataclasses.FrozenInstanceError):
        config.redis_db = 0


@pytest.mark.parametrize("given, resolved", [(-1, 4), (0, 4), (2, 2)])
def test_storage_slice_import_at_most_zero_means_storage_slice(given, resolved):
    text = json.dumps({"storage_slice": 4, "storage_slice_import": given})
    assert rc.parse_redis_config(text).storage_slice_import == resolved


def test_tfras_own_test_configs_and_unknown_fields(caplog):
    # The files TFRA's tests write; the docs' one has a field TFRA never reads (ignored).
    tfra_test = {"redis_connection_mode": 2, "redis_host_ip": ["127.0.0.1"],
                 "redis_host_port": [6379], "storage_slice": 1, "table_store_mode": 0}
    assert rc.parse_redis_config(json.dumps(tfra_test, indent=2)) == rc.RedisConfig(
        redis_connection_mode=2, table_store_mode=0)
    docs = {"redis_host_ip": ["127.0.0.1"], "redis_host_port": [6379], "using_model_lib": False}
    assert rc.parse_redis_config(json.dumps(docs)) == rc.RedisConfig()
    # Later duplicates win, as in TFRA's reader.
    assert rc.parse_redis_config('{"redis_db": 1, "redis_db": 2}').redis_db == 2


@pytest.mark.parametrize("text, message", [
    ("{", "invalid JSON"),
    ('{"redis_db": 1,}', "invalid JSON"),
    ('{"redis_db": NaN}', "invalid JSON: NaN"),
    ("[1, 2]", "must hold a JSON object, got list"),
    ('{"redis_db": "0"}', "redis_db must be a JSON integer, got '0' (str)"),
    ('{"redis_db": 1.0}', "redis_db must be a JSON integer, got 1.0 (float)"),
    ('{"redis_db": true}', "redis_db must be a JSON integer, got True (bool)"),
    ('{"redis_db": -1}', "redis_db must be in [0, 2147483647], got -1"),
    ('{"redis_wait_timeout": 2147483648}', "redis_wait_timeout must be a JSON intege"),
    ('{"redis_read_access_slave": 1}', "redis_read_access_slave must be a JSON boolean"),
    ('{"redis_host_port": 6379}', "redis_host_port must be a JSON array of integers, got 6379"),
    ('{"redis_host_port": ["6379"]}', "redis_host_port must be a JSON array of integers"),
    ('{"redis_host_port": [70000]}', "redis_host_port must be in [1, 65535]"),
    ('{"redis_host_ip": "127.0.0.1"}', "redis_host_ip must be a JSON array of non-empty strings"),
    ('{"redis_host_ip": ["a", "b"]}', "redis_host_ip ['a', 'b'] and redis_host_port [6379]"),
    ('{"redis_host_ip": [], "redis_host_port": []}', "must be non-empty lists"),
    ('{"redis_connection_mode": 3}', "redis_connection_mode must be in [0, 2], got 3"),
    ('{"table_store_mode": 5}', "table_store_mode must be in [0, 2], got 5"),
    ('{"storage_slice": 0}', "storage_slice must be in [1, 2147483647], got 0"),
    ('{"keys_sending_size": 0}', "keys_sending_size must be in [1, "),
    ('{"redis_hash_tags_runtime": [""]}', "redis_hash_tags_runtime must be a JSON array of non"),
    ('{"model_tag_runtime": 7}', "model_tag_runtime must be a JSON string, got 7 (int)"),
])
def test_bad_configs_name_the_field_and_value(text, message, tmp_path):
    path = _write(tmp_path / "bad.json", text)
    with pytest.raises(ValueError) as raised:
        rc.read_redis_config(rc.RedisTableConfig(path))
    assert str(raised.value).startswith(path + ": ") and message in str(raised.value)


# --- layout ----------------------------------------------------------------------------------


def _crc32c_bitwise(data):
    """CRC-32C, the textbook bit-at-a-time form (no table): standard init and final xor."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc32c_matches_published_vectors():
    vectors = {b"123456789": 0xE3069283, bytes(32): 0x8A9136AA, b"\xff" * 32: 0x62A8AB43,
               bytes(range(32)): 0x46DD794E}       # RFC 3720 B.4 and the usual check value
    for data, crc in vectors.items():
        assert _crc32c_bitwise(data) == crc
        assert rc.crc32c_tfra(data) == crc ^ 0xFFFFFFFF      # TFRA never inverts at the end
    rng = np.random.default_rng(0)
    for n in range(0, 40):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert rc.crc32c_tfra(data) == _crc32c_bitwise(data) ^ 0xFFFFFFFF


def test_crc16_and_key_slots_follow_redis():
    assert rc.crc16(b"123456789") == 0x31C3                  # CRC-16/XMODEM check value
    assert rc.key_hash_slot(b"foo") == 12182                   # Redis' docs
    assert rc.key_hash_slot(b"{user1000}.following") == rc.key_hash_slot(b"user1000")
    assert rc.key_hash_slot(b"foo{}{bar}") == rc.crc16(b"foo{}{bar}") % 16384
    assert rc.key_hash_slot(b"a{x}b{y}") == rc.key_hash_slot(b"x")


def test_slot_tags_are_the_smallest_integers_of_each_slot():
    tags = [rc.slot_tag(s) for s in range(16384)]
    assert all(rc.crc16(str(t).encode()) % 16384 == s for s, t in enumerate(tags))
    assert tags[0] == 3560 and max(tags) == 109757 and len(set(tags)) == 16384
    first_seen = {}
    for n in range(4000):
        first_seen.setdefault(rc.crc16(str(n).encode()) % 16384, n)
    assert all(tags[s] == n for s, n in first_seen.items())


def test_hash_tags():
    assert rc.hash_tags(4, ["a", "{b}", "c}", "{d"]) == ["{a}", "{b}", "{c}", "{d}"]
    # Standalone / sentinel / hypodispersion: slots 16384 // n * i + 16384 % n.
    assert rc.hash_tags(3) == ["{%d}" % rc.slot_tag(s) for s in (1, 5462, 10923)]
    assert rc.hash_tags(1) == ["{3560}"] and rc.hash_tags(2, ["{9}"]) == rc.hash_tags(2)
    masters = [(0, 5460), (5461, 10922), (10923, 16383)]
    assert rc.hash_tags(3, (), masters) == ["{%d}" % rc.slot_tag(s) for s in (0, 5461, 10923)]
    assert rc.hash_tags(2, (), masters) == ["{%d}" % rc.slot_tag(s) for s in (0, 5461)]
    # More slices than masters: the 4th and 5th step 5460 * 3 // 5 = 3276 into the ranges.
    assert rc.hash_tags(5, (), masters) == ["{%d}" % rc.slot_tag(s)
                                            for s in (0, 5461, 10923, 3276, 8737)]


def test_cluster_slot_ranges_reads_masters_first_ranges():
    nodes = ("id1 127.0.0.1:7001@17001 master - 0 1 2 connected 5461-10922\n"
             "id0 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 16000\n"
             "id3 127.0.0.1:7003@17003 slave id0 0 1 1 connected\n"
             "id2 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383\n"
             "id4 127.0.0.1:7004@17004 master - 0 1 3 connected\n")
    assert rc.cluster_slot_ranges(nodes) == [(0, 5460), (5461, 10922), (10923, 16383)]


# Hash names TFRA 0.8.1 wrote with using_md5_prefix_name (read from a real redis-server).
TFRA_MD5_NAMES = {
    "m5:probe_c": "fdfaf94fb19d9a7f85c811b7be8bdde0",
    "m5:probe_c_" + "n" * 50: "db8536f31a8b7ea124781bc434931b84",
    "m5:probe_c_" + "L" * 120: "80d8a49251d5a5218b52ccd8afa86552",
}


def test_tfra_md5_is_rfc1321_code_on_64_bit_words():
    for name, digest in TFRA_MD5_NAMES.items():
        assert rc.tfra_md5(name.encode()).hex() == digest
        assert hashlib.md5(name.encode()).hexdigest() != digest
    # The same code on 32-bit words is MD5 (one and several blocks, every padding case).
    for size in list(range(0, 130)) + [1000]:
        data = bytes((7 * i + size) % 256 for i in range(size))
        assert rc.tfra_md5(data, word_mask=2**32 - 1) == hashlib.md5(data).digest()


def test_prefix_and_embedding_names():
    assert rc.prefix_name("m1", "user_emb") == b"m1:user_emb"
    assert rc.prefix_name("m5", "probe_c", True).hex() == TFRA_MD5_NAMES["m5:probe_c"]
    assert rc.tfra_embedding_name("tower/user_emb") == "tower_user_emb"
    assert rc.tfra_embedding_name("user_emb_mht_1of2") == "user_emb"
    assert rc.tfra_embedding_name("a_mht_b") == "a"


def test_slice_names_follow_the_mode():
    base = dict(storage_slice=3, storage_slice_import=2, model_tag_import="old")
    masters = [(0, 5460), (5461, 10922), (10923, 16383)]
    cluster = rc.RedisConfig(redis_connection_mode=rc.CLUSTER, **base)
    assert cluster.slice_names("e", masters) == [
        b"test:e{%d}" % rc.slot_tag(s) for s in (0, 5461, 10923)]
    assert cluster.slice_names("e", masters, runtime=False) == [
        b"old:e{%d}" % rc.slot_tag(s) for s in (0, 5461)]
    for other in (rc.RedisConfig(redis_connection_mode=rc.STANDALONE, **base),
                  rc.RedisConfig(redis_connection_mode=rc.CLUSTER,
                                 redis_hash_tags_hypodispersion=True, **base)):
        assert other.slice_names("e", masters) == [b"test:e" + t.encode()
                                                   for t in rc.hash_tags(3)]
    md5 = rc.RedisConfig(using_md5_prefix_name=True, model_tag_runtime="m5",
                         redis_hash_tags_runtime=("{7}",))
    assert md5.slice_names("probe_c") == [bytes.fromhex(TFRA_MD5_NAMES["m5:probe_c"]) + b"{7}"]


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integer_key_slices(dtype):
    info = np.iinfo(dtype)
    keys = np.array([0, 1, 5, -1, -7, info.min, info.max, 123456789], dtype)
    low32 = keys.astype(np.int64).view(np.uint64) & np.uint64(0xFFFFFFFF)   # two's complement
    for n in (1, 3, 7, 16):
        assert [rc.key_slice(int(k), n, key_dtype=dtype.__name__) for k in keys] == \
            [int(v) % n for v in low32]
        raw = [k.tobytes() for k in keys]              # native little-endian bytes, 4 or 8
        assert [rc.key_slice(int(k), n, True, np.dtype(dtype)) for k in keys] == \
            [(_crc32c_bitwise(b) ^ 0xFFFFFFFF) % n for b in raw]


def test_string_key_slices():
    # TFRA hashes TF's in-memory small string: the byte len << 2, then the key but its last byte.
    for key in (b"", b"a", b"user:42", b"x" * 22):
        head = bytes([len(key) << 2]) + key[:-1] if key else b""
        assert rc.key_slice(key, 5) == (_crc32c_bitwise(head) ^ 0xFFFFFFFF) % 5
        assert rc.key_slice(key, 5, True) == rc.key_slice(key, 5)
    assert rc.key_slice("user:42", 5) == rc.key_slice(b"user:42", 5)
    long_key = b"y" * 23
    assert rc.key_slice(long_key, 5) == (_crc32c_bitwise(long_key) ^ 0xFFFFFFFF) % 5


def test_config_key_slice_is_zero_outside_cluster_mode():
    key = 12345678901   # low 32 bits 3755744309: slice 1 of 2, or 0 by CRC
    assert rc.RedisConfig(redis_connection_mode=rc.CLUSTER, storage_slice=2).key_slice(key) == 1
    assert rc.RedisConfig(redis_connection_mode=rc.STANDALONE, storage_slice=2).key_slice(key) == 0
    assert rc.RedisConfig(redis_connection_mode=rc.CLUSTER, storage_slice=2,
                          using_hash_storage_slice=True).key_slice(key) == 0


# --- the real servers of tests/redis_server.py -----------------------------------------------


def _gone(pid):
    return not os.path.exists(f"/proc/{pid}")


@pytest.fixture(scope="module")
def cluster():
    redis_server.require_redis()
    with redis_server.RedisCluster(masters=3) as c:
        yield c
    assert all(_gone(pid) for pid in c.pids) and all(n.pid is None for n in c.nodes)
    assert not any(os.path.exists(n.dir) for n in c.nodes)


def test_standalone_server_starts_answers_and_is_stopped():
    redis_server.require_redis()
    with redis_server.StandaloneRedis() as redis:
        pid, folder = redis.pid, redis.dir
        assert not _gone(pid) and os.path.isdir(folder)
        assert redis.cli("PING") == "PONG"
        assert redis.cli("SET", "k", "v") == "OK" and redis.cli("GET", "k") == "v"
        assert "cluster_enabled:0" in redis.cli("INFO", "cluster")
    assert _gone(pid) and not os.path.exists(folder) and redis.pid is None


def test_restart_keeps_what_was_persisted():
    redis_server.require_redis()
    with redis_server.StandaloneRedis(extra_args=("--appendonly", "yes")) as redis:
        port, first = redis.port, redis.pid
        redis.cli("HSET", "h", "f", "v")
        redis.restart()
        assert redis.port == port and redis.pid != first and _gone(first)
        assert redis.cli("HGET", "h", "f") == "v"


def test_stop_all_ends_servers_left_running():
    redis_server.require_redis()
    redis = redis_server.RedisServer().start()
    pid = redis.pid
    redis_server.stop_all()
    assert _gone(pid)
    redis.stop()      # nothing left to stop; removes the folder


def test_cluster_of_three_masters(cluster):
    assert len(set(cluster.ports)) == 3 and not any(_gone(pid) for pid in cluster.pids)
    for node in cluster.nodes:
        info = node.cli("CLUSTER", "INFO")
        assert "cluster_state:ok" in info and "cluster_known_nodes:3" in info
        assert "cluster_slots_assigned:16384" in info and "cluster_size:3" in info
        assert node.cli("PING") == "PONG"
    ranges = rc.cluster_slot_ranges(cluster.nodes[0].cli("CLUSTER", "NODES"))
    assert ranges == [(0, 5460), (5461, 10922), (10923, 16383)]
    # TFRA's tags for 3 slices land on the 3 masters; Redis agrees on every slot.
    names = rc.RedisConfig(redis_connection_mode=rc.CLUSTER, storage_slice=3).slice_names(
        "user_emb", ranges)
    for name, (first, _) in zip(names, ranges):
        assert rc.key_hash_slot(name) == first
        assert int(cluster.nodes[0].cli("CLUSTER", "KEYSLOT", name.decode())) == first
    for name in (b"foo", b"test:user_emb", b"a{b}c", b"{}x"):
        assert int(cluster.nodes[1].cli("CLUSTER", "KEYSLOT", name.decode())) == \
            rc.key_hash_slot(name)


def test_cluster_routes_keys_to_every_master(cluster):
    node = cluster.nodes[0]
    for i in range(30):
        assert node.cli("-c", "SET", f"key{i}", str(i)) == "OK"
    counts = [int(n.cli("DBSIZE")) for n in cluster.nodes]
    assert sum(counts) == 30 and all(c > 0 for c in counts)
    assert cluster.nodes[2].cli("-c", "GET", "key7") == "7"
