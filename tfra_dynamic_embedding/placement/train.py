"""Training the learned planner: the cost model on benchmark records, the policy on tasks.

    tfra-de train-planner --data tfra_dynamic_embedding/placement/data/cpu_shards.jsonl.gz --out DIR
    tfra-de train-planner --profile gpu --data .../data/gpu_shards.jsonl.gz --out DIR

1. Cost model (`fit`, TF/Keras): records split by unseen tables (`split_by_tables`),
   MSE on forward / backward ms; MAE / MSE reported on train and unseen tables. Records of
   filled (full-size) shards -- the only ones where a table's size shows -- are a small part
   of the data and can be repeated in training (`oversample_filled`).
2. Policy (`train_policy`, numpy): REINFORCE with a greedy self-critical baseline on the
   estimated MDP -- the cost model is the simulator, reward = -(max device cost) / L -- over
   tasks drawn from the first half of the benchmark's MetaSyn-like pool (down-scaled for CPU:
   256 tables, batch 1024, rows / 64; tasks of 80 tables on 8 devices of 256 MiB).
3. When a measuring estimator ("measured-cpu") is registered, a small loop measures the
   policy's own greedy plans, adds them as records, refits the cost model and fine-tunes the
   policy (`refine_with_measurements`).
Writes cost_model_cpu.npz, policy_cpu.npz, training.json and training.png to --out, and the
measured devices of step 3 as records (measured_plans.jsonl) that can join the data file.

`--profile gpu` (records of the "torch_cuda" backend) trains the GPU weights instead:
cost_model_gpu.npz, policy_gpu.npz, training_gpu.json, training_gpu.png (`--profile gpu_wide`:
the same for GPU tasks with tables wider than the pool's, *_gpu_wide.*). The policy trains on
the full-size pool (856 tables, batch 65536; 80 tables on 8 "/GPU:{i}" devices of 16 GiB),
the cost model (compute only) gets meta "profile": "gpu" and the all-to-all parameters
"comm" the planner adds per device (`cost_model.comm_ms`), and nothing is measured (step 3).
Each profile's settings are one entry of `PROFILES`.

`synthetic_records` makes records from a known nonlinear multi-table cost for tests and
development only; they are never shipped as measurements (their backend is "synthetic").
"""

import functools
import json
import math
import os
import sys
import time

import numpy as np

from tfra_dynamic_embedding.placement import comm as comm_lib
from tfra_dynamic_embedding.placement import cost_model as cm
from tfra_dynamic_embedding.placement import features, workloads
from tfra_dynamic_embedding.placement.benchmark import records as records_lib

# The pool the CPU benchmark records come from (placement/benchmark/collect.py defaults).
CPU_POOL = {"num_tables": 256, "seed": 0, "batch_size": 1024, "row_scale": 1 / 64}
CPU_MEMORY = "256MiB"
# Per hardware profile (cost_model.profile_of): the pool its benchmark records come from (the
# policy trains on tasks of its first half), the tasks' devices, and the measuring estimator
# of the refinement (None: none; one GPU cannot measure an 8-GPU plan's devices together).
PROFILES = {
    "cpu": {"pool": CPU_POOL, "memory": CPU_MEMORY, "device_template": "/job:ps/task:{i}",
            "measure": "measured-cpu"},
    "gpu": {"pool": {"num_tables": 856, "seed": 0, "batch_size": 65536, "row_scale": 1},
            "memory": "16GiB", "device_template": "/GPU:{i}", "measure": None},
}
# GPU tasks with a table wider than the pool's (cost_model.WIDE_DIM): the same pool and tasks;
# only the records differ (they include measured devices of wide tables).
PROFILES["gpu_wide"] = PROFILES["gpu"]


# -- synthetic records (tests / development only) --------------------------------------------
def synthetic_cost(tables, batch_size=1024):
    """A known nonlinear multi-table cost (forward_ms, backward_ms): bytes moved, slowed by the
    shard's total size (cache pressure) and by the number of tables (per-kernel overhead)."""
    fwd = bwd = 0.0
    size = 0.0
    for t in tables:
        row = t.dim * t.bytes_per_value
        lookups = batch_size * t.pooling_factor
        fwd += row * (lookups + batch_size) / 2e9 * 1e3
        bwd += row * (2 * lookups + batch_size) / 1.5e9 * 1e3
        size += t.size_bytes / 2 ** 20
    slow = 1.0 + 0.8 * math.tanh(size / 64.0)
    k = len(tables)
    return fwd * slow + 0.02 * k, bwd * slow * (1.0 + 0.05 * math.sqrt(k)) + 0.03 * k


def synthetic_records(tables, num_records, max_tables=12, batch_size=1024, seed=0, noise=0.02):
    """Records like the benchmark's, from `synthetic_cost` (for tests and development only)."""
    rng = np.random.default_rng(seed)
    tables = list(tables)
    out = []
    for _ in range(num_records):
        k = int(rng.integers(1, min(max_tables, len(tables)) + 1))
        chosen = [tables[i] for i in rng.choice(len(tables), k, replace=False)]
        fwd, bwd = synthetic_cost(chosen, batch_size)
        fwd *= 1 + noise * rng.standard_normal()
        bwd *= 1 + noise * rng.standard_normal()
        out.append({"backend": "synthetic", "batch_size": batch_size, "seed": seed, "threads": 1,
                    "tables": [{"name": t.name, "features": features.table_features(t).tolist(),
                                "spec": t.to_dict()} for t in chosen],
                    "forward_ms": fwd, "backward_ms": bwd, "total_ms": fwd + bwd})
    return out


# -- the cost model (`cost_model.CostModel`; TensorFlow is imported by `fit` only) -------------
def load_records(path):
    """Benchmark records from a JSONL file (blank and malformed trailing lines are skipped, as a
    file still being written may end mid-line)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no benchmark records at {path}")
    return [rec for rec in records_lib.read_records(path)
            if rec.get("tables") and "forward_ms" in rec and "backward_ms" in rec]


def table_names(record):
    return [entry.get("name") or (entry.get("spec") or {}).get("name") for entry in record["tables"]]


def pad_records(records, scales=features.FeatureScales()):
    """(x [n, T, 21], mask [n, T, 1], y [n, 2] forward/backward ms) of records, zero-padded."""
    feats = [cm.record_features(r, scales) for r in records]
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
    train and test on (`cpu_pool_tasks`); otherwise table names split in random halves
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


def build_keras_model(width, seed=0):
    """The Keras model: inputs x [B, T, 21] (standardised), mask [B, T, 1]; outputs [B, 2]."""
    import keras  # pylint: disable=import-outside-toplevel
    keras.utils.set_random_seed(seed)
    x_in = keras.Input((width, features.NUM_FEATURES), name="x")
    m_in = keras.Input((width, 1), name="mask")
    h = keras.layers.Dense(cm.HIDDEN, activation="relu", name="table_1")(x_in)
    h = keras.layers.Dense(cm.EMBED_DIM, activation="relu", name="table_2")(h)
    summed = keras.ops.sum(h * m_in, axis=1)
    outs = []
    for stage in cm.STAGES:
        g = keras.layers.Dense(cm.HEAD_HIDDEN, activation="relu", name=f"{stage}_1")(summed)
        outs.append(keras.layers.Dense(1, activation="softplus", name=f"{stage}_2")(g))
    return keras.Model([x_in, m_in], keras.layers.Concatenate(name="stages")(outs))


def export_params(model, x_mean, x_std, y_scale):
    """numpy params of a trained Keras model (see CostModel)."""
    params = {"x_mean": x_mean, "x_std": x_std, "y_scale": np.array(y_scale)}
    for ours, layer in (("1", "table_1"), ("2", "table_2")):
        w, b = model.get_layer(layer).get_weights()
        params[f"w{ours}"], params[f"b{ours}"] = w, b
    for stage in cm.STAGES:
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

    A machine's speed drifts between runs and moves all devices measured together alike
    (docs/learned_placement.md, "The cost model"); placement needs the costs of devices relative
    to each other. For a group of n records whose log residuals under `model` are
    r_i = log(measured_i / predicted_i), costs are divided by exp(n / (n + prior) * mean(r))
    (shrunk towards 1 for small groups). Records outside any group are returned unchanged.
    `fit` does this itself (drift=True) with its first fit's model.

    Example:
        >>> pool = workloads.generate_pool(8, seed=0, batch_size=1024, row_scale=1 / 64)
        >>> records = [dict(r, group="run 1") for r in synthetic_records(pool, 4, max_tables=3)]
        >>> out = remove_drift(records + [dict(records[0], group=None)], cm.load_cost_model())
        >>> ratios = [o["total_ms"] / r["total_ms"] for o, r in zip(out, records)]
        >>> bool(max(ratios) - min(ratios) < 1e-12), out[-1]["total_ms"] == records[0]["total_ms"]
        (True, True)
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
    raw records (which doubles the training time; what it gains: docs/learned_placement.md).

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
    # (almost) never hit in training from blowing an unseen table's input up many-fold
    # (docs/learned_placement.md, "Shipped weights and results").
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
    result = cm.CostModel(export_params(model, x_mean, x_std, y_scale), meta)
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
    for stage in cm.STAGES:
        for k in ("1", "2"):
            keras_model.get_layer(f"{stage}_{k}").set_weights([p[f"{stage}_w{k}"],
                                                               p[f"{stage}_b{k}"]])


# -- the policy ---------------------------------------------------------------------------------
class _Adam:
    def __init__(self, params, lr):
        self.lr, self.t = lr, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params, grads, b1=0.9, b2=0.999):
        self.t += 1
        for k, g in grads.items():
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            mh = self.m[k] / (1 - b1 ** self.t)
            vh = self.v[k] / (1 - b2 ** self.t)
            params[k] = params[k] - self.lr * mh / (np.sqrt(vh) + 1e-8)


def pool_tasks(num_tasks, profile="cpu", half="train", tables_per_task=80, num_devices=8,
               seed=0, memory="profile", pool=None):
    """Tasks from one half of a profile's MetaSyn-like pool (`PROFILES[profile]`), on devices
    named and sized as that profile's ("profile": its memory per device; None: unlimited).
    `pool`: the pool's tables when already generated (tests pass a smaller one).

    Example (`pool_tasks(24, "gpu")`: 80 full-size tables on /GPU:0../GPU:7 of 16 GiB each):
        >>> small = workloads.generate_pool(32, seed=0)
        >>> task = pool_tasks(2, "gpu", tables_per_task=8, pool=small)[0]
        >>> len(task.tables), task.devices[7]
        (8, DeviceSpec(name='/GPU:7', memory_bytes=17179869184))
    """
    setup = PROFILES[profile]
    pool = pool or workloads.generate_pool(**setup["pool"])
    train, test = workloads.split_pool(pool, seed=setup["pool"]["seed"])
    tables = train if half == "train" else test
    memory = setup["memory"] if memory == "profile" else memory
    return workloads.make_tasks(tables, num_tasks, tables_per_task, num_devices, memory, seed,
                                batch_size=setup["pool"]["batch_size"],
                                device_template=setup["device_template"])


def cpu_pool_tasks(num_tasks, half="train", tables_per_task=80, num_devices=8, seed=0,
                   memory=CPU_MEMORY, pool=None):
    """Tasks from one half of the down-scaled MetaSyn-like CPU pool (see CPU_POOL)."""
    return pool_tasks(num_tasks, "cpu", half, tables_per_task, num_devices, seed, memory, pool)


def train_policy(model, tasks, iterations=200, samples=16, lr=1e-3, seed=0, policy=None,
                 entropy=1e-3, history=None, log=None, eval_every=25):
    """REINFORCE (greedy self-critical baseline) on the estimated MDP of `tasks`.

    Each iteration takes one task, runs `samples` sampled episodes and one greedy episode
    with the cost model as the simulator; advantage = greedy max cost - sampled max cost (in
    units of L). Every `eval_every` iterations the mean greedy cost over all tasks is checked
    and the best parameters so far are kept (the untrained policy is the cost model's greedy,
    so training never returns anything worse on its tasks). Returns the trained Policy;
    `history` gets per-iteration dicts.
    """
    from tfra_dynamic_embedding.placement import policy as pol  # pylint: disable=import-outside-toplevel
    policy = policy or pol.Policy(seed=seed)
    problems = [pol.Problem(t, model) for t in tasks]
    opt = _Adam(policy.params, lr)
    rng = np.random.default_rng(seed)
    best_value = mean_greedy_cost(model, policy, tasks)
    best_params = {k: v.copy() for k, v in policy.params.items()}
    for it in range(iterations):
        prob = problems[it % len(problems)]
        _, greedy_top, _ = pol.rollout(prob, policy, 1, greedy=True)
        _, tops, trace = pol.rollout(prob, policy, samples, greedy=False, rng=rng, keep=True)
        reward = np.where(np.isfinite(tops), -tops / prob.scale, pol.FAILED_REWARD)
        base = -greedy_top[0] / prob.scale if np.isfinite(greedy_top[0]) else reward.mean()
        adv = reward - base
        adv = adv / (adv.std() + 1e-3)
        grads = policy.gradients(trace, adv, entropy)
        grads = {k: v / samples for k, v in grads.items()}
        opt.step(policy.params, grads)
        row = {"iteration": it + 1, "greedy_cost_over_L": float(greedy_top[0] / prob.scale),
               "sampled_mean_over_L": float(np.mean(np.minimum(-reward, -pol.FAILED_REWARD))),
               "alpha": float(policy.params["alpha"])}
        if (it + 1) % eval_every == 0 or it + 1 == iterations:
            value = mean_greedy_cost(model, policy, tasks)
            row["mean_greedy_over_L"] = value
            if value < best_value - 1e-9:
                best_value, best_params = value, {k: v.copy() for k, v in policy.params.items()}
        if history is not None:
            history.append(row)
        if log and (it + 1) % max(1, iterations // 10) == 0:
            log(f"policy iteration {it + 1}/{iterations}: greedy max/L "
                f"{row['greedy_cost_over_L']:.4f}, sampled {row['sampled_mean_over_L']:.4f}")
    policy.params = best_params
    policy.meta.update({"iterations": iterations, "samples": samples, "tasks": len(tasks),
                        "train_mean_greedy_over_L": best_value})
    return policy


def mean_greedy_cost(model, policy, tasks):
    """Mean (greedy max cost / L) of the policy over tasks, by the cost model."""
    from tfra_dynamic_embedding.placement import policy as pol  # pylint: disable=import-outside-toplevel
    values = []
    for task in tasks:
        prob = pol.Problem(task, model)
        _, top, _ = pol.rollout(prob, policy, 1, greedy=True)
        values.append(top[0] / prob.scale)
    return float(np.mean(values))


def refine_with_measurements(model, policy, tasks, records, estimator="measured-cpu",
                             rounds=1, plans_per_round=2, epochs=40, iterations=40, log=None):
    """Measures the policy's own greedy plans with a measuring estimator (one that reports its
    stages through `on_measure`, as "measured-cpu" does; it measures a plan's devices
    together), adds each device as a record, refits the cost model from its weights and
    fine-tunes the policy. Small by design."""
    from tfra_dynamic_embedding.placement import estimators, policy as pol  # pylint: disable=import-outside-toplevel
    measured = []   # (shards, stages) of the devices measured for the current plan
    est = estimators.get_estimator(
        estimator, on_measure=lambda shards, batch, result: measured.append((shards, result)))
    records = list(records)
    run = time.strftime("%Y%m%d-%H%M%S")   # measurement groups stay distinct across runs
    for r in range(rounds):
        added = 0
        for k in range(plans_per_round):   # cycling through the tasks
            task = tasks[(r * plans_per_round + k) % len(tasks)]
            measured.clear()
            est.plan_costs(pol.plan_task(task, policy, model))   # cached devices: no report
            for shards, result in measured:
                forward_ms, backward_ms = result["forward_ms"], result["backward_ms"]
                records.append({"backend": "measured-plan", "batch_size": task.batch_size,
                                "split": "train",   # the tasks are the first half's
                                "group": f"refine:{run}:{r}:{k}",   # measured together
                                "tables": [{"name": s.table.name, "spec": s.table.to_dict(),
                                            "fraction": s.fraction,
                                            "features": cm.shard_features(
                                                s.table, s.fraction).tolist()} for s in shards],
                                "forward_ms": forward_ms, "backward_ms": backward_ms,
                                "total_ms": forward_ms + backward_ms})
                added += 1
        model = fit(records, epochs=epochs, init=model, scales=model.scales)
        policy = train_policy(model, tasks, iterations, policy=policy)
        if log:
            log(f"measurement round {r + 1}/{rounds}: {added} measured devices added, "
                f"cost model refit, policy fine-tuned")
    return model, policy, records


# -- plots / CLI --------------------------------------------------------------------------------
def plot_curves(cost_history, policy_history, path):
    """PNG: cost-model loss (train / unseen) per epoch, policy greedy max/L per iteration."""
    from tfra_dynamic_embedding.placement import evaluate  # pylint: disable=import-outside-toplevel
    plt = evaluate.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    if cost_history:
        ep = [h["epoch"] for h in cost_history]
        ax1.plot(ep, [h["loss"] for h in cost_history], label="train tables")
        if cost_history[0].get("val_loss") is not None:
            ax1.plot(ep, [h["val_loss"] for h in cost_history], label="unseen tables")
        ax1.set_yscale("log")
        ax1.legend()
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("MSE (scaled ms)")
    ax1.set_title("cost model")
    if policy_history:
        it = [h["iteration"] for h in policy_history]
        g = np.array([h["greedy_cost_over_L"] for h in policy_history])
        w = max(1, len(g) // 20)
        smooth = np.convolve(g, np.ones(w) / w, mode="valid")
        ax2.plot(it, g, alpha=0.3, label="greedy (per task)")
        ax2.plot(it[w - 1:], smooth, label=f"moving mean ({w})")
        ax2.legend()
    ax2.set_xlabel("iteration")
    ax2.set_ylabel("max device cost / L (cost model)")
    ax2.set_title("policy (REINFORCE)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def oversample(records, times):
    """`records` with each filled record (field "filled") repeated `times` times in all.

    Example:
        >>> oversample([{"filled": True}, {}], 3)
        [{'filled': True}, {}, {'filled': True}, {'filled': True}]
    """
    if int(times) < 1:
        raise ValueError(f"times must be >= 1; got {times!r}")
    return list(records) + [r for r in records if r.get("filled")] * (int(times) - 1)


def train_planner(data, out, epochs=300, iterations=300, tasks=24, samples=16, seed=0,
                  measure=True, log=print, refine_rounds=2, plans_per_round=3,
                  oversample_filled=1, profile="cpu", pool=None):
    """The whole pipeline (see the module docstring); returns the summary dict.
    `oversample_filled`: times each filled (full-size) training record counts.
    `profile`: "cpu" or "gpu" (`PROFILES`), the weights trained and the policy's tasks;
    `pool`: that profile's pool when already generated (see `pool_tasks`).

    A run takes minutes to hours: `train_planner("gpu_shards.jsonl.gz", "weights/",
    profile="gpu")` is `tfra-de train-planner --profile gpu --data gpu_shards.jsonl.gz --out
    weights/`, whose use docs/learned_placement.md shows (its first commands; "GPU devices").
    """
    from tfra_dynamic_embedding.placement import estimators  # pylint: disable=import-outside-toplevel
    setup = PROFILES[profile]
    measure = measure and setup["measure"] is not None
    os.makedirs(out, exist_ok=True)
    if measure:
        try:   # "measured-cpu" must measure with the records' single TF thread, so that is
            # pinned before TF starts (the Keras fit below starts it)
            from tfra_dynamic_embedding.placement.benchmark import tf_cpu  # pylint: disable=import-outside-toplevel
            tf_cpu.set_threads(1)
        except ImportError:
            pass
    records = load_records(data)
    if len(records) < 10:
        raise ValueError(f"{data} holds {len(records)} usable records; need at least 10")
    train_recs, unseen = split_by_tables(records, seed)
    log(f"{len(records)} records: {len(train_recs)} train, {len(unseen)} with unseen tables, "
        f"{len(records) - len(train_recs) - len(unseen)} mixed (unused)")
    if len(train_recs) < 10:
        log("too few pure train records; training on all records, no unseen split")
        train_recs, unseen = records, []
    t0 = time.time()
    cost_history = []
    fit_recs = oversample(train_recs, oversample_filled)
    if oversample_filled > 1:
        log(f"{sum(1 for r in train_recs if r.get('filled'))} filled train records, each "
            f"counted {oversample_filled} times")
    model = fit(fit_recs, unseen, epochs=epochs, seed=seed, history=cost_history,
                   verbose=2 if log else 0)
    log(f"cost model trained in {time.time() - t0:.1f}s: train {model.meta['train_metrics']}, "
        f"unseen {model.meta['unseen_metrics']}")
    held_out = {"train_metrics": model.meta["train_metrics"],
                "unseen_metrics": model.meta["unseen_metrics"]}
    # The shipped model is this one, trained on the first half's tables only, so that the
    # placement evaluation on the second half (benchmarks/placement_eval.py) stays unseen.
    model.meta["held_out"] = held_out
    _set_profile(model, profile)   # before the policy trains: a GPU model's costs add the comm
    train_tasks = pool_tasks(tasks, profile, "train", seed=seed, pool=pool)
    policy_history = []
    t0 = time.time()
    pol = train_policy(model, train_tasks, iterations, samples, seed=seed,
                       history=policy_history, log=log)
    log(f"policy trained in {time.time() - t0:.1f}s")
    measured = None
    if measure and setup["measure"] in estimators.list_estimators():
        model, pol, refined = refine_with_measurements(model, pol, train_tasks, fit_recs,
                                                       setup["measure"], rounds=refine_rounds,
                                                       plans_per_round=plans_per_round, log=log)
        measured = setup["measure"]
        # the measured devices of the policy's plans, kept so they can join the data file
        with open(os.path.join(out, "measured_plans.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in refined[len(fit_recs):])
    model.meta["held_out"] = held_out    # (a refit's meta does not carry it)
    model.meta["data"] = os.path.basename(data)
    _set_profile(model, profile)
    model.save(os.path.join(out, f"cost_model_{profile}.npz"))
    pol.meta.update({"cost_model": f"cost_model_{profile}.npz", "pool": setup["pool"],
                     "memory": setup["memory"], "profile": profile, "refined_with": measured})
    pol.save(os.path.join(out, f"policy_{profile}.npz"))
    summary = {"records": len(records), "train_records": len(train_recs),
               "oversample_filled": int(oversample_filled),
               "unseen_records": len(unseen), "held_out": held_out,
               "final_train_metrics": model.meta["train_metrics"], "refined_with": measured,
               "policy_final_greedy_over_L": mean_greedy_cost(model, pol, train_tasks),
               "cost_history": cost_history, "policy_history": policy_history}
    # the cpu names as they always were; another profile's beside them in the same --out
    stem = "training" if profile == "cpu" else f"training_{profile}"
    with open(os.path.join(out, f"{stem}.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    plot_curves(cost_history, policy_history, os.path.join(out, f"{stem}.png"))
    log(f"wrote {out}/cost_model_{profile}.npz, policy_{profile}.npz, {stem}.json, {stem}.png")
    return summary


def _set_profile(model, profile):
    """Marks a trained model's profile; a GPU model also stores the all-to-all parameters its
    device costs add (`cost_model.comm_ms`), so they ship with the weights."""
    model.meta["profile"] = profile
    if profile in cm.GPU_PROFILES:
        model.meta["comm"] = comm_lib.AllToAll().params()


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "train-planner", help="train the learned cost model and RL placement policy",
        description="Train the neural cost model on benchmark records (JSONL) and the RL "
        "placement policy on tasks of the CPU pool's first half; writes cost_model_cpu.npz, "
        "policy_cpu.npz, training.json and training.png to --out (--profile gpu: GPU records, "
        "the full-size pool's tasks on 8 GPUs; writes cost_model_gpu.npz, policy_gpu.npz, "
        "training_gpu.json, training_gpu.png). Use them with "
        "`tfra-de plan --strategy learned --weights DIR`.")
    parser.add_argument("--data", required=True,
                        help="benchmark records (JSONL, or gzipped .jsonl.gz)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu",
                        help="hardware the weights are for (default cpu; gpu: records of the "
                        "torch_cuda backend, used for tasks whose devices are all GPUs; "
                        "gpu_wide: the same, for such tasks with tables wider than 128)")
    parser.add_argument("--epochs", type=int, default=300, help="cost-model epochs")
    parser.add_argument("--iterations", type=int, default=300, help="policy iterations")
    parser.add_argument("--tasks", type=int, default=24, help="training tasks (80 tables, 8 "
                        "devices)")
    parser.add_argument("--samples", type=int, default=16, help="episodes per iteration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--refine-rounds", type=int, default=2,
                        help="rounds of measuring the policy's plans and refitting")
    parser.add_argument("--plans-per-round", type=int, default=3,
                        help="training tasks whose plans are measured per round")
    parser.add_argument("--oversample-filled", type=int, default=1, metavar="K",
                        help="count each filled (full-size) training record K times")
    parser.add_argument("--no-measure", action="store_true",
                        help="skip the measured refinement even if 'measured-cpu' exists")
    parser.set_defaults(run=_run)
    return parser


def _run(args):
    if not os.path.exists(args.data):
        print(f"tfra-de train-planner: no data file {args.data}", file=sys.stderr)
        return 2
    train_planner(args.data, args.out, args.epochs, args.iterations, args.tasks, args.samples,
                  args.seed, measure=not args.no_measure, refine_rounds=args.refine_rounds,
                  plans_per_round=args.plans_per_round,
                  oversample_filled=args.oversample_filled, profile=args.profile)
    return 0
