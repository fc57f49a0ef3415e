"""kolo.keras on Keras 3: ``fit`` with DistributedOptimizer on N ranks equals
single-process training on the concatenated batch, on the tensorflow,
torch and jax backends (tests/python/workers/keras_fit.py); with gradient
clipping (averaged before clipping), a LossScaleOptimizer inside, and two
backward passes per step (reduced once per two passes: half the submissions
of one pass per step). BroadcastGlobalVariablesCallback makes every rank
start from rank 0's weights and MetricAverageCallback gives every rank the
same epoch losses; a model that has no weights before its first step
(unbuilt) gets rank 0's after it. The tf_keras cases run kolo.tensorflow.keras on the
legacy tf.keras (TF_USE_LEGACY_KERAS=1), the flavour Horovod's TF2 Keras
examples are written for."""

import importlib.util
import sys

import pytest

from conftest import results, run_worker

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("keras", "tensorflow")),
    reason=f"{sys.executable} lacks keras or tensorflow (scripts/setup.sh installs them)")

# Each launch runs its cases one after another in the same workers (Keras,
# TensorFlow and torch take most of a launch to import).
GROUPS = [("tensorflow", "plain,clipnorm,lossscale,bpps2", 2),
          ("torch", "plain,clipnorm,lossscale,bpps2", 2),
          ("jax", "plain,clipnorm,bpps2", 2),
          ("tf_keras", "plain,clipnorm,unbuilt", 2)] + \
    [(b, "plain,processset", 3) for b in ("tensorflow", "torch", "jax")]


@pytest.mark.parametrize("backend,cases,np_", GROUPS)
def test_fit_equals_the_concatenated_batch(backend, cases, np_):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"no {backend}")
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "KOLO_STALL_SHUTDOWN_SECONDS": "30"}
    if backend == "tf_keras":  # kolo.tensorflow.keras on tf.keras = tf_keras 2.x
        env["TF_USE_LEGACY_KERAS"] = "1"
    else:
        env["KERAS_BACKEND"] = backend
    p = run_worker(np_, "keras_fit.py", cases, timeout=300, env=env)
    res = results(p)
    assert sorted(res) == list(range(np_))
    for case in cases.split(","):
        rep = [next(x for x in res[r] if x["case"] == case) for r in range(np_)]
        if case == "processset":  # the even ranks average among themselves
            rep = [x for x in rep if x["member"]]
            assert len(rep) == (np_ + 1) // 2
        for r, x in enumerate(rep):
            assert x["backend"] == backend
            assert x["diff"] <= 1e-5 * max(1.0, x["scale"]), \
                f"{case}: rank {r}: weights differ from single-process training by " \
                f"{x['diff']:.3g}"
            assert x["checksum"] == rep[0]["checksum"], \
                f"{case}: rank {r} has other weights than rank 0"
            assert x["losses"] == rep[0]["losses"], f"{case}: rank {r}: epoch losses were " \
                "not averaged"
    if "bpps2" in cases:  # two passes per reduction: half of plain's submissions
        for r in range(np_):
            sent = {x["case"]: x["reductions"] for x in res[r]}
            assert sent["plain"] > 0 and sent["bpps2"] * 2 == sent["plain"], \
                f"rank {r}: optimizer reductions per case {sent}"
