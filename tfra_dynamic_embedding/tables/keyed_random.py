"""Random initial rows that are a pure function of (seed, key), in stock TF ops.

A seeded initializer must give a new key the same row whichever batch, shard count, backend or
process first creates it, and different keys different rows. A counter-based generator does this
with no state: for key k and column j,

    h    = mix64(k)                          int keys (sign-extended to 64 bits); a string key's
                                             FarmHash fingerprint (`tf.strings.to_hash_bucket_fast`)
    s_j  = h ^ mix64(seed + SALT) + (j + 1) * GOLDEN      (uint64 arithmetic, mod 2^64)
    u_j  = ((splitmix64(s_j) >> 11) + 0.5) / 2^53         uniform in the open interval (0, 1)

mix64 is the Murmur3 finaliser and splitmix64 Vigna's output function; together they are the
native kernels' `RowRng` (cc/ops/de_util.h). Normals are `ndtri(u)`, truncated normals
`ndtri(Phi(-2) + (Phi(2) - Phi(-2)) u)`, rows `a + b z` (uniform: `a + (b - a) u`) in float64
with a and b as given, then cast. The native kernels draw by this same recipe when asked to
(`NativeInitializer(keyed=True)`, cc/ops/de_keyed.h, which is what seeded user initializers get):
their rows equal these bit for bit, for int and string keys.
Everything is int64/float64 element-wise ops (wrapping int64 products carry the uint64 bits), so
it runs in eager mode, tf.function and v1 graphs on any device.

Example:
    >>> keys = tf.constant([3, 9], tf.int64)
    >>> u = keyed_uniforms(keys, seed=7, dim=4)
    >>> u.shape, u.dtype, bool(tf.reduce_all((u > 0) & (u < 1)))
    (TensorShape([2, 4]), tf.float64, True)
    >>> rows = keyed_rows(keys, "normal", 0.0, 0.1, seed=7, dim=4, dtype=tf.float32)
    >>> again = keyed_rows(keys[:1], "normal", 0.0, 0.1, seed=7, dim=4, dtype=tf.float32)
    >>> bool(tf.reduce_all(rows[0] == again[0]))     # a key's row depends on the key only
    True
"""

import math

import tensorflow as tf

KINDS = ("uniform", "normal", "truncated_normal")

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15      # splitmix64's increment
_SEED_SALT = 0x632BE59BD9B4E019   # keeps seed 0 from leaving the key hash unchanged
_SPLITMIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_MURMUR = (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53)
# TF's truncated normal keeps draws within two standard deviations: u maps into [Phi(-2), Phi(2)].
_PHI_LO = 0.5 * math.erfc(2.0 / math.sqrt(2.0))
_PHI_HI = 1.0 - _PHI_LO


def _signed(u):
    """The int64 with the bits of the uint64 `u` (a Python int)."""
    u &= _MASK64
    return u - (1 << 64) if u >= 1 << 63 else u


def _mix64_int(x):
    """mix64 of a Python int, for the seed (a constant of the graph)."""
    x &= _MASK64
    x ^= x >> 33
    x = (x * _MURMUR[0]) & _MASK64
    x ^= x >> 33
    x = (x * _MURMUR[1]) & _MASK64
    return x ^ (x >> 33)


def _srl(x, shift):
    """Logical right shift of int64 bits (TF's right_shift is arithmetic on signed ints)."""
    return tf.bitwise.bitwise_and(tf.bitwise.right_shift(x, tf.constant(shift, tf.int64)),
                                  tf.constant((1 << (64 - shift)) - 1, tf.int64))


def _xor_shift(x, shift):
    return tf.bitwise.bitwise_xor(x, _srl(x, shift))


def _mix64(x):
    x = _xor_shift(x, 33) * _signed(_MURMUR[0])
    x = _xor_shift(x, 33) * _signed(_MURMUR[1])
    return _xor_shift(x, 33)


def key_hash(keys):
    """A well-mixed int64 per key of a 1-D int32/int64/string tensor (stable across processes)."""
    keys = tf.convert_to_tensor(keys)
    if keys.dtype == tf.string:
        # FarmHash Fingerprint64 (stable by TF's contract) reduced below 2^63 - 1, then mixed.
        return _mix64(tf.strings.to_hash_bucket_fast(keys, (1 << 63) - 1))
    if keys.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"keys must be int32, int64 or string to draw keyed rows; "
                        f"got {keys.dtype.name}")
    return _mix64(tf.cast(keys, tf.int64))


def keyed_uniforms(keys, seed, dim):
    """`[size(keys), dim]` float64 uniforms in (0, 1), a pure function of (seed, key, column)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int; got {seed!r}")
    base = tf.bitwise.bitwise_xor(key_hash(tf.reshape(keys, [-1])),
                                  _signed(_mix64_int(seed + _SEED_SALT)))
    steps = tf.constant([_signed((j + 1) * _GOLDEN) for j in range(dim)], tf.int64)
    z = base[:, tf.newaxis] + steps                       # wraps mod 2^64
    z = _xor_shift(z, 30) * _signed(_SPLITMIX[0])
    z = _xor_shift(z, 27) * _signed(_SPLITMIX[1])
    z = _xor_shift(z, 31)
    return (tf.cast(_srl(z, 11), tf.float64) + 0.5) * 2.0 ** -53


def _float64(x):
    """A number in full double precision (tf.cast of a Python float would round it to float32
    first), or a run-time scalar cast to float64."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return tf.constant(float(x), tf.float64)
    return tf.cast(x, tf.float64)


def keyed_rows(keys, kind, a, b, seed, dim, dtype):
    """`[size(keys), dim]` rows of `dtype`: uniform in [a, b), normal(mean a, stddev b), or
    truncated_normal(a, b) (within two stddev, as `tf.random.truncated_normal`)."""
    u = keyed_uniforms(keys, seed, dim)
    a, b = _float64(a), _float64(b)
    if kind == "uniform":
        rows = a + (b - a) * u
    elif kind == "normal":
        rows = a + b * tf.math.ndtri(u)
    elif kind == "truncated_normal":
        rows = a + b * tf.math.ndtri(_PHI_LO + (_PHI_HI - _PHI_LO) * u)
    else:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    return tf.cast(rows, dtype)
