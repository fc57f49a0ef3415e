"""Local MNIST for Horovod's TensorFlow examples, which call
``tf.keras.datasets.mnist.load_data(path='mnist-<rank>.npz')``: that
downloads the data set and checks its SHA-256, so no stand-in file in the
Keras cache would pass. With this folder first on PYTHONPATH and
KOLO_EXAMPLE_MNIST naming a folder of MNIST IDX files (make_data.py mnist
writes them under ROOT/MNIST/raw), ``load_data`` of tf_keras and of Keras 3
returns those files instead, as the same uint8 arrays, shaped as Keras's
are. The examples themselves stay unchanged; without KOLO_EXAMPLE_MNIST this
module does nothing. Standard library and numpy only."""

import importlib.abc
import importlib.machinery
import os
import struct
import sys

_MODULES = ("tf_keras.src.datasets.mnist", "keras.src.datasets.mnist",
            "keras.datasets.mnist", "tf_keras.datasets.mnist")


def _read_idx(path):
    import numpy as np

    with open(path, "rb") as f:
        zero, dtype, ndim = struct.unpack(">HBB", f.read(4))
        if zero != 0 or dtype != 0x08:
            raise ValueError(f"{path}: not an IDX file of unsigned bytes")
        dims = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims).copy()


def load_data(path="mnist.npz"):
    """What keras.datasets.mnist.load_data returns, from the local files."""
    raw = os.environ["KOLO_EXAMPLE_MNIST"]
    split = [tuple(_read_idx(os.path.join(raw, f"{s}-{kind}-ubyte"))
                   for kind in ("images-idx3", "labels-idx1")) for s in ("train", "t10k")]
    return split[0], split[1]


class _Loader(importlib.abc.Loader):
    """Runs the real module, then puts the local load_data in it."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        if hasattr(module, "load_data"):
            module.load_data = load_data


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader)
        return spec


if os.environ.get("KOLO_EXAMPLE_MNIST"):
    sys.meta_path.insert(0, _Finder())
