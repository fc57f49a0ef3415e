"""Durable commits (docs/durable.md): an elastic job of two workers commits
every step with KOLO_DURABLE_EVERY=4; when both have reported the commit of
step 11 and the rendezvous records durable commit 8, every worker is
SIGKILLed at once. A new kolorun of the same job (the rendezvous server
outlives the workers) resumes from commit 8 (3 commits lost, at most 4) and
ends with the state of an uninterrupted run of the same size, bitwise."""

import os
import re
import time
import urllib.error

import pytest

from conftest import KOLORUN, requires_torch
from diag_jobs import Job, Server

STEPS, EVERY, HOLD = 20, 4, 11
DURABLE = HOLD - HOLD % EVERY


def job(server, name, state, env, hold=-1):
    args = ["--state", state, "--steps", STEPS, "--hold-at", hold]
    return Job(server, name, args, np_=2, env=env, script="durable_worker.py",
               launcher_args=["--min-np", 2, "--max-np", 2])


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
    """Until the rendezvous has dropped every worker of job name (their
    leases ran out): workers that come back then form a new round."""
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


@pytest.mark.parametrize("state", ["object", pytest.param("torch", marks=requires_torch)])
def test_every_worker_lost_then_resumed(tmp_path, state):
    server = Server(tmp_path, env={"KOLO_LEASE_MS": "1000"})
    durable = tmp_path / "durable"
    durable.mkdir()
    env = {"KOLO_DURABLE_DIR": durable, "KOLO_DURABLE_EVERY": EVERY, "KOLO_LOG_LEVEL": "info"}
    name = f"durable-{state}"
    try:
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

        ref = job(server, f"reference-{state}", state, {})
        reference = finish(ref)
        assert [e["step"] for e in resumed] == [STEPS, STEPS]
        assert {e["result"] for e in resumed} == {reference[0]["result"]}
        assert {e["result"] for e in reference} == {reference[0]["result"]}
    finally:
        for j in ("first", "again", "ref"):
            if j in locals() and locals()[j].p.poll() is None:
                locals()[j].kill()
        server.close()


def test_c_state_api_resumes(tmp_path):
    """The C state API (kolo_elastic_run over registered buffers,
    tests/elastic/elastic_worker.c): killed once the rendezvous records a
    durable commit, resumed from the file's commit; every step is applied
    exactly once over both runs (the worker checks its accumulator)."""
    worker = os.path.join(os.path.dirname(KOLORUN), "elastic_worker")
    server = Server(tmp_path, env={"KOLO_LEASE_MS": "1000"})
    durable = tmp_path / "durable"
    durable.mkdir()
    env = {"KOLO_DURABLE_DIR": durable, "KOLO_DURABLE_EVERY": EVERY, "KOLO_LOG_LEVEL": "info"}
    cmd = [worker, 60, 8, 20]
    try:
        first = Job(server, "durable-c", [], np_=2, env=env, command=cmd,
                    launcher_args=["--min-np", 2, "--max-np", 2])
        wait_recorded(server, "durable-c", 2 * EVERY)
        first.kill()
        wait_gone(server, "durable-c")
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
