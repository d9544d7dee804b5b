"""From training to serving in commands (issue 60, deliverable 5).

A model trained on the default (native) backend is exported by `tfra-de export` in a fresh
process -- from a `.keras` file or from its building function and a checkpoint, sharded by
`--shards`/`--plan` or plain -- and by `model.export` / `de.keras.models.save_model(...,
stock_tables=True)`; every
SavedModel is checked against the trained model's predictions, the plain ones in a process that
never imports this package. A SavedModel that keeps the native tables names the package when its
op library is missing.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tfra_dynamic_embedding import cli, inference
from tfra_dynamic_embedding.inference import stock_saved_model
from tfra_dynamic_embedding.tables import builtin

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-5
TIMEOUT = 300

# The model's code, as a user's module: `--model-fn ranker:build` imports it.
RANKER = textwrap.dedent("""
    import keras
    import tensorflow as tf
    import tensorflow_recommenders_addons.dynamic_embedding as de

    def build():
        user = keras.Input(shape=(), dtype="int64", name="user")
        tags = keras.Input(shape=(3,), dtype="string", name="tags")
        x = keras.Input(shape=(2,), name="x")
        # Zero rows for unseen ids, the export's rule: the trained model agrees on every id.
        pooled = [de.keras.layers.Embedding(4, initializer=0.0, name="user_emb")(user),
                  de.keras.layers.Embedding(4, key_dtype=tf.string, pooling="mean",
                                            initializer=0.0, name="tag_emb")(tags)]
        hidden = keras.layers.Dense(8, activation="relu")(
            keras.layers.Concatenate()(pooled + [x]))
        return keras.Model({"user": user, "tags": tags, "x": x}, keras.layers.Dense(1)(hidden))
""")

# Plain TensorFlow: loads a SavedModel, calls serving_default on a request, prints the outputs.
PLAIN_LOAD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    loaded = tf.saved_model.load(sys.argv[1])
    request = dict(np.load(sys.argv[2]))
    out = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in request.items()})
    leaked = [m for m in sys.modules if m.startswith(("tfra_dynamic_embedding",
                                                      "tensorflow_recommenders_addons"))]
    print(json.dumps({"out": {k: v.numpy().tolist() for k, v in out.items()},
                      "leaked": leaked}))
""")


def _request(rng, rows, offset=0):
    words = np.array([f"w{i + offset}".encode() for i in range(20)])
    return {"user": rng.integers(0, 40, size=(rows,)).astype(np.int64) + offset,
            "tags": words[rng.integers(0, 20, size=(rows, 3))],
            "x": rng.normal(size=(rows, 2)).astype(np.float32)}


def _run(args, cwd, env=None, timeout=TIMEOUT):
    """Runs `args` in a new process group; kills it (by pid) if it outlives `timeout`."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    process = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, stdout, stderr


# What the `tfra-de` console script runs.
TFRA_DE = "import sys; from tfra_dynamic_embedding.cli import main; sys.exit(main())"


def _tfra_de(args, cwd, pythonpath=ROOT):
    return _run([sys.executable, "-c", TFRA_DE, *args], cwd, {"PYTHONPATH": pythonpath})


def _plain_predictions(export_dir, request, tmp_path):
    """serving_default of `export_dir` in a Python that never imports this package."""
    path = str(tmp_path / "request.npz")
    np.savez(path, **request)
    code, stdout, stderr = _run([sys.executable, "-c", PLAIN_LOAD, export_dir, path], cwd="/",
                                env={"PYTHONPATH": ""})
    assert code == 0, stderr[-3000:]
    answer = json.loads(stdout.strip().splitlines()[-1])
    assert answer["leaked"] == []
    (values,) = answer["out"].values()
    return np.asarray(values)


@pytest.fixture(name="trained", scope="module")
def fixture_trained(tmp_path_factory):
    """The ranker trained on the default backend, saved as a .keras file and a checkpoint."""
    folder = tmp_path_factory.mktemp("trained")
    (folder / "ranker.py").write_text(RANKER)
    sys.path.insert(0, str(folder))
    try:
        import ranker  # pylint: disable=import-outside-toplevel
        model = ranker.build()
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("ranker", None)
    tables = stock_saved_model.dynamic_embeddings_of(model)
    assert tables and not any(isinstance(t, builtin.BuiltinKVTable)
                              for v in tables for t in v.shards.tables)   # default: native
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)),
                  loss="mse")
    rng = np.random.default_rng(5)
    train = _request(rng, 128)
    model.fit({k: tf.constant(v) for k, v in train.items()},
              rng.normal(size=(128, 1)).astype(np.float32), batch_size=32, epochs=2, verbose=0)
    request = {k: v[:24] for k, v in train.items()}
    unseen = _request(rng, 8, offset=1000)
    request = {k: np.concatenate([request[k], unseen[k]]) for k in request}
    expected = model.predict({k: tf.constant(v) for k, v in request.items()}, verbose=0)
    model.save(str(folder / "ranker.keras"))
    model.save_weights(str(folder / "ranker.weights.h5"))
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(str(folder / "ckpt" / "c"))
    inference.plan_for_model(model, 2, "size-greedy").save(str(folder / "plan.json"))
    return model, folder, request, expected


def _sharded_predictions(export_dir, request):
    return inference.load_sharded(export_dir).predict(request)["prediction"]


def test_cli_shards_a_keras_file(trained, tmp_path):
    _, folder, request, expected = trained
    out = tmp_path / "sharded"
    code, stdout, stderr = _tfra_de(
        ["export", "--model", str(folder / "ranker.keras"), "--shards", "2", "--strategy",
         "size-greedy", "--save-plan", str(tmp_path / "plan.json"), "--out", str(out)], tmp_path)
    assert code == 0, stderr[-3000:]
    assert "2 shards" in stdout and f"tfra-de serve {out}" in stdout
    assert sorted(os.listdir(out)) == ["main", "manifest.json", "shard_0", "shard_1"]
    assert json.loads((tmp_path / "plan.json").read_text())["strategy"] == "size-greedy"
    np.testing.assert_allclose(_sharded_predictions(str(out), request), expected, atol=TOL)
    # The shards hold stock ops only (TF Serving loads them).
    for part in ("main", "shard_0", "shard_1"):
        assert stock_saved_model.native_ops_in(str(out / part)) == []
    # Again into the same directory: refused, then replaced with --overwrite.
    args = ["export", "--model", str(folder / "ranker.keras"), "--shards", "1", "--out",
            str(out)]
    code, _, stderr = _tfra_de(args, tmp_path)
    assert code == 2 and "--overwrite" in stderr
    code, _, stderr = _tfra_de(args + ["--overwrite"], tmp_path)
    assert code == 0, stderr[-3000:]
    assert sorted(os.listdir(out)) == ["main", "manifest.json", "shard_0"]
    np.testing.assert_allclose(_sharded_predictions(str(out), request), expected, atol=TOL)


def test_cli_shards_a_checkpoint_with_the_model_fn_and_a_plan(trained, tmp_path):
    _, folder, request, expected = trained
    out = tmp_path / "sharded"
    # The user's module is importable from the working directory.
    (tmp_path / "ranker.py").write_text(RANKER)
    code, stdout, stderr = _tfra_de(
        ["export", "--model-fn", "ranker:build", "--checkpoint", str(folder / "ckpt"), "--plan",
         str(folder / "plan.json"), "--out", str(out)], tmp_path)
    assert code == 0, stderr[-3000:]
    manifest = inference.Manifest.load(str(out))
    assert manifest.strategy == "size-greedy" and len(manifest.shards) == 2, stdout
    np.testing.assert_allclose(_sharded_predictions(str(out), request), expected, atol=TOL)


def test_cli_takes_a_weights_file_with_the_model_fn(trained, tmp_path):
    _, folder, request, expected = trained
    (tmp_path / "ranker.py").write_text(RANKER)
    out = tmp_path / "sharded"
    code, stdout, stderr = _tfra_de(
        ["export", "--model-fn", "ranker:build", "--checkpoint",
         str(folder / "ranker.weights.h5"), "--shards", "1", "--out", str(out)], tmp_path)
    assert code == 0, stderr[-3000:]
    assert "1 shards" in stdout
    np.testing.assert_allclose(_sharded_predictions(str(out), request), expected, atol=TOL)


TF_KERAS = textwrap.dedent("""
    import subprocess, sys
    import numpy as np
    import tensorflow as tf
    import tf_keras
    import tensorflow_recommenders_addons.dynamic_embedding as de
    from tfra_dynamic_embedding import inference
    from tfra_dynamic_embedding.inference import stock_saved_model
    folder = sys.argv[1]
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 60, size=(256, 3))
    inputs = tf_keras.Input(shape=(3,), dtype=tf.int64, name="ids")
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(1)(
        de.keras.layers.Embedding(4, pooling="sum", name="emb")(inputs)))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf_keras.optimizers.legacy.Adam(0.05)),
                  loss="mse")
    model.fit(ids, (ids[:, :1] % 2).astype(np.float32), batch_size=64, verbose=0)
    want = model.predict(ids[:16], verbose=0)
    model.export(folder + "/export")                    # tf_keras' own export: stock tables
    assert stock_saved_model.native_ops_in(folder + "/export") == []
    serve = tf.saved_model.load(folder + "/export").signatures["serving_default"]
    np.testing.assert_allclose(list(serve(tf.constant(ids[:16])).values())[0].numpy(), want,
                               atol=1e-5)
    de.keras.models.save_model(model, folder + "/model")
    main = "import sys; from tfra_dynamic_embedding.cli import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", main, "export", "--model", folder + "/model",
                           "--shards", "1", "--out", folder + "/sharded"], timeout=240,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    got = inference.load_sharded(folder + "/sharded").predict({"ids": ids[:16]})["prediction"]
    np.testing.assert_allclose(got, want, atol=1e-5)
    print("OK")
""")


def test_tf_keras_model_exports_and_its_savedmodel_shards(tmp_path):
    """tf_keras: `model.export` writes stock tables; `tfra-de export` takes its SavedModel."""
    code, stdout, stderr = _run([sys.executable, "-c", TF_KERAS, str(tmp_path)], "/",
                                env={"PYTHONPATH": ROOT, "TF_USE_LEGACY_KERAS": "1"})
    assert code == 0 and "OK" in stdout, stderr[-3000:]


def test_cli_plain_savedmodel_loads_in_stock_tensorflow(trained, tmp_path):
    _, folder, request, expected = trained
    out = tmp_path / "plain"
    code, stdout, stderr = _tfra_de(["export", "--model", str(folder / "ranker.keras"),
                                     "--plain", "--out", str(out)], tmp_path)
    assert code == 0, stderr[-3000:]
    assert "stock tables" in stdout
    assert stock_saved_model.native_ops_in(str(out)) == []
    np.testing.assert_allclose(_plain_predictions(str(out), request, tmp_path), expected,
                               atol=TOL)


@pytest.mark.parametrize("how", ["model.export", "save_model"])
def test_default_backend_savedmodel_loads_without_this_package(trained, tmp_path, how):
    model, _, request, expected = trained
    export_dir = str(tmp_path / "1")
    if how == "model.export":
        model.export(export_dir, verbose=False)
        # Keras' endpoint `serve` is there as well as serving_default.
        assert "serve" in tf.saved_model.load(export_dir).signatures
    else:
        de.keras.models.save_model(model, export_dir, stock_tables=True)
    assert stock_saved_model.native_ops_in(export_dir) == []
    np.testing.assert_allclose(_plain_predictions(export_dir, request, tmp_path), expected,
                               atol=TOL)


def test_unseen_ids_get_the_seeded_initializers_rows(tmp_path):
    """Ids the table does not hold: the stock SavedModel draws the rows the native kernel draws
    (the keyed recipe of a seeded initializer), so it predicts what the model predicts."""
    ids = keras.Input(shape=(3,), dtype="int64", name="ids")
    layer = de.keras.layers.Embedding(
        4, pooling="sum", name="seeded_emb",
        initializer=keras.initializers.TruncatedNormal(stddev=0.5, seed=11))
    model = keras.Model(ids, keras.layers.Dense(1)(layer(ids)))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)),
                  loss="mse")
    rng = np.random.default_rng(2)
    model.fit(rng.integers(0, 30, size=(64, 3)), rng.normal(size=(64, 1)), verbose=0)
    request = {"ids": np.concatenate([rng.integers(0, 30, size=(4, 3)),
                                      rng.integers(10 ** 9, 10 ** 10, size=(4, 3))])}
    expected = model.predict(request["ids"], verbose=0)
    export_dir = str(tmp_path / "1")
    model.export(export_dir, verbose=False)
    np.testing.assert_allclose(_plain_predictions(export_dir, request, tmp_path), expected,
                               atol=TOL)


NATIVE_LOAD = textwrap.dedent("""
    import sys
    import tfra_dynamic_embedding
    from tfra_dynamic_embedding.inference import stock_saved_model
    try:
        stock_saved_model.load(sys.argv[1])
    except RuntimeError as error:
        print(error)
""")


def test_savedmodel_with_native_tables_names_the_package(trained, tmp_path):
    model, _, _, _ = trained
    export_dir = str(tmp_path / "native")
    model.export(export_dir, verbose=False, stock_tables=False)   # opt-in: native tables
    assert stock_saved_model.native_ops_in(export_dir)
    # Stock TensorFlow: TF's own message, naming the op (documented in docs/serving.md).
    code, _, stderr = _run([sys.executable, "-c", "import sys, tensorflow as tf; "
                            "tf.saved_model.load(sys.argv[1])", export_dir], "/",
                           env={"PYTHONPATH": ""})
    assert code != 0 and "Op type not registered 'TfraDe" in stderr
    # This package without its op library: the loader names the package and the fix.
    code, stdout, stderr = _run([sys.executable, "-c", NATIVE_LOAD, export_dir], "/",
                                env={"PYTHONPATH": ROOT,
                                     "TFRA_DE_OPS_LIBRARY": str(tmp_path / "missing.so")})
    assert code == 0, stderr[-3000:]
    assert "tfra_dynamic_embedding" in stdout and "import tfra_dynamic_embedding" in stdout
    assert "stock tables" in stdout


def test_cli_bad_arguments_are_named(trained, tmp_path, capsys):
    _, folder, _, _ = trained
    keras_file, out = str(folder / "ranker.keras"), str(tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    cases = [
        (["--shards", "2", "--out", out], "--model PATH"),
        (["--model", str(tmp_path / "nope.keras"), "--plain", "--out", out], "does not exist"),
        (["--model", keras_file, "--out", out], "one of --plan"),
        (["--model", keras_file, "--plain", "--shards", "2", "--out", out], "--shards and --plain"),
        (["--model", keras_file, "--shards", "-1", "--out", out], "--shards must be >= 0"),
        (["--model", keras_file, "--shards", "2", "--strategy", "best-ever", "--out", out],
         "--strategy must be one of"),
        (["--model", keras_file, "--plain", "--strategy", "size-greedy", "--out", out],
         "--strategy goes with --shards"),
        (["--model", keras_file, "--plan", str(tmp_path / "none.json"), "--out", out],
         "--plan"),
        (["--model", keras_file, "--plain", "--out", str(tmp_path / "full")], "--overwrite"),
        (["--model", keras_file, "--checkpoint", "c", "--plain", "--out", out],
         "--checkpoint goes with --model-fn"),
        (["--model-fn", "ranker", "--checkpoint", "c", "--plain", "--out", out],
         "MODULE:FUNCTION"),
        (["--model-fn", "ranker:build", "--plain", "--out", out], "needs --checkpoint"),
        (["--model-fn", "no_such_module:build", "--checkpoint", "c", "--plain", "--out", out],
         "no_such_module"),
        (["--model", str(folder), "--plain", "--out", out], "without a SavedModel"),
        (["--model", keras_file, "--shards", "1", "--input-signature", "{bad", "--out", out],
         "--input-signature"),
    ]
    for args, message in cases:
        assert cli.main(["export", *args]) == 2, args
        err = capsys.readouterr().err
        assert message in err, (args, err)
    # A serving SavedModel is no model to cut: says what to give instead.
    serving = str(tmp_path / "serving")
    de.keras.models.save_model(trained[0], serving, stock_tables=True)
    assert cli.main(["export", "--model", serving, "--shards", "1", "--out", out]) == 2
    assert "--model-fn" in capsys.readouterr().err
