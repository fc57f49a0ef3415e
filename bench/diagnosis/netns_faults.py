#!/usr/bin/env python3
"""Network faults under the hang diagnosis, on network-namespace hosts.

Each trial runs a non-elastic job of --hosts workers, one per host
(tests/netns/kolo-netns.sh), of tests/python/workers/diag_worker.py: a loop of
--elements float32 allreduces, against a kolo-rendezvous on the bridge. When
rank 0 has finished a random step, one fault hits the next allreduce in flight:
  slowlink  a random host's link is shaped down to --slow-rate in both
            directions (tc tbf)                         -> link, naming its rank
  cut       traffic between the hosts of a random rank and of the next rank of
            the ring is dropped; both still reach the rendezvous
                                                        -> link, naming both
  killhost  a random host's link goes down and its worker is SIGKILLed
                                                        -> dead or unresponsive
  control   no fault; a diagnosis every 200 ms for --control-seconds must
            blame nobody
For a fault it polls GET /v1/jobs/{job}/diagnosis?min_ms=THRESHOLD every 50 ms
until somebody is named, and records whether exactly the right culprit and
kind were named first, and the time from the fault to the answer. The workers
keep the transport's defaults: the liveness probe (docs/transport.md) fails a
collective whose peer host stopped acknowledging for KOLO_PROBE_TIMEOUT_MS
(1000 ms), about 1.4 s after a cut, and that ends a non-elastic job. So the
workers' KOLO_DIAG_THRESHOLD_MS (--threshold-ms, 500) is below the probe's
timeout: the diagnosis names the fault while the job hangs, before the probe
ends it; the trial line adds the errors the workers saw by then.
docs/diagnosis.md, "Network faults".

Needs root; exits 77 otherwise. With --check it exits 1 when the precision is
below 95 % or a control run blamed somebody.

  python bench/diagnosis/netns_faults.py --trials slowlink=12,cut=12,killhost=12,control=6
"""

import argparse
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NETNS = os.path.join(ROOT, "tests", "netns", "kolo-netns.sh")
WORKERS = os.path.join(ROOT, "tests", "python", "workers")
KINDS = ("slowlink", "cut", "killhost", "control")
_RESULT = re.compile(r"^KOLO-RESULT (.*)$")


class Ctx:
    """The namespace hosts, the server on the bridge, and the options."""

    def __init__(self, a, prefix, tmp):
        self.a, self.prefix, self.tmp = a, prefix, tmp
        self.token = os.path.join(tmp, "token")
        with open(self.token, "w") as f:
            f.write("netns-diagnosis-token-0123456789\n")
        self.server = subprocess.Popen(
            [os.path.join(a.bin, "kolo-rendezvous"), "--listen", "10.77.0.254:0",
             "--token-file", self.token, "--min-np", str(a.hosts), "--max-np", str(a.hosts),
             "--settle-ms", "200"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        m = re.match(r"listening on (\S+)", self.server.stdout.readline())
        if not m:
            self.server.kill()
            raise SystemExit("kolo-rendezvous did not start")
        self.url = "http://" + m.group(1)
        threading.Thread(target=self.server.stdout.read, daemon=True).start()  # its log

    def ns(self, *args):
        subprocess.run([NETNS, "--prefix", self.prefix, *map(str, args)], check=True,
                       stdout=subprocess.DEVNULL)

    def call(self, path, method="GET"):
        with open(self.token) as f:
            auth = "Bearer " + f.read().strip()
        req = urllib.request.Request(self.url + path, method=method,
                                     headers={"Authorization": auth})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def close(self):
        self.server.kill()
        self.server.wait()


class Job:
    """One worker per host; their KOLO-RESULT events in one queue."""

    def __init__(self, ctx, name):
        a = ctx.a
        env = {k: v for k, v in os.environ.items() if not k.startswith("KOLO_")}
        env.update({"KOLO_RENDEZVOUS": ctx.url, "KOLO_JOB": name, "KOLO_TOKEN_FILE": ctx.token,
                    "KOLO_DIAG_THRESHOLD_MS": str(a.threshold_ms), "KOLO_LOG_LEVEL": "error",
                    "KOLO_FLIGHT_DIR": ctx.tmp, "KOLO_LIBRARY": os.path.join(a.lib, "libkolo.so"),
                    "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "python"), WORKERS]),
                    "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"})
        cmd = [a.python, os.path.join(WORKERS, "diag_worker.py"), "--mode", "control",
               "--seconds", "100000", "--elements", str(a.elements), "--progress"]
        self.name = name
        self.events, self.lines = queue.Queue(), []
        self.procs = [subprocess.Popen([NETNS, "--prefix", ctx.prefix, "exec", str(h), *cmd],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, env=env) for h in range(a.hosts)]
        for h, p in enumerate(self.procs):
            threading.Thread(target=self._read, args=(h, p), daemon=True).start()
        self.host_of, self.pid_of, self.failed = {}, {}, {}

    def _read(self, host, p):
        for line in p.stdout:
            self.lines.append(f"h{host}: {line}")
            m = _RESULT.match(line.strip())
            if m:
                self.events.put(dict(json.loads(m.group(1)), _host=host))

    def pump(self, timeout):
        """The next event (None after timeout); keeps ranks, pids and failures."""
        try:
            e = self.events.get(timeout=max(timeout, 0))
        except queue.Empty:
            return None
        if e["ev"] == "ready":
            self.host_of[e["rank"]], self.pid_of[e["rank"]] = e["_host"], e["pid"]
        elif e["ev"] == "failed":
            self.failed[e["_host"]] = e["error"]
        return e

    def wait_step(self, step, timeout=120):
        """Until rank 0 has finished `step` (every rank is ready by then)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            e = self.pump(deadline - time.monotonic())
            if e and e["ev"] == "step" and self.host_of.get(0) == e["_host"] and e["step"] >= step:
                return
            if e and e["ev"] in ("failed", "wrong"):
                break
        raise SystemExit(f"FAIL: rank 0 did not reach step {step}:\n" + "".join(self.lines[-30:]))

    def kill(self):
        for pid in self.pid_of.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            p.kill()
            p.wait(timeout=30)


def inject(ctx, job, kind, victim, peer):
    """The fault, and the undo that the trial runs at its end."""
    hv, hp = job.host_of[victim], job.host_of[peer]
    if kind == "slowlink":
        ctx.ns("rate", hv, ctx.a.slow_rate)
        return lambda: ctx.ns("rate", hv, "off")
    if kind == "cut":
        ctx.ns("block", hv, hp, "on")
        return lambda: ctx.ns("block", hv, hp, "off")
    ctx.ns("link", hv, "down")
    os.kill(job.pid_of[victim], signal.SIGKILL)
    return lambda: ctx.ns("link", hv, "up")


def right(kind, culprits, victim, peer):
    """Whether the culprits are exactly the expected ones."""
    if len(culprits) != 1:
        return False
    c = culprits[0]
    if kind == "killhost":
        return c["rank"] == victim and c["kind"] in ("dead", "unresponsive")
    pair = {c["rank"], c.get("peer_rank")}
    return c["kind"] == "link" and (victim in pair if kind == "slowlink" else
                                    pair == {victim, peer})


def fault_trial(ctx, i, kind, rng):
    a = ctx.a
    job = Job(ctx, f"netns-{i}-{kind}")
    undo = None
    try:
        at = rng.randrange(3, 20)
        victim = rng.randrange(a.hosts)
        peer = (victim + 1) % a.hosts
        job.wait_step(at)
        t0 = time.monotonic()
        undo = inject(ctx, job, kind, victim, peer)
        path = f"/v1/jobs/netns-{i}-{kind}/diagnosis?min_ms={a.threshold_ms}"
        limit = a.threshold_ms / 1000 + 10
        while True:
            d = ctx.call(path)
            t = time.monotonic() - t0
            if d["culprits"] or t > limit:
                break
            time.sleep(0.05)  # the poll's pace; the server answers at once
        if a.doctor and d["culprits"]:
            # What a user would see, once the op is as old as kolo-doctor's (the server's
            # default) min_ms, 1000 ms; no new request: a killed host would hold it back.
            while time.monotonic() - t0 < 3 and not ctx.call(path.split("?")[0])["stalled"]:
                time.sleep(0.02)
            doc = subprocess.run([os.path.join(a.bin, "kolo-doctor"), ctx.url, job.name,
                                  "--no-request"], stdout=subprocess.PIPE, text=True,
                                 env=dict(os.environ, KOLO_TOKEN_FILE=ctx.token))
            print(f"$ kolo-doctor {ctx.url} {job.name} --no-request\n{doc.stdout}"
                  f"exit status {doc.returncode}", flush=True)
        while job.pump(0.05):  # the workers' errors so far
            pass
        ok = bool(d["culprits"]) and right(kind, d["culprits"], victim, peer)
        errs = "; ".join(f"h{h}: {e[:120]}" for h, e in sorted(job.failed.items()))
        what = f"{kind} rank {victim} (h{job.host_of[victim]})" + (
            f"-rank {peer} (h{job.host_of[peer]})" if kind == "cut" else "") + f" after step {at}"
        return ok, (t if d["culprits"] else None), what, d["summary"], errs
    finally:
        job.kill()
        if undo:
            undo()


def control_trial(ctx, i):
    name = f"netns-{i}-control"
    job = Job(ctx, name)
    try:
        job.wait_step(3)
        answers, blamed = 0, 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < ctx.a.control_seconds:
            n = ctx.call(f"/v1/jobs/{name}/diagnosis", "POST")["request"]
            d = ctx.call(f"/v1/jobs/{name}/diagnosis?request={n}&min_ms={ctx.a.threshold_ms}")
            answers += 1
            blamed += bool(d["culprits"] or d["stalled"])
            time.sleep(0.2)  # the request rate of a control run
            while job.pump(0):
                pass
        if job.failed:
            raise SystemExit(f"FAIL: control job failed: {job.failed}")
        return answers, blamed
    finally:
        job.kill()


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def run(a, prefix):
    rng = random.Random(a.seed)
    plan = [k for k, n in a.plan.items() for _ in range(n)]
    rng.shuffle(plan)
    res = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Ctx(a, prefix, tmp)
        try:
            for i, kind in enumerate(plan):
                if kind == "control":
                    answers, blamed = control_trial(ctx, i)
                    res[kind].append((not blamed, answers))
                    print(f"trial {i:3d} control : {answers} diagnoses, {blamed} blamed somebody",
                          flush=True)
                    continue
                ok, t, what, summary, errs = fault_trial(ctx, i, kind, rng)
                res[kind].append((ok, t))
                ts = f"{t:.2f} s" if t is not None else "never"
                print(f"trial {i:3d} {what}: {'right' if ok else 'WRONG'} after {ts}: {summary}"
                      + (f" | errors: {errs}" if errs else ""), flush=True)
        finally:
            ctx.close()
    print(f"\n{len(plan)} trials, {a.hosts} hosts x 1 rank, {a.elements * 4 >> 20} MiB "
          f"allreduces, threshold {a.threshold_ms} ms, slow link {a.slow_rate}")
    print(f"{'kind':9s} {'trials':>6s} {'right':>6s} {'p50 s':>7s} {'p90 s':>7s} {'max s':>7s}")
    for k in KINDS[:3]:
        times = [t for ok, t in res[k] if ok]
        print(f"{k:9s} {len(res[k]):6d} {sum(ok for ok, _ in res[k]):6d} {pct(times, 0.5):7.2f} "
              f"{pct(times, 0.9):7.2f} {max(times) if times else float('nan'):7.2f}")
    clean = sum(ok for ok, _ in res["control"])
    print(f"control   {len(res['control']):6d} {clean:6d}  ({sum(n for _, n in res['control'])} "
          f"diagnoses, {len(res['control']) - clean} runs blamed somebody)")
    faults = [x for k in KINDS[:3] for x in res[k]]
    n_right = sum(ok for ok, _ in faults)
    within = sum(1 for ok, t in faults if ok and t <= a.threshold_ms / 1000 + 2)
    precision = 100 * n_right / max(len(faults), 1)
    print(f"precision {n_right}/{len(faults)} = {precision:.1f} %; named within threshold + 2 s: "
          f"{within}/{len(faults)}")
    return 1 if a.check and (precision < 95 or clean < len(res["control"])) else 0


def parse_plan(text):
    plan = {}
    for part in text.split(","):
        k, _, n = part.partition("=")
        if k not in KINDS or not n.isdigit():
            raise argparse.ArgumentTypeError(f"bad trials '{part}' (KIND=N, KIND in {KINDS})")
        plan[k] = int(n)
    return plan


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=parse_plan, dest="plan",
                    default=parse_plan("slowlink=12,cut=12,killhost=12,control=6"))
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--elements", type=int, default=1 << 20, help="float32 per allreduce")
    ap.add_argument("--threshold-ms", type=int, default=500)
    ap.add_argument("--slow-rate", default="8kbit", help="kolo-netns.sh rate of slowlink")
    ap.add_argument("--control-seconds", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--doctor", action="store_true",
                    help="print kolo-doctor's answer once a fault is named")
    ap.add_argument("--bin", default=os.environ.get("KOLO_BIN", os.path.join(ROOT, "build", "bin")))
    ap.add_argument("--python", default=sys.executable, help="the workers' interpreter")
    ap.add_argument("--inside", help=argparse.SUPPRESS)  # the prefix, in the bridge namespace
    a = ap.parse_args()
    a.lib = os.path.join(os.path.dirname(a.bin), "lib")
    if a.inside:
        return run(a, a.inside)
    if os.geteuid() != 0:
        print("SKIP: needs root (network namespaces)")
        return 77
    prefix = f"kdg{os.getpid()}"
    if subprocess.run([NETNS, "--prefix", prefix, "up", str(a.hosts)],
                      stdout=subprocess.DEVNULL).returncode != 0:
        print("SKIP: cannot create the namespace hosts")
        return 77
    try:
        # The rendezvous and this script's HTTP calls live on the bridge (10.77.0.254),
        # which the root namespace cannot reach.
        return subprocess.run([NETNS, "--prefix", prefix, "exec", "br", sys.executable,
                               os.path.abspath(__file__), *sys.argv[1:], "--inside",
                               prefix]).returncode
    finally:
        subprocess.run([NETNS, "--prefix", prefix, "down"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main())
