"""`tfra-de demo --ps 2` (issue 19, item 8): the demo's DLRM trains with its tables on two PS
processes, evaluates, checkpoints, exports a SavedModel that stock TensorFlow serves, and tears
the cluster down. Runs the demo as its own process (it connects to a cluster), bounded."""

import json
import os
import re
import subprocess
import sys

import numpy as np

import tfra_dynamic_embedding
from tfra_dynamic_embedding.demo import criteo, run

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tfra_dynamic_embedding.__file__)))


def test_demo_trains_on_two_ps_processes(tmp_path):
    out = str(tmp_path / "demo")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p))
    result = subprocess.run(
        [sys.executable, "-m", "tfra_dynamic_embedding.cli", "demo", "--ps", "2",
         "--rows", "3000", "--batch-size", "250", "--learning-rate", "0.01", "--seed", "0",
         "--verbose", "0", "--out", out],
        capture_output=True, text=True, env=env, timeout=240, check=False)
    printed = result.stdout + result.stderr
    assert result.returncode == 0, printed[-4000:]
    with open(os.path.join(out, "metrics.json"), encoding="utf-8") as f:
        metrics = json.load(f)

    # Every table has one shard on each PS task, and those shards hold all of its rows.
    ps_devices = {f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(2)}
    assert set(metrics["table_sizes"]) == {f"C{i + 1}" for i in range(26)}
    for feature, rows in metrics["table_sizes"].items():
        shards = metrics["ps_table_sizes"][feature]
        assert set(shards) == ps_devices, feature
        assert sum(shards.values()) == rows > 0, feature
    assert all(n > 0 for n in metrics["ps_rows"].values())
    assert sum(metrics["ps_rows"].values()) == sum(metrics["table_sizes"].values())

    # It learned something (seed 0: about 0.64 on the 300 held-out rows).
    assert isinstance(metrics["auc"], float) and metrics["auc"] > 0.5
    assert os.path.exists(metrics["checkpoint"] + ".index")

    # The SavedModel loads and serves in a fresh stock-TensorFlow process, no cluster around.
    assert metrics["serving_max_abs_diff"] < 1e-5
    path = os.path.join(out, run.SYNTHETIC_FILE)
    raw, _ = next(iter(criteo.read_tsv(path, 8, skip=2700, take=8, raw=True)))
    served = np.asarray(run.serve_in_fresh_process(
        metrics["saved_model"], raw["dense"].numpy(), raw["categorical"].numpy()))
    assert served.shape == (8,) and ((served > 0) & (served < 1)).all()

    # The PS processes are gone.
    pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", printed)]
    assert len(pids) == 2
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"PS process {pid} outlived the demo")
