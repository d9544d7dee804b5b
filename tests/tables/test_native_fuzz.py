"""Property and fuzz tests of the native ops (hypothesis), each in a subprocess.

A kernel bug that crashes the process must fail a test, not kill pytest: every property runs in a
child interpreter and the test checks its exit status.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from tfra_dynamic_embedding.tables import native

pytestmark = pytest.mark.skipif(not native.is_available(),
                                reason=f"native op library not built: {native.load_error()}")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PRELUDE = textwrap.dedent('''
    import os, sys
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf
    from hypothesis import HealthCheck, given, settings, strategies as st
    from tfra_dynamic_embedding.tables import native

    gen = native.ops()
    KEYS = [tf.int32, tf.int64, tf.string]
    VALUES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
    EXPECTED = (tf.errors.OpError, TypeError, ValueError)

    def settings_(n):
        return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                        suppress_health_check=list(HealthCheck))

    def key_strategy(kd):
        if kd == tf.string:
            return st.binary(max_size=40)  # empty, inline (<= 20 bytes) and heap-stored keys
        bits = 31 if kd == tf.int32 else 63
        return st.integers(-2**bits, 2**bits - 1)

    def np_dtype(vd):
        return np.dtype(vd.as_numpy_dtype)
''')

MODEL = PRELUDE + textwrap.dedent('''
    @settings_(70)
    @given(st.data())
    def check(data):
        kd, vd = data.draw(st.sampled_from(KEYS)), data.draw(st.sampled_from(VALUES))
        dim = data.draw(st.sampled_from([1, 2, 5, 33, 1000, 70000]))
        max_n = max(1, min(40, 300000 // dim))
        t = native.NativeKVTable(kd, vd, dim, "fz", num_shards=data.draw(st.sampled_from([0, 1, 3])))
        vt = np_dtype(vd)
        pool = data.draw(st.lists(key_strategy(kd), min_size=1, max_size=25, unique=True))
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        ref = {}
        for _ in range(data.draw(st.integers(1, 10))):
            op = data.draw(st.sampled_from(
                ["insert", "accum", "remove", "lookup", "foi", "foi_native", "import", "clear",
                 "chunks"]))
            ids = data.draw(st.lists(st.sampled_from(pool), max_size=max_n))
            keys = tf.constant(ids, kd, shape=[len(ids)])
            n = len(ids)
            if op == "insert":
                rows = rng.integers(-8, 9, (n, dim)).astype(vt)
                t.insert(keys, tf.constant(rows, vd))
                for k, r in zip(ids, rows):
                    ref[k] = r
            elif op == "accum":
                rows = rng.integers(-1, 2, (n, dim)).astype(vt)
                t.accum(keys, tf.constant(rows, vd))
                for k, r in zip(ids, rows):  # in batch order, rounding in the value dtype
                    ref[k] = (ref[k] + r).astype(vt) if k in ref else r
            elif op == "remove":
                assert int(t.remove(keys)) == len(set(ids) & set(ref))
                for k in ids:
                    ref.pop(k, None)
            elif op == "lookup":
                rows, exists = t.lookup_with_exists(keys, tf.fill([dim], tf.constant(-3, vd)))
                assert exists.numpy().tolist() == [k in ref for k in ids]
                want = np.array([ref.get(k, np.full(dim, -3, vt)) for k in ids], vt).reshape(n, dim)
                assert np.array_equal(rows.numpy(), want)
            elif op in ("foi", "foi_native"):
                init = (native.NativeInitializer("constant", 2.0) if op == "foi_native"
                        else (lambda m: tf.fill(tf.stack([tf.size(m), dim]), tf.constant(2, vd))))
                rows, exists = t.find_or_insert(keys, init)
                assert exists.numpy().tolist() == [k in ref for k in ids]
                for k in ids:
                    if k not in ref:
                        ref[k] = np.full(dim, 2, vt)
                want = np.array([ref[k] for k in ids], vt).reshape(n, dim)
                assert np.array_equal(rows.numpy(), want)
            elif op == "import":
                rows = rng.integers(-8, 9, (n, dim)).astype(vt)
                t.import_(keys, tf.constant(rows, vd))
                ref = {}
                for k, r in zip(ids, rows):
                    ref[k] = r
            elif op == "clear":
                t.clear()
                ref = {}
            else:
                got = {}
                for ck, cv, _, _ in t.export_chunks(data.draw(st.integers(1, 7))):
                    for k, v in zip(ck.numpy().tolist(), cv.numpy()):
                        assert k not in got
                        got[k] = v
                assert set(got) == set(ref)
            assert int(t.size()) == len(ref)
        keys, values = t.export()
        got = dict(zip(keys.numpy().tolist(), values.numpy()))
        assert set(got) == set(ref)
        for k in ref:
            assert np.array_equal(got[k], ref[k]), k

    check()
    print("ok")
''')

RAW = PRELUDE + textwrap.dedent('''
    ANY_DTYPES = [tf.int32, tf.int64, tf.string, tf.float16, tf.bfloat16, tf.float32, tf.float64,
                  tf.bool]

    @st.composite
    def any_tensor(draw):
        dtype = draw(st.sampled_from(ANY_DTYPES))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        size = int(np.prod(shape)) if shape else 1
        if dtype == tf.string:
            return tf.constant([b"k%d" % i for i in range(size)], tf.string, shape=shape)
        return tf.cast(tf.reshape(tf.range(size), shape), dtype)

    @st.composite
    def arg(draw, good):
        return good if draw(st.booleans()) else draw(any_tensor())

    @settings_(150)
    @given(st.data())
    def check(data):
        kd, vd = data.draw(st.sampled_from(KEYS)), data.draw(st.sampled_from(VALUES))
        dim = data.draw(st.sampled_from([1, 3, 8]))
        t = native.NativeKVTable(kd, vd, dim, "raw")
        h = t.resource_handle
        n = data.draw(st.integers(0, 5))
        keys = tf.constant([b"a%d" % i for i in range(n)] if kd == tf.string else list(range(n)),
                           kd, shape=[n])
        rows = tf.zeros([n, dim], vd)
        t.insert(keys, rows)
        typed = dict(key_dtype=kd, value_dtype=vd)
        calls = [
            lambda: gen.tfra_de_find(h, data.draw(arg(keys)), data.draw(arg(rows)),
                                     dim=data.draw(st.sampled_from([dim, dim + 1]))),
            lambda: gen.tfra_de_insert(h, data.draw(arg(keys)), data.draw(arg(rows))),
            lambda: gen.tfra_de_accum(h, data.draw(arg(keys)), data.draw(arg(rows))),
            lambda: gen.tfra_de_insert_missing(h, data.draw(arg(keys)), data.draw(arg(rows)), dim=dim),
            lambda: gen.tfra_de_remove(h, data.draw(arg(keys))),
            lambda: gen.tfra_de_import(h, data.draw(arg(keys)), data.draw(arg(rows)),
                                       data.draw(arg(tf.zeros([n], tf.int64))),
                                       data.draw(arg(tf.zeros([0], tf.int64))),
                                       data.draw(arg(tf.constant(data.draw(st.booleans()))))),
            lambda: gen.tfra_de_export(h, data.draw(arg(tf.constant(
                data.draw(st.integers(-2**63, 2**63 - 1)), tf.int64))),
                data.draw(arg(tf.constant(data.draw(st.integers(-5, 5)), tf.int64))), dim=dim, **typed),
            lambda: gen.tfra_de_find_init(h, data.draw(arg(keys)), dim=dim, insert=True,
                                          init=data.draw(st.sampled_from(
                                              ["constant", "uniform", "normal", "truncated_normal"])),
                                          a=data.draw(st.floats(-1e3, 1e3)),
                                          b=data.draw(st.floats(0, 1e3)), seed=7, value_dtype=vd),
            lambda: gen.tfra_de_evict(h, data.draw(arg(tf.constant(3, tf.int64))),
                                      data.draw(arg(tf.constant(2, tf.int64)))),
            lambda: gen.tfra_de_set_step(h, data.draw(arg(tf.constant(5, tf.int64)))),
            lambda: gen.tfra_de_load_from_file(h, data.draw(arg(tf.constant("/nonexistent/f")))),
            lambda: gen.tfra_de_table(key_dtype=kd, value_dtype=vd,
                                      dim=data.draw(st.sampled_from([0, 1, 2**24 + 1, 2**40])),
                                      init_size=data.draw(st.sampled_from([0, 5, 2**32])),
                                      num_shards=data.draw(st.sampled_from([0, 7, 5000])),
                                      shared_name="fuzz_%d" % data.draw(st.integers(0, 3))),
        ]
        for _ in range(data.draw(st.integers(1, 6))):
            call = calls[data.draw(st.integers(0, len(calls) - 1))]
            try:
                call()
            except EXPECTED:
                pass
        assert int(t.size()) >= 0
        t.export()

    check()
    print("ok")
''')

FILES = PRELUDE + textwrap.dedent('''
    import tempfile
    tmp = tempfile.mkdtemp()
    good = os.path.join(tmp, "good")
    src = native.NativeKVTable(tf.string, tf.float32, 3, "src")
    src.insert(tf.constant([b"x" * i for i in range(50)]), tf.ones([50, 3]))
    src.save_to(good)
    GOOD = open(good, "rb").read()

    @settings_(120)
    @given(st.data())
    def check(data):
        mode = data.draw(st.sampled_from(["random", "mutated", "intact"]))
        if mode == "random":
            blob = data.draw(st.binary(max_size=300))
        elif mode == "intact":
            blob = GOOD
        else:  # a valid file with a few bytes replaced, inserted or cut
            blob = bytearray(GOOD)
            for _ in range(data.draw(st.integers(1, 4))):
                pos = data.draw(st.integers(0, len(blob) - 1))
                how = data.draw(st.sampled_from(["set", "cut", "insert"]))
                if how == "set":
                    blob[pos] = data.draw(st.integers(0, 255))
                elif how == "cut":
                    del blob[pos:pos + data.draw(st.integers(1, 64))]
                else:
                    blob[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
            blob = bytes(blob)
        path = os.path.join(tmp, "fuzzed")
        with open(path, "wb") as f:
            f.write(blob)
        t = native.NativeKVTable(tf.string, tf.float32, 3, "dst")
        t.insert(tf.constant([b"keep"]), tf.ones([1, 3]))
        try:
            t.load_from(path)
            assert blob == GOOD  # only the intact file may load
            assert int(t.size()) == 50
        except tf.errors.OpError:
            keys, _ = t.export()
            assert keys.numpy().tolist() == [b"keep"]  # a failed load changes nothing

    check()
    print("ok")
''')


def run_child(script, timeout=240):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO)
    out = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode >= 0, f"child crashed with signal {-proc.returncode}:\n{out}"
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), out


def test_random_op_sequences_match_dict_model():
    run_child(MODEL)


def test_malformed_inputs_never_crash():
    run_child(RAW)


def test_corrupt_files_never_crash_or_partially_load():
    run_child(FILES)
