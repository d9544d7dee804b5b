"""TFRA's Keras parameter-server demo (movielens-1m-keras-ps), train then save: as the chief of
a LocalCluster(ps=2, worker=1, chief=1) with TF_CONFIG set, tf_keras `model.fit` under
ParameterServerStrategy (a subclassed model, `@tf.function call`, SquashedEmbedding layers on the
PS tasks, a wrapped legacy Adam), then `model.save(dir)` from the coordinator, as the demo does.
Prints one JSON line last: the tables' rows and the dense weights, read from the PS tasks, for a
process without the cluster to check what it loads from `dir` against.

Usage: psst_keras_save.py SAVE_DIR
"""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.keras.optimizers.legacy import Adam  # noqa: E402

from tensorflow_recommenders_addons import dynamic_embedding as de  # noqa: E402

USERS, MOVIES, ROWS, BATCH, DIM = 50, 30, 640, 64, 8


class DualChannelsModel(tf.keras.Model):
    def __init__(self, devices=None):
        super().__init__()
        init = tf.keras.initializers.RandomNormal(0.0, 0.5)
        self.user_embedding = de.keras.layers.SquashedEmbedding(
            DIM, initializer=init, devices=devices, name="user_embedding")
        self.movie_embedding = de.keras.layers.SquashedEmbedding(
            DIM, initializer=init, devices=devices, name="movie_embedding")
        self.dnn = tf.keras.layers.Dense(5, activation="softmax")

    @tf.function
    def call(self, features):
        user = self.user_embedding(tf.reshape(features["user_id"], (-1, 1)))
        movie = self.movie_embedding(tf.reshape(features["movie_id"], (-1, 1)))
        return self.dnn(tf.concat([user, movie], axis=1))


def table(variable):
    keys, values = variable.export()
    order = np.argsort(keys.numpy())
    return {"keys": keys.numpy()[order].tolist(), "values": values.numpy()[order].tolist()}


def main(save_dir):
    config = json.loads(os.environ["TF_CONFIG"])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(config["cluster"]), task_type="chief", task_id=0)
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    ps_devices = [f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(2)]
    rows = np.arange(ROWS)
    features = {"user_id": rows % USERS, "movie_id": (rows * 7) % MOVIES}
    labels = tf.one_hot(rows % 5, 5)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(BATCH)
    dataset = strategy.experimental_distribute_dataset(dataset)
    with strategy.scope():
        model = DualChannelsModel(ps_devices)
        optimizer = de.DynamicEmbeddingOptimizer(Adam(1e-2))
    model.compile(optimizer=optimizer, loss=tf.keras.losses.MeanSquaredError())
    model.fit(dataset, epochs=2, steps_per_epoch=ROWS // BATCH, verbose=2)
    model.save(save_dir, options=tf.saved_model.SaveOptions(namespace_whitelist=["TFRA"]))
    result = {"user": table(model.user_embedding.params),
              "movie": table(model.movie_embedding.params),
              "dense": [w.tolist() for w in model.dnn.get_weights()]}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()
    os._exit(0)  # pylint: disable=protected-access  (coordinator threads may still wait on workers)
