"""Where a variable's shards go: the `devices` argument checked (`device_list`), the PS tasks of an
enclosing ParameterServerStrategy, the CPU of a shard's task (`task_cpu`), where the file,
split and join ops of that shard run, and the shard of each key by default
(`default_partition_fn`).

Example:
    >>> device_list("/CPU:0"), task_cpu("/job:ps/replica:0/task:1/device:GPU:0")
    (['/CPU:0'], '/job:ps/replica:0/task:1/device:CPU:0')
"""

import collections.abc
import contextlib

import tensorflow as tf

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding import trainable as trainable_lib


def device_list(devices):
    if devices is None:
        current = current_device()
        return [current] if current else (ps_strategy_devices() or [current])
    if isinstance(devices, (str, tf.DeviceSpec)):
        devices = [devices]
    if not isinstance(devices, collections.abc.Iterable):
        raise ValueError(f"devices must be a device string or a non-empty list of them; "
                         f"got {devices!r}")
    devices = [d.to_string() if isinstance(d, tf.DeviceSpec) else d for d in devices]
    if not devices or not all(isinstance(d, str) for d in devices):
        raise ValueError(f"devices must be a device string or a non-empty list of them; "
                         f"got {devices!r}")
    for device in devices:
        try:
            tf.DeviceSpec.from_string(device)
        except ValueError as error:
            raise ValueError(f"devices: {device!r} is not a device name ({error})") from None
    return devices


def ps_strategy_devices():
    """Under a `tf.distribute.ParameterServerStrategy` (its scope or a replica of it): one
    device per PS task of its cluster, `/job:ps/replica:0/task:<i>`; else None."""
    if trainable_lib.current_ps_strategy() is None:
        return None
    # The strategy connected this process to its cluster: the PS tasks' devices are listed.
    specs = (tf.DeviceSpec.from_string(d.name) for d in tf.config.list_logical_devices())
    tasks = sorted({spec.task for spec in specs if spec.job == "ps"})
    return [f"/job:ps/replica:0/task:{i}" for i in tasks] or None


def task_cpu(device):
    """The CPU of `device`'s task ('' for no device): where file, split and join ops of a shard
    run (they have CPU kernels)."""
    if not device:
        return ""
    return tf.DeviceSpec.from_string(device).replace(device_type="CPU", device_index=0).to_string()


def task_cpu_scope(device):
    """`tf.device` of `task_cpu(device)`, or no scope for no device."""
    cpu = task_cpu(device)
    return tf.device(cpu) if cpu else contextlib.nullcontext()


def current_device():
    """The device of the enclosing `tf.device` scope ('' when there is none)."""
    if tf.executing_eagerly():
        return _tf_private.eager_device_name()
    return tf.no_op(name="device_probe").device  # a throwaway op picks up the device scope


def default_partition_fn(keys, shard_num):
    """Shard id of every key: `keys mod shard_num` (never negative) or a stable string hash.

    Example:
        >>> default_partition_fn(tf.constant([-1, 5], tf.int64), 4)
        <tf.Tensor: shape=(2,), dtype=int32, numpy=array([3, 1], dtype=int32)>
    """
    if keys.dtype == tf.string:
        return tf.cast(tf.strings.to_hash_bucket_fast(keys, shard_num), tf.int32)
    return tf.cast(tf.math.floormod(keys, tf.cast(shard_num, keys.dtype)), tf.int32)
