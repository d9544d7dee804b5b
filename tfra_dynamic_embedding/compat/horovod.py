"""Horovod, as TFRA's `DEHvd*` utilities see it: the running `horovod.tensorflow`, if any.

This package trains across processes with TensorFlow's own runtime (parameter servers), not
Horovod; TFRA's Horovod-named utilities (`de.keras.callbacks`, `de.train.DEHvdSaver`) still work
in a process that Horovod launched, acting on rank 0 only, and as their plain Keras / TF
counterparts everywhere else.

Example (outside Horovod; under Horovod, docs/tfra_compatibility.md):
    >>> hvd = running()       # None unless `horovod.tensorflow` is imported and initialized
    >>> hvd is None, is_root()
    (True, True)
"""

import importlib
import sys

__all__ = ["running", "is_root", "require"]

_MODULE = "horovod.tensorflow"
_MISSING = ("Horovod is not installed (`import horovod.tensorflow` failed); {what} needs it: "
            "install Horovod built for this TensorFlow, or train across processes with "
            "parameter servers (docs/distributed.md)")


def running():
    """The `horovod.tensorflow` module when it is imported and `hvd.init()` ran, else None.

    Only a module the program already imported counts: importing Horovod here would load MPI
    into every process that merely asks."""
    hvd = sys.modules.get(_MODULE)
    if hvd is None:
        return None
    try:
        return hvd if hvd.is_initialized() else None
    except (AttributeError, ValueError):
        return None


def is_root():
    """True unless this process is a Horovod rank other than 0."""
    hvd = running()
    return hvd is None or hvd.rank() == 0


def require(what):
    """`horovod.tensorflow`, imported; a ValueError naming `what` when Horovod is missing."""
    try:
        return importlib.import_module(_MODULE)
    except ImportError as error:
        raise ValueError(_MISSING.format(what=what)) from error
