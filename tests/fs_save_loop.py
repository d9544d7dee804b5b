"""Child process of tests/test_file_system_atomic.py: saves one variable over and over.

    python tests/fs_save_loop.py DIR BACKEND KEYS DIM FIRST_GENERATION [PROC_RANK PROC_SIZE]

Generation g sets every row to the value g (keys 0..KEYS-1, 2 shards), then saves it to DIR with
`save_to_file_system`, printing `saving g` before and `saved g <seconds>` after, until killed.
A load that is all-or-nothing therefore finds one value in every row.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)

import tensorflow_recommenders_addons.dynamic_embedding as de  # noqa: E402


def main(argv):
    directory, backend = argv[1], argv[2]
    n, dim, generation = int(argv[3]), int(argv[4]), int(argv[5])
    proc_rank, proc_size = (int(argv[6]), int(argv[7])) if len(argv) > 7 else (0, 1)
    creator = de.BuiltinKVCreator() if backend == "builtin" else de.NativeKVCreator()
    var = de.Variable(key_dtype=tf.int64, dim=dim, devices=["/CPU:0", "/CPU:1"], name="emb",
                      kv_creator=creator)
    keys = tf.range(n, dtype=tf.int64)
    while True:
        var.upsert(keys, tf.fill([n, dim], float(generation)))
        print(f"saving {generation}", flush=True)
        start = time.perf_counter()
        var.save_to_file_system(directory, proc_rank=proc_rank, proc_size=proc_size)
        print(f"saved {generation} {time.perf_counter() - start:.4f}", flush=True)
        generation += 1


if __name__ == "__main__":
    main(sys.argv)
