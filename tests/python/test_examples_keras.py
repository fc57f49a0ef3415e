"""examples/keras/train_digits.py on 4 ranks, on each Keras backend: it
reaches its target accuracy (the digits when scikit-learn's file is there,
else the synthetic stand-in) and every rank ends with the same weights
(the example checks both and exits 1 otherwise; here the printed figures
are checked again)."""

import importlib.util
import re
import sys

import pytest

from conftest import PYTHON, REPO, kolorun

pytestmark = pytest.mark.skipif(importlib.util.find_spec("keras") is None,
                                reason=f"{sys.executable} has no keras")


@pytest.mark.parametrize("backend", ["tensorflow", "torch", "jax"])
def test_train_digits_keras(backend):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"no {backend}")
    p = kolorun(4, [PYTHON, str(REPO / "examples" / "keras" / "train_digits.py")], timeout=300,
                env={"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"})
    ranks = re.findall(r"train_digits: rank (\d+): backend (\w+), .*test accuracy ([0-9.]+), "
                       r"weights sha256 ([0-9a-f]{16})", p.stdout)
    assert sorted(int(r[0]) for r in ranks) == [0, 1, 2, 3], p.stdout[-3000:]
    assert {r[1] for r in ranks} == {backend}
    assert len({r[3] for r in ranks}) == 1, f"ranks hold different weights: {ranks}"
    assert all(float(r[2]) >= 0.9 for r in ranks), ranks
    assert "train_digits: PASS" in p.stdout
