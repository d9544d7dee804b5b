"""Applying a Plan: the devices (and row-slice partitioner) of real `de.Variable`s.

Two ways:
    w = de.get_variable("user", dim=16, devices=plan.devices_for("user"),
                        partitioner=plan.partitioner_for("user") or de.default_partition_fn)
or, for every variable a model creates:
    with plan.scope():                       # == apply.plan_scope(plan)
        w = de.get_variable("user", dim=16)  # devices from the plan
        layer = de.keras.layers.Embedding(...)

Plan table names match the variable-scope qualified name given to `de.get_variable`
("ctr/user"), or a trailing part of it ("user" matches "ctr/user"; the longest match wins).
A row-sliced table gets one shard per slice, slice i on the plan's i-th device, and the
partitioner keys mod n -- the same rule that defines the slices (string keys: TF's stable
string hash mod n). Variables the plan does not name keep their own devices (strict=True
raises instead).
"""

import contextlib

from absl import logging


def match_table(plan, full_name):
    """The plan's table name for a variable's full name, or None."""
    if full_name in plan.assignment:
        return full_name
    matches = [name for name in plan.assignment if full_name.endswith("/" + name)]
    if not matches:
        return None
    matches.sort(key=len, reverse=True)
    if len(matches) > 1 and len(matches[0]) == len(matches[1]):
        raise ValueError(f"variable {full_name!r} matches several plan tables: {matches}")
    return matches[0]


def partitioner_for(plan, name):
    """None for a table placed whole; the key-mod partitioner for a row-sliced table."""
    if plan.num_slices(name) == 1:
        return None
    from tfra_dynamic_embedding import variable  # pylint: disable=import-outside-toplevel
    return variable.default_partition_fn


def plan_resolver(plan, strict=False):
    """A resolver for `scopes.placement_scope`: full_name -> (devices, partitioner) or None."""
    plan.validate(check_memory=False)
    seen = set()

    def resolve(full_name):
        name = match_table(plan, full_name)
        if name is None:
            if strict:
                raise KeyError(f"de.Variable {full_name!r} is not in the placement plan "
                               f"(tables: {sorted(plan.assignment)[:10]})")
            if full_name not in seen:
                seen.add(full_name)
                logging.info("placement plan has no table for %s; keeping its own devices",
                             full_name)
            return None
        devices = plan.devices_for(name)
        logging.info("placing %s (plan table %s) on %s", full_name, name, devices)
        return devices, partitioner_for(plan, name)

    return resolve


@contextlib.contextmanager
def plan_scope(plan, strict=False):
    """Within the scope `de.get_variable` takes devices and row slices from `plan`.

    Scopes nest; the innermost with an opinion wins.
    """
    from tfra_dynamic_embedding import scopes  # pylint: disable=import-outside-toplevel
    with scopes.placement_scope(plan_resolver(plan, strict=strict)):
        yield plan


def shard_devices(var):
    """Device of each shard table's resource handle of a `de.Variable` (for checks)."""
    return [table.resource_handle.device for table in var.tables]
