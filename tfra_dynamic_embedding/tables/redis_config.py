"""TFRA's Redis table configuration (`de.RedisTableConfig` and its JSON file) and the layout in
which TFRA 0.8.1 keeps a table in Redis, as pure functions (no server needed).

The config file is found in this order (TFRA's documented precedence): the environment variable
named by `redis_config_abs_dir_env`, then `TFRA_REDIS_CONFIG_PATH`, then `redis_config_abs_dir`,
then TFRA's fallback `/tmp/tmp_TFRA_Redis_config_file.json`. Its fields, types and defaults are
those of TFRA's C++ reader (`RedisConfig` below); unknown fields are ignored, as TFRA does.

Layout: slice i of a table is the Redis hash `<prefix>{<tag_i>}`, the prefix being
`<model_tag>:<embedding name>` (or, with `using_md5_prefix_name`, the 16 bytes of its digest by
TFRA's MD5 code, which is not MD5: `tfra_md5`).
A field is the key's bytes (little-endian integer, or the string), its value the row's bytes
(little-endian; a string row is 4-byte little-endian length + bytes per element). With
`table_store_mode` 1 a save dumps each slice to `<model_lib_abs_dir>/<model_tag>/<hash name>.rdb`.

Example:
    >>> cfg = parse_redis_config('{"redis_connection_mode": 0, "storage_slice": 2}')
    >>> cfg.redis_connection_mode, cfg.storage_slice, cfg.storage_slice_import, cfg.redis_db
    (0, 2, 2, 0)
    >>> cfg.slice_names("user_emb")        # tags when the cluster's slots are not asked for
    [b'test:user_emb{3560}', b'test:user_emb{8209}']
    >>> key_slice(12345678901, 2), key_slice(12345678901, 2, using_hash_storage_slice=True)
    (1, 0)
    >>> parse_redis_config('{"redis_db": "0"}')
    Traceback (most recent call last):
    ...
    ValueError: <config>: redis_db must be a JSON integer, got '0' (str)
"""

import dataclasses
import functools
import json
import math
import os
import struct
from typing import Tuple

from absl import logging

CLUSTER, SENTINEL, STANDALONE = 0, 1, 2          # redis_connection_mode
CONFIG_PATH_ENV = "TFRA_REDIS_CONFIG_PATH"
FALLBACK_CONFIG_PATH = "/tmp/tmp_TFRA_Redis_config_file.json"
REDIS_SLOTS = 16384
_INT32_MAX = 2**31 - 1      # TFRA's JSON parser holds integers in int32; larger ones are doubles


class RedisTableConfig:
    """TFRA's `de.RedisTableConfig`: where the JSON config file is (`read_redis_config` reads it).

    `redis_config_abs_dir` is the file's path (TFRA's name; it is a file, not a directory);
    `redis_config_abs_dir_env` names an environment variable holding the path, which wins.
    """

    def __init__(self, redis_config_abs_dir=None, redis_config_abs_dir_env=None):
        self.redis_config_abs_dir = redis_config_abs_dir
        self.redis_config_abs_dir_env = redis_config_abs_dir_env

    def __repr__(self):
        return (f"RedisTableConfig(redis_config_abs_dir={self.redis_config_abs_dir!r}, "
                f"redis_config_abs_dir_env={self.redis_config_abs_dir_env!r})")


@dataclasses.dataclass(frozen=True)
class RedisConfig:
    """Every field of TFRA's config file, with TFRA's C++ types and defaults (lists as tuples).
    `storage_slice_import` <= 0 means "equal to storage_slice" and is stored resolved."""
    redis_connection_mode: int = SENTINEL      # 0 cluster, 1 sentinel, 2 standalone
    redis_master_name: str = "master"          # sentinel mode's master
    redis_host_ip: Tuple[str, ...] = ("127.0.0.1",)
    redis_host_port: Tuple[int, ...] = (6379,)
    redis_user: str = "default"
    redis_password: str = ""
    redis_db: int = 0
    redis_read_access_slave: bool = False
    redis_connect_keep_alive: bool = False
    redis_connect_timeout: int = 1000          # milliseconds
    redis_socket_timeout: int = 1000           # milliseconds
    redis_conn_pool_size: int = 20
    redis_wait_timeout: int = 100000000        # milliseconds
    redis_connection_lifetime: int = 100       # minutes
    redis_sentinel_user: str = "default"
    redis_sentinel_password: str = ""
    redis_sentinel_connect_timeout: int = 1000  # milliseconds
    redis_sentinel_socket_timeout: int = 1000   # milliseconds
    storage_slice_import: int = -1
    storage_slice: int = 1
    using_hash_storage_slice: bool = False
    keys_sending_size: int = 1024
    using_md5_prefix_name: bool = False
    redis_hash_tags_hypodispersion: bool = False
    model_tag_import: str = "test"
    redis_hash_tags_import: Tuple[str, ...] = ()
    model_tag_runtime: str = "test"
    redis_hash_tags_runtime: Tuple[str, ...] = ()
    expire_model_tag_in_seconds: int = 604800   # < 0: never expire
    table_store_mode: int = 1       # 0 checkpoint tensors, 1 Redis dump files, 2 nothing
    model_lib_abs_dir: str = "/tmp/"

    def __post_init__(self):
        if self.storage_slice_import <= 0:      # frozen: set once, as TFRA's reader does
            object.__setattr__(self, "storage_slice_import", self.storage_slice)

    def slice_names(self, embedding_name, cluster_slots=(), runtime=True):
        """The hash names (bytes) of the table's slices under `model_tag_runtime` (or, with
        runtime=False, `model_tag_import`). `cluster_slots`: `cluster_slot_ranges(...)` of the
        cluster; TFRA asks for them only in cluster mode without hypodispersion."""
        if self.redis_connection_mode != CLUSTER or self.redis_hash_tags_hypodispersion:
            cluster_slots = ()
        tag, slices, tags = ((self.model_tag_runtime, self.storage_slice,
                              self.redis_hash_tags_runtime) if runtime else
                             (self.model_tag_import, self.storage_slice_import,
                              self.redis_hash_tags_import))
        prefix = prefix_name(tag, embedding_name, self.using_md5_prefix_name)
        return [prefix + t.encode() for t in hash_tags(slices, tags, cluster_slots)]

    def key_slice(self, key, key_dtype="int64"):
        """The slice index of `key`: TFRA spreads keys over slices in cluster mode only; in
        standalone and sentinel mode every key is in slice 0."""
        if self.redis_connection_mode != CLUSTER:
            return 0
        return key_slice(key, self.storage_slice, self.using_hash_storage_slice, key_dtype)


# Field kinds from the annotations: what JSON type each field must have.
_FIELDS = {f.name: f for f in dataclasses.fields(RedisConfig)}
# (minimum, maximum) beyond the JSON int32 range; modes and slices outside them break TFRA.
_RANGES = {"redis_connection_mode": (0, 2), "table_store_mode": (0, 2), "storage_slice": (1, None),
           "keys_sending_size": (1, None), "redis_db": (0, None), "redis_conn_pool_size": (1, None),
           "redis_connect_timeout": (0, None), "redis_socket_timeout": (0, None),
           "redis_wait_timeout": (0, None), "redis_connection_lifetime": (0, None),
           "redis_sentinel_connect_timeout": (0, None), "redis_sentinel_socket_timeout": (0, None)}


def _checked(source, name, value):
    """`value` of field `name` as TFRA's reader takes it, or ValueError naming both."""
    kind = _FIELDS[name].type

    def bad(what):
        return ValueError(f"{source}: {name} must be {what}, got {value!r} "
                          f"({type(value).__name__})")
    if kind is bool:
        if not isinstance(value, bool):
            raise bad("a JSON boolean (true/false)")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise bad("a JSON string")
        return value
    if kind == Tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise bad("a JSON array of non-empty strings")
        return tuple(value)
    what = "a JSON integer" if kind is int else "a JSON array of integers"
    if kind is int:
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        raise bad(what)
    for v in items:     # a bool is an int in Python, not in JSON: TFRA rejects it too
        if isinstance(v, bool) or not isinstance(v, int) or abs(v) > _INT32_MAX:
            raise bad(what)
    lo, hi = (1, 65535) if name == "redis_host_port" else _RANGES.get(name, (None, None))
    if any((lo is not None and v < lo) or (hi is not None and v > hi) for v in items):
        raise bad(f"in [{lo}, {hi if hi is not None else _INT32_MAX}]")
    return value if kind is int else tuple(value)


def parse_redis_config(text, source="<config>"):
    """A `RedisConfig` from the JSON text (str or bytes) of a TFRA config file; `source` (its
    path) prefixes every error. Raises ValueError naming the field and the value."""
    def no_constant(name):        # NaN / Infinity: Python's json takes them, TFRA's does not
        raise ValueError(f"{source}: invalid JSON: {name} is not JSON")
    try:
        doc = json.loads(text, parse_constant=no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{source}: invalid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: must hold a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:     # TFRA ignores them; a typo would silently fall back to a default
        logging.warning("%s: ignoring fields TFRA does not read: %s", source, ", ".join(unknown))
    values = {name: _checked(source, name, doc[name]) for name in _FIELDS if name in doc}
    config = RedisConfig(**values)
    if len(config.redis_host_ip) != len(config.redis_host_port) or not config.redis_host_ip:
        raise ValueError(f"{source}: redis_host_ip {list(config.redis_host_ip)} and "
                         f"redis_host_port {list(config.redis_host_port)} must be non-empty "
                         f"lists of the same length")
    return config


def resolve_config_path(config, environ=None):
    """(path, where it came from) by TFRA's precedence. TFRA's kernel falls back to the next
    source when the variable named by `redis_config_abs_dir_env` is unset, as here (its Python
    wrapper raised instead); a variable that is set must name a file that exists."""
    environ = os.environ if environ is None else environ
    for var in (config.redis_config_abs_dir_env, CONFIG_PATH_ENV):
        if var and environ.get(var):
            return environ[var], f"environment variable {var}"
    if config.redis_config_abs_dir:
        return os.fspath(config.redis_config_abs_dir), "RedisTableConfig.redis_config_abs_dir"
    return FALLBACK_CONFIG_PATH, "TFRA's fallback path (no config file was named)"


def read_redis_config(config, environ=None):
    """The `RedisConfig` of a `RedisTableConfig`: finds the file (`resolve_config_path`) and
    parses it. A missing or empty file raises ValueError naming the path and its source."""
    if not isinstance(config, RedisTableConfig):
        raise TypeError(f"config must be a de.RedisTableConfig; got {config!r}")
    path, where = resolve_config_path(config, environ)
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"Redis config file {path!r} (from {where}) cannot be read: "
                         f"{e.strerror}") from None
    if not text:
        raise ValueError(f"Redis config file {path!r} (from {where}) is empty")
    return parse_redis_config(text, path)


# --- layout ---------------------------------------------------------------------------------


def tfra_embedding_name(variable_name):
    """TFRA's table name is `<variable name, '/' -> '_'>_mht_<i>of<n>` and its Redis name is
    that up to the first `_mht_`: every shard of a variable shares one name (TFRA's layout)."""
    return variable_name.replace("/", "_").split("_mht_", 1)[0]


def prefix_name(model_tag, embedding_name, using_md5_prefix_name=False):
    """`<model_tag>:<embedding_name>` as bytes, or the 16 bytes of its `tfra_md5` digest."""
    name = f"{model_tag}:{embedding_name}".encode()
    return tfra_md5(name) if using_md5_prefix_name else name


def tfra_md5(data, word_mask=2**64 - 1):
    """The "MD5" of TFRA's md5.cc: RFC 1321's reference code, whose 32-bit words are declared
    `unsigned long`, 64 bits on Linux: sums, NOTs and rotations (`x << s | x >> (32 - s)`) run
    on 64-bit words and only the digest keeps their low 32 bits. Not MD5's digest (with
    word_mask=2**32 - 1 it is: the tests check the two)."""
    size = len(data)
    data += b"\x80" + bytes((55 - size) % 64) + struct.pack("<Q", size * 8 % 2**64)
    state = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476]
    for block in range(0, len(data), 64):
        x = struct.unpack_from("<16I", data, block)
        a, b, c, d = state
        for i in range(64):
            if i < 16:
                f, g = (b & c) | (~b & word_mask & d), i
            elif i < 32:
                f, g = (b & d) | (c & ~d & word_mask), (5 * i + 1) % 16
            elif i < 48:
                f, g = b ^ c ^ d, (3 * i + 5) % 16
            else:
                f, g = c ^ (b | ~d & word_mask), 7 * i % 16
            t = (a + f + x[g] + _MD5_K[i]) & word_mask
            t = ((t << _MD5_S[i]) | (t >> (32 - _MD5_S[i]))) & word_mask
            a, b, c, d = d, (b + t) & word_mask, b, c
        state = [(s + v) & word_mask for s, v in zip(state, (a, b, c, d))]
    return struct.pack("<4I", *(s & 0xFFFFFFFF for s in state))


def crc16(data):
    """CRC-16/XMODEM (poly 0x1021, init 0), Redis Cluster's key hash."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16_TABLE[(crc >> 8) ^ byte]
    return crc


def key_hash_slot(name):
    """Redis Cluster's slot of key `name` (bytes): CRC16 mod 16384 of its first non-empty
    `{...}` hash tag, else of the whole name."""
    start = name.find(b"{")
    end = name.find(b"}", start + 1) if start >= 0 else -1
    if end > start + 1:
        name = name[start + 1:end]
    return crc16(name) % REDIS_SLOTS


@functools.lru_cache(maxsize=1)
def _slot_tags():
    """TFRA's table of hash tags: for each slot, the smallest non-negative integer whose decimal
    string hashes to it (computed, ~0.2 s once; the largest is 109757)."""
    tags, n = [None] * REDIS_SLOTS, 0
    missing = REDIS_SLOTS
    while missing:
        slot = crc16(str(n).encode()) % REDIS_SLOTS
        if tags[slot] is None:
            tags[slot], missing = n, missing - 1
        n += 1
    return tuple(tags)


def slot_tag(slot):
    """The decimal tag TFRA uses to place a slice on Redis Cluster slot `slot`."""
    return _slot_tags()[slot]


def hash_tags(storage_slice, redis_hash_tags=(), cluster_slots=()):
    """The `{tag}` of each slice, as TFRA chooses them: the configured tags when there are
    exactly `storage_slice` of them (braces added where missing); else with no cluster slots
    (standalone, sentinel, hypodispersion) tag i = slot_tag(16384 // n * i + 16384 % n); else
    from the first slot of each master's first range (sorted), spread when there are more
    slices than masters."""
    n = storage_slice
    if len(redis_hash_tags) == n:
        return [("" if t.startswith("{") else "{") + t + ("" if t.endswith("}") else "}")
                for t in redis_hash_tags]
    if not cluster_slots:
        return ["{%d}" % slot_tag(REDIS_SLOTS // n * i + REDIS_SLOTS % n) for i in range(n)]
    if len(cluster_slots) >= n:
        return ["{%d}" % slot_tag(first) for first, _ in cluster_slots[:n]]
    m, tags = len(cluster_slots), []
    while len(tags) < n:       # round-robin over the masters, stepping inside each range
        for first, last in cluster_slots:
            i = len(tags)
            tags.append("{%d}" % slot_tag(first + i // m * ((last - first) * m // n)))
            if len(tags) == n:
                break
    return tags


def cluster_slot_ranges(cluster_nodes):
    """The sorted distinct (first, last) slot of each master's first range in the text of
    `CLUSTER NODES`, as TFRA reads it (a master without slots is skipped: TFRA crashes)."""
    ranges, first = set(), 0
    for row in cluster_nodes.splitlines():
        cols = row.split(" ")
        if len(cols) < 9 or not cols[2].startswith(("master", "myself,master")):
            continue
        lo, sep, hi = cols[8].partition("-")
        if sep:
            first = int(lo)     # a lone slot keeps the previous row's first (TFRA's parser)
        ranges.add((first, int(hi if sep else lo)))
    return sorted(ranges)


def crc32c_tfra(data):
    """TFRA's key hash: the CRC-32C (Castagnoli) register after `data`, started at 0xFFFFFFFF
    and not inverted at the end (= standard CRC-32C ^ 0xFFFFFFFF; SSE4.2's crc32 instruction)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = (crc >> 8) ^ _CRC32C_TABLE[(crc ^ byte) & 0xFF]
    return crc


def key_slice(key, storage_slice, using_hash_storage_slice=False, key_dtype="int64"):
    """The slice TFRA puts `key` in (cluster mode; `RedisConfig.key_slice` handles the modes).

    Integer keys: (key mod 2**32, i.e. its low 32 bits unsigned) % storage_slice, or with
    `using_hash_storage_slice` crc32c_tfra(key's 4 or 8 little-endian bytes) % storage_slice.
    String keys (bytes), in both cases: TFRA hashes the first len(key) bytes of TensorFlow's
    in-memory string object, which for a string of at most 22 bytes is the byte len(key) << 2
    followed by key[:-1]; for a longer key those bytes hold a pointer and TFRA's slice is not
    reproducible: this function then hashes the key's bytes (crc32c_tfra(key) % storage_slice).
    """
    if isinstance(key, str):
        key = key.encode()
    if isinstance(key, bytes):
        if len(key) <= 22:
            key = bytes([len(key) << 2]) + key[:-1] if key else b""
        return crc32c_tfra(key) % storage_slice
    if not using_hash_storage_slice:
        return (int(key) & 0xFFFFFFFF) % storage_slice
    width = {"int32": 4, "int64": 8}[getattr(key_dtype, "name", key_dtype)]   # tf/np dtype or str
    return crc32c_tfra(int(key).to_bytes(width, "little", signed=True)) % storage_slice


def _crc_table(poly, reflected):
    table = []
    for byte in range(256):
        crc = byte if reflected else byte << 8
        for _ in range(8):
            if reflected:
                crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
            else:
                crc = ((crc << 1) ^ poly if crc & 0x8000 else crc << 1) & 0xFFFF
        table.append(crc)
    return tuple(table)


_MD5_K = [int(abs(math.sin(i + 1)) * 2**32) for i in range(64)]   # RFC 1321's table T
_MD5_S = [7, 12, 17, 22] * 4 + [5, 9, 14, 20] * 4 + [4, 11, 16, 23] * 4 + [6, 10, 15, 21] * 4
_CRC16_TABLE = _crc_table(0x1021, reflected=False)
_CRC32C_TABLE = _crc_table(0x82F63B78, reflected=True)
