"""Placement plans on a cluster (issue 19, item 7): inside `plan.scope()` a TF2 remote client's
tables (de.get_variable and Keras layers) land on the PS tasks the plan names, a row-sliced
table with slice i on the plan's i-th device (keys mod n)."""

from tests.distributed import procs


def _task(device):
    """'/job:ps/replica:0/task:1/device:CPU:0' or '/job:ps/task:1' -> 1."""
    return int(device.split("/task:")[1].split("/")[0])


def test_plan_scope_places_tables_on_their_ps_tasks(make_cluster):
    cluster = make_cluster(ps=2, chief=1, servers=("ps",))
    out = procs.run_script(cluster, "plan_client.py", timeout=180)
    assert set(out) == {"by_hand", "proposed"}
    for label, tables in out.items():
        assert set(tables) == {"user", "item", "ad"}, label
        for name, table in tables.items():
            assert table["shards"], (label, name)
            assert all(d.startswith("/job:ps/") for d in table["shards"]), (label, name, table)
            assert [_task(d) for d in table["shards"]] == [_task(d) for d in table["planned"]], \
                (label, name, table)
            assert sum(table["sizes"]) == 40, (label, name, table)
    by_hand = out["by_hand"]
    assert [_task(d) for d in by_hand["user"]["shards"]] == [1, 0]    # two row slices
    assert by_hand["user"]["sizes"] == [20, 20]                       # ids 1..40: keys mod 2
    assert [_task(d) for d in by_hand["item"]["shards"]] == [1]
    assert [_task(d) for d in by_hand["ad"]["shards"]] == [0]         # the Keras layer
