"""The in-process reference router: loads main and shard SavedModels, answers requests.

Each SavedModel is loaded with stock `tf.saved_model.load`; a request is routed with the plain
functions of `routing.py` (one call per shard, partial pools summed, main called), which an RPC
server reuses with remote shards in place of `call_shard`.

Usage, `load_sharded(export_dir).predict(request)` (as the trained model predicts):
docs/serving.md, "Exporting" (tests/inference/test_export.py runs it).
"""

import os

import numpy as np
import tensorflow as tf

from tfra_dynamic_embedding.inference import manifest as manifest_lib
from tfra_dynamic_embedding.inference import routing


class ShardedModel:
    """A sharded export loaded in this process: `predict(request) -> {output: array}`."""

    def __init__(self, export_dir):
        self.export_dir = os.fspath(export_dir)
        self.manifest = manifest_lib.Manifest.load(self.export_dir)
        # Keep the loaded objects: their tables live as long as they do.
        self._loaded = {name: tf.saved_model.load(os.path.join(self.export_dir, name))
                        for name in [manifest_lib.MAIN_DIR] + list(self.manifest.shards)}
        self.calls = {name: 0 for name in self._loaded}   # SavedModel calls, per name

    def _call(self, name, inputs):
        self.calls[name] += 1
        function = self._loaded[name].signatures[manifest_lib.SERVING_SIGNATURE]
        return {key: value.numpy() for key, value in function(**{
            key: tf.constant(value) for key, value in inputs.items()}).items()}

    def call_shard(self, shard, inputs):
        """One sparse shard's serving signature on routed inputs: {piece key: partial sums}."""
        return self._call(shard, inputs)

    def call_main(self, inputs):
        return self._call(manifest_lib.MAIN_DIR, inputs)

    def pooled(self, request):
        """{feature: pooled rows} of a request, as the dense part receives them."""
        routed = routing.route(self.manifest, request)
        outputs = {shard: self.call_shard(shard, inputs)
                   for shard, inputs in routed.shard_inputs.items()}
        return routed, routing.combine(self.manifest, routed, outputs)

    def predict(self, request):
        """{output name: array} for `request` ({input name: array}, the trained model's inputs)."""
        routed, pooled = self.pooled(request)
        return self.call_main(routing.main_inputs(self.manifest, routed, pooled))

    def table_sizes(self, shard):
        """{piece key: number of keys} held by `shard`."""
        out = self._loaded[shard].signatures[manifest_lib.SIZES_SIGNATURE]()
        return {key: int(value.numpy()) for key, value in out.items()}

    def table_keys(self, shard):
        """{piece key: its keys (array)} held by `shard`."""
        out = self._loaded[shard].signatures[manifest_lib.KEYS_SIGNATURE]()
        return {key: np.asarray(value.numpy()) for key, value in out.items()}


def load_sharded(export_dir):
    """A `ShardedModel` of `export_sharded`'s output directory."""
    return ShardedModel(export_dir)
