"""A small DLRM-style click-through-rate model over dynamic embeddings.

    dense [B, 13] ── bottom MLP ──▶ x [B, d] ─┐
    ids [B, 26] ── 26 de.keras.layers.Embedding ──▶ e_1..e_26 [B, d] ─┤
                                      interaction: pairwise dot products of (x, e_1, ..., e_26)
                                      (or their concatenation) ──▶ [x, dots] ── top MLP ──▶ sigmoid

One dynamic embedding table per categorical feature: ids are arbitrary int64 hashes, a row is
created the first time an optimizer step sees its id. With `vocab_sizes` the tables are static
`tf.keras.layers.Embedding`s instead (ids must then lie in [0, vocab)): the baseline of
benchmarks/train_step.py.

Training it (`model.compile` with a `de.DynamicEmbeddingOptimizer`, `model.fit` on generated
Criteo-format data) takes seconds: docs/demo.md shows it ("From Python").

Example (a small one, called on a batch):
    >>> model = DLRM(num_dense=2, num_categorical=3, embedding_dim=4, bottom=(8,), top=(8,))
    >>> batch = {"dense": tf.ones([5, 2]), "ids": tf.constant([[1, 2, 3]] * 5, tf.int64)}
    >>> model(batch).shape                                   # click probabilities
    TensorShape([5, 1])
"""

import numpy as np
import tensorflow as tf

import tfra_dynamic_embedding as de

INTERACTIONS = ("dot", "concat")


class DLRM(tf.keras.Model):
    """Bottom MLP, one embedding table per categorical feature, interaction, top MLP, sigmoid.

    Args:
      num_dense: dense features (0: no bottom MLP, the model reads only ids).
      num_categorical: categorical features, one table each.
      embedding_dim: row length of every table (and the bottom MLP's output).
      bottom: hidden units of the bottom MLP (its output layer has `embedding_dim` units).
      top: hidden units of the top MLP (its output layer is one sigmoid unit).
      interaction: "dot" (pairwise dot products, as DLRM) or "concat".
      vocab_sizes: None for dynamic tables, or one vocabulary size per feature for static ones.
      initializer: initializer of embedding rows.
      devices, kv_creator: where and how the dynamic tables are stored (see `de.Variable`).
      admission, eviction: online-learning filters of every dynamic table (`de.CountAdmission`,
        `de.Eviction`, ...; see online/).
    """

    def __init__(self, num_dense=13, num_categorical=26, embedding_dim=16, bottom=(64,),
                 top=(128, 64), interaction="dot", vocab_sizes=None, initializer=None,
                 devices=None, kv_creator=None, admission=None, eviction=None, name="dlrm",
                 **kwargs):
        super().__init__(name=name, **kwargs)
        if interaction not in INTERACTIONS:
            raise ValueError(f"interaction must be one of {list(INTERACTIONS)}; "
                             f"got {interaction!r}")
        if vocab_sizes is not None and len(vocab_sizes) != num_categorical:
            raise ValueError(f"vocab_sizes needs {num_categorical} entries; "
                             f"got {len(vocab_sizes)}")
        # The constructor arguments that define the architecture (see `clone`).
        self.architecture = dict(num_dense=num_dense, num_categorical=num_categorical,
                                 embedding_dim=embedding_dim, bottom=tuple(bottom),
                                 top=tuple(top), interaction=interaction,
                                 vocab_sizes=None if vocab_sizes is None else tuple(vocab_sizes))
        self.num_dense = num_dense
        self.num_categorical = num_categorical
        self.embedding_dim = embedding_dim
        self.interaction = interaction
        self.dynamic = vocab_sizes is None
        if initializer is None:
            initializer = tf.keras.initializers.RandomNormal(0.0, 0.05)
        if self.dynamic:
            embeddings = [
                de.keras.layers.Embedding(embedding_dim, initializer=initializer, devices=devices,
                                          kv_creator=kv_creator, admission=admission,
                                          eviction=eviction, name=f"C{i + 1}")
                for i in range(num_categorical)]
        else:
            embeddings = [
                tf.keras.layers.Embedding(int(vocab), embedding_dim,
                                          embeddings_initializer=initializer, name=f"C{i + 1}")
                for i, vocab in enumerate(vocab_sizes)]
        # Every layer is an attribute of its own: Keras 3 does not expose layers held in a list
        # (nor a Sequential built without an Input) to tf.train.Checkpoint, so their weights
        # -- and dynamic tables -- would silently be missing from checkpoints.
        self._names = {"embeddings": [], "bottom": [], "top": []}
        for i, layer in enumerate(embeddings):
            self._add("embeddings", f"embedding_{i + 1}", layer)
        if num_dense:
            for i, units in enumerate(list(bottom) + [embedding_dim]):
                self._add("bottom", f"bottom_{i}",
                          tf.keras.layers.Dense(units, activation="relu", name=f"bottom_{i}"))
        for i, units in enumerate(top):
            self._add("top", f"top_{i}",
                      tf.keras.layers.Dense(units, activation="relu", name=f"top_{i}"))
        self.head = tf.keras.layers.Dense(1, activation="sigmoid", name="head")
        vectors = num_categorical + (1 if num_dense else 0)
        # Flat positions (i * F + j, i < j) of the strictly upper triangle of the dot products.
        upper_i, upper_j = np.triu_indices(vectors, k=1)
        self._pairs = (upper_i * vectors + upper_j).astype(np.int32)
        self._vectors = vectors

    def _add(self, group, attribute, layer):
        setattr(self, attribute, layer)
        self._names[group].append(attribute)

    @property
    def vectors(self):
        """How many vectors meet in the dot interaction: one per categorical feature, plus the
        bottom MLP's output when there are dense features."""
        return self._vectors

    @property
    def embeddings(self):
        """The embedding layers, one per categorical feature (C1, C2, ...)."""
        return [getattr(self, name) for name in self._names["embeddings"]]

    def call(self, inputs, training=False):
        ids = inputs["ids"]
        columns = [ids[:, i] for i in range(self.num_categorical)]
        if self.dynamic:   # one lookup op per device for all tables (on a cluster: per PS)
            vectors = de.keras.layers.call_grouped(self.embeddings, columns)
        else:
            vectors = [layer(x) for layer, x in zip(self.embeddings, columns)]
        return self.dense_part(inputs.get("dense"), vectors)

    def input_signature(self):
        """The request `call` takes: {"dense": [B, num_dense] float32 (absent without dense
        features), "ids": [B, num_categorical] keys}; a sharded export serves this request."""
        key_dtype = self.embeddings[0].params.key_dtype if self.dynamic else tf.int64
        spec = {"ids": tf.TensorSpec([None, self.num_categorical], key_dtype, name="ids")}
        if self.num_dense:
            spec = {"dense": tf.TensorSpec([None, self.num_dense], tf.float32, name="dense"),
                    **spec}
        return spec

    def dense_part(self, dense, vectors):
        """The model after its tables: bottom MLP on `dense` ([B, num_dense], None without dense
        features), interaction with `vectors` (one [B, d] embedding per feature), top MLP,
        sigmoid."""
        vectors = list(vectors)
        if self.num_dense:
            x = dense
            for name in self._names["bottom"]:
                x = getattr(self, name)(x)
            vectors.insert(0, x)
        if self.interaction == "dot":
            stacked = tf.stack(vectors, axis=1)                      # [B, F, d]
            dots = tf.matmul(stacked, stacked, transpose_b=True)      # [B, F, F]
            dots = tf.reshape(dots, [-1, self._vectors * self._vectors])
            features = tf.gather(dots, self._pairs, axis=1)           # [B, F (F - 1) / 2]
            if self.num_dense:
                features = tf.concat([vectors[0], features], axis=1)
        else:
            features = tf.concat(vectors, axis=1)
        for name in self._names["top"]:
            features = getattr(self, name)(features)
        return self.head(features)

    def clone(self, **overrides):
        """A new, unbuilt model of the same architecture (e.g. `clone(kv_creator=...)`)."""
        return DLRM(**{**self.architecture, **overrides})

    def dense_layers(self):
        """The layers holding ordinary (non-table) weights, in a fixed order."""
        names = self._names["bottom"] + self._names["top"]
        return [getattr(self, name) for name in names] + [self.head]

    def table_sizes(self):
        """{feature name: rows in its dynamic table} (static tables: their vocabulary size)."""
        if self.dynamic:
            return {layer.name: int(layer.params.size()) for layer in self.embeddings}
        return {layer.name: int(layer.input_dim) for layer in self.embeddings}


def build(model):
    """Creates a DLRM's weights by calling it on a one-example batch (inserts no rows)."""
    model({"dense": tf.zeros([1, model.num_dense]),
           "ids": tf.zeros([1, model.num_categorical], tf.int64)})
    return model
