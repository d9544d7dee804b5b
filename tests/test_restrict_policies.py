"""Restrict policies: status kept by training, eviction of the stalest / rarest keys."""

import time

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tfra_dynamic_embedding.online import restrict_policies

DIM = 4


def _variable(name, policy, devices=None):
    return de.Variable(dim=DIM, name=name, initializer=tf.random_normal_initializer(seed=1),
                       devices=devices, restrict_policy=policy)


def _train(var, opt, batches, use_function=False):
    def step(ids):
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(var, ids, return_trainable=True)
            loss = tf.reduce_sum(rows ** 2)
        opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])

    run = tf.function(step, reduce_retracing=True) if use_function else step
    for ids in batches:
        run(tf.constant(ids, tf.int64))


def _keys(var):
    keys, _ = var.export()
    return sorted(keys.numpy().tolist())


def test_frequency_policy_evicts_the_rarest_keys_from_variable_status_and_slots():
    var = _variable("freq_emb", de.FrequencyRestrictPolicy)
    policy = var.restrict_policy
    assert isinstance(policy, de.FrequencyRestrictPolicy) and policy.var is var
    assert policy.status.value_dtype == tf.int32 and policy.status.dim == 1
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
    common, rare = list(range(10)), list(range(100, 110))
    _train(var, opt, [common, common + rare, common + [0, 0]], use_function=True)
    counts = dict(zip(*[x.numpy().ravel().tolist() for x in policy.status.export()]))
    assert counts == {**{k: 3 for k in common}, **{k: 1 for k in rare}}   # repeats count once
    assert len(policy.params_in_slots) == 2           # Adam's m and v tables
    assert all(_keys(s) == common + rare for s in policy.params_in_slots)
    rows_before = dict(zip(*[x.numpy().tolist() for x in var.export()]))

    var.restrict(15, trigger=25)                      # 20 keys <= trigger: nothing happens
    assert int(var.size()) == 20
    var.restrict(12)                                  # the 8 rarest of the 10 rare ones go
    kept = _keys(var)
    assert len(kept) == 12 and set(common) <= set(kept)
    assert _keys(policy.status) == kept
    assert all(_keys(s) == kept for s in policy.params_in_slots)
    rows_after = dict(zip(*[x.numpy().tolist() for x in var.export()]))
    assert all(rows_after[k] == rows_before[k] for k in kept)    # survivors are untouched


def test_timestamp_policy_evicts_the_oldest_keys_per_shard():
    var = _variable("stamp_emb", de.TimestampRestrictPolicy, devices=["/CPU:0", "/CPU:1"])
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))
    old, new = list(range(20)), list(range(1000, 1020))
    _train(var, opt, [old])
    time.sleep(1.1)                                   # the status has a resolution of 1 s
    _train(var, opt, [new])
    stamps = dict(zip(*[x.numpy().ravel().tolist() for x in var.restrict_policy.status.export()]))
    assert min(stamps[k] for k in new) > max(stamps[k] for k in old)
    assert abs(max(stamps.values()) - time.time()) < 60
    var.restrict(20)                                  # 10 per shard, the newest there
    kept = _keys(var)
    assert int(var.size(0)) == 10 and int(var.size(1)) == 10
    shard_of = {k: int(s) for k, s in zip(
        new + old, de.default_partition_fn(tf.constant(new + old, tf.int64), 2).numpy())}
    for shard in (0, 1):
        mine = [k for k in kept if shard_of[k] == shard]
        newest = sorted((k for k in new + old if shard_of[k] == shard),
                        key=lambda k: -stamps[k])[:10]
        assert sorted(mine) == sorted(newest)
    assert _keys(var.restrict_policy.status) == kept


def test_restrict_in_a_graph_and_bad_arguments():
    graph = tf.Graph()
    with graph.as_default():
        var = de.get_variable("graph_emb", dim=DIM, restrict_policy=de.FrequencyRestrictPolicy)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows = de.embedding_lookup(var, ids)
        loss = tf.reduce_sum(rows ** 2)
        train = de.DynamicEmbeddingOptimizer(
            tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(loss)
        restrict = var.restrict(3)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch in ([1, 2, 3, 4, 5], [1, 2, 3], [1, 2]):
                sess.run(train, {ids: batch})
            assert sess.run(var.size()) == 5
            sess.run(restrict)
            keys = sess.run(var.export()[0])
            assert sorted(keys.tolist()) == [1, 2, 3]
    var = _variable("plain_emb", de.FrequencyRestrictPolicy)
    with pytest.raises(TypeError, match="num_reserved must be an int; got 2.5"):
        var.restrict(2.5)
    with pytest.raises(ValueError, match="num_reserved must be >= 0; got -1"):
        var.restrict(-1)
    with pytest.raises(TypeError, match="trigger"):
        var.restrict(2, trigger="3")
    with pytest.raises(TypeError, match="restrict_policy must be a de.RestrictPolicy"):
        de.Variable(dim=2, name="bad", restrict_policy="timestamp")
    no_policy = de.Variable(dim=2, name="free")
    assert no_policy.restrict_policy is None
    no_policy.upsert(tf.constant([1], tf.int64), tf.ones([1, 2]))
    no_policy.restrict(0)
    assert int(no_policy.size()) == 1
    with pytest.raises(ValueError, match="needs the built-in backend"):
        de.Variable(dim=1, value_dtype=tf.int32, kv_creator=de.NativeKVCreator())
    np.testing.assert_array_equal(
        de.Variable(dim=1, value_dtype=tf.int32).lookup(tf.constant([7], tf.int64)).numpy(),
        [[0]])


def test_status_is_checkpointed_with_the_variable(tmp_path):
    var = _variable("ckpt_emb", de.FrequencyRestrictPolicy)
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))
    _train(var, opt, [[1, 2, 3], [1, 2], [1]])
    path = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
    fresh = _variable("ckpt_emb_restored", de.FrequencyRestrictPolicy)
    tf.train.Checkpoint(emb=fresh).restore(path).assert_existing_objects_matched()
    counts = dict(zip(*[x.numpy().ravel().tolist() for x in fresh.restrict_policy.status.export()]))
    assert counts == {1: 3, 2: 2, 3: 1}
    fresh.restrict(1)
    assert _keys(fresh) == [1]


def test_keras_layer_passes_the_policy_and_model_fit_updates_the_status():
    layer = de.keras.layers.Embedding(DIM, name="restricted_layer",
                                      restrict_policy=de.FrequencyRestrictPolicy)
    inputs = tf.keras.Input(shape=(2,), dtype=tf.int64)
    outputs = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(layer(inputs)))
    model = tf.keras.Model(inputs, outputs)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.01)),
                  loss="mse")
    ids = np.array([[1, 2], [1, 3], [1, 2]], np.int64)
    model.fit(ids, np.ones([3, 1], np.float32), batch_size=3, epochs=2, verbose=0)
    policy = layer.params.restrict_policy
    counts = dict(zip(*[x.numpy().ravel().tolist() for x in policy.status.export()]))
    assert counts == {1: 2, 2: 2, 3: 2}                # one update per step and trained id
    layer.params.restrict(0)
    assert int(layer.params.size()) == 0 and int(policy.status.size()) == 0


def _statuses(policy):
    keys, values = policy.status.export()
    return dict(zip(keys.numpy().tolist(), values.numpy().ravel().tolist()))


def test_native_rows_keep_the_status_no_status_table():
    var = de.Variable(dim=DIM, name="rows_emb", kv_creator=de.NativeKVCreator(),
                      restrict_policy=de.FrequencyRestrictPolicy)
    policy = var.restrict_policy
    assert isinstance(policy.status, restrict_policies.RowStatus)
    assert policy.status.value_dtype == tf.int32 and policy.status.dim == 1
    assert policy.freq_var is policy.status              # TFRA's attribute name
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
    _train(var, opt, [[1, 2, 3], [1, 2], [1, 1]], use_function=True)
    assert _statuses(policy) == {1: 3, 2: 2, 3: 1}
    assert int(policy.status.waiting.size()) == 0      # training kept no second table
    np.testing.assert_array_equal(policy.status.lookup(tf.constant([[3, 1], [9, 2]], tf.int64)),
                                  [[[1], [3]], [[0], [2]]])
    # Every native row has a status: a row written by upsert counts one write.
    var.upsert(tf.constant([50], tf.int64), tf.ones([1, DIM]))
    assert _statuses(policy)[50] == 1 and int(policy.status.size()) == 4
    policy.apply_restriction(num_reserved=2, trigger=3)   # TFRA's argument names
    assert _keys(var) == [1, 2] and all(_keys(s) == [1, 2] for s in policy.params_in_slots)


@pytest.mark.parametrize("policy_class", [de.TimestampRestrictPolicy, de.FrequencyRestrictPolicy])
def test_apply_update_of_keys_without_rows(kv_creator, policy_class):
    """TFRA's own scenario: statuses of keys the variable does not hold yet."""
    var = de.Variable(dim=2, name="waiting_emb", initializer=-0.1, kv_creator=kv_creator)
    policy = policy_class(var)
    assert int(policy.status.size()) == 0
    policy.apply_update(tf.constant([0, 1, 2], tf.int64))
    assert int(policy.status.size()) == 3
    time.sleep(1.1)
    policy.apply_update(tf.constant([1, 2, 3, 3], tf.int64))
    assert int(policy.status.size()) == 4 and int(var.size()) == 0
    status = _statuses(policy)
    if policy_class is de.FrequencyRestrictPolicy:
        assert status == {0: 1, 1: 2, 2: 2, 3: 1}
    else:
        assert all(status[k] > status[0] for k in (1, 2, 3))
    # A key that was waiting and then gets a row: its status continues (counts add up).
    var.upsert(tf.constant([1], tf.int64), tf.ones([1, 2]))
    policy.after_write(tf.constant([1], tf.int64))   # what a training write-back does
    assert int(policy.status.size()) == 4
    if policy_class is de.FrequencyRestrictPolicy:
        assert _statuses(policy)[1] == 3
    var.upsert(tf.constant([7], tf.int64), tf.ones([1, 2]))
    policy.apply_update(tf.constant([7], tf.int64))    # a key with a row: one more update
    if policy_class is de.FrequencyRestrictPolicy:
        assert _statuses(policy)[7] == (2 if kv_creator.__class__ is de.NativeKVCreator else 1)
    np.testing.assert_array_equal(var.lookup(tf.constant([7], tf.int64)), [[1.0, 1.0]])


def test_native_restore_puts_saved_statuses_back_into_the_rows(tmp_path):
    def make(name, policy_class, kv_creator=None):
        return de.Variable(dim=DIM, name=name, kv_creator=kv_creator or de.NativeKVCreator(),
                           restrict_policy=policy_class)

    stamped = make("stamp_saved", de.TimestampRestrictPolicy)
    counted = make("count_saved", de.FrequencyRestrictPolicy)
    def sgd():
        return de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))

    _train(stamped, sgd(), [[1, 2, 3]])
    _train(counted, sgd(), [[1, 2, 3], [1, 2], [1]])
    path = tf.train.Checkpoint(a=stamped, b=counted).save(str(tmp_path / "ckpt"))
    saved_stamps = _statuses(stamped.restrict_policy)
    time.sleep(1.1)   # a restore writes rows at a later second: the saved stamps must win
    stamped2 = make("stamp_restored", de.TimestampRestrictPolicy)
    counted2 = make("count_restored", de.FrequencyRestrictPolicy)
    tf.train.Checkpoint(a=stamped2, b=counted2).restore(path).assert_existing_objects_matched()
    assert _statuses(stamped2.restrict_policy) == saved_stamps
    assert int(stamped2.restrict_policy.status.waiting.size()) == 0   # all in the rows
    assert int(counted2.restrict_policy.status.waiting.size()) == 0
    _train(counted2, sgd(), [[2, 3]])
    assert _statuses(counted2.restrict_policy) == {1: 3, 2: 3, 3: 2}
    # The same checkpoint entry as a status table's: it restores into the built-in backend.
    builtin = make("count_builtin", de.FrequencyRestrictPolicy, de.BuiltinKVCreator())
    tf.train.Checkpoint(b=builtin).restore(path).expect_partial()
    assert _statuses(builtin.restrict_policy) == {1: 3, 2: 2, 3: 1}


def test_native_status_in_a_v1_saver_checkpoint(tmp_path):
    prefix = str(tmp_path / "v1")
    for phase in ("save", "restore"):
        graph = tf.Graph()
        with graph.as_default():
            var = de.get_variable("v1_rows", dim=DIM, kv_creator=de.NativeKVCreator(),
                                  restrict_policy=de.FrequencyRestrictPolicy)
            assert isinstance(var.restrict_policy.status, restrict_policies.RowStatus)
            ids = tf.compat.v1.placeholder(tf.int64, [None])
            loss = tf.reduce_sum(de.embedding_lookup(var, ids) ** 2)
            train = de.DynamicEmbeddingOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(0.1)).minimize(loss)
            export = var.restrict_policy.status.export()
            saver = tf.compat.v1.train.Saver()
            size = var.restrict_policy.status.size()
            init = tf.compat.v1.global_variables_initializer()
            graph.finalize()   # as in a MonitoredTrainingSession: size() is the op built before
            assert var.restrict_policy.status.size() is size
            with tf.compat.v1.Session() as sess:
                sess.run(init)
                if phase == "save":
                    for batch in ([5, 6], [5]):
                        sess.run(train, {ids: batch})
                    saver.save(sess, prefix)
                else:
                    saver.restore(sess, prefix)
                    sess.run(train, {ids: [6]})
                keys, values = sess.run(export)
                statuses = dict(zip(keys.tolist(), values.ravel().tolist()))
                assert sess.run(size) == 2
        assert statuses == ({5: 2, 6: 1} if phase == "save" else {5: 2, 6: 2})


def test_native_status_in_a_saved_model(tmp_path):
    def make(name):
        return de.Variable(dim=DIM, name=name, kv_creator=de.NativeKVCreator(),
                           restrict_policy=de.FrequencyRestrictPolicy)

    var = make("sm_rows")
    _train(var, de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1)), [[1, 2], [1]])
    module = tf.Module()
    module.var = var
    module.lookup = tf.function(lambda k: var.lookup(k),
                                input_signature=[tf.TensorSpec([None], tf.int64)])
    path = str(tmp_path / "sm")
    tf.saved_model.save(module, path)
    keys = tf.constant([1, 2, 3], tf.int64)
    np.testing.assert_array_equal(tf.saved_model.load(path).lookup(keys), var.lookup(keys))
    # The SavedModel's variables are a checkpoint: the statuses come back into fresh rows.
    fresh = make("sm_rows_restored")
    tf.train.Checkpoint(var=fresh).restore(
        str(tmp_path / "sm" / "variables" / "variables")).expect_partial()
    assert _statuses(fresh.restrict_policy) == {1: 2, 2: 1}
    assert int(fresh.restrict_policy.status.waiting.size()) == 0
