"""Every de.Variable op on a two-shard variable: remote tables (MODE remote) or one process
(MODE local). Prints {"results": {...}, "placement": {...}}; see remote_common.py."""

import shutil
import tempfile

import numpy as np
from remote_common import DIM, arr, done, placement, setup, table

tf, de, mode, spec, devices, _ = setup()
K = lambda *ks: tf.constant(ks, tf.int64)  # noqa: E731
results, place = {}, {}

w = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM, devices=devices, name="w",
                initializer=tf.keras.initializers.RandomNormal(0.0, 0.5, seed=7))
w.upsert(tf.range(10, dtype=tf.int64), tf.reshape(tf.range(40, dtype=tf.float32), [10, DIM]))
results["size_after_upsert"] = [int(w.size()), int(w.size(0)), int(w.size(1))]
rows, exists = w.lookup(K(1, 3, 100, 101, 3), return_exists=True)
results["lookup"] = [arr(rows), arr(exists)]
results["lookup_2d"] = arr(w.lookup(tf.constant([[2, 5], [7, 1000]], tf.int64)))
rows, exists = w.find_or_insert(K(100, 200, 5))
results["find_or_insert"] = [arr(rows), arr(exists), int(w.size())]
w.remove(K(2, 3, 200, 999))
results["size_after_remove"] = [int(w.size()), int(w.size(0)), int(w.size(1))]
w.accum(K(1, 300), tf.ones([2, DIM]))
old = w.lookup(K(4, 5, 301))
w.accum(K(4, 5, 301), old, old + 10.0, tf.constant([True, True, False]))
results["after_accum"] = table(w)
place["w"] = placement(w)
keys, values = w.tables[1].export()
results["shard1_export_keys"] = sorted(arr(keys))
results["import"] = None
w.import_(K(11, 12, 13), tf.fill([3, DIM], 2.5))
results["after_import"] = [table(w), int(w.size(0)), int(w.size(1))]
w.clear()
results["size_after_clear"] = [int(w.size()), int(w.size(0)), int(w.size(1))]

# Lookups of embedding_ops on a fresh variable (missing ids: the seeded initializer's rows).
e = de.Variable(dim=DIM, devices=devices, name="e",
                initializer=tf.keras.initializers.RandomUniform(-1.0, 1.0, seed=3))
e.upsert(K(1, 2, 3, 4), tf.reshape(tf.range(16, dtype=tf.float32), [4, DIM]) / 8.0)
results["embedding_lookup"] = arr(de.embedding_lookup(e, tf.constant([[1, 9], [4, 2]], tf.int64)))
sp_ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0], [2, 0], [2, 1]], K(1, 2, 3, 7, 4), [3, 2])
sp_w = tf.SparseTensor(sp_ids.indices, [1.0, 2.0, 0.5, 1.0, 3.0], [3, 2])
for combiner in ("sum", "mean", "sqrtn"):
    results[f"embedding_lookup_sparse_{combiner}"] = arr(
        de.embedding_lookup_sparse(e, sp_ids, sp_w, combiner=combiner))
sp_safe = tf.SparseTensor([[0, 0], [0, 1], [2, 0]], K(1, -5, 3), [4, 2])
safe_w = tf.SparseTensor(sp_safe.indices, [1.0, 2.0, -1.0], [4, 2])
results["safe_embedding_lookup_sparse"] = arr(
    de.safe_embedding_lookup_sparse(e, sp_safe, safe_w, combiner="mean", default_id=2))
results["e_size"] = int(e.size())   # lookups insert nothing
place["e"] = placement(e)

# Restrict policy: status table on the same PSs; eviction runs per shard on its PS.
r = de.Variable(dim=DIM, devices=devices, name="r", initializer=1.0,
                restrict_policy=de.FrequencyRestrictPolicy)
r.upsert(tf.range(10, dtype=tf.int64), tf.ones([10, DIM]))
for n in (10, 6, 3):   # key frequencies: 0-2: 3, 3-5: 2, 6-9: 1
    r.restrict_policy.apply_update(tf.range(n, dtype=tf.int64))
r.restrict(6, trigger=6)   # keeps the 3 most frequent keys of each shard
results["restrict"] = [table(r)["keys"], table(r.restrict_policy.status)]
place["r"] = placement(r)
place["r_status"] = placement(r.restrict_policy.status)
# Delta export: each shard's rows hashed on its PS, only the changed rows fetched.
from tfra_dynamic_embedding.online import delta  # noqa: E402  (after setup: TF's settings)

d = de.Variable(dim=DIM, devices=devices, name="d", initializer=0.0)
d.upsert(tf.range(20, dtype=tf.int64), tf.reshape(tf.range(20 * DIM, dtype=tf.float32), [20, DIM]))
workdir = tempfile.mkdtemp()
exporter = delta.DeltaExporter([d], workdir)
first = exporter.export()
d.upsert(K(3, 8, 25), tf.fill([3, DIM], -1.0))
d.remove(K(4, 11))
info = exporter.export()
keys, values, removed, full = delta.read_export(info.path)["d"]
order = np.argsort(keys)
results["delta"] = [first.upserts, info.upserts, info.removals, keys[order].tolist(),
                    values[order].tolist(), sorted(removed.tolist()), bool(full)]
place["d_hashing"] = [sorted({op.device for op in exporter._fingerprints[  # pylint: disable=protected-access
    f"d.shard{i}"].get_concrete_function().graph.get_operations()
    if op.type not in ("Identity", "NoOp")}) for i in range(2)]
shutil.rmtree(workdir)
done({"mode": mode, "results": results, "placement": place})
