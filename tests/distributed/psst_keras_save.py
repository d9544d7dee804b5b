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

from psst_keras_fit import BATCH, ROWS, compiled_model  # noqa: E402  (this script's folder)


def table(variable):
    keys, values = variable.export()
    order = np.argsort(keys.numpy())
    return {"keys": keys.numpy()[order].tolist(), "values": values.numpy()[order].tolist()}


def main(save_dir):
    _, model, _, dataset = compiled_model()
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
