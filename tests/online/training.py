"""What the online-learning tests share: one traced training step over a de.Variable, its keys."""

import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de


def train_step(var, opt):
    """A tf.function: look up `ids`, loss sum(rows^2 + rows), `opt` (a DynamicEmbeddingOptimizer)
    applies the gradient."""
    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            rows, wrapper = de.embedding_lookup(var, ids, return_trainable=True, name="lookup")
            loss = tf.reduce_sum(rows * rows + rows)
        opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
    return step


def keys_of(var):
    """The set of keys `var` holds."""
    return set(var.export()[0].numpy().tolist())
