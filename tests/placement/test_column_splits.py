"""Column-wise splits: plan data and JSON, the enumeration rule, the probe cost, the strategy that
cuts a hot wide table, and applying it (variables and a Keras layer that train like the whole
table) on 4 logical CPUs (tests/conftest.py)."""

import dataclasses
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfra_dynamic_embedding as de
from tfra_dynamic_embedding.placement import (apply, column_split, estimators, evaluate, pieces,
                                              policy, proposers)
from tfra_dynamic_embedding.placement.cost_model import LearnedEstimator
from tfra_dynamic_embedding.placement.planner import Planner
from tfra_dynamic_embedding.placement.types import (PLAN_FORMAT, PLAN_FORMAT_COLUMNS, DeviceCost,
                                                    DeviceSpec, Plan, Shard, TableSpec, Task,
                                                    column_block_spec, make_devices)

from .helpers import by_device

CPUS = [f"/CPU:{i}" for i in range(4)]


def cpu_of(device):
    assert device.startswith("/job:localhost/replica:0/task:0/device:CPU:"), device
    return "/CPU:" + device.rsplit(":", 1)[1]


def _plan(wide="wide", widths=(64, 32, 32), devices=("/CPU:2", "/CPU:0", "/CPU:3")):
    tables = [TableSpec(wide, rows=100, dim=sum(widths)), TableSpec("narrow", rows=10, dim=4),
              TableSpec("sliced", rows=10, dim=2)]
    task = Task(tables, [DeviceSpec(c, "1MiB") for c in CPUS], batch_size=64)
    return Plan(task, {wide: list(devices), "narrow": ["/CPU:1"],
                       "sliced": ["/CPU:0", "/CPU:1"]}, strategy="by-hand",
                columns={wide: list(widths)})


# -- plan data -----------------------------------------------------------------------------------
def test_plan_column_blocks_shards_and_memory():
    plan = _plan()
    assert plan.column_blocks("wide") == [(64, "/CPU:2"), (32, "/CPU:0"), (32, "/CPU:3")]
    assert plan.column_blocks("narrow") == [] and plan.column_blocks("sliced") == []
    assert plan.devices_for("wide") == ["/CPU:2", "/CPU:0", "/CPU:3"]
    assert [plan.num_slices(n) for n in ("wide", "narrow", "sliced")] == [1, 1, 2]
    assert plan.partitioner_for("wide") is None
    shards = plan.shards()
    assert [(s.table.name, s.device, s.col_offset, s.col_width, s.table.dim, s.index,
             s.num_slices) for s in shards] == [
        ("wide", "/CPU:2", 0, 64, 64, 0, 1), ("wide", "/CPU:0", 64, 32, 32, 0, 1),
        ("wide", "/CPU:3", 96, 32, 32, 0, 1), ("narrow", "/CPU:1", 0, 4, 4, 0, 1),
        ("sliced", "/CPU:0", 0, 2, 2, 0, 2), ("sliced", "/CPU:1", 0, 2, 2, 1, 2)]
    assert [s.is_column_block for s in shards] == [True] * 3 + [False] * 3
    assert all(s.source is plan.task.table(s.table.name) for s in shards)
    # wide: 100 rows x 4 B x (64 | 32 | 32) columns; narrow 160 B; sliced 5 rows x 8 B each.
    assert plan.memory_by_device() == {"/CPU:0": 12800 + 40, "/CPU:1": 160 + 40,
                                       "/CPU:2": 25600, "/CPU:3": 12800}


def test_plan_json_round_trip_and_old_plan_files(tmp_path):
    plan = _plan()
    plan.per_device["/CPU:2"].predicted_cost = 0.5
    path = tmp_path / "plan.json"
    plan.save(path)
    data = json.loads(path.read_text())
    assert data["format"] == PLAN_FORMAT_COLUMNS and data["columns"] == {"wide": [64, 32, 32]}
    again = Plan.load(path)
    assert again.columns == plan.columns and again.assignment == plan.assignment
    assert again.to_dict() == plan.to_dict()
    assert again.per_device["/CPU:2"] == DeviceCost(25600, 0.5, None)
    assert "edited" not in again.meta
    # A plan without column splits writes the old format and no "columns"; old files load.
    plain = Plan(plan.task, {"wide": ["/CPU:0"], "narrow": ["/CPU:1"], "sliced": ["/CPU:2"]})
    old = plain.to_dict()
    assert old["format"] == PLAN_FORMAT and "columns" not in old
    assert Plan.from_dict(old).columns == {}
    assert Plan.from_dict(old).digest() == plain.digest()
    # Hand edits of the widths are re-validated and drop the costs saved for the old split.
    data["columns"]["wide"] = [32, 64, 32]
    edited = Plan.from_dict(data)
    assert edited.column_blocks("wide")[1] == (64, "/CPU:0")
    assert edited.per_device["/CPU:2"].predicted_cost is None and edited.meta["edited"] is True


@pytest.mark.parametrize("columns, devices, message", [
    ({"wide": [64, 32, 16]}, None, r"column widths of table 'wide' must sum to its dim 128; "
                                   r"got \[64, 32, 16\] \(sum 112\)"),
    ({"wide": [64, 0, 64]}, None, r"column widths of table 'wide' must be a list of at least "
                                  r"2 positive integers; got \[64, 0, 64\]"),
    ({"wide": [128]}, ["/CPU:0"], r"at least 2 positive integers; got \[128\]"),
    ({"wide": 128}, None, r"must be a list of at least 2 positive integers; got 128"),
    ({"wide": [64, 64]}, None, r"table 'wide' is split into 2 column blocks \[64, 64\] but "
                               r"assigned 3 devices .*one device per block .*not both"),
    ({"wide": [64, 32, 32]}, ["/CPU:0", "/CPU:1", "/CPU:0"],
     r"column blocks of table 'wide' must lie on distinct devices; got \['/CPU:0', '/CPU:1', "
     r"'/CPU:0'\]"),
    ({"wide": [64, 32, 32], "nope": [1, 1]}, None,
     r"plan columns name tables not in the task: \['nope'\]"),
])
def test_validate_names_table_and_values(columns, devices, message):
    data = _plan().to_dict()
    data["columns"] = columns
    if devices is not None:
        data["assignment"]["wide"] = devices
    with pytest.raises(ValueError, match=message):
        Plan.from_dict(data)


def test_shard_column_blocks_see_the_block_width():
    spec = TableSpec("t", rows=10, dim=128, bytes_per_value=2, pooling_factor=3.0)
    block = Shard(spec, "d", col_offset=32, col_width=32)
    assert block.table.dim == 32 and block.table.rows == 10 and block.table.name == "t"
    assert block.table.pooling_factor == 3.0 and spec.dim == 128
    assert block.size_bytes == 10 * 32 * 2 and block.fraction == 1.0
    # One spec object per block, so the learned cost model's id-keyed cache keeps hitting.
    assert block.table is Shard(spec, "e", col_offset=0, col_width=32).table
    assert column_block_spec(spec, 128) is spec and Shard(spec, "d").table is spec
    with pytest.raises(ValueError, match=r"column block of table 't' \(dim 128\) must lie within "
                                         r"its columns; got col_offset=96, col_width=64"):
        Shard(spec, "d", col_offset=96, col_width=64)
    with pytest.raises(ValueError, match="cut by rows or by columns, not both; got 2 row slices"):
        Shard(spec, "d", 0, 2, col_offset=0, col_width=64)


# -- enumeration ---------------------------------------------------------------------------------
def test_column_split_rule():
    task = Task([TableSpec("big", rows=100, dim=128)], make_devices(8, "1MiB"))
    rule = lambda dim, devices=8, rows=100, memory="1MiB": pieces.column_splits(  # noqa: E731
        TableSpec("x", rows=rows, dim=dim), Task([TableSpec("y", 1, 1)],
                                                 make_devices(devices, memory)))
    assert rule(128) == [2, 4, 8]                # widths 64, 32, 16
    assert rule(128, devices=4) == [2, 4]        # no more blocks than devices
    assert rule(96) == [2, 3, 4, 6]              # blocks of >= 16 columns that divide 96
    assert rule(64) == [2, 4]
    assert rule(48) == [] and rule(63) == []     # narrower than MIN_COLUMN_DIM = 64
    assert rule(128, devices=1) == []
    # A table no device holds whole is cut by rows, never by columns.
    assert rule(128, rows=4096, memory="1MiB") == []
    assert pieces.min_slices(TableSpec("x", rows=4096, dim=128), task) == 2   # 2 MiB
    blocks = pieces.column_pieces(task.tables[0], 4)
    assert [(b.col_offset, b.col_width, b.device) for b in blocks] == [
        (0, 32, ""), (32, 32, ""), (64, 32, ""), (96, 32, "")]
    assert pieces.split_pieces(task, {"big": 4}) == blocks
    assert pieces.split_pieces(task) == [Shard(task.tables[0], "")]
    with pytest.raises(ValueError, match=r"num_blocks of table 'big' must be >= 2 and divide "
                                         r"its dim 128; got 3"):
        pieces.column_pieces(task.tables[0], 3)
    # Blocks need distinct devices with room: a 40 KiB table (dim 128 x 80 rows) on 2 devices
    # of 1 MiB and 6 of 4 KiB: 2 blocks of 20 KiB fit; 4 of 10 KiB or 8 of 5 KiB do not.
    table = TableSpec("w", rows=80, dim=128)
    roomy = Task([table], [DeviceSpec(f"/CPU:{i}", "1MiB" if i < 2 else "4KiB")
                           for i in range(8)])
    assert pieces.column_splits(table, roomy) == [2, 4, 8]
    assert pieces.column_options(table, roomy) == [2]
    # the fewest blocks whose block costs at most the limit, else the cheapest block
    assert pieces.fewest_blocks([2, 4, 8], {2: 5.0, 4: 3.0, 8: 2.5}, 3.2) == 4
    assert pieces.fewest_blocks([2, 4, 8], {2: 5.0, 4: 3.0, 8: 3.1}, 1.0) == 4


# -- estimators ----------------------------------------------------------------------------------
def _hot_task(pooling=4.0, devices=8):
    tables = [TableSpec("hot", rows=100_000, dim=128, pooling_factor=pooling)] + [
        TableSpec(f"t{i:02d}", rows=10_000, dim=16, pooling_factor=1.0) for i in range(15)]
    return Task(tables, make_devices(devices, "1GiB"), batch_size=4096)


def test_analytic_cost_of_a_column_block_charges_its_width_and_probes():
    task = Task([TableSpec("t", rows=10, dim=64, pooling_factor=2.0)], make_devices(2),
                batch_size=1000)
    table = task.tables[0]
    est = estimators.AnalyticEstimator(bandwidth=1e6, probe_bytes=100.0)
    whole = est.shard_cost(Shard(table, "d"), task)
    assert whole == pytest.approx(256 * (3 * 2000 + 2 * 1000) / 1e6)
    block = est.shard_cost(Shard(table, "d", col_offset=16, col_width=16), task)
    # 64 B of the block's row x 8000 rows moved, + 100 B per lookup x 2000 lookups.
    assert block == pytest.approx((64 * 8000 + 100 * 2000) / 1e6)
    blocks = sum(est.shard_cost(b, task) for b in pieces.column_pieces(table, 4))
    assert blocks == pytest.approx(whole + 4 * 100 * 2000 / 1e6)   # one probe per key per block
    assert estimators.AnalyticEstimator(1e6, probe_bytes=0).shard_cost(
        Shard(table, "d", col_offset=16, col_width=16), task) == pytest.approx(whole / 4)
    with pytest.raises(ValueError, match="probe_bytes must be >= 0 bytes per lookup; got -1"):
        estimators.AnalyticEstimator(probe_bytes=-1)


def test_rows_or_columns_depends_on_lookups_per_sample():
    """Row slices divide the lookups but every slice writes a pooled row per sample; column
    blocks divide the row bytes but probe every key: few lookups per sample favour columns."""
    est = estimators.get_estimator("analytic")
    for pooling, columns_cheaper in ((4.0, True), (60.0, False)):
        task = _hot_task(pooling)
        hot = task.tables[0]
        row_slice = est.shard_cost(Shard(hot, "", 0, 8), task)
        block = est.shard_cost(pieces.column_pieces(hot, 8)[0], task)
        assert (block < row_slice) == columns_cheaper, pooling


def test_learned_estimator_sees_a_block_as_a_table_of_its_width():
    task = _hot_task()
    hot = task.tables[0]
    est = LearnedEstimator()
    block = est.device_cost([Shard(hot, "", col_offset=32, col_width=32)], None, task)
    narrow = est.device_cost([Shard(dataclasses.replace(hot, dim=32), "")], None, task)
    assert block == pytest.approx(narrow)
    assert block != pytest.approx(est.device_cost([Shard(hot, "")], None, task))


# -- proposing -----------------------------------------------------------------------------------
def test_column_greedy_cuts_the_hot_wide_table_and_wins():
    task = _hot_task()
    est = estimators.get_estimator("analytic")
    hot_cost = est.shard_cost(Shard(task.tables[0], ""), task)
    average = sum(est.shard_cost(Shard(t, ""), task) for t in task.tables) / 8
    assert hot_cost > 2 * average
    assert proposers.hot_column_splits(task, est) == {"hot": 8}
    plan = proposers.propose(task, "column-greedy")
    assert plan.strategy == "column-greedy" and plan.columns == {"hot": [16] * 8}
    assert sorted(plan.devices_for("hot")) == sorted(d.name for d in task.devices)
    column_max = max(est.plan_costs(plan).values())
    # Any table-wise plan holds the whole hot table on one device: max cost >= its cost.
    assert column_max < 0.35 * hot_cost
    for name in proposers.list_strategies():
        if name != "column-greedy":
            other = proposers.propose(task, name)
            assert not other.columns, name
            assert max(est.plan_costs(other).values()) >= hot_cost > column_max, name
    choice = Planner("analytic").plan(task)
    assert choice.plan.strategy == "column-greedy" and choice.plan.columns == plan.columns
    assert choice.candidates[0].max_cost == pytest.approx(column_max)
    assert choice.margin > 1.0
    again = Plan.from_json(choice.plan.to_json())
    assert max(est.plan_costs(again).values()) == pytest.approx(column_max)
    # The lower bound counts the hot table by its cheapest column split, so it still bounds the
    # column plan (whole, the hot table alone would put it above that plan).
    bound = evaluate.lower_bound(task, est)
    block = max(est.shard_cost(b, task) for b in pieces.column_pieces(task.tables[0], 8))
    assert bound == pytest.approx(max(block, average)) and bound <= column_max < hot_cost
    assert evaluate.evaluate_plan(plan, est, num_random=0, record=False).gap >= 0


def test_column_greedy_is_cost_greedy_where_no_split_pays():
    # No table costs more than the per-device average: nothing to cut.
    even = Task([TableSpec(f"e{i}", rows=1000, dim=64 * (1 + i % 2), pooling_factor=2.0)
                 for i in range(12)], make_devices(4), batch_size=1024)
    assert proposers.hot_column_splits(even) == {}
    # A hot table on 2 devices: its 2 blocks would load both devices, worse than table-wise.
    pair = Task([TableSpec("a", rows=1000, dim=128, pooling_factor=10.0),
                 TableSpec("b", rows=1000, dim=128, pooling_factor=8.0)], make_devices(2),
                batch_size=1024)
    assert proposers.hot_column_splits(pair) == {"a": 2}
    for task in (even, pair):
        plan = proposers.propose(task, "column-greedy")
        greedy = proposers.propose(task, "cost-greedy")
        assert plan.columns == {} and plan.assignment == greedy.assignment
        choice = Planner().plan(task)     # ties go to the strategy listed first
        assert choice.plan.strategy != "column-greedy"


def test_column_blocks_go_only_where_they_fit():
    task = _hot_task(devices=8)
    task.devices[0].memory_bytes = 1000        # no block of "hot" fits /job:ps/task:0
    assert proposers.hot_column_splits(task) == {"hot": 4}    # 8 blocks need 8 devices
    plan = proposers.propose(task, "column-greedy")
    assert plan.columns == {"hot": [32] * 4}
    assert len(set(plan.devices_for("hot"))) == 4 and "/job:ps/task:0" not in plan.devices_for(
        "hot")
    assert by_device(plan)[0] == []
    # One device with room: no split (blocks need distinct devices); cost-greedy's plan.
    for device in task.devices[1:7]:
        device.memory_bytes = 1000
    assert proposers.hot_column_splits(task) == {}
    plan = proposers.propose(task, "column-greedy")
    assert plan.columns == {} and plan.assignment == proposers.propose(
        task, "cost-greedy").assignment


def _wide_gpu_task(dim=512):
    """One wide, hot table among 30 narrow ones on 8 GPUs: row slices of it would each still
    send its full-width partial sums through the all-to-all; column blocks send their width."""
    tables = [TableSpec("hot", rows=10**6, dim=dim, pooling_factor=10.0)] + [
        TableSpec(f"n{i:02d}", rows=100_000, dim=32, pooling_factor=2.0) for i in range(30)]
    return Task(tables, make_devices(8, "16GiB", "/GPU:{i}"), batch_size=65536)


def _rows_only_learned(task, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(policy, "column_splits", lambda *args, **kwargs: [])
        return proposers.propose(task, "learned")


def test_learned_cuts_a_hot_wide_table_by_columns(monkeypatch):
    task = _wide_gpu_task()
    est = LearnedEstimator()
    plan = proposers.propose(task, "learned")
    widths = plan.columns["hot"]
    assert len(widths) >= 2 and sum(widths) == 512 and len(set(widths)) == 1
    assert len(set(plan.devices_for("hot"))) == len(widths)          # blocks on distinct GPUs
    assert plan.meta["column_split_tables"] == ["hot"] and plan.meta["by_columns"]
    learned_max = max(est.plan_costs(plan).values())
    assert learned_max == pytest.approx(plan.meta["predicted_max_ms"] / 1e3, rel=1e-6)
    rows_only = _rows_only_learned(task, monkeypatch)
    assert rows_only.columns == {}
    assert learned_max < (1 - policy.COLUMN_MARGIN) * max(est.plan_costs(rows_only).values())
    for name in ("cost-greedy", "column-greedy"):
        other = proposers.propose(task, name, estimator=est)
        assert learned_max < max(est.plan_costs(other).values()), name
    choice = Planner().plan(task)
    assert choice.plan.strategy == "learned" and choice.plan.columns == plan.columns
    again = Plan.from_json(plan.to_json())
    assert again.columns == plan.columns and again.assignment == plan.assignment
    # the blocks are what the Shards of the plan cost: one block per device, of its width
    blocks = [s for s in plan.shards() if s.source.name == "hot"]
    assert sorted(s.col_offset for s in blocks) == [sum(widths[:j]) for j in range(len(widths))]
    assert all(s.table.dim == widths[0] for s in blocks)


def test_learned_keeps_column_blocks_only_past_the_margin(monkeypatch):
    task = _wide_gpu_task()
    est = LearnedEstimator()
    cut = proposers.propose(task, "learned")
    rows_only = _rows_only_learned(task, monkeypatch)
    gain = 1 - max(est.plan_costs(cut).values()) / max(est.plan_costs(rows_only).values())
    assert gain > policy.COLUMN_MARGIN
    monkeypatch.setattr(policy, "COLUMN_MARGIN", min(gain + 0.01, 1.0))
    plan = proposers.propose(task, "learned")
    assert plan.columns == {} and plan.assignment == rows_only.assignment
    # narrow tables (dim < pieces.MIN_COLUMN_DIM) are never cut by columns, however hot
    narrow = Task([dataclasses.replace(task.tables[0], dim=32)] + task.tables[1:],
                  task.devices, batch_size=task.batch_size)
    assert proposers.propose(narrow, "learned").columns == {}


# -- applying ------------------------------------------------------------------------------------
def _apply_plan(name, widths=(4, 4), devices=("/CPU:2", "/CPU:0"), rows=100):
    task = Task([TableSpec(name, rows=rows, dim=sum(widths)),
                 TableSpec(f"{name}_other", rows=rows, dim=2)], [DeviceSpec(c) for c in CPUS])
    return Plan(task, {name: list(devices), f"{name}_other": ["/CPU:1"]},
                columns={name: list(widths)})


def test_get_variable_of_a_column_split_table_in_the_scope_raises():
    plan = _apply_plan("cs_scope")
    with plan.scope():
        with pytest.raises(ValueError, match=r"'cs_scope': the placement plan splits table "
                           r"'cs_scope' by columns into 2 blocks \(widths \[4, 4\].*"
                           r"column_split_variables\(plan, 'cs_scope'"):
            de.get_variable("cs_scope", dim=8)
        with tf.compat.v1.variable_scope("ctr"):
            with pytest.raises(ValueError, match="ColumnSplitEmbedding"):
                de.get_variable("cs_scope", dim=8)       # "ctr/cs_scope" matches too
        with pytest.raises(ValueError, match="splits table 'cs_scope' by columns"):
            de.keras.layers.Embedding(8, name="cs_scope")
        other = de.get_variable("cs_scope_other", dim=2)
    assert other.devices == ["/CPU:1"]
    with plan.scope(strict=True):   # block variables are the plan's: their block's device
        split = column_split.column_split_variables(plan, "cs_scope")
        block = de.get_variable(apply.block_name("cs_scope", 1), dim=4)
    assert block is split.variables[1]
    assert [cpu_of(apply.shard_devices(v)[0]) for v in split.variables] == ["/CPU:2", "/CPU:0"]


def test_column_split_variables_build_errors():
    plan = _apply_plan("cs_err")
    with pytest.raises(ValueError, match=r"does not split table 'cs_err_other' by columns"):
        column_split.column_split_variables(plan, "cs_err_other")
    with pytest.raises(KeyError, match="'nope' is not in the placement plan"):
        column_split.column_split_variables(plan, "nope")
    with pytest.raises(ValueError, match=r"dim of table 'cs_err' must be the plan's dim 8; "
                                         r"got 6"):
        column_split.column_split_variables(plan, "cs_err", dim=6)
    with pytest.raises(ValueError, match=r"takes devices from the plan; got \['devices'\]"):
        column_split.column_split_variables(plan, "cs_err", devices=["/CPU:0"])
    with pytest.raises(ValueError, match=r"embedding_size of table 'cs_err' must be the plan's "
                                         r"dim 8; got 4"):
        column_split.ColumnSplitEmbedding(plan, "cs_err", 4)


def _train(lookup, batches, targets, steps=3):
    """A few Adam steps of a weighted squared error on `lookup(ids)` (eager TF2, Keras 3)."""
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
    weights = tf.range(1.0, 11.0)   # unequal columns: a column mix-up changes the result
    for _ in range(steps):
        for ids, target in zip(batches, targets):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(weights * (lookup(ids) - target) ** 2)
            variables = tape.watched_variables()
            opt.apply_gradients(zip(tape.gradient(loss, variables), variables))


def test_split_variables_train_like_the_whole_table():
    plan = _apply_plan("cs_train", widths=(6, 2, 2), devices=("/CPU:3", "/CPU:1", "/CPU:0"))
    split = column_split.column_split_variables(plan, "cs_train",
                                                initializer=tf.zeros_initializer())
    whole = de.get_variable("cs_train_whole", dim=10, initializer=tf.zeros_initializer())
    assert split.dim == 10 and split.widths == [6, 2, 2] and split.devices == [
        "/CPU:3", "/CPU:1", "/CPU:0"]
    assert [cpu_of(apply.shard_devices(v)[0]) for v in split.variables] == split.devices
    assert [v.name for v in split.variables] == ["cs_train/col0", "cs_train/col1",
                                                 "cs_train/col2"]
    known = tf.constant([1, 5, 7, 9], tf.int64)
    rows = tf.random.stateless_normal([4, 10], seed=[1, 2])
    split.upsert(known, rows)
    whole.upsert(known, rows)
    np.testing.assert_array_equal(split.lookup(known).numpy(), rows.numpy())
    np.testing.assert_array_equal(split.variables[1].lookup(known).numpy(), rows.numpy()[:, 6:8])
    # Repeated ids (their gradients sum) and an id never upserted (zero row, created by Adam).
    batches = [tf.constant([[1, 5], [1, 1]], tf.int64), tf.constant([[7, 3], [5, 7]], tf.int64)]
    targets = [tf.random.stateless_normal([2, 2, 10], seed=[3, k]) for k in range(2)]
    _train(split.embedding_lookup, batches, targets)
    _train(lambda ids: de.embedding_lookup(whole, ids), batches, targets)
    everything = tf.constant([1, 3, 5, 7, 9], tf.int64)
    got, want = split.lookup(everything).numpy(), whole.lookup(everything).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert np.abs(got[:3] - rows.numpy()[:3]).max() > 0.1      # it did train
    np.testing.assert_array_equal(got[4], rows.numpy()[3])      # id 9: not in a batch
    assert int(split.size()) == int(whole.size()) == 5
    assert [int(v.size()) for v in split.variables] == [5, 5, 5]


def _keras_model(layer):
    keras.utils.set_random_seed(0)
    ids = keras.Input(shape=(3,), dtype="int64")
    out = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(0.1))(layer(ids))
    model = keras.Model(ids, out)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)),
                  loss="mse")
    return model


def test_keras_layer_trains_like_the_unsplit_layer():
    plan = _apply_plan("cs_keras", widths=(4, 4), devices=("/CPU:2", "/CPU:0"))
    zeros = keras.initializers.Zeros()
    split = column_split.ColumnSplitEmbedding(plan, "cs_keras", 8, pooling="sum",
                                              initializer=zeros)
    whole = de.keras.layers.Embedding(8, pooling="sum", initializer=zeros, name="cs_keras_w")
    assert isinstance(split, keras.layers.Layer) and split.keras == "keras"
    assert [b.name for b in split.blocks] == ["cs_keras_col0", "cs_keras_col1"]
    assert [cpu_of(apply.shard_devices(b.params)[0]) for b in split.blocks] == ["/CPU:2",
                                                                               "/CPU:0"]
    split_model, whole_model = _keras_model(split), _keras_model(whole)
    assert len(split_model.trainable_weights) == 4      # 2 block lookups + dense kernel, bias
    known = tf.constant([1, 2, 3, 5, 7], tf.int64)
    rows = tf.random.stateless_normal([5, 8], seed=[5, 6])
    for j, block in enumerate(split.blocks):
        block.params.upsert(known, rows[:, 4 * j:4 * j + 4])
    whole.params.upsert(known, rows)
    x = np.array([[1, 5, 1], [7, 2, 3], [5, 5, 1], [3, 1, 8]], np.int64)
    y = np.arange(4, dtype=np.float32)[:, None]
    for model in (split_model, whole_model):
        model.fit(x, y, batch_size=2, epochs=2, verbose=0, shuffle=False)
    ids = tf.constant([1, 2, 3, 5, 7, 8], tf.int64)
    got = tf.concat([b.params.lookup(ids) for b in split.blocks], axis=-1).numpy()
    want = whole.params.lookup(ids).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert np.abs(got[:5] - rows.numpy()).max() > 0.01          # it did train
    np.testing.assert_allclose(split_model.predict(x, verbose=0),
                               whole_model.predict(x, verbose=0), rtol=0, atol=1e-6)


def test_sharded_export_refuses_a_column_split_table(tmp_path):
    from tfra_dynamic_embedding import inference   # pylint: disable=import-outside-toplevel
    ids = keras.Input(shape=(2,), dtype="int64", name="ids")
    layer = de.keras.layers.Embedding(8, pooling="sum", name="cs_export")
    model = keras.Model(ids, keras.layers.Dense(1)(layer(ids)))
    plan = _apply_plan("cs_export")
    with pytest.raises(ValueError, match=r"plan splits table 'cs_export' by columns .*row slices "
                                         r"only"):
        inference.export_sharded(model, plan, str(tmp_path / "export"))
    assert not (tmp_path / "export").exists()
