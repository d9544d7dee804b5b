"""Training steps with three optimizer families (Keras 3 Adam, tf_keras legacy Adam,
tf.compat.v1 Adam), each wrapped by de.DynamicEmbeddingOptimizer, then a checkpoint; or, with
`--restore PATH`, the same objects restored from PATH (no step). Prints every table (rows and
slots, sorted by key), dense weights and step counters; in remote mode also where each shard
lives. Needs TF_USE_LEGACY_KERAS=1 (tf_keras). Usage: MODE SPEC OUTDIR [--restore PATH]."""

import os

import numpy as np

from remote_common import DIM, arr, done, placement, setup, table

assert os.environ.get("TF_USE_LEGACY_KERAS") == "1", "run with TF_USE_LEGACY_KERAS=1"
tf, de, mode, spec, devices, rest = setup()
import keras  # noqa: E402  (Keras 3, next to tf_keras)
import tf_keras  # noqa: E402

out_dir = rest[0]
restore = rest[2] if len(rest) > 2 and rest[1] == "--restore" else None
OPTIMIZERS = {
    "k3": lambda: keras.optimizers.Adam(0.05),
    "tfk": lambda: tf_keras.optimizers.legacy.Adam(0.05),
    "v1": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
}
BATCHES = [np.random.default_rng(i).integers(0, 40, size=16) for i in range(4)]


class Model(tf.Module):
    def __init__(self, family, seed):
        super().__init__()
        # Keras 3's tables go to files (de.FileSystemSaver, written by the PSs); the others into
        # the checkpoint.
        creator = (de.CuckooHashTableCreator(saver=de.FileSystemSaver()) if family == "k3"
                   else None)
        self.emb = de.Variable(dim=DIM, devices=devices, name=f"emb_{family}",
                               initializer=tf.random_normal_initializer(0.0, 0.3, seed=seed),
                               kv_creator=creator)
        self.w = tf.Variable(tf.linspace(0.5, 1.5, DIM)[:, None])
        self.opt = de.DynamicEmbeddingOptimizer(OPTIMIZERS[family]())

    def step(self, ids):
        ids = tf.constant(ids, tf.int64)
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(self.emb, ids, return_trainable=True)
            loss = tf.reduce_mean((rows @ self.w - tf.cast(ids % 3, tf.float32)[:, None]) ** 2)
        grads = tape.gradient(loss, [wrapper, self.w])
        self.opt.apply_gradients(zip(grads, [wrapper, self.w]))

    def make_slots(self):
        """Creates the optimizer's slot tables (restored on creation) without changing a row:
        a step over no ids (the step counters advance; tables are what is compared)."""
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(self.emb, tf.zeros([0], tf.int64),
                                                return_trainable=True)
            loss = tf.reduce_sum(rows)
        self.opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])

    def state(self):
        slots = {v.name.split("/")[-1]: table(v) for v in self.opt.get_slot_variables(self.emb)}
        if hasattr(self.opt, "iterations"):
            counters = [float(self.opt.iterations.numpy())]
        else:
            counters = sorted(float(v.numpy()) for v in self.opt._non_slot_variables())  # pylint: disable=protected-access
        return {"emb": table(self.emb), "slots": slots, "w": arr(self.w), "counters": counters}

    def placement(self):
        return {"emb": placement(self.emb),
                "slots": {v.name.split("/")[-1]: placement(v)
                          for v in self.opt.get_slot_variables(self.emb)}}


models = {family: Model(family, seed) for seed, family in enumerate(OPTIMIZERS, start=11)}
ckpt = tf.train.Checkpoint(**models)
result = {"mode": mode}
if restore is None:
    for ids in BATCHES:
        for model in models.values():
            model.step(ids)
    path = ckpt.save(os.path.join(out_dir, "ckpt", "model"))
    result["path"] = path
    result["data_files"] = sorted(f for f in os.listdir(os.path.dirname(path))
                                  if f.startswith(os.path.basename(path) + ".data"))
    tensors = models["tfk"].emb._serialize_to_tensors()  # pylint: disable=protected-access
    result["saved_tensor_devices"] = sorted({t.device for t in tensors.values()})
else:
    status = ckpt.restore(restore)
    for model in models.values():
        model.make_slots()
    status.assert_existing_objects_matched()
    result["restored"] = restore
result["state"] = {family: model.state() for family, model in models.items()}
if mode == "remote":
    result["placement"] = {family: model.placement() for family, model in models.items()}
done(result)
