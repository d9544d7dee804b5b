"""The demo (issue 3): the Criteo TSV reader and generator, and a tiny end-to-end run."""

import collections
import contextlib
import io
import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tfra_dynamic_embedding.demo import criteo, dlrm, run
from tfra_dynamic_embedding.online import delta

# label, I1..I13, C1..C26: missing dense and categorical values, a negative count, a line
# without its trailing newline.
_C = ["68fd1e64", "80e26c9b", "fb936136", "7b4723c4", "25c83c98", "7e0ccccf", "de7995b8",
      "1f89b562", "a73ee510", "a8cd5504", "b2cb9c98", "37c9c164", "2824a5f6", "1adce6ef",
      "8ba8b39a", "891b62e7", "e5ba7672", "f54016b9", "21ddcdc9", "b1252a9d", "07b5194c",
      "", "3a171ecb", "c5c50484", "e8b83407", "9727dd16"]
_LINES = [
    "\t".join(["1", "1", "-1", "", "0", "1382", "4", "15", "2", "181", "1", "2", "", "2"] + _C),
    "\t".join(["0", "", "7", "", "", "", "", "", "", "", "", "", "", ""] + [""] * 26),
    "\t".join(["0", "0", "3", "1", "", "0", "", "", "", "", "", "", "", "8"]
              + _C[:3] + [""] * 20 + _C[:3]),
]


@pytest.fixture(name="three_lines")
def fixture_three_lines(tmp_path):
    path = tmp_path / "three.tsv"
    path.write_text("\n".join(_LINES))  # no newline after the last line
    return str(path)


def test_reader_parses_missing_values(three_lines):
    features, label = next(iter(criteo.read_tsv(three_lines, 8, raw=True)))
    np.testing.assert_array_equal(label.numpy(), [1.0, 0.0, 0.0])
    dense = features["dense"].numpy()
    np.testing.assert_array_equal(dense[0], [1, -1, 0, 0, 1382, 4, 15, 2, 181, 1, 2, 0, 2])
    np.testing.assert_array_equal(dense[1], [0, 7] + [0] * 11)
    np.testing.assert_array_equal(dense[2], [0, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8])
    categorical = features["categorical"].numpy().astype(str)
    assert categorical.shape == (3, 26)
    assert list(categorical[0]) == _C
    assert list(categorical[1]) == [""] * 26
    assert list(categorical[2]) == _C[:3] + [""] * 20 + _C[:3]

    inputs, label = next(iter(criteo.read_tsv(three_lines, 8)))
    np.testing.assert_allclose(inputs["dense"].numpy()[0, :3], [np.log(2.0), 0.0, 0.0])
    np.testing.assert_allclose(inputs["dense"].numpy()[0, 4], np.log(1383.0), rtol=1e-6)
    ids = inputs["ids"].numpy()
    assert ids.dtype == np.int64 and ids.shape == (3, 26) and (ids >= 0).all()
    # Equal strings hash to equal ids, different strings to different ids; "" is an id too.
    empty_id = ids[1, 0]
    assert (ids[1] == empty_id).all()
    np.testing.assert_array_equal(ids[2, :3], ids[0, :3])
    np.testing.assert_array_equal(ids[2, 23:], ids[0, :3])
    assert (ids[2, 3:23] == empty_id).all()
    assert len(set(ids[0])) == 26
    assert criteo.count_lines(three_lines) == 3


def test_reader_skip_take_and_known_length(three_lines):
    ds = criteo.read_tsv(three_lines, 2, skip=1, take=2)
    assert int(ds.cardinality()) == 1
    labels = np.concatenate([label.numpy() for _, label in ds])
    np.testing.assert_array_equal(labels, [0.0, 0.0])


def test_generated_file_is_criteo_format(tmp_path):
    path = str(tmp_path / "gen.tsv")
    data = criteo.generate(path, rows=3000, seed=5)
    with open(path, encoding="ascii") as f:
        lines = f.read().splitlines()
    assert len(lines) == 3000 == criteo.count_lines(path)
    fields = [line.split("\t") for line in lines]
    assert {len(f) for f in fields} == {40}
    assert {f[0] for f in fields} == {"0", "1"}
    for row in fields[:200]:
        for value in row[1:14]:
            assert value == "" or int(value) >= -3
        for value in row[14:]:
            assert value == "" or (len(value) == 8 and int(value, 16) >= 0)
    # Missing values and power-law ids: the most frequent id of a large feature is common.
    columns = list(zip(*fields))
    assert any(v == "" for v in columns[1]) and any(v == "" for v in columns[14 + 22])
    top_share = collections.Counter(columns[14 + 2]).most_common(1)[0][1] / 3000
    assert top_share > 0.02
    assert 0.15 < data.label.mean() < 0.35
    # The reader gives back the generator's labels.
    labels = np.concatenate([label.numpy() for _, label in criteo.read_tsv(path, 1024)])
    np.testing.assert_array_equal(labels, data.label)


def _distinct_training_values(path, num_train):
    with open(path, encoding="ascii") as f:
        rows = [line.rstrip("\n").split("\t") for _, line in zip(range(num_train), f)]
    return {f"C{j + 1}": len({row[14 + j] for row in rows}) for j in range(26)}


def test_demo_end_to_end(tmp_path):
    out = str(tmp_path / "demo")
    args = run.parse_args(["--rows", "8000", "--epochs", "1", "--batch-size", "128",
                           "--learning-rate", "0.01", "--out", out, "--verbose", "0",
                           "--no-serving-check", "--seed", "0"])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        results = run.run(args)
    assert "held-out (800 rows): AUC" in printed.getvalue()
    model = results["model"]
    # Quality: seeds 0-5 reach 0.68-0.72 on these 800 held-out rows (the hidden model: 0.83-0.88).
    assert results["auc"] > 0.6
    assert results["log_loss"] < results["constant_ctr_log_loss"]

    # One row per distinct (feature, value) of the training rows, a missing value included.
    path = os.path.join(out, run.SYNTHETIC_FILE)
    assert model.table_sizes() == _distinct_training_values(path, results["train_rows"])
    assert results["table_sizes"] == model.table_sizes()

    # The checkpoint restores into a fresh model and optimizer: identical tables, predictions.
    fresh = dlrm.build(dlrm.DLRM())
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.01))
    tf.train.Checkpoint(model=fresh, optimizer=optimizer).restore(
        results["checkpoint"]).assert_existing_objects_matched()
    assert fresh.table_sizes() == model.table_sizes()
    trained_rows, _ = next(iter(criteo.read_tsv(path, 512, take=512)))  # all ids trained
    np.testing.assert_array_equal(fresh(trained_rows).numpy(), model(trained_rows).numpy())
    for a, b in zip(model.embeddings, fresh.embeddings):
        keys_a, values_a = a.params.export()
        keys_b, values_b = b.params.export()
        order_a, order_b = np.argsort(keys_a.numpy()), np.argsort(keys_b.numpy())
        np.testing.assert_array_equal(keys_a.numpy()[order_a], keys_b.numpy()[order_b])
        np.testing.assert_array_equal(values_a.numpy()[order_a], values_b.numpy()[order_b])

    # The SavedModel serves in a process that never imports this package (it raises if it did).
    raw, _ = next(iter(criteo.read_tsv(path, 40, skip=results["train_rows"] - 32, take=40,
                                       raw=True)))
    served = np.asarray(run.serve_in_fresh_process(
        results["saved_model"], raw["dense"].numpy(), raw["categorical"].numpy()))
    expected = model(criteo.preprocess(raw["dense"], raw["categorical"])).numpy().ravel()
    assert served.shape == (40,)
    np.testing.assert_allclose(served[:32], expected[:32], atol=1e-6)  # trained rows
    assert ((served > 0) & (served < 1)).all()  # the last 8: held out, unseen ids embed as 0

    # Online learning: a delta export of the training tables reaches the loaded SavedModel in
    # place (its apply_delta signature): changed rows serve their new values, removals apply.
    tables = [layer.params for layer in model.embeddings]
    exporter = delta.DeltaExporter(tables, str(tmp_path / "deltas"))
    exporter.export()                                   # the state the SavedModel holds
    loaded = tf.saved_model.load(results["saved_model"])
    keys, values = tables[0].export()
    tables[0].upsert(keys[:10], values[:10] * 2.0)       # changed rows
    features = criteo.preprocess(raw["dense"][:32], raw["categorical"][:32])
    used = set(np.asarray(features["ids"][:, 0]).tolist())
    gone = [k for k in keys.numpy().tolist() if k not in used][:3]
    tables[0].remove(tf.constant(gone, keys.dtype))
    info = exporter.export()
    assert (info.upserts, info.removals) == (10 - len(set(keys.numpy()[:10]) & set(gone)), 3)
    sizes = delta.apply_delta(loaded, info.path, [t.name for t in tables])
    assert sizes["t0_size"] == int(tables[0].size())
    served = loaded.signatures["serving_default"](dense=raw["dense"][:32],
                                                  categorical=raw["categorical"][:32])
    np.testing.assert_allclose(served["probability"].numpy(), model(features).numpy().ravel(),
                               atol=1e-6)


def test_demo_resumes_from_its_checkpoint(tmp_path):
    out = str(tmp_path / "demo")
    common = ["--rows", "1200", "--batch-size", "250", "--out", out, "--verbose", "0",
              "--no-serving-check"]
    with contextlib.redirect_stdout(io.StringIO()):
        first = run.run(run.parse_args(common + ["--epochs", "1"]))
    assert first["checkpoint"].endswith("ckpt-1")
    steps = int(first["model"].optimizer.iterations)
    assert steps == 5  # 1080 training rows in batches of 250
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        second = run.run(run.parse_args(common + ["--epochs", "2", "--resume"]))
    assert f"resumed from {first['checkpoint']} (after epoch 1" in printed.getvalue()
    assert second["checkpoint"].endswith("ckpt-2")
    assert int(second["model"].optimizer.iterations) == 2 * steps  # one more epoch, not two
    assert second["table_sizes"] == first["table_sizes"]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="--eval-fraction"):
        run.run(run.parse_args(["--eval-fraction", "1.5"]))
    with pytest.raises(ValueError, match="--data"):
        run.run(run.parse_args(["--data", "/nonexistent/criteo.tsv"]))
    with pytest.raises(SystemExit):
        with contextlib.redirect_stdout(io.StringIO()):
            run.main(["--help"])
