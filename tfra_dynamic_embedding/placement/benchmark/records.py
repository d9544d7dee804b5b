"""Benchmark records (JSONL, one measured shard per line): reading them back as data and shards.

Written by `collect.py`; read by the cost model's training (`train.load_records`). The
record format is described in collect.py and placement/data/README.md.

Example:
    >>> import json, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "shards.jsonl")
    >>> table = {"spec": {"name": "t0", "rows": 100, "dim": 16}, "slice": [1, 2],
    ...          "features": [0.125, 0.0, 0.0, 0.0] + [1.0] + [0.0] * 16}
    >>> with open(path, "w") as f:        # a record, then the torn line of an interrupted run
    ...     _ = f.write(json.dumps({"total_ms": 2.5, "tables": [table]}) + "\\n" + '{"tot')
    >>> for record in read_records(path):
    ...     shards = record_shards(record)     # [Shard], reuse histograms restored
    >>> shards[0].index, shards[0].num_slices, shards[0].table.reuse_histogram[:2]
    (1, 2, [1.0, 0.0])
    >>> tmp.cleanup()
"""

import gzip
import json
import os

from tfra_dynamic_embedding.placement.types import Shard, TableSpec


def record_shards(record):
    """The `Shard`s (tables and row slices) of a record; reuse histograms are restored from the
    features."""
    out = []
    for table in record["tables"]:
        spec = dict(table["spec"])
        hist = table["features"][4:]
        if "reuse_histogram" not in spec and sum(hist) > 0:
            spec["reuse_histogram"] = list(hist)
        index, num_slices = table.get("slice", (0, 1))
        out.append(Shard(TableSpec.from_dict(spec), "", int(index), int(num_slices)))
    return out


def read_records(path):
    """The records of a JSONL file, or of a gzipped one (`.gz`: how the package ships its data);
    a torn last line from an interrupted run is skipped."""
    out = []
    if not os.path.exists(path):
        return out
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
