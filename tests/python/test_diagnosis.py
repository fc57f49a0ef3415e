"""Hang diagnosis end to end: 4 ranks under kolorun against a
kolo-rendezvous, one fault injected (a rank stopped with SIGSTOP, a rank
that skips one allreduce, a rank blocked outside kolo), and the job's
diagnosis pulled from the server while the job hangs. It must name the
right rank and kind, and nobody else first (bench/diagnosis/faults.py
measures the time to name over many trials; CI's machines are loaded, so
the bound here is loose); a run without a fault, asked for a diagnosis
every 200 ms, must never blame anybody. docs/diagnosis.md."""

import os
import subprocess
import time

import pytest

from diag_jobs import DOCTOR, Job, Server, control_run, diagnose_until

THRESHOLD_S = 1.0
NP = 4


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    yield s
    s.close()


@pytest.mark.parametrize("mode,kind", [("stop", "unresponsive"), ("skip", "not_submitted"),
                                       ("hang", "not_submitted")])
def test_names_the_culprit_while_it_hangs(server, mode, kind):
    name = f"diag-{mode}"
    job = Job(server, name, ["--mode", mode, "--victim", 2, "--at", 30, "--seconds", 600],
              NP, int(THRESHOLD_S * 1000))
    try:
        fault = job.wait_event("fault")
        elapsed, d, exact = diagnose_until(server, name, {(2, kind)}, fault["_at"],
                                           THRESHOLD_S + 20)
        assert exact, f"named {d['culprits']}, not rank 2 ({kind}) alone"
        assert d["stalled_op"]["name"] == "step.30", d["stalled_op"]
        assert sorted(d["stalled_op"]["waiting_ranks"]) == [0, 1, 3], d["stalled_op"]
        # Its neighbours on the host see its process: stopped, or running.
        want = "stopped" if mode == "stop" else "running"
        assert d["culprits"][0]["process"] == want, d["culprits"]
        # The words, as an operator sees them.
        doc = subprocess.run([DOCTOR, server.url, name, "--wait-ms", "1500"],
                             capture_output=True, text=True, timeout=30,
                             env=dict(os.environ, KOLO_TOKEN_FILE=server.token))
        assert doc.returncode == 1, doc.stdout + doc.stderr
        assert "rank 2" in doc.stdout.splitlines()[0], doc.stdout
        print(f"{mode}: named rank 2 ({kind}) {elapsed:.2f} s after the fault: {d['summary']}")
    finally:
        job.kill()


def test_straggler_is_logged(server):
    """Rank 2 computes 20 ms longer before every step: the diagnosis lists it
    as the straggler while the job runs, rank 0 logs it
    (KOLO_STRAGGLER_LOG_S=1), and neither names another rank."""
    job = Job(server, "diag-slow", ["--mode", "slow", "--victim", 2, "--seconds", 5], NP,
              60000, env={"KOLO_STRAGGLER_LOG_S": 1, "KOLO_LOG_LEVEL": "warn"})
    try:
        for _ in range(NP):
            job.wait_event("ready")
        listed, deadline = [], time.monotonic() + 120
        while job.p.poll() is None and not listed:
            assert time.monotonic() < deadline, "the job still runs after 120 s"
            try:
                n = server.call("/v1/jobs/diag-slow/diagnosis", "POST")["request"]
                d = server.call(f"/v1/jobs/diag-slow/diagnosis?request={n}")
            except OSError:
                continue
            listed = d.get("stragglers", [])
            assert not d["culprits"], d["culprits"]
            time.sleep(0.2)  # the request rate, as in a control run
        assert [s["rank"] for s in listed] == [2], listed
        assert listed[0]["p50_ms"] >= 10, listed
        assert job.p.wait(timeout=120) == 0, "".join(job.lines[-40:])
        lines = [x for x in job.lines if "straggler: rank" in x]
        assert lines, "no straggler line:\n" + "".join(job.lines[-40:])
        assert all("straggler: rank 2 submitted last" in x for x in lines), lines
        assert all(x.startswith("[0]") for x in lines), lines
        print(lines[-1].strip())
    finally:
        job.kill()


def test_no_blame_without_a_fault(server):
    job = Job(server, "diag-control", ["--mode", "control", "--seconds", 5], NP,
              int(THRESHOLD_S * 1000))
    try:
        for _ in range(NP):
            job.wait_event("ready")
        answers, blamed = control_run(server, "diag-control", job)
        assert not blamed, blamed[0]
        assert job.p.wait(timeout=60) == 0, "".join(job.lines[-40:])
        assert answers >= 5, f"only {answers} diagnoses while the job ran"
        done = [line for line in job.lines if '"ev": "done"' in line]
        assert len(done) == NP, "".join(job.lines[-40:])
    finally:
        job.kill()
