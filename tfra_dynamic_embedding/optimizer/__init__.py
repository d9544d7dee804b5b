"""`DynamicEmbeddingOptimizer(opt)`: lets any TensorFlow optimizer train `de.Variable`s.

The optimizer keeps its class, hyper-parameters and update math; `DynamicEmbeddingOptimizer`
re-classes it to a subclass (base.py: `wrap`, with its family's hooks from families.py) that,
for each `TrainableWrapper` among the variables:

1. creates the optimizer's slots for it as `de.Variable`s (same dim, devices, partitioner and
   backend as the embedding, named `<embedding>/<optimizer>/<slot>`; on the native backend kept
   in the embedding's own records);
2. where the optimizer has a fused rule (SGD, Momentum, Adagrad, Adam/AdamW, Ftrl, RMSProp:
   table_updates.py), applies the update where the tables live: the batch's ids and summed
   gradients go to one op per device, the slots never travel;
3. otherwise loads the slot rows of the batch's ids into per-lookup buffers (new ids start at
   the slot's initial value), runs the optimizer's own update on the wrapper and buffers like on
   any dense variable, and writes the rows and slots back. Only an update creates rows.

Updates are lazy: rows and slot rows of ids not in the batch are untouched, so optimizers whose
sparse update is row-local (SGD, Momentum, Adagrad, RMSProp, Ftrl, ...) match a dense embedding
exactly, and Adam-like optimizers match their lazy variant (bias correction uses the optimizer's
global step). Repeated ids in a batch have their gradients summed, as the dense path does.

Supported families: `tf.compat.v1.train` optimizers (graph and eager), Keras 3 optimizers (the
default `tf.keras`) and tf_keras optimizers, legacy and new.

Example:
    >>> import tensorflow as tf
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> w = de.Variable(dim=2, initializer=1.0)
    >>> ids = tf.constant([1, 2], tf.int64)
    >>> opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.25))
    >>> with tf.GradientTape() as tape:
    ...     emb, wrapper = de.embedding_lookup(w, ids, return_trainable=True)
    ...     loss = tf.reduce_sum(emb ** 2)
    >>> _ = opt.apply_gradients(zip(tape.gradient(loss, [wrapper]), [wrapper]))
    >>> de.embedding_lookup(w, ids).numpy()      # 1 - 0.25 * 2
    array([[0.5, 0.5],
           [0.5, 0.5]], dtype=float32)
"""

import importlib
import sys

from tfra_dynamic_embedding.optimizer import base
from tfra_dynamic_embedding.optimizer import families


# pylint: disable-next=invalid-name  (TFRA's public name)
def DynamicEmbeddingOptimizer(self, bp_v2=None, synchronous=False, apply_in_tables=True):
    """Returns `self`, re-classed so that it also trains `de.Variable`s (see module docstring).

    bp_v2: None (each variable's own `bp_v2`), or True / False for every variable it trains:
      True adds each step's row updates to the tables instead of overwriting the rows.
    synchronous: TFRA's synchronous Horovod training: every step sums the dense (non-embedding)
      gradients over the Horovod ranks (`hvd.allreduce`) before applying them; embedding rows
      are each rank's own. With one rank nothing is summed; without Horovod the step raises.
    apply_in_tables: apply the update where the tables live, sending only ids and gradients
      (table_updates.py), for the optimizers and variables that path serves; False keeps every
      update on the trainer (read rows and slots, update, write back).
    """
    if bp_v2 is not None and not isinstance(bp_v2, bool):
        raise ValueError(f"bp_v2 must be None or a bool; got {bp_v2!r}")
    if not isinstance(synchronous, bool):
        raise ValueError(f"synchronous must be a bool; got {synchronous!r}")
    if not isinstance(apply_in_tables, bool):
        raise ValueError(f"apply_in_tables must be a bool; got {apply_in_tables!r}")
    mixin = None if isinstance(self, base.DynamicEmbeddingMixin) else families.mixin_for(self)
    return base.wrap(self, mixin, bp_v2, synchronous, apply_in_tables)


def register_keras_optimizers():
    """Registers the wrapped class of every optimizer of each installed Keras (Keras 3, tf_keras
    and its legacy ones) now, so that a process that loads a saved model before wrapping any
    optimizer (`tf.keras.models.load_model` of a compiled model) finds them."""
    kinds = [("keras", "keras.optimizers", families.Keras3Mixin),
             ("tf_keras", "tf_keras.optimizers", families.NewTfKerasMixin),
             ("tf_keras", "tf_keras.optimizers.legacy", families.LegacyKerasMixin)]
    for package, module_name, mixin in kinds:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if package == "keras" and not getattr(sys.modules["keras"], "__version__",
                                                "").startswith("3."):
            continue
        root = module.Optimizer
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, root) and value is not root
                    and value.__module__.split(".")[0] == package
                    and "LossScale" not in value.__name__):
                base.wrapped_class(mixin, value)
