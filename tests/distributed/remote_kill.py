"""A training loop against two PSs that checkpoints after 3 steps, prints "checkpointed" and a
JSON line of the checkpointed tables, then trains until a PS dies: prints the error (type,
message) as its last JSON line. With `--resume`, restores the latest checkpoint of DIR into a
fresh client, prints the restored tables, trains one more step. Usage: MODE SPEC DIR [--resume]."""

import json
import os
import time

import numpy as np

from remote_common import DIM, done, setup, table

tf, de, mode, spec, devices, rest = setup()
from tfra_dynamic_embedding.distributed import remote  # noqa: E402

directory = rest[0]
emb = de.Variable(dim=DIM, devices=devices, name="emb",
                  initializer=tf.random_normal_initializer(0.0, 0.3, seed=5))
opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05))
ckpt = tf.train.Checkpoint(emb=emb, opt=opt)


def step(i, offset=0):
    ids = tf.constant(np.random.default_rng(i).integers(0, 50, size=16) + offset, tf.int64)
    with tf.GradientTape() as tape:
        rows, wrapper = de.embedding_lookup(emb, ids, return_trainable=True)
        loss = tf.reduce_sum(rows ** 2)
    opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])


def tables():
    return {"emb": table(emb),
            "slots": {v.name.split("/")[-1]: table(v) for v in opt.get_slot_variables(emb)}}


if rest[1:] == ["--resume"]:
    status = ckpt.restore(tf.train.latest_checkpoint(directory))
    with tf.GradientTape() as tape:   # a step over no ids: makes (restores) the slot tables
        rows, wrapper = de.embedding_lookup(emb, tf.zeros([0], tf.int64), return_trainable=True)
        loss = tf.reduce_sum(rows)
    opt.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
    status.assert_consumed()
    restored = tables()
    before = int(emb.size())
    step(100, offset=1000)   # training goes on: new keys
    done({"restored": restored, "sizes": [int(emb.size(i)) for i in range(emb.shard_num)],
          "grew": int(emb.size()) - before})
else:
    for i in range(3):
        step(i)
    ckpt.save(os.path.join(directory, "model"))
    print(json.dumps({"checkpointed": tables()}), flush=True)
    print("checkpointed", flush=True)
    i, start = 3, time.monotonic()
    try:
        with remote.named_task_errors(spec):
            while True:
                step(i)
                i += 1
                float(emb.size())
    except tf.errors.OpError as error:
        done({"error": type(error).__name__, "message": error.message, "steps": i,
              "cause": type(error.__cause__).__name__})
