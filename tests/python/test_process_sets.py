"""Process sets: kolo.torch's hvd.add_process_set and process_set= on every
collective and on DistributedOptimizer (workers/ops_process_sets.py), checked
against float64 references of the members' inputs on 2, 3 and 4 ranks. The C
core's own tests (runtime/process_set_test.c) cover 2, 3, 4, 5 and 8 ranks."""

import pytest

from conftest import check_cases, requires_torch, run_worker

pytestmark = requires_torch


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_process_sets(np_):
    p = run_worker(np_, "ops_process_sets.py", "20261207", timeout=240,
                   env={"KOLO_STALL_SHUTDOWN_SECONDS": "30"})
    names, _ = check_cases(p, np_, minimum=11)
    assert names[0] == "add" and "optimizer" in names and names[-1] == "remove"
