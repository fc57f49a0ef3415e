#!/usr/bin/env python3
"""Local emulations of the services a spot worker reads its preemption
notice from, written from the providers' documented formats, for the tests
of docs/spot.md. Loopback only; standard library only.

    metadata_emulator.py [--port P]      prints "port N" once it listens

Every port this process listens on is one emulated machine (an "instance")
that answers as all four services at once:

- AWS IMDSv2: ``PUT /latest/api/token`` with
  ``X-aws-ec2-metadata-token-ttl-seconds`` (1..21600) returns a session
  token; ``GET /latest/meta-data/...`` without a valid token is 401.
  ``spot/instance-action`` and ``events/recommendations/rebalance`` are 404
  until a notice, then 200 with ``{"action": "terminate", "time": ...}`` and
  ``{"noticeTime": ...}``.
- GCE: ``GET /computeMetadata/v1/instance/preempted`` needs
  ``Metadata-Flavor: Google`` (403 without); it answers ``FALSE``/``TRUE``
  with ``Metadata-Flavor: Google`` and an ``ETag``; with
  ``wait_for_change=true`` it hangs until the value's ETag differs from
  ``last_etag`` (or from the value when the request came), or
  ``timeout_sec``.
- Azure Scheduled Events: ``GET /metadata/scheduledevents?api-version=...``
  needs ``Metadata: true`` (400 without); the document always holds a
  Preempt event of another VM (which must not count), and after a notice a
  Preempt event naming this VM. ``POST`` of ``{"StartRequests":
  [{"EventId": ...}]}`` acknowledges (recorded, the event removed).
  ``GET /metadata/instance/compute/name?...&format=text`` is the VM's name.
- Kubernetes: ``GET /api/v1/namespaces/NS/pods/NAME`` with ``Authorization:
  Bearer TOKEN``: 401 without the token, 404 for another pod; the pod's
  ``status.conditions`` gain ``DisruptionTarget`` (``True``) on a notice.

Control (JSON answers):

- ``POST /_emulator/instances``: a new instance on a new port:
  ``{"port", "vm", "namespace", "pod", "token"}``;
- ``POST /_emulator/notice?provider=aws|gce|azure|k8s[&kind=rebalance]
  [&deadline_s=S]`` on an instance raises the notice there, the machine to
  go S seconds later (AWS's ``time``, whole seconds as AWS gives it; Azure's
  ``NotBefore``, empty when S is empty; the pod's ``deletionTimestamp``,
  set with the condition; defaults 120, 30 and 30; GCE's is always 30):
  ``{"t": time.monotonic(), "wall": time.time(), "deadline": the deadline
  as given, in seconds since 1970, or None}``;
- ``POST /_emulator/expire`` expires the AWS tokens of the instance;
- ``GET /_emulator/state``: the notices raised, the Azure acknowledgements
  and the requests served per path.
"""

import argparse
import hashlib
import json
import secrets
import sys
import threading
import time
import urllib.parse
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAMESPACE = "kolo-spot"


def _iso(dt):
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def _rfc1123(dt):
    return dt.strftime("%a, %d %b %Y %H:%M:%S GMT")


class Instance:
    """One emulated machine: its notices and what it was asked."""

    def __init__(self, registry):
        self.registry = registry
        self.cond = threading.Condition()
        self.tokens = {}                # AWS token -> expiry (monotonic)
        self.aws_action = None
        self.aws_rebalance = None
        self.gce_preempted = False
        self.azure_events = []
        self.azure_incarnation = 1
        self.azure_acks = []
        self.k8s_disrupted = False
        self.k8s_deleted = None
        self.notices = []
        self.requests = {}
        self.port = 0
        self.token = "sa-" + secrets.token_hex(12)
        self.server = None

    def bind(self, port):
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.server.instance = self
        self.port = self.server.server_address[1]
        self.vm = f"vm-{self.port}"
        self.pod = f"pod-{self.port}"
        # Another VM's preemption is in every document: it must not count.
        self.azure_events = [self._azure_event("other-vm")]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def _azure_event(self, vm, not_before=None):
        if not_before is None:
            not_before = _rfc1123(datetime.now(timezone.utc) + timedelta(seconds=30))
        return {"EventId": secrets.token_hex(8).upper(), "EventType": "Preempt",
                "ResourceType": "VirtualMachine", "Resources": [vm],
                "EventStatus": "Scheduled" if not_before else "Started",
                "NotBefore": not_before,
                "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}

    def gce_value(self):
        v = "TRUE" if self.gce_preempted else "FALSE"
        return v, hashlib.sha1(v.encode()).hexdigest()[:16]

    def notice(self, provider, kind, deadline_s=None):
        """Raises the notice; (monotonic time, the deadline given or None)."""
        now = datetime.now(timezone.utc)
        default = {"aws": 120, "gce": 30, "azure": 30, "k8s": 30}.get(provider, 0)
        secs = default if deadline_s is None or provider == "gce" else deadline_s
        at = now + timedelta(seconds=float(secs or 0))
        deadline = None
        with self.cond:
            t = time.monotonic()
            if provider == "aws" and kind == "rebalance":
                self.aws_rebalance = {"noticeTime": _iso(now)}
            elif provider == "aws":
                self.aws_action = {"action": "terminate", "time": _iso(at)}
                deadline = at.replace(microsecond=0).timestamp()
            elif provider == "gce":
                self.gce_preempted = True
                deadline = at.timestamp()
            elif provider == "azure":
                self.azure_events.append(self._azure_event(self.vm, _rfc1123(at) if secs != ""
                                                           else ""))
                self.azure_incarnation += 1
                deadline = at.replace(microsecond=0).timestamp() if secs != "" else None
            elif provider == "k8s":
                self.k8s_disrupted = True
                self.k8s_deleted = _iso(at)  # metav1.Time: whole seconds
                deadline = at.replace(microsecond=0).timestamp()
            else:
                return None, None
            self.notices.append({"provider": provider, "kind": kind, "t": t})
            self.cond.notify_all()
        return t, deadline

    def state(self):
        with self.cond:
            return {"port": self.port, "notices": list(self.notices),
                    "azure_acks": list(self.azure_acks), "requests": dict(self.requests)}


class Registry:
    def __init__(self):
        self.lock = threading.Lock()
        self.instances = []

    def new(self, port=0):
        inst = Instance(self).bind(port)
        with self.lock:
            self.instances.append(inst)
        return inst


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # One write per answer, sent at once: a body written after its headers
    # would otherwise wait for the client's delayed ACK (Nagle).
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # quiet
        pass

    @property
    def inst(self):
        return self.server.instance

    def _send(self, code, body=b"", ctype="text/plain", headers=None):
        if isinstance(body, (dict, list)):
            body, ctype = json.dumps(body).encode(), "application/json"
        elif isinstance(body, str):
            body = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _route(self, method):
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        with self.inst.cond:
            key = f"{method} {url.path}"
            self.inst.requests[key] = self.inst.requests.get(key, 0) + 1
        path = url.path
        if path.startswith("/_emulator/"):
            return self._control(method, path, q)
        if path.startswith("/latest/"):
            return self._aws(method, path)
        if path.startswith("/computeMetadata/"):
            return self._gce(method, path, q)
        if path.startswith("/metadata/"):
            return self._azure(method, path, q)
        if path.startswith("/api/v1/"):
            return self._k8s(method, path)
        self._send(404, "not found")

    def do_GET(self):
        self._route("GET")

    def do_PUT(self):
        self._route("PUT")

    def do_POST(self):
        self._route("POST")

    # ---- control ----

    def _control(self, method, path, q):
        inst = self.inst
        if path == "/_emulator/instances" and method == "POST":
            n = inst.registry.new()
            return self._send(200, {"port": n.port, "vm": n.vm, "namespace": NAMESPACE,
                                    "pod": n.pod, "token": n.token})
        if path == "/_emulator/notice" and method == "POST":
            t, deadline = inst.notice(q.get("provider", ""), q.get("kind", "notice"),
                                      q.get("deadline_s"))
            if t is None:
                return self._send(400, {"error": "provider: aws, gce, azure or k8s"})
            return self._send(200, {"t": t, "wall": time.time(), "deadline": deadline})
        if path == "/_emulator/expire" and method == "POST":
            with inst.cond:
                inst.tokens.clear()
            return self._send(200, {})
        if path == "/_emulator/state" and method == "GET":
            return self._send(200, inst.state())
        self._send(404, {"error": "unknown control path"})

    # ---- AWS IMDSv2 ----

    def _aws(self, method, path):
        inst = self.inst
        if path == "/latest/api/token":
            if method != "PUT":
                return self._send(405, "")
            self._body()
            try:
                ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
            except ValueError:
                ttl = 0
            if not 1 <= ttl <= 21600:
                return self._send(400, "")
            tok = secrets.token_urlsafe(32)
            with inst.cond:
                inst.tokens[tok] = time.monotonic() + ttl
            return self._send(200, tok, headers={"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)})
        if method != "GET":
            return self._send(405, "")
        tok = self.headers.get("X-aws-ec2-metadata-token", "")
        with inst.cond:
            valid = inst.tokens.get(tok, 0) > time.monotonic()
            action, rebalance = inst.aws_action, inst.aws_rebalance
        if not valid:
            return self._send(401, "")
        if path == "/latest/meta-data/spot/instance-action":
            return self._send(200, action) if action else self._send(404, "Not Found")
        if path == "/latest/meta-data/events/recommendations/rebalance":
            return self._send(200, rebalance) if rebalance else self._send(404, "Not Found")
        self._send(404, "Not Found")

    # ---- GCE ----

    def _gce(self, method, path, q):
        inst = self.inst
        hdr = {"Metadata-Flavor": "Google"}
        if self.headers.get("Metadata-Flavor") != "Google":
            return self._send(403, "Missing Metadata-Flavor:Google header.", headers=hdr)
        if method != "GET" or path != "/computeMetadata/v1/instance/preempted":
            return self._send(404, "not found", headers=hdr)
        with inst.cond:
            value, etag = inst.gce_value()
            if q.get("wait_for_change") == "true":
                last = q.get("last_etag") or etag
                end = time.monotonic() + float(q.get("timeout_sec") or 3600)
                while inst.gce_value()[1] == last:
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    inst.cond.wait(min(left, 1.0))
                value, etag = inst.gce_value()
        self._send(200, value, headers={**hdr, "ETag": etag})

    # ---- Azure ----

    def _azure(self, method, path, q):
        inst = self.inst
        if self.headers.get("Metadata") != "true":
            return self._send(400, {"error": "Bad request. Required metadata header not "
                                             "specified"})
        if "api-version" not in q:
            return self._send(400, {"error": "Bad request. api-version was not specified"})
        if path == "/metadata/instance/compute/name" and method == "GET":
            return self._send(200, inst.vm)
        if path != "/metadata/scheduledevents":
            return self._send(404, {"error": "Not found"})
        if method == "POST":
            try:
                doc = json.loads(self._body() or b"{}")
                ids = [r["EventId"] for r in doc["StartRequests"]]
            except (ValueError, KeyError, TypeError):
                return self._send(400, {"error": "Bad request"})
            with inst.cond:
                inst.azure_acks.extend(ids)
                inst.azure_events = [e for e in inst.azure_events if e["EventId"] not in ids]
                inst.azure_incarnation += 1
            return self._send(200, "")
        with inst.cond:
            doc = {"DocumentIncarnation": inst.azure_incarnation,
                   "Events": list(inst.azure_events)}
        self._send(200, doc)

    # ---- Kubernetes ----

    def _k8s(self, method, path):
        inst = self.inst
        if self.headers.get("Authorization") != f"Bearer {inst.token}":
            return self._send(401, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "reason": "Unauthorized", "code": 401})
        want = f"/api/v1/namespaces/{NAMESPACE}/pods/{inst.pod}"
        if method != "GET" or path != want:
            return self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "reason": "NotFound", "code": 404})
        conds = [{"type": "Ready", "status": "True"},
                 {"type": "ContainersReady", "status": "True"}]
        meta = {"name": inst.pod, "namespace": NAMESPACE}
        with inst.cond:
            if inst.k8s_deleted:
                meta["deletionTimestamp"] = inst.k8s_deleted
            if inst.k8s_disrupted:
                conds.append({"type": "DisruptionTarget", "status": "True",
                              "reason": "TerminationByKubelet",
                              "message": "Pod was terminated in response to imminent node "
                                         "shutdown.",
                              "lastTransitionTime": _iso(datetime.now(timezone.utc))})
        self._send(200, {"kind": "Pod", "apiVersion": "v1",
                         "metadata": meta,
                         "status": {"phase": "Running", "conditions": conds}})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    first = Registry().new(args.port)
    print(f"port {first.port}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
