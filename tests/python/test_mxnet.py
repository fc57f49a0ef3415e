"""kolo.mxnet (tests/python/workers/mx_ops.py) under MXNet 1.9's own
interpreter: KOLO_MXNET_PYTHON, by default the .venv-mxnet that
``scripts/setup.sh --with-mxnet`` makes (MXNet 1.9.1 needs numpy 1.23.5,
so it cannot share .venv). The test process itself needs no MXNet.

Every op against float64 references on 2 and 4 ranks; the engine ordering
an output's next operation without a wait; a mismatch raising on every
rank; DistributedTrainer, DistributedOptimizer and broadcast_parameters
against single-process training on the concatenated batch; a killed rank
failing the others promptly; operations still queued in MXNet's engine at
exit completing before the comm goes."""

import os
import pathlib

import pytest

from conftest import REPO, WORKERS, check_cases, kolorun, results

MXNET_PYTHON = os.environ.get("KOLO_MXNET_PYTHON",
                              str(pathlib.Path(REPO) / ".venv-mxnet" / "bin" / "python"))

pytestmark = pytest.mark.skipif(
    not os.access(MXNET_PYTHON, os.X_OK),
    reason=f"no MXNet interpreter at {MXNET_PYTHON} (scripts/setup.sh --with-mxnet)")


def run(np_, mode, **kw):
    return kolorun(np_, [MXNET_PYTHON, str(WORKERS / "mx_ops.py"), mode], **kw)


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_ops_against_references(np_):
    names, _ = check_cases(run(np_, "ops", timeout=240), np_, 11)
    assert {"engine_order", "mismatch", "process_set", "shards"} <= set(names)


def test_training_equals_the_concatenated_batch():
    names, res = check_cases(run(3, "train", timeout=240), 3, 6)
    assert names == ["trainer", "trainer_groups", "trainer_sharded", "trainer_sharded_adam",
                     "optimizer", "deferred"]
    errs = [x["err"] for x in res[0] if "trainer" in x]
    assert len(errs) == 4 and max(errs) <= 1e-5


def test_a_killed_rank_fails_the_others():
    p = run(3, "kill", timeout=120, check=False)
    res = results(p)
    killed = [x["killed_at"] for x in res.get(2, []) if "killed_at" in x]
    assert killed, f"rank 2 did not reach its kill:\n{p.stdout[-3000:]}"
    delays = []
    for r in (0, 1):
        raised = [x for x in res.get(r, []) if "raised_at" in x]
        assert raised, f"rank {r} did not raise:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        assert raised[0]["error"] in ("MembershipError", "Error", "ClosedError"), raised[0]
        assert "KOLO_E" in raised[0]["msg"], raised[0]
        delays.append(raised[0]["raised_at"] - killed[0])
    print(f"survivors raised {', '.join(f'{d * 1000:.0f} ms' for d in delays)} after the SIGKILL")
    assert max(delays) < 2.0
    assert p.returncode != 0


@pytest.mark.parametrize("mode", ["exit", "exit", "exit", "exit_shutdown"])
def test_operations_in_the_queue_complete_before_the_comm_goes(mode):
    res = results(run(2, mode, timeout=120))
    for r in range(2):
        checked = [x for x in res.get(r, []) if "exit_checked" in x]
        assert checked and checked[0]["exit_checked"] == 50 and not checked[0]["bad"], res.get(r)
