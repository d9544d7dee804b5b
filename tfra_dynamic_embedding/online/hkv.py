"""TFRA's HKV creator, `de.HkvHashTableCreator`: this package's default tables, each shard
bounded by an eviction.

TFRA's HKV table keeps its rows in GPU (and host) memory and, when an insert finds a table at
`max_capacity`, evicts the keys with the lowest scores. Here the rows live in this package's
tables (native when built, else built-in), and a trainable variable made with
`de.HkvHashTableCreator` holds a `de.Eviction(max_size=max_capacity x shards, order="lru" |
"lfu", slack=0)` unless it is given an eviction of its own (`KVCreator.default_eviction`): every
training step keeps each shard within `max_capacity` (docs/online.md). GPU memory settings
(`init_capacity`, `max_hbm_for_values`, `reserved_key_start_bit`) are checked and kept for
`get_config` but place nothing on a GPU.

Example:
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> config = de.HkvHashTableConfig(max_capacity=1 << 20, evict_strategy=de.HkvEvictStrategy.LFU)
    >>> w = de.Variable(dim=16, kv_creator=de.HkvHashTableCreator(config=config))
    >>> w.lookup(tf.constant([1], tf.int64)).shape
    TensorShape([1, 16])
"""

import enum

import tensorflow as tf

from tfra_dynamic_embedding.online import eviction as eviction_lib
from tfra_dynamic_embedding.tables.creators import CuckooHashTableCreator

KHkvHashTableInitCapacity = 1024 * 1024
KHkvHashTableMaxCapacity = 1024 * 1024
KHkvHashTableMaxHbmForValuesByBytes = 1024 * 1024 * 1024


@enum.unique
class HkvEvictStrategy(enum.IntEnum):
    """TFRA's eviction scores. LRU: last write time; LFU: write count; EPOCHLRU: (epoch, time),
    which orders keys as LRU does; EPOCHLFU: (epoch, count); CUSTOMIZED: scores from a function.
    The last two have no equivalent in this package's per-row metadata and are refused."""

    LRU = 0
    LFU = 1
    EPOCHLRU = 2
    EPOCHLFU = 3
    CUSTOMIZED = 4


# The `de.Eviction` order of each supported strategy.
_ORDERS = {HkvEvictStrategy.LRU: "lru", HkvEvictStrategy.LFU: "lfu",
           HkvEvictStrategy.EPOCHLRU: "lru"}


def _count(name, value, low):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
    return value


class HkvHashTableConfig:
    """The settings of TFRA's HKV table (see the module docstring for what each means here).

    Example:
        >>> config = HkvHashTableConfig(init_capacity=100_000, max_capacity=100_000,
        ...                             evict_strategy=HkvEvictStrategy.LRU)
        >>> config.init_capacity, config.max_capacity
        (100000, 100000)
        >>> HkvHashTableConfig(max_capacity=100_000).max_capacity   # below init_capacity: raised
        1048576
    """

    def __init__(self, init_capacity=KHkvHashTableInitCapacity,
                 max_capacity=KHkvHashTableMaxCapacity,
                 max_hbm_for_values=KHkvHashTableMaxHbmForValuesByBytes,
                 evict_strategy=HkvEvictStrategy.LRU, step_per_epoch=0, gen_scores_fn=None,
                 reserved_key_start_bit=0):
        self.init_capacity = _count("init_capacity", init_capacity, 1)
        self.max_capacity = _count("max_capacity", max_capacity, 1)
        if init_capacity > max_capacity:
            # As TFRA's HKV table does (TFRA code sets max_capacity alone, below the default
            # init_capacity of 2^20): the larger init_capacity is the capacity.
            tf.get_logger().warning(
                "HkvHashTableConfig: max_capacity %d < init_capacity %d; max_capacity is reset "
                "to %d", max_capacity, init_capacity, init_capacity)
            self.max_capacity = init_capacity
        self.max_hbm_for_values = _count("max_hbm_for_values", max_hbm_for_values, 0)
        try:
            strategy = HkvEvictStrategy(evict_strategy)
        except ValueError:
            raise ValueError(f"evict_strategy must be a de.HkvEvictStrategy; got "
                             f"{evict_strategy!r}") from None
        if strategy not in _ORDERS:
            raise ValueError(f"evict_strategy {strategy.name} is not supported: the tables here "
                             f"keep each key's last write step and write count, which give LRU, "
                             f"LFU and EPOCHLRU; got evict_strategy={strategy!r}")
        self.evict_strategy = strategy
        self.step_per_epoch = _count("step_per_epoch", step_per_epoch, 0)
        if strategy == HkvEvictStrategy.EPOCHLRU and step_per_epoch < 1:
            raise ValueError(f"step_per_epoch must be >= 1 with evict_strategy EPOCHLRU; got "
                             f"{step_per_epoch!r}")
        # Only CUSTOMIZED (refused above) reads it; TFRA passes it with any strategy.
        self.gen_scores_fn = gen_scores_fn
        self.reserved_key_start_bit = _count("reserved_key_start_bit", reserved_key_start_bit, 0)

    @property
    def order(self):
        """The `de.Eviction` order: "lru" or "lfu"."""
        return _ORDERS[self.evict_strategy]


class HkvHashTableCreator(CuckooHashTableCreator):
    """TFRA's HKV creator: this package's default tables, each shard bounded to the config's
    `max_capacity` keys by LRU / LFU eviction in training (`eviction`).

    Example:
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> config = HkvHashTableConfig(init_capacity=4096, max_capacity=4096)
        >>> creator = HkvHashTableCreator(config=config)
        >>> creator.default_eviction(shard_num=2).max_size     # 2 shards: at most 8192 keys
        8192
        >>> w = de.Variable(dim=8, devices=["/CPU:0", "/CPU:0"], kv_creator=creator)
    """

    config_class = HkvHashTableConfig

    def default_eviction(self, shard_num):
        """A trainable variable's eviction when it is given none: `max_capacity` keys per
        shard, evicted exactly (no slack) in the config's order."""
        return eviction_lib.Eviction(max_size=self.config.max_capacity * shard_num,
                                     order=self.config.order, slack=0.0)

    def get_config(self):
        return {"init_capacity": self.config.init_capacity,
                "max_capacity": self.config.max_capacity,
                "max_hbm_for_values": self.config.max_hbm_for_values,
                "evict_strategy": int(self.config.evict_strategy),
                "step_per_epoch": self.config.step_per_epoch,
                "reserved_key_start_bit": self.config.reserved_key_start_bit}
