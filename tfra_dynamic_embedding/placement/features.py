"""The 21 table features of AutoShard / DreamShard: a pure function of a spec and its stream.

Features of one table, in order (`FEATURE_NAMES`):
  dim / scales.dim, rows / scales.hash_size, pooling_factor / scales.pooling_factor,
  size in GB (rows * dim * bytes_per_value / 2**30, not normalised),
  17 reuse shares: the share of a batch's lookups that hit indices looked up (0,1], (1,2],
  (2,4], ..., (16384,32768], (32768,inf) times within that batch.

The reuse histogram comes from given indices, from the spec, or from the spec's index stream
(`streams.reuse_histogram` of its first batch).

Example:
    >>> from tfra_dynamic_embedding.placement.types import TableSpec
    >>> x = table_features(TableSpec("t", rows=10, dim=64, reuse_histogram=[1.0] + [0.0] * 16))
    >>> x.shape, float(x[0])             # 21 features; dim / 128 first
    ((21,), 0.5)
"""

import dataclasses

import numpy as np

from tfra_dynamic_embedding.placement import streams
from tfra_dynamic_embedding.placement.types import NUM_REUSE_BINS, REUSE_BIN_LABELS

NUM_FEATURES = 4 + NUM_REUSE_BINS
FEATURE_NAMES = ("dim", "hash_size", "pooling_factor", "size_gb") + tuple(
    f"reuse{label}" for label in REUSE_BIN_LABELS)


@dataclasses.dataclass(frozen=True)
class FeatureScales:
    """Divisors that normalise dim, hash size and pooling factor (store them with a model).

    Defaults are the maxima of the MetaSyn 2021 pool (hash size 12,543,670, pooling 193) and the
    largest default dimension (128). `FeatureScales.fit(tables)` uses a pool's own maxima.
    """

    dim: float = 128.0
    hash_size: float = 12_543_670.0
    pooling_factor: float = 193.0

    def __post_init__(self):
        for key in ("dim", "hash_size", "pooling_factor"):
            if not getattr(self, key) > 0:
                raise ValueError(f"FeatureScales.{key} must be > 0; got {getattr(self, key)!r}")

    @classmethod
    def fit(cls, tables):
        tables = list(tables)
        if not tables:
            raise ValueError("FeatureScales.fit needs at least one table")
        return cls(dim=max(t.dim for t in tables), hash_size=max(t.rows for t in tables),
                   pooling_factor=max(max(t.pooling_factor for t in tables), 1e-9))

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data):
        return cls(**data)


def table_reuse(spec, indices=None):
    """The table's reuse histogram: from `indices` if given, else the spec, else its stream."""
    if indices is not None:
        return streams.reuse_histogram(indices)
    if spec.reuse_histogram is not None:
        return np.asarray(spec.reuse_histogram, dtype=float)
    if spec.stream is not None:
        batch_indices, _ = streams.open_stream(spec).batch(0)
        return streams.reuse_histogram(batch_indices)
    raise ValueError(f"table {spec.name!r} has no reuse_histogram and no stream; pass indices= "
                     f"or fill TableSpec.reuse_histogram")


def table_features(spec, scales=FeatureScales(), indices=None):
    """The 21 features of one TableSpec as a float64 vector (order: FEATURE_NAMES)."""
    head = [spec.dim / scales.dim, spec.rows / scales.hash_size,
            spec.pooling_factor / scales.pooling_factor, spec.size_bytes / 2 ** 30]
    return np.concatenate([np.asarray(head, dtype=float), table_reuse(spec, indices)])


def features_matrix(tables, scales=FeatureScales()):
    """[num_tables, 21] features of a list of TableSpecs."""
    tables = list(tables)
    if not tables:
        return np.zeros((0, NUM_FEATURES))
    return np.stack([table_features(t, scales) for t in tables])
