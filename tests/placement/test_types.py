"""TableSpec / DeviceSpec / Task / Plan: validation, sizes, JSON round trips, hand edits."""

import json

import pytest

from tfra_dynamic_embedding.placement import cost_model, estimators, proposers
from tfra_dynamic_embedding.placement.types import (DeviceCost, DeviceSpec, Estimator,
                                                    PlacementError, Plan, Proposer, TableSpec,
                                                    Task, format_bytes, make_devices, parse_bytes)

from .helpers import table, task


def test_parse_bytes_units_and_errors():
    assert parse_bytes("16GiB") == 16 * 2 ** 30
    assert parse_bytes("1.5 GB") == 1_500_000_000
    assert parse_bytes("512MiB") == 512 * 2 ** 20
    assert parse_bytes(1000) == 1000
    assert parse_bytes("1e3") == 1000
    assert parse_bytes(None) is None
    with pytest.raises(ValueError, match=r"memory must be .*'16 parsecs'"):
        parse_bytes("16 parsecs")
    with pytest.raises(ValueError, match="non-negative"):
        parse_bytes(-5)
    assert format_bytes(3 * 2 ** 30) == "3.00 GiB"
    assert format_bytes(12) == "12 B"


def test_table_spec_validation_names_argument_and_value():
    assert TableSpec("a", rows=10, dim=4).size_bytes == 160
    with pytest.raises(ValueError, match=r"dim of table 'a' must be an integer >= 1; got 0"):
        TableSpec("a", rows=10, dim=0)
    with pytest.raises(ValueError, match=r"rows of table 'a' .*got 2.5"):
        TableSpec("a", rows=2.5, dim=4)
    with pytest.raises(ValueError, match=r"pooling_factor of table 'a' must be >= 0; got -1"):
        TableSpec("a", rows=10, dim=4, pooling_factor=-1)
    with pytest.raises(ValueError, match="reuse_histogram of table 'a' must be 17"):
        TableSpec("a", rows=10, dim=4, reuse_histogram=[1.0])
    with pytest.raises(ValueError, match="'kind'"):
        TableSpec("a", rows=10, dim=4, stream={"path": "x"})


def test_slices_partition_rows_by_key_mod():
    t = TableSpec("big", rows=10, dim=2, bytes_per_value=4)
    assert [t.slice_rows(i, 3) for i in range(3)] == [4, 3, 3]   # keys 0,3,6,9 | 1,4,7 | 2,5,8
    assert [t.slice_bytes(i, 3) for i in range(3)] == [32, 24, 24]


def test_task_rejects_duplicates_and_no_devices():
    with pytest.raises(ValueError, match=r"table names must be unique; repeated: \['a'\]"):
        task([table("a", 1), table("a", 2)])
    with pytest.raises(ValueError, match="at least one device"):
        Task([table("a", 1)], [])
    assert [d.name for d in make_devices(2, "1KiB", "/GPU:{i}")] == ["/GPU:0", "/GPU:1"]
    assert make_devices(1, "1KiB")[0].memory_bytes == 1024


def _plan():
    tables = [table("user", 100, dim=2, pooling=3.0, group="net0"),
              TableSpec("item", rows=10, dim=4, bytes_per_value=4, pooling_factor=1.5,
                        reuse_histogram=[1.0] + [0.0] * 16, stream={"kind": "synthetic",
                                                                     "seed": 3})]
    t = Task(tables, [DeviceSpec("/GPU:0", "1KiB"), DeviceSpec("/GPU:1", 4096)], batch_size=64,
             name="demo")
    return Plan(t, {"user": "/GPU:1", "item": ["/GPU:0", "/GPU:1"]}, strategy="by-hand")


def test_plan_memory_devices_and_shards():
    plan = _plan()
    assert plan.devices_for("user") == ["/GPU:1"]
    assert plan.devices_for("item") == ["/GPU:0", "/GPU:1"]
    # item: 10 rows x 16 B split 5/5; user: 200 B whole.
    assert plan.memory_by_device() == {"/GPU:0": 80, "/GPU:1": 280}
    assert plan.per_device["/GPU:1"].memory_bytes == 280
    assert [(s.table.name, s.device, s.index, s.num_slices) for s in plan.shards()] == [
        ("user", "/GPU:1", 0, 1), ("item", "/GPU:0", 0, 2), ("item", "/GPU:1", 1, 2)]
    by_device = {d: [(s.table.name, s.index) for s in shards]
                 for d, shards in plan.shards_by_device().items()}
    assert by_device == {"/GPU:0": [("item", 0)], "/GPU:1": [("user", 0), ("item", 1)]}
    with pytest.raises(KeyError, match="'nope' is not in the plan"):
        plan.devices_for("nope")


def test_plan_json_round_trip_keeps_everything(tmp_path):
    plan = _plan()
    plan.per_device["/GPU:0"].predicted_cost = 0.5
    plan.per_device["/GPU:1"].measured_cost = 0.25
    path = tmp_path / "plan.json"
    plan.save(path)
    again = Plan.load(path)
    assert again.assignment == plan.assignment
    assert again.task.to_dict() == plan.task.to_dict()
    assert again.per_device == {"/GPU:0": DeviceCost(80, 0.5, None),
                                "/GPU:1": DeviceCost(280, None, 0.25)}
    assert again.strategy == "by-hand"
    assert again.to_dict() == plan.to_dict()
    assert "edited" not in again.meta


def test_hand_edited_plan_is_revalidated_and_drops_stale_costs(tmp_path):
    plan = _plan()
    plan.per_device["/GPU:0"].predicted_cost = 0.5
    data = json.loads(plan.to_json())
    data["assignment"]["user"] = ["/GPU:0"]            # a person moves a table
    edited = Plan.from_dict(data)
    assert edited.memory_by_device() == {"/GPU:0": 280, "/GPU:1": 80}
    assert edited.per_device["/GPU:0"].predicted_cost is None
    assert edited.meta["edited"] is True
    data["assignment"]["user"] = ["/GPU:7"]
    with pytest.raises(ValueError, match=r"unknown devices \['/GPU:7'\]"):
        Plan.from_dict(data)
    data["assignment"]["user"] = ["/GPU:0"]
    data["assignment"]["item"] = ["/GPU:0", "/GPU:0"]
    with pytest.raises(ValueError, match="distinct devices"):
        Plan.from_dict(data)
    del data["assignment"]["item"]
    with pytest.raises(ValueError, match=r"unplaced tables \['item'\]"):
        Plan.from_dict(data)
    with pytest.raises(ValueError, match="not a plan file"):
        Plan.from_dict({"format": "other"})


def test_plan_validate_memory_names_tables_and_excess():
    plan = _plan()
    plan.task.devices[0].memory_bytes = 50      # /GPU:0 holds 80 B
    with pytest.raises(PlacementError, match=r"/GPU:0 over by 30 B .*\['item'\]") as info:
        plan.validate()
    assert info.value.tables == ["item"] and info.value.shortfall_bytes == 30



def test_the_built_in_stages_have_the_stage_interfaces():
    for name in ("analytic", "learned"):
        assert isinstance(estimators.get_estimator(name), Estimator)
    assert isinstance(cost_model.LearnedEstimator(), Estimator)
    for name in proposers.list_strategies():
        assert isinstance(proposers.get_strategy(name), Proposer), name
    assert not isinstance(object(), Estimator) and not isinstance(object(), Proposer)
