"""Live deltas: online training's exports applied to a running sparse shard, in place.

A shard process started with `--watch DIR` (`tfra-de serve --watch DIR` passes it on) follows a
`DeltaExporter` directory (online/delta.py): before it answers its first request it applies every
complete export there in order (the full export 000000, then each delta), and afterwards it
looks for new complete exports (their DONE marker written) every `poll_seconds` and applies each
in sequence order through the shard SavedModel's `apply_delta` signature -- stock TF ops on the
loaded tables, no reload, requests served meanwhile. Each piece takes the keys of its own row
slice (`manifest.slice_of`, the router's rule); tables an export does not name keep their rows.

What a request may see: each piece's rows change at once (one variable assignment, then the
index), so a request sees a piece before or after a delta, never a row half written; but the
pieces of one export, on one shard or several, and the replicas of a shard change at slightly
different moments, so for up to a poll interval two requests (or two features of one request)
may see different exports. A restarted replica replays the directory before it answers, so it
never serves rows older than the export it last saw. A stock TF Serving in a replica's place
does not follow deltas.

Example (a shard followed in this process: `follower.catch_up()` applies what is new):
    >>> import tempfile, keras
    >>> import tensorflow as tf
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> from tfra_dynamic_embedding import inference
    >>> from tfra_dynamic_embedding.online import delta
    >>> ids = keras.Input(shape=(), dtype="int64", name="ids")
    >>> emb = de.keras.layers.Embedding(2, initializer=0.0, name="live_emb")
    >>> model = keras.Model(ids, emb(ids))
    >>> _ = emb.params.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
    >>> export_dir, deltas = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> _ = inference.export_sharded(model, inference.plan_for_model(model, 1), export_dir,
    ...                              overwrite=True)
    >>> exporter = delta.DeltaExporter([emb.params], deltas)
    >>> _ = exporter.export()                                      # 000000, full
    >>> _ = emb.params.upsert(tf.constant([3], tf.int64), 3 * tf.ones([1, 2]))   # training
    >>> _ = exporter.export()                                      # 000001, a delta
    >>> shard = tf.saved_model.load(os.path.join(export_dir, "shard_0"))
    >>> follower = DeltaFollower(shard, Manifest.load(export_dir), "shard_0", deltas)
    >>> [applied.sequence for applied in follower.catch_up()]
    [0, 1]
    >>> follower.sizes()
    {'t0_live_emb_s0': 3}
"""

import dataclasses
import os
import threading
import time

import numpy as np

from tfra_dynamic_embedding.inference.manifest import DELTA_SIGNATURE
from tfra_dynamic_embedding.inference.manifest import DELTA_SUFFIXES
from tfra_dynamic_embedding.inference.manifest import Manifest
from tfra_dynamic_embedding.inference.manifest import slice_of


@dataclasses.dataclass
class Applied:
    """One export applied to a shard: its sequence, whether it was full, the keys upserted and
    removed on this shard, and when its DONE marker was written and when it was applied (Unix
    times: their difference is the staleness a request could see)."""

    sequence: int
    full: bool
    upserts: int
    removals: int
    done_at: float
    applied_at: float


class DeltaFollower:
    """Applies the exports of a `DeltaExporter` directory to one loaded shard SavedModel.

    Args:
      loaded: the shard's `tf.saved_model.load` result (written by `export_sharded`).
      manifest: the export's `Manifest`.
      shard: the shard's directory name in the export, e.g. "shard_0".
      directory: the `DeltaExporter` directory followed.
      poll_seconds: how often `start()`'s thread looks for new exports.
      log: called with one line per export applied or failed.
    """

    def __init__(self, loaded, manifest, shard, directory, poll_seconds=1.0, log=None):
        if DELTA_SIGNATURE not in loaded.signatures:
            raise ValueError(f"shard {shard!r} has no {DELTA_SIGNATURE!r} signature: it was "
                             f"exported by an older version; export it again to follow deltas")
        if not (isinstance(poll_seconds, (int, float)) and poll_seconds > 0):
            raise ValueError(f"poll_seconds must be > 0; got {poll_seconds!r}")
        if shard not in manifest.shards:
            raise ValueError(f"shard {shard!r} is not a shard of the export (it has "
                             f"{sorted(manifest.shards)})")
        self._apply = loaded.signatures[DELTA_SIGNATURE]
        self._sizes = loaded.signatures.get("table_sizes")
        self.pieces = [(feature, piece) for feature in manifest.features
                       for piece in feature.pieces if piece.shard == shard]
        self.shard, self.directory = shard, os.fspath(directory)
        self.poll_seconds = float(poll_seconds)
        self.log = log or (lambda line: None)
        self.applied = []          # Applied, in order
        self.error = None          # the export that failed, and why: following stopped there
        self._stop = threading.Event()
        self._thread = None

    @property
    def sequence(self):
        """The last sequence applied (-1: none)."""
        return self.applied[-1].sequence if self.applied else -1

    def catch_up(self):
        """Applies the complete exports after `sequence`, in order; returns their `Applied`."""
        from tfra_dynamic_embedding.online import delta  # pylint: disable=import-outside-toplevel
        done = []
        for sequence in delta.complete_exports(self.directory):
            if sequence <= self.sequence or self.error:
                continue
            path = os.path.join(self.directory, f"{sequence:06d}")
            try:
                done.append(self._apply_export(sequence, path))
            except Exception as error:  # pylint: disable=broad-except
                # A bad export stops the following (applying later deltas over a gap would
                # serve rows no training step ever had); the shard keeps serving what it has.
                self.error = f"export {path!r}: {type(error).__name__}: {error}"
                self.log(f"live deltas stopped at {path}: {self.error}")
                break
            self.applied.append(done[-1])
            self.log(f"applied {'full export' if done[-1].full else 'delta'} {path}: "
                     f"{done[-1].upserts} upserts, {done[-1].removals} removals, "
                     f"{done[-1].applied_at - done[-1].done_at:.2f} s after its DONE")
        return done

    def _apply_export(self, sequence, path):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        from tfra_dynamic_embedding.online import delta  # pylint: disable=import-outside-toplevel
        tables = delta.read_export(path)
        done_at = os.path.getmtime(os.path.join(path, delta.DONE))
        inputs, upserts, removals, full = {}, 0, 0, sequence == 0
        for feature, piece in self.pieces:
            keys_spec, rows_spec, _, _ = (self._apply.structured_input_signature[1][
                piece.key + suffix] for suffix in DELTA_SUFFIXES)
            keys, rows, removed, replace = tables.get(
                feature.table, (np.zeros([0], _numpy(keys_spec.dtype)),
                                np.zeros([0, feature.dim], _numpy(rows_spec.dtype)),
                                np.zeros([0], _numpy(keys_spec.dtype)), False))
            if rows.shape[1] != feature.dim:
                raise ValueError(f"table {feature.table!r} has rows of dim {rows.shape[1]}; "
                                 f"the export serves dim {feature.dim}")
            full = full or replace
            mine = slice_of(keys, piece.num_slices, feature.key_dtype) == piece.index
            keys, rows = _last_of_each(keys[mine], rows[mine])
            removed = removed[slice_of(removed, piece.num_slices, feature.key_dtype)
                              == piece.index]
            upserts, removals = upserts + len(keys), removals + len(removed)
            for suffix, value, spec in zip(
                    DELTA_SUFFIXES, (keys, rows, removed, replace),
                    (keys_spec, rows_spec, keys_spec, tf.TensorSpec([], tf.bool))):
                inputs[piece.key + suffix] = tf.constant(value, spec.dtype)
        if self.pieces:
            self._apply(**inputs)
        return Applied(sequence, full, upserts, removals, done_at, time.time())

    def sizes(self):
        """{piece key: keys held} of the shard now."""
        return {key: int(value) for key, value in self._sizes().items()}

    def start(self):
        """Follows the directory in a daemon thread (`catch_up` every `poll_seconds`)."""
        def follow():
            while not self._stop.wait(self.poll_seconds):
                self.catch_up()
        self._thread = threading.Thread(target=follow, name="live-deltas", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def follow_shard(loaded, saved_model_dir, directory, poll_seconds=1.0, log=None):
    """A started `DeltaFollower` of the shard SavedModel in `saved_model_dir` (a `shard_<i>`
    directory of a sharded export, whose manifest is read from its parent), caught up with
    `directory` before it returns."""
    export_dir = os.path.dirname(os.path.normpath(saved_model_dir))
    follower = DeltaFollower(loaded, Manifest.load(export_dir),
                             os.path.basename(os.path.normpath(saved_model_dir)), directory,
                             poll_seconds, log)
    follower.catch_up()
    follower.start()
    return follower


def _numpy(dtype):
    return object if dtype.name == "string" else dtype.as_numpy_dtype


def _last_of_each(keys, rows):
    """`keys` made distinct, each with its last row (an export has distinct keys already;
    `apply_delta` needs them so)."""
    if len(keys) < 2:
        return keys, rows
    _, last = np.unique(keys[::-1], return_index=True)
    keep = np.sort(len(keys) - 1 - last)
    return keys[keep], rows[keep]
