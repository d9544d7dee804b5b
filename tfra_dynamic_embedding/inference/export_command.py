"""`tfra-de export`: a trained model to a sharded export (or one stock SavedModel) in one command.

    tfra-de export --model model.keras --shards 2 --strategy size-greedy --out /tmp/sharded
    tfra-de export --model-fn my_model:build --checkpoint ckpt/ --plan plan.json --out /tmp/sharded
    tfra-de export --model model.keras --plain --out /models/ranker/1     # stock TF Serving

The model is either
  * `--model PATH`: a Keras model saved with its tables -- a Keras 3 `.keras` file
    (`model.save("model.keras")`) or a tf_keras SavedModel directory (`model.save(DIR,
    save_format="tf")`, `de.keras.models.save_model(model, DIR)`); or
  * `--model-fn MODULE:FUNCTION` (the module importable from the current directory or
    PYTHONPATH): a function of no arguments returning the model, built (a functional model is; call
    a subclassed one once), and `--checkpoint PATH` holding its weights: a `tf.train.Checkpoint`
    (a prefix, or a directory: its latest) that tracked the model as `model=` (`--checkpoint-key`
    names another attribute), or a `.weights.h5` file (`model.save_weights`).

and the split is `--plan PLAN.json` (a placement plan, e.g. from `tfra-de plan`), `--shards N`
with `--strategy` / `--memory` (`inference.plan_for_model`), or `--plain` (`--shards 0`): one
SavedModel with stock tables that stock TensorFlow and TF Serving load (`stock_saved_model`).
The sharded export is `inference.export_sharded`'s (docs/serving.md); `tfra-de serve OUT`
serves it.
"""

import json
import os
import sys

KERAS_METADATA = "keras_metadata.pb"   # what tf_keras writes into a SavedModel of a Keras model


def add_parser(subparsers):
    """`tfra-de export`: registers the subcommand (see tfra_dynamic_embedding/cli.py)."""
    parser = subparsers.add_parser(
        "export", help="a trained model to a sharded export (or one stock SavedModel)",
        description=__doc__.split("\n\n", 1)[1], formatter_class=_raw_formatter())
    source = parser.add_argument_group("the model (one of)")
    model = source.add_mutually_exclusive_group()
    model.add_argument("--model", metavar="PATH",
                       help="a .keras file or a tf_keras SavedModel directory")
    model.add_argument("--model-fn", metavar="MODULE:FUNCTION",
                       help="a function building the model; with --checkpoint")
    source.add_argument("--checkpoint", metavar="PATH",
                        help="--model-fn: the weights (tf.train.Checkpoint prefix or directory, "
                        "or a .weights.h5 file)")
    source.add_argument("--checkpoint-key", default="model",
                        help="--model-fn: the model's attribute in the tf.train.Checkpoint "
                        "(default: model)")
    source.add_argument("--input-signature", metavar="JSON",
                        help="the request of a model without one (a Keras 3 subclassed model): "
                        "{\"name\": {\"shape\": [null, 3], \"dtype\": \"int64\"}, ...}")
    split = parser.add_argument_group("the split (one of)")
    split.add_argument("--plan", metavar="PLAN.json", help="a placement plan of the tables")
    split.add_argument("--shards", type=int, metavar="N",
                       help="plan N sparse shards with --strategy (0: as --plain)")
    split.add_argument("--plain", action="store_true",
                       help="one SavedModel with stock tables (no shards)")
    split.add_argument("--strategy", default=None,
                       help="--shards: placement strategy (default lookup-greedy; see `tfra-de "
                       "evaluate --list`)")
    split.add_argument("--memory", default=None,
                       help="--shards: memory per shard, e.g. 64MiB (bigger tables are split)")
    split.add_argument("--seed", type=int, default=0, help="--shards: the strategy's seed")
    split.add_argument("--save-plan", metavar="FILE", help="--shards: also write the plan")
    parser.add_argument("--out", required=True, help="the export directory to write")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the contents of a non-empty --out")
    parser.set_defaults(run=run)
    return parser


def _raw_formatter():
    import argparse  # pylint: disable=import-outside-toplevel
    return argparse.RawDescriptionHelpFormatter


def _error(message):
    """A `CliError` of the running `tfra-de` (exit code 2): under `python -m
    tfra_dynamic_embedding.cli` that is `__main__`'s class, not the module's."""
    running = sys.modules.get("__main__")
    if not (hasattr(running, "CliError") and hasattr(running, "SUBCOMMANDS")):
        from tfra_dynamic_embedding import cli as running  # pylint: disable=import-outside-toplevel
    return running.CliError(message)


def check_args(args):
    """Raises CliError naming the first bad argument (nothing is loaded yet)."""
    if not args.model and not args.model_fn:
        raise _error("give the model: --model PATH (.keras file or tf_keras SavedModel) or "
                     "--model-fn MODULE:FUNCTION with --checkpoint PATH")
    if args.model and not os.path.exists(args.model):
        raise _error(f"--model {args.model!r} does not exist")
    if args.model and args.checkpoint:
        raise _error("--checkpoint goes with --model-fn (a --model file holds its weights)")
    if args.model_fn:
        module, _, function = args.model_fn.partition(":")
        if not module or not function or not function.isidentifier():
            raise _error(f"--model-fn must be MODULE:FUNCTION (e.g. my_model:build); got "
                         f"{args.model_fn!r}")
        if not args.checkpoint:
            raise _error("--model-fn needs --checkpoint PATH: the trained weights")
    splits = [name for name, given in (("--plan", args.plan), ("--shards", args.shards is not None),
                                       ("--plain", args.plain)) if given]
    if len(splits) != 1:
        raise _error(f"give one of --plan PLAN.json, --shards N or --plain; got "
                     f"{' and '.join(splits) or 'none'}")
    if args.shards is not None and args.shards < 0:
        raise _error(f"--shards must be >= 0 (0: a plain SavedModel); got {args.shards}")
    sharding = args.shards is not None and args.shards > 0
    for name, value in (("--strategy", args.strategy), ("--memory", args.memory),
                        ("--save-plan", args.save_plan)):
        if value is not None and not sharding:
            raise _error(f"{name} goes with --shards N (N > 0)")
    if args.strategy is not None:
        from tfra_dynamic_embedding.placement import proposers  # pylint: disable=import-outside-toplevel
        if args.strategy not in proposers.list_strategies():
            raise _error(f"--strategy must be one of {proposers.list_strategies()}; got "
                         f"{args.strategy!r}")
    if args.plan and not os.path.isfile(args.plan):
        raise _error(f"--plan {args.plan!r} is not a file")
    if os.path.isfile(args.out):
        raise _error(f"--out {args.out!r} is a file, not a directory")
    if os.path.isdir(args.out) and os.listdir(args.out) and not args.overwrite:
        raise _error(f"--out {args.out!r} is not empty; pass --overwrite to replace it")


def input_signature(text):
    """The `--input-signature` JSON as {name: tf.TensorSpec}, or None."""
    if text is None:
        return None
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    try:
        data = json.loads(text)
        specs = {name: tf.TensorSpec(spec["shape"], tf.as_dtype(spec["dtype"]), name=name)
                 for name, spec in data.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise _error(f"--input-signature must be JSON {{name: {{\"shape\": [...], \"dtype\": "
                     f"...}}}}; got {text!r} ({error})") from error
    if not specs:
        raise _error("--input-signature names no input")
    return specs


def load_model(path):
    """A Keras model saved with its tables: a `.keras` file or a tf_keras SavedModel."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.inference import stock_saved_model  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.keras import layers  # pylint: disable=import-outside-toplevel
    layers.register_keras_layers()   # the files name them "tfra_dynamic_embedding>Embedding"
    if os.path.isfile(path):
        if not path.endswith(".keras"):
            raise _error(f"--model {path!r}: a model file must be a Keras 3 '.keras' file")
        import keras  # pylint: disable=import-outside-toplevel
        return keras.saving.load_model(path, compile=False)
    if not tf.saved_model.contains_saved_model(path):
        raise _error(f"--model {path!r} is a directory without a SavedModel")
    if not os.path.exists(os.path.join(path, KERAS_METADATA)):
        raise _error(
            f"--model {path!r} is a SavedModel but not a Keras model (no {KERAS_METADATA}): a "
            f"serving SavedModel (model.export, de.keras.models.save_model with stock tables) "
            f"keeps no model to cut; give --model-fn MODULE:FUNCTION and --checkpoint PATH")
    import tf_keras  # pylint: disable=import-outside-toplevel
    try:
        return tf_keras.models.load_model(path, compile=False)
    except Exception as error:   # pylint: disable=broad-except  (TF raises several types)
        if "Op type not registered 'TfraDe" not in str(error):
            raise
        op = str(error).split("'")[1]
        raise RuntimeError(stock_saved_model.missing_package_message(path, op)) from error


def build_and_restore(model_fn, checkpoint, key="model"):
    """The model `model_fn` ("module:function") builds, with the weights of `checkpoint`."""
    import importlib  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.inference import stock_saved_model  # pylint: disable=import-outside-toplevel
    module_name, _, function_name = model_fn.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:   # `python -m` has it; scripts not
        sys.path.insert(0, os.getcwd())
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise _error(f"--model-fn {model_fn!r}: {error}") from error
    model = function()
    if not stock_saved_model.dynamic_embeddings_of(model):
        raise _error(f"--model-fn {model_fn!r} returned {type(model).__name__} "
                     f"{getattr(model, 'name', '')!r}, which has no de.keras.layers.Embedding")
    if checkpoint.endswith((".weights.h5", ".h5")):
        model.load_weights(checkpoint)
    else:
        prefix = tf.train.latest_checkpoint(checkpoint) if os.path.isdir(checkpoint) else checkpoint
        if prefix is None or not tf.io.gfile.glob(prefix + ".index"):
            raise _error(f"--checkpoint {checkpoint!r} holds no TF checkpoint (a prefix with a "
                         f".index file, or a directory with a 'checkpoint' file)")
        tf.train.Checkpoint(**{key: model}).restore(prefix).expect_partial()
    if all(int(v.size()) == 0 for v in stock_saved_model.dynamic_embeddings_of(model)):
        raise _error(f"--checkpoint {checkpoint!r} restored no table rows into the model: was it "
                     f"saved as tf.train.Checkpoint({key}=model) (see --checkpoint-key)?")
    return model


def run(args):
    """Loads the model and writes the export; returns the exit code."""
    check_args(args)
    signature = input_signature(args.input_signature)
    model = (load_model(args.model) if args.model
             else build_and_restore(args.model_fn, args.checkpoint, args.checkpoint_key))
    if args.plain or args.shards == 0:
        import shutil  # pylint: disable=import-outside-toplevel
        from tfra_dynamic_embedding.inference import stock_saved_model  # pylint: disable=import-outside-toplevel
        if os.path.isdir(args.out) and os.listdir(args.out):
            shutil.rmtree(args.out)   # check_args refused a non-empty one without --overwrite
        stock_saved_model.save(args.out, stock_saved_model.default_signatures(model, signature))
        tables = stock_saved_model.dynamic_embeddings_of(model)
        print(f"wrote a SavedModel with stock tables ({len(tables)} tables, "
              f"{sum(int(t.size()) for t in tables)} keys) to {args.out}: stock TensorFlow and "
              f"TF Serving load it (signature serving_default)")
        return 0
    from tfra_dynamic_embedding.inference import export  # pylint: disable=import-outside-toplevel
    if args.plan:
        plan = args.plan
    else:
        plan = export.plan_for_model(model, args.shards, args.strategy or "lookup-greedy",
                                     memory=args.memory, seed=args.seed,
                                     input_signature=signature)
        if args.save_plan:
            plan.save(args.save_plan)
            print(f"wrote the plan ({plan.strategy}) to {args.save_plan}")
    manifest = export.export_sharded(model, plan, args.out, overwrite=args.overwrite,
                                     input_signature=signature)
    for feature in manifest.features:
        pieces = ", ".join(f"{p.shard} ({p.num_keys} keys)" for p in feature.pieces)
        print(f"  {feature.name}: table {feature.table} -> {pieces}")
    print(f"wrote a sharded export ({len(manifest.features)} features on "
          f"{len(manifest.shards)} shards, strategy {manifest.strategy}) to {args.out}; serve "
          f"it with: tfra-de serve {args.out}")
    return 0
