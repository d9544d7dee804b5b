"""A Criteo-format click log: a synthetic generator with a hidden logistic model, and its reader.

Format (the Criteo display-advertising TSV): one example per line, 40 tab-separated fields

    label  I1 ... I13  C1 ... C26

`label` is 0/1, `I*` are integer counts, `C*` are 32-bit hashes written as 8 hex digits; any `I*`
or `C*` field may be empty (missing). The same reader parses a real Criteo file.

The generator draws, per categorical feature, ids from a truncated power law (Zipf-like: a few
ids are very frequent, most are rare) over its own cardinality, and per dense feature log-normal
counts. Labels are Bernoulli draws from a hidden logistic model over some of the features (id
weights, dense coefficients and one pairwise id interaction), so the quality of a trained model
is measurable: `GeneratedData.probability` holds the true click probability of every row, whose
AUC is the best any model can reach.

Example:
    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> data = generate(os.path.join(tmp.name, "train.tsv"), rows=64, seed=0)
    >>> data.rows, data.to_lines()[0].count("\\t") + 1           # 40 fields a line
    (64, 40)
    >>> ds = read_tsv(os.path.join(tmp.name, "train.tsv"), batch_size=16)
    >>> features, label = next(iter(ds))                    # ({"dense", "ids"}, label) batches
    >>> features["dense"].shape, features["ids"].shape, features["ids"].dtype, label.shape
    (TensorShape([16, 13]), TensorShape([16, 26]), tf.int64, TensorShape([16]))
    >>> tmp.cleanup()
"""

import dataclasses
import os

import numpy as np
import tensorflow as tf

NUM_DENSE = 13
NUM_CATEGORICAL = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_CATEGORICAL
DENSE_NAMES = tuple(f"I{i + 1}" for i in range(NUM_DENSE))
CATEGORICAL_NAMES = tuple(f"C{i + 1}" for i in range(NUM_CATEGORICAL))
# Categorical strings are hashed to int64 ids in [0, 2^63 - 1): ids are arbitrary, no vocabulary.
HASH_BUCKETS = 2**63 - 1

# The generator's world. Cardinality: how many distinct ids a feature can take (rows drawn decide
# how many are seen); exponent: the power law's s (p(rank r) ~ r^-s); missing: the share of empty
# fields. Our own choice: a mix of tiny, medium and large features, like a click log has.
CARDINALITIES = (1_200, 550, 250_000, 90_000, 280, 22, 11_000, 640, 3, 40_000, 4_800, 200_000,
                 3_100, 26, 13_000, 150_000, 9, 5_200, 2_100, 4, 120_000, 17, 14, 60_000, 95,
                 35_000)
EXPONENTS = tuple(1.05 + 0.05 * (i % 6) for i in range(NUM_CATEGORICAL))
CATEGORICAL_MISSING = (0.0, 0.0, 0.03, 0.03, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0,
                       0.0, 0.03, 0.0, 0.0, 0.44, 0.44, 0.03, 0.0, 0.76, 0.03, 0.44, 0.44)
DENSE_MISSING = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22)
# Features the hidden model reads, with the spread of their weights.
SIGNAL_CATEGORICAL = {0: 0.6, 1: 0.5, 3: 0.7, 5: 0.4, 7: 0.5, 10: 0.6, 13: 0.4, 15: 0.5,
                      18: 0.4, 24: 0.5}
SIGNAL_DENSE = {0: 0.3, 2: -0.25, 5: 0.2, 7: 0.35, 10: -0.3}
INTERACTION = (0, 3)  # the hidden model also reads u[C1] . u[C4] (a low-rank pairwise term)
INTERACTION_RANK = 4
INTERACTION_SCALE = 0.6
TARGET_CTR = 0.25


@dataclasses.dataclass
class GeneratedData:
    """Rows of the synthetic click log, kept as arrays (see `to_lines`)."""
    label: np.ndarray        # [rows] int
    dense: np.ndarray        # [rows, 13] int64 counts
    dense_missing: np.ndarray  # [rows, 13] bool
    categorical: np.ndarray  # [rows, 26] uint32 hashes (written as 8 hex digits)
    categorical_missing: np.ndarray  # [rows, 26] bool
    probability: np.ndarray  # [rows] the hidden model's click probability

    @property
    def rows(self):
        return len(self.label)

    def categorical_strings(self):
        """`[rows, 26]` strings as written to the TSV (8 hex digits, "" when missing)."""
        return np.stack([_as_text(self.categorical[:, j], self.categorical_missing[:, j], "%08x")
                         for j in range(NUM_CATEGORICAL)], axis=1)

    def to_lines(self):
        """The rows as TSV lines (without newlines)."""
        columns = [np.where(self.label > 0, "1", "0").astype(object)]
        columns += [_as_text(self.dense[:, j], self.dense_missing[:, j], "%d")
                    for j in range(NUM_DENSE)]
        columns += [_as_text(self.categorical[:, j], self.categorical_missing[:, j], "%08x")
                    for j in range(NUM_CATEGORICAL)]
        return ["\t".join(fields) for fields in zip(*columns)]


def _as_text(values, missing, fmt):
    """`values` formatted with `fmt` ("" where `missing`) as an object array of str.

    Each distinct value is formatted once: columns of a click log repeat their values a lot.
    """
    distinct, index = np.unique(values, return_inverse=True)
    text = np.asarray([fmt % v for v in distinct.tolist()] + [""], dtype=object)
    return text[np.where(missing, len(distinct), index.ravel())]


def generate_arrays(rows, seed=0):
    """`GeneratedData` of `rows` examples; the hidden model's world is drawn from `seed` too."""
    if rows <= 0:
        raise ValueError(f"rows must be positive; got {rows}")
    world = np.random.default_rng([seed, 0])
    rng = np.random.default_rng([seed, 1])

    categorical = np.empty((rows, NUM_CATEGORICAL), np.uint32)
    categorical_missing = np.empty((rows, NUM_CATEGORICAL), bool)
    logit = np.zeros(rows)
    ranks = {}
    for f, (cardinality, exponent) in enumerate(zip(CARDINALITIES, EXPONENTS)):
        # Truncated power law over ranks 0..cardinality-1, sampled by inverse CDF.
        cdf = np.cumsum(np.arange(1, cardinality + 1, dtype=np.float64) ** -exponent)
        rank = np.searchsorted(cdf, rng.random(rows) * cdf[-1])
        rank = np.minimum(rank, cardinality - 1)
        # Rank -> 32-bit hash: an odd multiplier is a bijection mod 2^32, so ids stay distinct.
        multiplier = np.uint64(world.integers(1, 2**31) * 2 + 1)
        offset = np.uint64(world.integers(0, 2**32))
        hashed = (rank.astype(np.uint64) * multiplier + offset) & np.uint64(0xFFFFFFFF)
        categorical[:, f] = hashed.astype(np.uint32)
        missing = rng.random(rows) < CATEGORICAL_MISSING[f]
        categorical_missing[:, f] = missing
        ranks[f] = np.where(missing, -1, rank)
        spread = SIGNAL_CATEGORICAL.get(f)
        if spread is not None:
            weights = world.normal(0.0, spread, cardinality)
            logit += np.where(missing, 0.0, weights[rank])

    u, v = (world.normal(0.0, 1.0, (CARDINALITIES[f], INTERACTION_RANK)) for f in INTERACTION)
    a, b = (ranks[f] for f in INTERACTION)
    both = (a >= 0) & (b >= 0)
    pair = np.einsum("ij,ij->i", u[np.maximum(a, 0)], v[np.maximum(b, 0)])
    logit += np.where(both, INTERACTION_SCALE * pair / np.sqrt(INTERACTION_RANK), 0.0)

    mu = world.uniform(0.0, 3.0, NUM_DENSE)
    sigma = world.uniform(0.5, 1.5, NUM_DENSE)
    dense = np.floor(rng.lognormal(mu, sigma, (rows, NUM_DENSE))).astype(np.int64)
    dense[:, 1] -= 3  # like Criteo's I2, this one can be negative
    dense_missing = rng.random((rows, NUM_DENSE)) < np.asarray(DENSE_MISSING)
    for j, coefficient in SIGNAL_DENSE.items():
        z = (np.log1p(np.maximum(dense[:, j], 0)) - mu[j]) / sigma[j]
        logit += np.where(dense_missing[:, j], 0.0, coefficient * z)

    logit += _bias_for_ctr(logit, TARGET_CTR)
    probability = 1.0 / (1.0 + np.exp(-logit))
    label = (rng.random(rows) < probability).astype(np.int64)
    return GeneratedData(label, dense, dense_missing, categorical, categorical_missing,
                         probability)


def _bias_for_ctr(logit, ctr):
    """The bias that makes the mean click probability `ctr` (bisection)."""
    low, high = -20.0, 20.0
    for _ in range(60):
        mid = (low + high) / 2
        if np.mean(1.0 / (1.0 + np.exp(-(logit + mid)))) < ctr:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def generate(path, rows, seed=0):
    """Writes `rows` synthetic examples to the TSV file `path`; returns their `GeneratedData`."""
    data = generate_arrays(rows, seed)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(data.to_lines()))
        f.write("\n")
    return data


def count_lines(path, limit=None):
    """Number of lines of a text file (stops counting at `limit`)."""
    count = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            count += chunk.count(b"\n")
            if limit is not None and count >= limit:
                return limit
        f.seek(0, os.SEEK_END)
        if f.tell() and _last_byte(f) != b"\n":
            count += 1  # a last line without a newline
    return count if limit is None else min(count, limit)


def _last_byte(f):
    f.seek(-1, os.SEEK_END)
    return f.read(1)


# -- reading ---------------------------------------------------------------------------------------
def parse_lines(lines):
    """TSV lines `[B]` -> (raw features, label): {"dense": [B, 13] float32, "categorical":
    [B, 26] string}, `[B]` float32. A missing dense value reads 0, a missing categorical ""."""
    defaults = [[0.0]] + [[0.0]] * NUM_DENSE + [[""]] * NUM_CATEGORICAL
    fields = tf.io.decode_csv(lines, defaults, field_delim="\t", use_quote_delim=False)
    label = fields[0]
    dense = tf.stack(fields[1:1 + NUM_DENSE], axis=-1)
    categorical = tf.stack(fields[1 + NUM_DENSE:], axis=-1)
    return {"dense": dense, "categorical": categorical}, label


def preprocess(dense, categorical):
    """Raw features -> model inputs: {"dense": log(1 + max(x, 0)), "ids": int64 string hashes}.

    Used by the training input pipeline and by the exported serving signature alike. A missing
    categorical value ("") is an id of its own, like any other value.
    """
    dense = tf.math.log1p(tf.maximum(tf.cast(dense, tf.float32), 0.0))
    ids = tf.strings.to_hash_bucket_fast(categorical, HASH_BUCKETS)
    return {"dense": dense, "ids": ids}


def read_tsv(path, batch_size, skip=0, take=None, shuffle_buffer=0, seed=None,
             drop_remainder=False, raw=False):
    """A `tf.data.Dataset` of ({"dense", "ids"}, label) batches from Criteo TSV file(s).

    Args:
      path: a file or list of files.
      batch_size: examples per batch.
      skip, take: use lines [skip, skip + take) (take None: to the end), e.g. a held-out tail.
      shuffle_buffer: lines shuffled before batching (0: file order).
      seed: the shuffle's seed.
      drop_remainder: drop the last, smaller batch.
      raw: yield the raw features ({"dense", "categorical"}, see `parse_lines`) instead.
    """
    ds = tf.data.TextLineDataset(path)
    if skip:
        ds = ds.skip(skip)
    if take is not None:
        ds = ds.take(take)
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)

    def to_inputs(lines):
        features, label = parse_lines(lines)
        return preprocess(features["dense"], features["categorical"]), label

    ds = ds.map(parse_lines if raw else to_inputs, num_parallel_calls=tf.data.AUTOTUNE)
    if take is not None:  # a known length lets Keras' progress bar show the total
        batches = take // batch_size if drop_remainder else -(-take // batch_size)
        ds = ds.apply(tf.data.experimental.assert_cardinality(batches))
    return ds.prefetch(tf.data.AUTOTUNE)
