"""Jobs with one injected fault and the diagnosis pulled from the server,
shared by tests/python/test_diagnosis.py and bench/diagnosis/faults.py:
a kolo-rendezvous on a free loopback port, kolorun -np N of
workers/diag_worker.py against it, and GET/POST /v1/jobs/{job}/diagnosis."""

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.request

from conftest import KOLORUN, PYTHON, WORKERS, worker_env

RENDEZVOUS = os.path.join(os.path.dirname(KOLORUN), "kolo-rendezvous")
DOCTOR = os.path.join(os.path.dirname(KOLORUN), "kolo-doctor")
_RESULT = re.compile(r"^\[(\d+)\] KOLO-RESULT (.*)$")


class Server:
    """kolo-rendezvous with a token file in directory tmp."""

    def __init__(self, tmp, env=None):
        self.token = os.path.join(str(tmp), "token")
        with open(self.token, "w") as f:
            f.write("diagnosis-test-token-0123456789\n")
        self.p = subprocess.Popen([RENDEZVOUS, "--listen", "127.0.0.1:0", "--token-file",
                                   self.token], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True,
                                  env=dict(os.environ, **(env or {})))
        m = re.match(r"listening on (\S+):(\d+)", self.p.stdout.readline())
        if not m:
            self.close()
            raise RuntimeError("kolo-rendezvous did not start")
        self.url = f"http://127.0.0.1:{m.group(2)}"

    def close(self):
        self.p.kill()
        self.p.wait()

    def call(self, path, method="GET", body=None):
        """The JSON answer to method path (with body, an object, as JSON)."""
        with open(self.token) as f:
            auth = "Bearer " + f.read().strip()
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, method=method, data=data,
                                     headers={"Authorization": auth})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())


class Job:
    """kolorun -np of workers/diag_worker.py (or another worker script, or
    any command; launcher_args before its "--"); its KOLO-RESULT events in a
    queue."""

    def __init__(self, server, job, args, np_=4, threshold_ms=1000, env=None,
                 script="diag_worker.py", launcher_args=(), command=None):
        extra = {"KOLO_DIAG_THRESHOLD_MS": threshold_ms, "KOLO_TIMEOUT_MS": 120000,
                 "KOLO_FLIGHT_DIR": os.path.dirname(server.token)}
        extra.update(env or {})
        cmd = [KOLORUN, "-np", str(np_), "--rendezvous", server.url, "--token-file",
               server.token, "--job", job, *map(str, launcher_args), "--",
               *map(str, command or [PYTHON, WORKERS / script, *args])]
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=worker_env(extra), start_new_session=True)
        self.events, self.lines, self.pids = queue.Queue(), [], []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line)
            m = _RESULT.match(line.strip())
            if m:
                self.events.put(dict(json.loads(m.group(2)), _at=time.monotonic()))

    def wait_event(self, ev, timeout=90):
        """The next event named ev (the others before it are dropped)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                e = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no {ev!r} event in {timeout} s:\n" +
                                     "".join(self.lines[-40:])) from None
            if e.get("ev") == "ready":
                self.pids.append(e["pid"])
            if e.get("ev") == ev:
                return e

    def kill(self):
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait(timeout=30)


def diagnose_until(server, job, want, since, limit_s):
    """Polls GET diagnosis until a culprit is named; returns (seconds since
    `since`, the diagnosis, whether the first culprits named were exactly
    want: a set of (rank, kind)). Raises AssertionError after limit_s."""
    while True:
        d = server.call(f"/v1/jobs/{job}/diagnosis")
        elapsed = time.monotonic() - since
        named = {(c["rank"], c["kind"]) for c in d.get("culprits", [])}
        if named:
            return elapsed, d, named == want
        if elapsed > limit_s:
            raise AssertionError(f"nobody named after {elapsed:.1f} s; last diagnosis: "
                                 f"{json.dumps(d)[:3000]}")
        time.sleep(0.05)  # the poll's pace; the server answers at once


def control_run(server, name, job, limit_s=120):
    """Job `name` (a Job) without a fault, asked for a diagnosis every 200 ms
    while it runs: returns (answers, the answers that blamed somebody).
    Raises AssertionError when the job still runs after limit_s."""
    answers, blamed = 0, []
    deadline = time.monotonic() + limit_s
    while job.p.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"job {name} still runs after {limit_s} s")
        try:
            n = server.call(f"/v1/jobs/{name}/diagnosis", "POST")["request"]
            d = server.call(f"/v1/jobs/{name}/diagnosis?request={n}")
        except OSError:
            continue
        answers += 1
        if d["culprits"] or d["stalled"]:
            blamed.append(d)
        time.sleep(0.2)  # the request rate of a control run
    return answers, blamed
