"""torch.distributed.pipelining on backend kolo: a two-stage schedule
(ScheduleGPipe and Schedule1F1B, 4 microbatches) of workers/pipeline_2stage.py
on 2 ranks, on a kolo group and on a gloo group in the same processes. Per
step, each stage's parameters and the last stage's loss on kolo equal gloo's
(within 1e-6) and single-process training of the whole model on the whole
batch (within 1e-5; the schedules divide the gradients by the number of
microbatches). The stages talk through batch_isend_irecv, i.e. kolo's
point-to-point."""

import sys

import pytest

from conftest import WORKERS, requires_torch, results, run_worker

pytestmark = requires_torch
ENV = {"GLOO_SOCKET_IFNAME": "lo", "KOLO_LOG_LEVEL": "warn"}
if str(WORKERS) not in sys.path:
    sys.path.insert(0, str(WORKERS))


@pytest.fixture(scope="module")
def run():
    proc = run_worker(2, "pipeline_2stage.py", env=ENV, timeout=180)
    res = results(proc)
    assert sorted(res) == [0, 1], proc.stdout[-3000:] + proc.stderr[-3000:]
    out = {}
    for rank, items in res.items():
        for o in items:
            if "backend" in o:
                out[(o["case"], o["backend"], rank, o["step"])] = o
    return out


def reference():
    """Per step: (loss, [stage 0 params, stage 1 params]) of one process."""
    import torch
    import pipeline_2stage as W
    full = W.model()
    opt = torch.optim.SGD(full.parameters(), lr=W.LR)
    steps = []
    for step in range(W.STEPS):
        x, y = W.batch(step)
        opt.zero_grad()
        loss = W.loss_fn(full(x), y)
        (loss / W.MICRO).backward()  # the schedules' scale_grads: the mean over microbatches
        opt.step()
        steps.append((loss.item(), [[p.detach().flatten().tolist() for p in
                                     W.stage_of(full, r).parameters()] for r in (0, 1)]))
    return steps


def close(a, b, tol):
    return all(len(x) == len(y) and all(abs(u - v) <= tol for u, v in zip(x, y))
               for x, y in zip(a, b)) and len(a) == len(b)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_two_stage_schedule_matches_gloo_and_single_process(run, kind):
    import pipeline_2stage as W
    ref = reference()
    for step in range(W.STEPS):
        for rank in (0, 1):
            kolo = run[(kind, "kolo", rank, step)]
            gloo = run[(kind, "gloo", rank, step)]
            assert close(kolo["params"], gloo["params"], 1e-6), (kind, step, rank)
            assert close(kolo["params"], ref[step][1][rank], 1e-5), (kind, step, rank)
        loss_k, loss_g = run[(kind, "kolo", 1, step)]["loss"], run[(kind, "gloo", 1, step)]["loss"]
        assert abs(loss_k - loss_g) <= 1e-6 * max(1.0, abs(loss_g)), (kind, step)
        assert abs(loss_k - ref[step][0]) <= 1e-5 * max(1.0, abs(ref[step][0])), (kind, step)
