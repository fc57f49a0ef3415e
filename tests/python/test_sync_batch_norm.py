"""hvd.SyncBatchNorm (workers/torch_syncbn.py) on 2 and 3 ranks against
torch's BatchNorm on the ranks' concatenated batch in one process."""

import pytest

from conftest import check_cases, requires_torch, run_worker

pytestmark = requires_torch


@pytest.mark.parametrize("np_", [2, 3])
def test_sync_batch_norm_matches_batch_norm_on_the_whole_batch(np_):
    p = run_worker(np_, "torch_syncbn.py", timeout=180)
    names, _ = check_cases(p, np_, minimum=2)
    assert names == ["bn1d", "bn2d"]
