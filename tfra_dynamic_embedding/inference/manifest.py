"""The sharded-export format: manifest.json, the row-split rule and signature names.

An export directory holds
    manifest.json      this module's `Manifest` as JSON (format "tfra-de-sharded/1")
    main/              SavedModel of the dense part
    shard_<i>/         SavedModel of sparse shard i: the table pieces the plan puts on one device

Row-split rule (the same as training's `de.default_partition_fn` and a Plan's row slices): piece
i of a table split into n holds the keys with
    int keys:    key mod n == i        (floor mod: never negative)
    string keys: tf.strings.to_hash_bucket_fast(key, n) == i   (FarmHash Fingerprint64 mod n)
`slice_of` is that rule; the exporter and every router use it.

Example (the manifest of an export that splits table "user_emb" in 2):
    >>> import tempfile
    >>> pieces = [Piece(piece_key(0, "user_emb", i), i, 2, shard_dir(i), f"/job:sparse/task:{i}")
    ...           for i in range(2)]
    >>> user = Feature("user", "user_emb", input="user", column=None, combiner=None,
    ...                key_dtype="int64", value_dtype="float32", dim=4, pieces=pieces)
    >>> export_dir = tempfile.TemporaryDirectory()
    >>> Manifest([user], {}, ["prediction"], {p.shard: p.device for p in pieces}).save(
    ...     export_dir.name)
    >>> manifest = Manifest.load(export_dir.name)
    >>> manifest.feature("user").pieces[1].shard, manifest.feature("user").pieces[1].key
    ('shard_1', 't0_user_emb_s1')
    >>> slice_of(np.array([-1, 5]), 4, "int64")      # floor mod: never negative
    array([3, 1], dtype=int32)
    >>> export_dir.cleanup()
"""

import dataclasses
import json
import os
import re
from typing import List, Optional

import numpy as np

FORMAT = "tfra-de-sharded/1"
MANIFEST_FILE = "manifest.json"
MAIN_DIR = "main"
SERVING_SIGNATURE = "serving_default"
SIZES_SIGNATURE = "table_sizes"   # shard: {piece key: number of keys} (no inputs)
KEYS_SIGNATURE = "table_keys"     # shard: {piece key: its keys} (no inputs)
DELTA_SIGNATURE = "apply_delta"   # shard: a delta applied in place (inference/live_deltas.py)
IDS_SUFFIX, SEGMENTS_SUFFIX, NUM_SEGMENTS_SUFFIX = "_ids", "_segments", "_num_segments"
# apply_delta's inputs per piece, in `_PieceTable.apply`'s order: distinct keys to upsert, their
# rows, keys to remove, and whether every key held before goes first (a full export).
DELTA_SUFFIXES = ("_upsert_keys", "_upsert_rows", "_removed", "_replace")
KEY_DTYPES = ("int32", "int64", "string")
COMBINERS = (None, "sum", "mean", "sqrtn")


def shard_dir(index):
    """Directory name of sparse shard `index`: 'shard_<index>'."""
    return f"shard_{index}"


def slice_of(keys, num_slices, key_dtype):
    """The row slice (int32 array, shape of `keys`) of every key of a table split `num_slices` ways.

    Example:
        >>> slice_of(np.array([7, -2]), 3, "int64")
        array([1, 1], dtype=int32)
        >>> slice_of(np.array([b"a", b"b"]), 1, "string")      # one slice holds every key
        array([0, 0], dtype=int32)
    """
    keys = np.asarray(keys)
    if num_slices == 1:
        return np.zeros(keys.shape, np.int32)
    if key_dtype == "string":
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        flat = tf.constant(keys.reshape(-1).astype(np.bytes_) if keys.size else
                           np.zeros([0], np.bytes_), tf.string)
        return tf.strings.to_hash_bucket_fast(flat, num_slices).numpy().astype(
            np.int32).reshape(keys.shape)
    return np.mod(keys.astype(np.int64), np.int64(num_slices)).astype(np.int32)


def delta_input_specs(key_dtype, value_dtype, dim):
    """{suffix: tf.TensorSpec} of one piece's `apply_delta` inputs (see DELTA_SUFFIXES)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    keys = tf.TensorSpec([None], key_dtype)
    return dict(zip(DELTA_SUFFIXES, (keys, tf.TensorSpec([None, dim], value_dtype), keys,
                                     tf.TensorSpec([], tf.bool))))


def piece_key(table_index, table_name, slice_index):
    """Signature-safe name of a table piece: 't<table>_<name>_s<slice>'."""
    return f"t{table_index}_{re.sub(r'[^A-Za-z0-9_]', '_', table_name)}_s{slice_index}"


@dataclasses.dataclass
class Piece:
    """Row slice `index` of `num_slices` of a table, held by `shard` under signature name `key`.

    The shard's serving signature takes `<key>_ids` ([N] keys), `<key>_segments` ([N] int32: the
    output cell of each id) and `<key>_num_segments` (scalar int32) and returns `<key>`:
    `[num_segments, dim]` sums of the rows of the ids in each cell (missing ids: zero rows).
    """

    key: str
    index: int
    num_slices: int
    shard: str
    device: str
    num_keys: int = 0


@dataclasses.dataclass
class Feature:
    """One embedding input of the model: where its ids are read and how they are pooled.

    ids = request[input] (or request[input][:, column]); combiner None: every id is a cell
    (output ids.shape + [dim]); else the last axis is pooled (output ids.shape[:-1] + [dim]):
    "sum" of the rows, "mean" sum / ids in the cell, "sqrtn" sum / sqrt(ids in the cell).
    The pooled value is the main model's input named `name`.
    """

    name: str
    table: str
    input: str
    column: Optional[int]
    combiner: Optional[str]   # the layer's `pooling` (None: a row per id)
    key_dtype: str
    value_dtype: str
    dim: int
    pieces: List[Piece]


@dataclasses.dataclass
class Manifest:
    """Everything a router needs: features -> tables -> pieces -> shards, and main's inputs.

    `main_inputs`: {name: {"dtype", "shape"}} of the request inputs main reads directly;
    `outputs`: names of main's outputs; `shards`: {shard dir: device of the plan}.
    """

    features: List[Feature]
    main_inputs: dict
    outputs: List[str]
    shards: dict
    request_inputs: dict = dataclasses.field(default_factory=dict)
    strategy: str = ""
    plan_digest: str = ""
    model: str = ""
    row_split: str = ("slice i of n: int keys with key mod n == i; string keys with "
                      "tf.strings.to_hash_bucket_fast(key, n) == i")
    missing_ids: str = "zero rows (the table's default row)"
    format: str = FORMAT

    def feature(self, name):
        for feature in self.features:
            if feature.name == name:
                return feature
        raise KeyError(f"no feature {name!r} in the manifest (features: "
                       f"{[f.name for f in self.features]})")

    def to_dict(self):
        data = dataclasses.asdict(self)
        data["signatures"] = {"main": SERVING_SIGNATURE, "shard": SERVING_SIGNATURE,
                              "shard_sizes": SIZES_SIGNATURE, "shard_keys": KEYS_SIGNATURE,
                              "shard_apply_delta": DELTA_SIGNATURE}
        return data

    @classmethod
    def from_dict(cls, data):
        if data.get("format") != FORMAT:
            raise ValueError(f"not a sharded export manifest: format must be {FORMAT!r}; "
                             f"got {data.get('format')!r}")
        data = {k: v for k, v in data.items() if k != "signatures"}
        features = [Feature(**{**f, "pieces": [Piece(**p) for p in f["pieces"]]})
                    for f in data.pop("features")]
        return cls(features=features, **data)

    def save(self, export_dir):
        with open(os.path.join(export_dir, MANIFEST_FILE), "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, export_dir):
        path = os.path.join(export_dir, MANIFEST_FILE)
        if not os.path.exists(path):
            raise ValueError(f"export_dir {export_dir!r} has no {MANIFEST_FILE}: not a sharded "
                             f"export")
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))
