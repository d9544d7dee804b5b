"""Coordinator of TFRA's own Keras parameter-server demo pattern (movielens-1m-keras-ps), run
as the chief of a LocalCluster(ps=2, worker=1, chief=1) with TF_CONFIG set:

tf_keras (TF_USE_LEGACY_KERAS=1), a subclassed model whose `call` is a `@tf.function` holding
two `de.keras.layers.SquashedEmbedding`s on the PS tasks, a legacy Adam wrapped by
`de.DynamicEmbeddingOptimizer`, all made under `tf.distribute.experimental.
ParameterServerStrategy(...).scope()`, trained by `model.fit` on a distributed dataset (which
schedules its steps on the workers itself). Then a custom scheduled step whose lookups run in a
nested `@tf.function` (Keras-free SGD) must reach every id. Prints one JSON line last.
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

USERS, MOVIES, ROWS, BATCH = 50, 30, 640, 64


class DualChannelsModel(tf.keras.Model):
    def __init__(self, devices):
        super().__init__()
        init = tf.keras.initializers.RandomNormal(0.0, 0.5)
        self.user_embedding = de.keras.layers.SquashedEmbedding(
            8, initializer=init, devices=devices, name="user_embedding")
        self.movie_embedding = de.keras.layers.SquashedEmbedding(
            8, initializer=init, devices=devices, name="movie_embedding")
        self.dnn = tf.keras.layers.Dense(5, activation="softmax")

    @tf.function
    def call(self, features):
        user = self.user_embedding(tf.reshape(features["user_id"], (-1, 1)))
        movie = self.movie_embedding(tf.reshape(features["movie_id"], (-1, 1)))
        return self.dnn(tf.concat([user, movie], axis=1))


def export(variable):
    keys, _ = variable.export()
    return sorted(keys.numpy().tolist())


def compiled_model():
    """(strategy, model, optimizer, distributed dataset) as the demo makes them, on this task's
    cluster (TF_CONFIG)."""
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
    return strategy, model, optimizer, dataset


def main():
    strategy, model, optimizer, dataset = compiled_model()
    history = model.fit(dataset, epochs=3, steps_per_epoch=ROWS // BATCH, verbose=2)
    result = {"losses": history.history["loss"]}
    for layer in (model.user_embedding, model.movie_embedding):
        result[layer.name] = {
            "devices": layer.params.devices,
            "sizes": [int(layer.params.size(i)) for i in range(2)],
            "keys": export(layer.params),
            "slots": {slot.name.split("/")[-1]: export(slot)
                      for slot in optimizer.get_slot_variables(layer.params)},
        }
    result["dense_devices"] = sorted({v.device for v in model.dnn.weights})

    # A custom step: lookups in a nested tf.function, gradients taken outside it.
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        table = de.get_variable("nested", dim=2, initializer=1.0)
        sgd = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1.0))

    @tf.function
    def lookup(ids):
        return de.embedding_lookup(table, ids, name="nested_lookup")

    @tf.function
    def step(ids):
        def replica_fn(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(lookup(ids))
            wrapper = table.get_trainable_by_name("nested_lookup")
            sgd.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
            return loss
        return strategy.run(replica_fn, args=(ids,))

    coordinator.schedule(step, args=(tf.constant([1, 2, 3], tf.int64),))
    coordinator.join()
    keys, values = table.export()
    order = np.argsort(keys.numpy())
    result["nested"] = {"keys": keys.numpy()[order].tolist(),
                        "values": values.numpy()[order].tolist()}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # pylint: disable=protected-access  (coordinator threads may still wait on workers)
