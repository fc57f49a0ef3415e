"""kolo.torch.elastic: ElasticSampler and state units (one process), and
elastic jobs of workers/elastic_train.py under kolorun where a worker is
SIGKILLed, SIGTERMed or added mid-run.

The test acts on what the workers report (a worker says it reached step k
and blocks on a FIFO; the test then kills it, or signals it and lets it go
on, or starts a joiner), never on sleeps. Each job checks that the
survivors end with identical parameters, that every sample index was
trained on exactly once per epoch (counted into the committed state, so a
step lost or applied twice shows), and that the model converged to the
regression's exact solution."""

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import KOLORUN, PYTHON, REPO, WORKERS, requires_torch, worker_env

pytestmark = requires_torch

for _p in (str(REPO / "python"), str(WORKERS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

RENDEZVOUS = os.path.join(os.path.dirname(KOLORUN), "kolo-rendezvous")
SCRIPT = str(WORKERS / "elastic_train.py")
EPOCHS = 4
ELASTIC_ENV = {
    "KOLO_HEARTBEAT_MS": "300",            # a joiner is noticed within ~0.3 s
    "KOLO_ELASTIC_LEAVE_GRACE_MS": "20000",  # a loaded box still reaches the commit
    "KOLO_IFACE": "127.0.0.1",
    "KOLO_LOG_LEVEL": "info",
}

# ---- ElasticSampler (one process; the world size is set by the test) ---------


class _Dataset:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


@pytest.fixture
def world(monkeypatch):
    from kolo.torch.elastic import sampler as mod
    w = {"size": 1, "rank": 0}
    monkeypatch.setattr(mod, "_world", lambda: (w["size"], w["rank"]))
    return w


def _samplers(world, n, size, state=None, **kw):
    """One ElasticSampler per rank of a world of ``size``."""
    from kolo.torch.elastic import ElasticSampler
    out = []
    for r in range(size):
        world.update(size=size, rank=r)
        s = ElasticSampler(_Dataset(n), **kw)
        if state is not None:
            s.load_state_dict(state)
        out.append(s)
    return out


def test_sampler_partitions_and_pads(world):
    ss = _samplers(world, 10, 4, shuffle=True, seed=3)
    parts = [list(s) for s in ss]
    assert all(len(p) == 3 == len(s) for p, s in zip(parts, ss))
    flat = sorted(i for p in parts for i in p)
    # 12 slots for 10 indices: every index once, the first two of the
    # epoch's order twice (the padding).
    order = ss[0].remaining_indices
    assert sorted(order) == list(range(10))
    assert flat == sorted(list(range(10)) + order[:2])
    # The order is a function of seed + epoch only, the same on every rank.
    assert all(s.remaining_indices == order for s in ss)
    import random
    want = list(range(10))
    random.Random(3).shuffle(want)
    assert order == want


def test_sampler_pads_fewer_indices_than_ranks(world):
    ss = _samplers(world, 10, 4, shuffle=False)
    ss[0].record_indices(range(9))            # one sample left for 4 ranks
    state = ss[0].state_dict()
    ss = _samplers(world, 10, 4, state=state, shuffle=False)
    assert [list(s) for s in ss] == [[9], [9], [9], [9]]


def test_processed_indices_survive_a_reset_to_another_size(world):
    n, bs = 23, 2
    ss = _samplers(world, n, 4, shuffle=True, seed=1)
    seen = []
    batches = [list(s) for s in ss]
    for b in range(2):                        # two batches on 4 ranks
        for r in range(4):
            seen += batches[r][b * bs:(b + 1) * bs]
        ss[0].record_batch(b, bs)
    assert ss[0].processed_num == len(set(seen)) == 16
    # A reset to 3 ranks (rank 0's state reaches everyone): only the 7
    # unprocessed indices are partitioned, padded to 9 slots.
    state = ss[0].state_dict()
    ss3 = _samplers(world, n, 3, state=state, shuffle=True, seed=1)
    rest = [list(s) for s in ss3]
    assert all(len(p) == 3 for p in rest)
    left = sorted(set(range(n)) - set(seen))
    assert sorted(set(i for p in rest for i in p)) == left
    # Finish the epoch on 3 ranks: batch 0 takes 6 indices, batch 1 the
    # last one (and two padding slots); every index is then processed.
    ss3[0].record_batch(0, bs)
    assert ss3[0].processed_num == 16 + 6
    ss3[0].record_batch(1, bs)
    assert ss3[0].processed_num == n
    ss3[0].record_batch(2, bs)               # past the end: nothing
    assert ss3[0].processed_num == n
    # The next epoch starts afresh with a new order.
    ss3[0].set_epoch(1)
    assert ss3[0].processed_num == 0 and len(ss3[0]) == 8
    assert ss3[0].remaining_indices != ss[0].remaining_indices


def test_sampler_state_dict_round_trip_and_horovod_form(world):
    from kolo.torch.elastic import ElasticSampler
    world.update(size=2, rank=1)
    s = ElasticSampler(_Dataset(9), seed=4)
    s.set_epoch(2)
    s.record_indices([3, 5])
    t = ElasticSampler(_Dataset(9), seed=4)
    t.load_state_dict(s.state_dict())
    s.reset()                                 # records re-partition at a reset
    assert (t.epoch, t.processed_indices, list(t)) == (2, {3, 5}, list(s))
    # Horovod 0.28 saves {"epoch", "processed_num"}: that many samples from
    # the start of the epoch's order.
    h = ElasticSampler(_Dataset(9), seed=4)
    h.load_state_dict({"epoch": 2, "processed_num": 4})
    assert h.processed_indices == set(s._order()[:4])


# ---- state units (one process: save/restore are local) ---------------------------


def test_torch_state_restores_the_last_commit():
    import torch
    from kolo.torch.elastic import TorchState
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TorchState(model, opt, epoch=1, counts=[0, 0])
    assert state.model is model and state.optimizer is opt and state.epoch == 1
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    state.epoch = 2
    state.counts[0] += 5                      # mutated in place
    state.restore()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert opt.state_dict()["state"] == {}
    assert state.epoch == 1 and state.counts == [0, 0]
    opt.step()                                # momentum buffers now exist
    state.epoch = 3
    state.save()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    state.restore()
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert len(opt.state_dict()["state"]) == 2 and state.epoch == 3
    # Assigning a handled value replaces it and saves it.
    other = torch.nn.Linear(3, 2)
    state.model = other
    with torch.no_grad():
        other.weight.zero_()
    state.restore()
    assert state.model is other and float(other.weight.detach().abs().sum()) > 0


def test_reset_limit_parsing(monkeypatch):
    from kolo.torch.elastic import reset_limit
    monkeypatch.delenv("KOLO_ELASTIC_RESET_LIMIT", raising=False)
    assert reset_limit() == 0
    monkeypatch.setenv("KOLO_ELASTIC_RESET_LIMIT", "3")
    assert reset_limit() == 3
    monkeypatch.setenv("KOLO_ELASTIC_RESET_LIMIT", "-1")
    with pytest.raises(ValueError, match="KOLO_ELASTIC_RESET_LIMIT"):
        reset_limit()


# ---- elastic jobs ----------------------------------------------------------------

_RESULT = re.compile(r"^(?:\[(\w+)\] )?KOLO-RESULT (.*)$")


class Job:
    """A kolorun started in the background; its stdout lines are parsed as
    they come (KOLO-RESULT objects go to ``events``)."""

    def __init__(self, np, args, launcher_args=(), env=None):
        cmd = [KOLORUN, "-np", str(np), *launcher_args, "--", PYTHON, SCRIPT, *args]
        self.cmd = " ".join(cmd)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=worker_env({**ELASTIC_ENV, **(env or {})}),
                                     cwd=str(REPO))
        self.events = queue.Queue()
        self.all = []
        self.out, self.err = [], []
        self._threads = [threading.Thread(target=self._read, args=(self.proc.stdout, True)),
                         threading.Thread(target=self._read, args=(self.proc.stderr, False))]
        for t in self._threads:
            t.daemon = True
            t.start()

    def _read(self, f, parse):
        for line in f:
            (self.out if parse else self.err).append(line)
            m = _RESULT.match(line.rstrip("\n")) if parse else None
            if m:
                ev = json.loads(m.group(2))
                self.all.append(ev)
                self.events.put(ev)

    def wait_event(self, pred, timeout=120):
        """The first reported object (not seen by an earlier wait) that
        satisfies ``pred``; fails the test after ``timeout`` s."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                self.fail(f"no awaited event within {timeout} s")
            try:
                ev = self.events.get(timeout=min(left, 1.0))
            except queue.Empty:
                if self.proc.poll() is not None:
                    for t in self._threads:
                        t.join(timeout=5)
                    if self.events.empty():
                        self.fail("kolorun exited before the awaited event")
                continue
            if pred(ev):
                return ev

    def finish(self, timeout=180):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.fail(f"timed out after {timeout} s")
        for t in self._threads:
            t.join(timeout=10)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def fail(self, why):
        self.kill()
        pytest.fail(f"{why}: {self.cmd}\nstdout:\n{''.join(self.out)[-5000:]}\n"
                    f"stderr:\n{''.join(self.err)[-8000:]}")

    @contextlib.contextmanager
    def explained(self, *others):
        """Failed checks inside show this job's (and others') output."""
        try:
            yield
        except AssertionError as e:
            for o in others:
                self.err += ["---- other kolorun:\n"] + o.err
            self.fail(f"check failed: {e}")

    def of(self, ev, pid=None):
        return [e for e in self.all if e["ev"] == ev and (pid is None or e["pid"] == pid)]


def reference_run(init, size0, change_at, size1):
    """Single-process replay of the job's training without kolo: the job
    has size0 workers until the commit of step ``change_at``, size1 after
    it (the survivors resume from that commit). Each step's gradient is the
    average over the ranks of their batch's mean-squared error, the ranks'
    batches partitioned as Horovod's ElasticSampler does (the epoch's
    shuffle without what it processed, padded by repeating its head, rank r
    taking every size-th index from r). Returns the final parameters."""
    import math
    import random
    import torch
    from elastic_train import BATCH, SAMPLES, SEED, Data, LR, MOMENTUM
    data = Data()
    model = torch.nn.Linear(data.x.shape[1], 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(init["weight"]).reshape(model.weight.shape))
        model.bias.copy_(torch.tensor(init["bias"]))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    step = 0
    for epoch in range(EPOCHS):
        order = list(range(SAMPLES))
        random.Random(SEED + epoch).shuffle(order)
        done = set()
        while len(done) < SAMPLES:
            n = size0 if step < change_at else size1
            rem = [i for i in order if i not in done]
            per = math.ceil(len(rem) / n)
            padded = (rem * n)[:per * n]
            parts = [padded[r::n] for r in range(n)]
            for b in range(math.ceil(per / BATCH)):
                opt.zero_grad()
                loss = sum(torch.nn.functional.mse_loss(model(data.x[idx]), data.y[idx])
                           for idx in (p[b * BATCH:(b + 1) * BATCH] for p in parts)) / n
                loss.backward()
                opt.step()
                done.update(padded[b * BATCH * n:min((b + 1) * BATCH, per) * n])
                step += 1
                if step == change_at:
                    break       # the job re-forms: a new partition
    return {k: v.double().flatten().tolist() for k, v in model.state_dict().items()}


def _check_training(jobs, size, schedule):
    """The finished workers: `size` of them, identical parameters, equal to
    the single-process replay of ``schedule`` (size0, change_at, size1)
    from rank 0's initial weights, every index once per epoch, converged to
    y = x . (1..6)/6 + 0.5."""
    import numpy as np
    done = [e for j in jobs for e in j.of("done")]
    assert len(done) == size, done
    assert sorted(e["rank"] for e in done) == list(range(size))
    assert all(e["size"] == size for e in done)
    ref = done[0]
    for e in done:
        assert e["params"] == ref["params"], "parameters differ between ranks"
        assert e["epochs"] == ref["epochs"]
    assert len(ref["epochs"]) == EPOCHS
    for epoch, counts in enumerate(ref["epochs"]):
        assert counts == [1] * len(counts), f"epoch {epoch}: sample counts {counts}"
    init = [e for j in jobs for e in j.of("init")][-1]["params"]
    want = reference_run(init, *schedule)
    for k in want:
        np.testing.assert_allclose(ref["params"][k], want[k], rtol=0, atol=2e-5,
                                   err_msg=f"{k} differs from the single-process replay")
    w = [(i + 1) / 6 for i in range(6)]
    assert max(abs(a - b) for a, b in zip(ref["params"]["weight"], w)) < 0.05, ref["params"]
    assert abs(ref["params"]["bias"][0] - 0.5) < 0.05, ref["params"]
    assert ref["loss"] < 1e-3, ref["loss"]
    return done


# The first round may form with min-np workers while the others still start
# (4 interpreters on 2 cores): they then join at the first commit point, and
# training starts at size 4 whatever the timing.
FULL_START = ["--start-size", "4"]


def _resets(job, pid):
    """(size, step) of the re-forms worker ``pid`` went through once
    training had begun (those at step 0 are late starters joining)."""
    return [(r["size"], r["step"]) for r in job.of("reset", pid) if r["step"] > 0]


def _paused_after_all_stepped(job, n):
    """Waits until all n workers have applied step S+1's update (not yet
    committed) and the victim is blocked after it (the others then wait for
    it in the step's next allreduce); returns the victim's event."""
    seen, paused = set(), None
    while len(seen) < n or paused is None:
        ev = job.wait_event(lambda e: e["ev"] in ("stepped", "paused"))
        if ev["ev"] == "stepped":
            seen.add(ev["pid"])
        else:
            paused = ev
    return paused


def test_sigkill_mid_run(tmp_path):
    """Rank 0 is killed (SIGKILL) in step 9, after the step's update and
    before its commit, while the others wait for it in the step's next
    allreduce: they restore step 8's commit (undoing step 9's update),
    re-form at size 3 (the new rank 0 is the oldest survivor), sync and
    finish as a replay of 8 steps at size 4 and the rest at size 3."""
    fifo = tmp_path / "pause"
    os.mkfifo(fifo)
    job = Job(4, ["--epochs", str(EPOCHS), "--pause-rank", "0", "--pause-at", "8",
                  "--fifo", str(fifo), *FULL_START], ["--min-np", "2", "--max-np", "4"])
    try:
        ev = _paused_after_all_stepped(job, 4)
        os.kill(ev["pid"], signal.SIGKILL)
        rc = job.finish()
    finally:
        job.kill()
    victim = ev["pid"]
    with job.explained():
        assert rc == 0
        assert any(f"killed by signal {signal.SIGKILL}" in line for line in job.err)
        assert not job.of("done", victim)
        done = _check_training([job], 3, (4, 8, 3))
        for e in done:
            assert len(job.of("restore", e["pid"])) == 1, "a survivor did not restore once"
            assert _resets(job, e["pid"]) == [(3, 8)]
            # The even ranks' process set, used every step, was made again
            # for the new size; the old round's set refused its op.
            sets = e["sets"]
            assert sets["bad"] == [] and sets["ranks"] == [0, 2], sets
            assert sets["stale"] and set(sets["stale"]) == {"raised"}, sets
            assert sets["checks"] > 0 or e["rank"] % 2, sets


def test_sigterm_leaves_gracefully(tmp_path):
    """Rank 1 gets SIGTERM while paused in step 9, then goes on: it leaves
    at step 9's commit point and exits 0; the others re-form at size 3
    without a failure (no restore) and finish as a replay of 9 steps at
    size 4 and the rest at size 3."""
    fifo = tmp_path / "pause"
    os.mkfifo(fifo)
    job = Job(4, ["--epochs", str(EPOCHS), "--pause-rank", "1", "--pause-at", "8",
                  "--fifo", str(fifo), *FULL_START], ["--min-np", "2", "--max-np", "4"])
    try:
        ev = _paused_after_all_stepped(job, 4)
        os.kill(ev["pid"], signal.SIGTERM)
        with open(fifo, "w") as f:      # let it go on to its next commit
            f.write("go\n")
        rc = job.finish()
    finally:
        job.kill()
    leaver = ev["pid"]
    with job.explained():
        assert rc == 0
        assert not [line for line in job.err if "exited with status" in line or
                    "killed by signal" in line]
        assert [e["code"] for e in job.of("left", leaver)] == [0]
        assert not job.of("done", leaver)
        assert not job.of("restore"), "a worker restored: the leave was seen as a failure"
        done = _check_training([job], 3, (4, 9, 3))
        for e in done:
            assert _resets(job, e["pid"]) == [(3, 9)]


@pytest.fixture
def server(tmp_path):
    """A kolo-rendezvous on a free loopback port (as tests/elastic use):
    yields (url, token file); a second kolorun can add workers to its job."""
    token = tmp_path / "token"
    token.write_text("elastic-python-test-token-0123456789\n")
    p = subprocess.Popen([RENDEZVOUS, "--listen", "127.0.0.1:0", "--token-file", str(token),
                          "--min-np", "2", "--max-np", "4", "--settle-ms", "300"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline()
        m = re.match(r"listening on (\S+):(\d+)", line)
        assert m, f"kolo-rendezvous said {line!r}"
        yield f"http://127.0.0.1:{m.group(2)}", str(token)
    finally:
        p.kill()
        p.wait()


def test_worker_joins_mid_run(server):
    """Three workers train; at step 6 they poll the commit point until a
    fourth worker (a second kolorun against the same server) is admitted;
    it syncs from rank 0 (weights, momentum buffers, sampler, counters),
    and all four finish identical, as a replay of 6 steps at size 3 and the
    rest at size 4."""
    url, token = server
    common = ["--rendezvous", url, "--token-file", token, "--job", "pyjoin",
              "--min-np", "2", "--max-np", "4"]
    args = ["--epochs", str(EPOCHS), "--start-size", "3", "--wait-size", "4", "--wait-at", "6"]
    job = Job(3, args, common)
    joiner = None
    try:
        job.wait_event(lambda e: e["ev"] == "waiting")
        joiner = Job(1, args, common)
        start = joiner.wait_event(lambda e: e["ev"] == "start")
        rc = job.finish()
        rc_join = joiner.finish()
    finally:
        job.kill()
        if joiner is not None:
            joiner.kill()
    with job.explained(joiner):
        assert (rc, rc_join) == (0, 0)
        assert (start["rank"], start["size"]) == (3, 4)
        assert not job.of("restore") and not joiner.of("restore")
        done = _check_training([job, joiner], 4, (3, 6, 4))
        for e in done:
            if e["pid"] != start["pid"]:
                assert _resets(job, e["pid"]) == [(4, 6)]


def _job(url, token, job):
    """The server's state of job (GET /v1/jobs/{job}), or None when it does
    not exist."""
    import urllib.error
    import urllib.request
    with open(token) as f:
        auth = "Bearer " + f.read().strip()
    req = urllib.request.Request(f"{url}/v1/jobs/{job}", headers={"Authorization": auth})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def _waiting(url, token, job):
    """The worker ids the server holds waiting for a round of job."""
    return [w["worker_id"] for w in (_job(url, token, job) or {}).get("waiting", [])]


def test_sigterm_before_init(server):
    """A program whose own SIGTERM handler calls kolo.elastic_leave() and is
    signalled before kolo.init() (docs/elastic.md, "Graceful leave"): init
    exits 0 without joining, so the server never hears of the worker."""
    url, token = server
    env = worker_env({"KOLO_RENDEZVOUS": url, "KOLO_TOKEN_FILE": token, "KOLO_JOB": "preinit",
                      "KOLO_ELASTIC": "1"})
    code = ("import signal, sys, kolo\n"
            "signal.signal(signal.SIGTERM, lambda *_: kolo.elastic_leave())\n"
            "print('READY', flush=True)\n"
            "sys.stdin.readline()\n"
            "kolo.init()\n"
            "print('INIT RETURNED')\n")
    p = subprocess.Popen([PYTHON, "-c", code], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "READY"
        p.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        out, err = p.communicate(input="go\n", timeout=30)
        ms = (time.monotonic() - t0) * 1000
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 0, err
    assert ms < 3000, f"leaving took {ms:.0f} ms"
    assert "INIT RETURNED" not in out
    assert "left job preinit before it got a rank" in err, err
    assert _job(url, token, "preinit") is None, "the worker joined the job"


def test_sigterm_before_a_rank(server):
    """A worker SIGTERMed while kolo.init() waits for its first round (one
    worker of a job of min-np 2) leaves the server's waiting list and exits
    0 within seconds, saying so; without kolo's handler in place before the
    join it would die of the signal and stay on the list until its lease
    lapsed."""
    url, token = server
    env = worker_env({"KOLO_RENDEZVOUS": url, "KOLO_TOKEN_FILE": token, "KOLO_JOB": "pyterm",
                      "KOLO_ELASTIC": "1", "KOLO_HEARTBEAT_MS": "300"})
    p = subprocess.Popen([PYTHON, "-c", "import kolo; kolo.init(); print('INIT RETURNED')"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _waiting(url, token, "pyterm"):
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "the worker never joined"
            time.sleep(0.05)  # polling the server's state, not synchronising
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=10)
        ms = (time.monotonic() - t0) * 1000
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 0, err
    assert ms < 3000, f"leaving took {ms:.0f} ms"
    assert "INIT RETURNED" not in out
    assert "left job pyterm before it got a rank" in err, err
    assert _waiting(url, token, "pyterm") == []
