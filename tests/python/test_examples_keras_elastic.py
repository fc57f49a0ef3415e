"""examples/keras/train_digits_elastic.py (Keras 3 fit inside
kolo.keras.elastic.run) through a SIGKILL and a join, on the tensorflow and
jax backends: 3 workers train; after step 5 one is SIGKILLed; the 2
survivors re-form at size 2 and hold; a worker added by `kolorun -np 1`
joins and the 3 re-form, the joiner starting from the survivors' step. Both
kolorun exit 0 and the final 3 ranks hold identical weights (hashes printed
by each rank, compared here) with the target accuracy."""

from __future__ import annotations

import importlib.util
import os
import re
import signal

import pytest

from conftest import REPO
from test_elastic import server  # noqa: F401 (a fixture)
from test_examples_elastic import Run

EXAMPLE = str(REPO / "examples" / "keras" / "train_digits_elastic.py")
NAME = "keras_digits_elastic"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="no keras")


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_keras_sigkill_then_join(server, backend):  # noqa: F811 (the fixture)
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"no {backend}")
    url, token = server
    launcher = ["--rendezvous", url, "--token-file", token, "--job", f"keras-{backend}",
                "--min-np", "2", "--max-np", "4"]
    args = ["--epochs", "6", "--hold-for-size", "3", "--slow-ms", "20"]
    env = {"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    job = Run(3, launcher, args, EXAMPLE, NAME, env)
    joiner = None
    try:
        pids = [int(job.wait(r"rank \d+ of \d+: pid (\d+)").group(1)) for _ in range(3)]
        at = int(job.wait(r"step (\d+) committed", lambda m: int(m.group(1)) >= 5).group(1))
        os.kill(pids[1], signal.SIGKILL)
        shrink = [job.wait(r"re-formed: size (\d+), rank (\d+), step (\d+)") for _ in range(2)]
        joiner = Run(1, launcher, args, EXAMPLE, NAME, env)
        joined = joiner.wait(r"rank (\d+) of (\d+): training from step (\d+)")
        grow = [job.wait(r"re-formed: size (\d+), rank (\d+), step (\d+)") for _ in range(2)]
        rc, rc_join = job.finish(), joiner.finish()
    except BaseException:
        job.kill()
        if joiner is not None:
            joiner.kill()
        raise
    try:
        assert (rc, rc_join) == (0, 0), f"exit statuses {rc}, {rc_join}"
        assert [int(m.group(1)) for m in shrink] == [2, 2]
        assert min(int(m.group(3)) for m in shrink) >= at - 1
        assert [int(m.group(1)) for m in grow] == [3, 3]
        assert {int(m.group(3)) for m in grow} == {int(joined.group(3))}
        assert int(joined.group(2)) == 3
        out = job.text() + joiner.text()
        hashes = re.findall(rf"{NAME}: rank (\d+): .* size 3, weights sha256 ([0-9a-f]{{16}})",
                            out)
        assert sorted(int(r) for r, _ in hashes) == [0, 1, 2], hashes
        assert len({h for _, h in hashes}) == 1, f"ranks hold different weights: {hashes}"
        assert f"{NAME}: PASS" in out
    except AssertionError as e:
        job.fail(f"check failed: {e}", joiner)
