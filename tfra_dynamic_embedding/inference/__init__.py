"""Scale-out inference: a model split into a main shard (dense layers) and sparse shards.

    from tfra_dynamic_embedding import inference
    plan = inference.plan_for_model(model, num_shards=2, strategy="size-greedy")
    inference.export_sharded(model, plan, "/tmp/sharded")      # main/, shard_<i>/, manifest.json
    inference.load_sharded("/tmp/sharded").predict(request)    # the in-process reference router

Modules: manifest (the format and row-split rule), model_cut (the model's sparse / dense parts),
export (writing SavedModels), routing (plain functions: ids per shard, combining partial pools),
compose (loading and serving in one process), grpc_shards (a shard's process: TF Serving's gRPC
PredictionService, and the main shard's client of its replicas), live_deltas (online
training's delta exports applied to running shards), rest (TF Serving's REST API),
request_checks (a REST request checked against its signature), serve (`tfra-de serve`: all of
it on loopback; operate, grpc_front, health, metrics, access_log, http_ops, supervisor: its
operational side), export_command (`tfra-de export`), stock_saved_model (a SavedModel with
stock copies of the tables, `tables.stock_table`: what `model.export` and
`de.keras.models.save_model` write by default). See docs/serving.md. Names load on first use:
`tfra-de` imports this package without TensorFlow.
"""

import importlib

_EXPORTS = {
    "ShardedModel": "compose", "load_sharded": "compose",
    "export_sharded": "export", "plan_for_model": "export",
    "Manifest": "manifest", "slice_of": "manifest",
    "combine": "routing", "main_inputs": "routing", "route": "routing",
    "RemoteShardedModel": "serve",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
