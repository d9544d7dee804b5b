"""`tfra-de` end to end on a small pool: workloads generate -> plan -> evaluate -> re-score."""

import json
import os

import pytest

from tfra_dynamic_embedding import cli
from tfra_dynamic_embedding.placement import proposers
from tfra_dynamic_embedding.placement.types import Plan

from tests.placement.helpers import run_python

PACKAGE_DIR = os.path.dirname(os.path.abspath(cli.__file__))


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("pool")
    code = cli.main(["workloads", "generate", "--tables", "48", "--out", str(out), "--seed", "2",
                     "--batch-size", "4096", "--row-scale", "0.0625", "--split", "--tasks", "2",
                     "--tables-per-task", "12", "--devices", "4", "--memory", "256MiB",
                     "--batches", "1"])
    assert code == 0
    return out


def test_workloads_generate_writes_the_pool(pool_dir):
    names = sorted(os.listdir(pool_dir))
    assert names == ["batches", "summary.json", "tables.json", "tasks", "test.json", "train.json"]
    tables = json.loads((pool_dir / "tables.json").read_text())["tables"]
    assert len(tables) == 48 and tables[0]["stream"]["kind"] == "synthetic"
    summary = json.loads((pool_dir / "summary.json").read_text())
    assert summary["rows_max"] == 783_979 and summary["pooling_max"] == 193.0
    assert len(json.loads((pool_dir / "test.json").read_text())["tables"]) == 24
    assert sorted(os.listdir(pool_dir / "tasks")) == ["task000.json", "task001.json"]
    assert os.listdir(pool_dir / "batches") == ["batch000.npz"]


def test_plan_then_evaluate_then_rescore_an_edited_plan(capsys, pool_dir, tmp_path):
    plan_path, png = tmp_path / "plan.json", tmp_path / "plan.png"
    code, out, _ = run(capsys, "plan", "--tables", str(pool_dir / "tables.json"), "--devices", "4",
                       "--memory", "1GiB", "--batch-size", "4096", "--strategy", "lookup-greedy",
                       "--out", str(plan_path), "--plot", str(png), "--random", "3")
    assert code == 0, out
    assert "strategy lookup-greedy, estimator learned, 48 tables on 4 devices" in out
    assert "speedup over random" in out and f"wrote {plan_path}" in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    plan = Plan.load(plan_path)
    assert plan.strategy == "lookup-greedy" and plan.task.num_devices == 4
    assert all(c.predicted_cost > 0 for c in plan.per_device.values())
    assert plan.assignment == proposers.propose(plan.task, "lookup-greedy").assignment

    data = json.loads(plan_path.read_text())
    moved = plan.task.tables[0].name
    data["assignment"][moved] = ["/job:ps/task:3"]            # a person edits the plan
    plan_path.write_text(json.dumps(data))
    rescored = tmp_path / "rescored.json"
    code, out, _ = run(capsys, "evaluate", "--plan", str(plan_path), "--out", str(rescored),
                       "--random", "0")
    assert code == 0 and "max cost" in out
    again = Plan.load(rescored)
    assert again.devices_for(moved) == ["/job:ps/task:3"]
    assert all(c.predicted_cost is not None for c in again.per_device.values())


def test_evaluate_compares_all_strategies(capsys, pool_dir, tmp_path):
    png, rows_path = tmp_path / "cmp.png", tmp_path / "rows.json"
    code, out, _ = run(capsys, "evaluate", "--task", str(pool_dir / "tasks" / "task000.json"),
                       "--task", str(pool_dir / "tasks" / "task001.json"), "--strategies", "all",
                       "--random", "3", "--plot", str(png), "--json", str(rows_path))
    assert code == 0, out
    assert "2 task(s), 12 tables on 4 devices, estimator analytic" in out
    rows = json.loads(rows_path.read_text())
    assert [r["strategy"] for r in rows] == proposers.list_strategies()
    assert all(r["tasks"] == 2 and r["failures"] == 0 for r in rows)
    for name in proposers.list_strategies():
        assert name in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    code, out, _ = run(capsys, "evaluate", "--pool", "20", "--tasks", "2", "--tables-per-task",
                       "10", "--devices", "2", "--strategies", "lookup-greedy,random",
                       "--random", "2", "--no-plot")
    assert code == 0 and "2 task(s), 10 tables on 2 devices" in out and "wrote" not in out
    code, out, _ = run(capsys, "evaluate", "--list")
    assert code == 0 and "nsbp" in out and "estimators: analytic" in out


def test_plan_by_default_keeps_the_cheapest_proposal(capsys, pool_dir, tmp_path):
    plan_path = tmp_path / "plan.json"
    code, out, _ = run(capsys, "plan", "--tables", str(pool_dir / "tables.json"), "--devices", "4",
                       "--memory", "1GiB", "--batch-size", "4096", "--out", str(plan_path),
                       "--random", "0")
    assert code == 0, out
    costs = {}
    for line in out.splitlines():
        if line.strip().startswith("candidate "):
            _, name, *rest = line.split()
            if rest[0] == "max":
                costs[name] = float(rest[2])
    assert "learned" in costs and "lookup-greedy" in costs and "random" not in costs
    plan = Plan.load(plan_path)
    assert costs[plan.strategy] == min(costs.values())
    assert f"best: {plan.strategy} (by the learned estimator" in out


def test_plan_names_the_tables_it_cuts(capsys, tmp_path):
    """One wide hot table among narrow ones on 8 GPUs: the default plan cuts it by columns (the
    learned proposer's column blocks) and says how to build it."""
    tables = [{"name": "hot", "rows": 1_000_000, "dim": 512, "pooling_factor": 10.0}] + [
        {"name": f"n{i:02d}", "rows": 100_000, "dim": 32, "pooling_factor": 2.0}
        for i in range(30)]
    path, plan_path = tmp_path / "tables.json", tmp_path / "plan.json"
    path.write_text(json.dumps({"tables": tables}))
    code, out, _ = run(capsys, "plan", "--tables", str(path), "--devices", "8", "--memory",
                       "16GiB", "--device-template", "/GPU:{i}", "--random", "0",
                       "--out", str(plan_path))
    assert code == 0, out
    plan = Plan.load(plan_path)
    widths = plan.columns["hot"]
    assert len(widths) >= 2 and sum(widths) == 512
    assert (f"cut by columns (build them with placement.column_split): hot (widths {widths})"
            in out)
    assert "cut by rows" not in out


def test_cli_errors_are_clear(capsys, pool_dir, tmp_path):
    tables = str(pool_dir / "tables.json")
    code, _, err = run(capsys, "plan", "--tables", tables, "--strategy", "nope", "--out",
                       str(tmp_path / "p.json"))
    assert code == 2 and "--strategy must be 'best' or one of ['random'" in err
    assert "got 'nope'" in err
    code, _, err = run(capsys, "plan", "--tables", tables, "--devices", "2", "--memory", "400MiB",
                       "--out", str(tmp_path / "p.json"))
    assert code == 1 and "PlacementError: cannot place" in err and "Shortfall" in err
    code, _, err = run(capsys, "plan", "--devices", "2", "--out", str(tmp_path / "p.json"))
    assert code == 2 and "give the tables" in err
    code, _, err = run(capsys, "evaluate", "--pool", "8", "--strategies", "nope", "--no-plot")
    assert code == 2 and "--strategies must be 'all' or names" in err
    code, out, _ = run(capsys)
    assert code == 2 and "plan" in out and "workloads" in out
    with pytest.raises(SystemExit) as info:
        cli.main(["plan", "--help"])
    assert info.value.code == 0
    assert "--strategy" in capsys.readouterr().out


def test_placement_commands_do_not_import_tensorflow(tmp_path):
    """cli.py and placement/ never import TF themselves (the package __init__ is stubbed)."""
    script = (
        "import sys, types\n"
        f"pkg = types.ModuleType('tfra_dynamic_embedding'); pkg.__path__ = "
        f"[{PACKAGE_DIR!r}]\n"
        "sys.modules['tfra_dynamic_embedding'] = pkg\n"
        "from tfra_dynamic_embedding import cli\n"
        f"code = cli.main(['plan', '--pool', '16', '--devices', '4', '--out', "
        f"{str(tmp_path / 'p.json')!r}, '--random', '2'])\n"
        "assert code == 0, code\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n"
        "print('ok')\n")
    assert run_python(script).endswith("ok")
