"""Lookups equal their tf.nn namesakes on a dense table holding the same rows."""

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tests.conftest import CPUS

VOCAB, DIM = 50, 6


@pytest.fixture
def tables(kv_creator):
    """(de.Variable over 3 shards, the dense tf.Variable with the same rows for ids 0..VOCAB-1)."""
    rng = np.random.default_rng(0)
    dense = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
    w = de.Variable(dim=DIM, devices=CPUS[:3], kv_creator=kv_creator)
    w.upsert(tf.range(VOCAB, dtype=tf.int64), dense)
    return w, tf.constant(dense)


def _sparse(rows, dense_shape, dtype=tf.int64, values=None):
    """SparseTensor from {(row, col,...): id} pairs in row-major order."""
    indices = sorted(rows)
    vals = [rows[i] for i in indices] if values is None else values
    return tf.SparseTensor(tf.constant(indices, tf.int64, shape=[len(indices), len(dense_shape)]),
                           tf.constant(vals, dtype), dense_shape)


@pytest.mark.parametrize("shape", [[7], [3, 4], [2, 3, 2]])
@pytest.mark.parametrize("max_norm", [None, 1.0])
def test_embedding_lookup_matches_tf_nn(tables, shape, max_norm):
    w, dense = tables
    ids = tf.constant(np.random.default_rng(1).integers(0, VOCAB, size=shape), tf.int64)
    got = de.embedding_lookup(w, ids, max_norm=max_norm)
    want = tf.nn.embedding_lookup(dense, ids, max_norm=max_norm)
    assert got.shape == want.shape == tuple(shape) + (DIM,)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)


def test_embedding_lookup_unique_is_tfras_name_for_the_deduplicating_lookup(tables):
    w, dense = tables
    ids = tf.constant([[3, 7, 3], [7, 7, 1]], tf.int64)
    got, wrapper = de.embedding_lookup_unique(w, ids, return_trainable=True)
    np.testing.assert_allclose(got.numpy(), tf.nn.embedding_lookup(dense, ids).numpy(),
                               rtol=1e-6)
    assert sorted(wrapper.batch_ids().numpy().tolist()) == [1, 3, 7]   # each id fetched once


@pytest.mark.parametrize("combiner", ["mean", "sqrtn", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_lookup_sparse_matches_tf_nn(tables, combiner, weighted):
    w, dense = tables
    entries = {(0, 0): 3, (0, 1): 3, (0, 2): 9, (2, 0): 40, (3, 0): 1, (3, 1): 49, (3, 2): 0}
    sp_ids = _sparse(entries, [5, 3])  # row 1 and row 4 are empty
    sp_weights = None
    if weighted:
        sp_weights = tf.SparseTensor(sp_ids.indices, [0.5, 2.0, 1.0, 3.0, 0.25, 1.5, 4.0], [5, 3])
    got = de.embedding_lookup_sparse(w, sp_ids, sp_weights, combiner=combiner)
    want = tf.nn.embedding_lookup_sparse(dense, sp_ids, sp_weights, combiner=combiner)
    assert got.shape.as_list() == want.shape.as_list()
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    # a plain numpy reference for one pooled row
    rows = dense.numpy()[[3, 3, 9]]
    weights = np.array([0.5, 2.0, 1.0]) if weighted else np.ones(3)
    pooled = (rows * weights[:, None]).sum(0)
    pooled /= {"sum": 1.0, "mean": weights.sum(), "sqrtn": np.sqrt((weights ** 2).sum())}[combiner]
    np.testing.assert_allclose(got.numpy()[0], pooled, rtol=1e-5)


@pytest.mark.parametrize("combiner", ["mean", "sqrtn", "sum"])
@pytest.mark.parametrize("default_id", [None, 7])
@pytest.mark.parametrize("weighted", [False, True])
def test_safe_embedding_lookup_sparse_matches_tf_nn(tables, combiner, default_id, weighted):
    w, dense = tables
    # Row 1 is empty, row 2 has only a negative id (-1: a key here and in TFRA, pruned by
    # tf.nn), row 4 only a zero weight.
    entries = {(0, 0): 3, (0, 1): 5, (2, 0): -1, (3, 0): 11, (3, 1): 12, (4, 0): 20}
    sp_ids = _sparse(entries, [5, 2])
    w.upsert(tf.constant([-1], tf.int64), tf.fill([1, DIM], 0.25))
    weights = None
    if weighted:
        weights = tf.SparseTensor(sp_ids.indices, [1.0, 2.0, 1.0, 0.5, -1.0, 0.0], [5, 2])
    got = de.safe_embedding_lookup_sparse(w, sp_ids, weights, combiner=combiner,
                                          default_id=default_id)
    want = tf.nn.safe_embedding_lookup_sparse(dense, sp_ids, weights, combiner=combiner,
                                              default_id=default_id).numpy()
    want[2] = w.lookup(tf.constant([-1], tf.int64)).numpy()[0]   # one id of weight 1
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
    empty_row = got.numpy()[1]
    if default_id is None:
        np.testing.assert_array_equal(empty_row, np.zeros(DIM))
    else:
        np.testing.assert_allclose(empty_row, dense.numpy()[default_id], rtol=1e-6)


def test_safe_embedding_lookup_sparse_n_dimensional(tables):
    w, dense = tables
    entries = {(0, 0, 0): 1, (0, 0, 1): 2, (0, 1, 0): 3, (1, 1, 0): 4, (1, 1, 2): 44}
    sp_ids = _sparse(entries, [2, 2, 3])
    got = de.safe_embedding_lookup_sparse(w, sp_ids, None, combiner="sqrtn")
    want = tf.nn.safe_embedding_lookup_sparse(dense, sp_ids, None, combiner="sqrtn")
    assert got.shape == (2, 2, DIM)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got.numpy()[1, 0], np.zeros(DIM))


def test_safe_lookup_with_no_ids_at_all(tables):
    w, _ = tables
    sp_ids = tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64), [3, 4])
    got = de.safe_embedding_lookup_sparse(w, sp_ids)
    np.testing.assert_array_equal(got.numpy(), np.zeros([3, DIM]))


def test_lookups_do_not_insert_and_use_initializer(kv_creator):
    w = de.Variable(dim=2, initializer=2.0, devices=CPUS[:2], kv_creator=kv_creator)
    sp_ids = _sparse({(0, 0): 100, (0, 1): 101, (1, 0): 102}, [2, 2])
    pooled = de.embedding_lookup_sparse(w, sp_ids, None, combiner="sum")
    np.testing.assert_array_equal(pooled.numpy(), [[4, 4], [2, 2]])
    de.embedding_lookup(w, tf.constant([5, 6], tf.int64))
    de.safe_embedding_lookup_sparse(w, sp_ids, default_id=9)
    assert int(w.size()) == 0


def test_string_keys(kv_creator):
    w = de.Variable(key_dtype=tf.string, dim=2, devices=CPUS[:2], kv_creator=kv_creator)
    w.upsert(tf.constant(["a", "b"]), tf.constant([[1.0, 2.0], [3.0, 4.0]]))
    sp_ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant(["a", "b", "zz"]), [2, 2])
    got = de.embedding_lookup_sparse(w, sp_ids, None, combiner="mean")
    np.testing.assert_array_equal(got.numpy(), [[2, 3], [0, 0]])
    got = de.safe_embedding_lookup_sparse(w, sp_ids, None, combiner="sum", default_id="a")
    np.testing.assert_array_equal(got.numpy(), [[4, 6], [0, 0]])


def test_lookups_in_graph_mode():
    with tf.Graph().as_default():
        w = de.Variable(dim=2, devices=["/CPU:0", "/CPU:1"], initializer=1.0)
        ids = tf.compat.v1.sparse_placeholder(tf.int64)
        pooled = de.safe_embedding_lookup_sparse(w, ids, combiner="sum")
        with tf.compat.v1.Session() as sess:
            sess.run(w.upsert(tf.constant([1], tf.int64), tf.constant([[5.0, 5.0]])))
            got = sess.run(pooled, {ids: tf.compat.v1.SparseTensorValue([[0, 0], [0, 1]], [1, 2],
                                                                        [2, 2])})
            np.testing.assert_array_equal(got, [[6, 6], [0, 0]])


# -- bad input --------------------------------------------------------------------------------
def test_unknown_combiner(tables):
    w, _ = tables
    sp_ids = _sparse({(0, 0): 1}, [1, 1])
    with pytest.raises(ValueError, match="combiner.*'max'"):
        de.embedding_lookup_sparse(w, sp_ids, None, combiner="max")
    with pytest.raises(ValueError, match="combiner.*'avg'"):
        de.safe_embedding_lookup_sparse(w, sp_ids, combiner="avg")


def test_max_norm_must_be_positive(tables):
    """tf.clip_by_norm with a clip norm <= 0 gives NaN rows (zero rows) or flipped ones."""
    w, dense = tables
    sp_ids = _sparse({(0, 0): 1}, [1, 1])
    for bad in (-1.0, 0, "1", True):
        with pytest.raises(ValueError, match=f"max_norm must be .*got {bad!r}"):
            de.embedding_lookup(w, tf.constant([1], tf.int64), max_norm=bad)
        with pytest.raises(ValueError, match="max_norm must be"):
            de.embedding_lookup_sparse(w, sp_ids, None, max_norm=bad)
        with pytest.raises(ValueError, match="max_norm must be"):
            de.safe_embedding_lookup_sparse(w, sp_ids, max_norm=bad)
    ids = tf.constant([1, 2], tf.int64)   # numpy numbers and tensors are taken, as tf.nn does
    want = tf.nn.embedding_lookup(dense, ids, max_norm=0.5).numpy()
    for good in (np.float32(0.5), tf.constant(0.5)):
        np.testing.assert_allclose(de.embedding_lookup(w, ids, max_norm=good).numpy(), want,
                                   rtol=1e-6)


def test_weights_with_other_indices_are_rejected(tables):
    w, _ = tables
    sp_ids = _sparse({(0, 0): 1, (1, 0): 2}, [2, 2])
    moved = tf.SparseTensor([[0, 0], [1, 1]], [1.0, 1.0], [2, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="sp_weights.indices must equal"):
        de.embedding_lookup_sparse(w, sp_ids, moved)
    shorter = tf.SparseTensor([[0, 0]], [1.0], [2, 2])
    with pytest.raises(ValueError, match="sp_weights.indices must equal"):
        de.embedding_lookup_sparse(w, sp_ids, shorter)
    with pytest.raises(tf.errors.InvalidArgumentError, match="sparse_weights.indices must equal"):
        de.safe_embedding_lookup_sparse(w, sp_ids, moved)


def test_wrong_id_dtype_and_params(tables):
    w, dense = tables
    with pytest.raises(TypeError, match="ids must have dtype int64; got int32"):
        de.embedding_lookup(w, tf.constant([1], tf.int32))
    with pytest.raises(TypeError, match="sp_ids must have dtype int64"):
        de.embedding_lookup_sparse(w, _sparse({(0, 0): 1}, [1, 1], dtype=tf.int32), None)
    with pytest.raises(TypeError, match="params must be a de.Variable"):
        de.embedding_lookup(dense, tf.constant([1], tf.int64))


def test_de_math_has_tfras_sparse_helpers():
    data = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    got = de.math.sparse_segment_sum(data, tf.constant([0, 2, 1]), tf.constant([0, 0, 2]),
                                     num_segments=4)
    np.testing.assert_array_equal(got.numpy(), [[6, 8], [0, 0], [3, 4], [0, 0]])
    sp = tf.SparseTensor([[0, 1], [2, 0]], tf.constant([7, 8], tf.int64), [3, 2])
    filled, empty = de.math.sparse_fill_empty_rows(sp, tf.constant(-1, tf.int64))
    np.testing.assert_array_equal(tf.sparse.to_dense(filled).numpy(), [[0, 7], [-1, 0], [8, 0]])
    np.testing.assert_array_equal(empty.numpy(), [False, True, False])
    assert de.math.sparse_reshape(sp, [6]).dense_shape.numpy().tolist() == [6]


@pytest.mark.parametrize("combiner", ["mean", "sum"])
def test_ragged_ids_and_weights_pool_like_their_sparse_form(tables, combiner):
    # TFRA's ragged lookups take RaggedTensors; they mean the SparseTensor of their entries.
    w, _ = tables
    ids = tf.ragged.constant([[1, 2, 2], [], [-7, 3]], dtype=tf.int64)
    weights = tf.ragged.constant([[1.0, 0.5, 2.0], [], [1.0, 3.0]])
    w.upsert(tf.constant([-7], tf.int64), tf.fill([1, DIM], 0.25))
    for lookup in (de.safe_embedding_lookup_sparse, de.embedding_lookup_sparse):
        got = lookup(w, ids, weights, combiner=combiner)
        want = lookup(w, ids.to_sparse(), weights.to_sparse(), combiner=combiner)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    with pytest.raises(TypeError, match="sp_ids must be a tf.SparseTensor or tf.RaggedTensor"):
        de.embedding_lookup_sparse(w, tf.constant([[1]], tf.int64), None)
