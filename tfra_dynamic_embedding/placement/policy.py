"""RL placement policy: places tables one by one, scoring every legal device with a shared MLP.

An episode places the pieces of a task (whole tables, or row slices of tables larger than any
device) largest predicted cost first. At each step the state of device d is
  - the piece's 32-d representation e (the cost model's per-table embedding),
  - the device's representation S_d (sum of its placed pieces' embeddings),
  - its predicted cost now and after adding the piece (the cost model's heads on S_d, S_d + e),
    the plan's current max cost, the marginal growth of the max, the memory left after placing,
    its number of pieces and the episode's progress,
all costs divided by the task's scale L = (sum of the pieces' standalone costs) / devices and
embeddings by their mean, so one policy serves any number of tables and devices. The score is
  logit_d = alpha * prior_d + MLP(state_d),   prior_d = -(cost after adding) / L,
softmax over the legal (memory-feasible, slice-distinct) devices. The prior makes the untrained
policy the longest-processing-time greedy of the cost model; training (REINFORCE with a greedy
self-critical baseline, `train.train_policy`) learns the residual MLP and alpha.

Inference is numpy only: greedy decode, optionally best-of-k samples scored by the cost model,
then a local search (moves and swaps off the most expensive device while the predicted max
cost drops; `improve`).
Registered as the strategy "learned" (shipped CPU weights, no training step):
    plan = propose(task, "learned")
"""

import json
import math
import os

import numpy as np

from tfra_dynamic_embedding.placement import cost_model as cm
from tfra_dynamic_embedding.placement import heuristics
from tfra_dynamic_embedding.placement.types import PlacementError

DEFAULT_WEIGHTS = os.path.join(cm.DATA_DIR, "policy_cpu.npz")
POLICY_FORMAT = "tfra-de-policy/1"
NUM_SCALARS = 8
NUM_INPUTS = NUM_SCALARS + 2 * cm.EMBED_DIM
BEST_OF = 16
FAILED_REWARD = -3.0   # reward (in units of L) of an episode that ran out of memory


class Policy:
    """Shared device-scoring MLP: inputs [.., NUM_INPUTS] -> tanh(64) -> 1, plus alpha * prior."""

    def __init__(self, params=None, hidden=64, seed=0, alpha=8.0, meta=None):
        if params is None:
            rng = np.random.default_rng(seed)
            params = {"w1": rng.normal(0, 1 / math.sqrt(NUM_INPUTS), (NUM_INPUTS, hidden)),
                      "b1": np.zeros(hidden), "w2": np.zeros(hidden),
                      "alpha": np.array(float(alpha))}
        self.params = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
        self.meta = dict(meta or {})

    def logits(self, x, prior):
        h = np.tanh(x @ self.params["w1"] + self.params["b1"])
        return self.params["alpha"] * prior + h @ self.params["w2"], h

    def save(self, path):
        np.savez_compressed(path, meta=np.array(json.dumps(dict(self.meta, format=POLICY_FORMAT))),
                            **{k: v.astype(np.float32) for k, v in self.params.items()})
        return path

    @classmethod
    def load(cls, path=None):
        path = path or DEFAULT_WEIGHTS
        if not os.path.exists(path):
            raise FileNotFoundError(f"no policy weights at {path}; train them with `tfra-de "
                                    f"train-planner --data FILE.jsonl --out DIR`")
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
            if meta.get("format") != POLICY_FORMAT:
                raise ValueError(f"{path} is not a policy file (format {meta.get('format')!r})")
            return cls({k: data[k] for k in data.files if k != "meta"}, meta=meta)

    def gradients(self, trace, advantages, entropy=0.0):
        """Gradients of -(sum_n A_n sum_t log pi(a_t)) (minus an entropy bonus) w.r.t. params,
        from a `rollout(..., keep=True)` trace of n episodes and their advantages [n]."""
        p = self.params
        grads = {k: np.zeros_like(v) for k, v in p.items()}
        adv = np.asarray(advantages, dtype=float)
        for step in trace:
            x, prior, legal, probs, chosen, h = (step[k] for k in (
                "x", "prior", "legal", "probs", "chosen", "h"))
            ok = chosen >= 0
            if not ok.any():
                continue
            onehot = np.zeros_like(probs)
            onehot[np.flatnonzero(ok), chosen[ok]] = 1.0
            g = -(adv[:, None] * (onehot - probs)) * ok[:, None]        # d loss / d logits
            if entropy:
                logp = np.log(np.where(legal, probs, 1.0))
                ent = -(probs * logp).sum(axis=1, keepdims=True)
                g += entropy * probs * (logp + ent) * ok[:, None]        # d(-H)/d logits
            g = np.where(legal, g, 0.0)
            grads["alpha"] += float((g * prior).sum())
            grads["w2"] += np.einsum("nd,ndh->h", g, h)
            dpre = g[..., None] * p["w2"] * (1.0 - h ** 2)
            grads["b1"] += dpre.sum(axis=(0, 1))
            grads["w1"] += np.einsum("ndi,ndh->ih", x, dpre)
        return grads


class Problem:
    """A task prepared for the policy: its pieces, their embeddings, costs and the scale L."""

    def __init__(self, task, model, order="cost"):
        self.task = task
        self.model = model
        self.items = heuristics.split_items(task)   # PlacementError for unsplittable tables
        self.emb = np.stack([model.shard_embedding(it.table, it.index, it.num_slices)
                             for it in self.items]) if self.items else np.zeros((0, cm.EMBED_DIM))
        self.solo = model.total(self.emb) if self.items else np.zeros(0)
        self.bytes = np.array([it.bytes for it in self.items], dtype=float)
        self.cap = np.array([math.inf if d.memory_bytes is None else d.memory_bytes
                             for d in task.devices], dtype=float)
        self.num_devices = task.num_devices
        self.scale = max(float(self.solo.sum()) / self.num_devices, 1e-12)
        self.e_scale = max(float(self.emb.mean()), 1e-9) if self.items else 1.0
        names = [it.table.name for it in self.items]
        self.table_id = np.unique(names, return_inverse=True)[1] if names else np.zeros(0, int)
        self.set_order(order)

    def set_order(self, order):
        if order == "cost":
            keys = [(-c, -b, it.table.name, it.index)
                    for c, b, it in zip(self.solo, self.bytes, self.items)]
        else:   # "bytes": memory-tight tasks
            keys = [(-b, -c, it.table.name, it.index)
                    for c, b, it in zip(self.solo, self.bytes, self.items)]
        self.order = sorted(range(len(self.items)), key=lambda i: keys[i])


def rollout(problem, policy, n=1, greedy=True, rng=None, keep=False, force=None):
    """Runs n episodes at once (`force` [n, items]: follow these devices instead). Returns (choices [n, items] device index or -1, max cost [n] in
    ms (inf for failed episodes), trace (list of per-step dicts when keep, else None))."""
    model, D = problem.model, problem.num_devices
    num_items = len(problem.items)
    S = np.zeros((n, D, cm.EMBED_DIM))
    cost = np.zeros((n, D))
    used = np.zeros((n, D))
    count = np.zeros((n, D))
    top = np.zeros(n)
    failed = np.zeros(n, dtype=bool)
    choices = np.full((n, num_items), -1, dtype=np.int64)
    on_table = {}
    trace = [] if keep else None
    L, per_dev = problem.scale, max(num_items / D, 1.0)
    cap_ok = np.isfinite(problem.cap)
    cap = np.where(cap_ok, problem.cap, 1.0)
    rows = np.arange(n)
    for step, i in enumerate(problem.order):
        e = problem.emb[i]
        after_sum = S + e
        after = model.total(after_sum)
        legal = used + problem.bytes[i] <= problem.cap
        taken = on_table.get(problem.table_id[i])
        if taken is not None:
            legal &= ~taken
        grow = np.maximum(after, top[:, None]) - top[:, None]
        mem_left = np.where(cap_ok, (cap - used - problem.bytes[i]) / cap, 1.0)
        x = np.concatenate([
            np.stack([after / L, cost / L, (after - cost) / L, grow / L,
                      np.broadcast_to(top[:, None] / L, (n, D)), mem_left, count / per_dev,
                      np.full((n, D), step / max(num_items, 1))], axis=-1),
            np.broadcast_to(e / problem.e_scale, (n, D, cm.EMBED_DIM)),
            S / (problem.e_scale * per_dev)], axis=-1)
        prior = -after / L
        logits, h = policy.logits(x, prior)
        logits = np.where(legal, logits, -np.inf)
        has = legal.any(axis=1)
        safe = np.where(has[:, None], logits, 0.0)
        if greedy and force is None:
            pick = np.argmax(safe, axis=1)
            probs = None
        else:
            z = safe - safe.max(axis=1, keepdims=True)
            probs = np.where(legal, np.exp(z), 0.0)
            probs /= np.maximum(probs.sum(axis=1, keepdims=True), 1e-300)
            u = (rng or np.random.default_rng()).random((n, 1))
            pick = np.minimum((probs.cumsum(axis=1) < u).sum(axis=1), D - 1)
            if force is not None:
                pick = np.asarray(force)[:, i]
        pick = np.where(has, pick, -1)
        failed |= ~has
        choices[:, i] = pick
        if keep:
            trace.append({"x": x, "prior": prior, "legal": legal, "probs": probs if probs is not None
                          else np.eye(D)[np.maximum(pick, 0)], "chosen": pick, "h": h})
        ok = rows[has]
        d = pick[has]
        S[ok, d] = after_sum[ok, d]
        cost[ok, d] = after[ok, d]
        used[ok, d] += problem.bytes[i]
        count[ok, d] += 1
        top = cost.max(axis=1)
        if (problem.items[i].num_slices > 1):
            mask = on_table.setdefault(problem.table_id[i], np.zeros((n, D), dtype=bool))
            mask[ok, d] = True
    final = np.where(failed, np.inf, top)
    return choices, final, trace


def improve(problem, choices, max_rounds=200, time_budget=0.025):
    """Local search after decoding: moves a piece off the most expensive device, or swaps it
    with a piece of another device, while that lowers the plan's max predicted cost (steepest
    descent; memory and slice-distinctness respected). Returns (choices, max cost ms)."""
    import time  # pylint: disable=import-outside-toplevel
    model, D = problem.model, problem.num_devices
    dev = np.asarray(choices, dtype=np.int64).copy()
    if len(dev) == 0 or (dev < 0).any():
        return dev, math.inf
    emb, size, tid = problem.emb, problem.bytes, problem.table_id
    S = np.zeros((D, cm.EMBED_DIM))
    np.add.at(S, dev, emb)
    used = np.bincount(dev, weights=size, minlength=D)
    cost = model.total(S)
    deadline = time.perf_counter() + time_budget
    for _ in range(max_rounds):
        if time.perf_counter() > deadline:
            break
        hot = int(np.argmax(cost))
        top = cost[hot]
        mine = np.flatnonzero(dev == hot)
        other = np.flatnonzero(dev != hot)
        if len(mine) == 0 or D < 2:
            break
        # moves: piece p of `hot` to device d (a "swap" with no partner)
        p_mv = np.repeat(mine, D)
        d_mv = np.tile(np.arange(D), len(mine))
        q_mv = np.full(len(p_mv), -1)
        # swaps: piece p of `hot` with piece q elsewhere
        p_sw = np.repeat(mine, len(other))
        q_sw = np.tile(other, len(mine))
        p_all = np.concatenate([p_mv, p_sw])
        q_all = np.concatenate([q_mv, q_sw])
        d_all = np.concatenate([d_mv, dev[q_sw]])
        ok = d_all != hot
        e_q = np.where((q_all >= 0)[:, None], emb[np.maximum(q_all, 0)], 0.0)
        b_q = np.where(q_all >= 0, size[np.maximum(q_all, 0)], 0.0)
        ok &= used[hot] - size[p_all] + b_q <= problem.cap[hot]
        ok &= used[d_all] + size[p_all] - b_q <= problem.cap[d_all]
        # a table's slices stay on distinct devices
        on = np.zeros((tid.max() + 1, D), dtype=np.int64)
        np.add.at(on, (tid, dev), 1)
        has_q = q_all >= 0
        t_q = tid[np.maximum(q_all, 0)]
        ok &= ~(has_q & (t_q == tid[p_all]))         # swapping two slices of one table: no-op
        ok &= on[tid[p_all], d_all] == 0
        ok &= ~has_q | (on[t_q, hot] == 0)
        if not ok.any():
            break
        p_all, q_all, d_all, e_q = p_all[ok], q_all[ok], d_all[ok], e_q[ok]
        new_hot = model.total(S[hot] - emb[p_all] + e_q)
        new_d = model.total(S[d_all] + emb[p_all] - e_q)
        # the max over the devices not touched: the largest of the top three not in {hot, d}
        order = np.argsort(-cost)[:3]
        rest = np.full(len(d_all), 0.0)
        for k in order[::-1]:
            rest = np.where((k != hot) & (k != d_all), cost[k], rest)
        new_top = np.maximum(np.maximum(new_hot, new_d), rest)
        best = int(np.argmin(new_top))
        if new_top[best] >= top * (1 - 1e-6):
            break
        p, q, d = int(p_all[best]), int(q_all[best]), int(d_all[best])
        S[hot] += e_q[best] - emb[p]
        S[d] += emb[p] - e_q[best]
        used[hot] += (size[q] if q >= 0 else 0.0) - size[p]
        used[d] += size[p] - (size[q] if q >= 0 else 0.0)
        dev[p] = d
        if q >= 0:
            dev[q] = hot
        cost[hot], cost[d] = new_hot[best], new_d[best]
    return dev, float(cost.max())


def _to_plan(problem, choices, seed, meta):
    state = heuristics._State(problem.task)  # pylint: disable=protected-access
    for item, device in zip(problem.items, choices):
        if device < 0:
            state.unplaced.append(item)
        else:
            state.put(item, int(device))
    plan = state.plan("learned", seed)
    plan.estimator = "learned"
    plan.meta.update(meta)
    return plan


_WEIGHTS_DIR = [None]


def use_weights(directory):
    """Makes the "learned" strategy load cost_model_cpu.npz / policy_cpu.npz from `directory`
    (None: the shipped package data), e.g. the --out of `tfra-de train-planner`."""
    if directory is not None and not os.path.isdir(directory):
        raise ValueError(f"weights directory {directory!r} does not exist")
    _WEIGHTS_DIR[0] = directory


def load_policy(path=None):
    if isinstance(path, Policy):
        return path
    return cm.load_cached(path or DEFAULT_WEIGHTS, Policy.load)


def plan_task(task, policy=None, model=None, samples=0, seed=0, improve_steps=200):
    """A Plan of `task` by the policy: greedy decode, plus best-of-`samples` sampled episodes
    scored by the cost model, then up to `improve_steps` rounds of local search (`improve`).
    A dead end (memory) is retried in bytes-first order; if that fails too, the heuristics'
    PlacementError is raised."""
    directory = _WEIGHTS_DIR[0]
    if model is None:
        model = cm.load_cost_model(os.path.join(directory, "cost_model_cpu.npz")
                                   if directory else None)
    else:
        model = cm.load_cost_model(model)
    if policy is None:
        policy = load_policy(os.path.join(directory, "policy_cpu.npz") if directory else None)
    else:
        policy = load_policy(policy)
    problem = Problem(task, model)
    if not problem.items:
        return _to_plan(problem, np.zeros(0, dtype=np.int64), seed, {})
    best, best_cost, how = None, math.inf, "greedy"
    for order in ("cost", "bytes"):
        problem.set_order(order)
        choices, top, _ = rollout(problem, policy, 1, greedy=True)
        if np.isfinite(top[0]):
            best, best_cost = choices[0], top[0]
        if samples:
            sc, st, _ = rollout(problem, policy, samples, greedy=False,
                                rng=np.random.default_rng(seed))
            k = int(np.argmin(st))
            if st[k] < best_cost:
                best, best_cost, how = sc[k], st[k], f"best of {samples} samples"
        if best is not None:
            break
    if best is not None and improve_steps:
        improved, cost = improve(problem, best, max_rounds=improve_steps)
        if cost < best_cost:
            best, best_cost, how = improved, cost, how + " + local search"
    if best is None:   # report like the heuristics do: the pieces left without room
        problem.set_order("bytes")
        choices, _, _ = rollout(problem, policy, 1, greedy=True)
        best = choices[0]
    return _to_plan(problem, best, seed, {
        "predicted_max_ms": float(best_cost) * model.batch_factor(task.batch_size)
        if math.isfinite(best_cost) else None, "decode": how, "order": order})


@heuristics.register_strategy("learned", "RL policy over the learned cost model (shipped "
                              "CPU weights; numpy inference)")
def learned_plan(task, seed=0, estimator=None):
    """The shipped RL policy over the shipped neural cost model: greedy decode, plus the best
    of 16 sampled plans (by the cost model) for tasks of up to 200 tables."""
    del estimator
    return plan_task(task, seed=seed, samples=BEST_OF if len(task.tables) <= 200 else 0)


__all__ = ["Policy", "Problem", "PlacementError", "learned_plan", "load_policy", "plan_task",
           "rollout", "use_weights"]
