"""Online learning on remote tables: a capacity bound (LRU on the native backend, LFU on the
built-in one) and count admission, trained by Adagrad, checkpointed mid-way and restored into
fresh objects that train on. Prints the tables, their sizes after every step and, in remote
mode, where every table of the state lives. Usage: MODE SPEC OUTDIR."""

import os

import numpy as np

from remote_common import DIM, arr, done, placement, setup, table

tf, de, mode, spec, devices, rest = setup()
import keras  # noqa: E402

out_dir = rest[0]
BOUND = 24
# 12 batches over 80 ids with repeats: keys come and go, some return after eviction.
BATCHES = [np.random.default_rng(100 + i).zipf(1.3, size=20) % 80 for i in range(12)]
SAVE_AFTER = 8
BACKENDS = {"native": de.NativeKVCreator, "builtin": de.BuiltinKVCreator}
ORDERS = {"native": "lru", "builtin": "lfu"}


class Model(tf.Module):
    def __init__(self):
        super().__init__()
        self.emb = {b: de.Variable(dim=DIM, devices=devices, name=f"emb_{b}",
                                   initializer=tf.random_normal_initializer(0.0, 0.3, seed=3),
                                   kv_creator=creator(),
                                   eviction=de.Eviction(max_size=BOUND, order=ORDERS[b]),
                                   admission=de.CountAdmission(2))
                    for b, creator in BACKENDS.items()}
        self.opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.1))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def step(self, ids):
        wrappers, loss = [], 0.0
        with tf.GradientTape() as tape:
            for b in BACKENDS:
                rows, wrapper = de.embedding_lookup(self.emb[b], ids, name=f"lookup_{b}",
                                                    return_trainable=True)
                loss += tf.reduce_sum((rows - tf.cast(ids % 3, tf.float32)[:, None]) ** 2)
                wrappers.append(wrapper)
        self.opt.apply_gradients(zip(tape.gradient(loss, wrappers), wrappers))

    def state(self):
        out = {}
        for b, var in self.emb.items():
            out[b] = {"emb": table(var),
                      "slots": [table(v) for v in self.opt.get_slot_variables(var)]}
        return out

    def sizes(self):
        return [int(self.emb[b].size()) for b in BACKENDS]


def train(model, batches):
    sizes = []
    for ids in batches:
        model.step(tf.constant(ids, tf.int64))
        sizes.append(model.sizes())
    return sizes


first = Model()
seen = {}
for ids in BATCHES:
    for k in set(ids.tolist()):
        seen[k] = seen.get(k, 0) + 1
# Keys that reach their second batch (CountAdmission(2)): more than the bound holds at once.
result = {"mode": mode, "admitted_ever": sum(1 for n in seen.values() if n >= 2),
          "sizes": train(first, BATCHES[:SAVE_AFTER])}
path = tf.train.Checkpoint(model=first).save(os.path.join(out_dir, "ckpt", "model"))
result["sizes"] += train(first, BATCHES[SAVE_AFTER:])
result["state"] = first.state()

second = Model()
tf.train.Checkpoint(model=second).restore(path)
result["restored_sizes"] = train(second, BATCHES[SAVE_AFTER:])
result["restored_state"] = second.state()
if mode == "remote":
    # Every table and variable of the model, and of the eviction and admission state.
    result["devices"] = sorted({v.device for v in first.variables if v.device} |
                               {t.resource_handle.device for var in first.emb.values()
                                for t in var.tables})
    result["placement"] = {b: placement(var) for b, var in first.emb.items()}
done(result)
