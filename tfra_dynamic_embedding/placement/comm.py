"""The all-to-all of model-parallel embeddings on GPUs, modelled (one GPU cannot measure it).

Each device sends the pooled rows of its pieces to the devices that own the samples (forward)
and receives their gradients back (backward); a row slice's partial sums are as wide as its
table's rows. Per stage a device moves pooled_bytes x (n - 1) / n.

Example:
    >>> from tfra_dynamic_embedding.placement.types import TableSpec
    >>> pooled = pooled_bytes([TableSpec("a", rows=10, dim=16)], 65536)
    >>> round(AllToAll().step_ms(pooled, num_devices=8), 4)       # forward + backward, ms
    0.0845
"""


def pooled_bytes(shards, batch_size):
    """Bytes of the pooled rows a device's pieces (Shards or TableSpecs) produce per batch.

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec
        >>> pooled_bytes([TableSpec("a", 10, dim=16)], 1024)      # 1024 * 16 * 4
        65536
    """
    return int(batch_size) * int(sum(getattr(s, "table", s).dim
                                     * getattr(s, "table", s).bytes_per_value for s in shards))


class AllToAll:
    """Milliseconds of a device's all-to-all exchanges per training step: each stage moves
    `pooled_bytes` x (n - 1) / n at `bandwidth` (bytes/s) after `latency` (s).

    The defaults are an 8-GPU NVLink-4 node: 450 GB/s per direction per GPU at peak, of which
    an all-to-all reaches well below peak (300 GB/s assumed), and a 30 us collective launch.

    Example:
        >>> round(AllToAll(bandwidth=300e9).stage_ms(2 ** 28, num_devices=8), 3)
        0.813
    """

    def __init__(self, bandwidth=300e9, latency=30e-6):
        if not bandwidth > 0 or not latency >= 0:
            raise ValueError(f"need bandwidth > 0 and latency >= 0; got bandwidth={bandwidth!r}, "
                             f"latency={latency!r}")
        self.bandwidth, self.latency = float(bandwidth), float(latency)

    def params(self):
        return {"bandwidth": self.bandwidth, "latency": self.latency}

    def stage_ms(self, pooled, num_devices):
        """One exchange (0 with one device or nothing pooled)."""
        if num_devices <= 1 or pooled <= 0:
            return 0.0
        moved = pooled * (num_devices - 1) / num_devices
        return (self.latency + moved / self.bandwidth) * 1e3

    def step_ms(self, pooled, num_devices):
        """Forward + backward exchange."""
        return 2.0 * self.stage_ms(pooled, num_devices)
