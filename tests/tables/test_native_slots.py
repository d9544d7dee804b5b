"""Optimizer slots kept in their variable's native records (tables/native_slots.py)."""

import os

import numpy as np
import pytest
import tensorflow as tf

import tfra_dynamic_embedding as de
from tfra_dynamic_embedding.tables import native
from tfra_dynamic_embedding.tables import native_slots

pytestmark = pytest.mark.skipif(not native.is_available(), reason="native ops not built")

DIM = 3


def _table(key_dtype=tf.int64, name="emb"):
    return native.NativeKVCreator().create(key_dtype, tf.float32, DIM, name)


def _keys(values, dtype=tf.int64):
    return tf.constant(values, dtype)


def _rows(table, dtype=tf.int64):
    """{key: row} of a table's export."""
    k, v = table.export()
    k = [x.decode() for x in k.numpy()] if dtype == tf.string else k.numpy().tolist()
    return {key: tuple(row) for key, row in zip(k, v.numpy().tolist())}


def _slot_rows(table, view, keys):
    """{key: row} of `view`'s columns for `keys` of `table` (written or not)."""
    (rows,), _ = native_slots.find_groups(table, _keys(keys), [view.group])
    return {k: tuple(r) for k, r in zip(keys, rows.numpy().tolist())}


def test_views_share_keys_and_start_at_their_fill():
    table = _table()
    table.insert(_keys([1, 2]), tf.constant([[1.0] * DIM, [2.0] * DIM]))
    m = native_slots.NativeSlotView(table, 0.0, "emb/m")
    v = native_slots.NativeSlotView(table, 0.25, "emb/v")
    assert (m.group, v.group) == (1, 2)
    # A slot holds the keys written through it (as TFRA's slot tables): none yet. The table's
    # keys' slot columns start at the fills.
    assert int(m.size()) == int(v.size()) == 0 and _rows(v) == {}
    assert _slot_rows(table, v, [1, 2]) == {1: (0.25,) * DIM, 2: (0.25,) * DIM}
    _, exists = v.lookup_with_exists(_keys([1, 2]), tf.fill([DIM], 0.25))
    np.testing.assert_array_equal(exists.numpy(), [False, False])
    np.testing.assert_array_equal(v.contains(_keys([1, 2])).numpy(), [False, False])
    # Rows of the table are untouched by adding groups.
    assert _rows(table) == {1: (1.0,) * DIM, 2: (2.0,) * DIM}
    # A new key written with its row gets the fills in its slot groups, not written.
    table.insert(_keys([3]), tf.fill([1, DIM], 3.0))
    assert _slot_rows(table, v, [3])[3] == (0.25,) * DIM and int(v.size()) == 0
    # A key written only through a view exists in the table, with a zero row, and in that view.
    m.insert(_keys([4]), tf.fill([1, DIM], 4.0))
    assert int(table.size()) == 4
    assert _rows(table)[4] == (0.0,) * DIM
    assert _rows(m) == {4: (4.0,) * DIM} and int(m.size()) == 1
    assert _slot_rows(table, v, [4])[4] == (0.25,) * DIM and 4 not in _rows(v)
    np.testing.assert_array_equal(m.contains(_keys([4, 3])).numpy(), [True, False])
    # Removing through a view removes the key.
    v.remove(_keys([4]))
    assert int(table.size()) == 3 and 4 not in _rows(m) and int(m.size()) == 0


def test_find_and_upsert_groups_move_every_group_of_a_key_at_once():
    table = _table()
    m = native_slots.NativeSlotView(table, 0.0, "emb/m")
    v = native_slots.NativeSlotView(table, 0.5, "emb/v")
    keys = _keys([5, 6, 5])   # a repeated key: the last write wins
    values = [tf.reshape(tf.range(9, dtype=tf.float32) + 9 * j, [3, DIM]) for j in range(3)]
    native_slots.upsert_groups(table, keys, values, [0, m.group, v.group])
    want = [x.numpy()[2] for x in values]
    (got_v, got_row, got_m), exists = native_slots.find_groups(table, _keys([5, 7]),
                                                              [v.group, 0, m.group])
    np.testing.assert_array_equal(exists.numpy(), [True, False])
    np.testing.assert_array_equal(got_row.numpy()[0], want[0])
    np.testing.assert_array_equal(got_m.numpy()[0], want[1])
    np.testing.assert_array_equal(got_v.numpy()[0], want[2])
    np.testing.assert_array_equal(got_v.numpy()[1], [0.5] * DIM)
    np.testing.assert_array_equal(got_row.numpy()[1], [0.0] * DIM)
    np.testing.assert_array_equal(got_m.numpy()[1], [0.0] * DIM)
    # Writing only slot groups leaves the row and its write count alone.
    _, _, _, freqs_before = table.export_with_meta()
    native_slots.upsert_groups(table, _keys([5]), [tf.fill([1, DIM], 9.0)], [v.group])
    assert _rows(table)[5] == tuple(want[0])
    assert _rows(v)[5] == (9.0,) * DIM
    np.testing.assert_array_equal(table.export_with_meta()[3].numpy(), freqs_before.numpy())


@pytest.mark.parametrize("rows_first", [True, False])
def test_restoring_rows_and_slots_in_either_order_gives_the_checkpoint(rows_first):
    table = _table()
    m = native_slots.NativeSlotView(table, 0.0, "emb/m")
    # State before the restore: keys 1, 2, 9 with rows and slot values.
    native_slots.upsert_groups(table, _keys([1, 2, 9]), [tf.fill([3, DIM], -1.0)] * 2, [0, 1])
    saved_keys = _keys([2, 3])
    saved_rows = tf.constant([[2.0] * DIM, [3.0] * DIM])
    saved_m = tf.constant([[20.0] * DIM, [30.0] * DIM])
    steps = [lambda: table.import_(saved_keys, saved_rows),
             lambda: m.import_(saved_keys, saved_m)]
    for step in (steps if rows_first else steps[::-1]):
        step()
    assert _rows(table) == {2: (2.0,) * DIM, 3: (3.0,) * DIM}
    assert _rows(m) == {2: (20.0,) * DIM, 3: (30.0,) * DIM}


def test_slot_import_resets_keys_it_lacks_to_the_fill_and_clear_resets_the_slot():
    table = _table()
    v = native_slots.NativeSlotView(table, 0.5, "emb/v")
    native_slots.upsert_groups(table, _keys([1, 2]), [tf.fill([2, DIM], 7.0)] * 2, [0, 1])
    v.import_(_keys([2]), tf.fill([1, DIM], 4.0))
    assert _rows(v) == {2: (4.0,) * DIM} and int(v.size()) == 1
    assert _slot_rows(table, v, [1, 2]) == {1: (0.5,) * DIM, 2: (4.0,) * DIM}
    v.clear()
    assert _rows(v) == {} and int(v.size()) == 0
    assert _slot_rows(table, v, [1, 2]) == {1: (0.5,) * DIM, 2: (0.5,) * DIM}
    assert _rows(table) == {1: (7.0,) * DIM, 2: (7.0,) * DIM}


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string])
def test_files_of_rows_and_slots_round_trip(tmp_path, key_dtype):
    as_key = (lambda k: str(k) * 9) if key_dtype == tf.string else (lambda k: k)  # long strings
    table = _table(key_dtype)
    m = native_slots.NativeSlotView(table, 0.0, "emb/m")
    keys = tf.constant([as_key(k) for k in range(300)], key_dtype)
    values = tf.random.stateless_normal([300, 2 * DIM], seed=[1, 2])
    native_slots.upsert_groups(table, keys, [values[:, :DIM], values[:, DIM:]], [0, 1])
    rows_before, m_before = _rows(table, key_dtype), _rows(m, key_dtype)
    table.save_to(str(tmp_path / "rows"))
    m.save_to(str(tmp_path / "m"))
    native_slots.upsert_groups(table, keys[:10], [tf.zeros([10, DIM])] * 2, [0, 1])
    table.insert(tf.constant([as_key(1000)], key_dtype), tf.ones([1, DIM]))
    assert int(m.load_from(str(tmp_path / "m"))) == 300
    assert int(table.load_from(str(tmp_path / "rows"))) == 300
    assert _rows(table, key_dtype) == rows_before
    assert _rows(m, key_dtype) == m_before


def test_adding_groups_keeps_every_row_of_a_large_table():
    table = native.NativeKVCreator(num_shards=8).create(tf.int64, tf.float32, DIM, "big")
    keys = tf.range(50_000, dtype=tf.int64) * 7919
    rows = tf.random.stateless_normal([50_000, DIM], seed=[3, 4])
    table.insert(keys, rows)
    table.remove(keys[:1000])   # free rows in the slabs too
    native_slots.NativeSlotView(table, 1.0, "big/a")
    native_slots.NativeSlotView(table, 2.0, "big/b")
    (got, got_a, got_b), exists = native_slots.find_groups(table, keys, [0, 1, 2])
    np.testing.assert_array_equal(exists.numpy(), np.arange(50_000) >= 1000)
    np.testing.assert_array_equal(got.numpy()[1000:], rows.numpy()[1000:])
    np.testing.assert_array_equal(got_a.numpy()[1000:], np.ones([49_000, DIM]))
    np.testing.assert_array_equal(got_b.numpy()[1000:], np.full([49_000, DIM], 2.0))


def test_bad_groups_and_fills_are_named():
    table = _table()
    native_slots.NativeSlotView(table, 0.0, "emb/m")
    with pytest.raises(tf.errors.InvalidArgumentError, match="column group 4 does not exist"):
        native_slots.find_groups(table, _keys([1]), [4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="starts at 0, not 1"):
        table.gen_ops.tfra_de_group_view(table.resource_handle, tf.constant([1.0], tf.float64),
                                      group=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"group must be in \[1, 16\)"):
        table.gen_ops.tfra_de_group_view(table.resource_handle, tf.zeros([16], tf.float64),
                                      group=16)
    view = native_slots.NativeSlotView(table, 0.0, "emb/v")
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a column group view"):
        table.gen_ops.tfra_de_group_view(view.resource_handle, tf.zeros([1], tf.float64), group=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not available on column group"):
        view._find_init(_keys([1]), native.NativeInitializer("constant", 0.0), insert=True)  # pylint: disable=protected-access
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Expected shape \[1, 3\]"):
        native_slots.upsert_groups(table, _keys([1]), [tf.zeros([1, DIM]), tf.zeros([1, 2])],
                                   [0, 1])


# -- through the optimizer ---------------------------------------------------------------------

def _train(kv_creator, steps=3, devices=None, key_dtype=tf.int64):
    emb = de.Variable(key_dtype=key_dtype, dim=DIM, initializer=0.1, kv_creator=kv_creator,
                      devices=devices, name="slots_emb")
    w = tf.Variable(tf.linspace(0.5, 1.0, DIM)[:, None])
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05, name="slots_adam"))
    rng = np.random.default_rng(0)
    for _ in range(steps):
        ids = rng.integers(0, 20, size=16)
        ids = tf.constant([str(i) for i in ids] if key_dtype == tf.string else ids, key_dtype)
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(emb, ids, return_trainable=True)
            loss = tf.reduce_sum((rows @ w - 1.0) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, [wrapper, w]), [wrapper, w]))
    return emb, opt


def _sorted(variable):
    keys, values = variable.export()
    order = np.argsort(keys.numpy())
    return keys.numpy()[order], values.numpy()[order]


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string])
def test_adam_slots_live_in_the_records_and_train_as_the_builtin_backend(key_dtype):
    devices = ["/CPU:0", "/CPU:0"]   # two shard tables
    emb, opt = _train(native.NativeKVCreator(), devices=devices, key_dtype=key_dtype)
    ref, ref_opt = _train(de.BuiltinKVCreator(), devices=devices, key_dtype=key_dtype)
    slots = opt.get_slot_variables(emb)
    assert len(slots) == 2
    assert emb.slot_groups(slots) == [1, 2]
    assert all(isinstance(t, native_slots.NativeSlotView) for s in slots for t in s._tables)  # pylint: disable=protected-access
    for got, want in zip([emb] + slots, [ref] + ref_opt.get_slot_variables(ref)):
        got_keys, got_rows = _sorted(got)
        want_keys, want_rows = _sorted(want)
        np.testing.assert_array_equal(got_keys, want_keys)
        np.testing.assert_array_equal(got_rows, want_rows)


def test_a_graph_step_reads_slots_with_one_probe_and_writes_once():
    graph = tf.Graph()
    with graph.as_default():
        emb = de.get_variable("probe_emb", dim=DIM, initializer=0.1,
                              kv_creator=native.NativeKVCreator())
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows = de.embedding_lookup(emb, ids, name="probe_lookup")
        train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1),
                                             apply_in_tables=False).minimize(
            tf.reduce_sum(rows ** 2))
        types = [op.type for op in graph.get_operations()]
        # The trainer-side path: one lookup of the rows (the forward pass), one of both slots,
        # one write of all three (the default path sends only gradients: test_table_updates).
        assert types.count("TfraDeFindInit") == 1
        assert types.count("TfraDeFindGroups") == 1
        assert types.count("TfraDeUpsertGroups") == 1
        assert "TfraDeInsert" not in types and "TfraDeFind" not in types
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(2):
                sess.run(train, {ids: [1, 2, 2]})
            assert sess.run(emb.size()) == 2


def test_checkpoint_keeps_slot_names_and_restores_slots_into_a_new_model(tmp_path):
    def keys_of(path):
        return {name for name, _ in tf.train.list_variables(path)}

    emb, opt = _train(native.NativeKVCreator())
    path = tf.train.Checkpoint(emb=emb, opt=opt).write(str(tmp_path / "native"))
    ref, ref_opt = _train(de.BuiltinKVCreator())
    ref_path = tf.train.Checkpoint(emb=ref, opt=ref_opt).write(str(tmp_path / "builtin"))
    assert keys_of(path) == keys_of(ref_path)
    saved = [_sorted(v) for v in [emb] + opt.get_slot_variables(emb)]

    # A fresh model restores before its slots exist; they are restored when a step makes them.
    fresh, fresh_opt = _train(native.NativeKVCreator(), steps=0)
    tf.train.Checkpoint(emb=fresh, opt=fresh_opt).read(path)
    np.testing.assert_array_equal(_sorted(fresh)[1], saved[0][1])
    ids = tf.constant([10_000], tf.int64)   # a key not in the checkpoint: slots of the others stay
    with tf.GradientTape() as tape:
        rows, wrapper = de.embedding_lookup(fresh, ids, return_trainable=True)
        loss = tf.reduce_sum(rows)
    fresh_opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
    for slot, (want_keys, want_rows) in zip(fresh_opt.get_slot_variables(fresh), saved[1:]):
        got_keys, got_rows = _sorted(slot)
        keep = got_keys != 10_000
        np.testing.assert_array_equal(got_keys[keep], want_keys)
        np.testing.assert_array_equal(got_rows[keep], want_rows)


def test_file_system_saver_saves_slots_in_records(tmp_path):
    emb, opt = _train(native.NativeKVCreator())
    slots = opt.get_slot_variables(emb)
    for i, variable in enumerate([emb] + slots):
        variable.save_to_file_system(str(tmp_path / f"v{i}"))
    saved = [_sorted(v) for v in [emb] + slots]
    fresh, fresh_opt = _train(native.NativeKVCreator(), steps=1)
    fresh_slots = fresh_opt.get_slot_variables(fresh)
    for i, variable in enumerate([fresh] + fresh_slots):
        variable.load_from_file_system(str(tmp_path / f"v{i}"))
    for variable, (keys, rows) in zip([fresh] + fresh_slots, saved):
        got_keys, got_rows = _sorted(variable)
        np.testing.assert_array_equal(got_keys, keys)
        np.testing.assert_array_equal(got_rows, rows)
    assert os.listdir(tmp_path)



def test_a_saved_model_holding_the_optimizer_saves_and_loads_its_slot_views(tmp_path):
    emb, opt = _train(native.NativeKVCreator())
    module = tf.Module()
    module.emb, module.opt = emb, opt
    module.serve = tf.function(lambda ids: emb.lookup(ids),
                               input_signature=[tf.TensorSpec([None], tf.int64)])
    tf.saved_model.save(module, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    keys, rows = _sorted(emb)
    np.testing.assert_array_equal(loaded.serve(tf.constant(keys)).numpy(), rows)


def test_a_view_left_by_a_destroyed_table_of_the_same_name_is_replaced():
    old = native.NativeKVTable(tf.int64, tf.float32, DIM, "same", shared_name="slots_same_name")
    native_slots.NativeSlotView(old, 0.0, "same/m")
    old.insert(_keys([1, 2, 3]), tf.ones([3, DIM]))
    tf.raw_ops.DestroyResourceOp(resource=old.resource_handle)   # the view still holds it
    new = native.NativeKVTable(tf.int64, tf.float32, DIM, "same", shared_name="slots_same_name")
    view = native_slots.NativeSlotView(new, 0.0, "same/m")
    native_slots.upsert_groups(new, _keys([7]), [tf.ones([1, DIM]), tf.fill([1, DIM], 2.0)],
                               [0, view.group])
    assert int(view.size()) == 1
    assert _rows(view) == {7: (2.0,) * DIM}
