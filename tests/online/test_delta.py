"""Delta export (issue 22): full export + every delta == the last full state, removals included.

Tables change by training (updates, new keys), by eviction (a capacity bound) and by hand
(remove); exports are replayed into fresh variables and into a serving SavedModel in place.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.online.training import train_step
from tfra_dynamic_embedding.online import delta



def _content(var):
    keys, values = (t.numpy() for t in var.export())
    order = np.argsort(keys)
    return keys[order], values[order]


def _assert_same(a, b):
    (ka, va), (kb, vb) = _content(a), _content(b)
    np.testing.assert_array_equal(ka, kb)
    np.testing.assert_array_equal(va, vb)


def test_a_replay_that_does_not_fit_the_variable_changes_nothing(tmp_path):
    source = de.Variable(dim=2, name="user")
    source.upsert(tf.constant([1, 2 ** 40], tf.int64), tf.ones([2, 2]))
    delta.DeltaExporter([source], str(tmp_path)).export()   # a full export
    wider = de.Variable(dim=3, name="user")
    wider.upsert(tf.constant([99], tf.int64), tf.ones([1, 3]))
    with pytest.raises(ValueError, match="dim 2; variable 'user' has dim 3"):
        delta.replay(str(tmp_path), [wider])
    assert _content(wider)[0].tolist() == [99]   # a full export clears only after the checks
    narrow = de.Variable(dim=2, name="user", key_dtype=tf.int32)
    with pytest.raises(ValueError, match="keys outside int32"):   # 2**40 would wrap to 0
        delta.replay(str(tmp_path), [narrow])
    assert int(narrow.size()) == 0
    named = de.Variable(dim=2, name="user", key_dtype=tf.string)
    with pytest.raises(TypeError, match="integer keys; variable 'user' has key_dtype string"):
        delta.replay(str(tmp_path), [named])


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string])
def test_full_plus_deltas_equals_the_last_state(kv_creator, key_dtype, tmp_path):
    def keys(numbers):
        if key_dtype == tf.string:
            return tf.constant([f"k{n}" for n in numbers])
        return tf.constant(numbers, tf.int64)

    user = de.Variable(key_dtype=key_dtype, dim=3, initializer=0.1, kv_creator=kv_creator,
                       devices=["/CPU:0", "/CPU:1"], name="user",
                       eviction=de.Eviction(max_size=40, slack=0.0))
    item = de.Variable(key_dtype=key_dtype, dim=2, initializer=0.0, kv_creator=kv_creator,
                       name="item")
    steps = {v.name: train_step(v, de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1)))
             for v in (user, item)}
    exporter = delta.DeltaExporter([user, item], str(tmp_path / "exports"))
    rng = np.random.default_rng(0)
    infos, states = [], []
    for _ in range(4):
        for _ in range(5):
            steps["user"](keys(np.unique(rng.integers(0, 120, size=10)).tolist()))
            steps["item"](keys(np.unique(rng.integers(0, 30, size=6)).tolist()))
        item.remove(keys([int(rng.integers(0, 30))]))
        infos.append(exporter.export())
        states.append({v.name: _content(v) for v in (user, item)})
    assert infos[0].full and not any(i.full for i in infos[1:])
    assert all(i.removals > 0 for i in infos[1:])          # evictions and the hand removals
    assert all(0 < i.upserts < 40 + 30 for i in infos[1:])
    for upto, state in enumerate(states):   # every prefix replays to its own export exactly
        user2 = de.Variable(key_dtype=key_dtype, dim=3, name="user")
        item2 = de.Variable(key_dtype=key_dtype, dim=2, name="item")
        delta.replay(str(tmp_path / "exports"), [user2, item2], upto=upto)
        for var in (user2, item2):
            got, want = _content(var), state[var.name]
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])


def test_nothing_changed_gives_an_empty_delta_and_exporters_resume(tmp_path):
    var = de.Variable(dim=2, initializer=0.0, name="v")
    var.upsert(tf.constant([1, 2, 3], tf.int64), tf.constant(np.ones([3, 2], np.float32)))
    first = delta.DeltaExporter([var], str(tmp_path))
    assert first.export().upserts == 3
    again = first.export()
    assert (again.upserts, again.removals, again.full) == (0, 0, False)
    # An incomplete export (no DONE) is neither replayed nor counted; a new exporter resumes.
    os.makedirs(tmp_path / "000002")
    var.upsert(tf.constant([2], tf.int64), tf.constant([[5.0, 5.0]]))
    var.remove(tf.constant([3], tf.int64))
    resumed = delta.DeltaExporter([var], str(tmp_path))
    info = resumed.export()
    assert (info.sequence, info.upserts, info.removals) == (2, 1, 1)
    keys, values, removed, full = delta.read_export(info.path)["v"]
    assert keys.tolist() == [2] and values.tolist() == [[5.0, 5.0]] and removed.tolist() == [3]
    assert not full
    target = de.Variable(dim=2, name="v")
    delta.replay(str(tmp_path), [target])
    _assert_same(target, var)
    with pytest.raises(ValueError, match="variables must have distinct names"):
        delta.DeltaExporter([var, target], str(tmp_path))


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
@pytest.mark.parametrize("shape", [(0, 3), (1, 1), (7, 3)])
def test_row_hashes_in_tensorflow_equal_the_numpy_ones(dtype, shape):
    # The table's device hashes with TF ops, the fingerprint files hold numpy's: one function.
    values = tf.cast(tf.random.stateless_normal(shape, seed=[1, 2]), dtype)
    want = delta._row_hashes(values.numpy())  # pylint: disable=protected-access
    got = delta._row_hashes_tf(values).numpy()  # pylint: disable=protected-access
    assert got.dtype == np.uint64
    np.testing.assert_array_equal(got, want)
    if shape[0] > 1:
        assert len(np.unique(got)) == shape[0]


def test_rows_are_hashed_where_the_table_lives_and_only_changes_fetched(tmp_path):
    var = de.Variable(dim=4, initializer=0.0, name="v", devices=["/CPU:0", "/CPU:2"])
    var.upsert(tf.range(100, dtype=tf.int64), tf.ones([100, 4]))
    exporter = delta.DeltaExporter([var], str(tmp_path))
    exporter.export()
    var.upsert(tf.constant([5, 6, 200], tf.int64), tf.fill([3, 4], 2.0))
    var.remove(tf.constant([7], tf.int64))
    fetched = []
    for t in var._tables:  # pylint: disable=protected-access
        t.lookup_with_exists = (lambda keys, rows, f=t.lookup_with_exists:
                                fetched.append(int(tf.size(keys))) or f(keys, rows))
    info = exporter.export()
    assert (info.upserts, info.removals) == (3, 1)
    assert sum(fetched) == 3                                  # only the changed rows came over
    graph = exporter._fingerprints["v.shard1"].get_concrete_function().graph  # pylint: disable=protected-access
    devices = {op.device for op in graph.get_operations() if op.type not in ("Identity", "NoOp")}
    assert devices and all(d.endswith("CPU:2") for d in devices), devices
    # A shard with no rows exports too.
    lone = de.Variable(dim=3, initializer=0.0, name="lone", devices=["/CPU:0", "/CPU:1"])
    lone.upsert(tf.constant([4], tf.int64), tf.ones([1, 3]))
    lone_exporter = delta.DeltaExporter([lone], str(tmp_path / "lone"))
    assert [lone_exporter.export().upserts for _ in range(2)] == [1, 0]
    lone.upsert(tf.constant([5], tf.int64), tf.ones([1, 3]))   # into the shard that was empty
    assert lone_exporter.export().upserts == 1


def test_a_key_removed_while_its_shard_is_exported_is_a_removal(tmp_path):
    var = de.Variable(dim=2, initializer=0.0, name="v")
    var.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2]))
    exporter = delta.DeltaExporter([var], str(tmp_path))
    exporter.export()
    var.upsert(tf.constant([2, 3, 4], tf.int64), tf.fill([3, 2], 5.0))
    table = var._tables[0]  # pylint: disable=protected-access
    lookup = table.lookup_with_exists

    def remove_then_lookup(keys, rows):   # a writer gets in between hashing and fetching
        var.remove(tf.constant([2, 4], tf.int64))
        var.upsert(tf.constant([3], tf.int64), tf.fill([1, 2], 9.0))
        return lookup(keys, rows)

    table.lookup_with_exists = remove_then_lookup
    info = exporter.export()
    del table.lookup_with_exists
    keys, values, removed, _ = delta.read_export(info.path)["v"]
    assert keys.tolist() == [3] and values.tolist() == [[9.0, 9.0]]
    assert removed.tolist() == [2]          # 4 was never exported: nothing to remove
    again = exporter.export()               # the fingerprint holds what was exported
    assert (again.upserts, again.removals) == (0, 0)
    target = de.Variable(dim=2, name="v")
    delta.replay(str(tmp_path), [target])
    _assert_same(target, var)


def test_serving_savedmodel_takes_deltas_in_place(tmp_path):
    trained = de.Variable(dim=2, initializer=0.0, name="emb")
    step = train_step(trained, de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.3)))
    step(tf.constant([1, 2, 3, 4], tf.int64))
    exporter = delta.DeltaExporter([trained], str(tmp_path / "exports"))
    exporter.export()

    serving = de.Variable(dim=2, initializer=0.0, name="emb", kv_creator=de.BuiltinKVCreator())
    delta.replay(str(tmp_path / "exports"), [serving])
    module = tf.Module()
    module.tables = [serving]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    def serve(ids):
        return {"rows": serving.lookup(ids)}

    module.serve = serve
    apply_fn = delta.add_apply_delta_signature(module, [serving])
    tf.saved_model.save(module, str(tmp_path / "model"),
                        signatures={"serving_default": serve, "apply_delta": apply_fn})
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    ids = tf.constant([1, 2, 3, 4, 5, 6], tf.int64)

    def served():
        return loaded.signatures["serving_default"](ids=ids)["rows"].numpy()

    before = served()
    step(tf.constant([3, 4, 5, 6], tf.int64))
    trained.remove(tf.constant([1], tf.int64))
    info = exporter.export()
    assert (info.upserts, info.removals) == (4, 1)
    sizes = delta.apply_delta(loaded, info.path, ["emb"])
    assert sizes == {"t0_size": 5}
    np.testing.assert_array_equal(served(), trained.lookup(ids).numpy())
    assert not np.array_equal(served(), before)
    with pytest.raises(ValueError, match="is a full export; apply_delta takes deltas"):
        delta.apply_delta(loaded, os.path.join(str(tmp_path / "exports"), "000000"), ["emb"])


def test_warm_start_from_exports_renamed_resharded_subset(kv_creator, tmp_path):
    old = de.Variable(dim=2, initializer=0.0, kv_creator=kv_creator, name="old_user",
                      devices=["/CPU:0", "/CPU:1"])
    keys = np.arange(100, dtype=np.int64)
    old.upsert(tf.constant(keys), tf.constant(np.stack([keys, -keys], 1).astype(np.float32)))
    exporter = delta.DeltaExporter([old], str(tmp_path))
    exporter.export()
    old.remove(tf.constant([10, 20], tf.int64))
    old.upsert(tf.constant([30], tf.int64), tf.constant([[1.5, 1.5]]))
    exporter.export()
    new = de.Variable(dim=2, kv_creator=kv_creator, name="user",
                      devices=["/CPU:0", "/CPU:1", "/CPU:2"])
    delta.replay(str(tmp_path), [new], var_name_to_prev_var_name={"user": "old_user"},
                 keep_keys=lambda k: k % 10 == 0)
    got_keys, got_values = _content(new)
    want = [k for k in range(0, 100, 10) if k not in (10, 20)]
    assert got_keys.tolist() == want
    expected = {k: [float(k), float(-k)] for k in want}
    expected[30] = [1.5, 1.5]
    assert got_values.tolist() == [expected[k] for k in want]
    for i, table in enumerate(new.tables):   # spread by the new variable's own partitioner
        shard_keys = table.export()[0].numpy()
        assert all(de.default_partition_fn(tf.constant(shard_keys), 3).numpy() == i)
    with pytest.raises(ValueError, match="has no export of tables \\['user'\\]"):
        delta.replay(str(tmp_path), [de.Variable(dim=2, name="user")])
    with pytest.raises(ValueError, match="names variables not given: \\['nope'\\]"):
        delta.replay(str(tmp_path), [new], var_name_to_prev_var_name={"nope": "old_user"})


DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                   "docs", "online.md")


@pytest.mark.skipif(not os.path.exists(DOC), reason="docs/ is not in this test's runfiles")
def test_docs_example_prints_what_it_says(capsys, tmp_path):
    import re  # pylint: disable=import-outside-toplevel
    with open(DOC, encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    assert len(blocks) == 1
    code = blocks[0].replace("/tmp/online_example", str(tmp_path / "example"))
    exec(compile(code, "docs/online.md", "exec"), {})  # pylint: disable=exec-used
    assert capsys.readouterr().out.split() == ["True", "True"]
