"""`de.train`: TFRA's training utilities; `DECheckpoint` (also `Checkpoint`), a
`tf.train.Checkpoint` for models with dynamic embeddings, and `DEHvdSaver`, a
`tf.compat.v1.train.Saver` that writes on Horovod rank 0 only.

`tf.train.Checkpoint` already saves and restores `de.Variable`s (all rows, re-partitioned over
the restoring variable's shards, or to files with `de.FileSystemSaver`: see checkpoint.py), so
`DECheckpoint` adds only TFRA's save-time behaviour: every `de.shadow_ops.ShadowVariable` in the
checkpointed objects is emptied (its rows are a cache of the tables, reloaded by the next lookup).

Example:
    >>> import os, tempfile
    >>> import tensorflow as tf
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> model = tf.Module()
    >>> model.emb = de.Variable(dim=2, devices=["/CPU:0"] * 2)
    >>> _ = model.emb.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2]))
    >>> path = DECheckpoint(model).save(os.path.join(tempfile.mkdtemp(), "model"))
    >>> new_model = tf.Module()
    >>> new_model.emb = de.Variable(dim=2, devices=["/CPU:0"] * 3)
    >>> _ = DECheckpoint(new_model).read(path).expect_partial()  # over new_model's shards
    >>> int(new_model.emb.size())
    3
"""

import tensorflow as tf

from tfra_dynamic_embedding.compat import horovod
from tfra_dynamic_embedding.compat import shadow_ops

__all__ = ["Checkpoint", "DECheckpoint", "DEHvdSaver"]


class DECheckpoint(tf.train.Checkpoint):
    """A `tf.train.Checkpoint` (same arguments and methods) that also empties the
    `ShadowVariable`s of the objects it saves before each `save` / `write` (TFRA's
    `de.train.DECheckpoint`). TFRA's Horovod rank coordination is not needed here: one process
    saves each variable, and `de.FileSystemSaver(proc_size, proc_rank)` splits file saves.

    Example:
        >>> import os, tempfile
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> module = tf.Module()
        >>> module.params = de.Variable(dim=2)
        >>> module.shadow = de.shadow_ops.ShadowVariable(module.params)
        >>> _ = de.shadow_ops.embedding_lookup(module.shadow, tf.constant([1, 2], tf.int64))
        >>> _ = DECheckpoint(module).save(os.path.join(tempfile.mkdtemp(), "model"))
        >>> module.shadow.shape                 # emptied: it holds [0, dim]
        TensorShape([0, 2])
    """

    def save(self, file_prefix, options=None):
        self._clear_shadows()
        return super().save(file_prefix, options=options)

    def write(self, file_prefix, options=None):
        self._clear_shadows()
        return super().write(file_prefix, options=options)

    def _clear_shadows(self):
        # Only eagerly: in a tf.compat.v1 graph the save op runs later, in a session, and the
        # checkpoint entry of a shadow is empty anyway (ShadowVariable._serialize_to_tensors).
        if not tf.executing_eagerly():
            return
        for trackable in tf.train.TrackableView(self).descendants():
            if isinstance(trackable, shadow_ops.ShadowVariable):
                trackable.clear()


Checkpoint = DECheckpoint


class DEHvdSaver(tf.compat.v1.train.Saver):
    """TFRA's `de.train.DEHvdSaver`: a `tf.compat.v1.train.Saver` (same arguments; it saves and
    restores `de.Variable`s, also through `de.FileSystemSaver`), whose `save` writes only on
    Horovod rank 0 and returns None on the other ranks, which hold the same model. Outside
    Horovod it is the plain Saver.

    Usage under Horovod (`saver.save(sess, path, global_step=step)` on every rank):
    docs/tfra_compatibility.md.
    """

    def save(self, sess, save_path, *args, **kwargs):  # pylint: disable=arguments-differ
        if not horovod.is_root():
            return None
        return super().save(sess, save_path, *args, **kwargs)
