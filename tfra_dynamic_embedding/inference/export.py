"""Sharded export for scale-out inference: a main SavedModel and one SavedModel per sparse shard.

A model too big for one server is served as a main shard (the dense layers) and sparse shards
(embedding tables and their pooling), one call per sparse shard per request. `export_sharded`
writes that split from a trained model and a placement `Plan` (any strategy; a table the plan
splits row-wise is split by key with `manifest.slice_of`, the rule of training and of the router):

    export_dir/manifest.json   features -> tables -> pieces -> shards, dtypes, dims, combiners
    export_dir/main/           SavedModel, signature serving_default:
                                 request inputs other than ids + one pooled value per feature
                                 -> {"prediction": ...}
    export_dir/shard_<i>/      SavedModel per plan device holding pieces, each exactly the
                               piece's keys in a stock tf.lookup.experimental.DenseHashTable
                               (key -> row number) and its rows in one variable (compact:
                               the overhead is per key, see docs/serving.md for the RSS
                               measured); signatures serving_default
                               (per piece: <key>_ids, <key>_segments, <key>_num_segments
                               -> <key>: partial sums per cell), table_sizes, table_keys,
                               apply_delta (per piece: <key>_upsert_keys, _upsert_rows,
                               _removed, _replace -> <key>: keys held; live_deltas.py)

Every SavedModel uses built-in TF ops only: stock TensorFlow (and TF Serving) loads it without
this package. Ids a table does not hold embed as zero rows (the table's default row), as in the
single-process export (`demo.run.export_saved_model`); in training they would get fresh
initializer rows.

docs/serving.md, "Exporting", shows `plan_for_model`, `export_sharded` and
`compose.load_sharded` on a trained model (tests/inference/test_export.py runs it).
"""

import os
import shutil

import tensorflow as tf
from absl import logging

from tfra_dynamic_embedding.inference import manifest as manifest_lib
from tfra_dynamic_embedding.inference import model_cut
from tfra_dynamic_embedding.tables import stock_table
from tfra_dynamic_embedding.placement import apply as apply_lib
from tfra_dynamic_embedding.placement import proposers
from tfra_dynamic_embedding.placement import types


def plan_for_model(model, num_shards, strategy="lookup-greedy", memory=None, seed=0,
                   device_template="/job:sparse/task:{i}", input_signature=None):
    """A placement Plan of the model's tables over `num_shards` sparse shards.

    Tables are sized by their current number of keys; `memory` (bytes or '64MiB') per shard makes
    strategies split tables bigger than a shard row-wise; `input_signature` as in
    `export_sharded`.

    Example:
        >>> import keras
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> ids = keras.Input(shape=(2,), dtype="int64", name="ids")
        >>> small = de.keras.layers.Embedding(4, pooling="sum", name="small")(ids)
        >>> wide = de.keras.layers.Embedding(16, pooling="sum", name="wide")(ids)
        >>> model = keras.Model({"ids": ids}, keras.layers.Concatenate()([small, wide]))
        >>> plan = plan_for_model(model, 2, "dim-greedy")
        >>> plan.devices_for("wide"), plan.devices_for("small")
        (['/job:sparse/task:0'], ['/job:sparse/task:1'])
    """
    cut = model_cut.cut_model(model, input_signature)
    tables = []
    for feature in cut.features:
        params = feature.layer.params
        shape = _ids_per_row(cut, feature)
        lookups = 1.0
        for size in shape:
            lookups *= size if size is not None else 1
        tables.append(types.TableSpec(
            params.name, rows=max(1, int(params.size())), dim=params.dim,
            bytes_per_value=params.value_dtype.size, pooling_factor=lookups))
    task = types.Task(tables, types.make_devices(num_shards, memory, device_template))
    return proposers.propose(task, strategy, seed=seed)


def _ids_per_row(cut, feature):
    """The shape of a feature's ids without the batch axis."""
    spec = cut.request_inputs[feature.input]
    shape = list(spec.shape)[1:]
    return shape[1:] if feature.column is not None else shape


def _check_plan(plan):
    if isinstance(plan, (str, os.PathLike)):
        plan = types.Plan.load(os.fspath(plan))
    if not isinstance(plan, types.Plan):
        raise TypeError(f"plan must be a placement.Plan or the path of a plan JSON file; "
                        f"got {type(plan).__name__}")
    plan.validate(check_memory=False)
    return plan


def _check_export_dir(export_dir, overwrite):
    if not isinstance(export_dir, (str, os.PathLike)) or not os.fspath(export_dir):
        raise ValueError(f"export_dir must be a directory path; got {export_dir!r}")
    export_dir = os.fspath(export_dir)
    if os.path.exists(export_dir):
        if not os.path.isdir(export_dir):
            raise ValueError(f"export_dir {export_dir!r} exists and is not a directory")
        if os.listdir(export_dir):
            if not overwrite:
                raise ValueError(f"export_dir {export_dir!r} is not empty; pass overwrite=True "
                                 f"to replace its contents")
            shutil.rmtree(export_dir)
    os.makedirs(export_dir, exist_ok=True)
    return export_dir


def _table_of(plan, feature):
    params = feature.layer.params
    name = apply_lib.match_table(plan, params.name) or apply_lib.match_table(plan,
                                                                              feature.layer.name)
    if name is None:
        raise ValueError(f"plan does not place the table {params.name!r} of embedding layer "
                         f"{feature.layer.name!r} (plan tables: {sorted(plan.assignment)[:20]})")
    if plan.column_blocks(name):   # pieces here are row slices: blocks would pass as slices
        raise ValueError(f"plan splits table {name!r} by columns ({plan.column_blocks(name)}); "
                         f"the sharded export serves whole tables and row slices only: export "
                         f"with a plan that keeps {name!r} whole or cuts it by rows")
    spec = plan.task.table(name)
    if spec.dim != params.dim:
        raise ValueError(f"plan table {name!r} has dim {spec.dim} but layer "
                         f"{feature.layer.name!r} has dim {params.dim}")
    return name


def export_sharded(model, plan, export_dir, overwrite=False, input_signature=None):
    """Writes `model` split by `plan` into `export_dir` (see the module docstring); returns the
    `manifest.Manifest` it wrote.

    Args:
      model: a trained Keras model (functional, Sequential or subclassed; the demo's DLRM) whose
        de.keras.layers.Embedding layers each look up a request input or one column of one
        (see `model_cut`).
      plan: a `placement.Plan` (or its JSON path) placing every table of the model; tables are
        matched by (trailing part of) their de.Variable name, as `Plan.scope` does.
      export_dir: a new or empty directory.
      overwrite: replace the contents of a non-empty `export_dir`.
      input_signature: the request the model's `call` takes (a tf.TensorSpec, or a dict / list
        of them); needed for a subclassed model that has no `input_signature` of its own.
    """
    plan = _check_plan(plan)
    cut = model_cut.cut_model(model, input_signature)
    tables = {}
    for feature in cut.features:
        name = _table_of(plan, feature)
        if name in tables:
            raise ValueError(f"plan table {name!r} matches the tables of layers "
                             f"{tables[name].layer.name!r} and {feature.layer.name!r}")
        key_dtype = feature.layer.params.key_dtype.name
        if key_dtype not in manifest_lib.KEY_DTYPES:
            raise TypeError(f"layer {feature.layer.name!r} has key dtype {key_dtype}; the sharded "
                            f"export takes {list(manifest_lib.KEY_DTYPES)}")
        tables[name] = feature
    unused = sorted(set(plan.assignment) - set(tables))
    if unused:
        logging.info("plan tables %s are not tables of the model; not exported", unused)
    export_dir = _check_export_dir(export_dir, overwrite)

    # Shards: the plan's devices that hold a piece of the model's tables, in plan order.
    used = {d for name in tables for d in plan.devices_for(name)}
    shards = {}
    for device in plan.task.devices:
        if device.name in used:
            shards[device.name] = manifest_lib.shard_dir(len(shards))
    features, contents = [], {shard: [] for shard in shards.values()}
    for table_index, (name, feature) in enumerate(tables.items()):
        params = feature.layer.params
        keys, values = params.export()
        keys, values = keys.numpy(), values.numpy()
        devices = plan.devices_for(name)
        key_dtype = params.key_dtype.name
        slices = manifest_lib.slice_of(keys, len(devices), key_dtype)
        pieces = []
        for index, device in enumerate(devices):
            mine = slices == index
            piece = manifest_lib.Piece(manifest_lib.piece_key(table_index, name, index), index,
                                       len(devices), shards[device], device, int(mine.sum()))
            pieces.append(piece)
            contents[piece.shard].append((piece, params, keys[mine], values[mine]))
        features.append(manifest_lib.Feature(
            feature.name, name, feature.input, feature.column, feature.combiner, key_dtype,
            params.value_dtype.name, params.dim, pieces))

    for shard, held in contents.items():
        _save_shard(os.path.join(export_dir, shard), held)
    _save_main(os.path.join(export_dir, manifest_lib.MAIN_DIR), cut)
    manifest = manifest_lib.Manifest(
        features=features,
        main_inputs={name: _spec_dict(spec) for name, spec in cut.dense_inputs.items()},
        outputs=list(cut.outputs),
        shards={shard: device for device, shard in shards.items()},
        request_inputs={name: _spec_dict(spec) for name, spec in cut.request_inputs.items()},
        strategy=plan.strategy, plan_digest=plan.digest(), model=cut.kind)
    manifest.save(export_dir)   # written last: a directory with a manifest is complete
    logging.info("sharded export of %s: %d features on %d shards in %s", cut.kind,
                 len(features), len(shards), export_dir)
    return manifest


def _spec_dict(spec):
    return {"dtype": spec.dtype.name,
            "shape": [None if d is None else int(d) for d in spec.shape.as_list()]}


def _save_shard(path, held):
    """A SavedModel of compact stock tables, one per piece, pooling the ids it is sent."""
    module = tf.Module()
    module.tables = [stock_table.StockTable(piece.key, params.key_dtype, params.value_dtype,
                                            params.dim, keys, values)
                     for piece, params, keys, values in held]
    signature = {}
    for piece, params, _, _ in held:
        signature[piece.key + manifest_lib.IDS_SUFFIX] = tf.TensorSpec(
            [None], params.key_dtype, name=piece.key + manifest_lib.IDS_SUFFIX)
        signature[piece.key + manifest_lib.SEGMENTS_SUFFIX] = tf.TensorSpec(
            [None], tf.int32, name=piece.key + manifest_lib.SEGMENTS_SUFFIX)
        signature[piece.key + manifest_lib.NUM_SEGMENTS_SUFFIX] = tf.TensorSpec(
            [], tf.int32, name=piece.key + manifest_lib.NUM_SEGMENTS_SUFFIX)
    names = [piece.key for piece, *_ in held]
    tables = list(module.tables)

    @tf.function(input_signature=[signature])
    def serve(inputs):
        out = {}
        for key, table in zip(names, tables):
            rows = table.lookup(inputs[key + manifest_lib.IDS_SUFFIX])
            out[key] = tf.math.unsorted_segment_sum(
                rows, inputs[key + manifest_lib.SEGMENTS_SUFFIX],
                inputs[key + manifest_lib.NUM_SEGMENTS_SUFFIX])
        return out

    delta_signature = {}
    for piece, params, _, _ in held:
        for suffix, spec in manifest_lib.delta_input_specs(params.key_dtype, params.value_dtype,
                                                           params.dim).items():
            delta_signature[piece.key + suffix] = tf.TensorSpec(
                spec.shape, spec.dtype, name=piece.key + suffix)

    @tf.function(input_signature=[delta_signature])
    def apply_delta(inputs):
        return {key: table.apply(*(inputs[key + suffix]
                                   for suffix in manifest_lib.DELTA_SUFFIXES))
                for key, table in zip(names, tables)}

    @tf.function(input_signature=[])
    def sizes():
        return {key: table.index.size() for key, table in zip(names, tables)}

    @tf.function(input_signature=[])
    def table_keys():
        return {key: table.keys() for key, table in zip(names, tables)}

    module.serve = serve
    tf.saved_model.save(module, path, signatures={
        manifest_lib.SERVING_SIGNATURE: serve.get_concrete_function(),
        manifest_lib.SIZES_SIGNATURE: sizes.get_concrete_function(),
        manifest_lib.KEYS_SIGNATURE: table_keys.get_concrete_function(),
        manifest_lib.DELTA_SIGNATURE: apply_delta.get_concrete_function()})


def _save_main(path, cut):
    """A SavedModel of the dense part: dense request inputs + pooled features -> outputs."""
    module = tf.Module()
    module.dense_variables = list(cut.dense_variables)
    signature = dict(cut.dense_inputs)
    for feature in cut.features:
        if feature.name in signature:
            raise ValueError(f"feature {feature.name!r} has the name of a model input")
        signature[feature.name] = feature.output_spec
    dense_names = list(cut.dense_inputs)

    @tf.function(input_signature=[signature])
    def serve(inputs):
        dense = {name: inputs[name] for name in dense_names}
        pooled = {f.name: inputs[f.name] for f in cut.features}
        return cut.dense_call(dense, pooled)

    module.serve = serve
    tf.saved_model.save(module, path,
                        signatures={manifest_lib.SERVING_SIGNATURE: serve.get_concrete_function()})

