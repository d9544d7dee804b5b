"""Neural multi-table cost model: what the embedding kernels of a device cost, learned from data.

This module is inference only (numpy); training (TF/Keras) is `train.fit`.

Architecture (trained with TF/Keras, run in numpy for planning):
  per table:   21 features --standardise--> Dense(128, relu) --> Dense(32, relu)   (shared MLP)
  per device:  sum of its tables' 32-d representations
  per stage:   Dense(64, relu) --> Dense(1, softplus), one head for forward, one for backward
  device cost = forward + backward (ms of one training step at the trained batch size);
  plan cost   = max over devices (devices work in parallel).

The sum of learned representations lets the heads model multi-table interactions (cache
sharing, contention, kernel overheads) that an additive model cannot. Training data are
benchmark records (JSONL, one per device shard, see `train.load_records`); the model is exported to
plain numpy arrays (`CostModel`), so planning needs neither TensorFlow nor a GPU.

The estimator "learned" (predicted costs, not measured; estimators.py names it):
    >>> from tfra_dynamic_embedding.placement import evaluate_plan
    >>> from tfra_dynamic_embedding.placement.types import Plan, TableSpec, Task, make_devices
    >>> task = Task([TableSpec("a", 1000, 64), TableSpec("b", 1000, 64)], make_devices(2))
    >>> plan = Plan(task, {"a": ["/job:ps/task:0"], "b": ["/job:ps/task:1"]})
    >>> report = evaluate_plan(plan, "learned")     # the shipped weights of the task's profile
    >>> est = estimators.get_estimator("learned", weights=DEFAULT_WEIGHTS)   # or retrained ones
    >>> est.model.profile
    'cpu'

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

import json
import os

import numpy as np

from tfra_dynamic_embedding.placement import comm as comm_lib
from tfra_dynamic_embedding.placement import estimators, features, streams
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

    Example:
        >>> from tfra_dynamic_embedding.placement.types import Task, make_devices
        >>> tables, wide = [TableSpec("a", 10, dim=64)], [TableSpec("w", 10, dim=256)]
        >>> gpus = make_devices(8, "16GiB", "/GPU:{i}")
        >>> profile_of(Task(tables, gpus)), profile_of(Task(wide, gpus)), profile_of(
        ...     Task(tables, make_devices(8)))
        ('gpu', 'gpu_wide', 'cpu')
    """
    devices = getattr(task, "devices", None) or ()
    if not devices or not all("gpu" in d.name.lower() for d in devices):
        return "cpu"
    return "gpu_wide" if any(t.dim > WIDE_DIM for t in task.tables) else "gpu"


def check_weights_dir(directory):
    """`directory` (a directory of trained weights, or None for the shipped ones); ValueError
    when it does not exist, as a mistyped --weights would otherwise plan with other weights.

    Example:
        >>> check_weights_dir(None), check_weights_dir(DATA_DIR) == DATA_DIR
        (None, True)
        >>> check_weights_dir("no_such_weights/")
        Traceback (most recent call last):
        ValueError: weights directory 'no_such_weights/' does not exist
    """
    if directory is not None and not os.path.isdir(directory):
        raise ValueError(f"weights directory {directory!r} does not exist")
    return directory


def weights_file(kind, profile="cpu", directory=None):
    """Path of `directory`/{kind}_{profile}.npz (kind "cost_model" or "policy"; directory None:
    the shipped data; ValueError when it does not exist), or of the file the profile falls back
    to (`FALLBACK`) when it has none there.

    Example:
        >>> import tempfile
        >>> mine = tempfile.TemporaryDirectory()          # a directory with gpu weights only
        >>> open(os.path.join(mine.name, "policy_gpu.npz"), "w").close()
        >>> os.path.basename(weights_file("policy", "gpu_wide", mine.name))
        'policy_gpu.npz'
        >>> os.path.basename(weights_file("policy", "gpu_wide"))   # the shipped ones
        'policy_gpu_wide.npz'
        >>> mine.cleanup()
    """
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}; got {profile!r}")
    directory = check_weights_dir(directory) or DATA_DIR
    path = os.path.join(directory, f"{kind}_{profile}.npz")
    while profile in FALLBACK and not os.path.exists(path):
        profile = FALLBACK[profile]
        path = os.path.join(directory, f"{kind}_{profile}.npz")
    return path


def comm_ms(model, shards, task):
    """ms of one device's all-to-all per training step (forward + backward) under a GPU
    model's comm meta (`CostModel.comm`); 0 for a CPU model, no shards or one device.

    Example:
        >>> from tfra_dynamic_embedding.placement.types import Plan, Task, make_devices
        >>> task = Task([TableSpec("a", 1000, 64), TableSpec("b", 1000, 64)],
        ...             make_devices(2, "16GiB", "/GPU:{i}"), batch_size=1024)
        >>> plan = Plan(task, {"a": ["/GPU:0"], "b": ["/GPU:1"]})
        >>> gpu_model = load_cost_model(weights_file("cost_model", "gpu"))
        >>> comm_ms(gpu_model, plan.shards_on("/GPU:0"), task) > 0
        True
        >>> comm_ms(load_cost_model(), plan.shards_on("/GPU:0"), task)      # a CPU model
        0.0
    """
    comm = model.comm
    if comm is None or not shards or task is None:
        return 0.0
    return comm.step_ms(comm_lib.pooled_bytes(shards, task.batch_size), task.num_devices)


# -- features of shards and records -------------------------------------------------------------
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

        Example:
            >>> model = load_cost_model()
            >>> worst, dist = model.range_distance(shard_features(TableSpec("w", 10, 4096))[None])
            >>> features.FEATURE_NAMES[worst[0]], bool(dist[0] > 10)     # dim: far beyond
            ('dim', True)
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

        Example:
            >>> load_cost_model().outside(shard_features(TableSpec("w", 10, 4096))[None])
            array([ True])
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

    Example:
        >>> from tfra_dynamic_embedding.placement.types import Plan, Task, make_devices
        >>> gpu_task = Task([TableSpec("a", 1000, 64)], make_devices(2, "16GiB", "/GPU:{i}"))
        >>> shards = Plan(gpu_task, {"a": ["/GPU:0"]}).shards_on("/GPU:0")
        >>> LearnedEstimator().device_cost(shards, "/GPU:0", gpu_task) > 0   # seconds
        True
        >>> LearnedEstimator().model_for(gpu_task).profile      # from cost_model_gpu.npz
        'gpu'
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
