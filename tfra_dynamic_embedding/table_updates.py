"""Optimizer updates applied in the tables, where they live (Paddle's distributed lookup table).

A trainer sends each table the batch's unique ids and their summed gradients; one native op per
device (`TfraDeApplyGradients`, all tables of that device at once) updates the rows and their
optimizer slots in place. Slot rows never travel, and concurrent trainers' updates to one id
add up by construction. The hyper-parameters (learning rate after schedules, Adam's bias
correction, weight decay) are evaluated on the trainer each step, as the optimizer itself
would, and sent as numbers.

Rules by optimizer (the same numbers as the optimizer's own update; anything else keeps the
trainer-side path of optimizer/base.py):

| rule            | tf.compat.v1.train      | Keras 3 / tf_keras          | tf_keras legacy            |
|-----------------|-------------------------|-----------------------------|----------------------------|
| sgd             | GradientDescent         | SGD (momentum 0)            | SGD (momentum 0)           |
| momentum        | Momentum (Nesterov too) |                             |                            |
| keras_momentum  |                         | SGD (momentum, Nesterov)    | SGD (momentum, Nesterov)   |
| adagrad         | Adagrad                 | Adagrad                     | Adagrad                    |
| adam (lazy)     | Adam                    | Adam, AdamW (no amsgrad)    | Adam (no amsgrad)          |
| ftrl            | Ftrl                    | Ftrl                        | Ftrl                       |
| rmsprop         | RMSProp                 | RMSprop                     | RMSprop                    |

A variable takes this path when all its shards are native tables whose records hold the
optimizer's slots. Its admission filter (which ids are written), eviction (room made before the
update) and restrict policy apply as on the trainer-side path.

Example:
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> w = de.Variable(dim=2, initializer=1.0)
    >>> opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(0.5))
    >>> ids = tf.constant([3, 4], tf.int64)
    >>> with tf.GradientTape() as tape:
    ...     emb, wrapper = de.embedding_lookup(w, ids, return_trainable=True)
    ...     loss = tf.reduce_sum(emb)
    >>> _ = opt.apply_gradients(zip(tape.gradient(loss, [wrapper]), [wrapper]))
    >>> rows = de.embedding_lookup(w, ids).numpy()   # 1 - 0.5 * 1 / sqrt(0.1 + 1 + 1e-7)
    >>> rows.astype("float64").round(4).tolist()
    [[0.5233, 0.5233], [0.5233, 0.5233]]
"""

import dataclasses
import sys
from typing import Optional, Tuple

import tensorflow as tf

from tfra_dynamic_embedding.tables import native_slots


@dataclasses.dataclass(frozen=True)
class Rule:
    """An optimizer's update as the table op applies it: `kind` (the op's rule), `slots` (the
    optimizer's slot names in the rule's order; None where the configuration keeps none)."""
    kind: str
    slots: Tuple[Optional[str], ...] = ()


@dataclasses.dataclass
class Pending:
    """One wrapper's update of this step, applied by `apply_pending` after the optimizer ran."""
    wrapper: object
    grad: tf.Tensor
    rule: Rule
    hyper: tf.Tensor   # float64 [decay, then the rule's numbers]


# ----------------------------------------------------------------- rules by optimizer --

def rule_of(optimizer, cls, family):
    """The `Rule` for `optimizer` (of class `cls`, without DynamicEmbeddingOptimizer's
    subclass) of `family` ("v1", "keras3", "tf_keras", "legacy"), or None when its update stays
    on the trainer."""
    if family == "v1":
        return _v1_rule(optimizer, cls)
    if family == "legacy":
        return _legacy_rule(optimizer, cls)
    return _keras_rule(optimizer, cls, family)


def _is(cls, namespace, *names):
    """Whether `cls` is exactly one of `namespace`'s classes `names`."""
    return any(getattr(namespace, n, None) is cls for n in names)


def _v1_rule(opt, cls):
    train = tf.compat.v1.train
    # pylint: disable=protected-access
    if _is(cls, train, "GradientDescentOptimizer"):
        return Rule("sgd")
    if _is(cls, train, "MomentumOptimizer"):
        return Rule("momentum", ("momentum",))
    if _is(cls, train, "AdagradOptimizer"):
        return Rule("adagrad", ("accumulator",))
    if _is(cls, train, "AdamOptimizer"):
        return Rule("adam", ("m", "v"))
    if _is(cls, train, "FtrlOptimizer"):
        return Rule("ftrl", ("accum", "linear"))
    if _is(cls, train, "RMSPropOptimizer"):
        return Rule("rmsprop", ("rms", "momentum", "mg" if opt._centered else None))
    return None


def _keras_rule(opt, cls, family):
    keras3 = family == "keras3"
    if getattr(opt, "gradient_accumulation_steps", None):
        return None   # its update runs inside a conditional of Keras' own
    namespace = sys.modules["keras" if keras3 else "tf_keras"].optimizers
    if _is(cls, namespace, "SGD"):
        if not float(opt.momentum):
            return Rule("sgd")
        return Rule("keras_momentum", ("momentum" if keras3 else "m",))
    if _is(cls, namespace, "Adam", "AdamW") and not opt.amsgrad:
        return Rule("adam", ("momentum", "velocity") if keras3 else ("m", "v"))
    if _is(cls, namespace, "Adagrad"):
        return Rule("adagrad", ("accumulator",))
    if _is(cls, namespace, "Ftrl"):
        return Rule("ftrl", ("accumulator", "linear"))
    if _is(cls, namespace, "RMSprop"):
        return Rule("rmsprop", ("velocity", "momentum" if opt.momentum > 0 else None,
                                "average_gradient" if opt.centered else None))
    return None


def _legacy_rule(opt, cls):
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is None:   # TF's own frozen copy of these optimizers: the trainer's path
        return None
    namespace = tf_keras.optimizers.legacy
    # pylint: disable=protected-access
    if _is(cls, namespace, "SGD"):
        return Rule("keras_momentum", ("momentum",)) if opt._momentum else Rule("sgd")
    if _is(cls, namespace, "Adam") and not opt.amsgrad:
        return Rule("adam", ("m", "v"))
    if _is(cls, namespace, "Adagrad"):
        return Rule("adagrad", ("accumulator",))
    if _is(cls, namespace, "Ftrl"):
        return Rule("ftrl", ("accumulator", "linear"))
    if _is(cls, namespace, "RMSprop"):
        return Rule("rmsprop", ("rms", "momentum" if opt._momentum else None,
                                "mg" if opt.centered else None))
    return None


# ------------------------------------------------------- hyper-parameters, per step --

def _numbers(values, dtype):
    """The rule's numbers as the float64 vector the op takes, each first rounded to the
    variable's dtype (as the optimizer computes them)."""
    return tf.cast(tf.stack([tf.cast(v, dtype) for v in values]), tf.float64)


def v1_hyper(opt, rule, dtype):
    """tf.compat.v1.train: from the tensors `_prepare` made this step."""
    # pylint: disable=protected-access
    if rule.kind == "sgd":
        values = [opt._learning_rate_tensor]
    elif rule.kind == "momentum":
        values = [opt._learning_rate_tensor, opt._momentum_tensor, float(opt._use_nesterov)]
    elif rule.kind == "adagrad":
        values = [opt._learning_rate_tensor, 0.0, 0.0]
    elif rule.kind == "adam":
        b1p, b2p = (tf.cast(p, dtype) for p in opt._get_beta_accumulators())
        lr = tf.cast(opt._lr_t, dtype)
        values = [lr * tf.sqrt(1 - b2p) / (1 - b1p), 1 - tf.cast(opt._beta1_t, dtype),
                  1 - tf.cast(opt._beta2_t, dtype), opt._epsilon_t]
    elif rule.kind == "ftrl":
        values = [opt._learning_rate_tensor, opt._l1_regularization_strength_tensor,
                  opt._adjusted_l2_regularization_strength_tensor,
                  opt._l2_shrinkage_regularization_strength_tensor,
                  opt._learning_rate_power_tensor]
    else:
        rho = tf.cast(opt._decay_tensor, dtype)
        values = [opt._learning_rate_tensor, rho, 1 - rho, opt._momentum_tensor,
                  opt._epsilon_tensor, 0.0, float(opt._centered), 0.0]
    return _numbers([0.0] + values, dtype)


def keras_hyper(opt, rule, dtype, learning_rate, decay):
    """Keras 3 and tf_keras: as their `update_step`, with `learning_rate` this step's and
    `decay` the weight decay factor (lr * weight_decay, or 0)."""
    lr = tf.cast(learning_rate, dtype)
    if rule.kind == "sgd":
        values = [lr]
    elif rule.kind == "keras_momentum":
        values = [lr, opt.momentum, float(opt.nesterov)]
    elif rule.kind == "adagrad":
        values = [lr, opt.epsilon, 0.0]
    elif rule.kind == "adam":
        step = tf.cast(opt.iterations + 1, dtype)
        b1p = tf.pow(tf.cast(opt.beta_1, dtype), step)
        b2p = tf.pow(tf.cast(opt.beta_2, dtype), step)
        values = [lr * tf.sqrt(1 - b2p) / (1 - b1p), 1 - opt.beta_1, 1 - opt.beta_2,
                  opt.epsilon]
    elif rule.kind == "ftrl":
        values = [lr, opt.l1_regularization_strength,
                  opt.l2_regularization_strength + opt.beta / (2.0 * lr),
                  opt.l2_shrinkage_regularization_strength, opt.learning_rate_power]
    else:
        values = [lr, opt.rho, 1 - opt.rho, opt.momentum, opt.epsilon, 0.0,
                  float(opt.centered), 1.0]
    return _numbers([decay] + values, dtype)


def legacy_hyper(opt, rule, dtype, coefficients):
    """tf_keras legacy: from the step's `apply_state` coefficients of the variable."""
    c = coefficients
    if rule.kind == "sgd":
        values = [c["lr_t"]]
    elif rule.kind == "keras_momentum":
        values = [c["lr_t"], c["momentum"], float(opt.nesterov)]
    elif rule.kind == "adagrad":
        values = [c["lr_t"], 0.0, c["epsilon"]]
    elif rule.kind == "adam":
        lr = c["lr_t"] * tf.sqrt(1 - c["beta_2_power"]) / (1 - c["beta_1_power"])
        values = [lr, 1 - c["beta_1_t"], 1 - c["beta_2_t"], c["epsilon"]]
    elif rule.kind == "ftrl":
        values = [c["lr_t"], c["l1_regularization_strength"],
                  c["l2_regularization_strength"] + c["beta"] / (2.0 * c["lr_t"]),
                  c["l2_shrinkage_regularization_strength"], c["learning_rate_power"]]
    else:   # with momentum TF's kernel (epsilon in the root), else tf_keras' own (outside)
        momentum = bool(opt._momentum)  # pylint: disable=protected-access
        values = [c["lr_t"], c["rho"], 1 - c["rho"], c["momentum"] if momentum else 0.0,
                  c["epsilon"] if momentum else 0.0, 0.0 if momentum else c["epsilon"],
                  float(opt.centered), 0.0 if momentum else 1.0]
    return _numbers([0.0] + values, dtype)


# ------------------------------------------------------------------ who takes the path --

def slot_variables(params, rule, slot_tables):
    """The slot `de.Variable`s of `rule` for embedding `params` (None where not kept), from
    the optimizer's `{(params, slot name): slot variable}`; None when one is missing."""
    found = []
    for name in rule.slots:
        if name is None:
            found.append(None)
            continue
        table = slot_tables.get((params, name))
        if table is None:
            return None
        found.append(table)
    return found


def takes_path(wrapper, rule, slot_tables):
    """Whether the update of `wrapper`'s rows can be applied in its variable's tables under
    `rule`."""
    params = wrapper.params
    if rule is None or wrapper.HOLDS_TRAINED_ROWS or not params.value_dtype.is_floating:
        return False
    if not native_slots.fusable(params.shards.tables):
        return False
    slots = slot_variables(params, rule, slot_tables)
    return slots is not None and params.slot_groups([s for s in slots if s is not None]) is not None


# ------------------------------------------------------------------------ the op calls --

def apply_pending(pending, slot_tables, keep=None):
    """The ops applying this step's `Pending` updates: one per device, rule and hyper vector
    (the tables of one device and optimizer go together). `keep`: {wrapper ref: None or a
    bool mask over its ids} (an admission filter's: only those ids are written)."""
    calls = {}
    for p in pending:
        params = p.wrapper.params
        shards = params.shards
        ids, grad = p.wrapper.batch_ids(), p.grad
        init = params.init_spec
        rows = None if native_slots.drawn_in_table(init) else p.wrapper.held_rows()
        mask = (keep or {}).get(p.wrapper.ref())
        if mask is not None:
            ids, grad = tf.boolean_mask(ids, mask), tf.boolean_mask(grad, mask)
            rows = None if rows is None else tf.boolean_mask(rows, mask)
        slots = slot_variables(params, p.rule, slot_tables)
        if len(shards) == 1:
            parts, grads, inits = [ids], [grad], [rows]
        else:
            parts, positions = shards.partition(ids)
            grads = [tf.gather(grad, pos) for pos in positions]
            inits = [None if rows is None else tf.gather(rows, pos) for pos in positions]
        for i, table in enumerate(shards.tables):
            groups = [-1 if s is None else s.shards.tables[i].group for s in slots]
            key = (table.device, table.key_dtype, table.value_dtype, p.rule.kind, p.hyper.ref())
            calls.setdefault(key, []).append(
                native_slots.TableUpdate(table, parts[i], grads[i], init, inits[i], groups))
    ops = []
    for (device, _, _, kind, hyper_ref), updates in calls.items():
        ops.append(native_slots.apply_gradients(device, updates, kind, hyper_ref.deref()))
    return ops
