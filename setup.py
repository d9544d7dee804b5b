"""pip build of tfra-dynamic-embedding: the Python packages plus the native op library.

The op library `tfra_dynamic_embedding/tables/_tfra_de_ops.so` is compiled from `cc/ops/*.cc`
against the TensorFlow that is already installed, so pip must not build in an isolated env:

    pip install --no-build-isolation -e .     # editable: the .so lands in the source tree
    pip install --no-build-isolation .        # regular: the .so goes into the (platform) wheel

TensorFlow is deliberately not in install_requires: `tensorflow-cpu` and `tensorflow` are different
distributions providing the same module, and requiring one would make pip pull the other.
Set TFRA_DE_SKIP_OPS=1 to install without building the library (the package still imports; the
native backend is then unavailable). The compile logic lives in tools/build_ops.py.
"""

import os
import re
import sys

from setuptools import Distribution, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import build_ops  # noqa: E402  (tools/build_ops.py)

DEFAULT_VERSION = "0.1.0"


def _version():
    """__version__ from tfra_dynamic_embedding/__init__.py if it defines one (read, not imported)."""
    try:
        with open(os.path.join(ROOT, "tfra_dynamic_embedding", "__init__.py")) as f:
            match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
    except OSError:
        match = None
    return match.group(1) if match else DEFAULT_VERSION


def _long_description():
    try:
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


class BinaryDistribution(Distribution):
    """Always a platform wheel: it carries a compiled library built for this TF and platform."""

    def has_ext_modules(self):
        return True


class BuildOps(build_ext):
    """`build_ext` that builds the op library with tools/build_ops.py instead of Extensions."""

    description = "build the native op library from cc/ops/*.cc against the installed TensorFlow"

    def initialize_options(self):
        super().initialize_options()
        self._built = []

    def run(self):
        if os.environ.get("TFRA_DE_SKIP_OPS", "") not in ("", "0"):
            print("[build_ops] TFRA_DE_SKIP_OPS set: not building the op library")
            return
        # Editable installs (PEP 660 sets editable_mode; `build_ext --inplace` sets inplace)
        # keep the library in the source tree, next to tables/native.py.
        inplace = self.inplace or getattr(self, "editable_mode", False)
        base = ROOT if inplace else os.path.abspath(self.build_lib)
        try:
            # The main op library, and the Redis tables' one where hiredis is installed.
            self._built = build_ops.build_all(ROOT, jobs=self.parallel or None, base=base)
        except build_ops.BuildError as e:
            raise SystemExit(f"error: building the op library failed: {e}")

    def get_outputs(self):
        return list(self._built)

    def get_output_mapping(self):
        return {}


setup(
    name="tfra-dynamic-embedding",
    version=_version(),
    description=("Dynamic embeddings for TensorFlow recommenders: hash-table embeddings that grow, "
                 "native C++ kernels and a learned table-placement planner"),
    long_description=_long_description(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(
        where=ROOT,
        include=[
            "tfra_dynamic_embedding",
            "tfra_dynamic_embedding.*",
            "tensorflow_recommenders_addons",
            "tensorflow_recommenders_addons.*",
        ],
    ),
    package_data={
        # Shipped data (e.g. pretrained placement models). The op library is added by BuildOps.
        "tfra_dynamic_embedding": [
            "**/*.json", "**/*.jsonl", "**/*.jsonl.gz", "**/*.npz", "**/*.npy", "**/*.csv",
            "**/*.txt", "**/*.keras", "**/*.h5",
        ],
    },
    install_requires=["numpy", "absl-py"],
    extras_require={
        # Pick the TensorFlow flavour explicitly; neither is required (see module docstring).
        "cpu": ["tensorflow-cpu>=2.16"],
        "gpu": ["tensorflow>=2.16"],
        "placement": ["matplotlib"],
        # Serving also needs `tensorflow-serving-api` (TF Serving's gRPC protos), which requires
        # the `tensorflow` distribution: install it with `pip install --no-deps`, as tf-keras
        # (README, "Installing into another environment").
        "serving": ["aiohttp>=3.9", "grpcio>=1.60", "prometheus_client"],
        "test": ["pytest", "hypothesis", "matplotlib", "aiohttp>=3.9", "requests", "grpcio>=1.60",
                 "prometheus_client"],
    },
    entry_points={
        "console_scripts": ["tfra-de = tfra_dynamic_embedding.cli:main"],
    },
    cmdclass={"build_ext": BuildOps},
    distclass=BinaryDistribution,
    zip_safe=False,
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: C++",
        "Operating System :: POSIX :: Linux",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
