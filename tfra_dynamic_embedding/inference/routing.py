"""Routing one request over a sharded export: ids grouped per shard, partial pools combined.

Plain numpy functions over a `Manifest`, shared by the in-process reference (`compose.py`) and an
RPC router: `route` gives the one call each shard gets (all its table pieces' ids at once),
`combine` sums the shards' partial pools into one pooled value per feature, `main_inputs` is
main's call.

In the example, one feature sums 2 ids per row; its table is split in 2 shards, each answered
by a stand-in whose row of id k is [k].

Example:
    >>> M = manifest_lib
    >>> pieces = [M.Piece(f"t0_ids_s{i}", i, 2, M.shard_dir(i), f"/job:sparse/task:{i}")
    ...           for i in range(2)]
    >>> feature = M.Feature("pooled", "ids", input="ids", column=None, combiner="sum",
    ...                     key_dtype="int64", value_dtype="float32", dim=1, pieces=pieces)
    >>> manifest = M.Manifest([feature], {"x": {}}, ["prediction"],
    ...                       {"shard_0": "/job:sparse/task:0", "shard_1": "/job:sparse/task:1"})
    >>> def call_shard(shard, inputs):                     # {piece key: [cells, dim] sums}
    ...     key = f"t0_ids_s{shard[-1]}"
    ...     return {key: np.bincount(inputs[key + "_segments"], inputs[key + "_ids"],
    ...                              inputs[key + "_num_segments"])[:, None]}
    >>> routed = route(manifest, {"x": np.ones([2, 1]), "ids": np.array([[1, 2], [3, 5]])})
    >>> routed.shard_inputs["shard_1"]["t0_ids_s1_ids"]           # the odd ids
    array([1, 3, 5])
    >>> outputs = {shard: call_shard(shard, inputs)
    ...            for shard, inputs in routed.shard_inputs.items()}
    >>> pooled = combine(manifest, routed, outputs)
    >>> main_inputs(manifest, routed, pooled)["pooled"]         # 1 + 2, 3 + 5: main's input
    array([[3.],
           [8.]])
"""

import dataclasses

import numpy as np

from tfra_dynamic_embedding.inference import manifest as manifest_lib


@dataclasses.dataclass
class RoutedRequest:
    """`shard_inputs`: {shard: {signature input: array}}, one call per shard; `cells`: {feature:
    output shape without dim}; `counts`: {feature: ids per output cell}; `dense`: main's inputs
    read from the request as they are."""

    shard_inputs: dict
    cells: dict
    counts: dict
    dense: dict


def feature_ids(feature, request):
    """The ids array of `feature` in `request` ({input name: array})."""
    if feature.input not in request:
        raise KeyError(f"request lacks input {feature.input!r} (feature {feature.name!r}); it "
                       f"has {sorted(request)}")
    ids = np.asarray(request[feature.input])
    if feature.column is not None:
        ids = ids[:, feature.column]
    if feature.key_dtype == "string":
        return ids.astype(np.bytes_) if ids.dtype.kind in "US" else ids
    return ids.astype(np.int64 if feature.key_dtype == "int64" else np.int32)


def cells_of(feature, ids):
    """(cell shape, flat ids, segment of every flat id): combiner None pools nothing (a cell per
    id); otherwise the cells are the leading axes and the last axis is pooled."""
    if feature.combiner is None:
        cell_shape, per_cell = ids.shape, 1
    else:
        if ids.ndim < 1:
            raise ValueError(f"feature {feature.name!r} pools its last axis; got scalar ids")
        cell_shape, per_cell = ids.shape[:-1], ids.shape[-1]
    num_cells = int(np.prod(cell_shape, dtype=np.int64))
    segments = np.repeat(np.arange(num_cells, dtype=np.int32), per_cell)
    return tuple(cell_shape), ids.reshape(-1), segments


def route(manifest, request):
    """Groups the request's ids per shard by the row-split rule (`manifest.slice_of`)."""
    shard_inputs = {shard: {} for shard in manifest.shards}
    cells, counts = {}, {}
    for feature in manifest.features:
        cell_shape, flat, segments = cells_of(feature, feature_ids(feature, request))
        num_cells = int(np.prod(cell_shape, dtype=np.int64))
        cells[feature.name] = cell_shape
        counts[feature.name] = np.bincount(segments, minlength=num_cells)
        slices = manifest_lib.slice_of(flat, len(feature.pieces), feature.key_dtype)
        for piece in feature.pieces:
            mine = slices == piece.index
            inputs = shard_inputs[piece.shard]
            inputs[piece.key + manifest_lib.IDS_SUFFIX] = flat[mine]
            inputs[piece.key + manifest_lib.SEGMENTS_SUFFIX] = segments[mine]
            inputs[piece.key + manifest_lib.NUM_SEGMENTS_SUFFIX] = np.int32(num_cells)
    dense = {}
    for name in manifest.main_inputs:
        if name not in request:
            raise KeyError(f"request lacks input {name!r}; it has {sorted(request)}")
        dense[name] = np.asarray(request[name])
    return RoutedRequest(shard_inputs, cells, counts, dense)


def combine(manifest, routed, shard_outputs):
    """{feature: pooled array} from {shard: {piece key: [cells, dim] partial sums}}."""
    pooled = {}
    for feature in manifest.features:
        total = None
        for piece in feature.pieces:
            part = np.asarray(shard_outputs[piece.shard][piece.key])
            total = part if total is None else total + part
        dtype = total.dtype
        if feature.combiner in ("mean", "sqrtn"):
            count = routed.counts[feature.name].astype(dtype)
            scale = count if feature.combiner == "mean" else np.sqrt(count)
            total = np.divide(total, scale[:, None], out=np.zeros_like(total),
                              where=scale[:, None] != 0)
        pooled[feature.name] = total.reshape(routed.cells[feature.name] + (feature.dim,))
    return pooled


def main_inputs(manifest, routed, pooled):
    """Main's signature inputs: the request's dense inputs and one pooled value per feature."""
    del manifest
    return {**routed.dense, **pooled}
