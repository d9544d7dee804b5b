"""Small builders shared by the placement tests."""

import argparse
import subprocess
import sys

from tfra_dynamic_embedding.placement.types import DeviceSpec, TableSpec, Task


def table(name, rows, dim=1, pooling=1.0, group=None, bytes_per_value=1):
    """A TableSpec whose size in bytes is rows * dim (bytes_per_value 1 keeps sums readable)."""
    return TableSpec(name, rows=rows, dim=dim, bytes_per_value=bytes_per_value,
                     pooling_factor=pooling, group=group)


def task(tables, num_devices=2, memory=None, batch_size=1000):
    memories = memory if isinstance(memory, (list, tuple)) else [memory] * num_devices
    devices = [DeviceSpec(f"/job:ps/task:{i}", m) for i, m in enumerate(memories)]
    return Task(list(tables), devices, batch_size=batch_size)


def by_device(plan):
    """{device index: sorted table names (slices as name#i)}."""
    out = {i: [] for i in range(plan.task.num_devices)}
    index = {d.name: i for i, d in enumerate(plan.task.devices)}
    for shard in plan.shards():
        label = shard.table.name if shard.num_slices == 1 else f"{shard.table.name}#{shard.index}"
        out[index[shard.device]].append(label)
    return {k: sorted(v) for k, v in out.items()}


def run_python(script, timeout=120):
    """Stripped stdout of `script` run in a fresh interpreter (fails the test on a non-zero exit,
    showing stderr): for checks of what a fresh process imports."""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=timeout, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def run_cli(argv):
    """Runs `tfra-de benchmark collect ...` in this process (argv after `tfra-de`); its exit code."""
    from tfra_dynamic_embedding.placement.benchmark import collect  # pylint: disable=import-outside-toplevel
    parser = argparse.ArgumentParser(prog="tfra-de")
    collect.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.run(args)
