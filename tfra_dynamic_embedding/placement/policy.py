"""RL placement policy: places tables one by one, scoring every legal device with a shared MLP.

An episode places the pieces of a task (whole tables, row slices of tables larger than any
device or costlier than a share of the load, or column blocks of hot wide tables; see
`plan_task`) largest predicted cost first. At each step the state of device d is
  - the piece's 32-d representation e (the cost model's per-table embedding),
  - the device's representation S_d (sum of its placed pieces' embeddings),
  - its predicted cost now and after adding the piece (the cost model's heads on S_d, S_d + e),
    the plan's current max cost, the marginal growth of the max, the memory left after placing,
    its number of pieces and the episode's progress,
all costs divided by the task's scale L = (sum of the pieces' standalone costs) / devices and
embeddings by their mean, so one policy serves any number of tables and devices. The score is
  logit_d = alpha * prior_d + MLP(state_d),   prior_d = -(cost after adding) / L,
softmax over the legal (memory-feasible, slice- and block-distinct) devices. The prior makes
the untrained policy the longest-processing-time greedy of the cost model; training (REINFORCE
with a greedy self-critical baseline, `train.train_policy`) learns the residual MLP and alpha.

Inference is numpy only: greedy decode, optionally best-of-k samples scored by the cost model,
then a local search (moves and swaps off the most expensive device while the predicted max
cost drops, then onto the cheapest while its cost rises without raising the max; `improve`).
The strategy "learned" (shipped weights of the task's hardware profile, `cm.profile_of`: GPU
devices use cost_model_gpu.npz / policy_gpu.npz, or the *_gpu_wide.npz ones for a task with a
table wider than the pool's, falling back as `cm.weights_file` does; no training step;
proposers.py names it; trained weights are passed in, never set for the process):
    >>> from tfra_dynamic_embedding.placement import proposers
    >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
    >>> task = Task([TableSpec("a", 1000, 16), TableSpec("b", 1000, 64)], make_devices(2))
    >>> proposers.propose(task, "learned").strategy
    'learned'
    >>> mine = cm.DATA_DIR                   # e.g. the --out of `tfra-de train-planner`
    >>> proposers.propose(task, "learned", weights=mine).estimator
    'learned'

A GPU cost model predicts compute only; `Problem` adds each device's modelled all-to-all
(`cm.comm_ms`) to the costs the policy and the local search balance.
"""

import json
import math
import os

import numpy as np

from tfra_dynamic_embedding.placement import comm as comm_lib
from tfra_dynamic_embedding.placement import cost_model as cm
from tfra_dynamic_embedding.placement.pieces import (Partition, column_options, column_pieces,
                                                     column_splits, fewest_blocks, largest_memory,
                                                     split_pieces)
from tfra_dynamic_embedding.placement.types import PlacementError, Shard

DEFAULT_WEIGHTS = os.path.join(cm.DATA_DIR, "policy_cpu.npz")
POLICY_FORMAT = "tfra-de-policy/1"
NUM_SCALARS = 8
NUM_INPUTS = NUM_SCALARS + 2 * cm.EMBED_DIM
BEST_OF = 16
SEARCH_EVALUATIONS = 60_000        # local-search budget (candidate moves scored), see improve
BIG_TASK_SEARCH_EVALUATIONS = 15_000   # for tasks over 200 tables: planning time first
HOT_SPLITS = (None, 1.0, 0.7, 0.5)   # see plan_task: also try cutting tables costlier than h * L
# A plan with column blocks must be predicted this much cheaper than the best without: a
# column-split table runs as several variables whose lookups concatenate, and smaller predicted
# gains lie within the cost model's error on a device (a few percent).
COLUMN_MARGIN = 0.05
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

    def logits_from_first_layer(self, pre, prior):
        """(logits [..], hidden [.., hidden]) given the first layer before tanh,
        pre = x @ w1 + b1 for inputs x [.., NUM_INPUTS] (`rollout` sums it from parts), and
        the priors [..]."""
        h = np.tanh(pre)
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
    """A task prepared for the policy: its pieces, their embeddings, costs and the scale L.

    Device costs are ms at the model's training batch (`model.batch_factor` scales them to the
    task's), summed from per-piece projections (`proj`, see `total_from_projection`). For a GPU
    model (`model.comm`) each device also pays its all-to-all, `cm.comm_ms`: linear in its
    pooled bytes plus one latency once it holds a piece, so `proj` gets two more columns (the
    piece's linear ms, and 1 to count pieces) and device sums stay additive.
    """

    def __init__(self, task, model, order="cost", hot_split=None, items=None, columns=False):
        """`items`: the task's `pieces.split_pieces` when already known. `hot_split` h: pieces
        costlier than h * L are cut (`columns`: hot wide tables by columns first,
        `split_hot_columns`; then the others by rows, `split_hot_items`)."""
        self.task = task
        self.model = model
        comm = model.comm if task.num_devices > 1 else None
        self.latency_ms = None     # None: no all-to-all term (a CPU model, or one device)
        if comm is not None:
            # cm.comm_ms = 2 stages x (latency + pooled (n - 1) / n / bandwidth), in ms at the
            # task's batch; divided by the batch factor into this problem's unit
            factor = model.batch_factor(task.batch_size)
            n = task.num_devices
            self.latency_ms = 2e3 * comm.latency / factor
            self._ms_per_byte = 2e3 * (n - 1) / n / comm.bandwidth / factor
        # PlacementError for unsplittable tables
        self.items = list(items) if items is not None else split_pieces(task)
        self._embed_items()
        if hot_split is not None and self.items:
            limit = hot_split * float(self.solo.sum()) / task.num_devices
            if columns:
                self.items = split_hot_columns(self.items, self.solo, task, limit,
                                               self.piece_costs)
                self._embed_items()
            self.items = split_hot_items(self.items, self.solo, model, task.num_devices, limit,
                                         costs=self.piece_costs)
            self._embed_items()
        self.bytes = np.array([it.size_bytes for it in self.items], dtype=float)
        self.cap = np.array([math.inf if d.memory_bytes is None else d.memory_bytes
                             for d in task.devices], dtype=float)
        self.num_devices = task.num_devices
        self.scale = max(float(self.solo.sum()) / self.num_devices, 1e-12)
        self.e_scale = max(float(self.emb.mean()), 1e-9) if self.items else 1.0
        names = [it.table.name for it in self.items]
        self.table_id = np.unique(names, return_inverse=True)[1] if names else np.zeros(0, int)
        self.set_order(order)

    def _embed_items(self):
        self.emb = self._embed(self.items)
        # per piece, what it adds to a device's cost-model projection (CostModel.project)
        self.proj = self._project(self.items, self.emb)
        self.solo = self.total_from_projection(self.proj) if self.items else np.zeros(0)

    def _embed(self, items):
        return np.stack([self.model.shard_embedding(it.table, it.index, it.num_slices)
                         for it in items]) if items else np.zeros((0, cm.EMBED_DIM))

    def _project(self, items, emb):
        proj = self.model.project(emb)
        if self.latency_ms is None:
            return proj
        batch = self.task.batch_size
        comm = np.array([[comm_lib.pooled_bytes([it], batch) * self._ms_per_byte, 1.0]
                         for it in items]).reshape(len(items), 2)
        return np.concatenate([proj, comm], axis=1)

    def total_from_projection(self, projected):
        """[...] ms of devices whose pieces' `proj` rows sum to `projected`: the cost model's
        compute, plus the all-to-all for a GPU model (0 on a device without pieces)."""
        if self.latency_ms is None:
            return self.model.total_from_projection(projected)
        compute = self.model.total_from_projection(projected[..., :-2])
        return compute + projected[..., -2] + np.where(projected[..., -1] > 0.5,
                                                       self.latency_ms, 0.0)

    def piece_costs(self, items):
        """[n] ms of each piece of `items` alone on a device (its all-to-all included).

        Example:
            >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
            >>> task = Task([TableSpec("hot", 100_000, 64, pooling_factor=50.0)], make_devices(8))
            >>> problem = Problem(task, cm.load_cost_model())
            >>> quarters = problem.piece_costs([Shard(task.tables[0], "", i, 4) for i in range(4)])
            >>> bool(quarters.max() < problem.piece_costs([Shard(task.tables[0], "")])[0])
            True
        """
        return self.total_from_projection(self._project(items, self._embed(items)))

    def set_order(self, order):
        if order == "cost":
            keys = [(-c, -b, it.table.name, it.index)
                    for c, b, it in zip(self.solo, self.bytes, self.items)]
        else:   # "bytes": memory-tight tasks
            keys = [(-b, -c, it.table.name, it.index)
                    for c, b, it in zip(self.solo, self.bytes, self.items)]
        self.order = sorted(range(len(self.items)), key=lambda i: keys[i])


def split_hot_items(items, solo, model, num_devices, limit, costs=None):
    """`items` with every whole table whose predicted standalone cost `solo` exceeds `limit`
    (ms) cut into the fewest row slices (at most `num_devices`) that each cost at most `limit`
    -- slices of a table go to distinct devices, so one hot table no longer sets the max.
    `costs`: [Shard] -> [n] ms of each alone (default: the cost model's; `Problem.piece_costs`
    adds a GPU model's all-to-all).

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> task = Task([TableSpec("hot", 100_000, 64, pooling_factor=50.0)] + [
        ...     TableSpec(f"f{i}", 1000, 16) for i in range(7)], make_devices(8))
        >>> model = cm.load_cost_model()
        >>> items = split_pieces(task)
        >>> solo = Problem(task, model).piece_costs(items)
        >>> out = split_hot_items(items, solo, model, 8, 1.0 * solo.sum() / 8)
        >>> [s.num_slices > 1 for s in out if s.table.name == "hot"][:2], out[-1].num_slices
        ([True, True], 1)
    """
    if costs is None:
        costs = lambda pieces: model.total(np.stack(   # noqa: E731
            [model.shard_embedding(p.table, p.index, p.num_slices) for p in pieces]))
    out = []
    for item, cost in zip(items, solo):
        if (item.num_slices > 1 or item.is_column_block or cost <= limit or num_devices < 2
                or item.table.rows < 2):
            out.append(item)
            continue
        table = item.table
        for n in range(2, min(num_devices, table.rows) + 1):
            if costs([Shard(table, "", i, n) for i in range(n)]).max() <= limit:
                break
        out.extend(Shard(table, "", i, n) for i in range(n))
    return out


def split_hot_columns(items, solo, task, limit, costs):
    """`items` with every whole table whose predicted standalone cost `solo` exceeds `limit`
    (ms) and that `pieces.column_splits` allows cut into equal column blocks (TorchRec's
    column-wise sharding; blocks go to distinct devices): the fewest blocks that each cost at
    most `limit`, else the number whose block costs least, among the numbers n for which n
    devices have room for a block. `costs`: [Shard] -> [n] ms of each alone
    (`Problem.piece_costs`). Each block probes every key, so more blocks cost more in total.

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> task = Task([TableSpec("hot", 100_000, 64, pooling_factor=50.0)] + [
        ...     TableSpec(f"f{i}", 1000, 16) for i in range(7)], make_devices(8))
        >>> problem = Problem(task, cm.load_cost_model())
        >>> items = split_pieces(task)
        >>> solo = problem.piece_costs(items)
        >>> out = split_hot_columns(items, solo, task, 0.5 * solo.sum() / 8, problem.piece_costs)
        >>> [s.is_column_block for s in out if s.table.name == "hot"][:2], out[-1].is_column_block
        ([True, True], False)
    """
    largest = largest_memory(task)
    out = []
    for item, cost in zip(items, solo):
        whole = item.num_slices == 1 and not item.is_column_block
        options = column_options(item.table, task, largest) if whole and cost > limit else []
        if not options:
            out.append(item)
            continue
        block = dict(zip(options, costs([column_pieces(item.table, n)[0] for n in options])))
        out.extend(column_pieces(item.table, fewest_blocks(options, block, limit)))
    return out


def rollout(problem, policy, n=1, greedy=True, rng=None, keep=False, force=None):
    """Runs n episodes at once (`force` [n, items]: follow these devices instead). Returns
    (choices [n, items] device index or -1, max cost [n] in ms (inf for failed episodes),
    trace (list of per-step dicts when keep, else None)).

    Both MLPs' first layers are linear in the device sums S, so each device keeps its sums'
    projections (cost-model heads, policy) and a step adds the piece's precomputed projection
    to them instead of multiplying [n, devices, 72] inputs again (the same numbers; planning
    800 tables on 80 devices spent most of its time in those products)."""
    D = problem.num_devices
    num_items = len(problem.items)
    E, H = cm.EMBED_DIM, policy.params["b1"].shape[0]
    L, per_dev = problem.scale, max(num_items / D, 1.0)
    w1 = policy.params["w1"]
    w_scalars = w1[:NUM_SCALARS]
    # per piece: its cost-model projection, its policy input term, and what it adds to the
    # policy term of the device it joins
    piece_cost = problem.proj
    piece_pol = (problem.emb / problem.e_scale) @ w1[NUM_SCALARS:NUM_SCALARS + E] \
        + policy.params["b1"]
    piece_dev = (problem.emb / (problem.e_scale * per_dev)) @ w1[NUM_SCALARS + E:]
    dev_cost = np.zeros((n, D, piece_cost.shape[1]))   # project(S)
    dev_pol = np.zeros((n, D, H))                      # S-part of the policy's first layer
    S = np.zeros((n, D, E)) if keep else None          # the sums themselves: traces only
    cost = np.zeros((n, D))
    used = np.zeros((n, D))
    count = np.zeros((n, D))
    top = np.zeros(n)
    failed = np.zeros(n, dtype=bool)
    choices = np.full((n, num_items), -1, dtype=np.int64)
    on_table = {}
    trace = [] if keep else None
    cap_ok = np.isfinite(problem.cap)
    cap = np.where(cap_ok, problem.cap, 1.0)
    rows = np.arange(n)
    for step, i in enumerate(problem.order):
        after = problem.total_from_projection(dev_cost + piece_cost[i])
        legal = used + problem.bytes[i] <= problem.cap
        taken = on_table.get(problem.table_id[i])
        if taken is not None:
            legal &= ~taken
        grow = np.maximum(after, top[:, None]) - top[:, None]
        mem_left = np.where(cap_ok, (cap - used - problem.bytes[i]) / cap, 1.0)
        scalars = np.empty((n, D, NUM_SCALARS))   # filled in place: cheaper than np.stack
        scalars[..., 0] = after / L
        scalars[..., 1] = cost / L
        scalars[..., 2] = scalars[..., 0] - scalars[..., 1]
        scalars[..., 3] = grow / L
        scalars[..., 4] = top[:, None] / L
        scalars[..., 5] = mem_left
        scalars[..., 6] = count / per_dev
        scalars[..., 7] = step / max(num_items, 1)
        prior = -after / L
        logits, h = policy.logits_from_first_layer(
            scalars @ w_scalars + piece_pol[i] + dev_pol, prior)
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
            e = problem.emb[i]
            x = np.concatenate([scalars, np.broadcast_to(e / problem.e_scale, (n, D, E)),
                                S / (problem.e_scale * per_dev)], axis=-1)
            trace.append({"x": x, "prior": prior, "legal": legal, "probs": probs if probs is not None
                          else np.eye(D)[np.maximum(pick, 0)], "chosen": pick, "h": h})
        if n == 1:   # plain indices: fancy indexing costs several us per update
            if not has[0]:
                continue
            ok, d = 0, int(pick[0])
        else:
            ok, d = rows[has], pick[has]
        dev_cost[ok, d] += piece_cost[i]
        dev_pol[ok, d] += piece_dev[i]
        if keep:
            S[ok, d] += problem.emb[i]
        cost[ok, d] = after[ok, d]
        used[ok, d] += problem.bytes[i]
        count[ok, d] += 1
        top = cost.max(axis=1)
        if problem.items[i].num_slices > 1 or problem.items[i].is_column_block:
            mask = on_table.setdefault(problem.table_id[i], np.zeros((n, D), dtype=bool))
            mask[ok, d] = True
    final = np.where(failed, np.inf, top)
    return choices, final, trace


def improve(problem, choices, max_evaluations=SEARCH_EVALUATIONS):
    """Local search after decoding, by the cost model, in two phases of steepest descent:
    (1) move a piece off the most expensive device, or swap it with a piece of another device,
    while that lowers the plan's max cost; (2) then move or swap pieces onto the cheapest device
    while that raises the min cost without raising the max (a better balance). Memory and
    slice-distinctness are respected. The search stops once it has scored `max_evaluations`
    candidate moves: a work budget rather than a clock, so the same task gets the same plan on
    a fast or a slow machine (every worker of a job plans alone; timings:
    docs/learned_placement.md).
    Returns (choices, max cost ms)."""
    D = problem.num_devices
    dev = np.asarray(choices, dtype=np.int64).copy()
    if len(dev) == 0 or (dev < 0).any():
        return dev, math.inf
    state = _SearchState(problem, dev)
    for phase in ("max", "min"):
        while D >= 2 and state.evaluated < max_evaluations and state.step(phase):
            pass
    return state.dev, float(state.cost.max())


class _SearchState:
    """Devices' projected summed embeddings, memory and costs of a plan under local search."""

    def __init__(self, problem, dev):
        self.problem, self.dev = problem, dev
        D = problem.num_devices
        self.P = np.zeros((D, problem.proj.shape[1]))      # per device: project(S_d)
        np.add.at(self.P, dev, problem.proj)
        self.used = np.bincount(dev, weights=problem.bytes, minlength=D)
        self.cost = problem.total_from_projection(self.P)
        self.evaluated = 0   # candidate moves scored so far

    def _candidates(self, phase):
        """(p, q, a, b): piece p moves from device a to b; piece q (or -1) from b to a."""
        D, dev = self.problem.num_devices, self.dev
        if phase == "max":   # p leaves the most expensive device
            hot = int(np.argmax(self.cost))
            mine, other = np.flatnonzero(dev == hot), np.flatnonzero(dev != hot)
            p = np.concatenate([np.repeat(mine, D), np.repeat(mine, len(other))])
            q = np.concatenate([np.full(len(mine) * D, -1), np.tile(other, len(mine))])
            b = np.concatenate([np.tile(np.arange(D), len(mine)), dev[np.tile(other, len(mine))]])
            return p, q, np.full(len(p), hot), b
        cold = int(np.argmin(self.cost))   # "min": p joins the cheapest device
        mine, other = np.flatnonzero(dev == cold), np.flatnonzero(dev != cold)
        p = np.concatenate([other, np.repeat(other, len(mine))])
        q = np.concatenate([np.full(len(other), -1), np.tile(mine, len(other))])
        return p, q, dev[p], np.full(len(p), cold)

    def step(self, phase):
        """Applies the best improving move or swap of `phase`; False when there is none."""
        prob, dev, cost = self.problem, self.dev, self.cost
        p, q, a, b = self._candidates(phase)
        if len(p) == 0:
            return False
        tid, size, proj = prob.table_id, prob.bytes, prob.proj
        has_q = q >= 0
        qq = np.maximum(q, 0)
        e_q = np.where(has_q[:, None], proj[qq], 0.0)
        b_q = np.where(has_q, size[qq], 0.0)
        on = np.zeros((tid.max() + 1, prob.num_devices), dtype=np.int64)
        np.add.at(on, (tid, dev), 1)
        ok = (a != b) & ~(has_q & (tid[qq] == tid[p]))     # swapping two slices of one table: no-op
        ok &= (self.used[a] - size[p] + b_q <= prob.cap[a]) & (
            self.used[b] + size[p] - b_q <= prob.cap[b])
        ok &= (on[tid[p], b] == 0) & (~has_q | (on[tid[qq], a] == 0))
        if not ok.any():
            return False
        p, q, a, b, e_q = p[ok], q[ok], a[ok], b[ok], e_q[ok]
        self.evaluated += len(p)
        new_a = prob.total_from_projection(self.P[a] - proj[p] + e_q)
        new_b = prob.total_from_projection(self.P[b] + proj[p] - e_q)
        top = cost.max()
        if phase == "max":
            rest = _extreme_of_rest(cost, a, b, largest=True)
            value = np.maximum(np.maximum(new_a, new_b), rest)
            best = int(np.argmin(value))
            if value[best] >= top * (1 - 1e-6):
                return False
        else:
            rest = _extreme_of_rest(cost, a, b, largest=False)
            value = np.where(np.maximum(new_a, new_b) <= top,
                             np.minimum(np.minimum(new_a, new_b), rest), -np.inf)
            best = int(np.argmax(value))
            if value[best] <= cost.min() * (1 + 1e-6):
                return False
        pi, qi, ai, bi = int(p[best]), int(q[best]), int(a[best]), int(b[best])
        self.P[ai] += e_q[best] - proj[pi]
        self.P[bi] += proj[pi] - e_q[best]
        moved_back = size[qi] if qi >= 0 else 0.0
        self.used[ai] += moved_back - size[pi]
        self.used[bi] += size[pi] - moved_back
        dev[pi] = bi
        if qi >= 0:
            dev[qi] = ai
        cost[ai], cost[bi] = new_a[best], new_b[best]
        return True


def _extreme_of_rest(cost, a, b, largest):
    """Per candidate, the max (or min) cost over the devices other than a and b."""
    order = np.argsort(-cost if largest else cost)[:3]
    rest = np.full(len(a), 0.0 if largest else np.inf)
    for k in order[::-1]:   # the most extreme device not in {a, b} is written last
        rest = np.where((k != a) & (k != b), cost[k], rest)
    return rest


def _to_plan(problem, choices, seed, meta):
    slices = {it.table.name: it.num_slices for it in problem.items}
    columns = {}
    for it in sorted((it for it in problem.items if it.is_column_block),
                     key=lambda it: it.col_offset):
        columns.setdefault(it.table.name, []).append(it.col_width)
    state = Partition(problem.task, slices, columns)
    for item, device in zip(problem.items, choices):
        if device < 0:
            state.unplaced.append(item)
        else:
            state.put(item, int(device))
    plan = state.plan("learned", seed)
    plan.estimator = "learned"
    plan.meta.update(meta)
    return plan


def weights_files(task, weights=None):
    """(cost model path, policy path) the "learned" strategy plans `task` with: the files of
    its profile (`cm.profile_of`) in the directory `weights` (e.g. the --out of `tfra-de
    train-planner`; None: the shipped data), the cpu files where a gpu one is missing
    (`cm.weights_file`).

    Example:
        >>> from tfra_dynamic_embedding.placement.types import TableSpec, Task, make_devices
        >>> gpu_task = Task([TableSpec("a", 1000, 64)], make_devices(2, "16GiB", "/GPU:{i}"))
        >>> [os.path.basename(path) for path in weights_files(gpu_task, cm.DATA_DIR)]
        ['cost_model_gpu.npz', 'policy_gpu.npz']
    """
    profile = cm.profile_of(task)
    return (cm.weights_file("cost_model", profile, weights),
            cm.weights_file("policy", profile, weights))


def load_policy(path=None):
    if isinstance(path, Policy):
        return path
    return cm.load_cached(path or DEFAULT_WEIGHTS, Policy.load)


def plan_task(task, policy=None, model=None, samples=0, seed=0,
              search_evaluations=SEARCH_EVALUATIONS, hot_splits=HOT_SPLITS, weights=None):
    """A Plan of `task` by the policy: greedy decode, plus best-of-`samples` sampled episodes
    scored by the cost model, then local search (`improve`) scoring up to `search_evaluations`
    candidate moves (0: none).
    This runs once per entry of `hot_splits` -- None: tables whole (row-sliced only where they
    fit no device); h: tables predicted to cost more than h * L also cut into row slices
    (`split_hot_items`), and, where a task has tables wide enough, once more with those of them
    cut into column blocks instead (`split_hot_columns`) -- and the plan with the lowest
    predicted max cost wins; one with column blocks only when it is COLUMN_MARGIN below the
    best without.
    A dead end (memory) is retried in bytes-first order; if that fails too, the
    Partition's PlacementError is raised.
    `policy` / `model` None: the weights of the task's profile in the directory `weights`
    (`weights_files`; None: the shipped ones)."""
    model_path, policy_path = weights_files(task, weights)
    model = cm.load_cost_model(model_path if model is None else model)
    policy = load_policy(policy_path if policy is None else policy)
    whole = Problem(task, model)
    if not whole.items:
        return _to_plan(whole, np.zeros(0, dtype=np.int64), seed, {})
    largest = largest_memory(task)
    wide = any(column_splits(t, task, largest) for t in task.tables)
    variants = [(hot, by_columns) for hot in hot_splits
                for by_columns in ((False, True) if hot is not None and wide else (False,))]
    # by_columns -> (max cost, problem, choices, meta); a column variant is decoded only when
    # it cut some table by columns (otherwise its pieces are its row variant's, already tried)
    found, tried = {}, set()
    for hot, by_columns in variants:
        problem = whole if hot is None else Problem(task, model, hot_split=hot,
                                                    items=whole.items, columns=by_columns)
        pieces_key = tuple((it.table.name, it.index, it.num_slices, it.col_offset)
                           for it in problem.items)
        if pieces_key in tried:
            continue   # the same pieces as a variant already decoded
        tried.add(pieces_key)
        choices, cost, meta = _decode(problem, policy, samples, seed, search_evaluations)
        if choices is not None and (by_columns not in found or cost < found[by_columns][0]):
            found[by_columns] = (cost, problem, choices,
                                 dict(meta, hot_split=hot, by_columns=by_columns))
    best, cut = found.get(False), found.get(True)
    if cut is not None and (best is None or cut[0] < (1.0 - COLUMN_MARGIN) * best[0]):
        best = cut
    if best is None:   # report like the heuristics do: the pieces left without room
        whole.set_order("bytes")
        choices, _, _ = rollout(whole, policy, 1, greedy=True)
        return _to_plan(whole, choices[0], seed, {})
    cost, problem, choices, meta = best
    meta["predicted_max_ms"] = float(cost) * model.batch_factor(task.batch_size)
    meta["split_tables"] = sorted({it.table.name for it in problem.items if it.num_slices > 1})
    meta["column_split_tables"] = sorted({it.table.name for it in problem.items
                                          if it.is_column_block})
    return _to_plan(problem, choices, seed, meta)


def _decode(problem, policy, samples, seed, search_evaluations):
    """(choices, predicted max cost, meta) of the best decode of `problem`; (None, inf, {})
    when every decode runs out of memory."""
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
    if best is None:
        return None, math.inf, {}
    if search_evaluations:
        improved, cost = improve(problem, best, search_evaluations)
        if cost < best_cost:
            best, best_cost, how = improved, cost, how + " + local search"
    return best, float(best_cost), {"decode": how, "order": order}


def learned_plan(task, seed=0, estimator=None, weights=None):
    """RL policy over the learned cost model (shipped CPU weights; numpy inference)

    The RL policy over the neural cost model of the task's profile, from the directory
    `weights` (None: the shipped ones; `weights_files`): greedy decode, plus the best of 16
    sampled plans (by the cost model) for tasks of up to 200 tables, each with tables whole
    and with hot tables cut at 1.0, 0.7 and 0.5 x L (by rows, and the wide ones by columns);
    bigger tasks decode once, cutting tables costlier than 0.5 x L (the best single choice by
    the cost model on 400/40 and 800/80 tasks) with a smaller local-search budget, to keep
    planning fast."""
    del estimator
    small = len(task.tables) <= 200
    return plan_task(task, seed=seed, samples=BEST_OF if small else 0,
                     hot_splits=HOT_SPLITS if small else (HOT_SPLITS[-1],),
                     search_evaluations=SEARCH_EVALUATIONS if small
                     else BIG_TASK_SEARCH_EVALUATIONS, weights=weights)


__all__ = ["Policy", "Problem", "PlacementError", "learned_plan", "load_policy", "plan_task",
           "rollout", "weights_files"]
