"""Durable commits (docs/durable.md): an elastic job of two workers commits
every step with KOLO_DURABLE_EVERY=4; when both have reported the commit of
step 11 and the rendezvous records durable commit 8, every worker is
SIGKILLed at once. A new kolorun of the same job (the rendezvous server
outlives the workers) resumes from commit 8 (3 commits lost, at most 4) and
ends with the state of an uninterrupted run of the same size, bitwise:
for an ObjectState, a TorchState and a Keras 3 KerasState on the tensorflow
backend (kolo.tensorflow.keras).

Who tells the server that the workers are gone: nobody when their kolorun
dies with them (the leases run out); their kolorun, as it reaps them, when
it lives (it then restarts them with --restart-failed, or exits)."""

import importlib.util
import os
import re
import signal
import time
import urllib.error

import numpy as np
import pytest

from conftest import KOLORUN, requires_torch
from diag_jobs import Job, Server

STEPS, EVERY, HOLD = 20, 4, 11
DURABLE = HOLD - HOLD % EVERY

requires_tf_keras = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("tensorflow", "keras")),
    reason="no tensorflow or keras (scripts/setup.sh installs them)")


def job(server, name, state, env, hold=-1, launcher_args=()):
    args = ["--state", state, "--steps", STEPS, "--hold-at", hold]
    return Job(server, name, args, np_=2, env=env, script="durable_worker.py",
               launcher_args=["--min-np", 2, "--max-np", 2, *launcher_args])


def events(j, ev, n=2):
    return [j.wait_event(ev) for _ in range(n)]


def recorded(server, name):
    """The durable commit the rendezvous records for job name, or -1."""
    try:
        return server.call(f"/v1/jobs/{name}/kv/durable/commit")["commit"]
    except urllib.error.HTTPError:
        return -1


def wait_recorded(server, name, want, limit_s=30):
    deadline = time.monotonic() + limit_s
    while (got := recorded(server, name)) < want:
        assert time.monotonic() < deadline, f"durable commit {want} not recorded (last {got})"
        time.sleep(0.02)  # the poll's pace; the write is what is awaited
    return got


def wait_gone(server, name, limit_s=30):
    """Until the rendezvous has dropped every worker of job name: when their
    kolorun died with them nobody reports them, and their leases must run
    out before workers that come back can form a round without them."""
    deadline = time.monotonic() + limit_s
    while True:
        st = server.call(f"/v1/jobs/{name}")
        if not st["members"] and not st["waiting"]:
            return
        assert time.monotonic() < deadline, f"workers of {name} still there: {st}"
        time.sleep(0.05)  # the poll's pace; the leases' end is what is awaited


def file_commit(path):
    with open(path, "rb") as f:
        head = f.read(40)
    assert head[:8] == b"KOLODUR\0"
    return int.from_bytes(head[16:24], "little")


def finish(j):
    done = events(j, "done")
    assert j.p.wait(timeout=60) == 0, "".join(j.lines[-40:])
    return done


@pytest.mark.parametrize("state", ["object", pytest.param("torch", marks=requires_torch),
                                   pytest.param("keras", marks=requires_tf_keras)])
def test_every_worker_lost_then_resumed(tmp_path, state):
    server = Server(tmp_path, env={"KOLO_LEASE_MS": "1000"})
    durable = tmp_path / "durable"
    durable.mkdir()
    env = {"KOLO_DURABLE_DIR": durable, "KOLO_DURABLE_EVERY": EVERY, "KOLO_LOG_LEVEL": "info"}
    name = f"durable-{state}"
    try:
        # The uninterrupted run of the same size, a job of its own beside the first
        ref = job(server, f"reference-{state}", state, {})
        first = job(server, name, state, env, hold=HOLD)
        assert [e["step"] for e in events(first, "start")] == [0, 0]
        assert [e["step"] for e in events(first, "held")] == [HOLD, HOLD]
        assert wait_recorded(server, name, DURABLE) == DURABLE
        first.kill()
        wait_gone(server, name)
        assert file_commit(durable / f"kolo-{name}.state") == DURABLE

        again = job(server, name, state, env)
        starts = events(again, "start")
        assert [e["step"] for e in starts] == [DURABLE, DURABLE], "".join(again.lines[-40:])
        assert HOLD - DURABLE <= EVERY
        resumed = finish(again)
        log = "".join(again.lines)
        assert f"resuming from durable commit {DURABLE}" in log, log[-4000:]
        assert recorded(server, name) == STEPS - STEPS % EVERY

        reference = finish(ref)
        assert [e["step"] for e in resumed] == [STEPS, STEPS]
        assert {e["result"] for e in resumed} == {reference[0]["result"]}
        assert {e["result"] for e in reference} == {reference[0]["result"]}
    finally:
        for j in ("first", "again", "ref"):
            if j in locals() and locals()[j].p.poll() is None:
                locals()[j].kill()
        server.close()


def object_reference(steps, size=2):
    """The object state's final bytes (hex) after steps steps on size ranks,
    computed here with the worker's float64 arithmetic (a sum of two
    doubles is the same in any order)."""
    total = 0.0
    for s in range(steps):
        total = total * 0.75 + sum((r + 1) * (s + 1) / 7.0 for r in range(size))
    return np.float64(total).tobytes().hex()


def test_every_worker_killed_restarted(tmp_path):
    """kolorun --restart-failed, the default 10 s lease: every worker is
    SIGKILLed at once while kolorun lives. kolorun tells the rendezvous that
    each is gone as it reaps it, so its replacements form a round and resume
    from the durable commit at once, not after the dead workers' leases."""
    lease_ms = 10000  # KOLO_LEASE_MS's default
    server = Server(tmp_path, env={"KOLO_LEASE_MS": str(lease_ms)})
    durable = tmp_path / "durable"
    durable.mkdir()
    env = {"KOLO_DURABLE_DIR": durable, "KOLO_DURABLE_EVERY": EVERY, "KOLO_LOG_LEVEL": "info"}
    env["KOLO_ELASTIC"] = 1  # kolorun: a dead worker is replaced, not the job's end
    name = "durable-restarted"
    # Rounds of exactly 2, formed as soon as both are there (kolorun -np 2
    # --min-np 2 --max-np 2 leaves the server's defaults: min 1, settle 2 s).
    server.call(f"/v1/jobs/{name}", "PUT", {"min_np": 2, "max_np": 2})
    try:
        first = job(server, name, "object", env, hold=HOLD, launcher_args=["--restart-failed"])
        assert [e["step"] for e in events(first, "start")] == [0, 0]
        assert [e["step"] for e in events(first, "held")] == [HOLD, HOLD]
        assert wait_recorded(server, name, DURABLE) == DURABLE
        killed = list(first.pids)
        assert len(killed) == 2
        t0 = time.monotonic()
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        starts = events(first, "start")
        took = max(e["_at"] for e in starts) - t0
        assert {e["pid"] for e in starts}.isdisjoint(killed)
        assert [e["step"] for e in starts] == [DURABLE, DURABLE], "".join(first.lines[-40:])
        assert took < 3.0, f"resumed {took:.1f} s after the kill (lease {lease_ms} ms):\n" + \
            "".join(first.lines[-40:])
        done = finish(first)
        assert [e["step"] for e in done] == [STEPS, STEPS]
        assert {e["result"] for e in done} == {object_reference(STEPS)}
    finally:
        if "first" in locals() and first.p.poll() is None:
            first.kill()
        server.close()


def children(pid):
    """The pids of pid's children (kolorun forks from its only thread)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def test_c_state_api_resumes(tmp_path):
    """The C state API (kolo_elastic_run over registered buffers,
    tests/elastic/elastic_worker.c): every worker killed once the rendezvous
    records a durable commit, resumed by a new kolorun from the file's
    commit; every step is applied exactly once over both runs (the worker
    checks its accumulator). The first kolorun, left with no worker, has
    told the rendezvous that each is dead before it exits: the server holds
    none of them although their leases (the default 10 s) still run."""
    worker = os.path.join(os.path.dirname(KOLORUN), "elastic_worker")
    server = Server(tmp_path, env={"KOLO_LEASE_MS": "10000"})
    durable = tmp_path / "durable"
    durable.mkdir()
    env = {"KOLO_DURABLE_DIR": durable, "KOLO_DURABLE_EVERY": EVERY, "KOLO_LOG_LEVEL": "info",
           "KOLO_ELASTIC": 1}
    cmd = [worker, 60, 8, 20]
    try:
        first = Job(server, "durable-c", [], np_=2, env=env, command=cmd,
                    launcher_args=["--min-np", 2, "--max-np", 2])
        wait_recorded(server, "durable-c", 2 * EVERY)
        workers = children(first.p.pid)
        assert len(workers) == 2, workers
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        assert first.p.wait(timeout=30) == 128 + signal.SIGKILL, "".join(first.lines[-40:])
        st = server.call("/v1/jobs/durable-c")
        assert not st["members"] and not st["waiting"], f"{st}\n" + "".join(first.lines[-40:])
        commit = file_commit(durable / "kolo-durable-c.state")
        assert commit % EVERY == 0 and commit >= 2 * EVERY
        again = Job(server, "durable-c", [], np_=2, env=env, command=cmd,
                    launcher_args=["--min-np", 2, "--max-np", 2])
        assert again.p.wait(timeout=90) == 0, "".join(again.lines[-40:])
        log = "".join(again.lines)
        assert f"resuming from durable commit {commit}" in log, log[-4000:]
        assert re.search(rf"ROUND \d+ size 2 rank 0 step {commit}\n", log), log[-4000:]
        assert log.count("RESULT ok") == 2, log[-4000:]
    finally:
        for j in ("first", "again"):
            if j in locals() and locals()[j].p.poll() is None:
                locals()[j].kill()
        server.close()
