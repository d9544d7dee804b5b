"""TFRA's Horovod-named utilities: `de.keras.callbacks`, `de.train.DEHvdSaver` /
`de.train.Checkpoint`, `de.keras.layers.HvdAllToAllEmbedding` (refused).

Horovod is not installed here: its behaviour is checked in child processes that import a
recording stand-in of `horovod.tensorflow` (rank and size from the environment).
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAKE_HOROVOD = '''
import json, os
_log = os.environ["FAKE_HVD_LOG"]
def is_initialized():
    return True
def rank():
    return int(os.environ["FAKE_HVD_RANK"])
def size():
    return 2
def broadcast_variables(variables, root_rank):
    with open(_log, "a") as f:
        f.write(json.dumps({"root_rank": root_rank, "names": [v.name for v in variables]}) + "\\n")
'''


def _model(seed=0):
    inputs = tf.keras.Input(shape=(2,), dtype=tf.int64)
    emb = de.keras.layers.Embedding(4, name="emb", initializer=tf.keras.initializers.RandomNormal(
        seed=seed))
    outputs = tf.keras.layers.Dense(1, name="out")(tf.keras.layers.Flatten()(emb(inputs)))
    model = tf.keras.Model(inputs, outputs)
    model.compile(de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)), "mse")
    return model, emb


def _data():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(256, 2))
    return ids, (ids[:, :1] % 2).astype(np.float32)


def _rows(layer, keys):
    return layer.params.lookup(tf.constant(keys, tf.int64)).numpy()


def test_model_checkpoint_saves_the_tables_each_epoch(tmp_path):
    model, emb = _model()
    ids, labels = _data()
    cb = de.keras.callbacks.ModelCheckpoint(str(tmp_path / "e{epoch}.weights.h5"),
                                            save_weights_only=True)
    assert de.keras.callbacks.ModelCheckpoint is de.keras.callbacks.DEHvdModelCheckpoint
    assert isinstance(cb, keras.callbacks.ModelCheckpoint)
    model.fit(ids, labels, batch_size=64, epochs=2, verbose=0, callbacks=[cb])
    assert sorted(os.listdir(tmp_path)) == ["e1.weights.h5", "e2.weights.h5"]

    fresh, fresh_emb = _model(seed=7)
    fresh.load_weights(str(tmp_path / "e2.weights.h5"))
    keys = np.unique(ids)
    np.testing.assert_array_equal(_rows(fresh_emb, keys), _rows(emb, keys))
    assert int(fresh_emb.params.size()) == len(keys)
    np.testing.assert_allclose(fresh.predict(ids[:8], verbose=0), model.predict(ids[:8], verbose=0),
                               rtol=1e-6)


def test_broadcast_callback_without_horovod_says_so():
    with pytest.raises(ValueError, match="Horovod is not installed"):
        de.keras.callbacks.DEHvdBroadcastGlobalVariablesCallback(root_rank=0)


def test_hvd_all_to_all_embedding_says_what_to_use():
    with pytest.raises(ValueError, match="Horovod is not installed"):
        de.keras.layers.HvdAllToAllEmbedding(embedding_size=4)


def test_train_checkpoint_names():
    assert de.train.Checkpoint is de.train.DECheckpoint
    assert issubclass(de.train.DEHvdSaver, tf.compat.v1.train.Saver)


def test_hvd_saver_outside_horovod_round_trips_a_variable(tmp_path):
    with tf.Graph().as_default():
        var = de.get_variable("hvd_saver_emb", dim=3, initializer=1.0)
        ids = tf.constant([4, 9], tf.int64)
        write = var.upsert(ids, tf.constant([[1.0, 2, 3], [4, 5, 6]]))
        saver = de.train.DEHvdSaver()
        with tf.compat.v1.Session() as sess:
            sess.run(write)
            path = saver.save(sess, str(tmp_path / "model"))
        assert path is not None
    with tf.Graph().as_default():
        var = de.get_variable("hvd_saver_emb", dim=3, initializer=0.0)
        rows = var.lookup(tf.constant([4, 9], tf.int64))
        with tf.compat.v1.Session() as sess:
            de.train.DEHvdSaver().restore(sess, path)
            np.testing.assert_array_equal(sess.run(rows), [[1, 2, 3], [4, 5, 6]])


def _run_as_horovod_rank(tmp_path, rank, keras_env, script):
    """Runs `script` in a child process that imported the stand-in Horovod as rank `rank` of 2."""
    fake = tmp_path / "fake" / "horovod"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("")
    (fake / "tensorflow.py").write_text(FAKE_HOROVOD)
    log = tmp_path / f"hvd_{rank}.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), ROOT]),
               FAKE_HVD_RANK=str(rank), FAKE_HVD_LOG=str(log), TF_CPP_MIN_LOG_LEVEL="3",
               **keras_env)
    prelude = f"import horovod.tensorflow as hvd\nOUT = {str(tmp_path / f'out_{rank}')!r}\n"
    result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script)],
                            capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


HOROVOD_SCRIPT = """
import os
import numpy as np
import tensorflow as tf
import tensorflow_recommenders_addons.dynamic_embedding as de

inputs = tf.keras.Input(shape=(2,), dtype=tf.int64)
emb = de.keras.layers.Embedding(4, name="emb")
dense = tf.keras.layers.Dense(1, name="out")
model = tf.keras.Model(inputs, dense(tf.keras.layers.Flatten()(emb(inputs))))
model.compile(de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)), "mse")
ids = np.arange(64).reshape(32, 2)
os.makedirs(OUT)
# tf_keras writes weights to .h5 in the legacy format, which cannot hold tables.
ckpt = de.keras.callbacks.ModelCheckpoint(os.path.join(OUT, os.environ["CKPT_NAME"]),
                                          save_weights_only=True)
bcast = de.keras.callbacks.DEHvdBroadcastGlobalVariablesCallback(
    root_rank=0, local_variables=[dense.bias])
model.fit(ids, np.ones((32, 1)), batch_size=8, epochs=1, verbose=0, callbacks=[ckpt, bcast])
assert bcast.broadcast_done

with tf.Graph().as_default():
    var = de.get_variable("v1_emb", dim=2)
    lookup = var.lookup(tf.constant([1, 2], tf.int64))
    with tf.compat.v1.Session() as sess:
        sess.run(lookup)
        saved = de.train.DEHvdSaver().save(sess, os.path.join(OUT, "v1", "model"))
try:
    de.keras.layers.HvdAllToAllEmbedding(embedding_size=4)
except NotImplementedError as error:
    assert "ParameterServerStrategy" in str(error), error
else:
    raise AssertionError("HvdAllToAllEmbedding was built")
print("saved", saved)
print("files", sorted(os.listdir(OUT)))
print("OK")
"""


@pytest.mark.parametrize("flavor", ["keras3", "tf_keras"])
@pytest.mark.parametrize("rank", [0, 1])
def test_under_horovod_rank_0_saves_and_dense_weights_are_broadcast(tmp_path, flavor, rank):
    keras_env = ({"TF_USE_LEGACY_KERAS": "1", "CKPT_NAME": "m_ckpt"} if flavor == "tf_keras"
                 else {"CKPT_NAME": "m.weights.h5"})
    broadcasts = _run_as_horovod_rank(tmp_path, rank, keras_env, HOROVOD_SCRIPT)
    out = tmp_path / f"out_{rank}"
    if rank == 0:
        assert "v1" in os.listdir(out)
        assert any(name.startswith("m") for name in os.listdir(out)), os.listdir(out)
        assert any(name.startswith("model") for name in os.listdir(out / "v1"))
    else:
        assert os.listdir(out) == []     # neither the Keras callback nor the v1 saver wrote
    # One broadcast after the first batch: the model's dense weights (the kernel; the bias is
    # local), then the optimizer's; never the embedding rows.
    assert len(broadcasts) == 2 and all(b["root_rank"] == 0 for b in broadcasts)
    model_names, optimizer_names = broadcasts[0]["names"], broadcasts[1]["names"]
    assert len(model_names) == 1 and "kernel" in model_names[0], model_names
    assert not any("emb" in name for name in model_names + optimizer_names)
    assert any("kernel" in name for name in optimizer_names), optimizer_names
