"""kolo.tensorflow with process sets and Adasum (workers/tf_process_sets.py,
3 ranks: the set of the even ranks leaves rank 1 out), eager and inside
tf.function, against float64 references of the members' inputs."""

import importlib.util
import sys

import pytest

from conftest import check_cases, run_worker

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason=f"{sys.executable} has no tensorflow "
                                "(scripts/setup.sh installs tensorflow-cpu into .venv)")


def test_tf_process_sets_and_adasum():
    p = run_worker(3, "tf_process_sets.py", "20261207", timeout=300,
                   env={"KOLO_STALL_SHUTDOWN_SECONDS": "30"})
    names, _ = check_cases(p, 3, minimum=4)
    assert names == ["collectives", "tape", "adasum", "outsider"]
