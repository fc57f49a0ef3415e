"""Hang diagnosis end to end: 4 ranks under kolorun against a
kolo-rendezvous, one fault injected (a rank stopped with SIGSTOP, a rank
that skips one allreduce), and the job's diagnosis pulled from the server
while the job hangs. It must name the right rank and kind within 2 s of the
stall threshold; a run without a fault must never blame anybody, even when
a diagnosis is requested every 200 ms. docs/diagnosis.md."""

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.request

import pytest

from conftest import KOLORUN, PYTHON, WORKERS, worker_env

RENDEZVOUS = os.path.join(os.path.dirname(KOLORUN), "kolo-rendezvous")
DOCTOR = os.path.join(os.path.dirname(KOLORUN), "kolo-doctor")
THRESHOLD_S = 1.0
NP = 4
_RESULT = re.compile(r"^\[(\d+)\] KOLO-RESULT (.*)$")


@pytest.fixture
def server(tmp_path):
    token = tmp_path / "token"
    token.write_text("diagnosis-test-token-0123456789\n")
    p = subprocess.Popen([RENDEZVOUS, "--listen", "127.0.0.1:0", "--token-file", str(token)],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        m = re.match(r"listening on (\S+):(\d+)", p.stdout.readline())
        assert m, "kolo-rendezvous did not start"
        yield f"http://127.0.0.1:{m.group(2)}", token
    finally:
        p.kill()
        p.wait()


class Job:
    """kolorun -np 4 of workers/diag_worker.py; its events in a queue."""

    def __init__(self, url, token, job, args):
        env = worker_env({"KOLO_DIAG_THRESHOLD_MS": int(THRESHOLD_S * 1000),
                          "KOLO_TIMEOUT_MS": 120000, "KOLO_FLIGHT_DIR": str(token.parent)})
        cmd = [KOLORUN, "-np", str(NP), "--rendezvous", url, "--token-file", str(token),
               "--job", job, "--", PYTHON, str(WORKERS / "diag_worker.py"), *args]
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=env, start_new_session=True)
        self.events, self.lines = queue.Queue(), []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line)
            m = _RESULT.match(line.strip())
            if m:
                self.events.put(dict(json.loads(m.group(2)), _at=time.monotonic()))

    def wait_event(self, ev, timeout=90):
        deadline = time.monotonic() + timeout
        while True:
            try:
                e = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                pytest.fail(f"no {ev!r} event in {timeout} s:\n" + "".join(self.lines[-40:]))
            if e.get("ev") == ev:
                return e

    def kill(self, pids):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait(timeout=30)


def get_json(url, token, path, method="GET"):
    req = urllib.request.Request(url + path, method=method,
                                 headers={"Authorization": "Bearer " + token.read_text().strip()})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def diagnose_until(url, token, job, want_rank, want_kinds, since, limit_s):
    """Polls GET diagnosis until it names want_rank; returns (seconds since
    `since`, the diagnosis, every stalled answer seen before)."""
    seen = []
    while True:
        d = get_json(url, token, f"/v1/jobs/{job}/diagnosis")
        elapsed = time.monotonic() - since
        names = [(c["rank"], c["kind"]) for c in d.get("culprits", [])]
        if any(r == want_rank and k in want_kinds for r, k in names):
            return elapsed, d, seen
        if names:
            seen.append(names)
        if elapsed > limit_s:
            pytest.fail(f"no culprit rank {want_rank} ({want_kinds}) after {elapsed:.1f} s; "
                        f"last diagnosis: {json.dumps(d)[:3000]}")
        time.sleep(0.05)  # the poll's pace; the server answers at once


@pytest.mark.parametrize("mode,kinds", [("stop", {"unresponsive"}),
                                        ("skip", {"not_submitted"})])
def test_names_the_culprit_while_it_hangs(server, mode, kinds):
    url, token = server
    job = Job(url, token, f"diag-{mode}", ["--mode", mode, "--victim", "2", "--at", "30",
                                           "--seconds", "600"])
    pids = []
    try:
        for _ in range(NP):
            pids.append(job.wait_event("ready")["pid"])
        fault = job.wait_event("fault")
        elapsed, d, before = diagnose_until(url, token, f"diag-{mode}", 2, kinds,
                                            fault["_at"], THRESHOLD_S + 20)
        assert not before, f"blamed the wrong ranks first: {before}"
        assert [c["rank"] for c in d["culprits"]] == [2], d["culprits"]
        assert d["stalled_op"]["name"] == "step.30", d["stalled_op"]
        assert sorted(d["stalled_op"]["waiting_ranks"]) == [0, 1, 3], d["stalled_op"]
        # The words, as an operator sees them.
        doc = subprocess.run([DOCTOR, url, f"diag-{mode}", "--wait-ms", "1500"],
                             capture_output=True, text=True, timeout=30,
                             env=dict(os.environ, KOLO_TOKEN_FILE=str(token)))
        assert doc.returncode == 1, doc.stdout + doc.stderr
        assert "rank 2" in doc.stdout.splitlines()[0], doc.stdout
        print(f"{mode}: named rank 2 ({d['culprits'][0]['kind']}) {elapsed:.2f} s after the "
              f"fault: {d['summary']}")
    finally:
        job.kill(pids)


def test_no_blame_without_a_fault(server):
    url, token = server
    job = Job(url, token, "diag-control", ["--mode", "control", "--seconds", "5"])
    try:
        for _ in range(NP):
            job.wait_event("ready")
        answers = 0
        while job.p.poll() is None:
            n = get_json(url, token, "/v1/jobs/diag-control/diagnosis", "POST")["request"]
            d = get_json(url, token, f"/v1/jobs/diag-control/diagnosis?request={n}")
            assert not d["culprits"] and not d["stalled"], json.dumps(d)
            answers += 1
            time.sleep(0.2)  # the request rate of this control run
        assert job.p.wait(timeout=60) == 0, "".join(job.lines[-40:])
        assert answers >= 5, f"only {answers} diagnoses while the job ran"
        done = [e for e in iter(lambda: job.events.get_nowait() if not job.events.empty()
                                else None, None) if e.get("ev") == "done"]
        assert len(done) == NP, done
    finally:
        job.kill([])
