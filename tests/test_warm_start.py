"""de.warm_start / de.WarmStartHook: fill de.Variables from another model's checkpoint."""

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS

DIM = 4
COLLECTION = de.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES


def _rows(n=60, seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.choice(10**12, size=n, replace=False).astype(np.int64) - 5 * 10**11
    return keys, rng.normal(size=(n, DIM)).astype(np.float32)


def _saved(prefix, names_and_rows, devices=CPUS[:2], kv_creator=None, var_list=None):
    """Graph mode: one variable per (name, (keys, values)), filled and saved by a v1 Saver."""
    with tf.Graph().as_default():
        variables = [de.get_variable(name, dim=DIM, devices=devices, kv_creator=kv_creator)
                     for name, _ in names_and_rows]
        writes = [v.upsert(k, x) for v, (_, (k, x)) in zip(variables, names_and_rows)]
        saver = tf.compat.v1.train.Saver(var_list=variables if var_list else None)
        with tf.compat.v1.Session() as sess:
            sess.run(writes)
            return saver.save(sess, prefix)


def _sorted(keys, values):
    order = np.argsort(keys)
    return keys[order], values[order]


def _assert_holds(sess, variable, keys, values):
    """`variable` holds exactly these rows (nothing more, nothing else)."""
    got = _sorted(*sess.run(variable.export()))
    want = _sorted(keys, values)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_warm_start_into_fresh_graph_equals_saved_rows(kv_creator, tmp_path):
    keys, values = _rows()
    prefix = _saved(str(tmp_path / "ckpt"), [("user", (keys, values))], kv_creator=kv_creator)
    with tf.Graph().as_default():
        w = de.get_variable("user", dim=DIM, devices=CPUS[:2], initializer=7.0,
                            kv_creator=kv_creator)
        stale = w.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, DIM]))  # replaced
        restore = de.warm_start(prefix, vars_to_warm_start=[w])
        with tf.compat.v1.Session() as sess:
            sess.run(stale)
            sess.run(restore)
            _assert_holds(sess, w, keys, values)
            np.testing.assert_array_equal(sess.run(de.embedding_lookup(w, keys)), values)


@pytest.mark.parametrize("shards_before, shards_after", [(2, 3), (3, 1)])
def test_warm_start_reshards(tmp_path, shards_before, shards_after):
    keys, values = _rows(n=90)
    prefix = _saved(str(tmp_path / "ckpt"), [("user", (keys, values))],
                    devices=CPUS[:shards_before])
    with tf.Graph().as_default():
        w = de.get_variable("user", dim=DIM, devices=CPUS[:shards_after], initializer=-1.0)
        restore = de.warm_start(prefix, [w])
        with tf.compat.v1.Session() as sess:
            sess.run(restore)
            _assert_holds(sess, w, keys, values)
            # every key sits on the shard the partitioner picks, so lookups find all of them
            sizes = sess.run([w.size(index=i) for i in range(shards_after)])
            assert sizes == [int(np.sum(np.mod(keys, shards_after) == i))
                             for i in range(shards_after)]
            np.testing.assert_array_equal(sess.run(w.lookup(keys)), values)


def test_warm_start_from_tfras_per_shard_tables(tmp_path):
    """TFRA's layout, one entry per shard table (`<name>_mht_<i>of<n>-keys`), 2 shards -> 3."""
    keys, values = _rows(n=40)
    names, tensors = [], []
    for i in range(2):
        mine = np.mod(keys, 2) == i
        names += [f"user_mht_{i + 1}of2-keys", f"user_mht_{i + 1}of2-values"]
        tensors += [tf.constant(keys[mine]), tf.constant(values[mine])]
    prefix = str(tmp_path / "tfra")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * 4,
                      tensors=tensors)
    with tf.Graph().as_default():
        w = de.get_variable("user", dim=DIM, devices=CPUS[:3])
        restore = de.warm_start(prefix, [w])
        with tf.compat.v1.Session() as sess:
            sess.run(restore)
            _assert_holds(sess, w, keys, values)
            np.testing.assert_array_equal(sess.run(w.lookup(keys)), values)


def test_warm_start_slot_variables(tmp_path):
    """An Adam-trained embedding and its m / v slots, warm-started into a renamed model."""
    ids = np.array([3, -8, 12, 3, 40], np.int64)
    prefix = str(tmp_path / "ckpt")

    def build(name):
        with tf.compat.v1.variable_scope("ctr"):
            w = de.get_variable(name, dim=DIM, devices=CPUS[:2],
                                initializer=tf.compat.v1.random_normal_initializer(seed=1))
        loss = tf.reduce_sum(tf.square(de.embedding_lookup(w, ids)))
        opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
        return w, opt, opt.minimize(loss)

    with tf.Graph().as_default():
        w, opt, train = build("user")
        slots = w.get_slot_variables(opt)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            want = sess.run([v.export() for v in [w] + slots])
            saver.save(sess, prefix)
    assert len(slots) == 2 and all(len(k) == 4 for k, _ in want)

    with tf.Graph().as_default():
        w, opt, train = build("user_v2")
        slots = w.get_slot_variables(opt)
        # renaming the embedding renames its slots (ctr/user_v2/Adam/m <- ctr/user/Adam/m)
        restore = de.warm_start(prefix, [w] + slots, {"ctr/user_v2": "ctr/user"})
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(restore)
            for variable, (keys, values) in zip([w] + slots, want):
                _assert_holds(sess, variable, keys, values)
            # the slots are non-trivial: m and v differ from each other and from the rows
            assert not np.array_equal(_sorted(*want[1])[1], _sorted(*want[2])[1])


def test_selection_by_regex_list_and_none(tmp_path):
    rows = {name: _rows(n=10, seed=i) for i, name in enumerate(["user", "item", "usage"])}
    prefix = _saved(str(tmp_path / "ckpt"), list(rows.items()))
    for selection, chosen in [("us.*", {"user", "usage"}), (["item", "^usa"], {"item", "usage"}),
                              (None, {"user", "item", "usage"}), (".*", {"user", "item", "usage"})]:
        with tf.Graph().as_default():
            variables = {name: de.get_variable(name, dim=DIM, devices=CPUS[:2])
                         for name in rows}
            for v in variables.values():
                tf.compat.v1.add_to_collection(COLLECTION, v)
            tf.compat.v1.add_to_collection(COLLECTION, variables["user"])  # twice: once restored
            restore = de.warm_start(prefix, selection)
            with tf.compat.v1.Session() as sess:
                sess.run(restore)
                sizes = {name: sess.run(v.size()) for name, v in variables.items()}
                assert sizes == {name: 10 if name in chosen else 0 for name in rows}, selection
                for name in chosen:
                    _assert_holds(sess, variables[name], *rows[name])


def test_saver_var_list_names_each_variable(tmp_path):
    """`Saver(var_list=[a, b])` (as TFRA's tests save) keeps both variables apart."""
    a_rows, b_rows = _rows(n=10, seed=1), _rows(n=12, seed=2)
    prefix = _saved(str(tmp_path / "ckpt"), [("a", a_rows), ("b", b_rows)], var_list=True)
    names = {name for name, _ in tf.train.list_variables(prefix)}
    assert names == {"a-keys", "a-values", "b-keys", "b-values"}
    with tf.Graph().as_default():
        a = de.get_variable("a", dim=DIM, devices=CPUS[:3])
        b = de.get_variable("b", dim=DIM)
        restore = de.warm_start(prefix, [a, b])
        with tf.compat.v1.Session() as sess:
            sess.run(restore)
            _assert_holds(sess, a, *a_rows)
            _assert_holds(sess, b, *b_rows)


def test_variable_not_in_checkpoint_is_an_error_naming_it(tmp_path):
    prefix = _saved(str(tmp_path / "ckpt"), [("user", _rows(n=5))])
    with tf.Graph().as_default():
        user = de.get_variable("user", dim=DIM)
        other = de.get_variable("not_saved", dim=DIM)
        with pytest.raises(tf.errors.NotFoundError, match=r"'not_saved' is not in checkpoint .*"
                                                          r"entries: \[user\]") as raised:
            de.warm_start(prefix, [user, other])
        assert isinstance(raised.value, ValueError)
        with pytest.raises(ValueError, match=r"'user' \(previous name 'gone'\) is not in"):
            de.warm_start(prefix, [user], {"user": "gone"})


def test_mismatched_dim_or_dtype_is_an_error(tmp_path):
    prefix = _saved(str(tmp_path / "ckpt"), [("user", _rows(n=5))])
    with tf.Graph().as_default():
        wide = de.get_variable("user", dim=DIM + 1)
        with pytest.raises(ValueError, match=r"'user-values' has shape \[5, 4\]; "
                                             r"de.Variable 'user' has dim 5"):
            de.warm_start(prefix, [wide])
    with tf.Graph().as_default():
        strings = de.get_variable("user", key_dtype=tf.string, dim=DIM)
        with pytest.raises(ValueError, match=r"'user-keys' has dtype int64; .* needs string"):
            de.warm_start(prefix, [strings])


def test_bad_arguments_name_the_argument(tmp_path):
    prefix = _saved(str(tmp_path / "ckpt"), [("user", _rows(n=5))])
    with tf.Graph().as_default():
        w = de.get_variable("user", dim=DIM)
        with pytest.raises(ValueError, match=r"vars_to_warm_start must be .*; got 42"):
            de.warm_start(prefix, 42)
        with pytest.raises(ValueError, match=r"vars_to_warm_start as a list .*'user'"):
            de.warm_start(prefix, [w, "user"])
        with pytest.raises(ValueError, match=r"vars_to_warm_start: '\(' is not a valid regex"):
            de.warm_start(prefix, "(")
        with pytest.raises(ValueError, match=r"var_name_to_prev_var_name must be a dict"):
            de.warm_start(prefix, [w], ["user"])
        missing = str(tmp_path / "nothing_here")
        with pytest.raises(ValueError, match=r"ckpt_to_initialize_from=.*nothing_here.* names no "
                                             r"checkpoint"):
            de.warm_start(missing, [w])
        with pytest.raises(ValueError, match=r"ckpt_to_initialize_from must be"):
            de.warm_start(None, [w])


def test_hook_in_monitored_training_session(tmp_path):
    keys, values = _rows(n=30)
    _saved(str(tmp_path / "old" / "model.ckpt"), [("user", (keys, values))])
    with tf.Graph().as_default():
        w = de.get_variable("user", dim=DIM, devices=CPUS[:3])
        tf.compat.v1.add_to_collection(COLLECTION, w)
        tf.compat.v1.train.get_or_create_global_step()
        lookup, size = de.embedding_lookup(w, keys), w.size()
        # a directory: its latest checkpoint is read
        hook = de.WarmStartHook(str(tmp_path / "old"), ".*user")
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
            np.testing.assert_array_equal(sess.run(lookup), values)
            assert sess.run(size) == 30


def test_tf2_checkpoint_by_object_path(tmp_path):
    """Eagerly, from a tf.train.Checkpoint: the previous name is the object path."""
    keys, values = _rows(n=20)
    source = de.Variable(dim=DIM, devices=CPUS[:2], name="user")
    source.upsert(keys, values)
    path = tf.train.Checkpoint(model=tf.Module(), emb=source).save(str(tmp_path / "c"))
    target = de.Variable(dim=DIM, devices=CPUS[:3], name="user_v2")
    assert de.warm_start(path, [target], {"user_v2": "emb"}) is None
    got = _sorted(*(t.numpy() for t in target.export()))
    want = _sorted(keys, values)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
