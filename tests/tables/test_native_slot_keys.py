"""A slot's keys are the keys its optimizer trained (TFRA 0.8.1: slots are tables of their own).

Slots kept in their variable's native records share the variable's keys; each record notes
which slot groups were written for its key (cc/ops/de_slab.h), and a slot's size, exports,
files and checkpoint entries hold only those keys.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfra_dynamic_embedding as de
from tests.conftest import CPUS
from tfra_dynamic_embedding.tables import native
from tfra_dynamic_embedding.tables import native_slots

pytestmark = pytest.mark.skipif(not native.is_available(), reason="native ops not built")

DIM = 4
ALL = list(range(1, 11))     # keys upserted into the variable
TRAINED = [1, 2, 3]          # keys the optimizer trains


def _creator(backend, saver=None):
    if saver is not None:
        return de.CuckooHashTableCreator(saver=saver)
    return native.NativeKVCreator() if backend == "native" else de.BuiltinKVCreator()


def _variable(kv_creator, name="sk_emb", devices=None, **kwargs):
    var = de.Variable(dim=DIM, initializer=0.1, kv_creator=kv_creator, devices=devices or CPUS[:2],
                      name=name, **kwargs)
    var.upsert(tf.constant(ALL, tf.int64), tf.fill([len(ALL), DIM], 0.5))
    return var


def _keras_step(var, opt, ids=TRAINED):
    with tf.GradientTape() as tape:
        rows, wrapper = de.embedding_lookup(var, tf.constant(ids, tf.int64), return_trainable=True)
        loss = tf.reduce_sum(rows ** 2)
    opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])


def _keras_trained(kv_creator, name="sk_emb", steps=2, **kwargs):
    var = _variable(kv_creator, name, **kwargs)
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1, name="sk_adam"))
    for _ in range(steps):
        _keras_step(var, opt)
    return var, opt


def _keys_of(variable):
    return sorted(variable.export()[0].numpy().tolist())


def _sorted_rows(variable):
    keys, values = variable.export()
    order = np.argsort(keys.numpy())
    return keys.numpy()[order], values.numpy()[order]


def _check_slots(var, slots, want_slots=2):
    assert len(slots) == want_slots
    assert int(var.size()) == len(ALL) and _keys_of(var) == ALL
    for slot in slots:
        assert int(slot.size()) == len(TRAINED), slot.name
        assert _keys_of(slot) == TRAINED, slot.name


# -- every optimizer family, both backends --------------------------------------------------------

@pytest.mark.parametrize("backend", ["native", "builtin"])
def test_keras_adam_slots_hold_only_the_trained_keys(backend):
    var, opt = _keras_trained(_creator(backend))
    slots = opt.get_slot_variables(var)
    _check_slots(var, slots)
    assert var.get_slot_variables(opt) == slots            # TFRA's way
    if backend == "native":
        assert var.slot_groups(slots) == [1, 2]             # in the variable's records
    for slot in slots:
        # Untrained keys are missing from the slot; a lookup gives them its start value.
        rows, exists = slot.lookup(tf.constant([1, 5], tf.int64), return_exists=True)
        np.testing.assert_array_equal(exists.numpy(), [True, False])
        np.testing.assert_array_equal(rows.numpy()[1], np.zeros(DIM))   # Adam's fill
        np.testing.assert_array_equal(slot.contains(tf.constant([3, 4], tf.int64)).numpy(),
                                      [True, False])
        assert sum(int(t.size()) for t in slot.tables) == len(TRAINED)


def test_native_slot_views_list_only_trained_keys_in_every_export():
    var, opt = _keras_trained(_creator("native"), devices=CPUS[:1])
    for slot in opt.get_slot_variables(var):
        view = slot.shards.tables[0]
        assert isinstance(view, native_slots.NativeSlotView)
        keys, values, stamps, freqs = view.export_with_meta()
        assert sorted(keys.numpy().tolist()) == TRAINED
        assert values.shape == [3, DIM] and stamps.shape == [3] and freqs.shape == [3]
        chunks = list(view.export_chunks(chunk_size=2))
        assert sorted(k for c in chunks for k in c[0].numpy().tolist()) == TRAINED
        assert [int(tf.size(c[0])) for c in chunks] == [2, 1]
        assert sorted(slot.tables[0].export()[0].numpy().tolist()) == TRAINED  # TFRA's table view


@pytest.mark.parametrize("eager", [True, False])
def test_v1_adam_slots_hold_only_the_trained_keys(eager):
    def build():
        var = _variable(_creator("native"), "sk_v1")
        opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
        return var, opt

    if eager:
        var, opt = build()
        for _ in range(2):
            _keras_step(var, opt)
        _check_slots(var, opt.get_slot_variables(var))
        return
    graph = tf.Graph()
    with graph.as_default():
        var = de.Variable(dim=DIM, initializer=0.1, kv_creator=_creator("native"),
                          devices=CPUS[:2], name="sk_v1")
        fill = var.upsert(tf.constant(ALL, tf.int64), tf.fill([len(ALL), DIM], 0.5))
        rows = de.embedding_lookup(var, tf.constant(TRAINED, tf.int64))
        opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
        train = opt.minimize(tf.reduce_sum(rows ** 2))
        slots = opt.get_slot_variables(var)
        sizes = [var.size()] + [s.size() for s in slots]
        keys = [var.export()[0]] + [s.export()[0] for s in slots]
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(fill)
            for _ in range(2):
                sess.run(train)
            got_sizes, got_keys = sess.run([sizes, keys])
    assert len(slots) == 2
    assert got_sizes == [len(ALL), len(TRAINED), len(TRAINED)]
    assert [sorted(k.tolist()) for k in got_keys] == [ALL, TRAINED, TRAINED]


def test_bp_v2_writes_slots_through_the_views_and_marks_only_trained_keys():
    var, opt = _keras_trained(_creator("native"), name="sk_bp", bp_v2=True)
    slots = opt.get_slot_variables(var)
    assert var.slot_groups(slots) == [1, 2]
    _check_slots(var, slots)


# -- checkpoints and files ----------------------------------------------------------------------

def test_checkpoint_holds_and_restores_only_the_trained_keys_of_slots(tmp_path):
    var, opt = _keras_trained(_creator("native"))
    saved = [_sorted_rows(v) for v in [var] + opt.get_slot_variables(var)]
    path = tf.train.Checkpoint(emb=var, opt=opt).write(str(tmp_path / "ckpt"))
    reader = tf.train.load_checkpoint(path)
    slot_keys = [name for name, _ in tf.train.list_variables(path)
                 if "de_slot" in name and name.endswith("/keys")]
    assert len(slot_keys) == 2
    for name in slot_keys:
        assert sorted(reader.get_tensor(name).tolist()) == TRAINED, name

    # A fresh model whose optimizer trained another key first: the restore replaces it all.
    fresh, fresh_opt = _keras_trained(_creator("native"), steps=0)
    _keras_step(fresh, fresh_opt, ids=[42])
    tf.train.Checkpoint(emb=fresh, opt=fresh_opt).read(path).assert_consumed()
    fresh_slots = fresh_opt.get_slot_variables(fresh)
    _check_slots(fresh, fresh_slots)
    for variable, (keys, rows) in zip([fresh] + fresh_slots, saved):
        got_keys, got_rows = _sorted_rows(variable)
        np.testing.assert_array_equal(got_keys, keys)
        np.testing.assert_array_equal(got_rows, rows)


def test_a_checkpoint_restored_before_the_slots_exist_gives_them_the_trained_keys(tmp_path):
    var, opt = _keras_trained(_creator("native"))
    path = tf.train.Checkpoint(emb=var, opt=opt).write(str(tmp_path / "ckpt"))
    fresh = de.Variable(dim=DIM, initializer=0.1, kv_creator=_creator("native"),
                        devices=CPUS[:2], name="sk_emb")
    fresh_opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1, name="sk_adam"))
    tf.train.Checkpoint(emb=fresh, opt=fresh_opt).read(path)
    _keras_step(fresh, fresh_opt, ids=[3])          # makes the slots: the restore fills them
    _check_slots(fresh, fresh_opt.get_slot_variables(fresh))


def test_file_system_saver_files_hold_only_the_trained_keys_of_slots(tmp_path):
    saver = de.FileSystemSaver()
    var, opt = _keras_trained(_creator("native", saver))
    slots = opt.get_slot_variables(var)
    assert var.slot_groups(slots) == [1, 2]
    saved = [_sorted_rows(v) for v in [var] + slots]
    path = tf.train.Checkpoint(emb=var, opt=opt).write(str(tmp_path / "ckpt"))

    fresh, fresh_opt = _keras_trained(_creator("native", de.FileSystemSaver()), steps=0)
    _keras_step(fresh, fresh_opt, ids=[42])
    tf.train.Checkpoint(emb=fresh, opt=fresh_opt).read(path)
    fresh_slots = fresh_opt.get_slot_variables(fresh)
    _check_slots(fresh, fresh_slots)
    for variable, (keys, rows) in zip([fresh] + fresh_slots, saved):
        got_keys, got_rows = _sorted_rows(variable)
        np.testing.assert_array_equal(got_keys, keys)
        np.testing.assert_array_equal(got_rows, rows)

    # The slot files themselves: save_to_file_system / load_from_file_system of each variable.
    for i, variable in enumerate([var] + slots):
        variable.save_to_file_system(str(tmp_path / f"v{i}"))
    other, other_opt = _keras_trained(_creator("native"), steps=0)
    _keras_step(other, other_opt, ids=[42])
    other_slots = other_opt.get_slot_variables(other)
    for i, variable in enumerate([other] + other_slots):
        variable.load_from_file_system(str(tmp_path / f"v{i}"))
    _check_slots(other, other_slots)
    staging = native.NativeKVCreator().create(tf.int64, tf.float32, DIM, "sk_staging")
    for table in slots[0].shards.tables:
        table.save_to(str(tmp_path / "one_shard"))
        staging.load_from(str(tmp_path / "one_shard"))
        assert int(staging.size()) == int(table.size())
        assert sorted(staging.export()[0].numpy().tolist()) == sorted(
            table.export()[0].numpy().tolist())


# -- the written marks through the table's own operations -----------------------------------------

LAYOUTS = [(tf.int64, tf.float32), (tf.int32, tf.float64), (tf.string, tf.float16),
           (tf.int64, tf.bfloat16)]


def _k(key_dtype, values):
    values = list(values)
    if key_dtype == tf.string:
        return tf.constant([f"key{v}" for v in values], tf.string)
    return tf.constant(values, key_dtype)


def _view_keys(view, key_dtype):
    keys = view.export()[0].numpy().tolist()
    if key_dtype == tf.string:
        return sorted(int(k.decode()[3:]) for k in keys)
    return sorted(keys)


@pytest.mark.parametrize("key_dtype,value_dtype", LAYOUTS)
def test_marks_survive_widening_compaction_growth_and_eviction(key_dtype, value_dtype):
    table = native.NativeKVCreator(num_shards=2).create(key_dtype, value_dtype, 3, "marks")
    m = native_slots.NativeSlotView(table, 0.0, "marks/m")
    table.set_step(1)
    n = 3000
    table.insert(_k(key_dtype, range(n)), tf.ones([n, 3], value_dtype))
    written = list(range(0, n, 3))
    native_slots.upsert_groups(table, _k(key_dtype, written),
                               [tf.ones([len(written), 3], value_dtype)] * 2, [0, m.group])
    assert int(m.size()) == len(written)
    # A new group widens every record; the marks of group 1 stay, group 2 has none.
    v = native_slots.NativeSlotView(table, 0.5, "marks/v")
    assert int(m.size()) == len(written) and int(v.size()) == 0
    assert _view_keys(m, key_dtype) == written
    # Removals compact the shards (rows move); the index grows with new keys (rehash).
    gone = [k for k in range(n) if k % 2 == 0]
    table.remove(_k(key_dtype, gone))
    written = [k for k in written if k % 2 == 1]
    assert int(m.size()) == len(written) and _view_keys(m, key_dtype) == written
    more = list(range(n, 3 * n))
    native_slots.upsert_groups(table, _k(key_dtype, more),
                               [tf.ones([len(more), 3], value_dtype)] * 2, [0, v.group])
    assert _view_keys(m, key_dtype) == written
    assert int(v.size()) == len(more) and _view_keys(v, key_dtype) == more
    # A TTL sweep removes keys with their marks.
    table.set_step(100)
    native_slots.upsert_groups(table, _k(key_dtype, written[:10]),
                               [tf.ones([10, 3], value_dtype)], [0])
    table.evict(min_stamp=100)
    assert int(table.size()) == 10
    assert int(m.size()) == 10 and _view_keys(m, key_dtype) == written[:10]
    assert int(v.size()) == 0 and _view_keys(v, key_dtype) == []


def test_a_bounded_table_counts_the_marks_of_the_keys_it_evicts():
    table = native.NativeKVCreator(num_shards=1).create(tf.int64, tf.float32, 2, "bounded")
    m = native_slots.NativeSlotView(table, 0.0, "bounded/m")
    table.set_bound(10, 0, "lru")
    for step in range(5):
        table.set_step(step)
        keys = tf.range(step * 6, step * 6 + 6, dtype=tf.int64)
        groups = [0, m.group] if step % 2 == 0 else [0]
        native_slots.upsert_groups(table, keys, [tf.ones([6, 2])] * len(groups), groups)
    assert int(table.size()) == 10
    keys = sorted(m.export()[0].numpy().tolist())
    assert int(m.size()) == len(keys) and keys == list(range(24, 30))


def test_writes_of_rows_leave_slots_unwritten_and_imports_keep_or_set_marks():
    table = native.NativeKVCreator().create(tf.int64, tf.float32, 2, "imports")
    m = native_slots.NativeSlotView(table, 0.0, "imports/m")
    table.insert(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
    table.accum(tf.constant([2, 3], tf.int64), tf.ones([2, 2]))
    table.find_or_insert(tf.constant([4], tf.int64), native.NativeInitializer("constant", 1.0))
    assert int(table.size()) == 4 and int(m.size()) == 0
    m.accum(tf.constant([2], tf.int64), tf.ones([1, 2]))
    m.insert(tf.constant([5], tf.int64), tf.ones([1, 2]))
    assert sorted(m.export()[0].numpy().tolist()) == [2, 5]
    # Restoring rows keeps the marks of the keys that stay; restoring a slot sets them.
    table.import_(tf.constant([2, 3, 6], tf.int64), tf.zeros([3, 2]))
    assert sorted(m.export()[0].numpy().tolist()) == [2] and int(m.size()) == 1
    m.import_(tf.constant([3, 7], tf.int64), tf.ones([2, 2]))
    assert sorted(m.export()[0].numpy().tolist()) == [3, 7] and int(m.size()) == 2
    assert int(table.size()) == 4


def test_the_written_mask_costs_no_record_bytes_without_slots():
    def record_bytes(key_dtype, value_dtype, slots):
        table = native.NativeKVCreator(num_shards=1).create(key_dtype, value_dtype, 16, "bytes")
        for i in range(slots):
            native_slots.NativeSlotView(table, 0.0, f"bytes/s{i}")
        table.insert(tf.zeros([1], key_dtype), tf.zeros([1, 16], value_dtype))
        parts = table.memory_parts()
        return int(parts["records"]) // int(parts["rows"])

    row = 16 * 4
    assert record_bytes(tf.int64, tf.float32, 0) == 8 + 8 + row     # key, stamp + freq, row
    # With slots, the mask takes the padding after freq where there is some (int32 keys,
    # 8-byte values) and else 2 bytes at the record's end, aligned up.
    assert record_bytes(tf.int32, tf.float64, 2) == 16 + 3 * 2 * row
    assert record_bytes(tf.int64, tf.float32, 2) == 8 + 8 + 3 * row + 8
