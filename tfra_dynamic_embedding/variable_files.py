"""TFRA's file-system save and load of a `de.Variable` (`save_to_file_system`,
`load_from_file_system`, `load_from_file_system_with_restore_function`): per-shard files,
committed all or nothing, read back into any shard count (layout: tables/files.py).
`Variable` inherits these methods from `FileSystemMethods`.

Example:
    >>> import tempfile
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> w = de.Variable(dim=2, name="vf_w")
    >>> _ = w.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
    >>> folder = tempfile.mkdtemp()
    >>> _ = w.save_to_file_system(folder)
    >>> _ = w.clear()
    >>> _ = w.load_from_file_system(folder)
    >>> int(w.size())
    2
"""

import tensorflow as tf

from tfra_dynamic_embedding import checkpoint as checkpoint_lib
from tfra_dynamic_embedding import devices as devices_lib
from tfra_dynamic_embedding.tables import files
from tfra_dynamic_embedding.typed_inputs import scope_name


class FileSystemMethods:
    """The file-system methods of `de.Variable` (they use its shards, name and partitioner)."""

    def save_to_file_system(self, dirpath, proc_size=1, proc_rank=0, file_name_list=None,
                            dirpath_env=files.ENV_DIR, append_to_file=False,
                            buffer_size=4194304, name=None):
        """Op saving every shard, all or nothing: shard i goes to
        `<name>_mht_<i+1>of<n>_rank<proc_rank>_size<proc_size>` (or `file_name_list[i]`) in a new
        generation directory under `dirpath`, then one atomic rename commits them together (layout
        in tables/files.py). `$TFRA_SAVED_KV` overrides `dirpath`, which may be a string tensor.
        `buffer_size` is accepted for TFRA compatibility (native files stream in ~1 MB blocks).

        Example:
            >>> import os, tempfile
            >>> import tensorflow_recommenders_addons.dynamic_embedding as de
            >>> w = de.Variable(dim=2, devices=["/CPU:0", "/CPU:0"], name="files_w")
            >>> _ = w.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
            >>> folder = tempfile.mkdtemp()
            >>> _ = w.save_to_file_system(folder, proc_size=2, proc_rank=1)
            >>> sorted(f for _, _, files in os.walk(folder) for f in files)
            [...'files_w_mht_1of2_rank1_size2'..., ...'files_w_mht_2of2_rank1_size2'...]
        """
        del buffer_size
        if append_to_file:
            raise ValueError("append_to_file=True is not supported: every save writes whole, "
                             "checksummed shard files")
        checkpoint_lib.check_ranks(proc_size, proc_rank)
        directory = files.resolve_dir(dirpath, dirpath_env)
        names = self._shard_file_names(file_name_list, proc_rank, proc_size)
        with tf.name_scope(name or scope_name(self._name + "_save_to_file_system")):
            return files.save_shards(self._tables, directory, self._name, names, proc_rank,
                                     proc_size)

    def load_from_file_system(self, dirpath, proc_size=1, proc_rank=0, file_name_list=None,
                              dirpath_env=files.ENV_DIR, load_entire_dir=False,
                              buffer_size=4194304, name=None):
        """Op replacing the content with the last committed `save_to_file_system` (or plain
        TFRA-layout files where nothing was committed): shard i reads its own file (same shard
        count), or with `load_entire_dir=True` every shard file of this variable in the directory,
        any rank and shard count, is read and re-partitioned over the current shards. Which save
        is read is decided when the op runs."""
        del buffer_size
        checkpoint_lib.check_ranks(proc_size, proc_rank)
        directory = files.resolve_dir(dirpath, dirpath_env)
        with tf.name_scope(name or scope_name(self._name + "_load_from_file_system")):
            if load_entire_dir:
                return self._load_files(directory)
            names = self._shard_file_names(file_name_list, proc_rank, proc_size)
            prefixes = files.shard_prefixes(directory, self._name, names, proc_rank, proc_size)
            return files.load_shards(self._tables, prefixes)

    def load_from_file_system_with_restore_function(self, dirpath, proc_size=1, proc_rank=0,
                                                    buffer_size=4194304):
        """Op loading every shard file of this variable in `dirpath` (committed saves, see
        `load_from_file_system`), whatever shard count and rank wrote them, re-partitioned over the
        current shards. With `proc_size` > 1 only the keys of rank `proc_rank`
        (`key % proc_size == proc_rank`, as `default_partition_fn`)."""
        del buffer_size
        checkpoint_lib.check_ranks(proc_size, proc_rank)
        with tf.name_scope(scope_name(self._name + "_load_from_file_system")):
            return self._load_files(files.resolve_dir(dirpath, None), proc_size, proc_rank)

    def _shard_file_names(self, file_name_list, proc_rank, proc_size):
        if file_name_list is None:
            return [files.shard_file_name(self._name, i, self.shard_num, proc_rank,
                                                proc_size) for i in range(self.shard_num)]
        if len(file_name_list) != self.shard_num:
            raise ValueError(f"file_name_list must name one file per shard ({self.shard_num}); "
                             f"got {len(file_name_list)}")
        if not all(isinstance(n, str) and n and "/" not in n for n in file_name_list):
            raise ValueError(f"file_name_list must hold plain file names; got {file_name_list!r}")
        return list(file_name_list)

    def _load_files(self, directory, proc_size=1, proc_rank=0):
        if len({devices_lib.task_cpu(d) for d in self._devices}) > 1:
            # Shards on several tasks (PSs): each task reads the files and keeps its own keys
            # (Paddle's PS-side load); no row passes through the client.
            loads = []
            for i, table in enumerate(self._tables):
                with devices_lib.task_cpu_scope(table.device):
                    keys, values = self._read_files(directory, proc_size, proc_rank)
                    ids = tf.cast(self._partitioner(keys, self.shard_num), tf.int32)
                    mine = tf.equal(ids, i)
                    loads.append(table.import_(tf.boolean_mask(keys, mine),
                                               tf.boolean_mask(values, mine)))
            return tf.group(*loads)
        return self.import_(*self._read_files(directory, proc_size, proc_rank))

    def _read_files(self, directory, proc_size, proc_rank):
        keys, values = files.read_files(files.variable_files(directory, self._name),
                                        self._key_dtype, self._value_dtype, self._dim)
        if proc_size > 1:
            mine = tf.equal(devices_lib.default_partition_fn(keys, proc_size), proc_rank)
            keys, values = tf.boolean_mask(keys, mine), tf.boolean_mask(values, mine)
        return keys, values
