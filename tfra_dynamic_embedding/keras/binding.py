"""Which Keras a `de.keras.layers` layer belongs to: Keras 3 (`keras`) or tf_keras.

A process may hold both: `tf.keras` is Keras 3 unless `TF_USE_LEGACY_KERAS=1` was set before
TensorFlow's Keras loaded, and `import tf_keras` works either way. A layer must belong to the Keras
of the model that holds it, so the classes in `layers.py` hold the logic and name no Keras;
constructing one makes an instance of its subclass for one Keras (`bound_class`), chosen by
`resolve`, first rule that applies:

1. the class already derives from a Keras layer class (e.g. `type(layer)`): that Keras;
2. `keras=` is given ("keras", "tf_keras", or the module itself): that Keras;
3. the arguments hold objects of one Keras (an initializer, a dtype policy): that Keras;
4. otherwise the Keras that `tf.keras` is.

Example:
    >>> import tf_keras
    >>> import tensorflow_recommenders_addons.dynamic_embedding as de
    >>> layer = de.keras.layers.Embedding(8, initializer=tf_keras.initializers.Constant(0.1))
    >>> isinstance(layer, tf_keras.layers.Layer)                   # rule 3
    True
    >>> de.keras.layers.Embedding(8, keras="tf_keras").keras       # rule 2
    'tf_keras'
"""

import importlib
import inspect
import types

import tensorflow as tf

KERAS3 = "keras"
TF_KERAS = "tf_keras"
PACKAGES = (KERAS3, TF_KERAS)
REGISTERED_PACKAGE = "tfra_dynamic_embedding"   # Keras' registry: "<package>>Embedding"

_BOUND = {}   # (logic class, package) -> its subclass for that Keras


def package_of(obj):
    """"keras" or "tf_keras" when `obj` (an instance, tensor or class) comes from that Keras,
    else None."""
    cls = obj if isinstance(obj, type) else type(obj)
    for klass in cls.__mro__:
        top = (getattr(klass, "__module__", None) or "").split(".")[0]
        if top in PACKAGES:
            return top
    return None


def keras_module(package):
    """The Keras module of `package` ("keras" or "tf_keras"), imported on first use."""
    return importlib.import_module(package)


def default_package():
    """The Keras `tf.keras` is: tf_keras under TF_USE_LEGACY_KERAS=1, else Keras 3."""
    try:
        layer_class = tf.keras.layers.Layer
    except (ImportError, AttributeError) as error:   # neither Keras is installed
        raise ImportError("de.keras.layers needs Keras 3 (`keras`) or `tf_keras`") from error
    package = package_of(layer_class)
    if package is None:
        raise ImportError(f"tf.keras ({layer_class.__module__}) is neither Keras 3 nor tf_keras")
    return package


def parse_keras_argument(keras):
    """The package named by a layer's `keras=` argument (a name or the Keras module itself)."""
    if isinstance(keras, str) and keras in PACKAGES:
        return keras
    if isinstance(keras, types.ModuleType):   # also tf.keras, a lazily loaded module
        layer_class = getattr(getattr(keras, "layers", None), "Layer", None)
        package = package_of(layer_class) if isinstance(layer_class, type) else None
        if package is not None:
            return package
    raise ValueError(f"keras must be None, 'keras' (Keras 3), 'tf_keras' or one of those modules; "
                     f"got {keras!r}")


def resolve(cls, args, kwargs):
    """The package a layer of class `cls` constructed with `args`/`kwargs` belongs to (see the
    module docstring for the rule). Raises ValueError for a conflicting `keras=` or arguments
    that mix objects of both Kerases."""
    explicit = kwargs.get("keras")
    explicit = None if explicit is None else parse_keras_argument(explicit)
    own = package_of(cls)
    if own is not None:
        if explicit not in (None, own):
            raise ValueError(f"keras={kwargs['keras']!r} contradicts the class {cls.__name__}, "
                             f"a {own} layer")
        return own
    if explicit is not None:
        return explicit
    found = {}
    for name, value in _named_arguments(cls, args, kwargs):
        package = package_of(value)
        if package is not None:
            found.setdefault(package, []).append(name)
    if len(found) > 1:
        named = "; ".join(f"{p}: {', '.join(found[p])}" for p in PACKAGES)
        raise ValueError(f"{cls.__name__}'s arguments mix Keras 3 and tf_keras objects ({named}); "
                         f"pass keras='keras' or keras='tf_keras' to choose the layer's Keras")
    return next(iter(found)) if found else default_package()


def bound_class(cls, package, base="Layer", namespace="layers"):
    """`cls`'s subclass for one Keras: `(cls, <that Keras>.<namespace>.<base>)`, made once.

    It keeps `cls`'s name and module, so configs and summaries read as `cls`, and `isinstance`
    checks against `cls` (and its logic bases) hold for objects of either Keras.
    """
    key = (cls, package)
    if key not in _BOUND:
        module = keras_module(package)
        bound = type(cls.__name__, (cls, getattr(getattr(module, namespace), base)),
                     {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                      "__doc__": cls.__doc__})
        if namespace == "layers":
            # Configs (a `.keras` file, `to_json`) then name it "tfra_dynamic_embedding>Embedding",
            # and that Keras' `load_model` / `model_from_json` find it without `custom_objects`
            # (by the plain name tf_keras would make its own Embedding).
            module.saving.register_keras_serializable(package=REGISTERED_PACKAGE,
                                                      name=cls.__name__)(bound)
        _BOUND[key] = bound
    return _BOUND[key]


def class_for(cls, args, kwargs, base="Layer", namespace="layers"):
    """(class, package) an instance of `cls` constructed with `args` / `kwargs` is made of: `cls`
    itself when it is already bound to a Keras, else its `bound_class` for the Keras `resolve`
    chooses (what a logic class's `__new__` needs).

    Example:
        >>> from tfra_dynamic_embedding.keras.layers import Embedding
        >>> klass, package = class_for(Embedding, (8,), {"keras": "tf_keras"})
        >>> package, issubclass(klass, Embedding)
        ('tf_keras', True)
    """
    package = resolve(cls, args, kwargs)
    return (cls if package_of(cls) else bound_class(cls, package, base, namespace)), package


def register(classes):
    """Makes (and so registers) the class of each of `classes` (pairs of a logic class and its
    Keras base name) for each installed Keras now, for a saved config loaded before any such
    layer is constructed."""
    for package in PACKAGES:
        try:
            module = keras_module(package)
        except ImportError:
            continue
        if package == KERAS3 and not getattr(module, "__version__", "").startswith("3."):
            continue
        for cls, base in classes:
            bound_class(cls, package, base)


def _named_arguments(cls, args, kwargs):
    """(name, value) of each constructor argument, positional ones named by `cls.__init__`."""
    try:
        bound = inspect.signature(cls.__init__).bind_partial(None, *args, **kwargs)
    except TypeError:   # the constructor itself reports bad arguments
        return [(f"argument {i}", v) for i, v in enumerate(args)] + list(kwargs.items())
    named = []
    for name, value in list(bound.arguments.items())[1:]:
        kind = inspect.signature(cls.__init__).parameters[name].kind
        named += list(value.items()) if kind is inspect.Parameter.VAR_KEYWORD else [(name, value)]
    return named
