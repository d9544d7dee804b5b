"""The key-value table interface every backend implements, and how a Variable asks for tables.

A `KVTable` is one shard of a `de.Variable`: a hash table from keys to rows of `dim` values, living
on one device as a TensorFlow resource. All methods take 1-D keys and `[N, dim]` rows and return
tensors or ops, so they work in eager mode, inside `tf.function` and in `tf.compat.v1` graphs.
Tables know nothing of training, partitioning or checkpoint layout: `de.Variable` does that.

Rows of keys a table does not hold come from an `InitSpec`, a description of the initializer
that goes down to the table (`lookup_or_init`, `find_or_insert`): each backend decides itself how
to draw it -- the native one in its fused lookup kernel, the built-in one with TF ops -- and
nothing calls back up into the Variable.

Example (any backend):
    >>> from tfra_dynamic_embedding.tables import BuiltinKVCreator
    >>> table = BuiltinKVCreator().create(tf.int64, tf.float32, dim=4, name="t", device="/CPU:0")
    >>> _ = table.insert(tf.constant([1, 2], tf.int64), tf.ones([2, 4]))
    >>> keys = tf.constant([1, 7], tf.int64)
    >>> rows, exists = table.lookup_with_exists(keys, tf.zeros([2, 4]))
    >>> rows.numpy()[:, 0], exists.numpy()
    (array([1., 0.], dtype=float32), array([ True, False]))
    >>> rows, exists = table.lookup_or_init(keys, InitSpec("normal", dim=4, a=0.0, b=0.01, seed=3))
    >>> rows.shape, exists.numpy()
    (TensorShape([2, 4]), array([ True, False]))
"""

import abc
import dataclasses
import itertools
import math
import weakref
from typing import Callable, Optional, Tuple

import tensorflow as tf

from tfra_dynamic_embedding import _tf_private
from tfra_dynamic_embedding.tables import keyed_random

_table_ids = itertools.count()

# The kinds of initial rows a backend may draw itself (the native kernels do), and "custom":
# rows only `make_rows` can make.
CONSTANT, UNIFORM, NORMAL, TRUNCATED_NORMAL, CUSTOM = (
    "constant", "uniform", "normal", "truncated_normal", "custom")
INIT_KINDS = (CONSTANT, UNIFORM, NORMAL, TRUNCATED_NORMAL, CUSTOM)


@dataclasses.dataclass(frozen=True, eq=False)
class InitSpec:
    """How a table makes the initial rows of keys it does not hold: a description (plain data),
    which each backend draws its own way (`initializers.describe` makes it from a Variable's
    `initializer`).

    kind: "constant" (every column `a`, or the `[dim]` `row`), "uniform" in [a, b), "normal"
      (mean a, stddev b), "truncated_normal" (mean a, stddev b, within two stddev, as TF's), or
      "custom" (rows from `make_rows` only, e.g. a VarianceScaling or a user's callable).
    seed: the random kinds' seed. keyed: rows a pure function of (seed, key), the same on every
      backend (tables/keyed_random.py's recipe; what a seed the user gave means). Unkeyed random
      rows are fresh draws (the native kernels' fast generator under `seed`).
    make_rows: None, or `fn(keys) -> [size(keys), dim]` rows by TF ops, which backends that do
      not draw the kind themselves use: the Variable's initializer as TF draws it (stateful
      draws for unseeded initializers, a VarianceScaling's fan), or a constant the fields cannot
      hold exactly (integer or text rows, a graph tensor). It is data handed down: it calls TF
      and the user's initializer, never the Variable. Without it, `rows` draws from the fields.
    equal_rows: every row is the same (a constant kind, or a custom constant): a backend may ask
      for rows of any keys, e.g. default rows for one find. Otherwise `make_rows` is called once
      per op with exactly the distinct missing keys.
    dim, dtype: the rows' width and dtype.

    Example:
        >>> from tfra_dynamic_embedding.tables.native import NativeKVCreator
        >>> table = NativeKVCreator().create(tf.int64, tf.float32, dim=8, name="t")
        >>> spec = InitSpec("normal", dim=8, a=0.0, b=0.01, seed=7, keyed=True)
        >>> rows, exists = table.lookup_or_init(tf.constant([3], tf.int64), spec)  # fused kernel
        >>> by_tf = spec.rows(tf.constant([3], tf.int64))     # the same row of key 3, by TF ops
        >>> bool(tf.reduce_all(tf.abs(rows - by_tf) < 1e-6))
        True
    """
    kind: str
    dim: Optional[int] = None
    dtype: tf.DType = tf.float32
    a: float = 0.0
    b: float = 0.0
    row: Optional[Tuple[float, ...]] = None
    seed: int = 0
    keyed: bool = False
    make_rows: Optional[Callable] = None
    equal_rows: bool = False

    def __post_init__(self):
        if self.kind not in INIT_KINDS:
            raise ValueError(f"kind must be one of {INIT_KINDS}; got {self.kind!r}")
        object.__setattr__(self, "dtype", tf.as_dtype(self.dtype))
        if self.kind == CUSTOM:
            if not callable(self.make_rows):
                raise ValueError(f"a custom InitSpec needs make_rows; got {self.make_rows!r}")
            return
        object.__setattr__(self, "a", float(self.a))
        object.__setattr__(self, "b", float(self.b))
        object.__setattr__(self, "seed", int(self.seed))
        if self.row is not None:
            if self.kind != CONSTANT:
                raise ValueError(f"row is for constant initializers; got kind {self.kind!r}")
            object.__setattr__(self, "row", tuple(float(v) for v in self.row))
            if self.dim is not None and len(self.row) != self.dim:
                raise ValueError(f"row must have shape [dim] = [{self.dim}]; got "
                                 f"[{len(self.row)}]")
        if self.kind in (CONSTANT, CUSTOM):
            return
        if not (math.isfinite(self.a) and math.isfinite(self.b)):
            raise ValueError(f"a {self.kind} initializer needs finite parameters; got "
                             f"a={self.a}, b={self.b}")
        if self.kind == UNIFORM and not self.b > self.a:
            raise ValueError(f"maxval must be > minval for a uniform initializer; got "
                             f"minval={self.a}, maxval={self.b}")
        if self.kind != UNIFORM and self.b < 0:
            raise ValueError(f"stddev must be >= 0 for a {self.kind} initializer; got {self.b}")

    @property
    def constant(self):
        """Whether every row is the same."""
        return self.kind == CONSTANT or self.equal_rows

    def rows(self, keys):
        """The `[size(keys), dim]` initial rows of 1-D `keys`, by TF ops (`make_rows` if given)."""
        if self.make_rows is not None:
            return self.make_rows(keys)
        if self.dim is None:
            raise ValueError("an InitSpec needs `dim` to draw rows with TF ops")
        if self.kind == CONSTANT:
            if self.row is not None:
                return tf.tile(tf.cast(tf.constant([self.row], tf.float64), self.dtype),
                               tf.stack([tf.size(keys), 1]))
            return tf.fill(tf.stack([tf.size(keys), self.dim]),
                           tf.cast(tf.constant(self.a, tf.float64), self.dtype))
        return keyed_random.keyed_rows(keys, self.kind, self.a, self.b, self.seed, self.dim,
                                       self.dtype)

    def __repr__(self):
        name = type(self).__name__
        if self.kind == CUSTOM:
            return f"{name}('custom', {self.make_rows!r})"
        if self.kind == CONSTANT:
            value = self.a if self.row is None else f"row[{len(self.row)}]"
            return f"{name}('constant', {value})"
        return (f"{name}({self.kind!r}, a={self.a}, b={self.b}, seed={self.seed}, "
                f"keyed={self.keyed})")


def as_init_spec(init, dim, dtype):
    """`init` as an InitSpec: itself, or a plain `make_rows(keys)` callable as a custom one (the
    tables' own API accepts either)."""
    if isinstance(init, InitSpec):
        return init
    if callable(init):
        return InitSpec(CUSTOM, dim=dim, dtype=dtype, make_rows=init)
    raise TypeError(f"an initializer must be an InitSpec or a callable make_rows(keys); got "
                    f"{init!r}")


class _AbstractResourceMeta(type(tf.saved_model.experimental.TrackableResource), abc.ABCMeta):
    """TrackableResource's metaclass plus ABCMeta, so missing methods fail at construction."""


class KVTable(tf.saved_model.experimental.TrackableResource, metaclass=_AbstractResourceMeta):
    """One shard table. Subclasses create the resource in `_create_resource`.

    Checkpointing is the Variable's job (it re-partitions on restore), so a KVTable must not
    save itself: it has no `_serialize_to_tensors`.
    """

    # Whether a SavedModel of the table's variable holds its rows. A table whose rows live
    # outside the process (Redis) says False: the SavedModel's lookups read them where they are.
    saved_model_holds_rows = True

    def __init__(self, key_dtype, value_dtype, dim, name, device="", shared_name=None):
        super().__init__(device=device)
        self.key_dtype = tf.as_dtype(key_dtype)
        self.value_dtype = tf.as_dtype(value_dtype)
        self.dim = int(dim)
        self.name = name
        self._device = device
        # In eager mode (also when lifted out of a tf.function being traced) an unnamed table
        # gets a unique shared name, else two tables on one device would share storage, and it
        # is destroyed with this object. A table the user shares by name is never destroyed by
        # us; in a v1 graph an unnamed table is shared by node name (see `_create_resource`).
        self._owns_resource = shared_name is None and tf.executing_eagerly()
        if self._owns_resource:
            shared_name = f"{op_name(name)}_{next(_table_ids)}"
        self._shared_name = shared_name
        self._owner = None   # weakref.ref to the de.Variable a SavedModel of this table holds

    # A SavedModel written with TF's default options keeps no device placements (so a model
    # trained on parameter servers loads in one process): while it is written, the table's
    # resource and the ops of the functions traced for it name no device.
    @property
    def device(self):
        """The device of the table's resource ("" while a SavedModel without devices is
        written)."""
        return "" if _tf_private.saving_without_devices() else self._device

    @property
    def _resource_device(self):
        return "" if _tf_private.saving_without_devices() else self._resource_device_name

    @_resource_device.setter
    def _resource_device(self, device):   # TrackableResource's constructor sets it
        self._resource_device_name = device

    def set_owner(self, variable):
        """Records `variable` (a de.Variable) as the one this table is a shard of, which a
        SavedModel of the table holds too; None for a table whose variable serving does not need
        (the variable says which: an optimizer slot's)."""
        self._owner = None if variable is None else weakref.ref(variable)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        owner = self._owner() if self._owner is not None else None
        if save_type == "savedmodel" and owner is not None:
            # The variable saves this table's rows (see the class docstring). Keras 3's
            # `model.export()` keeps only the TrackableResources it finds under the model, so
            # without this edge its SavedModel would hold empty tables. (A SavedModel of the
            # model itself has the slot tables through its optimizer.)
            children = dict(children, de_variable=owner)
        return children

    def _destroy_resource(self):
        # Runs eagerly when this object dies. When traced (a SavedModel's destroyer function) it
        # does nothing, like stock TF tables: a loaded model keeps serving from its tables even
        # if the Python object returned by tf.saved_model.load is dropped.
        if self._owns_resource and tf.executing_eagerly():
            tf.raw_ops.DestroyResourceOp(resource=self.resource_handle, ignore_lookup_error=True)

    @abc.abstractmethod
    def lookup(self, keys, default_rows):
        """Rows for `keys`; a missing key i gets `default_rows[i]`. Never inserts."""

    @abc.abstractmethod
    def lookup_with_exists(self, keys, default_rows):
        """(rows, exists): like `lookup` plus a bool mask of the keys present. Never inserts."""

    def contains(self, keys):
        """A bool mask of the keys present. Never inserts; backends may skip reading rows."""
        keys = tf.convert_to_tensor(keys)
        return self.lookup_with_exists(keys, tf.zeros([tf.size(keys), self.dim],
                                                      self.value_dtype))[1]

    def lookup_or_init(self, keys, init, return_exists=True):
        """(rows, exists) without inserting: missing keys get initial rows of `init` (an
        `InitSpec`, or a `make_rows(keys)` callable); exists is None when not `return_exists`.

        This generic form draws with TF ops: a constant's rows are the defaults of one find;
        other rows are made once, for the distinct missing keys (a repeated key gets one row).
        Backends override it to draw the kinds they can in their own kernels.
        """
        init = as_init_spec(init, self.dim, self.value_dtype)
        with tf.device(self.device):
            if init.constant:
                defaults = tf.cast(init.rows(keys), self.value_dtype)
                if return_exists:
                    return self.lookup_with_exists(keys, defaults)
                return self.lookup(keys, defaults), None
            rows, exists = self._lookup_or_zeros(keys)
            missing = tf.where(tf.logical_not(exists))
            unique_keys, index = tf.unique(tf.gather_nd(keys, missing))
            new_rows = tf.cast(init.rows(unique_keys), self.value_dtype)
            rows = tf.tensor_scatter_nd_update(rows, missing, tf.gather(new_rows, index))
            return rows, exists if return_exists else None

    def _lookup_or_zeros(self, keys):
        """(rows, exists) with zero rows for missing keys (backends may skip the `[N, dim]`
        default)."""
        return self.lookup_with_exists(keys, tf.zeros([tf.size(keys), self.dim], self.value_dtype))

    @abc.abstractmethod
    def find_or_insert(self, keys, init):
        """(rows, exists): missing keys are inserted with initial rows of `init` (an `InitSpec`,
        or a `make_rows(keys)` callable).

        Only the distinct missing keys draw, exactly those (a row may depend on its key, e.g. a
        seeded draw).
        """

    @abc.abstractmethod
    def insert(self, keys, values):
        """Upsert: set the rows of `keys` to `values`."""

    @abc.abstractmethod
    def accum(self, keys, deltas):
        """Add `deltas` to the rows of `keys`; a missing key is inserted with its delta."""

    @abc.abstractmethod
    def remove(self, keys):
        """Delete `keys` (missing keys are ignored)."""

    @abc.abstractmethod
    def clear(self):
        """Delete every key."""

    @abc.abstractmethod
    def size(self):
        """Number of keys, an int64 scalar."""

    @abc.abstractmethod
    def export(self):
        """(keys, values) of the whole shard, `[n]` and `[n, dim]`."""

    @abc.abstractmethod
    def import_(self, keys, values):
        """Replace the whole content of the shard with `keys`/`values`."""


class KVCreator(metaclass=abc.ABCMeta):
    """Makes the shard tables of a Variable; `de.Variable(kv_creator=...)` selects the backend."""

    @abc.abstractmethod
    def create(self, key_dtype, value_dtype, dim, name, device="", shared_name=None, init_size=0):
        """Return a new `KVTable` whose resource lives on `device`."""

    def default_eviction(self, shard_num):
        """None, or the eviction hook (hooks.py) a trainable variable of `shard_num` shards made
        with this creator gets when it is given no `eviction` (TFRA's HKV creator, online/hkv.py,
        bounds every shard)."""
        del shard_num
        return None


def op_name(name):
    """A valid TF op name from a table or variable name (which may hold scope slashes)."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return cleaned.lstrip("._-") or "table"


def exists_like_keys(exists, keys, owner):
    """`exists` as a bool tensor, checked to have the shape of `keys` (statically where both
    shapes are known, else when the op runs), so a mask is never silently broadcast.

    Example:
        >>> keys = tf.constant([4, 5], tf.int64)
        >>> exists_like_keys([True, False], keys, "table t").numpy()
        array([ True, False])
        >>> exists_like_keys([True], keys, "table t")
        Traceback (most recent call last):
        ...
        ValueError: exists must have the shape of keys (2,); got (1,)
    """
    exists = tf.convert_to_tensor(exists, tf.bool, name="exists")
    if not exists.shape.is_compatible_with(keys.shape):
        raise ValueError(f"exists must have the shape of keys {keys.shape}; got {exists.shape}")
    if exists.shape.is_fully_defined() and keys.shape.is_fully_defined():
        return exists
    with tf.control_dependencies([tf.debugging.assert_equal(
            tf.shape(exists), tf.shape(keys),
            message=f"exists must have the shape of keys for {owner}")]):
        return tf.identity(exists)
