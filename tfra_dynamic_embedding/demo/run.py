"""The end-to-end demo: train a DLRM on a Criteo-format click log, evaluate, checkpoint, export.

    python -m tfra_dynamic_embedding.demo [--data PATH] [--rows N] [--epochs E] [--out DIR] ...

Steps: generate a synthetic Criteo TSV (or read a real one with `--data`), train the DLRM of
`dlrm.py` with one dynamic embedding table per categorical feature and a
`de.DynamicEmbeddingOptimizer`-wrapped Adam (Keras progress bar), print the held-out AUC and log
loss, the table sizes, save a `tf.train.Checkpoint` (model + optimizer, every epoch, resumable
with `--resume`) and a SavedModel whose `serving_default` signature takes the raw features and
runs in stock TensorFlow -- checked by loading it in a fresh process that never imports this
package.

This module imports nothing heavy at import time (the `tfra-de` command line lists its parser).
"""

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time

DEFAULT_OUT = os.path.join("/tmp", "tfra_de_demo")
SAVED_MODEL_DIR = "saved_model"
CHECKPOINT_DIR = "checkpoints"
SYNTHETIC_FILE = "criteo_synthetic.tsv"


def add_arguments(parser):
    """Adds the demo's options to an `argparse` parser."""
    data = parser.add_argument_group("data")
    data.add_argument("--data", metavar="PATH",
                      help="a Criteo TSV (label, I1..I13, C1..C26); default: generate one")
    data.add_argument("--rows", type=int, default=None, metavar="N",
                      help="rows to generate (default 150000), or lines of --data to read "
                      "(default: all)")
    data.add_argument("--eval-fraction", type=float, default=0.1, metavar="F",
                      help="share of the rows (the last ones) held out for evaluation")
    data.add_argument("--seed", type=int, default=0, help="seed of the data and the model")
    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=int, default=1, metavar="E")
    train.add_argument("--batch-size", type=int, default=1024, metavar="B")
    train.add_argument("--embedding-dim", type=int, default=16, metavar="D")
    train.add_argument("--learning-rate", type=float, default=2e-3, metavar="LR")
    train.add_argument("--optimizer", choices=("adam", "adagrad"), default="adam",
                       help="Keras optimizer, wrapped by de.DynamicEmbeddingOptimizer")
    train.add_argument("--interaction", choices=("dot", "concat"), default="dot")
    output = parser.add_argument_group("output")
    output.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"checkpoints, SavedModel, generated data, metrics.json "
                        f"(default {DEFAULT_OUT})")
    output.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in --out")
    output.add_argument("--no-serving-check", dest="serving_check", action="store_false",
                        help="do not load the SavedModel in a fresh stock-TensorFlow process")
    output.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1,
                        help="Keras verbosity: 1 progress bar, 2 one line per epoch, 0 silent")
    from tfra_dynamic_embedding.demo import cluster  # pylint: disable=import-outside-toplevel
    return cluster.add_arguments(parser)


def add_parser(subparsers):
    """`tfra-de demo`: registers the subcommand (see tfra_dynamic_embedding/cli.py)."""
    parser = subparsers.add_parser(
        "demo", help="train a DLRM with dynamic embeddings on Criteo-format data",
        description=__doc__.split("\n\n")[1])
    add_arguments(parser)
    parser.set_defaults(run=lambda args: 0 if run(args) else 1)
    return parser


def parse_args(argv=None):
    """The demo's options from `argv` (default: sys.argv[1:])."""
    parser = argparse.ArgumentParser(prog="python -m tfra_dynamic_embedding.demo",
                                     description=__doc__.split("\n\n")[1])
    return add_arguments(parser).parse_args(argv)


def main(argv=None):
    """Parses `argv` (default: sys.argv[1:]), runs the demo, returns the exit code."""
    return 0 if run(parse_args(argv)) else 1


def run(args):
    """Runs the demo for parsed `args` (see `parse_args`).

    Returns the results (metrics.json holds the same, less "model": the trained DLRM).
    """
    if getattr(args, "ps", 0):  # tables on a local cluster of PS processes: demo/cluster.py
        from tfra_dynamic_embedding.demo import cluster  # pylint: disable=import-outside-toplevel
        return cluster.run(args)
    check_args(args)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tfra_dynamic_embedding as de  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.demo import criteo, dlrm  # pylint: disable=import-outside-toplevel

    start = time.perf_counter()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    tf.keras.utils.set_random_seed(args.seed)
    print("== tfra_dynamic_embedding demo: a DLRM with dynamic embeddings on Criteo-format data")

    # -- data --------------------------------------------------------------------------------
    data = prepare_data(args, out)
    train_ds = criteo.read_tsv(data.path, args.batch_size, take=data.num_train,
                               shuffle_buffer=min(data.num_train, 100_000), seed=args.seed)
    eval_ds = eval_dataset(data)

    # -- model ---------------------------------------------------------------------------------
    model = dlrm.DLRM(embedding_dim=args.embedding_dim, interaction=args.interaction,
                      devices=getattr(args, "devices", None))
    optimizer = de.DynamicEmbeddingOptimizer(keras_optimizer(tf, args))
    model.compile(optimizer=optimizer, loss=tf.keras.losses.BinaryCrossentropy(),
                  metrics=[tf.keras.metrics.AUC(name="auc", num_thresholds=1000)],
                  jit_compile=False)
    dlrm.build(model)
    print(f"model: {describe(model)}; {type(optimizer).__name__}(learning_rate="
          f"{args.learning_rate:g}) wrapped by de.DynamicEmbeddingOptimizer")
    _, manager, epoch = make_checkpoint(model, optimizer, out, args.resume)

    # -- train ---------------------------------------------------------------------------------
    class SaveEveryEpoch(tf.keras.callbacks.Callback):
        def on_epoch_end(self, index, logs=None):
            epoch.assign(index + 1)
            manager.save(checkpoint_number=index + 1)

    began = time.perf_counter()
    if int(epoch) < args.epochs:
        model.fit(train_ds, epochs=args.epochs, initial_epoch=int(epoch),
                  callbacks=[SaveEveryEpoch()], verbose=args.verbose, shuffle=False)
    train_seconds = time.perf_counter() - began

    # -- evaluate, save ------------------------------------------------------------------------
    metrics = model.evaluate(eval_ds, return_dict=True, verbose=0)
    results = held_out_results(float(metrics["auc"]), float(metrics["loss"]), data, args,
                               train_seconds)
    finish(model, manager, data, args, out, results, start, train_seconds)
    results["model"] = model
    return results


# -- the steps of a run, shared with the cluster modes (cluster.py, ps_strategy.py) -------------
class Data:  # pylint: disable=too-few-public-methods
    """The demo's rows: `path` (a TSV), `rows`, the first `num_train` for training and the last
    `num_eval` held out; `generated` (criteo.GeneratedData) when the demo wrote the file."""

    def __init__(self, path, rows, num_train, num_eval, generated):
        self.path, self.rows, self.num_train, self.num_eval = path, rows, num_train, num_eval
        self.generated = generated


def prepare_data(args, out):
    """Generates the synthetic TSV in `out` (or counts the lines of --data), splits it, prints
    where the rows come from; returns a `Data`."""
    from tfra_dynamic_embedding.demo import criteo  # pylint: disable=import-outside-toplevel
    generated = None
    if args.data:
        path = args.data
        rows = criteo.count_lines(path, limit=args.rows)
        source = f"{path} ({rows:,} lines)"
    else:
        path = os.path.join(out, SYNTHETIC_FILE)
        rows = args.rows or 400_000
        began = time.perf_counter()
        generated = criteo.generate(path, rows, seed=args.seed)
        source = (f"{path} ({rows:,} synthetic rows written in "
                  f"{time.perf_counter() - began:.1f} s, CTR {generated.label.mean():.3f})")
    num_eval = max(1, int(round(rows * args.eval_fraction)))
    num_train = rows - num_eval
    if num_train < 1:
        raise ValueError(f"{rows} rows leave nothing to train on with --eval-fraction "
                         f"{args.eval_fraction}")
    print(f"data:  {source}\n       {num_train:,} rows for training, the last {num_eval:,} held "
          f"out")
    return Data(path, rows, num_train, num_eval, generated)


def eval_dataset(data):
    """The held-out rows of `data`, in batches of 4096."""
    from tfra_dynamic_embedding.demo import criteo  # pylint: disable=import-outside-toplevel
    return criteo.read_tsv(data.path, 4096, skip=data.num_train, take=data.num_eval)


def make_checkpoint(model, optimizer, out, resume):
    """(tf.train.Checkpoint(model, optimizer, epoch), its CheckpointManager in out/checkpoints,
    the epoch variable); restores the latest checkpoint when `resume`."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(out, CHECKPOINT_DIR),
                                         max_to_keep=2)
    if resume and manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        print(f"resumed from {manager.latest_checkpoint} (after epoch {int(epoch)}, "
              f"{sum(model.table_sizes().values()):,} embedding rows)")
    elif resume:
        print(f"nothing to resume in {manager.directory}: starting from scratch")
    return checkpoint, manager, epoch


def held_out_results(auc, log_loss, data, args, train_seconds):
    """The results dict of a run whose model scored `auc`, `log_loss` on the held-out rows, with
    the generator's references (the hidden model, the constant CTR) when the data is synthetic;
    prints them."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    num_train, num_eval, generated = data.num_train, data.num_eval, data.generated
    results = {"auc": float(auc), "log_loss": float(log_loss),
               "train_rows": num_train, "eval_rows": num_eval, "epochs": args.epochs,
               "train_seconds": round(train_seconds, 1)}
    line = f"held-out ({num_eval:,} rows): AUC {results['auc']:.4f}  log loss " \
           f"{results['log_loss']:.4f}"
    if generated is not None:
        label = generated.label[num_train:].astype(np.float32)
        truth = generated.probability[num_train:].astype(np.float32)
        oracle = tf.keras.metrics.AUC(num_thresholds=1000)
        oracle.update_state(label, truth)
        results["hidden_model_auc"] = float(oracle.result())
        results["hidden_model_log_loss"] = _log_loss(np, label, truth)
        ctr = float(generated.label[:num_train].mean())
        results["constant_ctr_log_loss"] = _log_loss(np, label, np.full_like(label, ctr))
        line += (f"\n       reference: the hidden model that drew the labels AUC "
                 f"{results['hidden_model_auc']:.4f}  log loss "
                 f"{results['hidden_model_log_loss']:.4f}; predicting the mean CTR: "
                 f"AUC 0.5  log loss {results['constant_ctr_log_loss']:.4f}")
    print(line)
    return results


def finish(model, manager, data, args, out, results, start, train_seconds):
    """The end of a run: prints the table sizes, saves the checkpoint if no epoch did, exports
    the SavedModel, serves it in a fresh stock-TF process (unless --no-serving-check), writes
    out/metrics.json; all of it recorded in `results`."""
    from tfra_dynamic_embedding.demo import criteo  # pylint: disable=import-outside-toplevel
    sizes = model.table_sizes()
    results["table_sizes"] = sizes
    print(f"table sizes (rows = distinct ids trained, layer.params.size()), total "
          f"{sum(sizes.values()):,}:")
    names = list(sizes)
    for i in range(0, len(names), 7):
        print("       " + "  ".join(f"{n}={sizes[n]:,}" for n in names[i:i + 7]))

    # Saved after every epoch; here only when this run trained none.
    results["checkpoint"] = manager.latest_checkpoint or manager.save(checkpoint_number=0)
    print(f"checkpoint (model + optimizer, tf.train.Checkpoint): {results['checkpoint']}")
    export_dir = os.path.join(out, SAVED_MODEL_DIR)
    exported = export_saved_model(model, export_dir)
    results["saved_model"] = export_dir
    print(f"SavedModel: {export_dir}\n       signature serving_default(dense: float32 [None, "
          f"{criteo.NUM_DENSE}] raw counts, categorical: string [None, "
          f"{criteo.NUM_CATEGORICAL}] hex) -> probability [None]")
    if args.serving_check:
        # Rows from both sides of the split: trained ids, and held-out ones never trained.
        sample = next(iter(criteo.read_tsv(data.path, 16, skip=max(0, data.num_train - 8),
                                           take=16, raw=True)))[0]
        expected = exported(criteo.preprocess(sample["dense"], sample["categorical"])).numpy()
        diff = check_serving(export_dir, sample["dense"].numpy(),
                             sample["categorical"].numpy(), expected.ravel())
        results["serving_max_abs_diff"] = diff
        print(f"       served by stock TensorFlow in a fresh process (no tfra import): "
              f"{len(expected)} rows, max |served - exported| = {diff:.1e}")

    results["wall_seconds"] = round(time.perf_counter() - start, 1)
    write_metrics(out, results)
    print(f"wall time: {results['wall_seconds']:.1f} s (training {train_seconds:.1f} s); "
          f"metrics in {os.path.join(out, 'metrics.json')}")


def write_metrics(out, results):
    """Writes `results` (less a "model") to out/metrics.json."""
    with open(os.path.join(out, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump({k: v for k, v in results.items() if k != "model"}, f, indent=1)


def check_args(args):
    """Raises ValueError naming the first bad option of `args` (before anything starts)."""
    workers, ps = getattr(args, "workers", 0), getattr(args, "ps", 0)
    if workers < 0:
        raise ValueError(f"--workers must be at least 0 (0: no workers); got --workers {workers}")
    if workers and ps < 1:
        raise ValueError(f"--workers {workers} needs --ps N >= 1 (the workers train tables that "
                         f"live on PS tasks); got --ps {ps}")
    if args.rows is not None and args.rows < 2:
        raise ValueError(f"--rows must be at least 2; got {args.rows}")
    if not 0.0 < args.eval_fraction < 1.0:
        raise ValueError(f"--eval-fraction must be in (0, 1); got {args.eval_fraction}")
    for name in ("epochs", "batch_size", "embedding_dim"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive; "
                             f"got {getattr(args, name)}")
    if args.data and not os.path.isfile(args.data):
        raise ValueError(f"--data {args.data!r} is not a file")


def keras_optimizer(tf, args):
    """The Keras optimizer `--optimizer` and `--learning-rate` name."""
    if args.optimizer == "adagrad":
        return tf.keras.optimizers.Adagrad(args.learning_rate)
    return tf.keras.optimizers.Adam(args.learning_rate)


def _log_loss(np, label, probability):
    p = np.clip(probability.astype(np.float64), 1e-7, 1 - 1e-7)
    return float(-np.mean(label * np.log(p) + (1 - label) * np.log(1 - p)))


def describe(model):
    """One line describing a DLRM."""
    tables = "dynamic" if model.dynamic else "static"
    arch = model.architecture
    parts = [f"{model.num_categorical} {tables} tables x dim {model.embedding_dim}"]
    if model.num_dense:
        parts.append("bottom MLP " + "-".join(
            str(n) for n in (model.num_dense, *arch["bottom"], model.embedding_dim)))
    if model.interaction == "dot":
        pairs = model.vectors * (model.vectors - 1) // 2
        parts.append(f"dot interaction ({pairs} pairs)")
    else:
        parts.append("concat interaction")
    parts.append("top MLP " + "-".join(str(n) for n in (*arch["top"], 1)) + " sigmoid")
    return ", ".join(parts)


# -- export --------------------------------------------------------------------------------------
def export_saved_model(model, export_dir):
    """Saves `model` with a raw-feature `serving_default` signature, servable by stock TF, and
    an `apply_delta` signature taking delta exports (online/delta.py) in place.

    The tables are copied into the built-in backend first (stock TF hash tables), whatever backend
    the model trained with, so the SavedModel needs no custom op. Ids never trained embed as
    zeros there (in training they get fresh initializer rows), so serving is deterministic.
    Returns the exported model (a DLRM sharing no state with `model`).
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tfra_dynamic_embedding as de  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.demo import criteo, dlrm  # pylint: disable=import-outside-toplevel
    from tfra_dynamic_embedding.online import delta  # pylint: disable=import-outside-toplevel

    serving = model.clone(kv_creator=de.BuiltinKVCreator(), initializer=0.0)
    dlrm.build(serving)
    for source, target in zip(model.embeddings, serving.embeddings):
        keys, values = source.params.export()
        target.params.upsert(keys, values)
    for source, target in zip(model.dense_layers(), serving.dense_layers()):
        target.set_weights(source.get_weights())

    # The module holds the tables and weights the signature reads, not the Keras model: Keras
    # would add a `serving_default` of its own, traced with float inputs.
    module = tf.Module()
    module.tables = [layer.params for layer in serving.embeddings]
    module.weights = [w for layer in serving.dense_layers() for w in layer.weights]

    @tf.function(input_signature=[
        tf.TensorSpec([None, criteo.NUM_DENSE], tf.float32, name="dense"),
        tf.TensorSpec([None, criteo.NUM_CATEGORICAL], tf.string, name="categorical")])
    def serve(dense, categorical):
        probability = serving(criteo.preprocess(dense, categorical), training=False)
        return {"probability": tf.reshape(probability, [-1])}

    module.serve = serve
    # Online learning: `online.delta.apply_delta(loaded, delta_path, [t.name for t in tables])`
    # brings a running server's tables up to a delta export of the training tables in place.
    apply_delta = delta.add_apply_delta_signature(module, module.tables)
    tf.saved_model.save(module, export_dir,
                        signatures={"serving_default": serve, "apply_delta": apply_delta})
    return serving


_SERVING_CHECK = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    inputs = np.load(sys.argv[2], allow_pickle=False)
    loaded = tf.saved_model.load(sys.argv[1])  # keep it: its tables live as long as it does
    serve = loaded.signatures["serving_default"]
    out = serve(dense=tf.constant(inputs["dense"]), categorical=tf.constant(inputs["categorical"]))
    leaked = [m for m in sys.modules if m.startswith(("tfra_dynamic_embedding",
                                                      "tensorflow_recommenders_addons"))]
    print(json.dumps({"probability": out["probability"].numpy().tolist(), "leaked": leaked}))
""")


def serve_in_fresh_process(export_dir, dense, categorical, timeout=300):
    """Runs the SavedModel's serving_default in a new Python that never imports this package.

    Returns the probabilities (a list). Raises RuntimeError if the process fails or imported us.
    """
    import numpy as np  # pylint: disable=import-outside-toplevel

    inputs_path = os.path.join(export_dir, "..", "serving_check_inputs.npz")
    np.savez(inputs_path, dense=np.asarray(dense, np.float32),
             categorical=np.asarray(categorical).astype(np.bytes_))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH="")
    result = subprocess.run(
        [sys.executable, "-c", _SERVING_CHECK, os.path.abspath(export_dir),
         os.path.abspath(inputs_path)], capture_output=True, text=True, env=env,
        cwd=os.path.dirname(os.path.abspath(export_dir)), timeout=timeout, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"serving the SavedModel in stock TensorFlow failed:\n"
                           f"{result.stderr[-3000:]}")
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    if answer["leaked"]:
        raise RuntimeError(f"the serving process imported {answer['leaked']}")
    return answer["probability"]


def check_serving(export_dir, dense, categorical, expected):
    """Max |served - expected| of the SavedModel served in a fresh stock-TF process."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    served = np.asarray(serve_in_fresh_process(export_dir, dense, categorical))
    if served.shape != np.shape(expected):
        raise RuntimeError(f"served shape {served.shape}, expected {np.shape(expected)}")
    return float(np.max(np.abs(served - expected)))
