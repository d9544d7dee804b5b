"""Writes the checkpoints of tests/data/tfra_checkpoints/ with TFRA itself (not this package).

Run it in an environment where `tensorflow_recommenders_addons` is TFRA (0.8.1: `tensorflow==2.16.2`,
`tf-keras==2.16.*`; its CUDA build also needs `nvidia-cuda-runtime-cu12` preloaded):

    python tools/write_tfra_checkpoints.py tests/data/tfra_checkpoints

Each format gets a folder and `<format>.json` with the rows (and optimizer slot rows) TFRA saved:
- tf1:   a tf.compat.v1 graph, `de.get_variable` on 2 shards, one v1 Adam step, `Saver().save`;
- tf2:   `tf.train.Checkpoint(emb=w).save` of a 2-shard `de.get_variable`, eagerly;
- keras: a tf_keras model with `de.keras.layers.Embedding` on 2 shards, one `fit` step of Adam
         through `de.DynamicEmbeddingOptimizer`, `model.save_weights`;
- shadow: `tf.train.Checkpoint(emb=w, optimizer=opt).save` after one step of a
          `de.shadow_ops.ShadowVariable` trained by tf_keras Adam (TF2, eagerly);
- files: `save_to_file_system` of a 2-shard `de.get_variable` (TFRA's raw `-keys`/`-values` files);
- savedmodel: `tf.saved_model.save` of a tf.Module serving lookups of an int64-keyed and a
              string-keyed 2-shard `de.get_variable` (TFRA's ops in its graphs);
- tf1_meta: the same graph saved with its meta graph (written with tf1); its json also holds
            every row after a second step (`after_step`), run in TFRA's graph;
- keras_savedmodel: a tf_keras model with `de.keras.layers.Embedding` on 2 shards (and TFRA's
                    FrequencyRestrictPolicy: int32 status tables) and a Dense layer, one `fit`
                    step, `model.save(save_format="tf")`.
"""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_recommenders_addons.dynamic_embedding as de  # noqa: E402

KEYS = np.arange(1, 21, dtype=np.int64)
VALUES = np.arange(20 * 4, dtype=np.float32).reshape(20, 4) / 10.0
BATCH = KEYS[:10]   # the ids the optimizer step trains


def _dump(path, keys, values, names, slots=None):
    with open(path, "w") as f:
        json.dump({"keys": np.asarray(keys).tolist(), "values": np.asarray(values).tolist(),
                   "slots": slots or {}, "tensor_names": names}, f, indent=0)


def _tf1_graph():
    """(variable, its upsert of the rows, one v1 Adam step, the optimizer) in a TF1 graph."""
    tf.compat.v1.disable_eager_execution()
    w = de.get_variable("user", dim=4, devices=["/CPU:0", "/CPU:0"], initializer=0.0)
    upsert = w.upsert(tf.constant(KEYS), tf.constant(VALUES))
    emb = de.embedding_lookup(w, tf.constant(BATCH), name="lookup")
    tf.identity(w.lookup(tf.constant(KEYS)), name="all_rows")
    opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
    train = opt.minimize(tf.reduce_sum(emb * emb),
                         global_step=tf.compat.v1.train.get_or_create_global_step())
    return w, upsert, train, opt


def write_tf1(out):
    """tf1 (no meta graph) and tf1_meta (with it, and every row after a second step)."""
    os.makedirs(os.path.join(out, "tf1"), exist_ok=True)
    os.makedirs(os.path.join(out, "tf1_meta"), exist_ok=True)
    w, upsert, train, opt = _tf1_graph()
    tf.compat.v1.add_to_collection("train_op", train)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(upsert)
        sess.run(train)
        keys, values = sess.run(w.export())
        slots = {s.name: [a.tolist() for a in sess.run(s.export())]
                 for s in w.get_slot_variables(opt)}
        prefix = saver.save(sess, os.path.join(out, "tf1", "model"), write_meta_graph=False)
        saver.save(sess, os.path.join(out, "tf1_meta", "model"))
        sess.run(train)
        after = sess.run("all_rows:0")
    _dump(os.path.join(out, "tf1.json"), keys, values,
          [n for n, _ in tf.train.list_variables(prefix)], slots)
    _dump(os.path.join(out, "tf1_meta.json"), keys, values, [], {"after_step": after.tolist()})


def write_tf2(out):
    w = de.get_variable("user", dim=4, devices=["/CPU:0", "/CPU:0"], initializer=0.0)
    w.upsert(tf.constant(KEYS), tf.constant(VALUES))
    prefix = tf.train.Checkpoint(emb=w).save(os.path.join(out, "tf2", "ckpt"))
    keys, values = w.export()
    _dump(os.path.join(out, "tf2.json"), keys, values,
          [n for n, _ in tf.train.list_variables(prefix)])


def write_keras(out):
    import tf_keras as keras
    ids = keras.layers.Input(shape=(1,), dtype=tf.int64)
    layer = de.keras.layers.Embedding(4, devices=["/CPU:0", "/CPU:0"], name="emb",
                                      initializer=0.0)
    model = keras.Model(ids, layer(ids))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1)),
                  loss="mse")
    layer.params.upsert(tf.constant(KEYS), tf.constant(VALUES))
    model.fit(BATCH.reshape(-1, 1), np.ones([10, 1, 4], np.float32), batch_size=10, verbose=0)
    prefix = os.path.join(out, "keras", "weights")
    model.save_weights(prefix)
    keys, values = layer.params.export()
    slots = {s.name: [a.numpy().tolist() for a in s.export()]
             for s in layer.params.get_slot_variables(model.optimizer)}
    _dump(os.path.join(out, "keras.json"), keys, values,
          [n for n, _ in tf.train.list_variables(prefix)], slots)


def write_shadow(out):
    import tf_keras as keras
    w = de.get_variable("user", dim=4, devices=["/CPU:0", "/CPU:0"], initializer=0.0)
    w.upsert(tf.constant(KEYS), tf.constant(VALUES))
    shadow = de.shadow_ops.ShadowVariable(w, name="user_shadow")
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))

    def loss():
        rows = de.shadow_ops.embedding_lookup(shadow, tf.constant(BATCH))
        return tf.reduce_sum(rows * rows)

    opt.minimize(loss, var_list=[shadow])
    prefix = tf.train.Checkpoint(emb=w, optimizer=opt).save(os.path.join(out, "shadow", "ckpt"))
    keys, values = w.export()
    slots = {s.name: [a.numpy().tolist() for a in s.export()] for s in w.get_slot_variables(opt)}
    _dump(os.path.join(out, "shadow.json"), keys, values,
          [n for n, _ in tf.train.list_variables(prefix)], slots)


def write_files(out):
    w = de.get_variable("user", dim=4, devices=["/CPU:0", "/CPU:0"], initializer=0.0)
    w.upsert(tf.constant(KEYS), tf.constant(VALUES))
    w.save_to_file_system(os.path.join(out, "files"), proc_size=1, proc_rank=0)
    keys, values = w.export()
    _dump(os.path.join(out, "files.json"), keys, values,
          sorted(os.listdir(os.path.join(out, "files"))))


NAMES = np.array([b"a", b"b", b"c", b"d", b"e"])


def write_savedmodel(out):
    class Lookups(tf.Module):
        def __init__(self):
            super().__init__()
            self.user = de.get_variable("user", dim=4, devices=["/CPU:0", "/CPU:0"],
                                        initializer=-1.0)
            self.item = de.get_variable("item", key_dtype=tf.string, dim=2,
                                        devices=["/CPU:0", "/CPU:0"], initializer=-2.0)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64),
                                      tf.TensorSpec([None], tf.string)])
        def serve(self, ids, names):
            return {"user": self.user.lookup(ids), "item": self.item.lookup(names)}

    m = Lookups()
    m.user.upsert(tf.constant(KEYS), tf.constant(VALUES))
    m.item.upsert(tf.constant(NAMES), tf.constant(VALUES[:5, :2] + 100.0))
    tf.saved_model.save(m, os.path.join(out, "savedmodel"),
                        signatures={"serving_default": m.serve})
    item_keys, item_values = m.item.export()
    keys, values = m.user.export()
    _dump(os.path.join(out, "savedmodel.json"), keys, values, [],
          {"item": [[k.decode() for k in item_keys.numpy()], item_values.numpy().tolist()]})


def write_keras_savedmodel(out):
    import tf_keras as keras
    ids = keras.Input(shape=(1,), dtype=tf.int64, name="ids")
    rows = de.keras.layers.Embedding(4, devices=["/CPU:0", "/CPU:0"], name="emb",
                                     initializer=0.5,
                                     restrict_policy=de.FrequencyRestrictPolicy)(ids)
    score = keras.layers.Dense(1, kernel_initializer="ones")(keras.layers.Flatten()(rows))
    model = keras.Model(ids, score)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
    model.fit(BATCH.reshape(-1, 1), np.zeros([10, 1], np.float32), batch_size=10, verbose=0)
    model.save(os.path.join(out, "keras_savedmodel"), save_format="tf")
    keys, values = model.get_layer("emb").params.export()
    predict = model.predict(KEYS.reshape(-1, 1), verbose=0)
    _dump(os.path.join(out, "keras_savedmodel.json"), keys, values, [],
          {"predict": predict.tolist()})


if __name__ == "__main__":
    out_dir, fmt = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
    if fmt is None:   # each format in a process of its own (tf1 turns eager execution off)
        import subprocess
        for name in ("tf1", "tf2", "keras", "shadow", "files", "savedmodel", "keras_savedmodel"):
            subprocess.run([sys.executable, __file__, out_dir, name], check=True)
    else:
        {"tf1": write_tf1, "tf2": write_tf2, "keras": write_keras, "shadow": write_shadow,
         "files": write_files, "savedmodel": write_savedmodel,
         "keras_savedmodel": write_keras_savedmodel}[fmt](out_dir)
