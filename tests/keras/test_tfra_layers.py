"""TFRA's layer family: BasicEmbedding (TFRA kwargs), SquashedEmbedding, FieldWiseEmbedding."""

import itertools
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sequential(layer, flatten=False):
    layers = [tf.keras.layers.InputLayer(shape=(None,), dtype=tf.int64), layer]
    layers += [tf.keras.layers.Flatten()] if flatten else []
    layers += [tf.keras.layers.Dense(8, activation="relu"),
               tf.keras.layers.Dense(1, activation="sigmoid")]
    return tf.keras.Sequential(layers)


def _fit_new_ids_each_step(model, layer):
    """Fits batches of ever new ids (10 samples of i ids in step i): every id gets a row."""
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-4)),
                  loss="binary_crossentropy")
    start = 0
    for i in range(1, 5):
        x = tf.reshape(tf.range(start, start + 10 * i, dtype=tf.int64), (10, -1))
        start += 10 * i
        model.fit(x, tf.zeros((10, 1)), verbose=0)
        assert int(layer.params.size()) == start


def test_basic_embedding_takes_tfra_arguments():
    assert de.keras.layers.BasicEmbedding is de.keras.layers.Embedding
    options = itertools.product([1, 4], [tf.int32, tf.int64], [True, False], [True, False],
                                [None, de.TimestampRestrictPolicy, de.FrequencyRestrictPolicy])
    for k, (dim, key_dtype, trainable, bp_v2, policy) in enumerate(options):
        layer = de.keras.layers.BasicEmbedding(
            dim, key_dtype=key_dtype, initializer=tf.keras.initializers.RandomNormal(),
            trainable=trainable, bp_v2=bp_v2, restrict_policy=policy, init_capacity=64,
            name=f"tfra_create_{k}")
        assert layer.name == f"tfra_create_{k}" and int(layer.params.size()) == 0
        assert (layer.params.trainable, layer.trainable) == (trainable, trainable)
        assert layer.params.bp_v2 is bp_v2 and layer.params.init_size == 64
        assert type(layer.params.restrict_policy) is (policy or type(None))   # noqa: E721
        assert bool(layer.trainable_weights) == trainable
    with pytest.raises(TypeError, match="embedding_size"):
        de.keras.layers.BasicEmbedding("eight")


def test_tfra_positional_arguments_and_short_file_name():
    # TFRA's order: (embedding_size, key_dtype, value_dtype, combiner, initializer, devices,
    # name, with_unique, short_file_name); SquashedEmbedding inherits it, FieldWiseEmbedding
    # ends in with_unique.
    layer = de.keras.layers.Embedding(3, tf.int64, tf.float32, None, 0.5, None, "pos_emb",
                                      False, True)
    assert (layer.name, layer.with_unique, layer.params.short_file_name) == \
        ("pos_emb", False, True)
    assert layer.get_config()["short_file_name"] is True
    squashed = de.keras.layers.SquashedEmbedding(2, tf.int64, tf.float32, "sum", 1.0, None,
                                                 "pos_sq", False)
    fields = de.keras.layers.FieldWiseEmbedding(2, 2, lambda x: x % 2, tf.int64, tf.float32,
                                                "sum", 1.0, None, "pos_fw", False)
    assert not squashed.with_unique and not fields.with_unique
    short = de.keras.layers.SquashedEmbedding(2, tf.int64, tf.float32, "sum", 1.0, None,
                                              "pos_sq_short", True, True)
    assert short.params.short_file_name
    np.testing.assert_array_equal(squashed(tf.constant([[1, 2, 3]], tf.int64)).numpy(),
                                  [[3.0, 3.0]])
    # A slot of a short-named layer's variable is <name>/<slot>, without the optimizer's name.
    inputs = tf.keras.Input(shape=(2,), dtype=tf.int64)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(
        layer(inputs))))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1)),
                  loss="mse")
    model.fit(tf.constant([[1, 2]], tf.int64), tf.zeros((1, 1)), verbose=0)
    slots = sorted(v.name for v in layer.params.get_slot_variables(model.optimizer))
    assert slots and all(name.startswith("pos_emb/") and name.count("/") == 1
                         for name in slots), slots


def test_embedding_returns_a_row_per_id_whatever_the_combiner_as_tfras_does():
    # TFRA's Embedding keeps `combiner` (default "sum") for its subclasses and returns
    # shape(ids) + [embedding_size]; pooling is this package's `pooling` argument.
    ids = tf.constant([[1, 2, 3], [4, 5, 6]], tf.int64)
    for combiner in ("sum", "mean", "max"):
        layer = de.keras.layers.Embedding(4, combiner=combiner, initializer=1.0,
                                          name=f"tfra_comb_{combiner}")
        assert layer.combiner == combiner and layer(ids).shape == (2, 3, 4)
        assert layer.compute_output_shape((2, 3)) == (2, 3, 4)
    assert de.keras.layers.Embedding(4, name="tfra_comb_default").combiner == "sum"
    pooled = de.keras.layers.Embedding(4, combiner="max", pooling="mean", initializer=1.0,
                                       name="tfra_comb_pooled")
    np.testing.assert_array_equal(pooled(ids).numpy(), np.ones([2, 4]))
    config = pooled.get_config()
    assert (config["combiner"], config["pooling"]) == ("max", "mean")
    assert type(pooled).from_config(config)(ids).shape == (2, 4)


def test_default_initializer_is_tfras_random_normal():
    layer = de.keras.layers.Embedding(8, name="tfra_default_init")
    rows = layer(tf.range(20000, dtype=tf.int64)).numpy()
    # Keras' RandomNormal(): mean 0, stddev 0.05, unbounded (Keras' "uniform" stays in +-0.05).
    assert abs(rows.mean()) < 0.002 and abs(rows.std() - 0.05) < 0.002
    assert np.abs(rows).max() > 0.15
    assert len(np.unique(rows, axis=0)) == 20000   # every id its own draw


def test_tfras_combiner_names_and_reduce_pooling():
    from tensorflow_recommenders_addons.dynamic_embedding.python.keras.layers.embedding import \
        reduce_pooling   # TFRA's module path
    rows = tf.constant([[[1., 2.], [3., 6.]], [[0., 0.], [2., 2.]]])
    np.testing.assert_allclose(reduce_pooling(rows, "mean").numpy(), [[2., 4.], [1., 1.]])
    np.testing.assert_allclose(reduce_pooling(rows[0]).numpy(), [4., 8.])
    # More than one id axis: one axis at a time, as TFRA's.
    deep = np.random.default_rng(0).normal(size=[2, 3, 4, 5]).astype(np.float32)
    np.testing.assert_allclose(reduce_pooling(tf.constant(deep), "std").numpy(),
                               deep.std(axis=1).std(axis=1), rtol=1e-5)
    with pytest.raises(ValueError, match="combiner must name a tf.math.reduce_.*'avg'"):
        reduce_pooling(rows, "avg")
    # FieldWiseEmbedding takes TFRA's "sqrt_n" (tf.sparse.segment_sqrt_n) and tf.nn's "sqrtn".
    for name in ("sqrt_n", "sqrtn"):
        fields = de.keras.layers.FieldWiseEmbedding(2, 3, lambda x: x % 3, combiner=name,
                                                    initializer=1.0, name=f"tfra_fw_{name}")
        np.testing.assert_allclose(fields(tf.constant([[1, 4, 2]], tf.int64)).numpy(),
                                   [[[0., 0.], [2 ** 0.5] * 2, [1., 1.]]], rtol=1e-6)


def test_tfra_keyword_arguments_keep_distribution_and_distribute_strategy():
    creator = de.NativeKVCreator()
    layer = de.keras.layers.Embedding(2, name="kd_emb", keep_distribution=True,
                                      kv_creator=creator,
                                      restrict_policy=de.FrequencyRestrictPolicy)
    config = layer.get_config()
    assert config["keep_distribution"] is True and config["kv_creator"] is creator
    assert config["restrict_policy"] == "FrequencyRestrictPolicy"
    config["name"] = "kd_emb_copy"
    copy = type(layer).from_config(config)
    assert copy.params.kv_creator is creator
    assert isinstance(copy.params.restrict_policy, de.FrequencyRestrictPolicy)
    plain = de.keras.layers.Embedding(2, name="kd_plain").get_config()
    assert "kv_creator" not in plain and "restrict_policy" not in plain

    # Made outside the scope of the strategy it is given, the layer's rows live on its device.
    strategy = tf.distribute.OneDeviceStrategy("/cpu:1")
    placed = de.keras.layers.Embedding(2, name="kd_strategy", distribute_strategy=strategy)
    assert placed.trainable_weights[0].device.endswith("CPU:1"), placed.trainable_weights[0].device
    with pytest.raises(TypeError, match="distribute_strategy"):
        de.keras.layers.Embedding(2, name="kd_bad", distribute_strategy="mirrored")


def test_wrapper_value_takes_tfras_do_prefetch():
    var = de.Variable(dim=2, initializer=0.0, name="value_prefetch")
    ids = tf.constant([7], tf.int64)
    var.upsert(ids, tf.constant([[1.0, 1.0]]))
    _, wrapper = de.embedding_lookup(var, ids, return_trainable=True)
    var.upsert(ids, tf.constant([[2.0, 2.0]]))        # the table moves on after the lookup
    np.testing.assert_array_equal(wrapper.value().numpy(), [[1.0, 1.0]])
    np.testing.assert_array_equal(wrapper.value(do_prefetch=True).numpy(), [[2.0, 2.0]])


def test_basic_embedding_forward_matches_keras_embedding_and_fit_inserts_every_id():
    layer = de.keras.layers.BasicEmbedding(4, initializer=tf.keras.initializers.RandomNormal(0),
                                           name="tfra_forward")
    ids = tf.range(200, dtype=tf.int64)
    layer.params.upsert(ids, tf.fill([200, 4], 0.25))
    dense = tf.keras.layers.Embedding(1000, 4, embeddings_initializer=tf.keras.initializers
                                      .Constant(0.25))
    grid = tf.reshape(ids, (25, 8))
    np.testing.assert_allclose(layer(grid).numpy(), dense(grid).numpy())
    for bp_v2 in (False, True):
        layer = de.keras.layers.BasicEmbedding(4, bp_v2=bp_v2, name=f"tfra_fit_{bp_v2}")
        model = _sequential(layer)
        _fit_new_ids_each_step(model, layer)


def test_squashed_embedding_reduces_all_but_the_batch_axis():
    layer = de.keras.layers.SquashedEmbedding(2, initializer=tf.keras.initializers.Zeros(),
                                              key_dtype=tf.int32, name="tfra_squash")
    layer.params.upsert(tf.constant([3, 0, 1], tf.int32), tf.constant([[1., 2.], [3., 4.],
                                                                       [5., 6.]]))
    np.testing.assert_allclose(layer(tf.constant([3, 0, 1, 2], tf.int32)).numpy(), [9., 12.])
    batched = layer(tf.constant([[[3, 0], [1, 2]], [[2, 2], [0, 0]]], tf.int32)).numpy()
    np.testing.assert_allclose(batched, [[9., 12.], [6., 8.]])
    mean = de.keras.layers.SquashedEmbedding(2, combiner="mean", initializer=1.0,
                                             name="tfra_squash_mean")
    np.testing.assert_allclose(mean(tf.constant([[1, 2, 3]], tf.int64)).numpy(), [[1., 1.]])
    with pytest.raises(ValueError, match="combiner must name a tf.math.reduce_.*'median'"):
        de.keras.layers.SquashedEmbedding(2, combiner="median")


def test_field_wise_embedding_pools_ids_by_slot():
    def to_slot(x):
        return tf.math.floormod(x, 3)

    layer = de.keras.layers.FieldWiseEmbedding(2, 3, slot_map_fn=to_slot,
                                               initializer=tf.keras.initializers.Zeros(),
                                               name="tfra_field")
    ids = tf.constant([[23, 12, 0], [9, 13, 10]], tf.int64)
    np.testing.assert_array_equal(layer(ids).numpy(), np.zeros((2, 3, 2)))
    layer.params.upsert(tf.range(100, dtype=tf.int64), tf.ones((100, 2)))
    np.testing.assert_array_equal(layer(ids).numpy(),
                                  [[[2, 2], [0, 0], [1, 1]], [[1, 1], [2, 2], [0, 0]]])
    mean = de.keras.layers.FieldWiseEmbedding(1, 2, slot_map_fn=lambda x: x % 2,
                                              combiner="mean", name="tfra_field_mean")
    mean.params.upsert(tf.constant([1, 2, 3], tf.int64), tf.constant([[1.], [2.], [5.]]))
    np.testing.assert_allclose(mean(tf.constant([[1, 2, 3]], tf.int64)).numpy(),
                               [[[2.], [3.]]])           # slot 0: id 2; slot 1: ids 1, 3
    identity = de.keras.layers.FieldWiseEmbedding(2, 3, slot_map_fn=lambda x: x,
                                                  name="tfra_bad_slots")
    with pytest.raises(tf.errors.InvalidArgumentError, match="slot >= nslots"):
        identity(tf.constant([[1, 7]], tf.int64))       # slot 7 of 3 would be the next row's
    with pytest.raises(ValueError, match=r"ids must be \[batch, n\]"):
        layer(tf.constant([[[1]]], tf.int64))
    with pytest.raises(ValueError, match="slot_map_fn must be callable"):
        de.keras.layers.FieldWiseEmbedding(2, 3, slot_map_fn=None)
    with pytest.raises(ValueError, match="combiner must be one of"):
        de.keras.layers.FieldWiseEmbedding(2, 3, slot_map_fn=to_slot, combiner="max")


def test_squashed_and_field_wise_embeddings_name_the_layer_for_sparse_and_ragged_ids():
    # only Embedding pools variable-length ids; these said "RaggedTensor has no len()"
    layers = [de.keras.layers.SquashedEmbedding(2, name="tfra_squash_dense"),
              de.keras.layers.FieldWiseEmbedding(2, 3, slot_map_fn=lambda x: x % 3,
                                                 name="tfra_field_dense")]
    for layer, ids in itertools.product(layers, [
            tf.ragged.constant([[1, 2, 3], [4]], dtype=tf.int64),
            tf.sparse.from_dense(tf.constant([[1, 0, 3], [0, 5, 0]], tf.int64))]):
        with pytest.raises(TypeError, match=f"{type(layer).__name__} '{layer.name}' takes "
                                            f"dense ids; got a {type(ids).__name__}.*pooling"):
            layer(ids)


def test_field_wise_embedding_trains_in_a_sequential_model():
    layer = de.keras.layers.FieldWiseEmbedding(4, 2, tf.function(lambda x: x % 2), bp_v2=True,
                                               initializer=tf.keras.initializers
                                               .RandomNormal(seed=0), name="tfra_field_fit")
    model = _sequential(layer, flatten=True)
    _fit_new_ids_each_step(model, layer)
    assert model.predict(tf.zeros((3, 4), tf.int64), verbose=0).shape == (3, 1)


def test_tfra_layers_under_tf_keras():
    script = textwrap.dedent("""
        import numpy as np
        import tensorflow as tf
        import tf_keras
        import tensorflow_recommenders_addons.dynamic_embedding as de
        squash = de.keras.layers.SquashedEmbedding(2, initializer=1.0)
        field = de.keras.layers.FieldWiseEmbedding(2, 2, slot_map_fn=lambda x: x % 2,
                                                   initializer=1.0)
        assert isinstance(squash, tf_keras.layers.Layer)
        ids = tf.constant([[1, 2, 3]], tf.int64)
        np.testing.assert_allclose(squash(ids).numpy(), [[3., 3.]])
        np.testing.assert_allclose(field(ids).numpy(), [[[1., 1.], [2., 2.]]])
        print("OK")
    """)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, timeout=600, check=False)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
