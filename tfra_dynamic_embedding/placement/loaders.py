"""Table lists from files: dlrm_datasets `.pt`, JSON/CSV lists, Criteo TSV (streams: streams.py).

- `load_dlrm_pt(path)`: Meta's embedding-lookup files (`indices, offsets, lengths = torch.load`,
  lengths [tables, batch], offsets of all bags back to back); needs PyTorch.
  `tables_from_dlrm_arrays` does the same from NumPy arrays.
- `load_tables(path)` / `save_tables(tables, path)`: a JSON list (or {"tables": [...]}, a task or
  a plan file) or a CSV with a header (name, rows, dim, bytes_per_value, pooling_factor, group,
  reuse_0 .. reuse_16; `hash_size` is accepted for rows).
- `criteo_tsv_stats(path)`: one TableSpec per categorical feature C1..C26 of a Criteo TSV
  (`label, I1..I13, C1..C26`, categorical values hex strings, empty = missing).

Example:
    >>> import os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> save_tables([TableSpec("user", rows=1000, dim=16)], os.path.join(tmp.name, "tables.csv"))
    >>> load_tables(os.path.join(tmp.name, "tables.csv"))
    [TableSpec(name='user', rows=1000, dim=16, bytes_per_value=4, pooling_factor=1.0, ...)]
    >>> day_0 = os.path.join(tmp.name, "day_0.tsv")    # 6 lines; each C column holds 3 values
    >>> with open(day_0, "w") as f:
    ...     f.writelines("\\t".join(["0"] + ["1"] * 13 + [f"{i % 3:08x}"] * 26) + "\\n"
    ...                  for i in range(6))
    >>> criteo = criteo_tsv_stats(day_0, dim=16, batch_size=6)
    >>> len(criteo), criteo[0].name, criteo[0].rows, criteo[0].reuse_histogram[:2]
    (26, 'C1', 3, [0.0, 1.0])
    >>> tmp.cleanup()
"""

import csv
import json
import os

import numpy as np

from tfra_dynamic_embedding.placement import streams
from tfra_dynamic_embedding.placement.types import NUM_REUSE_BINS, TableSpec

_CSV_FIELDS = ("name", "rows", "dim", "bytes_per_value", "pooling_factor", "group")


def tables_from_dlrm_arrays(indices, offsets, lengths, dim=16, bytes_per_value=4, name_prefix="t",
                            source=None):
    """TableSpecs of a dlrm_datasets batch: rows = max index + 1, pooling = mean bag length,
    reuse histogram measured on the batch; `source` (the file path) becomes the stream reference.
    """
    tables = []
    parts = streams.split_dlrm_arrays(indices, offsets, lengths)
    width = len(str(len(parts) - 1))
    for t, (idx, local) in enumerate(parts):
        stream = {"kind": "dlrm_pt", "path": source, "table": t} if source else None
        tables.append(TableSpec(
            f"{name_prefix}{t:0{width}d}", rows=int(idx.max()) + 1 if idx.size else 1, dim=dim,
            bytes_per_value=bytes_per_value,
            pooling_factor=float(local[-1]) / max(len(local) - 1, 1),
            reuse_histogram=[float(x) for x in streams.reuse_histogram(idx)], stream=stream))
    return tables


def load_dlrm_pt(path, dim=16, bytes_per_value=4, name_prefix="t"):
    """TableSpecs of a dlrm_datasets `.pt` file (needs torch; a clear ImportError otherwise)."""
    indices, offsets, lengths = streams.read_dlrm_pt(path)
    return tables_from_dlrm_arrays(indices, offsets, lengths, dim, bytes_per_value, name_prefix,
                                   source=os.fspath(path))


# -- JSON / CSV table lists ----------------------------------------------------------------------
def load_tables(path):
    """TableSpecs from a JSON (list, {"tables": [...]}, task or plan file) or CSV file."""
    path = os.fspath(path)
    if path.endswith(".csv"):
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        return [_table_from_csv_row(row, i + 2, path) for i, row in enumerate(rows)]
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is neither a CSV file (by name) nor valid JSON: "
                             f"{error}") from error
    if isinstance(data, dict):
        if "tables" not in data:
            raise ValueError(f"{path}: a JSON object must have a 'tables' list")
        data = data["tables"]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of tables; got {type(data).__name__}")
    return [TableSpec.from_dict(t) for t in data]


def _table_from_csv_row(row, line, path):
    row = {k.strip(): (v.strip() if isinstance(v, str) else v) for k, v in row.items() if k}
    data = {}
    try:
        data["name"] = row["name"]
        data["rows"] = int(float(row.get("rows") or row["hash_size"]))
        data["dim"] = int(row["dim"])
        if row.get("bytes_per_value"):
            data["bytes_per_value"] = int(row["bytes_per_value"])
        if row.get("pooling_factor"):
            data["pooling_factor"] = float(row["pooling_factor"])
        if row.get("group"):
            data["group"] = row["group"]
        reuse = [row.get(f"reuse_{i}") for i in range(NUM_REUSE_BINS)]
        if all(reuse):
            data["reuse_histogram"] = [float(x) for x in reuse]
        return TableSpec.from_dict(data)
    except KeyError as error:
        raise ValueError(f"{path}:{line}: missing column {error.args[0]!r} (need name, rows or "
                         f"hash_size, dim)") from error
    except ValueError as error:
        raise ValueError(f"{path}:{line}: {error}") from error


def save_tables(tables, path):
    """Writes TableSpecs as JSON ({"tables": [...]}) or, for a .csv path, as CSV."""
    path = os.fspath(path)
    if path.endswith(".csv"):
        fields = list(_CSV_FIELDS) + [f"reuse_{i}" for i in range(NUM_REUSE_BINS)]
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fields)
            writer.writeheader()
            for t in tables:
                row = {k: getattr(t, k) for k in _CSV_FIELDS}
                row["group"] = t.group or ""
                for i, x in enumerate(t.reuse_histogram or [""] * NUM_REUSE_BINS):
                    row[f"reuse_{i}"] = x
                writer.writerow(row)
        return
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"tables": [t.to_dict() for t in tables]}, f, indent=1)
        f.write("\n")


# -- Criteo TSV ------------------------------------------------------------------------------------
def criteo_tsv_stats(path, dim=16, batch_size=65536, max_lines=None, bytes_per_value=4):
    """One TableSpec per Criteo categorical feature, measured over batches of `batch_size` lines.

    rows = number of distinct values seen, pooling_factor = share of lines where the feature is
    present, reuse histogram pooled over batches (lookup-weighted). Each spec refers to its
    column stream ({"kind": "criteo_tsv", "path", "column", "batch_size"}).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
    num = len(streams.CRITEO_CATEGORICAL)
    distinct = [np.zeros(0, dtype=np.int64) for _ in range(num)]
    bin_lookups = np.zeros((num, NUM_REUSE_BINS))
    lookups = np.zeros(num)
    lines = 0
    for values, present in streams.criteo_batches(path, batch_size, max_lines):
        lines += len(values)
        for c in range(num):
            ids = values[present[:, c], c]
            if ids.size:
                uniq, counts = np.unique(ids, return_counts=True)
                distinct[c] = np.union1d(distinct[c], uniq)
                np.add.at(bin_lookups[c], streams.reuse_bin(counts), counts)
                lookups[c] += ids.size
    if lines == 0:
        raise ValueError(f"{path} has no data lines")
    tables = []
    for c, name in enumerate(streams.CRITEO_CATEGORICAL):
        hist = bin_lookups[c] / lookups[c] if lookups[c] else np.zeros(NUM_REUSE_BINS)
        tables.append(TableSpec(
            name, rows=max(1, distinct[c].size), dim=dim, bytes_per_value=bytes_per_value,
            pooling_factor=lookups[c] / lines, reuse_histogram=[float(x) for x in hist],
            stream={"kind": "criteo_tsv", "path": os.fspath(path), "column": name,
                    "batch_size": batch_size}))
    return tables
