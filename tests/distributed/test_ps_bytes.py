"""Bytes a training step moves on a real cluster (counted per socket, not timed): with the
optimizer's update applied on the PS a step moves little more than the minimum -- the batch's
unique ids, their rows back, their gradients out -- where the trainer-side path moved the rows
and every Adam slot both ways (3-4x). Runs benchmarks/ps_training.py's TF2 client and TF1
trainer on a 2-PS LocalCluster (every process killed by pid at its end)."""

import json
import os
import subprocess
import sys

import tfra_dynamic_embedding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tfra_dynamic_embedding.__file__)))


def test_a_step_moves_little_more_than_the_minimum():
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "ps_training.py"), "--modes", "tf2,tf1",
         "--no-local", "--ps", "2", "--tf1-ps", "2", "--trainers", "1", "--steps", "3",
         "--warmup", "2", "--timeout", "240"],
        capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    rows = {r["config"]: r for r in json.loads(result.stdout.splitlines()[-1])["results"]}
    tf2, tf1 = rows["tf2 ps=2"], rows["tf1 ps=2 x1"]
    for row in (tf2, tf1):
        assert row["min_bytes_per_step"] > 1e6 and row["wire_bytes_per_step"] > 0
    # TF2 client: ids twice, rows in, gradients out, and a little framing.
    assert tf2["ratio"] <= 1.3, tf2
    # TF1: the dense weights live on the PS tasks and travel too (about 1.1 MB a step).
    assert tf1["ratio"] <= 1.5, tf1
    # The update reached the PS: both PS tasks hold rows of every step's ids.
    assert all(n > 0 for n in tf2["rows_per_ps"].values())
    # Each PS runs one lookup op and one update op per step for all 26 tables.
    assert tf2["table_ops_per_ps"] == {
        f"/job:ps/replica:0/task:{i}/device:CPU:0": {"TfraDeFindInitGroup": 1,
                                                     "TfraDeApplyGradients": 1}
        for i in range(2)}, tf2["table_ops_per_ps"]
