"""Shared setup of the TF2 remote-client scripts (remote_*.py; run by test_remote_client.py).

A script is called `python remote_<x>.py MODE SPEC_JSON [ARGS...]`: MODE "remote" connects this
process to the cluster SPEC_JSON (`tf.config.experimental_connect_to_cluster`, client job
"localhost") and places tables on `/job:ps/replica:0/task:<i>`; MODE "local" runs the same
steps in one process, the shards on this process's CPU (the reference). The script prints one
JSON line last.
"""

import json
import os
import sys

import numpy as np

DIM = 4
# Failing PS calls end in under a few seconds; a call that never answers (a partition, a
# stopped PS) ends after this long instead of hanging (ConfigProto.operation_timeout_in_ms).
OPERATION_TIMEOUT_MS = 30000


def setup(argv=None):
    """(tf, de, mode, spec, devices, extra args) with TF connected in remote mode."""
    argv = sys.argv[1:] if argv is None else argv
    mode, spec, *rest = argv
    spec = json.loads(spec)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import tensorflow_recommenders_addons.dynamic_embedding as de  # pylint: disable=import-outside-toplevel
    if mode == "remote":
        from tfra_dynamic_embedding.distributed import remote  # pylint: disable=import-outside-toplevel
        remote.connect(spec, operation_timeout_in_ms=OPERATION_TIMEOUT_MS)
        devices = [f"/job:ps/replica:0/task:{i}" for i in range(len(spec["ps"]))]
    elif mode == "local":
        devices = ["/CPU:0"] * int(os.environ.get("LOCAL_SHARDS", "2"))
    else:
        raise SystemExit(f"MODE must be remote or local; got {mode!r}")
    return tf, de, mode, spec, devices, rest


def arr(t):
    """A tensor as nested lists (floats round-trip exactly through JSON)."""
    a = np.asarray(t.numpy() if hasattr(t, "numpy") else t)
    if a.dtype.kind == "f":
        a = a.astype(np.float64)
    return a.tolist()


def table(var):
    """{"keys": sorted keys, "values": their rows} of a de.Variable."""
    keys, values = var.export()
    keys, values = keys.numpy(), values.numpy()
    order = np.argsort(keys, kind="stable")
    return {"keys": arr(keys[order]), "values": arr(values[order])}


def placement(var):
    """Per shard: (the table resource's device, its number of keys, keys owned by that shard)."""
    out = []
    keys = var.export()[0].numpy()
    for i, t in enumerate(var.tables):
        owned = int(np.sum(np.mod(keys, var.shard_num) == i)) if keys.dtype.kind == "i" else None
        out.append({"device": t.resource_handle.device, "size": int(var.size(i)),
                    "owned": owned})
    return out


def done(result):
    print(json.dumps(result), flush=True)
