"""TFRA's `de.keras.callbacks`: `ModelCheckpoint` (= `DEHvdModelCheckpoint`) and
`DEHvdBroadcastGlobalVariablesCallback`.

Keras' own checkpoints already hold the tables of `de.keras.layers` (`.keras`, `.weights.h5`,
SavedModel, TF checkpoints), so `ModelCheckpoint` is Keras' `ModelCheckpoint` with one change
for processes Horovod launched: only rank 0 writes (every rank holds the same model). Each is a
callback of one Keras, chosen as for the layers (`binding`): `keras=` ("keras" / "tf_keras"),
else the Keras `tf.keras` is.

Example (its use in training: docs/tfra_compatibility.md):
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> ckpt = de.keras.callbacks.ModelCheckpoint("ckpt/model.weights.h5", save_weights_only=True)
    >>> isinstance(ckpt, tf.keras.callbacks.ModelCheckpoint)
    True
"""

import tensorflow as tf

from tfra_dynamic_embedding import trainable
from tfra_dynamic_embedding.compat import horovod
from tfra_dynamic_embedding.keras import binding

__all__ = ["ModelCheckpoint", "DEHvdModelCheckpoint", "DEHvdBroadcastGlobalVariablesCallback"]


def _bound_instance(cls, base, args, kwargs):
    return object.__new__(binding.class_for(cls, args, kwargs, base, "callbacks")[0])


class DEHvdModelCheckpoint:
    """Keras' `ModelCheckpoint` (same arguments, plus `keras=`); under Horovod only rank 0
    saves. The saved model or weights hold the dynamic-embedding tables with their rows.

    Example (in training and under Horovod: docs/tfra_compatibility.md):
        >>> import tf_keras
        >>> cb = DEHvdModelCheckpoint("ckpt/{epoch}", keras="tf_keras")
        >>> isinstance(cb, tf_keras.callbacks.ModelCheckpoint)
        True
    """

    def __new__(cls, *args, **kwargs):
        return _bound_instance(cls, "ModelCheckpoint", args, kwargs)

    def __init__(self, *args, keras=None, **kwargs):
        del keras   # chose the class in __new__
        super().__init__(*args, **kwargs)

    def _save_model(self, *args, **kwargs):
        if horovod.is_root():
            super()._save_model(*args, **kwargs)


ModelCheckpoint = DEHvdModelCheckpoint


class DEHvdBroadcastGlobalVariablesCallback:
    """Copies rank `root_rank`'s dense weights (the model's and its optimizer's) to every
    Horovod rank after the first training batch, as Horovod's own callback, leaving out the
    dynamic-embedding rows (`de.TrainableWrapper`, `de.DEResourceVariable`: a lookup's
    per-batch cache, not weights) and `local_variables`. Needs Horovod (a ValueError without it).

    Usage under Horovod: docs/tfra_compatibility.md. Without it:
        >>> DEHvdBroadcastGlobalVariablesCallback(0)
        Traceback (most recent call last):
        ...
        ValueError: ...Horovod...
    """

    def __new__(cls, *args, **kwargs):
        return _bound_instance(cls, "Callback", args, kwargs)

    def __init__(self, root_rank=0, device="", local_variables=None, keras=None):
        del keras   # chose the class in __new__
        self._hvd = horovod.require("DEHvdBroadcastGlobalVariablesCallback")
        super().__init__()
        if local_variables is None:
            local_variables = []
        elif _is_variable(local_variables):
            local_variables = [local_variables]
        not_variables = [v for v in local_variables if not _is_variable(v)]
        if not_variables:
            raise ValueError(f"local_variables must be variables (tf.Variable or Keras "
                             f"Variable); got {not_variables!r}")
        self.root_rank = root_rank
        self.device = device
        self._local = list(local_variables)
        self.broadcast_done = False

    def register_local_var(self, var):
        """Keeps `var` out of the broadcast (each rank keeps its own value)."""
        if not _is_variable(var):
            raise ValueError(f"var must be a tf.Variable or Keras Variable; got {var!r}")
        self._local.append(var)

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        optimizer_variables = self.model.optimizer.variables
        if callable(optimizer_variables):   # tf_keras: a method; Keras 3: a property
            optimizer_variables = optimizer_variables()
        with tf.device(self.device):
            self._hvd.broadcast_variables(self._dense(self.model.variables),
                                          root_rank=self.root_rank)
            self._hvd.broadcast_variables(self._dense(optimizer_variables),
                                          root_rank=self.root_rank)
        self.broadcast_done = True

    def on_train_batch_end(self, batch, logs=None):
        self.on_batch_end(batch, logs)

    def _dense(self, variables):
        return [v for v in variables
                if not any(v is local for local in self._local)
                and not isinstance(v, (trainable.TrainableWrapper, trainable.DEResourceVariable))]


def _is_variable(value):
    # Keras 3 variables are not tf.Variables; both can be assigned.
    return isinstance(value, tf.Variable) or (
        binding.package_of(value) is not None and hasattr(value, "assign"))
