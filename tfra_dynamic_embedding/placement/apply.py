"""Applying a Plan: the devices (and row-slice partitioner) of real `de.Variable`s; tables the
plan splits by columns are built by `column_split.py` (one variable per block).

Two ways: `de.get_variable(..., devices=plan.devices_for(name), partitioner=...)`, or
`with plan.scope():` for every variable (and Keras `de.keras.layers.Embedding`) a model creates.

Example:
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> from tfra_dynamic_embedding.placement.types import Plan, TableSpec, Task, make_devices
    >>> task = Task([TableSpec("user", 100, 16), TableSpec("item", 100, 16)],
    ...             make_devices(2, template="/CPU:{i}"))
    >>> plan = Plan(task, {"user": ["/CPU:0", "/CPU:1"], "item": ["/CPU:1"]})   # user: 2 slices
    >>> w = de.get_variable("user", dim=16, devices=plan.devices_for("user"),
    ...                     partitioner=plan.partitioner_for("user") or de.default_partition_fn)
    >>> with plan.scope():                        # == plan_scope(plan)
    ...     v = de.get_variable("ctr/item", dim=16)   # devices from the plan
    >>> w.devices, v.devices
    (['/CPU:0', '/CPU:1'], ['/CPU:1'])

Plan table names match the variable-scope qualified name given to `de.get_variable`
("ctr/user"), or a trailing part of it ("user" matches "ctr/user"; the longest match wins).
A row-sliced table gets one shard per slice, slice i on the plan's i-th device, and the
partitioner keys mod n -- the same rule that defines the slices (string keys: TF's stable
string hash mod n). Variables the plan does not name keep their own devices (strict=True
raises instead).

A table split by columns is not one de.Variable: `de.get_variable` of its name inside the scope
raises ValueError. Build it with `column_split.column_split_variables(plan, name, ...)` or the
Keras layer `column_split.ColumnSplitEmbedding(plan, name, ...)`; their block variables
`<name>/col<j>` land on block j's device, also inside the scope.
"""

import contextlib
import re

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


def block_name(name, index):
    """The de.Variable name of column block `index` of table `name`: block_name("ad", 1) ->
    "ad/col1"."""
    return f"{name}/col{index}"


def match_block(plan, full_name):
    """(plan table, block index) when `full_name` names a column block ("<table>/col<j>") of a
    table the plan splits by columns, else None."""
    found = re.fullmatch(r"(.+)/col([0-9]+)", full_name)
    if not found:
        return None
    name, index = match_table(plan, found.group(1)), int(found.group(2))
    if name is None or index >= len(plan.column_blocks(name)):
        return None
    return name, index


def _column_split_error(plan, name, full_name):
    """The ValueError for `de.get_variable(full_name)` of a table the plan splits by columns."""
    blocks = plan.column_blocks(name)
    return ValueError(
        f"de.Variable {full_name!r}: the placement plan splits table {name!r} by columns into "
        f"{len(blocks)} blocks (widths {[w for w, _ in blocks]} on "
        f"{[d for _, d in blocks]}); one de.Variable cannot hold column blocks. Build it with "
        f"placement.column_split.column_split_variables(plan, {name!r}, ...) or the Keras layer "
        f"placement.column_split.ColumnSplitEmbedding(plan, {name!r}, ...)")


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
        if name is not None and plan.column_blocks(name):
            raise _column_split_error(plan, name, full_name)
        block = match_block(plan, full_name) if name is None else None
        if block is not None:   # a variable of column_split.py: its block's device
            device = plan.column_blocks(block[0])[block[1]][1]
            logging.info("placing %s (plan table %s, column block %d) on %s", full_name,
                         block[0], block[1], device)
            return [device], None
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
    """Within the scope `de.get_variable` takes devices and row slices from `plan` (and raises
    ValueError for a table the plan splits by columns: see `column_split.py`).

    Scopes nest; the innermost with an opinion wins.
    """
    from tfra_dynamic_embedding import scopes  # pylint: disable=import-outside-toplevel
    with scopes.placement_scope(plan_resolver(plan, strict=strict)):
        yield plan


def shard_devices(var):
    """Device of each shard table's resource handle of a `de.Variable` (for checks)."""
    return [table.resource_handle.device for table in var.tables]
