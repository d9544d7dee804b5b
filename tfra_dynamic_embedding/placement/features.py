"""The 21 table features of AutoShard / DreamShard, and the 17-bin index-reuse histogram.

Features of one table, in order (`FEATURE_NAMES`):
  dim / scales.dim, rows / scales.hash_size, pooling_factor / scales.pooling_factor,
  size in GB (rows * dim * bytes_per_value / 2**30, not normalised),
  17 reuse shares: the share of a batch's lookups that hit indices looked up (0,1], (1,2],
  (2,4], ..., (16384,32768], (32768,inf) times within that batch.

The reuse histogram comes from an index stream (`reuse_histogram`), from the spec, or from an
analytic popularity model (`expected_reuse_histogram`, used by the synthetic workloads).

Example:
    reuse_histogram([5, 5, 7])          # [1/3, 2/3, 0, ...]: 7 is seen once, 5 twice
    table_features(TableSpec("t", rows=10, dim=8, reuse_histogram=h)).shape   # (21,)
"""

import dataclasses
import math

import numpy as np

from tfra_dynamic_embedding.placement.types import NUM_REUSE_BINS, REUSE_BIN_LABELS

NUM_FEATURES = 4 + NUM_REUSE_BINS
FEATURE_NAMES = ("dim", "hash_size", "pooling_factor", "size_gb") + tuple(
    f"reuse{label}" for label in REUSE_BIN_LABELS)
# Counts 1, 2, 4, ..., 32768 close the first 16 bins; above 32768 is the last bin.
_UPPER = np.array([2 ** i for i in range(16)], dtype=np.int64)


def reuse_bin(counts):
    """Bin index (0..16) of each reuse count >= 1: reuse_bin([1, 2, 3, 40000]) -> [0, 1, 2, 16]."""
    counts = np.asarray(counts, dtype=np.int64)
    if counts.size and counts.min() < 1:
        raise ValueError(f"reuse counts must be >= 1; got min {counts.min()}")
    return np.searchsorted(_UPPER, counts, side="left")


def reuse_histogram(indices, weight="lookups"):
    """The 17-bin reuse histogram of one batch of indices (any shape; flattened).

    weight="lookups" (default): share of lookups hitting indices with each reuse count (the
    published 'ratio of index distribution'); weight="unique": share of unique indices (the
    'histogram of col sizes', which is what the DreamShard reference code stores).
    An empty batch gives all zeros.
    """
    if weight not in ("lookups", "unique"):
        raise ValueError(f"weight must be 'lookups' or 'unique'; got {weight!r}")
    flat = np.asarray(indices).reshape(-1)
    hist = np.zeros(NUM_REUSE_BINS)
    if flat.size == 0:
        return hist
    _, counts = np.unique(flat, return_counts=True)
    np.add.at(hist, reuse_bin(counts), counts if weight == "lookups" else 1)
    return hist / hist.sum()


def pooled_reuse_histogram(histograms, lookups):
    """Pools per-table (or per-batch) lookup-weighted histograms, weighting each by its lookups."""
    histograms = np.asarray(histograms, dtype=float).reshape(-1, NUM_REUSE_BINS)
    lookups = np.asarray(lookups, dtype=float).reshape(-1)
    if lookups.shape[0] != histograms.shape[0]:
        raise ValueError(f"need one lookup count per histogram; got {lookups.shape[0]} counts "
                         f"for {histograms.shape[0]} histograms")
    total = (histograms * lookups[:, None]).sum(axis=0)
    return total / total.sum() if total.sum() > 0 else total


# -- analytic expectation -------------------------------------------------------------------
def _erfc(x):
    """Complementary error function (Numerical Recipes' Chebyshev fit, |rel err| < 1.2e-7)."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    r = t * np.exp(poly)
    return np.where(x >= 0, r, 2.0 - r)


def poisson_cdf(m, lam):
    """P(Y <= m) for Y ~ Poisson(lam), elementwise over `lam`; m an int (or a list of ints).

    Exact summation for m <= 64, Wilson-Hilferty's cube-root normal approximation above
    (absolute error below 1e-3 there, far below the calibration tolerance).
    Example: poisson_cdf(0, [1.0]) -> [0.3679]
    """
    lam = np.asarray(lam, dtype=float)
    ms = [int(m)] if np.ndim(m) == 0 else [int(x) for x in m]
    out = {}
    small = sorted(x for x in set(ms) if 0 <= x <= 64)
    if small:
        pmf = np.exp(-lam)
        cdf = pmf.copy()
        for k in range(1, small[-1] + 1):
            if k - 1 in small:
                out[k - 1] = np.minimum(cdf, 1.0)
            pmf = pmf * lam / k
            cdf = cdf + pmf
        out[small[-1]] = np.minimum(cdf, 1.0)
    for x in set(ms):
        if x < 0:
            out[x] = np.zeros_like(lam)
        elif x > 64:
            k = x + 1.0  # P(Y <= x) = P(Gamma(x + 1) > lam)
            z = 3.0 * math.sqrt(k) * (np.cbrt(lam / k) - 1.0 + 1.0 / (9.0 * k))
            out[x] = 0.5 * _erfc(z / math.sqrt(2.0))
    return out[ms[0]] if np.ndim(m) == 0 else [out[x] for x in ms]


def reuse_bin_probabilities(lam, weight="lookups"):
    """[len(lam), 17]: bin probabilities for rows whose batch count is Poisson(lam).

    weight="lookups": for a lookup that hits the row, the probability that the row's count lies
    in bin (lo, hi], i.e. P(lo <= Poisson(lam) <= hi - 1) (the lookup itself is the +1);
    weight="unique": the probability that the row's count lies in the bin (rows of count 0 fall
    in no bin).
    """
    lam = np.asarray(lam, dtype=float).reshape(-1)
    if weight == "lookups":
        bounds = [np.zeros_like(lam)] + poisson_cdf([int(lo) - 1 for lo in _UPPER], lam)
    elif weight == "unique":
        bounds = poisson_cdf([0] + [int(hi) for hi in _UPPER], lam)
    else:
        raise ValueError(f"weight must be 'lookups' or 'unique'; got {weight!r}")
    bounds.append(np.ones_like(lam))
    cdf = np.stack(bounds, axis=1)
    return np.clip(np.diff(cdf, axis=1), 0.0, 1.0)


def expected_reuse_histogram(bucket_mass, bucket_rows, num_lookups, weight="lookups"):
    """Expected 17-bin histogram of a batch of `num_lookups` i.i.d. draws from a popularity law.

    The law is given in buckets of rows with equal probability: bucket b has `bucket_rows[b]`
    rows carrying total probability `bucket_mass[b]`. Each row's count in the batch is taken as
    Poisson(num_lookups * p) (see `reuse_bin_probabilities`).

    Example: expected_reuse_histogram([1.0], [1], 10**6)[16] -> 1.0 (one row, a million hits).
    """
    mass = np.asarray(bucket_mass, dtype=float)
    rows = np.asarray(bucket_rows, dtype=float)
    if mass.shape != rows.shape or (rows <= 0).any() or (mass < 0).any():
        raise ValueError("bucket_mass and bucket_rows must have one shape, rows > 0, mass >= 0")
    if num_lookups <= 0 or mass.sum() <= 0:
        return np.zeros(NUM_REUSE_BINS)
    mass = mass / mass.sum()
    probs = reuse_bin_probabilities(num_lookups * mass / rows, weight)
    hist = (mass if weight == "lookups" else rows) @ probs
    return hist / hist.sum()


# -- the 21 features --------------------------------------------------------------------------
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
        return reuse_histogram(indices)
    if spec.reuse_histogram is not None:
        return np.asarray(spec.reuse_histogram, dtype=float)
    if spec.stream is not None:
        from tfra_dynamic_embedding.placement import workloads  # pylint: disable=import-outside-toplevel
        batch_indices, _ = workloads.open_stream(spec).batch(0)
        return reuse_histogram(batch_indices)
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
