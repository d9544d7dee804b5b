"""The Redis backend: shard tables kept in a Redis server (TFRA's `de.RedisTableCreator`).

Rows live outside the process, so a table can outgrow the trainers' and PS tasks' memory,
survive their restarts and be read by other processes (TFRA's own tables included) while it is
written. Every op is one C++ kernel (`cc/redis/`, over hiredis) that sends its keys in batched,
pipelined commands; no Python runs per key.

Layout (TFRA 0.8.1's, so each side reads what the other wrote): slice i of a table is the Redis
hash `<model_tag_runtime>:<name>{<tag_i>}` (tables/redis_config.py), a field is the key's raw
bytes (little-endian integer, or the string) and its value the row's raw little-endian bytes.
`<name>` is the variable's name with `/` as `_` (optimizer slots: `<var>_<Optimizer>_<slot>`,
e.g. `emb_Adam_m`; TFRA's are named after the lookup instead, docs/redis.md). A variable on
n > 1 devices keeps shard i (of 1..n) in a hash of its own, `<name>_mht_<i>of<n>`; TFRA puts
every shard into `<name>` and so counts a key once per shard.

The config is TFRA's JSON file (`de.RedisTableConfig`; tables/redis_config.py reads it), in each
of TFRA's modes (`redis_connection_mode`): 2 standalone, 1 sentinel (the master is asked of the
sentinels, again after a failover), 0 Redis Cluster (slot routing in the kernel). The passwords
are read by the kernel from the file, so that they never appear in a graph or SavedModel. A
checkpoint holds the rows as for the other backends, or with the file's `table_store_mode` 1 the
paths of Redis dumps of the hashes (2: nothing; `RedisKVTable.store_mode`). A SavedModel holds
none: its lookups read them in Redis, through the config file found again when it is loaded
(docs/redis.md, "Serving from Redis").

The op library is `_tfra_de_redis_ops.so` next to this file, or `$TFRA_DE_REDIS_OPS_LIBRARY`;
it is built only where hiredis is installed (`make system-deps`), and creating a table without
it raises RuntimeError naming why.

Usage (with a server; docs/redis.md has more), `redis.json` being
`{"redis_connection_mode": 2, "redis_host_ip": ["127.0.0.1"], "redis_host_port": [6379]}`:

    import tensorflow_recommenders_addons.dynamic_embedding as de
    creator = de.RedisTableCreator(de.RedisTableConfig(redis_config_abs_dir="redis.json"))
    emb = de.get_variable("user_emb", dim=16, kv_creator=creator)
"""

import json
import os
import re
import socket
import threading

import tensorflow as tf

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding import checkpoint as checkpoint_lib
from tfra_dynamic_embedding.tables import base, native
from tfra_dynamic_embedding.tables import redis_config as rc

LIBRARY_ENV = "TFRA_DE_REDIS_OPS_LIBRARY"
KEY_DTYPES = (tf.int32, tf.int64, tf.string)
VALUE_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)

_load_lock = threading.Lock()
_library = None
_load_error = None
_load_tried = False


def library_path():
    """Path the Redis op library is loaded from: `$TFRA_DE_REDIS_OPS_LIBRARY`, else next to
    this module."""
    return os.environ.get(LIBRARY_ENV) or os.path.join(os.path.dirname(__file__),
                                                       "_tfra_de_redis_ops.so")


def _load():
    global _library, _load_error, _load_tried
    with _load_lock:
        if not _load_tried:
            _load_tried = True
            path = library_path()
            try:
                _library = tf.load_op_library(path)
            except Exception as error:  # pylint: disable=broad-except  (reported by ops())
                _load_error = f"{path}: {error}"
    return _library


def is_available():
    """Whether the Redis op library is loaded (loading it on first call)."""
    return _load() is not None


def load_if_built():
    """Loads the op library when it is there (silently otherwise): a SavedModel holding Redis
    tables loads only where their ops are registered, so TFRA's import
    (`compat.install`) calls this, and `tf.saved_model.load` works right after
    `import tensorflow_recommenders_addons.dynamic_embedding`. True when loaded."""
    return os.path.exists(library_path()) and is_available()


def ops():
    """The Redis op library's op functions; RuntimeError naming why when it did not load."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"Redis tables are not available: {_load_error}. Build the library "
                           f"with hiredis installed (`make system-deps && make ops`).")
    return lib


def redis_table_name(table_name):
    """The `<name>` of a shard table's Redis hashes (see the module docstring): TFRA's
    `<variable>` for the only shard of a variable, `<variable>_mht_<i>of<n>` for one of n > 1.

    Example:
        >>> redis_table_name("user_emb_mht_1of1"), redis_table_name("user_emb_mht_2of4")
        ('user_emb', 'user_emb_mht_2of4')
        >>> redis_table_name("emb_Adam_m_mht_1of1"), redis_table_name("my_table")
        ('emb_Adam_m', 'my_table')
    """
    name = table_name.replace("/", "_")
    match = re.fullmatch(r"(.*)_mht_(\d+)of(\d+)", name)
    if match and int(match.group(3)) == 1:
        return match.group(1)
    return name


def cluster_nodes(config):
    """The text of `CLUSTER NODES` from the first configured node that answers (TFRA derives a
    cluster table's hash tags from it). Asked once per table when it is created, over a plain
    socket: the rows themselves only ever travel through the kernels."""
    errors = []
    timeout = max(config.redis_connect_timeout, config.redis_socket_timeout, 1) / 1000.0
    for host, port in zip(config.redis_host_ip, config.redis_host_port):
        try:
            with socket.create_connection((host, port), timeout=timeout) as conn:
                reader = conn.makefile("rb")
                if config.redis_password:
                    user = ([config.redis_user] if config.redis_user not in ("", "default")
                            else [])
                    _resp_command(conn, reader, "AUTH", *user, config.redis_password)
                return _resp_command(conn, reader, "CLUSTER", "NODES").decode()
        except (OSError, RuntimeError) as e:
            errors.append(f"{host}:{port}: {e}")
    raise ValueError(f"no Redis Cluster node answered CLUSTER NODES (redis_host_ip / "
                     f"redis_host_port): {'; '.join(errors)}")


def _resp_command(conn, reader, *args):
    """Sends one command; returns its status or bulk reply (RuntimeError on an error reply)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    conn.sendall(b"".join(out))
    line = reader.readline()
    if not line.endswith(b"\r\n"):
        raise RuntimeError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"-":
        raise RuntimeError(rest.decode(errors="replace"))
    if kind == b"$" and int(rest) >= 0:
        return reader.read(int(rest) + 2)[:-2]
    return rest


def _config_of(config):
    """(RedisConfig, path of its file or "", the environment variables naming the file in
    TFRA's order) of a creator's `config`."""
    if isinstance(config, rc.RedisConfig):
        if config.redis_password or config.redis_sentinel_password:
            raise ValueError("a RedisConfig with a redis_password must come from its config file "
                             "(de.RedisTableConfig): the kernel reads the password from the file, "
                             "so that it is never written into a graph")
        return config, "", ()
    path, _ = rc.resolve_config_path(config)
    env = tuple(v for v in (config.redis_config_abs_dir_env, rc.CONFIG_PATH_ENV) if v)
    return rc.read_redis_config(config), path, env


def named_fields(path):
    """The fields a config file names (an empty set for no file)."""
    if not path:
        return set()
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError):
        return set()
    return set(doc) if isinstance(doc, dict) else set()


def store_mode_of(config, path):
    """The `table_store_mode` a checkpoint follows: the file's when it names one, else 0 (the
    rows, portable to every backend). TFRA's default is 1; here a dump needs asking for, as
    earlier releases of this package always wrote the rows."""
    return config.table_store_mode if "table_store_mode" in named_fields(path) else 0


def expire_seconds_of(config, path):
    """The TTL (s) every write sets on its hashes: `expire_model_tag_in_seconds` when the file
    names it and it is > 0, else -1 (none). TFRA's default is 7 days; here a TTL needs asking
    for, so that a pause in training never deletes a table."""
    seconds = config.expire_model_tag_in_seconds
    return seconds if "expire_model_tag_in_seconds" in named_fields(path) and seconds > 0 else -1


class RedisKVTable(base.KVTable):
    """A shard table in Redis (see `KVTable` for the methods; module docstring for the layout).

    config: the parsed `RedisConfig`; password_file: the JSON file the kernel reads
    `redis_password` from ("" for none); config_env: the environment variables that name the
    file (TFRA's order). With a file, the kernel reads it again whenever it creates the table
    -- also in a process that loads a SavedModel of it: there the first of `config_env` that is
    set names the file, else `password_file`; its connection fields and model_tag_runtime
    replace those of `config` (docs/redis.md, "Serving from Redis").
    """

    saved_model_holds_rows = False   # a SavedModel reads the rows in Redis

    def __init__(self, key_dtype, value_dtype, dim, name, config, password_file="", device="",
                 shared_name=None, config_env=(), store_mode=0, expire_seconds=-1):
        key_dtype, value_dtype = tf.as_dtype(key_dtype), tf.as_dtype(value_dtype)
        if key_dtype not in KEY_DTYPES:
            raise TypeError(f"key_dtype of a Redis table must be one of int32, int64, string; "
                            f"got {key_dtype.name}")
        if value_dtype not in VALUE_DTYPES:
            raise TypeError(f"value_dtype of a Redis table must be one of float16, bfloat16, "
                            f"float32, float64; got {value_dtype.name}")
        if isinstance(dim, bool) or int(dim) < 1:
            raise ValueError(f"dim must be >= 1; got {dim!r}")
        if not isinstance(config, rc.RedisConfig):
            raise TypeError(f"config must be a RedisConfig (redis_config.read_redis_config); "
                            f"got {config!r}")
        mode = config.redis_connection_mode
        super().__init__(key_dtype, value_dtype, dim, name, device, shared_name)
        self.gen_ops = ops()
        self.config = config
        self.redis_name = redis_table_name(name)
        slots = ()
        if (mode == rc.CLUSTER and not config.redis_hash_tags_hypodispersion
                and len(config.redis_hash_tags_runtime) != config.storage_slice):
            slots = rc.cluster_slot_ranges(cluster_nodes(config))   # TFRA's tags follow them
        self.hash_names = config.slice_names(self.redis_name, slots)
        self._password_file = password_file
        self._config_env = list(config_env)
        self._store_mode = int(store_mode)
        self._expire_seconds = int(expire_seconds)
        self.resource_handle  # pylint: disable=pointless-statement  (create it now, on `device`)

    def _create_resource(self):
        shared_name = self._shared_name or ""
        if self._owns_resource and not tf.executing_eagerly():
            shared_name = ""    # as native.py: a traced creator gets a private table
        c = self.config
        return self.gen_ops.tfra_de_redis_table(
            key_dtype=self.key_dtype, value_dtype=self.value_dtype, dim=self.dim,
            connection_mode=c.redis_connection_mode, hosts=list(c.redis_host_ip),
            ports=list(c.redis_host_port), user=c.redis_user, password_file=self._password_file,
            db=c.redis_db, connect_timeout_ms=c.redis_connect_timeout,
            socket_timeout_ms=c.redis_socket_timeout, pool_size=c.redis_conn_pool_size,
            wait_timeout_ms=c.redis_wait_timeout, keep_alive=c.redis_connect_keep_alive,
            master_name=c.redis_master_name, sentinel_user=c.redis_sentinel_user,
            sentinel_connect_timeout_ms=c.redis_sentinel_connect_timeout,
            sentinel_socket_timeout_ms=c.redis_sentinel_socket_timeout,
            hash_names=self.hash_names, using_hash_storage_slice=c.using_hash_storage_slice,
            keys_sending_size=c.keys_sending_size,
            expire_seconds=self._expire_seconds,
            follow_config=bool(self._password_file),
            config_env=self._config_env, model_tag=c.model_tag_runtime,
            md5_prefix=c.using_md5_prefix_name, shared_name=shared_name,
            use_node_name_sharing=not tf.inside_function(), name=base.op_name(self.name))

    # -- checkpoints: TFRA's table_store_mode ---------------------------------------------

    @property
    def store_mode(self):
        """TFRA's `table_store_mode` (`store_mode_of`): 0 a checkpoint holds the rows, 1 it names
        Redis dump files (`<model_lib_abs_dir>/<model_tag_runtime>/<hash>.rdb`, written at each
        save, read back at restore), 2 it holds only the hash names (the rows stay in Redis)."""
        return self._store_mode

    def dump_directory(self):
        return os.path.join(self.config.model_lib_abs_dir, self.config.model_tag_runtime)

    def store_tensors(self):
        """What a checkpoint holds of this table in store modes 1 and 2 (see `store_mode`).

        Mode 1's dump is a SaveSpec of a callable, run only when the checkpoint is written: TF
        also asks a trackable for its tensors when it restores it (for their names), and a dump
        made then would overwrite the files about to be read (TFRA's restore has that bug)."""
        device = self.device or "/device:CPU:0"
        if self.store_mode == 1:
            def dump():
                with tf.device(self.device):
                    return self.gen_ops.tfra_de_redis_dump(self.resource_handle,
                                                           self.dump_directory())
            return {"redis_dump_files": _tf_private.SaveSpec(dump, "", "", dtype=tf.string,
                                                             device=device)}
        with tf.device(self.device):
            return {"redis_hashes": tf.constant(self.hash_names, tf.string)}

    def restore_store_tensors(self, tensors):
        """Store mode 1: reads the dump files named (never writes them); mode 2: nothing."""
        with tf.device(self.device):
            if "redis_dump_files" in tensors:
                return self.gen_ops.tfra_de_redis_restore(self.resource_handle,
                                                          tensors["redis_dump_files"])
            return tf.no_op()

    # -- conversions ----------------------------------------------------------------------

    def key_tensor(self, keys):
        keys = tf.convert_to_tensor(keys)
        if keys.dtype != self.key_dtype:
            if keys.dtype.is_integer and self.key_dtype.is_integer:
                return tf.cast(keys, self.key_dtype)
            raise TypeError(f"keys must be {self.key_dtype.name}; got {keys.dtype.name}")
        return keys

    def row_tensor(self, rows, name="values"):
        rows = tf.convert_to_tensor(rows)
        if rows.dtype != self.value_dtype:
            if not (rows.dtype.is_floating or rows.dtype.is_integer):
                raise TypeError(f"{name} must be {self.value_dtype.name}; got {rows.dtype.name}")
            rows = tf.cast(rows, self.value_dtype)
        return rows

    def _typed(self):
        return dict(key_dtype=self.key_dtype, value_dtype=self.value_dtype, dim=self.dim)

    # -- lookups --------------------------------------------------------------------------

    def lookup(self, keys, default_rows):
        return self.lookup_with_exists(keys, default_rows)[0]

    def lookup_with_exists(self, keys, default_rows):
        """(rows, exists); `default_rows` is `[N, dim]` or one `[dim]` row for every key."""
        with tf.device(self.device):
            return self.gen_ops.tfra_de_redis_find(
                self.resource_handle, self.key_tensor(keys),
                self.row_tensor(default_rows, "default_rows"), dim=self.dim)

    def _lookup_or_zeros(self, keys):
        with tf.device(self.device):
            return self.gen_ops.tfra_de_redis_find(self.resource_handle, self.key_tensor(keys),
                                                   tf.zeros([self.dim], self.value_dtype),
                                                   dim=self.dim)

    def _drawer(self):
        """An always-empty native table on this table's device, or None without the native
        library: its fused lookup draws initial rows in C++, the very rows the native backend
        gives the same keys (nothing is ever inserted into it)."""
        if "_init_drawer" not in self.__dict__:
            drawer = None
            if native.is_available():
                with tf.init_scope():
                    drawer = native.NativeKVTable(self.key_dtype, self.value_dtype, self.dim,
                                                  f"{self.name}_init_rows", self._device)
                # Tracked, so that a SavedModel whose functions use it holds it too.
                self._track_trackable(drawer, name="init_rows")
            self.__dict__["_init_drawer"] = drawer
        return self.__dict__["_init_drawer"]

    def _initial_rows(self, keys, init):
        """Initial rows of `init` for `keys`: one row for all ([dim]) when every row is the
        same, else `[N, dim]` drawn in C++ (`_drawer`) or by TF ops (`init.rows`)."""
        if init.constant:
            return self.row_tensor(init.rows(tf.zeros([1], self.key_dtype))[0], "initial rows")
        drawer = self._drawer()
        if drawer is not None and native.fused_form(init) is not None:
            return drawer.lookup_or_init(keys, init, return_exists=False)[0]
        return self.row_tensor(init.rows(keys), "initial rows")

    def lookup_or_init(self, keys, init, return_exists=True):
        """(rows, exists) without inserting; missing keys get initial rows of `init` (an
        `InitSpec`, or a `make_rows(keys)` callable): a constant row is the default of the one
        find; other rows are drawn afterwards for the distinct missing keys only (in C++ where
        the native kernels draw the kind: `_initial_rows`)."""
        init = base.as_init_spec(init, self.dim, self.value_dtype)
        with tf.device(self.device):
            keys = self.key_tensor(keys)
            if init.constant:
                rows, exists = self.lookup_with_exists(keys, self._initial_rows(keys, init))
                return rows, exists if return_exists else None
            rows, exists = self._lookup_or_zeros(keys)
            drawer = self._drawer()
            if drawer is not None and native.fused_form(init) is not None:
                # Every key's initial row, drawn in C++ while the find waits on the server (the
                # two ops do not depend on each other, so TF runs them side by side), then one
                # select: no unique / gather / scatter over the missing keys.
                drawn = drawer.lookup_or_init(keys, init, return_exists=False)[0]
                rows = tf.where(tf.expand_dims(exists, -1), rows, drawn)
                return rows, exists if return_exists else None
            missing = tf.where(tf.logical_not(exists))
            unique_keys, index = tf.unique(tf.gather_nd(keys, missing))
            new_rows = self._initial_rows(unique_keys, init)
            rows = tf.tensor_scatter_nd_update(rows, missing, tf.gather(new_rows, index))
            return rows, exists if return_exists else None

    def find_or_insert(self, keys, init):
        """(rows, exists); the distinct missing keys are inserted with initial rows of `init`
        unless another writer got there first (then its row is returned)."""
        init = base.as_init_spec(init, self.dim, self.value_dtype)
        with tf.device(self.device):
            keys = self.key_tensor(keys)
            rows, exists = self._lookup_or_zeros(keys)
            missing = tf.where(tf.logical_not(exists))
            unique_keys, index = tf.unique(tf.gather_nd(keys, missing))
            new_rows = self._initial_rows(unique_keys, init)
            if new_rows.shape.rank == 1:
                new_rows = tf.tile(new_rows[None], tf.stack([tf.size(unique_keys), 1]))
            stored = self.gen_ops.tfra_de_redis_insert_missing(
                self.resource_handle, unique_keys, new_rows, dim=self.dim)
            rows = tf.tensor_scatter_nd_update(rows, missing, tf.gather(stored, index))
            return rows, exists

    # -- updates --------------------------------------------------------------------------

    def insert(self, keys, values):
        with tf.device(self.device):
            return self.gen_ops.tfra_de_redis_insert(self.resource_handle, self.key_tensor(keys),
                                                     self.row_tensor(values), dim=self.dim)

    def accum(self, keys, deltas):
        """Adds `deltas` on the server (atomically per command: concurrent writers add up)."""
        with tf.device(self.device):
            return self.gen_ops.tfra_de_redis_accum(self.resource_handle, self.key_tensor(keys),
                                                    self.row_tensor(deltas, "deltas"),
                                                    dim=self.dim)

    def remove(self, keys):
        """Deletes keys; returns the number removed (an int64 scalar)."""
        with tf.device(self.device):
            return self.gen_ops.tfra_de_redis_remove(self.resource_handle, self.key_tensor(keys))

    def clear(self):
        with tf.device(self.device):
            return self.gen_ops.tfra_de_redis_clear(self.resource_handle)

    def size(self):
        with tf.device(self.device):
            return self.gen_ops.tfra_de_redis_size(self.resource_handle)

    def export(self):
        with tf.device(self.device):
            return tuple(self.gen_ops.tfra_de_redis_export(self.resource_handle, **self._typed()))

    def import_(self, keys, values):
        with tf.device(self.device):
            return self.gen_ops.tfra_de_redis_import(self.resource_handle, self.key_tensor(keys),
                                                     self.row_tensor(values), dim=self.dim)


class RedisKVCreator(base.KVCreator):
    """Creates `RedisKVTable` shards: `de.Variable(..., kv_creator=RedisKVCreator(config))`.

    config: a `de.RedisTableConfig` (TFRA's: where the JSON file is), a parsed `RedisConfig`
    (without a password), or None (TFRA's lookup of the file: `$TFRA_REDIS_CONFIG_PATH`, then
    its fallback path). The file is read when a table is created (usage with a server: the
    module docstring).

    Example:
        >>> creator = RedisKVCreator(rc.RedisTableConfig(redis_config_abs_dir="/no/such.json"))
        >>> creator.create(tf.int64, tf.float32, dim=4, name="t")
        Traceback (most recent call last):
        ...
        ValueError: Redis config file '/no/such.json' (from ...) cannot be read: No such file ...
    """

    def __init__(self, config=None):
        if config is None:
            config = rc.RedisTableConfig()
        if not isinstance(config, (rc.RedisTableConfig, rc.RedisConfig)):
            raise TypeError(f"config must be a de.RedisTableConfig; got {config!r}")
        self.config = config

    def create(self, key_dtype, value_dtype, dim, name, device="", shared_name=None, init_size=0):
        del init_size  # Redis grows by itself
        config, password_file, config_env = _config_of(self.config)
        return RedisKVTable(key_dtype, value_dtype, dim, name, config, password_file, device,
                            shared_name, config_env, store_mode_of(config, password_file),
                            expire_seconds_of(config, password_file))


class RedisTableCreator(RedisKVCreator):
    """TFRA's `de.RedisTableCreator(config, saver)`: Redis tables for `de.Variable`,
    `de.get_variable` and `de.keras.layers.Embedding` (`kv_creator=`).

    config: a `de.RedisTableConfig` or None (see `RedisKVCreator`); saver: None or a
    `de.FileSystemSaver` (checkpoints then write the tables to files, as for other backends).
    Usage with a server: the module docstring, docs/redis.md.

    Example:
        >>> RedisTableCreator(config={"redis_host_ip": ["10.0.0.1"]})
        Traceback (most recent call last):
        ...
        TypeError: config must be a de.RedisTableConfig or None; got {'redis_host_ip': ['10.0.0.1']}
    """

    def __init__(self, config=None, saver=None):
        if config is not None and not isinstance(config, rc.RedisTableConfig):
            raise TypeError(f"config must be a de.RedisTableConfig or None; got {config!r}")
        if saver is not None and not isinstance(saver, checkpoint_lib.DynamicEmbeddingSaver):
            raise TypeError(f"saver must be None or a de.FileSystemSaver; got {saver!r}")
        super().__init__(config)
        self.saver = saver

