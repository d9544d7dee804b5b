"""Index streams and their reuse statistics: synthetic (a popularity law per table), dlrm_datasets
`.pt` files and Criteo TSV columns, behind `open_stream(spec)`.

A stream's `batch(i)` is (indices int64 [n], offsets int64 [B + 1]): sample j looks up
indices[offsets[j]:offsets[j+1]]. Its statistic the planner uses is the 17-bin reuse histogram
(`reuse_histogram`: the share of a batch's lookups hitting indices seen (0,1], (1,2], (2,4], ...,
(32768,inf) times in that batch), measured on a batch or expected under a popularity law.

Example:
    >>> from tfra_dynamic_embedding.placement import workloads
    >>> spec = workloads.generate_pool(1, seed=0, batch_size=256, row_scale=1 / 16)[0]
    >>> indices, offsets = open_stream(spec, batch_size=8).batch(0)
    >>> len(offsets), int(offsets[-1]) == len(indices)
    (9, True)
    >>> reuse_histogram([5, 5, 7])[:3].round(3)        # 7 is seen once, 5 twice
    array([0.333, 0.667, 0.   ])
"""

import gzip
import math

import numpy as np

from tfra_dynamic_embedding.placement.types import NUM_REUSE_BINS

CRITEO_DENSE = tuple(f"I{i}" for i in range(1, 14))
CRITEO_CATEGORICAL = tuple(f"C{i}" for i in range(1, 27))

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

    Example:
        >>> poisson_cdf(0, [1.0]).round(4)
        array([0.3679])
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

    Example:
        >>> float(expected_reuse_histogram([1.0], [1], 10**6)[16])   # one row, 10**6 hits
        1.0
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


# -- synthetic streams: a popularity law per table ------------------------------------------
def _zm_cum(x, s, q):
    """Unnormalised cumulative mass of density (x + q)^-s at x (monotone increasing in x)."""
    if abs(s - 1.0) < 1e-6:
        return np.log(np.asarray(x, dtype=float) + q)
    return ((np.asarray(x, dtype=float) + q) ** (1.0 - s)) / (1.0 - s)


def popularity_buckets(stream, rows, exact=64, per_decade=32):
    """(mass, rows) buckets of a synthetic stream's popularity law, for expected histograms.

    Ranks [0, rows - warm_rows) follow a continuous Zipf-Mandelbrot law (rank k covers [k, k+1));
    the first `exact` ranks are one bucket each, the rest log-spaced; the warm set is one bucket.
    """
    warm_rows = int(stream.get("warm_rows", 0))
    warm = float(stream.get("warm_share", 0.0)) if warm_rows else 0.0
    zipf_rows = rows - warm_rows
    s, q = float(stream["zipf_s"]), float(stream["zipf_q"])
    head = min(zipf_rows, exact)
    edges = np.arange(head + 1, dtype=float)
    if zipf_rows > head:
        count = max(1, int(math.ceil(math.log10(zipf_rows / head) * per_decade)))
        tail = np.unique(np.round(np.logspace(math.log10(head), math.log10(zipf_rows), count + 1)))
        edges = np.concatenate([edges[:-1], tail])
    cum = _zm_cum(edges, s, q)
    mass = np.diff(cum) / (cum[-1] - cum[0]) * (1.0 - warm)
    widths = np.diff(edges)
    if warm_rows:
        mass = np.append(mass, warm)
        widths = np.append(widths, warm_rows)
    return mass, widths


def expected_histograms(tables, batch_size, weight="lookups"):
    """[len(tables), 17] expected reuse histograms of synthetic tables' batches (Poisson model).

    Rows of tables without lookups are all zero. One vectorised pass over all tables' buckets.
    """
    masses, lams, owner = [], [], []
    for i, spec in enumerate(tables):
        lookups = spec.pooling_factor * batch_size
        if lookups <= 0:
            continue
        mass, widths = popularity_buckets(spec.stream, spec.rows)
        masses.append(mass if weight == "lookups" else widths)
        lams.append(lookups * mass / widths)
        owner.append(np.full(len(mass), i))
    out = np.zeros((len(tables), NUM_REUSE_BINS))
    if not masses:
        return out
    probs = reuse_bin_probabilities(np.concatenate(lams), weight)
    weighted = np.concatenate(masses)[:, None] * probs
    owner = np.concatenate(owner)
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    out[owner[starts]] = np.add.reduceat(weighted, starts, axis=0)
    totals = out.sum(axis=1, keepdims=True)
    return np.divide(out, totals, out=np.zeros_like(out), where=totals > 0)


class SyntheticStream:
    """Batches of one synthetic table: `batch(i)` -> (indices int64 [n], offsets int64 [B + 1]).

    Sample j looks up indices[offsets[j]:offsets[j+1]]; bag lengths are negative-binomial with
    mean pooling_factor; indices follow the table's popularity law, ranks mapped to row ids by a
    seeded affine bijection of [0, rows). Batch i is a pure function of (seed, i).
    """

    def __init__(self, spec, batch_size=None):
        self.spec = spec
        self.params = spec.stream
        self.batch_size = int(batch_size or self.params.get("batch_size", 65536))
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size!r}")
        rows = spec.rows
        rng = np.random.default_rng([int(self.params["seed"]), 7])
        mult = int(rng.integers(1, 2 ** 31 - 1)) | 1
        while math.gcd(mult, rows) != 1:
            mult += 2
        self._mult, self._shift = mult % rows or 1, int(rng.integers(0, rows))

    def lengths(self, rng):
        mean = self.spec.pooling_factor
        if mean <= 0:
            return np.zeros(self.batch_size, dtype=np.int64)
        disp = float(self.params.get("length_dispersion", 2.0))
        return rng.negative_binomial(disp, disp / (disp + mean), self.batch_size).astype(np.int64)

    def ranks(self, rng, n):
        p, rows = self.params, self.spec.rows
        warm_rows = int(p.get("warm_rows", 0))
        zipf_rows = rows - warm_rows
        s, q = float(p["zipf_s"]), float(p["zipf_q"])
        u = rng.random(n)
        lo, hi = _zm_cum(0.0, s, q), _zm_cum(float(zipf_rows), s, q)
        target = lo + u * (hi - lo)
        if abs(s - 1.0) < 1e-6:
            x = np.exp(target) - q
        else:
            x = (target * (1.0 - s)) ** (1.0 / (1.0 - s)) - q
        ranks = np.clip(np.floor(x), 0, zipf_rows - 1).astype(np.int64)
        if warm_rows:
            warm = rng.random(n) < float(p["warm_share"])
            ranks[warm] = zipf_rows + rng.integers(0, warm_rows, int(warm.sum()))
        return ranks

    def batch(self, index):
        rng = np.random.default_rng([int(self.params["seed"]), 11, int(index)])
        lengths = self.lengths(rng)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        ranks = self.ranks(rng, int(offsets[-1]))
        rows = self.spec.rows
        indices = (ranks * self._mult + self._shift) % rows
        return indices.astype(np.int64), offsets

    def __iter__(self):
        index = 0
        while True:
            yield self.batch(index)
            index += 1


def expected_unique_rows(spec, batch_size):
    """Expected number of distinct rows in one batch of a synthetic table."""
    lookups = spec.pooling_factor * batch_size
    if lookups <= 0:
        return 0.0
    mass, widths = popularity_buckets(spec.stream, spec.rows)
    return float(np.sum(widths * -np.expm1(-lookups * mass / widths)))


# -- dlrm_datasets files ----------------------------------------------------------------------
def _require_torch(path):
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise ImportError(
            f"reading the dlrm_datasets file {path!r} needs PyTorch (the .pt format is a "
            f"torch pickle); install it with `pip install torch` (the CPU wheel is enough), or "
            f"convert the file to NumPy and call tables_from_dlrm_arrays") from error
    return torch


_PT_CACHE = {}


def read_dlrm_pt(path):
    """(indices, offsets, lengths) of one dlrm_datasets file as int64 NumPy arrays (cached)."""
    if path not in _PT_CACHE:
        torch = _require_torch(path)
        indices, offsets, lengths = torch.load(path, map_location="cpu")
        _PT_CACHE.clear()  # these files are GBs: keep one
        _PT_CACHE[path] = tuple(np.asarray(x.numpy(), dtype=np.int64)
                                for x in (indices, offsets, lengths))
    return _PT_CACHE[path]


def split_dlrm_arrays(indices, offsets, lengths):
    """Per table (indices, local offsets [B + 1]) from the dlrm_datasets layout."""
    indices, offsets, lengths = (np.asarray(x, dtype=np.int64) for x in (indices, offsets, lengths))
    if lengths.ndim != 2:
        raise ValueError(f"lengths must be [num_tables, batch_size]; got shape {lengths.shape}")
    num_tables, batch = lengths.shape
    if offsets.shape != (num_tables * batch + 1,):
        raise ValueError(f"offsets must have num_tables * batch_size + 1 = "
                         f"{num_tables * batch + 1} entries; got shape {offsets.shape}")
    if not np.array_equal(np.diff(offsets), lengths.reshape(-1)):
        raise ValueError("offsets and lengths disagree: diff(offsets) != lengths.flatten()")
    out = []
    for t in range(num_tables):
        local = offsets[t * batch:(t + 1) * batch + 1]
        out.append((indices[local[0]:local[-1]], local - local[0]))
    return out


class DlrmPtStream:
    """The stream of one table of one or more dlrm_datasets files (a file is one batch)."""

    def __init__(self, spec):
        paths = spec.stream["path"]
        self.paths = [paths] if isinstance(paths, str) else list(paths)
        self.table = int(spec.stream["table"])

    def batch(self, index):
        indices, offsets, lengths = read_dlrm_pt(self.paths[index % len(self.paths)])
        return split_dlrm_arrays(indices, offsets, lengths)[self.table]


# -- Criteo TSV columns ------------------------------------------------------------------------
def _open_text(path):
    return gzip.open(path, "rt", encoding="utf-8") if str(path).endswith(".gz") else open(
        path, encoding="utf-8")


def criteo_batches(path, batch_size, max_lines=None):
    """Yields lists of 26 int64 arrays of values and 26 bool masks (present), per batch of lines."""
    num_fields = 1 + len(CRITEO_DENSE) + len(CRITEO_CATEGORICAL)
    with _open_text(path) as f:
        lines = []
        for number, line in enumerate(f, start=1):
            if max_lines is not None and number > max_lines:
                break
            fields = line.rstrip("\n").split("\t")
            if len(fields) != num_fields:
                raise ValueError(f"{path}:{number}: expected {num_fields} tab-separated fields "
                                 f"(label, I1..I13, C1..C26); got {len(fields)}")
            lines.append((number, fields[14:]))
            if len(lines) == batch_size:
                yield _criteo_columns(lines, path)
                lines = []
        if lines:
            yield _criteo_columns(lines, path)


def _criteo_columns(lines, path):
    values = np.zeros((len(lines), len(CRITEO_CATEGORICAL)), dtype=np.int64)
    present = np.zeros(values.shape, dtype=bool)
    for r, (number, cats) in enumerate(lines):
        for c, text in enumerate(cats):
            if text:
                try:
                    values[r, c] = int(text, 16)
                except ValueError as error:
                    raise ValueError(f"{path}:{number}: {CRITEO_CATEGORICAL[c]} must be a hex "
                                     f"string; got {text!r}") from error
                present[r, c] = True
    return values, present


class CriteoStream:
    """Batches of one Criteo categorical column: raw hex-hash ids, bags of length 0 or 1."""

    def __init__(self, spec, batch_size=None):
        self.path = spec.stream["path"]
        self.column = CRITEO_CATEGORICAL.index(spec.stream["column"])
        self.batch_size = int(batch_size or spec.stream.get("batch_size", 65536))

    def batch(self, index):
        for i, (values, present) in enumerate(criteo_batches(self.path, self.batch_size)):
            if i == index:
                mask = present[:, self.column]
                offsets = np.concatenate([[0], np.cumsum(mask)]).astype(np.int64)
                return values[mask, self.column], offsets
        raise IndexError(f"{self.path} has fewer than {index + 1} batches of {self.batch_size}")


# -- any stream ---------------------------------------------------------------------------------
def open_stream(spec, batch_size=None):
    """The index stream a TableSpec refers to (`spec.stream["kind"]`).

    Kinds: "synthetic" (`SyntheticStream`), "dlrm_pt" ({"path", "table"}: a dlrm_datasets file,
    needs torch), "criteo_tsv" ({"path", "column"}). Each has `.batch(i) -> (indices, offsets)`.
    """
    if spec.stream is None:
        raise ValueError(f"table {spec.name!r} has no index stream (TableSpec.stream is None)")
    kind = spec.stream.get("kind")
    if kind == "synthetic":
        return SyntheticStream(spec, batch_size)
    if kind == "dlrm_pt":
        return DlrmPtStream(spec)
    if kind == "criteo_tsv":
        return CriteoStream(spec, batch_size)
    raise ValueError(f"unknown stream kind {kind!r} of table {spec.name!r}; expected one of "
                     f"'synthetic', 'dlrm_pt', 'criteo_tsv'")


def pool_batch(tables, index=0, batch_size=None):
    """One batch of all `tables` in dlrm_datasets layout: (indices, offsets, lengths [T, B])."""
    parts, lengths = [], []
    for spec in tables:
        idx, off = open_stream(spec, batch_size).batch(index)
        parts.append(idx)
        lengths.append(np.diff(off))
    if len({len(x) for x in lengths}) > 1:
        raise ValueError("tables' streams have different batch sizes; pass batch_size=")
    lengths = np.stack(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths.reshape(-1))]).astype(np.int64)
    return np.concatenate(parts).astype(np.int64), offsets, lengths
