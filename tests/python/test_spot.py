"""Preemption notices (docs/spot.md) turned into a graceful leave, against
local emulations of AWS IMDSv2, GCE, Azure Scheduled Events and the
Kubernetes API (tests/spot/metadata_emulator.py).

For each provider: ``kolorun -np 3 --spares 1`` runs workers/spot_worker.py,
each worker watching its own emulated machine (KOLO_PREEMPTION=provider).
When rank 1 reports step K, the test raises the notice on rank 1's machine.
Rank 1 must leave at a commit point and exit 0; the others go on without a
restore (their step counter never goes back, every step is applied exactly
once), the spare takes rank 1's place so the job stays at 3, and the
parameters are bitwise those of a run where rank 1 called
kolo.elastic_leave() at the same step (the same membership history, no
notice). The time from the notice to the job starting its first step without
the leaver is printed (``pytest -s``) and bounded.

A notice whose deadline comes before the leaver's next commit point: the
leaver leaves KOLO_PREEMPTION_MARGIN_MS before the deadline, and the others
go on from their last commit (test_deadline_before_the_commit_point)."""

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone

import numpy as np
import pytest

from conftest import KOLORUN, PYTHON, REPO, WORKERS, worker_env

EMULATOR = REPO / "tests" / "spot" / "metadata_emulator.py"
SCRIPT = str(WORKERS / "spot_worker.py")
STEPS, STEP_MS, NOTICE_AT, POLL_MS = 60, 15, 10, 50
ENV = {
    "KOLO_IFACE": "127.0.0.1",
    "KOLO_HEARTBEAT_MS": "300",
    "KOLO_PREEMPTION_POLL_MS": str(POLL_MS),
    "KOLO_ELASTIC_LEAVE_GRACE_MS": "20000",  # a loaded box still reaches the commit
    "KOLO_LOG_LEVEL": os.environ.get("SPOT_LOG", "warn"),
}

_RESULT = re.compile(r"^(?:\[(\w+)\] )?KOLO-RESULT (.*)$")


@pytest.fixture(scope="module")
def emulator():
    p = subprocess.Popen([sys.executable, str(EMULATOR)], stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        m = re.match(r"port (\d+)", line)
        assert m, f"the emulator said {line!r}"
        yield f"http://127.0.0.1:{m.group(1)}"
    finally:
        p.kill()
        p.wait()


def _http(method, url):
    req = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"{}")


class Job:
    """kolorun in the background; KOLO-RESULT lines parsed as they come."""

    def __init__(self, args, env=None):
        cmd = [KOLORUN, "-np", "3", "--spares", "1", "--", PYTHON, SCRIPT, *map(str, args)]
        self.cmd = " ".join(cmd)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=worker_env({**ENV, **(env or {})}),
                                     cwd=str(REPO))
        self.events, self.all, self.out, self.err = queue.Queue(), [], [], []
        self.threads = [threading.Thread(target=self._read, args=(self.proc.stdout, True),
                                         daemon=True),
                        threading.Thread(target=self._read, args=(self.proc.stderr, False),
                                         daemon=True)]
        for t in self.threads:
            t.start()

    def _read(self, f, parse):
        for line in f:
            (self.out if parse else self.err).append(line)
            m = _RESULT.match(line.rstrip("\n")) if parse else None
            if m:
                ev = json.loads(m.group(2))
                self.all.append(ev)
                self.events.put(ev)

    def wait_event(self, pred, timeout=30):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                ev = self.events.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self.events.empty():
                    self.fail("kolorun exited before the awaited event")
                continue
            if pred(ev):
                return ev
        self.fail(f"no awaited event within {timeout} s")

    def finish(self, timeout=30):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"timed out after {timeout} s")
        for t in self.threads:
            t.join(timeout=5)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def fail(self, why):
        self.kill()
        pytest.fail(f"{why}: {self.cmd}\nstdout:\n{''.join(self.out)[-4000:]}\n"
                    f"stderr:\n{''.join(self.err)[-6000:]}")

    def of(self, ev, pid=None):
        return [e for e in self.all if e["ev"] == ev and (pid is None or e["pid"] == pid)]


def _check_run(job, leaver_pid):
    """The survivors and the spare: no restore, steps never go back, every
    step applied once, size 3 at the end; returns the done events."""
    assert not job.of("restore"), "a worker restored: the leave was seen as a failure"
    done = job.of("done")
    assert sorted(e["rank"] for e in done) == [0, 1, 2], done
    assert all(e["size"] == 3 and e["step"] == STEPS for e in done), done
    assert leaver_pid not in {e["pid"] for e in done}
    for e in done:
        assert e["applied"] == list(range(1, STEPS + 1)), f"steps applied: {e['applied']}"
        steps = [s["step"] for s in job.of("step", e["pid"])]
        assert steps == sorted(set(steps)), f"pid {e['pid']}: steps went back: {steps}"
        assert e["params"] == done[0]["params"], "parameters differ between ranks"
    return done


@pytest.mark.parametrize("provider", ["aws", "gce", "azure", "k8s"])
def test_notice_becomes_a_leave(emulator, provider):
    job = Job(["--steps", STEPS, "--step-ms", STEP_MS, "--provider", provider,
               "--emulator", emulator])
    try:
        starts = {}
        while len(starts) < 3:
            ev = job.wait_event(lambda e: e["ev"] == "start")
            starts[ev["pid"]] = ev
        victim = next(e for e in starts.values() if e["rank"] == 1 and e["size"] == 3)
        job.wait_event(lambda e: e["ev"] == "step" and e["pid"] == victim["pid"] and
                       e["step"] == NOTICE_AT)
        raised = _http("POST", f"http://127.0.0.1:{victim['instance']}/_emulator/notice"
                               f"?provider={provider}")
        rc = job.finish()
    finally:
        job.kill()
    t_notice = raised["t"]
    with_err = "".join(job.err)
    try:
        assert rc == 0, f"kolorun exited {rc}"
        assert "exited with status" not in with_err and "killed by signal" not in with_err
        left = job.of("left", victim["pid"])
        assert [e["code"] for e in left] == [0], left
        kind, text = left[0]["preemption"]
        assert kind == 2 and text.startswith(provider + ": "), left[0]
        leave_step = left[0]["step"]
        assert leave_step > NOTICE_AT
        assert f"{provider}: preemption notice" in with_err
        done = _check_run(job, victim["pid"])
        # The spare took the leaver's place: its first step is the next one.
        spare = [e for e in done if e["pid"] not in starts]
        assert len(spare) == 1
        assert job.of("step", spare[0]["pid"])[0]["step"] == leave_step + 1
        resumed = [s for s in job.of("step") if s["step"] == leave_step + 1]
        assert len(resumed) == 3 and all(s["size"] == 3 for s in resumed)
        # From the notice to every member of the new round starting its first step.
        to_start = max(s["t0"] for s in resumed) - t_notice
        before = [s["t1"] - s["t0"] for s in job.of("step") if s["step"] <= NOTICE_AT]
        step = sorted(before)[len(before) // 2]
        # When the worker saw it (its log line's wall-clock time).
        seen = [ln for ln in job.err if f"{provider}: preemption notice" in ln]
        assert len(seen) == 1, seen
        stamp = re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z", seen[0])
        detect = datetime.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
            tzinfo=timezone.utc).timestamp() - raised["wall"]
        if provider == "azure":
            state = _http("GET", f"http://127.0.0.1:{victim['instance']}/_emulator/state")
            assert len(state["azure_acks"]) == 1, state
    except AssertionError as e:
        job.fail(f"check failed: {e}")
    if os.environ.get("SPOT_LOG"):
        print("".join(job.err)[-6000:])
    print(f"\n{provider}: notice at step {NOTICE_AT}, left after step {leave_step}; notice -> "
          f"job stepping at size 3 without the leaver: {to_start * 1000:.0f} ms "
          f"(seen by the worker after {max(detect, 0) * 1000:.0f} ms) "
          f"(median step {step * 1000:.0f} ms, poll {POLL_MS} ms)")
    assert to_start <= step + (POLL_MS + 100) / 1000 + 0.3, (to_start, step)

    # The same membership history without a notice: rank 1 leaves with
    # kolo.elastic_leave() at the same commit point.
    ref = Job(["--steps", STEPS, "--step-ms", 0, "--leave-rank", 1,
               "--leave-step", leave_step])
    try:
        rc = ref.finish()
    finally:
        ref.kill()
    ref_left = ref.of("left")
    if rc != 0 or len(ref_left) != 1 or ref_left[0]["step"] != leave_step:
        ref.fail(f"the reference run: exit {rc}, left {ref_left}")
    ref_done = _check_run(ref, ref_left[0]["pid"])
    assert ref_done[0]["params"] == done[0]["params"], \
        "parameters differ from the run with the same membership history"


def test_aws_rebalance_is_a_hint_and_tokens_are_renewed(emulator):
    """AWS's rebalance recommendation is only a hint: rank 1 logs it and
    exposes it (kolo.elastic_preemption() gives kind 1) but stays; its
    session token expires meanwhile (the metadata service answers 401) and
    the watcher takes a new one. Nobody leaves; the job ends at size 3
    without the spare."""
    job = Job(["--steps", STEPS, "--step-ms", STEP_MS, "--provider", "aws",
               "--emulator", emulator])
    try:
        starts = {}
        while len(starts) < 3:
            ev = job.wait_event(lambda e: e["ev"] == "start")
            starts[ev["pid"]] = ev
        victim = next(e for e in starts.values() if e["rank"] == 1)
        job.wait_event(lambda e: e["ev"] == "step" and e["pid"] == victim["pid"] and
                       e["step"] == NOTICE_AT)
        base = f"http://127.0.0.1:{victim['instance']}/_emulator"
        _http("POST", base + "/expire")
        _http("POST", base + "/notice?provider=aws&kind=rebalance")
        rc = job.finish()
    finally:
        job.kill()
    state = _http("GET", base + "/state")
    try:
        assert rc == 0
        assert not job.of("left")
        done = _check_run(job, None)
        assert {e["pid"] for e in done} == set(starts), "the spare was used"
        kinds = {e["pid"]: e["preemption"] for e in done}
        assert kinds[victim["pid"]][0] == 1 and "rebalance" in kinds[victim["pid"]][1], kinds
        assert all(k[0] == 0 for p, k in kinds.items() if p != victim["pid"]), kinds
        assert state["requests"].get("PUT /latest/api/token", 0) >= 2, state
        assert "aws: early hint of a preemption" in "".join(job.err)
    except AssertionError as e:
        job.fail(f"check failed: {e}")


def _log_time(line):
    """The wall-clock time of a kolo log line."""
    stamp = re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z", line)
    return datetime.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=timezone.utc).timestamp()


def _reference_params(steps):
    """spot_worker.py's training in one process, in float64: every step's
    global batch at once (it is the same whatever the size)."""
    dim, per_rank, lr = 8, 4, 0.05
    p = np.zeros(dim + 1)
    for s in range(1, steps + 1):
        rng = np.random.default_rng(s)
        x = rng.standard_normal((per_rank * 3, dim))
        y = x @ (np.arange(1.0, dim + 1.0) / dim) + 0.5
        err = x @ p[:dim] + p[dim] - y
        p = p - lr * np.append(x.T @ err, err.sum()) / (per_rank * 3)
    return p


def test_deadline_before_the_commit_point(emulator):
    """Rank 1's AWS notice says the machine goes about 3 s later, and rank 1
    then stalls in its step (a step longer than the notice): no commit point
    comes. KOLO_PREEMPTION_MARGIN_MS (1 s) before the deadline it logs why,
    leaves the job and exits 0; the others, blocked in that step's
    allreduce, learn at once, restore their last commit and go on with the
    spare before the deadline. Every step is applied exactly once, and the
    parameters are those of a single-process float64 run."""
    deadline_s, margin_ms = 3, 1000
    job = Job(["--steps", STEPS, "--step-ms", STEP_MS, "--provider", "aws",
               "--emulator", emulator, "--stall-on-notice", "--await-notice", f"1:{NOTICE_AT}"],
              env={"KOLO_PREEMPTION_MARGIN_MS": str(margin_ms)})
    try:
        starts = {}
        while len(starts) < 3:
            ev = job.wait_event(lambda e: e["ev"] == "start")
            starts[ev["pid"]] = ev
        victim = next(e for e in starts.values() if e["rank"] == 1 and e["size"] == 3)
        job.wait_event(lambda e: e["ev"] == "step" and e["pid"] == victim["pid"] and
                       e["step"] == NOTICE_AT)
        raised = _http("POST", f"http://127.0.0.1:{victim['instance']}/_emulator/notice"
                               f"?provider=aws&deadline_s={deadline_s}")
        stall = job.wait_event(lambda e: e["ev"] == "stall")
        rc = job.finish()
    finally:
        job.kill()
    err = "".join(job.err)
    deadline = raised["deadline"]  # wall clock, whole seconds as AWS gives it
    deadline_mono = raised["t"] + deadline - raised["wall"]
    try:
        assert rc == 0, f"kolorun exited {rc}"
        assert "exited with status" not in err and "killed by signal" not in err
        assert stall["pid"] == victim["pid"] and stall["step"] > NOTICE_AT, stall
        assert 0 < stall["deadline_ms"] <= deadline_s * 1000, stall
        # The leaver: its reason, then its exit, both before the deadline;
        # it never reached a commit point after the notice.
        assert not job.of("left") and victim["pid"] not in {e["pid"] for e in job.of("done")}
        assert len(re.findall(r"aws: preemption notice: spot instance-action terminate "
                              r"at \S+Z, in [1-3] s", err)) == 1, err[-3000:]
        why = [ln for ln in job.err if "no commit point came and the machine goes in" in ln]
        gone = [ln for ln in job.err if "exiting with status 0" in ln]
        assert len(why) == 1 and len(gone) == 1, (why, gone)
        before = deadline - _log_time(why[0])
        assert 0.5 <= before <= margin_ms / 1000 + 0.1, (before, why[0])
        assert _log_time(gone[0]) < deadline, gone[0]
        assert max(s["step"] for s in job.of("step", victim["pid"])) == stall["step"] - 1
        # The others: a restore each (a lost member), then the stalled step
        # again at size 3 with the spare, begun before the deadline.
        survivors = set(starts) - {victim["pid"]}
        assert {e["pid"] for e in job.of("restore")} == survivors, job.of("restore")
        done = job.of("done")
        assert sorted(e["rank"] for e in done) == [0, 1, 2], done
        assert all(e["size"] == 3 and e["step"] == STEPS for e in done), done
        spare = [e for e in done if e["pid"] not in starts]
        assert len(spare) == 1
        assert job.of("step", spare[0]["pid"])[0]["step"] == stall["step"]
        again = [s for s in job.of("step") if s["step"] == stall["step"]]
        assert len(again) == 3 and all(s["size"] == 3 for s in again), again
        assert max(s["t0"] for s in again) < deadline_mono, (again, deadline_mono)
        for e in done:
            assert e["applied"] == list(range(1, STEPS + 1)), f"steps applied: {e['applied']}"
            steps = [s["step"] for s in job.of("step", e["pid"])]
            assert steps == sorted(set(steps)), f"pid {e['pid']}: steps went back: {steps}"
            assert e["params"] == done[0]["params"], "parameters differ between ranks"
        params = np.array([float.fromhex(v) for v in done[0]["params"]])
        ref = _reference_params(STEPS)
        assert np.abs(ref).max() > 0.5
        assert np.allclose(params, ref, rtol=1e-12, atol=1e-12), (params, ref)
    except AssertionError as e:
        job.fail(f"check failed: {e}")
    if os.environ.get("SPOT_LOG"):
        print(err[-6000:])
    print(f"\ndeadline: notice at step {NOTICE_AT} ({deadline - raised['wall']:.2f} s before "
          f"the deadline), stalled in step {stall['step']}; left {before:.2f} s before the "
          f"deadline (margin {margin_ms} ms); the job re-formed "
          f"{deadline_mono - max(s['t0'] for s in again):.2f} s before it")
