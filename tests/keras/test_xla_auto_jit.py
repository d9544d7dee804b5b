"""Training under XLA auto-clustering (`TF_XLA_FLAGS=--tf_xla_auto_jit=2
--tf_xla_cpu_global_jit`, which TFRA's demos set "for optimal performance"): `model.fit` of a
`de.keras.layers.Embedding` with Adam trains as without it.

A wrapper's held rows and ids (and the slot buffers) change shape every step; inside a compiled
cluster their assignment failed ("Shape of resource ... cannot be changed after
initialization"). The flags must be set before TensorFlow starts, so each run is a child process.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
XLA_FLAGS = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit"

TRAIN = r'''
import json
import numpy as np
import tensorflow as tf
import tensorflow_recommenders_addons.dynamic_embedding as de

tf.keras.utils.set_random_seed(0)
inputs = tf.keras.Input(shape=(2,), dtype=tf.int64)
emb = de.keras.layers.Embedding(4, initializer=tf.keras.initializers.RandomNormal(seed=1),
                                name="emb")
flat = tf.keras.layers.Flatten()(emb(inputs))
outputs = tf.keras.layers.Dense(1, kernel_initializer="ones", name="out")(flat)
model = tf.keras.Model(inputs, outputs)
model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)),
              loss="mse")
ids = (np.arange(512, dtype=np.int64).reshape(-1, 2) * 7) % 97
labels = (ids[:, :1] % 3).astype(np.float32)
history = model.fit(ids, labels, batch_size=32, epochs=2, shuffle=False, verbose=0)
keys = np.arange(97, dtype=np.int64)
print(json.dumps({"loss": history.history["loss"],
                  "rows": emb.params.lookup(tf.constant(keys)).numpy().tolist(),
                  "size": int(emb.params.size())}))
'''


def _train(legacy_keras, xla):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="0")
    env.pop("TF_XLA_FLAGS", None)
    if xla:
        env["TF_XLA_FLAGS"] = XLA_FLAGS
    if legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    else:
        env.pop("TF_USE_LEGACY_KERAS", None)
    done = subprocess.run([sys.executable, "-c", TRAIN], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.parametrize("legacy_keras", [False, True], ids=["keras3", "tf_keras"])
def test_fit_under_xla_auto_jit_trains_as_without_it(legacy_keras):
    plain, _ = _train(legacy_keras, xla=False)
    compiled, log = _train(legacy_keras, xla=True)
    assert "Compiled cluster using XLA" in log   # auto-clustering was on and compiled the step
    assert compiled["size"] == plain["size"] == 97
    np.testing.assert_allclose(compiled["rows"], plain["rows"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(compiled["loss"], plain["loss"], rtol=1e-4)
    assert compiled["loss"][-1] < compiled["loss"][0]
