"""Neural multi-table cost model: what the embedding kernels of a device cost, learned from data.

Architecture (trained with TF/Keras, run in numpy for planning):
  per table:   21 features --standardise--> Dense(128, relu) --> Dense(32, relu)   (shared MLP)
  per device:  sum of its tables' 32-d representations
  per stage:   Dense(64, relu) --> Dense(1, softplus), one head for forward, one for backward
  device cost = forward + backward (ms of one training step at the trained batch size);
  plan cost   = max over devices (devices work in parallel).

The sum of learned representations lets the heads model multi-table interactions (cache
sharing, contention, kernel overheads) that an additive model cannot. Training data are
benchmark records (JSONL, one per device shard, see `load_records`); the model is exported to
plain numpy arrays (`CostModel`), so planning needs neither TensorFlow nor a GPU.

The estimator "learned" (predicted costs, not measured; estimators.py names it):
    report = evaluate_plan(plan, "learned")                  # shipped weights of the task's profile
    est = get_estimator("learned", weights="my_model.npz")    # retrained weights

Hardware profiles: a task whose devices are all GPUs has profile "gpu" (`profile_of`), or
"gpu_wide" when one of its tables is wider than the GPU pool's tables (`WIDE_DIM`), any other
"cpu"; each profile has its own weights, cost_model_{profile}.npz and policy_{profile}.npz
(`weights_file`; a missing file falls back along gpu_wide -> gpu -> cpu). A GPU model (meta
"profile": "gpu" or "gpu_wide") predicts compute only; the estimator and the policy add the
modelled all-to-all of each device (`comm_ms`, meta "comm").

Shard features: a row slice of a table gets the table's features with hash size, pooling factor
and size scaled by the slice's share of rows. Costs are predicted at the batch size the model was
trained on and scaled linearly to the task's batch size (placement only needs relative costs).
"""

import functools
import json
import math
import os

import numpy as np

from tfra_dynamic_embedding.placement import comm as comm_lib
from tfra_dynamic_embedding.placement import estimators, features, streams, workloads
from tfra_dynamic_embedding.placement.benchmark import records as records_lib
from tfra_dynamic_embedding.placement.types import TableSpec

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
DEFAULT_WEIGHTS = os.path.join(DATA_DIR, "cost_model_cpu.npz")
PROFILES = ("cpu", "gpu", "gpu_wide")
GPU_PROFILES = ("gpu", "gpu_wide")
# The file a profile falls back to when a weights directory lacks its own.
FALLBACK = {"gpu_wide": "gpu", "gpu": "cpu"}
# The widest table of the GPU pool (MetaSyn's dims): the "gpu" weights were trained on tables
# up to this wide; the "gpu_wide" weights also on measured devices of wider ones. Those planned
# unseen tasks of narrow tables worse than the "gpu" weights (docs/learned_placement.md), so
# each kind of task keeps the weights that measured best on it.
WIDE_DIM = 128
EMBED_DIM = 32
HIDDEN = 128
HEAD_HIDDEN = 64
STAGES = ("forward", "backward")
MODEL_FORMAT = "tfra-de-cost-model/1"


def _relu(x):
    return np.maximum(x, 0.0)


def _softplus(x):
    return np.logaddexp(0.0, x)


# -- hardware profiles ---------------------------------------------------------------------------
def profile_of(task):
    """Which weights plan and cost `task`: "gpu" when every device is a GPU (its name contains
    "GPU", any case), "gpu_wide" when moreover one of its tables is wider than `WIDE_DIM`, else
    "cpu" (also for None or a task without devices).

    Example: profile_of(Task(tables, make_devices(8, "16GiB", "/GPU:{i}")))  # -> "gpu"
    """
    devices = getattr(task, "devices", None) or ()
    if not devices or not all("gpu" in d.name.lower() for d in devices):
        return "cpu"
    return "gpu_wide" if any(t.dim > WIDE_DIM for t in task.tables) else "gpu"


def weights_file(kind, profile="cpu", directory=None):
    """Path of `directory`/{kind}_{profile}.npz (kind "cost_model" or "policy"; directory None:
    the shipped data), or of the file the profile falls back to (`FALLBACK`) when it has none
    there.

    Example: weights_file("policy", "gpu_wide", "my_gpu_weights/")   # its policy_gpu.npz
    """
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}; got {profile!r}")
    directory = directory or DATA_DIR
    path = os.path.join(directory, f"{kind}_{profile}.npz")
    while profile in FALLBACK and not os.path.exists(path):
        profile = FALLBACK[profile]
        path = os.path.join(directory, f"{kind}_{profile}.npz")
    return path


def comm_ms(model, shards, task):
    """ms of one device's all-to-all per training step (forward + backward) under a GPU
    model's comm meta (`CostModel.comm`); 0 for a CPU model, no shards or one device.

    Example: comm_ms(gpu_model, plan.shards_on("/GPU:0"), plan.task)
    """
    comm = model.comm
    if comm is None or not shards or task is None:
        return 0.0
    return comm.step_ms(comm_lib.pooled_bytes(shards, task.batch_size), task.num_devices)


# -- records -------------------------------------------------------------------------------------
def load_records(path):
    """Benchmark records from a JSONL file (blank and malformed trailing lines are skipped, as a
    file still being written may end mid-line)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no benchmark records at {path}")
    return [rec for rec in records_lib.read_records(path)
            if rec.get("tables") and "forward_ms" in rec and "backward_ms" in rec]


def shard_features(table, fraction=1.0, scales=features.FeatureScales(), batch_size=1024):
    """21 features of a (slice of a) table: rows, pooling and size scale with the slice.

    A table with neither a reuse histogram nor an index stream gets the histogram expected of
    uniformly random lookups (batch_size * pooling factor draws over its rows).
    """
    if table.reuse_histogram is None and table.stream is None:
        hist = streams.expected_reuse_histogram([1.0], [table.rows],
                                                batch_size * table.pooling_factor)
        head = [table.dim / scales.dim, table.rows / scales.hash_size,
                table.pooling_factor / scales.pooling_factor, table.size_bytes / 2 ** 30]
        x = np.concatenate([np.asarray(head, dtype=float), hist])
    else:
        x = features.table_features(table, scales).copy()
    if fraction != 1.0:
        x[1] *= fraction
        x[2] *= fraction
        x[3] *= fraction
    return x


def record_features(record, scales=features.FeatureScales()):
    """[tables, 21] features of one record: recomputed from the specs when they carry a reuse
    histogram (so training and planning use the same scales), else the stored features."""
    rows = []
    for entry in record["tables"]:
        spec = entry.get("spec")
        x = None
        if spec:
            try:
                table = TableSpec.from_dict(spec)
                if table.reuse_histogram is not None:
                    x = shard_features(table, float(entry.get("fraction", 1.0)), scales)
            except (ValueError, KeyError, TypeError):
                x = None
        if x is None:
            x = np.asarray(entry["features"], dtype=float)
        rows.append(x)
    return np.stack(rows)


def table_names(record):
    return [entry.get("name") or (entry.get("spec") or {}).get("name") for entry in record["tables"]]


def pad_records(records, scales=features.FeatureScales()):
    """(x [n, T, 21], mask [n, T, 1], y [n, 2] forward/backward ms) of records, zero-padded."""
    feats = [record_features(r, scales) for r in records]
    width = max(len(f) for f in feats)
    x = np.zeros((len(records), width, features.NUM_FEATURES), dtype=np.float32)
    mask = np.zeros((len(records), width, 1), dtype=np.float32)
    for i, f in enumerate(feats):
        x[i, :len(f)] = f
        mask[i, :len(f)] = 1.0
    y = np.array([[r["forward_ms"], r["backward_ms"]] for r in records], dtype=np.float32)
    return x, mask, y


def split_by_tables(records, seed=0):
    """(train, unseen) records by unseen tables; records mixing both sides are dropped.

    A record's side comes from, in order: its "split" field ("train" / "test"); for records
    measured on a generated pool (fields pool_seed, pool_tables, row_scale, batch_size), that
    pool's halves `workloads.split_pool(pool, seed=pool_seed)` -- the halves the placement tasks
    train and test on (`train.cpu_pool_tasks`); otherwise table names split in random halves
    (`seed`).
    """
    names = sorted({n for r in records for n in table_names(r)})
    order = np.random.default_rng(seed).permutation(len(names))
    by_name = {names[i] for i in order[:len(names) // 2]}
    train, unseen = [], []
    for rec in records:
        if rec.get("split") in ("train", "test"):
            (train if rec["split"] == "train" else unseen).append(rec)
            continue
        first = by_name
        if "pool_seed" in rec and "pool_tables" in rec:
            first = _pool_train_names(int(rec["pool_tables"]), int(rec["pool_seed"]),
                                      float(rec.get("row_scale", 1.0)),
                                      int(rec.get("batch_size", 65536)))
        inside = [n in first for n in table_names(rec)]
        if all(inside):
            train.append(rec)
        elif not any(inside):
            unseen.append(rec)
    return train, unseen


@functools.lru_cache(maxsize=8)
def _pool_train_names(pool_tables, pool_seed, row_scale, batch_size):
    """Names of the first (training) half of a generated pool."""
    pool = workloads.generate_pool(pool_tables, seed=pool_seed, batch_size=batch_size,
                                   row_scale=row_scale)
    return frozenset(t.name for t in workloads.split_pool(pool, seed=pool_seed)[0])


# -- the numpy model -----------------------------------------------------------------------------
class CostModel:
    """The exported cost model: numpy forward pass, save/load as a small .npz.

    `params`: w1 [21,128], b1, w2 [128,32], b2, and per stage s: {s}_w1 [32,64], {s}_b1,
    {s}_w2 [64,1], {s}_b2; x_mean / x_std [21] standardise the features; y_scale (ms) is the
    unit of the heads' outputs. `meta`: batch_size of the training data, backend, metrics.
    """

    def __init__(self, params, meta=None):
        self.params = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
        self.meta = dict(meta or {})
        self.batch_size = int(self.meta.get("batch_size") or 4096)
        self.scales = features.FeatureScales.from_dict(self.meta["scales"]) \
            if self.meta.get("scales") else features.FeatureScales()
        p = self.params
        self._w1 = p["w1"] / p["x_std"][:, None]          # standardisation folded in
        self._b1 = p["b1"] - (p["x_mean"] / p["x_std"]) @ p["w1"]
        self._y_scale = float(p["y_scale"])
        # The stage heads fused into two matmuls (planning calls `heads` once per placement
        # step, where numpy's per-call overhead dominates): hidden layers side by side, output
        # weights block-diagonal.
        self._head_w1 = np.concatenate([p[f"{s}_w1"] for s in STAGES], axis=1)
        self._head_b1 = np.concatenate([p[f"{s}_b1"] for s in STAGES])
        self._head_w2 = np.zeros((self._head_w1.shape[1], len(STAGES)))
        start = 0
        for k, stage in enumerate(STAGES):
            rows = p[f"{stage}_w2"].shape[0]
            self._head_w2[start:start + rows, k] = p[f"{stage}_w2"][:, 0]
            start += rows
        self._head_b2 = np.concatenate([p[f"{s}_b2"] for s in STAGES])
        self._cache = {}

    # forward pass pieces
    def embed(self, x):
        """[n, 21] features -> [n, 32] table representations."""
        h = _relu(np.asarray(x, dtype=np.float64) @ self._w1 + self._b1)
        return _relu(h @ self.params["w2"] + self.params["b2"])

    def heads(self, summed):
        """[..., 32] summed representations -> [..., 2] forward/backward ms (batch of training)."""
        return self.heads_from_projection(self.project(summed))

    def total(self, summed, count=None):
        """[...] ms of devices with summed representations `summed` (0 where count == 0)."""
        cost = self.heads(summed).sum(axis=-1)
        if count is not None:
            cost = np.where(np.asarray(count) > 0, cost, 0.0)
        return cost

    # The heads' first layer is linear in the summed representation, so a planner can keep
    # project(S_d) per device and add project(e) of a piece instead of re-running the
    # [devices, 32] x [32, 128] product at every placement step:
    #   total_from_projection(project(S) + project(e)) == total(S + e)
    def project(self, summed):
        """[..., 32] -> [..., 128]: the stage heads' first layer before bias and relu."""
        return summed @ self._head_w1

    def heads_from_projection(self, projected):
        """[..., 128] (a sum of `project` outputs) -> [..., 2] forward/backward ms."""
        h = projected + self._head_b1
        np.maximum(h, 0.0, out=h)   # relu in place: planning calls this once per step
        return _softplus(h @ self._head_w2 + self._head_b2) * self._y_scale

    def total_from_projection(self, projected):
        """[...] ms of devices whose summed representations project to `projected`."""
        return self.heads_from_projection(projected).sum(axis=-1)

    def predict_records(self, records):
        """[n, 2] predicted forward/backward ms of benchmark records."""
        return np.stack([self.heads(self.embed(record_features(r, self.scales)).sum(axis=0))
                         for r in records])

    # shards
    def shard_embedding(self, table, index=0, num_slices=1):
        key = (id(table), index, num_slices)
        # the entry keeps its table alive, so no other table can take its id meanwhile; the
        # scalar fields catch a spec edited in place
        fields = (table.name, table.rows, table.dim, table.bytes_per_value,
                  table.pooling_factor)
        hit = self._cache.get(key)
        if hit is None or hit[1] != fields:
            fraction = table.slice_rows(index, num_slices) / table.rows
            hit = (table, fields, self.embed(shard_features(table, fraction, self.scales,
                                                            self.batch_size)[None])[0])
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = hit
        return hit[2]

    def embed_tables(self, tables):
        """[n, 32] representations of whole tables (one batched pass)."""
        if not tables:
            return np.zeros((0, EMBED_DIM))
        return self.embed(np.stack([shard_features(t, 1.0, self.scales, self.batch_size)
                                    for t in tables]))

    @property
    def has_range(self):
        """Whether these weights store their training range (`meta["x_min"]`, `["x_max"]`)."""
        return self.meta.get("x_min") is not None and self.meta.get("x_max") is not None

    def range_distance(self, x, margin=0.1):
        """(worst [n] int, distance [n] float) of rows of features `x` ([n, 21]): per row, the
        feature lying farthest outside the training range (`meta["x_min"]`, `meta["x_max"]`)
        widened by `margin` of its width on each side, and how far beyond that widened range
        it lies in widths of the (unwidened) range; distance 0 (and worst 0) for a row inside.
        A feature that was constant in training (width 0) is infinitely far once it differs.
        None for weights without a stored range.

        Example: worst, dist = model.range_distance(np.stack([shard_features(t) for t in tables]))
        """
        if not self.has_range:
            return None
        lo, hi = np.asarray(self.meta["x_min"], float), np.asarray(self.meta["x_max"], float)
        width = hi - lo
        pad = margin * width
        x = np.atleast_2d(np.asarray(x, dtype=float))
        excess = np.maximum(lo - pad - x, x - hi - pad)          # > 0: beyond the widened range
        beyond = excess > 1e-12
        in_widths = np.where(width > 0, excess / np.where(width > 0, width, 1.0), np.inf)
        dist = np.where(beyond, in_widths, 0.0)
        worst = np.argmax(dist, axis=1)
        return worst, dist[np.arange(len(x)), worst]

    def outside(self, x, margin=0.1):
        """[n] bool: rows of features `x` ([n, 21]) with a feature outside the training range
        (`meta["x_min"]`, `meta["x_max"]`) widened by `margin` of its width on each side;
        None for weights without a stored range (see `range_distance`).

        Example: model.outside(np.stack([shard_features(t) for t in tables]))
        """
        found = self.range_distance(x, margin)
        return None if found is None else found[1] > 0

    def batch_factor(self, batch_size):
        return float(batch_size) / self.batch_size

    @property
    def profile(self):
        """The hardware profile the weights were trained for (meta "profile"; old files: cpu)."""
        return self.meta.get("profile", "cpu")

    @property
    def comm(self):
        """The all-to-all model (`comm.AllToAll`, parameters from meta "comm") a GPU model's
        device costs add to its predicted compute; None for a CPU model."""
        if self.profile not in GPU_PROFILES:
            return None
        return comm_lib.AllToAll(**(self.meta.get("comm") or {}))

    # I/O
    def save(self, path):
        meta = dict(self.meta, format=MODEL_FORMAT)
        np.savez_compressed(path, meta=np.array(json.dumps(meta)),
                            **{k: v.astype(np.float32) for k, v in self.params.items()})
        return path

    @classmethod
    def load(cls, path=None):
        path = path or DEFAULT_WEIGHTS
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"no cost model weights at {path}; train them with `tfra-de train-planner "
                f"--data FILE.jsonl --out DIR` or pass weights=")
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
            if meta.get("format") != MODEL_FORMAT:
                raise ValueError(f"{path} is not a cost model file (format {meta.get('format')!r})")
            params = {k: data[k] for k in data.files if k != "meta"}
        return cls(params, meta)


_LOADED = {}


def load_cached(path, load):
    """`load(path)`, cached per path until the file changes (weights are read once per run)."""
    path = os.path.abspath(path)
    stamp = os.path.getmtime(path) if os.path.exists(path) else None
    if path not in _LOADED or _LOADED[path][0] != stamp:
        _LOADED[path] = (stamp, load(path))
    return _LOADED[path][1]


def load_cost_model(weights=None):
    """A CostModel from `weights` (path, CostModel, or None: the shipped CPU model), cached."""
    if isinstance(weights, CostModel):
        return weights
    return load_cached(weights or DEFAULT_WEIGHTS, CostModel.load)


class LearnedEstimator(estimators.CostEstimator):
    """Estimator "learned": a device's cost (seconds) predicted by the neural cost model, plus
    the modelled all-to-all (`comm_ms`) for a GPU model.

    `weights`: None (the shipped weights of each task's profile), a directory (its weights of
    each task's profile, see `weights_file`), or one model (path or CostModel) for every task.

    Example: LearnedEstimator().device_cost(shards, "/GPU:0", gpu_task)   # cost_model_gpu.npz
    """

    name = "learned"
    additive = False
    measured = False

    def __init__(self, weights=None):
        per_profile = weights is None or (isinstance(weights, (str, os.PathLike))
                                            and os.path.isdir(weights))
        self._directory = weights if per_profile else None
        self._per_profile = per_profile
        # a directory is loaded per profile on first use (one of GPU weights alone is fine)
        self._one = None if per_profile else load_cost_model(weights)

    @property
    def model(self):
        """The CPU profile's CostModel (or the one model given)."""
        return self._one if self._one is not None else self.model_for(None)

    def model_for(self, task):
        """The CostModel that costs `task`'s devices (task None: the CPU profile's)."""
        if self._one is not None:
            return self._one
        return load_cost_model(weights_file("cost_model", profile_of(task), self._directory))

    def device_cost(self, shards, device, task):
        if not shards:
            return 0.0
        model = self.model_for(task)
        summed = sum(model.shard_embedding(s.table, s.index, s.num_slices) for s in shards)
        ms = float(model.total(summed))
        batch = task.batch_size if task is not None else model.batch_size
        return (ms * model.batch_factor(batch) + comm_ms(model, shards, task)) / 1e3



# -- training (TensorFlow imported here only) -----------------------------------------------------
def build_keras_model(width, seed=0):
    """The Keras model: inputs x [B, T, 21] (standardised), mask [B, T, 1]; outputs [B, 2]."""
    import keras  # pylint: disable=import-outside-toplevel
    keras.utils.set_random_seed(seed)
    x_in = keras.Input((width, features.NUM_FEATURES), name="x")
    m_in = keras.Input((width, 1), name="mask")
    h = keras.layers.Dense(HIDDEN, activation="relu", name="table_1")(x_in)
    h = keras.layers.Dense(EMBED_DIM, activation="relu", name="table_2")(h)
    summed = keras.ops.sum(h * m_in, axis=1)
    outs = []
    for stage in STAGES:
        g = keras.layers.Dense(HEAD_HIDDEN, activation="relu", name=f"{stage}_1")(summed)
        outs.append(keras.layers.Dense(1, activation="softplus", name=f"{stage}_2")(g))
    return keras.Model([x_in, m_in], keras.layers.Concatenate(name="stages")(outs))


def export_params(model, x_mean, x_std, y_scale):
    """numpy params of a trained Keras model (see CostModel)."""
    params = {"x_mean": x_mean, "x_std": x_std, "y_scale": np.array(y_scale)}
    for ours, layer in (("1", "table_1"), ("2", "table_2")):
        w, b = model.get_layer(layer).get_weights()
        params[f"w{ours}"], params[f"b{ours}"] = w, b
    for stage in STAGES:
        for k in ("1", "2"):
            w, b = model.get_layer(f"{stage}_{k}").get_weights()
            params[f"{stage}_w{k}"], params[f"{stage}_b{k}"] = w, b
    return params


def metrics(model, records):
    """MAE / MSE (ms, total = forward + backward) and relative MAE of a CostModel on records."""
    if not records:
        return {"n": 0}
    pred = model.predict_records(records).sum(axis=1)
    true = np.array([r["forward_ms"] + r["backward_ms"] for r in records])
    err = pred - true
    corr = float(np.corrcoef(pred, true)[0, 1]) if len(true) > 2 and true.std() > 0 else math.nan
    return {"n": len(records), "mae_ms": float(np.abs(err).mean()),
            "mse_ms2": float((err ** 2).mean()),
            "mape": float(np.mean(np.abs(err) / np.maximum(np.abs(true), 1e-9))),
            "corr": corr}


def measurement_group(record):
    """The key shared by records whose devices were measured together in one interleaved run
    (so their costs share that minute's machine speed), or None for a lone measurement:
    the record's "group" field, else, for `collect --whole-plans` records, their plan."""
    if record.get("group") is not None:
        return str(record["group"])
    if "plan_devices" in record:
        return "plan:{}:{}:{}:{}".format(*(record.get(k) for k in (
            "pool_seed", "half", "index", "source")))
    return None


def remove_drift(records, model, prior=2.0):
    """Copies of `records` with each measurement group's common speed factor divided out.

    This VM's speed moves by up to a third between days and ~10% within minutes, and it
    moves all devices measured together alike; placement needs the costs of devices relative
    to each other. For a group of n records whose log residuals under `model` are
    r_i = log(measured_i / predicted_i), costs are divided by exp(n / (n + prior) * mean(r))
    (shrunk towards 1 for small groups). Records outside any group are returned unchanged.

    Example: fit(remove_drift(records, first_model), drift=False)   # what fit() does itself
    """
    members = {}
    for i, rec in enumerate(records):
        key = measurement_group(rec)
        if key is not None:
            members.setdefault(key, []).append(i)
    out = list(records)
    if not members:
        return out
    grouped = [i for idx in members.values() for i in idx]
    pred = model.predict_records([records[i] for i in grouped]).sum(axis=1)
    measured = np.array([records[i]["forward_ms"] + records[i]["backward_ms"] for i in grouped])
    residual = dict(zip(grouped, np.log(np.maximum(measured, 1e-9) / np.maximum(pred, 1e-9))))
    for idx in members.values():
        factor = math.exp(-np.mean([residual[i] for i in idx]) * len(idx) / (len(idx) + prior))
        for i in idx:
            rec = dict(records[i])
            for key in ("forward_ms", "backward_ms", "total_ms"):
                if key in rec:
                    rec[key] = rec[key] * factor
            out[i] = rec
    return out


def fit(train_records, val_records=(), epochs=200, batch_size=64, lr=2e-3, seed=0,
        verbose=0, history=None, scales=features.FeatureScales(), init=None, weight_decay=1e-3,
        early_stop=0.15, patience=100, std_floor=0.25, drift=True):
    """Trains a cost model on records (MSE on forward/backward ms scaled by their mean);
    returns a CostModel whose meta holds train/unseen metrics (on the records as given).

    `drift`: records measured together (`measurement_group`) first have their group's common
    speed factor divided out (`remove_drift`), judged by `init` or else by a first fit on the
    raw records (which doubles the training time). On the placement evaluation's measured
    devices this lowered the model's error between devices of one task by ~10% (session 9).

    `history` (a list) receives per-epoch {"epoch", "loss", "val_loss"} (val_loss: on
    `val_records`, the unseen tables). `init` (a CostModel) warm-starts a refit from its weights.
    `std_floor`: least scale of a standardised feature.
    `early_stop`: this share of the training records (seen tables, never `val_records`) is held
    back to stop training when its loss has not improved for `patience` epochs, keeping the best
    weights (0, or fewer than 200 records: train all epochs on all records).
    """
    import keras  # pylint: disable=import-outside-toplevel
    if not train_records:
        raise ValueError("no training records")
    given = train_records
    if drift and any(measurement_group(r) is not None for r in train_records):
        judge = init if init is not None else fit(
            train_records, (), epochs, batch_size, lr, seed, scales=scales,
            weight_decay=weight_decay, early_stop=early_stop, patience=patience,
            std_floor=std_floor, drift=False)
        train_records = remove_drift(train_records, judge)
    x, mask, y = pad_records(train_records, scales)
    flat = x[mask[..., 0] > 0]
    x_mean = flat.mean(axis=0)
    # Features are O(1) (shares, scaled sizes): a floor on their scale keeps a reuse bin that is
    # (almost) never hit in training from blowing an unseen table's input up 40-fold (measured:
    # unseen-table MAE 14.4 ms -> 5.5 ms with floor 0.2 instead of 1e-3).
    x_std = np.maximum(flat.std(axis=0), std_floor)
    y_scale = max(float(y.mean()), 1e-6)
    model = build_keras_model(None, seed)
    if init is not None:
        _load_into(model, init)
        x_mean, x_std = init.params["x_mean"], init.params["x_std"]
        y_scale = float(init.params["y_scale"])
    prep = lambda xx, mm: (((xx - x_mean) / x_std) * mm).astype(np.float32)  # noqa: E731
    val = None
    if val_records:
        vx, vm, vy = pad_records(list(val_records), scales)
        val = ([prep(vx, vm), vm], vy / y_scale)
    model.compile(optimizer=keras.optimizers.AdamW(lr, weight_decay=weight_decay), loss="mse")
    xs, ys = [prep(x, mask), mask], y / y_scale
    inner = None
    n_stop = int(round(early_stop * len(y))) if early_stop and len(y) >= 200 else 0
    if n_stop:
        order = np.random.default_rng(seed).permutation(len(y))
        hold, keep = order[:n_stop], order[n_stop:]
        inner = ([xs[0][hold], xs[1][hold]], ys[hold])
        xs, ys = [xs[0][keep], xs[1][keep]], ys[keep]
    callbacks = []
    if history is not None or inner is not None:
        def on_epoch_end(epoch, logs):
            row = {"epoch": epoch + 1, "loss": float(logs["loss"]), "val_loss": None}
            if val is not None:
                row["val_loss"] = float(model.evaluate(val[0], val[1], verbose=0))
            if inner is not None:
                logs["stop_loss"] = row["stop_loss"] = float(
                    model.evaluate(inner[0], inner[1], verbose=0))
            if history is not None:
                history.append(row)
        callbacks.append(keras.callbacks.LambdaCallback(on_epoch_end=on_epoch_end))
    if inner is not None:
        callbacks.append(keras.callbacks.EarlyStopping("stop_loss", patience=patience, mode="min",
                                                       restore_best_weights=True))
    model.fit(xs, ys, epochs=epochs, batch_size=batch_size, verbose=verbose, shuffle=True,
              callbacks=callbacks)
    batch = train_records[0].get("batch_size", 4096)
    meta = {"batch_size": int(batch), "backend": train_records[0].get("backend", "?"),
            "scales": scales.to_dict(), "records": len(train_records)}
    meta.update(feature_range(flat))
    result = CostModel(export_params(model, x_mean, x_std, y_scale), meta)
    result.meta["train_metrics"] = metrics(result, given)
    result.meta["unseen_metrics"] = metrics(result, list(val_records))
    return result


def feature_range(flat):
    """{"x_min", "x_max"}: each feature's range over training tables ([n, 21] rows), stored
    with a model so a planner can tell tables inside what it saw (`CostModel.outside`)."""
    flat = np.asarray(flat, dtype=float)
    return {"x_min": [float(f"{v:.6g}") for v in flat.min(axis=0)],
            "x_max": [float(f"{v:.6g}") for v in flat.max(axis=0)]}


def _load_into(keras_model, model):
    p = model.params
    for ours, layer in (("1", "table_1"), ("2", "table_2")):
        keras_model.get_layer(layer).set_weights([p[f"w{ours}"], p[f"b{ours}"]])
    for stage in STAGES:
        for k in ("1", "2"):
            keras_model.get_layer(f"{stage}_{k}").set_weights([p[f"{stage}_w{k}"],
                                                               p[f"{stage}_b{k}"]])
