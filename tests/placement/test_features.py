"""The 17-bin reuse histogram (measured and expected) and the 21 table features."""

import math

import numpy as np
import pytest

from tfra_dynamic_embedding.placement import features, streams
from tfra_dynamic_embedding.placement.types import REUSE_BIN_LABELS, TableSpec


def test_bins_are_powers_of_two():
    assert REUSE_BIN_LABELS[0] == "(0, 1]" and REUSE_BIN_LABELS[15] == "(16384, 32768]"
    assert REUSE_BIN_LABELS[16] == "(32768, inf)"
    counts = [1, 2, 3, 4, 5, 8, 9, 16384, 16385, 32768, 32769, 10 ** 6]
    assert streams.reuse_bin(counts).tolist() == [0, 1, 2, 2, 3, 3, 4, 14, 15, 15, 16, 16]
    with pytest.raises(ValueError, match="reuse counts must be >= 1"):
        streams.reuse_bin([0])


def test_reuse_histogram_of_a_batch():
    # 7 once, 5 twice, 9 three times: 1/6 of lookups reuse 1, 2/6 reuse 2, 3/6 reuse (2,4].
    hist = streams.reuse_histogram([[5, 7, 9], [5, 9, 9]])
    assert hist.tolist()[:4] == pytest.approx([1 / 6, 2 / 6, 3 / 6, 0.0])
    assert hist.sum() == pytest.approx(1.0)
    unique = streams.reuse_histogram([5, 7, 9, 5, 9, 9], weight="unique")
    assert unique.tolist()[:3] == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert streams.reuse_histogram([]).tolist() == [0.0] * 17
    big = streams.reuse_histogram(np.zeros(40000, dtype=np.int64))
    assert big[16] == 1.0


def test_pooled_histogram_weights_by_lookups():
    a, b = np.eye(17)[0], np.eye(17)[16]
    pooled = streams.pooled_reuse_histogram([a, b], [300, 100])
    assert pooled[0] == pytest.approx(0.75) and pooled[16] == pytest.approx(0.25)


def test_poisson_cdf_exact_and_approximation():
    assert streams.poisson_cdf(0, [1.0])[0] == pytest.approx(np.exp(-1))
    assert streams.poisson_cdf(2, [2.0])[0] == pytest.approx(5 * np.exp(-2))
    # Above 64 Wilson-Hilferty's approximation; compare with exact log-space sums.
    for m, lam in ((127, 128.0), (200, 180.0), (1023, 1000.0), (70, 80.0)):
        exact = sum(math.exp(-lam + k * math.log(lam) - math.lgamma(k + 1)) for k in range(m + 1))
        assert streams.poisson_cdf(m, [lam])[0] == pytest.approx(exact, abs=1e-3)
    assert streams.poisson_cdf(-1, [3.0])[0] == 0.0


def test_expected_histogram_matches_sampling():
    assert streams.expected_reuse_histogram([1.0], [1], 10 ** 6)[16] == 1.0
    rng = np.random.default_rng(0)
    # 2,000 equally likely rows, 20,000 lookups: Poisson(10) counts, mostly bin (8, 16].
    draws = rng.integers(0, 2000, 20000)
    measured = streams.reuse_histogram(draws)
    expected = streams.expected_reuse_histogram([1.0], [2000], 20000)
    assert np.abs(measured - expected).max() < 0.02
    unique = streams.expected_reuse_histogram([1.0], [2000], 20000, weight="unique")
    assert np.abs(unique - streams.reuse_histogram(draws, "unique")).max() < 0.03


def test_table_features_vector():
    hist = [0.5, 0.5] + [0.0] * 15
    spec = TableSpec("t", rows=1_254_367, dim=64, bytes_per_value=4, pooling_factor=19.3,
                     reuse_histogram=hist)
    vec = features.table_features(spec)
    assert vec.shape == (21,) and features.NUM_FEATURES == 21
    assert vec[:4].tolist() == pytest.approx([0.5, 0.1, 0.1, 1_254_367 * 256 / 2 ** 30])
    assert vec[4:].tolist() == hist
    measured = features.table_features(spec, indices=[1, 1, 2])
    assert measured[4:6].tolist() == pytest.approx([1 / 3, 2 / 3])
    scales = features.FeatureScales.fit([spec])
    assert features.table_features(spec, scales)[:3].tolist() == [1.0, 1.0, 1.0]
    assert features.features_matrix([spec, spec]).shape == (2, 21)
    with pytest.raises(ValueError, match="no reuse_histogram and no stream"):
        features.table_features(TableSpec("bare", rows=3, dim=2))
    with pytest.raises(ValueError, match="FeatureScales.dim must be > 0"):
        features.FeatureScales(dim=0)
    assert features.FEATURE_NAMES[4] == "reuse(0, 1]"
