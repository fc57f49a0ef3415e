"""kolo.torch's helpers (Horovod's horovod.torch.functions):
broadcast_parameters, broadcast_optimizer_state (Adam, SGD with momentum, a
fresh optimizer on the other ranks, a DistributedOptimizer), broadcast_object
and allgather_object.

The worker (tests/python/workers/ops_functions.py) compares every rank's
result with a reference it computes alone: models rebuilt from seeds, the
root's training replayed locally without kolo.
"""

import pytest

from conftest import requires_torch, results, run_worker

pytestmark = requires_torch

CASES = [
    "broadcast_parameters/state_dict", "broadcast_parameters/named_and_lists",
    "broadcast_parameters/non_contiguous", "broadcast_optimizer_state/adam",
    "broadcast_optimizer_state/sgd_momentum", "broadcast_optimizer_state/all_fresh",
    "broadcast_optimizer_state/plain_sgd", "broadcast_optimizer_state/distributed_optimizer",
    "broadcast_optimizer_state/lbfgs_refused",
    "broadcast_object", "allgather_object",
]


@pytest.mark.parametrize("np_", [2, 3])
def test_functions(np_):
    # A stall (a rank making a collective the others do not) fails in 30 s.
    p = run_worker(np_, "ops_functions.py", timeout=240,
                   env={"KOLO_STALL_SHUTDOWN_SECONDS": "30"})
    res = results(p)
    assert sorted(res) == list(range(np_)), f"ranks that reported: {sorted(res)}"
    for rank, items in sorted(res.items()):
        cases = [x for x in items if "case" in x]
        assert items[-1] == {"cases": len(cases)}, f"rank {rank} did not finish"
        assert [c["case"] for c in cases] == CASES
        failed = [f"{c['case']}: {c['detail']}" for c in cases if not c["ok"]]
        assert not failed, f"rank {rank} of {np_}:\n" + "\n".join(failed)
