"""A client of kolo-rendezvous's per-job KV store (docs/rendezvous.md).

PUT and GET (which long-polls for an absent key), and the operations that
are atomic on the server: add, compare_set, delete, the number of keys.
Requests that cannot reach the server (refused, reset: the server is
restarting) are retried with backoff for up to ``retry_s`` (add and
compare_set only when refused: they are not idempotent); what the server
answers is never retried."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Optional, Tuple

_KEY = re.compile(r"[A-Za-z0-9._:/-]+")
_JOB = re.compile(r"[A-Za-z0-9._:-]{1,127}")


def kv_key(prefix: str, key: str) -> str:
    """``prefix/key`` where the server accepts it as a key, else ``prefix/h/``
    and a hash of ``key`` (any string maps to a valid key, and distinct
    strings to distinct keys)."""
    k = f"{prefix}/{key}"
    if len(k) <= 127 and _KEY.fullmatch(k) and "//" not in k and not k.endswith("/"):
        return k
    return f"{prefix}/h/{hashlib.sha256(key.encode()).hexdigest()[:64]}"


def read_token(token_file: Optional[str] = None) -> str:
    """The bearer token: ``token_file``, else KOLO_TOKEN, else the file named
    by KOLO_TOKEN_FILE; empty for a server without one."""
    path = token_file or (None if os.environ.get("KOLO_TOKEN") else
                          os.environ.get("KOLO_TOKEN_FILE"))
    if path:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    return os.environ.get("KOLO_TOKEN", "")


class RendezvousKV:
    """The KV store of job ``job`` on the server at ``url``."""

    def __init__(self, url: str, job: str, token: str, retry_s: float = 30.0):
        if "://" not in url:
            url = "http://" + url
        if not _JOB.fullmatch(job):
            raise ValueError(f"kolo: job id {job!r}: 1-127 characters of [A-Za-z0-9._:-]")
        self.url = url.rstrip("/")
        self.job = job
        self.token = token
        self.retry_s = retry_s

    @classmethod
    def from_env(cls) -> Optional["RendezvousKV"]:
        url = os.environ.get("KOLO_RENDEZVOUS")
        if not url:
            return None
        return cls(url, os.environ.get("KOLO_JOB") or "default", read_token())

    def _request(self, method: str, key: Optional[str], data: Optional[bytes], query: str,
                 timeout_s: float) -> Tuple[int, bytes]:
        path = f"{self.url}/v1/jobs/{urllib.parse.quote(self.job, safe='')}/kv"
        if key is not None:
            path += "/" + urllib.parse.quote(key, safe="/:")
        req = urllib.request.Request(path + query, data=data, method=method)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/octet-stream")
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        while True:
            try:
                with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                    return resp.status, resp.read()
            except urllib.error.HTTPError as e:
                return e.code, e.read()
            except (urllib.error.URLError, ConnectionError) as e:
                # add and compare_set are not idempotent: resend them only when the
                # connection was refused, so the server cannot have applied them
                refused = isinstance(getattr(e, "reason", e), ConnectionRefusedError)
                if (method == "POST" and not refused) or time.monotonic() + delay > deadline:
                    raise ConnectionError(f"kolo: rendezvous server {self.url} unreachable for "
                                          f"{self.retry_s:.0f} s: {e}") from e
                time.sleep(delay)  # backoff before reconnecting, not synchronisation
                delay = min(delay * 2, 1.0)

    @staticmethod
    def _fail(what: str, key: Optional[str], code: int, body: bytes) -> RuntimeError:
        return RuntimeError(f"kolo: store {what} {key!r}: rendezvous answered {code}: "
                            f"{body[:200].decode(errors='replace')}")

    def put(self, key: str, value: bytes) -> None:
        code, body = self._request("PUT", key, value, "", 30.0)
        if code not in (200, 204):
            raise self._fail("set", key, code, body)

    def try_get(self, key: str, timeout_s: float = 0.0) -> Optional[bytes]:
        """The value, waiting up to timeout_s for it (one poll of at most 30 s);
        None when absent."""
        ms = int(min(max(timeout_s, 0.0), 30.0) * 1000)
        code, body = self._request("GET", key, None, f"?timeout_ms={ms}", ms / 1000 + 10)
        if code == 200:
            return body
        if code == 404:
            return None
        raise self._fail("get", key, code, body)

    def get(self, key: str, timeout_s: float) -> bytes:
        """The value, waiting up to timeout_s for it to be set."""
        deadline = time.monotonic() + timeout_s
        while True:
            v = self.try_get(key, max(0.0, deadline - time.monotonic()))
            if v is not None:
                return v
            if time.monotonic() >= deadline:
                raise TimeoutError(f"kolo: store key {key!r} was not set within "
                                   f"{timeout_s:.0f} s")

    def wait(self, keys, timeout_s: float) -> None:
        """Waits until every key of ``keys`` is set, timeout_s for them all."""
        deadline = time.monotonic() + timeout_s
        for key in keys:
            self.get(key, max(0.0, deadline - time.monotonic()))

    def add(self, key: str, amount: int) -> int:
        code, body = self._request("POST", key, b"", f"?add={int(amount)}", 30.0)
        if code != 200:
            raise self._fail("add", key, code, body)
        return int(body)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> Optional[bytes]:
        """Stores ``desired`` if the value is ``expected`` (or the key is absent
        and ``expected`` empty); returns the value afterwards, None when the
        key is absent (and ``expected`` was not empty)."""
        code, body = self._request("POST", key, expected + desired,
                                   f"?compare_set&expected_len={len(expected)}", 30.0)
        if code == 200:
            return body
        if code == 404:
            return None
        raise self._fail("compare_set", key, code, body)

    def delete(self, key: str) -> bool:
        code, body = self._request("DELETE", key, None, "", 30.0)
        if code in (200, 204):
            return True
        if code == 404:
            return False
        raise self._fail("delete_key", key, code, body)

    def num_keys(self) -> int:
        code, body = self._request("GET", None, None, "", 30.0)
        if code != 200:
            raise self._fail("num_keys", None, code, body)
        return int(json.loads(body)["num_keys"])
