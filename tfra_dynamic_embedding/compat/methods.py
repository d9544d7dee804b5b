"""TFRA's method forms on core classes: `de.Variable.embedding_lookup(ids, ...)`, the method
form of `de.embedding_lookup(var, ids, ...)`.

The lookups (embedding_ops.py) build on `de.Variable`, so variable.py cannot call them without
an import circle; TFRA's API has the method, so `install()` (run by `compat.install()`, the alias
package's import) gives the class this one.

Example:
    >>> import tensorflow as tf
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> var = de.Variable(dim=2)
    >>> rows, wrapper = var.embedding_lookup(tf.constant([1], tf.int64), name="emb",
    ...                                      return_trainable=True)
    >>> rows.shape
    TensorShape([1, 2])
"""

from tfra_dynamic_embedding import embedding_ops
from tfra_dynamic_embedding import variable as variable_lib


def embedding_lookup(self, ids, name=None, max_norm=None, return_trainable=False):
    """TFRA's method form of `de.embedding_lookup(self, ids, ...)`: trainable rows.

    Example:
        >>> import tensorflow as tf
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> var = de.Variable(dim=3)
        >>> emb, wrapper = var.embedding_lookup(tf.constant([1, 2], tf.int64), name="emb",
        ...                                     return_trainable=True)
        >>> emb.shape, wrapper.batch_ids().numpy()
        (TensorShape([2, 3]), array([1, 2]))
    """
    return embedding_ops.embedding_lookup(self, ids, name=name, max_norm=max_norm,
                                          return_trainable=return_trainable)


def install():
    """Gives `de.Variable` TFRA's method forms (once)."""
    variable_lib.Variable.embedding_lookup = embedding_lookup
