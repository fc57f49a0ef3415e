"""An elastic training job for test_elastic.py: linear regression with
kolo.torch.elastic (TorchState, ElasticSampler, DistributedOptimizer).

    elastic_train.py [--epochs E] [--start-size K0] [--wait-size K --wait-at S]
                     [--pause-rank R --pause-at S --fifo PATH]

--start-size K0: training starts once the job has K0 workers (the first
round may form with min-np of them while the others still start; they are
admitted at the commit point polled before step 0).

Every step commits. Events are reported (conftest's KOLO-RESULT lines) so
that the test acts on them:
  {"ev": "start", "pid", "rank", "size"}           after init
  {"ev": "init", "params"}                         rank 0 before the first step
  {"ev": "stepped", "pid", "step": S}              every process, in step S+1
      after the optimizer's step (applied, not committed), the first time
  {"ev": "paused", "pid", "step": S}               then the process that was
      rank R at start blocks reading the FIFO (the test kills it, or signals
      it and writes a line to let it go on); the others block in the step's
      next allreduce
  {"ev": "waiting", "step"}                        rank 0 before step S+1 while
      the size is below K: every member polls the commit point until a
      joiner is admitted
  {"ev": "restore"} / {"ev": "reset", "size", "rank", "step"}  ("step": this
      worker's step when the callback runs, before the sync)
  {"ev": "left"}                                   this worker left (exit 0)
  {"ev": "done", "params", "epochs", "loss", "sets", ...}  the end; "sets": the
      process set of the even ranks (made at the start and again by a reset
      callback) checked by an allreduce in every step, and whether an op on
      the set of the round before a re-form raised
"epochs" holds, for every epoch, how many times each sample index was in a
real (not padding) batch of some rank, counted with an allreduce into the
committed state: exactly once each when nothing was lost or applied twice.
"""

import argparse
import os
import time

import torch

import kolo.torch as hvd
from _common import report

torch.set_num_threads(1)

FEATURES, SAMPLES, BATCH = 6, 48, 2
LR, MOMENTUM, SEED = 0.05, 0.5, 5


class Data(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(11)
        self.x = torch.randn(SAMPLES, FEATURES, generator=g)
        w = torch.arange(1.0, FEATURES + 1.0).unsqueeze(1) / FEATURES
        self.y = self.x @ w + 0.5

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def params(model):
    return {k: v.double().flatten().tolist() for k, v in model.state_dict().items()}


class Reporting(hvd.elastic.TorchState):
    def restore(self):
        report({"ev": "restore", "pid": os.getpid()})
        super().restore()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--pause-rank", type=int, default=-1)
    ap.add_argument("--pause-at", type=int, default=-1)
    ap.add_argument("--fifo", default="")
    ap.add_argument("--start-size", type=int, default=0)
    ap.add_argument("--wait-size", type=int, default=0)
    ap.add_argument("--wait-at", type=int, default=-1)
    args = ap.parse_args()

    hvd.init()
    first_rank = hvd.rank()
    report({"ev": "start", "pid": os.getpid(), "rank": first_rank, "size": hvd.size()})

    data = Data()
    # Every process starts from different weights: the first sync (and a
    # joiner's) must replace them with rank 0's.
    torch.manual_seed(1000 + os.getpid())
    model = torch.nn.Linear(FEATURES, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
                                   named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=SEED)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler)
    state = Reporting(model, opt, sampler=sampler, epoch=0, step=0, counts=[0] * SAMPLES,
                      epochs=[])
    sets = {"set": None, "checks": 0, "bad": [], "stale": []}

    def add_even_set():
        """A process set of the even ranks: made at the start and, as
        Horovod's programs do, again after every re-form; an op on the old
        one must be refused."""
        old = sets["set"]
        if old is not None:
            try:
                hvd.allreduce(torch.ones(1), process_set=old)
                sets["stale"].append("no error")
            except ValueError as e:
                sets["stale"].append("raised" if "not been added" in str(e) else str(e))
        if hvd.size() > 1:
            sets["set"] = hvd.add_process_set(list(range(0, hvd.size(), 2)))

    add_even_set()
    state.register_reset_callbacks([lambda: report({"ev": "reset", "size": hvd.size(),
                                                    "rank": hvd.rank(), "pid": os.getpid(),
                                                    "step": state.step}),
                                    add_even_set])
    stepped = []

    def wait_for_size(state, k, announce=False):
        """Polls the commit point (one small allreduce) until it raises
        HostsUpdatedInterrupt for joiners while the size is below k; the
        pause between polls only keeps them from taking the CPU the joiners
        need to start."""
        if hvd.size() >= k:
            return
        if announce and hvd.rank() == 0:
            report({"ev": "waiting", "step": state.step})
        while True:
            state.check_host_updates()
            time.sleep(0.02)

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            for b, (x, y, idx) in enumerate(loader):
                if state.step == 0:
                    wait_for_size(state, args.start_size)
                if state.step == args.wait_at:
                    wait_for_size(state, args.wait_size, announce=True)
                if state.step == 0 and hvd.rank() == 0:
                    report({"ev": "init", "pid": os.getpid(), "params": params(model)})
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                if state.step == args.pause_at and not stepped:
                    # Step S+1's update is applied but not committed yet.
                    stepped.append(True)
                    report({"ev": "stepped", "pid": os.getpid(), "step": state.step})
                    if first_rank == args.pause_rank:
                        report({"ev": "paused", "pid": os.getpid(), "step": state.step})
                        with open(args.fifo) as f:
                            f.readline()
                # Which samples of this batch are real (not padding):
                # element j of batch b is position (b*BATCH+j)*size+rank of
                # the padded order; the real ones come first.
                cnt = torch.zeros(SAMPLES, dtype=torch.int64)
                for j, i in enumerate(idx.tolist()):
                    pos = (b * BATCH + j) * sampler.num_replicas + sampler.rank
                    if pos < len(sampler.remaining_indices):
                        cnt[i] += 1
                hvd.allreduce_(cnt, op=hvd.Sum, name="elastic_test.counts")
                ps = sets["set"]
                if ps is not None and ps.included():
                    got = hvd.allreduce(torch.full((1,), float(hvd.rank())), op=hvd.Sum,
                                        name="elastic_test.set", process_set=ps).item()
                    sets["checks"] += 1
                    if got != sum(ps.ranks):
                        sets["bad"].append([state.step, got, ps.ranks])
                state.counts = [a + c for a, c in zip(state.counts, cnt.tolist())]
                sampler.record_batch(b, BATCH)
                state.step += 1
                state.commit()
            state.epochs = state.epochs + [state.counts]
            state.counts = [0] * SAMPLES
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()

    try:
        train(state)
    except SystemExit as e:
        report({"ev": "left", "pid": os.getpid(), "code": e.code})
        raise
    with torch.no_grad():
        loss = float(torch.nn.functional.mse_loss(model(data.x), data.y))
    report({"ev": "done", "pid": os.getpid(), "rank": hvd.rank(), "size": hvd.size(),
            "params": params(model),
            "epochs": state.epochs, "loss": loss, "step": state.step,
            "sets": {"checks": sets["checks"], "bad": sets["bad"], "stale": sets["stale"],
                     "ranks": sets["set"].ranks if sets["set"] else None}})
    hvd.shutdown()


if __name__ == "__main__":
    main()
