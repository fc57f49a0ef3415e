"""Adasum: kolo's op="adasum" on numpy arrays (workers/core_adasum.py, 2, 3,
4, 5 and 8 ranks) and kolo.torch's op=hvd.Adasum with DistributedOptimizer
(workers/torch_adasum.py, 2, 3 and 4 ranks), each checked against a float64
numpy implementation of the same tree (workers/_common.adasum_ref)."""

import pytest

from conftest import check_cases, requires_torch, run_worker


@pytest.mark.parametrize("np_", [2, 3, 4, 5, 8])
def test_core_adasum_matches_the_float64_tree(np_):
    p = run_worker(np_, "core_adasum.py", "20261207", timeout=240,
                   env={"KOLO_STALL_SHUTDOWN_SECONDS": "30"})
    check_cases(p, np_, minimum=6)


@requires_torch
@pytest.mark.parametrize("np_", [2, 3, 4])
def test_torch_adasum_and_the_adasum_optimizer(np_):
    p = run_worker(np_, "torch_adasum.py", "20261207", timeout=240,
                   env={"KOLO_STALL_SHUTDOWN_SECONDS": "30"})
    names, _ = check_cases(p, np_, minimum=2)
    assert names == ["allreduce", "optimizer"]
