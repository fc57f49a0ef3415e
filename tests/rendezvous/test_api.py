#!/usr/bin/env python3
"""Drives the real kolo-rendezvous binary over HTTP: every endpoint, every
documented status code, the bad inputs, leases, failures, leaves, KV waits and
a server restart with workers re-registering their claims.

usage: test_api.py PATH/TO/kolo-rendezvous [test-name ...]
Standard library only. Every wait has a deadline."""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

BIN = None
TOKEN = "s3cret-token"


class Server:
    def __init__(self, *args, port=0, token=True):
        self.tokfile = None
        cmd = [BIN, "--listen", "127.0.0.1:%d" % port]
        if token:
            fd, self.tokfile = tempfile.mkstemp()
            os.write(fd, (TOKEN + "\n").encode())
            os.close(fd)
            cmd += ["--token-file", self.tokfile]
        cmd += list(args)
        self.errf = tempfile.TemporaryFile()
        env = dict(os.environ)
        env.pop("KOLO_TOKEN", None)
        env.pop("KOLO_TOKEN_FILE", None)
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.errf, env=env)
        line = self._readline(10)
        assert line.startswith("listening on 127.0.0.1:"), line
        self.port = int(line.rsplit(":", 1)[1])

    def _readline(self, timeout):
        out = []
        t = threading.Thread(target=lambda: out.append(self.p.stdout.readline().decode()))
        t.daemon = True
        t.start()
        t.join(timeout)
        assert out, "server printed no address"
        return out[0].strip()

    def log(self):
        self.errf.seek(0)
        return self.errf.read().decode(errors="replace")

    def stop(self, sig=signal.SIGTERM):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            rc = self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise AssertionError("server did not exit on signal")
        if self.tokfile:
            os.unlink(self.tokfile)
            self.tokfile = None
        return rc


class Client:
    """One keep-alive connection."""

    def __init__(self, port, token=TOKEN, timeout=30):
        self.port, self.token, self.timeout = port, token, timeout
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def req(self, method, path, body=None, token=None, headers=None):
        h = dict(headers or {})
        tok = self.token if token is None else token
        if tok:
            h["Authorization"] = "Bearer " + tok
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        try:
            self.c.request(method, path, body=body, headers=h)
            r = self.c.getresponse()
            data = r.read()
        except (http.client.HTTPException, OSError):
            self.c.close()
            self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            raise
        if r.getheader("Connection", "").lower() == "close":
            self.c.close()
            self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        return r.status, data, r

    def json(self, method, path, body=None, **kw):
        st, data, _ = self.req(method, path, body, **kw)
        return st, (json.loads(data) if data else None)

    def close(self):
        self.c.close()


def expect(cond, msg=""):
    if not cond:
        raise AssertionError(msg)


def expect_error(st, body, code, contains=None):
    expect(st == code, "status %s != %s (%s)" % (st, code, body))
    expect(isinstance(body, dict) and isinstance(body.get("error"), str), "no error: %r" % body)
    if contains:
        expect(contains in body["error"], "%r not in %r" % (contains, body["error"]))


def metric(port, name):
    c = Client(port)
    st, data, _ = c.req("GET", "/metrics", token="")
    c.close()
    expect(st == 200)
    total = 0.0
    found = False
    for line in data.decode().splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total if found else None


def wait_for(pred, timeout=10, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


def reference(hosts):
    """Independent Horovod-style assignment: returns a dict per index."""
    order = []
    for h in hosts:
        if h not in order:
            order.append(h)
    per = {h: [i for i, x in enumerate(hosts) if x == h] for h in order}
    out = [None] * len(hosts)
    rank = 0
    for h in order:
        for lr, i in enumerate(per[h]):
            cross = [hh for hh in order if len(per[hh]) > lr]
            out[i] = dict(rank=rank, size=len(hosts), local_rank=lr, local_size=len(per[h]),
                          cross_rank=cross.index(h), cross_size=len(cross))
            rank += 1
    return out


class Poll(threading.Thread):
    """An assignment long poll on its own connection."""

    def __init__(self, port, job, wid, after=0, timeout_ms=20000):
        super().__init__(daemon=True)
        self.args = (port, job, wid, after, timeout_ms)
        self.result = None
        self.start()

    def run(self):
        port, job, wid, after, t = self.args
        c = Client(port, timeout=t / 1000 + 10)
        try:
            self.result = c.json("GET", "/v1/jobs/%s/workers/%s/assignment?after_round=%d&timeout_ms=%d"
                                 % (job, wid, after, t))
        except Exception as e:  # noqa: BLE001
            self.result = ("exc", repr(e))
        c.close()

    def get(self, timeout=30):
        self.join(timeout)
        expect(not self.is_alive(), "long poll did not return")
        return self.result


def join(c, job, host, **extra):
    body = {"host": host}
    body.update(extra)
    st, b = c.json("POST", "/v1/jobs/%s/workers" % job, body)
    expect(st == 201, "join: %s %s" % (st, b))
    expect(isinstance(b["worker_id"], str) and isinstance(b["lease_ms"], int))
    return b["worker_id"]


def check_assignment(b, wid, rnd, expected_members):
    """expected_members: list of (worker_id, host) in rank order."""
    expect(b["round"] == rnd, "round %s != %s" % (b["round"], rnd))
    ids = [m["worker_id"] for m in b["members"]]
    expect(ids == [m[0] for m in expected_members], "members %s != %s" % (ids, expected_members))
    expect([m["rank"] for m in b["members"]] == list(range(len(ids))))
    expect([m["host"] for m in b["members"]] == [m[1] for m in expected_members])
    ref = reference([m[1] for m in expected_members])[ids.index(wid)]
    for k, v in ref.items():
        expect(b[k] == v, "%s: %s != %s for %s" % (k, b[k], v, wid))


# ---------------------------------------------------------------- tests ----

def test_health_metrics_auth():
    s = Server()
    try:
        c = Client(s.port)
        st, b = c.json("GET", "/healthz", token="")
        expect(st == 200 and b == {"status": "ok"})
        st, data, r = c.req("GET", "/metrics", token="")
        expect(st == 200 and r.getheader("Content-Type").startswith("text/plain"))
        st, b = c.json("GET", "/v1/jobs/j", token="")
        expect_error(st, b, 401)
        st, b = c.json("GET", "/v1/jobs/j", token="wrong")
        expect_error(st, b, 401)
        st, b = c.json("GET", "/v1/jobs/j", token=TOKEN + "x")
        expect_error(st, b, 401)
        st, b = c.json("POST", "/v1/jobs/j/workers", {"host": "a"}, token="")
        expect_error(st, b, 401)
        st, b = c.json("GET", "/v1/nothing", token="")
        expect_error(st, b, 401)
        expect(metric(s.port, "kolo_rdzv_auth_failures_total") == 5)
        st, b = c.json("GET", "/v1/jobs/j")
        expect_error(st, b, 404, "unknown job")
        st, b = c.json("PUT", "/v1/jobs/j", {"min_np": 2, "max_np": 4, "settle_ms": 100})
        expect(st == 200 and b["job"] == "j" and b["round"] == 0 and b["state"] == "waiting")
        expect(b["min_np"] == 2 and b["max_np"] == 4 and b["members"] == [] and b["waiting"] == [])
        m = metric(s.port, 'kolo_rdzv_requests_total{endpoint="job",code="401"}')
        expect(m == 3, "401 count %s" % m)
        expect(metric(s.port, 'kolo_rdzv_round{job="j"}') == 0)
        expect(metric(s.port, 'kolo_rdzv_workers{job="j"}') == 0)
        c.close()
    finally:
        expect(s.stop() == 0, "exit code")


def test_bad_inputs():
    s = Server()
    try:
        c = Client(s.port)
        # malformed JSON, wrong types, missing fields, bad ranges
        for body, frag in [("{", "malformed JSON"), ("[1]", "JSON object"), ("", "empty body"),
                           ('{"min_np":"2"}', "min_np"), ('{"max_np":1.5}', "max_np"),
                           ('{"min_np":0}', "min_np"), ('{"min_np":4,"max_np":2}', "max_np"),
                           ('{"settle_ms":-1}', "settle_ms"), ('{"min_np":1,"min_np":2}', "malformed")]:
            st, b = c.json("PUT", "/v1/jobs/j", body)
            expect_error(st, b, 400, frag)
        for body, frag in [("{}", 'missing field "host"'), ('{"host":7}', "host"),
                           ('{"host":"a b"}', "host"), ('{"host":"a","worker_id":"x y"}', "worker_id"),
                           ('{"host":"a","round":"1","rank":0,"worker_id":"w"}', "round"),
                           ('{"host":"a","round":1,"worker_id":"w"}', "together"),
                           ('{"host":"a","round":1,"rank":0}', "worker_id"), ("nope", "malformed")]:
            st, b = c.json("POST", "/v1/jobs/j/workers", body)
            expect_error(st, b, 400, frag)
        for body, frag in [("{}", "round"), ('{"round":1}', "rank"), ('{"round":1,"rank":"0"}', "rank"),
                           ('{"round":-1,"rank":0}', "round"), ("]", "malformed")]:
            st, b = c.json("POST", "/v1/jobs/j/failures", body)
            expect_error(st, b, 400, frag)
        # ids and keys
        st, b = c.json("GET", "/v1/jobs/bad%20job")
        expect_error(st, b, 400, "job id")
        st, b = c.json("GET", "/v1/jobs/" + "x" * 200)
        expect_error(st, b, 400, "job id")
        st, b = c.json("PUT", "/v1/jobs/j/kv/" + "k" * 128, "v")
        expect_error(st, b, 400, "key")
        st, b = c.json("PUT", "/v1/jobs/j/kv/a%00b", "v")
        expect(st in (400, 404), "NUL in key: %s" % st)
        # query arguments
        wid = join(c, "j", "h")
        st, b = c.json("GET", "/v1/jobs/j/workers/%s/assignment?after_round=x" % wid)
        expect_error(st, b, 400, "after_round")
        st, b = c.json("GET", "/v1/jobs/j/workers/%s/assignment?timeout_ms=-5" % wid)
        expect_error(st, b, 400)
        st, b = c.json("GET", "/v1/jobs/j/kv/k?timeout_ms=abc")
        expect_error(st, b, 400, "timeout_ms")
        # unknown paths, wrong methods
        for p in ["/", "/v1", "/v1/jobs", "/v1/jobs/j/nothing", "/v1/jobs/j/workers/w/x",
                  "/v1/jobs/j/kvx", "/healthz/x"]:
            st, b = c.json("GET", p)
            expect_error(st, b, 404)
        for m, p, allow in [("POST", "/healthz", "GET"), ("DELETE", "/v1/jobs/j", "GET, PUT"),
                            ("GET", "/v1/jobs/j/workers", "POST"),
                            ("GET", "/v1/jobs/j/workers/w", "DELETE"),
                            ("POST", "/v1/jobs/j/workers/w/assignment", "GET"),
                            ("GET", "/v1/jobs/j/workers/w/heartbeat", "POST"),
                            ("GET", "/v1/jobs/j/failures", "POST"),
                            ("PATCH", "/v1/jobs/j/kv/k", "GET, PUT, POST, DELETE"),
                            ("PUT", "/v1/jobs/j/kv", "GET"), ("DELETE", "/v1/jobs/j/kv", "GET")]:
            st, data, r = c.req(m, p, "{}")
            expect(st == 405, "%s %s: %s" % (m, p, st))
            expect(r.getheader("Allow") == allow, "Allow %s" % r.getheader("Allow"))
            expect("error" in json.loads(data))
        # a body over 1 MiB, with and without Content-Length
        st, b = c.json("PUT", "/v1/jobs/j/kv/big", b"x" * (1024 * 1024 + 1))
        expect_error(st, b, 413)
        raw = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        raw.sendall(b"PUT /v1/jobs/j/kv/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                    + TOKEN.encode() + b"\r\nContent-Length: 5000000\r\n"
                    + b"Expect: 100-continue\r\n\r\n")
        resp = raw.recv(4096)
        expect(resp.startswith(b"HTTP/1.1 413"), resp[:40])
        raw.close()
        raw = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        raw.sendall(b"PUT /v1/jobs/j/kv/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                    + TOKEN.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        try:
            for _ in range(20):
                raw.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            raw.sendall(b"0\r\n\r\n")
        except OSError:
            pass
        resp = raw.recv(4096)
        expect(resp.startswith(b"HTTP/1.1 413"), resp[:40])
        raw.close()
        # exactly 1 MiB is fine
        c2 = Client(s.port)
        st, _, _ = c2.req("PUT", "/v1/jobs/j/kv/big", b"y" * (1024 * 1024))
        expect(st == 204, "1 MiB put: %s" % st)
        st, data, _ = c2.req("GET", "/v1/jobs/j/kv/big")
        expect(st == 200 and data == b"y" * (1024 * 1024))
        # garbage that is not HTTP, and a half request then a close (the
        # server may answer 400 or just drop them; either way it goes on)
        for junk in [b"\x00\x01garbage\r\n\r\n", b"GET /healthz HTTP/1.1\r\nHost"]:
            raw = socket.create_connection(("127.0.0.1", s.port), timeout=1)
            raw.sendall(junk)
            raw.shutdown(socket.SHUT_WR)
            try:
                raw.recv(4096)
            except OSError:
                pass
            raw.close()
        st, b = c2.json("GET", "/healthz")
        expect(st == 200)
        st, b = c2.json("GET", "/v1/jobs/j")
        expect(st == 200 and b["job"] == "j")
        c.close()
        c2.close()
    finally:
        expect(s.stop() == 0)


def test_round_uneven_hosts():
    """8 workers on 3 host names; every field of every assignment."""
    s = Server()
    try:
        c = Client(s.port)
        st, _ = c.json("PUT", "/v1/jobs/r", {"min_np": 8, "max_np": 8, "settle_ms": 60000})
        expect(st == 200)
        hosts = ["b", "a", "b", "c", "a", "b", "c", "b"]
        ids, polls = [], []
        for h in hosts[:7]:
            wid = join(c, "r", h)
            ids.append(wid)
            polls.append(Poll(s.port, "r", wid))
        wait_for(lambda: metric(s.port, "kolo_rdzv_long_polls") == 7, what="7 long polls")
        st, b = c.json("GET", "/v1/jobs/r")
        expect(b["state"] == "waiting" and len(b["waiting"]) == 7 and b["round"] == 0)
        expect([w["worker_id"] for w in b["waiting"]] == ids)
        ids.append(join(c, "r", hosts[7]))
        polls.append(Poll(s.port, "r", ids[7]))
        # ranks contiguous per host, hosts by first join
        order = sorted(range(8), key=lambda i: (["b", "a", "c"].index(hosts[i]), i))
        members = [(ids[i], hosts[i]) for i in order]
        for wid, p in zip(ids, polls):
            st, b = p.get()
            expect(st == 200, "poll %s" % st)
            check_assignment(b, wid, 1, members)
        st, b = c.json("GET", "/v1/jobs/r")
        expect(b["state"] == "running" and b["round"] == 1 and b["waiting"] == [])
        expect([(m["worker_id"], m["host"]) for m in b["members"]] == members)
        # already formed: returns at once; newer than the round: 204 at its timeout
        st, b = c.json("GET", "/v1/jobs/r/workers/%s/assignment?after_round=0" % ids[0])
        expect(st == 200 and b["round"] == 1, (st, b))
        t0 = time.monotonic()
        st, data, _ = c.req("GET", "/v1/jobs/r/workers/%s/assignment?after_round=1&timeout_ms=300" % ids[0])
        expect(st == 204 and data == b"" and time.monotonic() - t0 >= 0.25)
        st, b = c.json("POST", "/v1/jobs/r/workers/%s/heartbeat" % ids[3])
        expect(st == 200 and b == {"round": 1, "pending_change": False})
        expect(metric(s.port, "kolo_rdzv_rounds_formed_total") == 1)
        expect(metric(s.port, 'kolo_rdzv_workers{job="r"}') == 8)
        expect(metric(s.port, 'kolo_rdzv_round{job="r"}') == 1)
        c.close()
        expect("job r round 1 formed" in s.log())
    finally:
        expect(s.stop() == 0)


def form(s, c, job, hosts, min_np=None, settle_ms=60000):
    """Joins len(hosts) workers with max_np = n; returns ids in join order."""
    n = len(hosts)
    st, _ = c.json("PUT", "/v1/jobs/" + job, {"min_np": min_np or n, "max_np": n,
                                              "settle_ms": settle_ms})
    expect(st == 200)
    ids = [join(c, job, h) for h in hosts]
    for wid in ids:
        st, b = c.json("GET", "/v1/jobs/%s/workers/%s/assignment?after_round=0&timeout_ms=5000" % (job, wid))
        expect(st == 200 and b["round"] == 1, (st, b))
    return ids


def test_settle_and_pending_join():
    s = Server()
    try:
        c = Client(s.port)
        st, _ = c.json("PUT", "/v1/jobs/p", {"min_np": 2, "max_np": 0, "settle_ms": 300})
        ids = [join(c, "p", "h1"), join(c, "p", "h2")]
        polls = [Poll(s.port, "p", w) for w in ids]
        t0 = time.monotonic()
        for p in polls:
            st, b = p.get()
            expect(st == 200 and b["size"] == 2 and b["round"] == 1)
        expect(time.monotonic() - t0 >= 0.2, "formed before the settle period")
        # a join while the round runs is pending until the members reach a commit
        w3 = join(c, "p", "h1")
        st, b = c.json("POST", "/v1/jobs/p/workers/%s/heartbeat" % ids[0])
        expect(st == 200 and b == {"round": 1, "pending_change": True})
        st, b = c.json("GET", "/v1/jobs/p")
        expect(b["state"] == "running" and [w["worker_id"] for w in b["waiting"]] == [w3])
        p3 = Poll(s.port, "p", w3)
        time.sleep(0.5)  # past the settle period: still no round, one member has not committed
        p0 = Poll(s.port, "p", ids[0], after=1)
        time.sleep(0.2)
        expect(p3.is_alive() and p0.is_alive(), "round formed without every member's commit")
        p1 = Poll(s.port, "p", ids[1], after=1)
        members = [(ids[0], "h1"), (w3, "h1"), (ids[1], "h2")]
        for wid, p in [(ids[0], p0), (ids[1], p1), (w3, p3)]:
            st, b = p.get()
            expect(st == 200, "%s" % st)
            check_assignment(b, wid, 2, members)
        st, b = c.json("POST", "/v1/jobs/p/workers/%s/heartbeat" % w3)
        expect(b == {"round": 2, "pending_change": False})
        c.close()
    finally:
        expect(s.stop() == 0)


def test_leave_failure_lease():
    s = Server("--lease-ms", "1500")
    stop = threading.Event()
    try:
        c = Client(s.port)
        hosts = ["a", "b", "a", "c", "b"]
        beating = set()

        def heartbeats():
            hc = Client(s.port)
            while not stop.is_set():
                for w in list(beating):
                    hc.req("POST", "/v1/jobs/e/workers/%s/heartbeat" % w)
                stop.wait(0.1)
            hc.close()

        st, _ = c.json("PUT", "/v1/jobs/e", {"min_np": 2, "max_np": 5, "settle_ms": 30000})
        ids = []
        for h in hosts:
            ids.append(join(c, "e", h))
            beating.add(ids[-1])
        hb = threading.Thread(target=heartbeats, daemon=True)
        hb.start()
        for w in ids:
            st, b = c.json("GET", "/v1/jobs/e/workers/%s/assignment?timeout_ms=5000" % w)
            expect(st == 200 and b["round"] == 1, (st, b))
        r1 = [(m["worker_id"], m["host"]) for m in b["members"]]
        expect(r1[0][0] == ids[0])

        # graceful leave of rank 0: survivors at once (settle is 30 s), order kept
        polls = {w: Poll(s.port, "e", w, after=1) for w in ids[1:]}
        t0 = time.monotonic()
        beating.discard(ids[0])
        st, data, _ = c.req("DELETE", "/v1/jobs/e/workers/%s" % ids[0])
        expect(st == 204 and data == b"")
        r2 = [m for m in r1 if m[0] != ids[0]]
        for w, p in polls.items():
            st, b = p.get(10)
            expect(st == 200, "%s" % st)
            check_assignment(b, w, 2, r2)
        expect(time.monotonic() - t0 < 5, "survivors waited")
        st, b = c.json("POST", "/v1/jobs/e/workers/%s/heartbeat" % ids[0])
        expect_error(st, b, 410, "evicted")
        st, data, _ = c.req("DELETE", "/v1/jobs/e/workers/%s" % ids[0])
        expect(st == 204)

        # a failure report: rank 1 of round 2 (were the victim also asking
        # past round 2, every member would be, and they would form round 3
        # together: the round ended with nobody dead)
        victim = r2[1][0]
        polls = {w: Poll(s.port, "e", w, after=2) for w, _ in r2 if w != victim}
        time.sleep(0.1)
        st, b = c.json("POST", "/v1/jobs/e/failures", {"round": 2, "rank": 1})
        expect(st == 202 and b["accepted"] is True)
        beating.discard(victim)
        vp = Poll(s.port, "e", victim, after=2)
        st, b = vp.get(10)
        expect_error(st, b, 410, "evicted")
        r3 = [m for m in r2 if m[0] != victim]
        for w, p in polls.items():
            st, b = p.get(10)
            check_assignment(b, w, 3, r3)
        expect(r3[0][0] == r2[0][0], "rank 0 moved")
        st, b = c.json("POST", "/v1/jobs/e/failures", {"round": 2, "rank": 0})
        expect(st == 202 and b["accepted"] is False, "stale report acted on")

        # a lease that expires: the survivors get round 4 without asking
        dead = r3[-1][0]
        polls = {w: Poll(s.port, "e", w, after=3) for w, _ in r3 if w != dead}
        beating.discard(dead)
        r4 = [m for m in r3 if m[0] != dead]
        for w, p in polls.items():
            st, b = p.get(10)
            expect(st == 200, "lease poll %s" % st)
            check_assignment(b, w, 4, r4)
        st, b = c.json("GET", "/v1/jobs/e/workers/%s/assignment" % dead)
        expect_error(st, b, 410, "evicted")
        st, b = c.json("POST", "/v1/jobs/e/workers/%s/heartbeat" % dead)
        expect_error(st, b, 410, "lease expired")
        st, b = c.json("POST", "/v1/jobs/e/workers/nobody/heartbeat")
        expect_error(st, b, 410)
        expect(b["error"].startswith("unknown worker"), b)
        st, b = c.json("GET", "/v1/jobs/nojob/workers/nobody/assignment")
        expect(st == 410 and b["error"].startswith("unknown worker"))

        # below min_np: the job waits and says so
        last = r4[-1][0]
        beating.discard(last)
        c.req("DELETE", "/v1/jobs/e/workers/%s" % last)
        st, b = c.json("GET", "/v1/jobs/e")
        expect(b["state"] == "waiting" and b["members"] == [] and len(b["waiting"]) == 1)
        log = s.log()
        expect("dropped=[" in log and "(left)" in log and "lease expired" in log, log[-2000:])
        c.close()
    finally:
        stop.set()
        expect(s.stop() == 0)


def test_kv():
    s = Server()
    try:
        c = Client(s.port)
        st, data, _ = c.req("PUT", "/v1/jobs/k/kv/round1/addr/0", b"\x00\x01binary")
        expect(st == 204)
        st, data, r = c.req("GET", "/v1/jobs/k/kv/round1/addr/0")
        expect(st == 200 and data == b"\x00\x01binary")
        expect(r.getheader("Content-Type") == "application/octet-stream")
        st, b = c.json("GET", "/v1/jobs/k/kv/missing")
        expect_error(st, b, 404, "no such key")
        t0 = time.monotonic()
        st, b = c.json("GET", "/v1/jobs/k/kv/missing?timeout_ms=300")
        expect_error(st, b, 404)
        expect(time.monotonic() - t0 >= 0.25)
        # a get that waits for a put made later, and several waiters on one key
        res = []

        def getter():
            gc = Client(s.port)
            res.append(gc.req("GET", "/v1/jobs/k/kv/later?timeout_ms=10000")[:2])
            gc.close()

        ts = [threading.Thread(target=getter, daemon=True) for _ in range(3)]
        for t in ts:
            t.start()
        wait_for(lambda: metric(s.port, "kolo_rdzv_long_polls") == 3, what="3 KV waiters")
        st, _, _ = c.req("PUT", "/v1/jobs/k/kv/later", b"value!")
        expect(st == 204)
        for t in ts:
            t.join(10)
        expect(sorted(res) == [(200, b"value!")] * 3, res)
        # overwrite and empty values
        c.req("PUT", "/v1/jobs/k/kv/later", b"")
        st, data, _ = c.req("GET", "/v1/jobs/k/kv/later")
        expect(st == 200 and data == b"")
        expect(metric(s.port, "kolo_rdzv_kv_keys") == 2)
        expect(metric(s.port, "kolo_rdzv_kv_bytes") == len(b"\x00\x01binary"))
        c.close()
    finally:
        expect(s.stop() == 0)


def test_kv_store_ops():
    # The c10d store operations: ?add=, ?compare_set, DELETE and the key count.
    s = Server()
    try:
        c = Client(s.port)
        kv = "/v1/jobs/ks/kv/"

        def post(key, query, body=b""):
            return c.req("POST", kv + key + "?" + query, body)

        def value(key):
            st, data, _ = c.req("GET", kv + key)
            return data if st == 200 else st

        # add: an absent key counts as 0; the answer is the new value
        st, data, r = post("n", "add=5")
        expect(st == 200 and data == b"5", (st, data))
        expect(r.getheader("Content-Type") == "application/octet-stream")
        for q, want in [("add=-7", b"-2"), ("add=0", b"-2"), ("add=%2B4", b"2")]:
            st, data, _ = post("n", q)
            expect(st == 200 and data == want, (q, st, data))
        expect(value("n") == b"2")
        st, data, _ = post("m", "add=-9223372036854775808")
        expect(st == 200 and data == b"-9223372036854775808", data)
        for q in ["add=", "add", "add=x", "add=1.5", "add=9223372036854775808", "add=1&compare_set",
                  "", "timeout_ms=5", "compare_set&add=1&expected_len=0"]:
            st, b = c.json("POST", kv + "n?" + q, b"")
            expect_error(st, b, 400)
        st, b = c.json("POST", kv + "n?add=1", b"x")
        expect_error(st, b, 400, "empty body")
        c.req("PUT", kv + "text", b"12 ")
        st, b = c.json("POST", kv + "text?add=1")
        expect_error(st, b, 409, "value of key text is not an integer")
        c.req("PUT", kv + "top", b"9223372036854775807")
        st, b = c.json("POST", kv + "top?add=1")
        expect_error(st, b, 409, "overflows")
        expect(value("top") == b"9223372036854775807" and value("text") == b"12 ")
        expect(metric(s.port, 'kolo_rdzv_requests_total{endpoint="kv",code="409"}') == 2)

        # compare_set: the body is the expected bytes (expected_len) then the desired ones
        st, b = c.json("POST", kv + "c?compare_set&expected_len=1", b"xnew")
        expect_error(st, b, 404, "no such key c")
        expect(value("c") == 404)
        for q, want in [("compare_set&expected_len=0", b"init"), ("compare_set=&expected_len=0", b"init")]:
            st, data, _ = post("c", q, b"init")
            expect(st == 200 and data == want, (st, data))
        st, data, _ = post("c", "compare_set&expected_len=4", b"init\x00next")
        expect(st == 200 and data == b"\x00next", data)
        st, data, _ = post("c", "compare_set&expected_len=4", b"initother")  # a mismatch
        expect(st == 200 and data == b"\x00next", data)
        st, data, _ = post("c", "compare_set&expected_len=0", b"other")  # exists: kept
        expect(st == 200 and data == b"\x00next", data)
        st, data, _ = post("c", "compare_set&expected_len=5", b"\x00next")  # desired empty
        expect(st == 200 and data == b"", data)
        for q, body in [("compare_set", b"ab"), ("compare_set&expected_len=3", b"ab"),
                        ("compare_set&expected_len=-1", b"ab"), ("compare_set&expected_len=x", b"ab")]:
            st, b = c.json("POST", kv + "c?" + q, body)
            expect_error(st, b, 400, "expected_len")
        st, b = c.json("POST", kv + "c?compare_set&expected_len=0", b"x" * (1024 * 1024 + 1))
        expect_error(st, b, 413)

        # a GET held for a key is answered by an add or a compare_set that stores it
        res = {}

        def getter(key):
            gc = Client(s.port)
            res[key] = gc.req("GET", kv + key + "?timeout_ms=10000")[:2]
            gc.close()

        ts = [threading.Thread(target=getter, args=(k,), daemon=True) for k in ("w1", "w2")]
        for t in ts:
            t.start()
        wait_for(lambda: metric(s.port, "kolo_rdzv_long_polls") == 2, what="2 KV waiters")
        st, data, _ = post("w1", "add=3")
        expect(st == 200 and data == b"3")
        st, data, _ = post("w2", "compare_set&expected_len=0", b"set")
        expect(st == 200 and data == b"set")
        for t in ts:
            t.join(10)
            expect(not t.is_alive(), "held GET not answered")
        expect(res == {"w1": (200, b"3"), "w2": (200, b"set")}, res)

        # the key count, DELETE, and the totals
        st, b = c.json("GET", "/v1/jobs/ks/kv")
        keys = ["n", "m", "text", "top", "c", "w1", "w2"]
        expect(st == 200 and b == {"num_keys": len(keys)}, (st, b))
        values = {k: value(k) for k in keys}
        expect(metric(s.port, "kolo_rdzv_kv_keys") == len(keys))
        expect(metric(s.port, "kolo_rdzv_kv_bytes") == sum(len(v) for v in values.values()))
        st, data, _ = c.req("DELETE", kv + "top")
        expect(st == 204 and data == b"", (st, data))
        st, b = c.json("DELETE", kv + "top")
        expect_error(st, b, 404, "no such key top")
        st, b = c.json("DELETE", kv + "never")
        expect_error(st, b, 404, "no such key never")
        expect(value("top") == 404)
        expect(metric(s.port, "kolo_rdzv_kv_keys") == len(keys) - 1)
        expect(metric(s.port, "kolo_rdzv_kv_bytes")
               == sum(len(v) for k, v in values.items() if k != "top"))
        st, b = c.json("GET", "/v1/jobs/ks/kv")
        expect(b == {"num_keys": len(keys) - 1}, b)
        st, data, _ = post("top", "add=1")  # a deleted counter starts from 0
        expect(st == 200 and data == b"1")
        # a job is made by its first KV request, as with GET and PUT
        st, b = c.json("GET", "/v1/jobs/fresh/kv")
        expect(st == 200 and b == {"num_keys": 0}, b)
        st, b = c.json("GET", "/v1/jobs/fresh")
        expect(st == 200 and b["job"] == "fresh", b)
        expect(metric(s.port, 'kolo_rdzv_requests_total{endpoint="kv_store",code="200"}') == 3)

        # ids, keys and the token as for the other KV requests
        for m, p in [("POST", kv + "bad%20key?add=1"), ("DELETE", kv + "bad%20key"),
                     ("GET", "/v1/jobs/bad%20job/kv")]:
            st, b = c.json(m, p)
            expect_error(st, b, 400, "invalid")
        for m, p in [("POST", kv + "n?add=1"), ("DELETE", kv + "n"), ("GET", "/v1/jobs/ks/kv")]:
            st, b = c.json(m, p, token="wrong")
            expect_error(st, b, 401)
        expect(value("n") == b"2")
        c.close()
    finally:
        expect(s.stop() == 0)


def test_job_retention():
    # A job with no workers, polls or requests for --job-retain-ms is forgotten
    # (configuration, KV, evictions); one with a worker is kept.
    s = Server("--job-retain-ms", "400")
    try:
        c = Client(s.port)
        st, b = c.json("PUT", "/v1/jobs/old", {"min_np": 3})
        expect(st == 200 and b["min_np"] == 3, (st, b))
        st, _, _ = c.req("PUT", "/v1/jobs/old/kv/addr/0", b"12345")
        expect(st == 204)
        wid = join(c, "busy", "h0")
        t0 = time.monotonic()
        # only /metrics while waiting: a request naming the job keeps it
        wait_for(lambda: metric(s.port, "kolo_rdzv_kv_keys") == 0, timeout=10,
                 what="the idle job forgotten")
        expect(time.monotonic() - t0 >= 0.3, "forgotten too early")
        expect(metric(s.port, "kolo_rdzv_kv_bytes") == 0)
        st, b = c.json("GET", "/v1/jobs/old")
        expect_error(st, b, 404, "unknown job")
        st, b = c.json("GET", "/v1/jobs/busy")
        expect(st == 200 and [w["worker_id"] for w in b["waiting"] + b["members"]] == [wid], b)
        # a forgotten job starts afresh with the server's defaults
        st, b = c.json("PUT", "/v1/jobs/old", {})
        expect(st == 200 and b["min_np"] == 1, (st, b))
        expect("job old forgotten" in s.log(), s.log())
        c.close()
    finally:
        expect(s.stop() == 0)


def test_disconnect_mid_poll():
    s = Server()
    try:
        c = Client(s.port)
        wid = join(c, "d", "h")  # min_np 1 and settle 2 s: a round forms later
        st, _ = c.json("PUT", "/v1/jobs/d", {"min_np": 2})
        socks = []
        for path in ["/v1/jobs/d/workers/%s/assignment?timeout_ms=60000" % wid,
                     "/v1/jobs/d/kv/never?timeout_ms=60000"]:
            for _ in range(5):
                raw = socket.create_connection(("127.0.0.1", s.port), timeout=10)
                raw.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n"
                             % (path, TOKEN)).encode())
                socks.append(raw)
        wait_for(lambda: metric(s.port, "kolo_rdzv_long_polls") == 10, what="10 polls")
        for raw in socks:
            raw.close()
        wait_for(lambda: metric(s.port, "kolo_rdzv_long_polls") == 0, timeout=10,
                 what="disconnected polls cleaned up")
        st, b = c.json("POST", "/v1/jobs/d/workers/%s/heartbeat" % wid)
        expect(st == 200)
        st, b = c.json("GET", "/healthz")
        expect(st == 200)
        c.close()
    finally:
        expect(s.stop() == 0)


def test_restart_claims():
    s = Server("--lease-ms", "5000")
    port = s.port
    try:
        c = Client(port)
        hosts = ["x", "y", "x", "z"]
        ids = form(s, c, "rs", hosts)
        st, b = c.json("GET", "/v1/jobs/rs")
        before = [(m["rank"], m["worker_id"], m["host"]) for m in b["members"]]
        # a long poll in flight when the server stops gets 503
        p = Poll(port, "rs", ids[0], after=1)
        wait_for(lambda: metric(port, "kolo_rdzv_long_polls") == 1, what="poll")
        c.close()
    except BaseException:
        s.stop()
        raise
    expect(s.stop() == 0, "exit code after SIGTERM")
    st, b = p.get(10)
    expect(st == 503 or st == "exc", "poll at shutdown: %s %s" % (st, b))

    s = Server("--lease-ms", "5000", port=port)
    try:
        c = Client(port)
        st, b = c.json("POST", "/v1/jobs/rs/workers/%s/heartbeat" % ids[1])
        expect(st == 410 and b["error"].startswith("unknown worker"), b)
        # everyone but rank 2 re-registers with its claim
        for rank, wid, host in before:
            if rank == 2:
                continue
            st, b = c.json("POST", "/v1/jobs/rs/workers",
                           {"host": host, "worker_id": wid, "round": 1, "rank": rank})
            expect(st == 201 and b["worker_id"] == wid)
        st, b = c.json("GET", "/v1/jobs/rs")
        expect(b["round"] == 1 and b["state"] == "running", b)
        expect([(m["rank"], m["worker_id"], m["host"]) for m in b["members"]]
               == [m for m in before if m[0] != 2])
        st, b = c.json("POST", "/v1/jobs/rs/workers/%s/heartbeat" % before[1][1])
        expect(st == 200 and b["round"] == 1, (st, b))
        # a claim of an older round joins afresh
        st, b = c.json("POST", "/v1/jobs/rs/workers",
                       {"host": "old", "worker_id": "stale-1", "round": 0, "rank": 0})
        expect(st == 201)
        st, b = c.json("GET", "/v1/jobs/rs")
        expect([w["worker_id"] for w in b["waiting"]] == ["stale-1"])
        c.req("DELETE", "/v1/jobs/rs/workers/stale-1")
        # rank 2 never came back: a peer reports it; the others form round 2 at once
        survivors = [(m[1], m[2]) for m in before if m[0] != 2]
        polls = {w: Poll(port, "rs", w, after=1) for w, _ in survivors}
        st, b = c.json("POST", "/v1/jobs/rs/failures", {"round": 1, "rank": 2})
        expect(st == 202 and b["accepted"] is True)
        for w, pp in polls.items():
            st, b = pp.get(10)
            expect(st == 200, st)
            check_assignment(b, w, 2, survivors)
        c.close()
    finally:
        expect(s.stop() == 0)

    # Restarted while the members wait for a new round: once every member that
    # came back asks past the adopted round, and claims settled, it re-forms.
    s = Server("--lease-ms", "5000", "--settle-ms", "300", port=port)
    try:
        c = Client(port)
        polls = {}
        for rank, (w, host) in enumerate(survivors):
            st, b = c.json("POST", "/v1/jobs/rs/workers",
                           {"host": host, "worker_id": w, "round": 2, "rank": rank})
            expect(st == 201)
            polls[w] = Poll(port, "rs", w, after=2)
        for w, pp in polls.items():
            st, b = pp.get(10)
            expect(st == 200, st)
            check_assignment(b, w, 3, survivors)
        c.close()
    finally:
        expect(s.stop() == 0)


def test_json_logs():
    s = Server("--log-format", "json")
    try:
        c = Client(s.port)
        join(c, "lj", "h")
        c.close()
    finally:
        expect(s.stop() == 0)
    lines = [l for l in s.log().splitlines() if l.strip()]
    expect(lines, "no log")
    for l in lines:
        o = json.loads(l)
        expect("msg" in o and "level" in o)


def test_cli():
    for args, code in [(["--help"], 0), (["--version"], 0), (["--min-np", "x"], 2),
                       (["--bogus"], 2), (["--min-np", "3", "--max-np", "2"], 2),
                       (["--log-format", "xml"], 2)]:
        p = subprocess.run([BIN] + args, capture_output=True, timeout=10)
        expect(p.returncode == code, "%s -> %s" % (args, p.returncode))
    p = subprocess.run([BIN, "--version"], capture_output=True, timeout=10)
    expect(p.stdout.startswith(b"kolo-rendezvous "))
    # KOLO_TOKEN from the environment
    env = dict(os.environ, KOLO_TOKEN="envtok")
    p = subprocess.Popen([BIN, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=env)
    try:
        port = int(p.stdout.readline().decode().strip().rsplit(":", 1)[1])
        c = Client(port, token="envtok")
        st, _ = c.json("GET", "/v1/jobs/x")
        expect(st == 404)
        st, _ = c.json("GET", "/v1/jobs/x", token="other")
        expect(st == 401)
        c.close()
    finally:
        p.send_signal(signal.SIGINT)
        expect(p.wait(10) == 0)


TESTS = [v for k, v in list(globals().items()) if k.startswith("test_")]


def main():
    global BIN
    BIN = os.path.abspath(sys.argv[1])
    names = sys.argv[2:]
    failed = 0
    for t in TESTS:
        if names and t.__name__ not in names:
            continue
        t0 = time.monotonic()
        try:
            t()
            print("PASS %s (%.2fs)" % (t.__name__, time.monotonic() - t0), flush=True)
        except Exception:  # noqa: BLE001
            failed += 1
            print("FAIL %s" % t.__name__, flush=True)
            traceback.print_exc()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
