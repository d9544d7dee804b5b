"""The benchmarks' training batches in TFRA's setup, with numpy alone (so that a trainer running
under TFRA's own environment can make the same batches).

Example:
    >>> from zipf_batches import tfra_batches
    >>> inputs, labels = tfra_batches(1, batch_size=4, seed=0)[0]
    >>> inputs["ids"].shape, labels.shape
    ((4, 26), (4,))
"""

import numpy as np


def tfra_batches(num_batches, batch_size, seed, tables=26, exponent=1.2):
    """Batches of `tables` Zipf(exponent) ids per example (arbitrary int64), random labels."""
    rng = np.random.default_rng(seed)
    ids = rng.zipf(exponent, size=(num_batches, batch_size, tables)).astype(np.int64)
    # Spread each table's ids over the int64 range (a fixed odd multiplier is a bijection).
    ids = ids * np.int64(0x9E3779B97F4A7C15 - 2**64) + np.arange(tables, dtype=np.int64)
    labels = rng.integers(0, 2, size=(num_batches, batch_size)).astype(np.float32)
    return [({"ids": ids[i]}, labels[i]) for i in range(num_batches)]
