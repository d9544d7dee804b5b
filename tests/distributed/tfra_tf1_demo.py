"""TFRA's own TF1 parameter-server demo (demo/dynamic_embedding/movielens-1m-ps), as written there:
a cluster of "ps" and "worker" jobs only (worker 0 is the chief), tf_keras `Dense` layers,
`tfra.dynamic_embedding.get_variable` over the PS devices, `tf.unique` + `embedding_lookup(...,
return_trainable=True)`, a v1 AdamOptimizer wrapped by DynamicEmbeddingOptimizer, everything under
`replica_device_setter`, trained by MonitoredTrainingSession until the input runs out.
Movielens is replaced by a fixed synthetic batch stream per worker.

    python tfra_tf1_demo.py SYNC_DIR        # TF_CONFIG names the task

Prints one JSON line last: steps run, and (worker 0, after worker 1 finished) table sizes and the
global step.
"""

import json
import os
import sys
import time

import numpy as np

ROWS, BATCH = 256, 32


def data(worker_id):
    """The worker's ratings: movies 0..39 and users 100..129, drawn per worker."""
    rng = np.random.default_rng(worker_id)
    return {"movie_id": rng.integers(0, 40, ROWS).astype(np.int64),
            "user_id": (rng.integers(0, 30, ROWS) + 100).astype(np.int64),
            "user_rating": rng.integers(1, 6, ROWS).astype(np.float32)}


def wait(path):
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.05)


def main(sync_dir):
    # TensorFlow only here: the test imports this module for `data` (and must not get tf_keras).
    # pylint: disable=import-outside-toplevel
    import tensorflow as tf
    from tensorflow.keras.layers import Dense

    import tensorflow_recommenders_addons as tfra

    tf.compat.v1.disable_eager_execution()
    config = json.loads(os.environ["TF_CONFIG"])
    worker_id = config["task"]["index"]
    ps_num = len(config["cluster"]["ps"])
    sess_config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                           inter_op_parallelism_threads=1)
    cluster = tf.train.ClusterSpec(config["cluster"])
    server = tf.distribute.Server(cluster, protocol="grpc", job_name="worker",
                                  task_index=worker_id, config=sess_config)
    devices = [f"/job:ps/replica:0/task:{i}" for i in range(ps_num)]
    with tf.compat.v1.device(f"/job:worker/replica:0/task:{worker_id}"):
        iterator = tf.compat.v1.data.make_initializable_iterator(
            tf.data.Dataset.from_tensor_slices(data(worker_id)).batch(BATCH))
        batch = iterator.get_next()
    setter = tf.compat.v1.train.replica_device_setter(
        ps_tasks=ps_num, worker_device=f"/job:worker/replica:0/task:{worker_id}",
        ps_device="/job:ps")
    with tf.compat.v1.device(setter):
        hidden, out = Dense(16, activation="relu"), Dense(1)
        init = tf.keras.initializers.RandomNormal(-1, 1)
        users = tfra.dynamic_embedding.get_variable(
            name="user_dynamic_embeddings", dim=8, devices=devices, initializer=init)
        movies = tfra.dynamic_embedding.get_variable(
            name="moive_dynamic_embeddings", dim=8, devices=devices, initializer=init)
        user_ids, user_idx = tf.unique(batch["user_id"])
        user_rows, _ = tfra.dynamic_embedding.embedding_lookup(
            params=users, ids=user_ids, name="user-id-weights", return_trainable=True)
        movie_ids, movie_idx = tf.unique(batch["movie_id"])
        movie_rows, _ = tfra.dynamic_embedding.embedding_lookup(
            params=movies, ids=movie_ids, name="movie-id-weights", return_trainable=True)
        embeddings = tf.concat([tf.gather(user_rows, user_idx),
                                tf.gather(movie_rows, movie_idx)], axis=1)
        predict = tf.reshape(out(hidden(embeddings)), [-1])
        loss = tf.keras.losses.MeanSquaredError()(batch["user_rating"], predict)
        optimizer = tfra.dynamic_embedding.DynamicEmbeddingOptimizer(
            tf.compat.v1.train.AdamOptimizer(learning_rate=0.001))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        update = optimizer.minimize(loss, global_step=global_step)
        report = [users.size(), movies.size(), global_step]
    is_chief = worker_id == 0
    if not is_chief:   # a non-chief session re-checks readiness only every 30 s: come later
        wait(os.path.join(sync_dir, "chief_ready"))
    result = {"worker": worker_id, "steps": 0}
    with tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=is_chief, config=sess_config,
            checkpoint_dir=os.path.join(sync_dir, "ckpt") if is_chief else None) as sess:
        if is_chief:
            open(os.path.join(sync_dir, "chief_ready"), "w").close()
        sess.run([iterator.initializer])
        while True:
            try:
                sess.run([update, loss])
                result["steps"] += 1
            except tf.errors.OutOfRangeError:
                break
        open(os.path.join(sync_dir, f"done{worker_id}"), "w").close()
        if is_chief:
            wait(os.path.join(sync_dir, "done1"))
            result.update(zip(("users", "movies", "global_step"),
                              map(int, sess.run(report))))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"   # as the demo's Keras 2 code expects
    main(sys.argv[1])
