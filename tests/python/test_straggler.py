"""The straggler eviction policy of elastic jobs (docs/diagnosis.md,
"Evicting a straggler"): workers/straggler_worker.py under kolorun with
KOLO_STRAGGLER_EVICT_PCT set. A rank that shares its CPU with a busy
process (or sleeps longer every step) is evicted at a commit point, exits
with kolo.EXIT_EVICTED and is not restarted; the others go on without
rolling back (a spare keeps the job at its size); nobody else is evicted,
nobody at all in a run without a straggler, and never below min-np.

Every job checks its own arithmetic: each step adds the allreduced sum of
the ranks' contributions (size * (size + 1) / 2) to the committed total,
so the survivors' totals say at which size every step ran."""

import json
import os
import re
import subprocess

import pytest

from conftest import KOLORUN, PYTHON, WORKERS, kolorun, results, worker_env
from diag_jobs import Server

SCRIPT = str(WORKERS / "straggler_worker.py")
WINDOW = 40
# A rank beside two busy processes computes 3 times as long (200 % on the
# others); in runs without one, a rank of this 2-core machine that keeps
# losing the race for a core was seen up to 40 % slower.
POLICY = {"KOLO_STRAGGLER_EVICT_PCT": "80", "KOLO_STRAGGLER_EVICT_STEPS": str(WINDOW),
          "KOLO_IFACE": "127.0.0.1"}
TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                              reason="a CPU hog beside one rank needs two CPUs")


def events(proc):
    """Every reported object, whichever worker printed it (a spare's lines
    start with [wN] until it has a rank)."""
    return [o for objs in results(proc).values() for o in objs] + [
        json.loads(m) for m in re.findall(r"^\[w\d+\] KOLO-RESULT (.*)$", proc.stdout, re.M)]


def job(np_, args, env=None, launcher=(), timeout=150):
    proc = kolorun(np_, [PYTHON, SCRIPT, *args], timeout=timeout, env=env,
                   launcher_args=launcher)
    ev = events(proc)
    return proc, [e for e in ev if e["ev"] == "done"], [e for e in ev if e["ev"] == "exit"], \
        [e for e in ev if e["ev"] == "ready"]


def total(steps_at):
    """The committed total after steps at the sizes given [(steps, size)]."""
    return sum(k * s * (s + 1) / 2 for k, s in steps_at)


@TWO_CPUS
@pytest.mark.parametrize("victim", [0, 1])
def test_hog_is_evicted_and_a_spare_keeps_the_size(victim):
    steps = 250
    proc, done, exits, ready = job(2, ["--mode", "hog", "--victim", victim, "--steps", steps,
                                       "--work", 400], env=POLICY, launcher=["--spares", 1])
    hog = [r for r in ready if r["victim"]]
    assert len(hog) == 1, ready
    assert [(e["pid"], e["code"]) for e in exits] == [(hog[0]["pid"], 90)], proc.stderr[-3000:]
    # Evicted within four windows: the first one whole, unless a passing
    # disturbance of the shared machine broke the rule in it.
    assert exits[0]["step"] <= 4 * WINDOW + 1, exits
    assert re.search(rf"straggler: evicting rank {victim} on host \S+ from round 1: rank "
                     rf"{victim} was the slowest in \d+ of the last {WINDOW} steps", proc.stderr)
    assert f"rank {victim} (pid {hog[0]['pid']}) was evicted as a straggler; not restarted" \
        in proc.stderr
    # The spare took its place at the commit point: every step ran at size 2.
    assert sorted(d["rank"] for d in done) == [0, 1], done
    for d in done:
        assert (d["step"], d["size"], d["total"]) == (steps, 2, total([(steps, 2)])), d
        assert not d["victim"]
    assert proc.stderr.count("straggler: evicting") == 1


def test_slow_rank_among_four_shrinks_the_job():
    steps = 150
    proc, done, exits, ready = job(4, ["--mode", "slow", "--victim", 2, "--steps", steps,
                                       "--work", 0, "--delay-ms", 15],
                                   env=POLICY, launcher=["--min-np", 3, "--max-np", 4])
    slow = [r for r in ready if r["victim"]]
    assert [(e["pid"], e["code"]) for e in exits] == [(slow[0]["pid"], 90)], proc.stderr[-3000:]
    k = exits[0]["step"]  # the commit point it left at: steps 1..k ran at size 4
    assert len(done) == 3, done
    for d in done:
        assert (d["step"], d["size"], d["total"]) == (steps, 3, total([(k, 4), (steps - k, 3)]))
    assert proc.stderr.count("straggler: evicting") == 1


@TWO_CPUS
def test_never_below_min_np():
    steps = 150
    proc, done, exits, _ = job(2, ["--mode", "hog", "--victim", 1, "--steps", steps, "--work",
                                   400], env={**POLICY, "KOLO_ELASTIC": "1"})
    assert exits == [] and len(done) == 2, proc.stderr[-3000:]
    assert "evicting" not in proc.stderr
    refused = re.findall(r"straggler: rank 1 was the slowest .*; not evicted: 2 workers and 0 "
                         r"waiting, and the job needs at least 2 \(min-np\)", proc.stderr)
    assert len(refused) == 1, proc.stderr[-3000:]  # said once per round
    for d in done:
        assert d["total"] == total([(steps, 2)])


@TWO_CPUS
def test_off_by_default():
    proc, done, exits, _ = job(2, ["--mode", "hog", "--victim", 1, "--steps", 100, "--work",
                                   400], env={"KOLO_IFACE": "127.0.0.1"},
                               launcher=["--spares", 1])
    assert exits == [] and len(done) == 2 and "evict" not in proc.stderr


def test_control_run_evicts_nobody():
    proc, done, exits, _ = job(2, ["--mode", "none", "--steps", 300, "--work", 400],
                               env=POLICY, launcher=["--spares", 1])
    assert exits == [] and len(done) == 2, proc.stderr[-3000:]
    assert "evict" not in proc.stderr


@TWO_CPUS
def test_a_launcher_whose_workers_were_all_evicted_exits_90(tmp_path):
    """Two kolorun instances (two pods) against one kolo-rendezvous: the one
    whose only worker was evicted exits 90, the other 0 with the job done."""
    server = Server(tmp_path)
    steps = 250
    try:
        def launch(victim):
            env = worker_env({**POLICY, "STRAGGLER_VICTIM": int(victim)})
            cmd = [KOLORUN, "-np", "1", "--min-np", "1", "--max-np", "2", "--rendezvous",
                   server.url, "--token-file", server.token, "--job", "evict90", "--", PYTHON,
                   SCRIPT, "--mode", "hog", "--victim", "-1", "--steps", str(steps), "--work",
                   "400"]
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env)
        pods = [launch(True), launch(False)]
        outs = [p.communicate(timeout=150) for p in pods]
    finally:
        for p in locals().get("pods", []):
            p.kill()
        server.close()
    assert [p.returncode for p in pods] == [90, 0], outs
    assert "was evicted as a straggler; not restarted" in outs[0][1]
    done = [json.loads(m) for m in re.findall(r"KOLO-RESULT (.*)", outs[1][0])
            if '"done"' in m]
    exits = [json.loads(m) for m in re.findall(r"KOLO-RESULT (.*)", outs[0][0])
             if '"exit"' in m]
    assert len(exits) == 1 and exits[0]["code"] == 90, outs[0]
    k = exits[0]["step"]
    assert len(done) == 1 and done[0]["step"] == steps and done[0]["size"] == 1, outs[1]
    assert done[0]["total"] == total([(k, 2), (steps - k, 1)]), (k, done)
