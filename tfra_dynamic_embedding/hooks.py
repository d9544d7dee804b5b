"""Hooks: how eviction, admission and restrict policies (online/) attach to a `de.Variable`.

`variable.py` knows this interface, not the features: `de.Variable(eviction=..., admission=...,
restrict_policy=...)` takes any `VariableHook` made for that argument, and `attach(variable)`
gives the hook's state on the variable, an `AttachedHook`. The state works on the variable's
public surface (`variable.shards`: each shard's table and device, and the partition of keys
over them; `contains`, `accum`, `size`, ...); the variable checkpoints the state's trackables
under their names and calls `after_restore` when a restore of its rows ends. So the features
import the variable, never the other way round.

Example (a hook that admits every key, attached as `admission=`):
    >>> import tensorflow as tf
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> class AdmitAllState(AttachedHook):
    ...     def admit(self, ids, exists):   # what the optimizer asks of an admission state
    ...         return tf.ones_like(exists), tf.no_op()
    >>> class AdmitAll(VariableHook):
    ...     argument = "admission"
    ...     def attach(self, variable):
    ...         return AdmitAllState()
    >>> w = de.Variable(dim=4, admission=AdmitAll())
    >>> is_hook(AdmitAll(), "admission"), is_hook(AdmitAll(), "eviction")
    (True, False)
"""

# The Variable arguments that take hooks, in the order a Variable attaches them: a restrict
# policy looks at the eviction (its rows' stamps are training steps then).
ARGUMENTS = ("eviction", "restrict_policy", "admission")


class VariableHook:
    """What a Variable argument in `ARGUMENTS` takes: `argument` names it, `attach(variable)`
    makes the state. With `passed_as_class`, the argument takes the hook's class instead of an
    instance (TFRA passes restrict policies so), and the class's `attach` makes the state."""

    argument = None
    passed_as_class = False

    def attach(self, variable):
        """The `AttachedHook` that does this hook's work on `variable` (a de.Variable)."""
        raise NotImplementedError


class AttachedHook:
    """A hook's state on one Variable; the Variable calls what is defined here."""

    # Names among `trackables()` a SavedModel leaves out (training state no server reads).
    checkpoint_only = ()

    def trackables(self):
        """{name: trackable} saved and restored with the variable, under these names."""
        return {}

    def after_restore(self, restored):
        """The op ending a restore of the variable's rows, `restored` (the import op)."""
        return restored


def is_hook(value, argument):
    """Whether `value` is a hook for the Variable argument `argument` (an instance of a
    `VariableHook` for it, or the class itself when the hook is `passed_as_class`).

    Example:
        >>> import tensorflow_recommenders_addons.dynamic_embedding as de
        >>> is_hook(de.Eviction(max_size=10), "eviction"), is_hook(3, "eviction")
        (True, False)
    """
    hook_type = value if isinstance(value, type) else type(value)
    return (issubclass(hook_type, VariableHook) and hook_type.argument == argument
            and isinstance(value, type) == hook_type.passed_as_class)
