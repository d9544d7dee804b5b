"""The capacity model (distributed/capacity.py): record bytes equal the native table's, the
estimate's arithmetic, fitting recovers known costs, the command line and bad input."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_recommenders_addons.dynamic_embedding as de
from tfra_dynamic_embedding.distributed import capacity


@pytest.mark.parametrize("optimizer, dim", [("sgd", 16), ("adagrad", 8), ("adam", 16),
                                            ("adam", 64)])
def test_record_bytes_are_the_native_tables(optimizer, dim):
    """A trained table's record memory per key equals the model's record size."""
    keys = tf.range(4096, dtype=tf.int64)
    emb = de.Variable(dim=dim, initializer=0.1)
    opt = de.DynamicEmbeddingOptimizer({"sgd": tf.keras.optimizers.SGD(0.1),
                                        "adagrad": tf.keras.optimizers.Adagrad(0.1),
                                        "adam": tf.keras.optimizers.Adam(0.1)}[optimizer])
    with tf.GradientTape() as tape:
        rows, wrapper = de.embedding_lookup(emb, keys, return_trainable=True)
        loss = tf.reduce_sum(rows)
    opt.apply_gradients(zip(tape.gradient(loss, [wrapper]), [wrapper]))
    parts = emb.shards.tables[0].memory_parts()
    per_record = int(parts["records"]) / int(parts["rows"])
    table = capacity.TableLoad("t", rows=4096, dim=dim, ids_per_step=1, optimizer=optimizer)
    assert per_record == table.record_bytes()
    index_per_key = int(parts["index"]) / 4096
    assert 4 / 0.875 <= index_per_key <= 4 / 0.4   # the index's load stays in its bounds


def test_estimate_adds_up():
    tables = [capacity.TableLoad("a", rows=10_000, dim=16, ids_per_step=100),
              capacity.TableLoad("b", rows=5_000, dim=8, ids_per_step=50, optimizer="sgd")]
    costs = capacity.Costs(step_ms=2.0, table_ms=0.5, row_us=10.0, framing_bytes=300.0)
    est = capacity.estimate(tables, ps=2, costs=costs, dense_bytes=1000)
    assert est.min_bytes_per_step == 100 * (8 + 128) + 50 * (8 + 64)
    assert est.wire_bytes_per_step == 100 * (16 + 128) + 50 * (16 + 64) + 2 * 300 + 1000
    assert est.ps_cpu_ms_per_step == pytest.approx(2.0 + 2 * 0.5 + 75 * 10.0 / 1e3)
    assert est.total_ps_cpu_ms_per_step == pytest.approx(2 * est.ps_cpu_ms_per_step)
    per_key_a = tables[0].record_bytes() + 4 / capacity.INDEX_LOAD
    per_key_b = tables[1].record_bytes() + 4 / capacity.INDEX_LOAD
    assert est.memory_per_ps_bytes == int(5_000 * per_key_a + 2_500 * per_key_b)


def test_fit_recovers_the_costs_it_was_given():
    true = capacity.Costs(step_ms=3.0, table_ms=0.2, row_us=4.0, framing_bytes=500.0)
    measured = []
    for ps in (1, 2, 4):
        tables = [capacity.TableLoad(f"t{i}", rows=1000, dim=16, ids_per_step=2000 + 300 * i)
                  for i in range(26)]
        est = capacity.estimate(tables, ps, true)
        payload = est.wire_bytes_per_step - ps * true.framing_bytes
        measured.append({"ps": ps, "tables": 26, "rows_per_step": sum(t.ids_per_step
                                                                      for t in tables),
                         "ps_cpu_ms_per_step": [est.ps_cpu_ms_per_step] * ps,
                         "wire_bytes_per_step": est.wire_bytes_per_step,
                         "payload_bytes_per_step": payload})
    fitted = capacity.fit(measured)
    assert fitted.step_ms == 0.0 and fitted.row_us == pytest.approx(4.0)
    # With 26 tables everywhere the fixed cost per task goes to the tables' term: the fit must
    # reproduce the measured CPU, and the framing exactly.
    assert fitted.framing_bytes == pytest.approx(500.0)
    for m in measured:
        got = (fitted.step_ms + 26 * fitted.table_ms
               + m["rows_per_step"] / m["ps"] * fitted.row_us / 1e3)
        np.testing.assert_allclose(got, m["ps_cpu_ms_per_step"][0], rtol=1e-6)


def test_fit_separates_fixed_and_per_table_costs_given_two_table_counts():
    true = capacity.Costs(step_ms=3.0, table_ms=0.2, row_us=4.0, framing_bytes=0.0)
    measured = []
    for ps, count in ((1, 10), (2, 26), (4, 26), (2, 10)):
        tables = [capacity.TableLoad(f"t{i}", rows=10, dim=4, ids_per_step=500 + 40 * i)
                  for i in range(count)]
        est = capacity.estimate(tables, ps, true)
        measured.append({"ps": ps, "tables": count,
                         "rows_per_step": sum(t.ids_per_step for t in tables),
                         "ps_cpu_ms_per_step": [est.ps_cpu_ms_per_step] * ps,
                         "wire_bytes_per_step": est.wire_bytes_per_step,
                         "payload_bytes_per_step": est.wire_bytes_per_step})
    fitted = capacity.fit(measured)
    assert (fitted.step_ms, fitted.table_ms, fitted.row_us) == pytest.approx((3.0, 0.2, 4.0))


def test_bad_tables_are_clear_errors():
    with pytest.raises(ValueError, match="optimizer of table 'x'"):
        capacity.TableLoad("x", rows=1, dim=4, ids_per_step=1, optimizer="nadam")
    with pytest.raises(ValueError, match="dim of table 'x'"):
        capacity.TableLoad("x", rows=1, dim=0, ids_per_step=1)
    with pytest.raises(ValueError, match="ps must be >= 1"):
        capacity.estimate([], 0, capacity.MEASURED_COSTS)


def test_command_line_prints_one_estimate_per_ps_count(tmp_path):
    path = tmp_path / "tables.json"
    path.write_text(json.dumps([{"name": "u", "rows": 1000, "dim": 8, "ids_per_step": 10}]))
    out = subprocess.run([sys.executable, "-m", "tfra_dynamic_embedding.cli", "capacity",
                          "--tables", str(path), "--ps", "1,3"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["ps"] for line in lines] == [1, 3]
    assert lines[0]["memory_per_ps_bytes"] > lines[1]["memory_per_ps_bytes"] > 0
