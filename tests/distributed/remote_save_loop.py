"""Saves again and again until killed: save n holds every row = n in a tensor-format variable
(`t`) and in a de.FileSystemSaver variable (`f`); prints "saved <n>" after each. With
`--check`, restores the latest checkpoint of DIR instead and prints both tables' row values.
Usage: MODE SPEC DIR [--check]."""

import os

import numpy as np

from remote_common import done, setup

tf, de, mode, spec, devices, rest = setup()
directory = rest[0]
KEYS = 200
t = de.Variable(dim=8, devices=devices, name="t")
f = de.Variable(dim=8, devices=devices, name="f",
                kv_creator=de.CuckooHashTableCreator(saver=de.FileSystemSaver()))
ckpt = tf.train.Checkpoint(t=t, f=f)
if rest[1:] == ["--check"]:
    path = tf.train.latest_checkpoint(directory)
    ckpt.restore(path).assert_consumed()

    def content(var):
        keys, values = var.export()
        return {"keys": np.sort(keys.numpy()).tolist(),
                "row_values": np.unique(values.numpy()).tolist()}

    done({"path": path, "save_counter": int(ckpt.save_counter), "t": content(t),
          "f": content(f)})
else:
    keys = tf.range(KEYS, dtype=tf.int64)
    for n in range(1, 10000):
        rows = tf.fill([KEYS, 8], float(n))
        t.upsert(keys, rows)
        f.upsert(keys, rows)
        ckpt.save(os.path.join(directory, "model"))   # save n: model-n
        print(f"saved {n}", flush=True)
