"""The data of the digits examples (examples/keras/train_digits.py): the UCI
handwritten digits that scikit-learn ships (read with numpy and gzip;
sklearn is not imported; ``scripts/setup.sh --with-digits`` installs it),
or, without them, a synthetic stand-in; a fixed train/test split."""

from __future__ import annotations

import gzip
import importlib.util
import pathlib

import numpy as np

SPLIT_SEED = 20240601
TEST_FRACTION = 0.2


def digits_file() -> pathlib.Path:
    """scikit-learn's digits file: this interpreter's scikit-learn (located,
    not imported), else Debian's python3-sklearn."""
    rel = pathlib.Path("datasets", "data", "digits.csv.gz")
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        if (pathlib.Path(root) / rel).exists():
            return pathlib.Path(root) / rel
    return pathlib.Path("/usr/lib/python3/dist-packages/sklearn") / rel


def load(kind: str = "auto") -> tuple:
    """(x_train, y_train, x_test, y_test, description); kind is auto, digits
    or synthetic."""
    f = digits_file()
    if kind == "digits" or (kind == "auto" and f.exists()):
        if not f.exists():
            raise SystemExit(f"{f} is absent (scripts/setup.sh --with-digits, or --data "
                             f"synthetic)")
        with gzip.open(f, "rt") as fh:
            data = np.loadtxt(fh, delimiter=",", dtype=np.float32)
        x, y, what = data[:, :-1] / 16.0, data[:, -1].astype(np.int64), f"UCI digits ({f})"
    else:
        g = np.random.default_rng(7)
        centres = g.normal(0.0, 1.0, (10, 2, 64))
        y = g.integers(0, 10, 1797)
        x = (centres[y, g.integers(0, 2, 1797)] + g.normal(0.0, 1.2, (1797, 64)))
        x, y = x.astype(np.float32), y.astype(np.int64)
        what = "synthetic data (10 classes of 2 Gaussian blobs each in 64 dimensions)"
    perm = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_test = int(round(len(x) * TEST_FRACTION))
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te], what
