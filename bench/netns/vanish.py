#!/usr/bin/env python3
"""Vanished hosts, partitions and stalled ranks on network-namespace hosts.

An elastic job of one worker per host (tests/netns/kolo-netns.sh hosts, `kolo-bench elastic
--worker`: a loop of allreduces with a commit after each) against a kolo-rendezvous on the
bridge. Series, each a fresh job:

  busy      a host's link is cut (at the bridge port: it sends nothing, not even a reset)
            while the ring is in the middle of a 16 MiB allreduce
  idle      the same while the ranks compute between small steps (--compute-ms)
  partition traffic between two hosts only is dropped (both still reach the rendezvous) for
            --hold-s seconds: one host is left out, and must not come back before it heals
  stop      a rank is SIGSTOPped for --stop-s seconds and resumed, under full CPU load
  quiet     nothing happens for 10 s per event while 16 MiB allreduces fill the links (with
            --rate, shaped ones): a probe must never be lost on a busy link

For each cut it reports the time from the cut to the first allreduce completed by the re-formed
ring (the slowest survivor's), split by phase as `kolo-bench elastic` does; the link then comes
back and the cut host's worker must join again (the job returns to full size). For `stop` it
reports how many stalls evicted the rank (must be 0). With --check it exits 1 when a bound is
broken (recovery over --max-recovery-s, an eviction by a stall, no rejoin), so a CTest can run it.

Needs root. Usage: vanish.py [--series busy,idle,partition,stop] [--events N] [--check]
"""
import argparse
import os
import random
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NETNS = os.path.join(ROOT, "tests", "netns", "kolo-netns.sh")


class Worker:
    """One worker process on host `host`, with what its lines said."""

    def __init__(self, host, proc, log):
        self.host = host
        self.proc = proc
        self.log = log
        self.buf = b""
        self.round = self.size = self.rank = -1
        self.rounds = []      # (round, size, rank, t_seen)
        self.firsts = []      # dicts of the FIRST lines
        self.last_step = (0, 0, 0)  # round, step, t


class Job:
    def __init__(self, args, prefix, hosts, out):
        self.args = args
        self.prefix = prefix
        self.hosts = hosts
        self.out = out
        self.workers = {}
        self.server = None
        self.url = None

    # ---- processes ---------------------------------------------------------------------
    def ns(self, *cmd, check=True):
        return subprocess.run([NETNS, "--prefix", self.prefix, *cmd], check=check,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def start_server(self):
        log = open(os.path.join(self.out, "rdzv.out"), "w+")
        self.server = subprocess.Popen(
            [NETNS, "--prefix", self.prefix, "exec", "br", os.path.join(self.args.bin,
             "kolo-rendezvous"), "--listen", "10.77.0.254:0", "--min-np", "2", "--max-np",
             str(self.hosts), "--settle-ms", "200"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            log.seek(0)
            m = re.search(r"listening on (\S+)", log.read())
            if m:
                self.url = "http://" + m.group(1)
                return
            if self.server.poll() is not None:
                break
            select.select([], [], [], 0.05)  # polling the server's first line, bounded
        raise SystemExit("the rendezvous server did not start")

    def start_worker(self, host, extra_env=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("KOLO_")}
        env.update({
            "KOLO_RENDEZVOUS": self.url, "KOLO_JOB": "vanish", "KOLO_TOKEN": "vanish-token",
            "KOLO_ELASTIC": "1", "KOLO_HEARTBEAT_MS": "300", "KOLO_ELASTIC_REJOINS": "100",
            "KOLO_LOG_LEVEL": os.environ.get("KOLO_LOG_LEVEL", "warn"),
        })
        for k, v in os.environ.items():  # the caller's tuning passes (KOLO_PROBE_MS ...)
            if k.startswith("KOLO_") and k not in ("KOLO_RENDEZVOUS", "KOLO_JOB", "KOLO_TOKEN"):
                env[k] = v
        env.update(extra_env or {})
        n = sum(1 for w in self.workers.values() if w.host == host)
        log = open(os.path.join(self.out, "h%d.%d.out" % (host, n)), "wb")
        proc = subprocess.Popen(
            [NETNS, "--prefix", self.prefix, "exec", str(host),
             os.path.join(self.args.bin, "kolo-bench"), "elastic", "--worker", "--count",
             str(self.count), "--compute-ms", str(self.compute_ms)],
            stdout=subprocess.PIPE, stderr=log, env=env)
        os.set_blocking(proc.stdout.fileno(), False)
        w = Worker(host, proc, log)
        self.workers[proc.stdout.fileno()] = w
        return w

    def stop_all(self):
        for w in self.workers.values():
            if w.proc.poll() is None:
                w.proc.kill()
        for w in self.workers.values():
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.workers = {}
        if self.server and self.server.poll() is None:
            self.server.kill()
            self.server.wait(timeout=10)
        self.server = None

    # ---- output ------------------------------------------------------------------------
    def pump(self, timeout):
        """Reads every worker's lines for up to `timeout` s (returns after the first batch)."""
        fds = [fd for fd, w in self.workers.items() if w.proc.poll() is None or True]
        r, _, _ = select.select(fds, [], [], max(timeout, 0))
        now = time.monotonic_ns()
        for fd in r:
            w = self.workers[fd]
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                del self.workers[fd]
                self.workers[-fd - 1000] = w  # keep it, but out of the select set
                continue
            w.buf += data
            while b"\n" in w.buf:
                line, w.buf = w.buf.split(b"\n", 1)
                self.on_line(w, line.decode(errors="replace"), now)

    def on_line(self, w, line, now):
        f = line.split()
        if not f:
            return
        if f[0] == "ROUND" and len(f) == 4:
            w.round, w.size, w.rank = int(f[1]), int(f[2]), int(f[3])
            w.rounds.append((w.round, w.size, w.rank, now))
        elif f[0] == "FIRST" and len(f) == 10:
            keys = ["round", "size", "rank", "t_err", "t_start", "t_down", "t_round", "t_conn",
                    "t_first"]
            d = dict(zip(keys, map(int, f[1:])))
            w.round, w.size, w.rank = d["round"], d["size"], d["rank"]
            w.firsts.append(d)
        elif f[0] == "STEP" and len(f) == 4:
            w.last_step = (int(f[1]), int(f[2]), int(f[3]))
        elif f[0] == "WRONG":
            raise SystemExit("wrong allreduce result on host %d: %s" % (w.host, line))

    def live(self):
        return [w for w in self.workers.values() if w.proc.poll() is None]

    def wait_for(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            self.pump(min(0.1, max(deadline - time.monotonic(), 0)))
        if self.args.check:
            self.dump()
            raise SystemExit("FAIL: %s not within %.0f s" % (what, timeout))
        return False

    def formed(self, size):
        """Every live worker is in one round of `size` and has stepped in it."""
        ws = self.live()
        if len(ws) != size:
            return False
        rounds = {w.round for w in ws}
        return (len(rounds) == 1 and all(w.size == size for w in ws) and
                all(w.last_step[0] == w.round for w in ws))

    def dump(self):
        for name in sorted(os.listdir(self.out)):
            path = os.path.join(self.out, name)
            with open(path, errors="replace") as fh:
                lines = fh.readlines()[-15:]
            sys.stderr.write("---- %s\n%s" % (name, "".join(lines)))


def cut(job, kind, victim, other, up):
    """Cuts (up=False) or heals the victim's link, or the victim-other path (partition)."""
    if kind == "partition":
        job.ns("block", str(victim), str(other), "on" if not up else "off")
    else:
        job.ns("link", str(victim), "up" if up else "down")


def series_cut(args, job, kind):
    """Cuts a host `args.events` times; returns the recovery figures (ms) and phases."""
    rows = []
    hosts = job.hosts
    for e in range(args.events):
        job.wait_for(lambda: job.formed(hosts), 60, "the job at size %d" % hosts)
        victim = 1 + e % (hosts - 1) if kind == "partition" else e % hosts
        other = (victim + 1) % hosts if kind == "partition" else None
        # A random moment within a step (busy: mid-allreduce; idle: mostly computing).
        job.pump(random.uniform(0.05, 0.3))
        before = {id(w): len(w.firsts) for w in job.live()}
        t_cut = time.monotonic_ns()
        cut(job, kind, victim, other, up=False)

        def recovered():
            done = [w for w in job.live() if len(w.firsts) > before.get(id(w), 0)
                    and w.firsts[-1]["size"] == hosts - 1]
            return len(done) >= hosts - 1
        ok = job.wait_for(recovered, args.max_recovery_s * 4, "re-formed ring after the cut")
        survivors = [w for w in job.live() if len(w.firsts) > before.get(id(w), 0)
                     and w.firsts[-1]["size"] == hosts - 1]
        if ok and survivors:
            slow = max(survivors, key=lambda w: w.firsts[-1]["t_first"])
            d = slow.firsts[-1]
            det = min(w.firsts[-1]["t_err"] for w in survivors) - t_cut
            row = {"total": (d["t_first"] - t_cut) / 1e6, "detect": det / 1e6,
                   "teardown": (d["t_down"] - d["t_start"]) / 1e6,
                   "round": (d["t_round"] - d["t_down"]) / 1e6,
                   "connect": (d["t_conn"] - d["t_round"]) / 1e6,
                   "first": (d["t_first"] - d["t_conn"]) / 1e6,
                   "cut_out": [w.host for w in job.live() if w not in survivors]}
            rows.append(row)
            print("  %-9s event %d: host %d%s: %.0f ms to the first allreduce of the "
                  "re-formed ring (detect %.0f, teardown %.1f, round %.0f, connect %.1f, "
                  "sync + first %.1f); out: host %s" % (
                      kind, e + 1, victim, "-%d" % other if other is not None else "",
                      row["total"], row["detect"], row["teardown"], row["round"],
                      row["connect"], row["first"], ",".join(map(str, row["cut_out"]))),
                  flush=True)
            if kind == "partition" and len(row["cut_out"]) != 1:
                raise SystemExit("FAIL: the partition took out %s" % row["cut_out"])
        if kind == "partition" and args.hold_s > 0 and ok:
            # The cut stays: the worker that was left out must wait for it to heal
            # instead of joining, being cut off and evicted again at every commit.
            insiders = [w for w in job.live() if w.host not in row["cut_out"]]
            seen = {id(w): len(w.rounds) for w in insiders}
            t_hold = time.monotonic()
            while time.monotonic() - t_hold < args.hold_s:
                job.pump(args.hold_s - (time.monotonic() - t_hold))
            extra = sum(len(w.rounds) - seen[id(w)] for w in insiders)
            print("  %-9s event %d: held %.0f s: %d more re-forms of the others" % (
                kind, e + 1, args.hold_s, extra), flush=True)
            if extra and args.check:
                raise SystemExit("FAIL: %d re-forms while the partition held" % extra)
        # Heal; the host that was left out joins again as a new worker.
        cut(job, kind, victim, other, up=True)
        t_heal = time.monotonic()
        job.wait_for(lambda: job.formed(hosts), 60, "the cut host back in the job")
        print("  %-9s event %d: back at size %d %.1f s after the link returned" % (
            kind, e + 1, hosts, time.monotonic() - t_heal), flush=True)
    return rows


def series_stop(args, job):
    """SIGSTOPs a rank for args.stop_s under full CPU load; returns the evictions."""
    hosts = job.hosts
    job.wait_for(lambda: job.formed(hosts), 60, "the job at size %d" % hosts)
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)]
    evictions = 0
    try:
        for e in range(args.events):
            job.wait_for(lambda: job.formed(hosts), 60, "the job at size %d" % hosts)
            ws = sorted(job.live(), key=lambda w: w.rank)
            w = ws[e % len(ws)]
            rounds = {id(x): x.round for x in ws}
            job.pump(random.uniform(0.05, 0.3))
            # The worker's process is the child of `ip netns exec ... sh -c exec`: the
            # chain execs, so the pid is the worker's own.
            os.kill(w.proc.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            while time.monotonic() - t0 < args.stop_s:
                job.pump(args.stop_s - (time.monotonic() - t0))
            os.kill(w.proc.pid, signal.SIGCONT)
            # Then every rank must keep stepping in the same round for 2 s.
            steps = {id(x): x.last_step[1] for x in ws}
            t1 = time.monotonic()
            while time.monotonic() - t1 < 2.0:
                job.pump(0.1)
            moved = all(x.last_step[1] > steps[id(x)] for x in ws)
            same = all(x.round == rounds[id(x)] for x in ws)
            if not same:
                evictions += 1
            print("  stop      event %d: rank %d stopped %.1f s under load: %s, %s" % (
                e + 1, w.rank, args.stop_s, "same round" if same else "RE-FORMED",
                "every rank stepped after it" if moved else "NO PROGRESS"), flush=True)
            if not moved and args.check:
                raise SystemExit("FAIL: the job did not step after a %.1f s stop" % args.stop_s)
    finally:
        for p in load:
            p.kill()
            p.wait()
    return evictions


def series_quiet(args, job):
    """No event for args.events x 10 s of 16 MiB allreduces: returns the re-forms (must be 0:
    a probe that is not answered on a busy, shaped link would be a false loss)."""
    hosts = job.hosts
    job.wait_for(lambda: job.formed(hosts), 60, "the job at size %d" % hosts)
    seen = {id(w): len(w.rounds) for w in job.live()}
    steps = {id(w): w.last_step[1] for w in job.live()}
    t0 = time.monotonic()
    while time.monotonic() - t0 < 10.0 * args.events:
        job.pump(10.0 * args.events - (time.monotonic() - t0))
    extra = sum(len(w.rounds) - seen.get(id(w), 0) for w in job.live())
    done = min(w.last_step[1] - steps.get(id(w), 0) for w in job.live())
    print("  quiet     %.0f s, %d steps of 16 MiB: %d re-forms" % (10.0 * args.events, done,
                                                                   extra), flush=True)
    return extra


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--series", default="busy,idle,partition,stop")
    ap.add_argument("--events", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate", type=int, default=0, help="link rate in Mbit/s (0: unshaped)")
    ap.add_argument("--stop-s", type=float, default=1.0)
    ap.add_argument("--hold-s", type=float, default=5.0,
                    help="how long a partition stays before it heals")
    ap.add_argument("--max-recovery-s", type=float, default=5.0,
                    help="with --check: most seconds from a cut to the re-formed ring")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bin", default=os.environ.get("KOLO_BIN", os.path.join(ROOT, "build",
                                                                             "bin")))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: needs root (network namespaces)")
        return 77
    random.seed(int(os.environ.get("SEED", "1")))
    out = tempfile.mkdtemp(prefix="kolo-vanish.")
    prefix = "kvn%d" % os.getpid()
    up = [NETNS, "--prefix", prefix, "up", str(args.hosts)]
    if args.rate:
        up += ["--rate", str(args.rate)]
    if subprocess.run(up, stdout=subprocess.DEVNULL).returncode != 0:
        print("SKIP: cannot create the namespace hosts")
        return 77
    status = 0
    summary = []
    try:
        for kind in args.series.split(","):
            job = Job(args, prefix, args.hosts, out)
            job.count, job.compute_ms = {"busy": (4 << 20, 0), "idle": (1024, 100),
                                         "partition": (1024, 20), "stop": (1 << 16, 20),
                                         "quiet": (4 << 20, 0)}[kind]
            job.start_server()
            for h in range(args.hosts):
                job.start_worker(h)
            try:
                if kind == "quiet":
                    ev = series_quiet(args, job)
                    summary.append("quiet: %d re-forms in %d s without an event" % (
                        ev, 10 * args.events))
                    if ev and args.check:
                        status = 1
                    continue
                if kind == "stop":
                    ev = series_stop(args, job)
                    summary.append("stop: %d of %d stalls of %.1f s under full CPU load "
                                   "evicted the rank" % (ev, args.events, args.stop_s))
                    if ev and args.check:
                        status = 1
                    continue
                rows = series_cut(args, job, kind)
                if rows:
                    med = lambda k: statistics.median(r[k] for r in rows)
                    summary.append(
                        "%s: median %.0f ms (max %.0f) of %d: detect %.0f, teardown %.1f, "
                        "round %.0f, connect %.1f, sync + first %.1f" % (
                            kind, med("total"), max(r["total"] for r in rows), len(rows),
                            med("detect"), med("teardown"), med("round"), med("connect"),
                            med("first")))
                    if args.check and max(r["total"] for r in rows) > args.max_recovery_s * 1e3:
                        status = 1
            finally:
                job.stop_all()
    finally:
        subprocess.run([NETNS, "--prefix", prefix, "down"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    print("vanish summary (%d hosts x 1 rank, KOLO_PROBE_MS=%s, KOLO_PROBE_TIMEOUT_MS=%s):" % (
        args.hosts, os.environ.get("KOLO_PROBE_MS", "200"),
        os.environ.get("KOLO_PROBE_TIMEOUT_MS", "1000")))
    for s in summary:
        print("  " + s)
    print("outputs in", out)
    return status


if __name__ == "__main__":
    sys.exit(main())
