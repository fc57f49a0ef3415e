"""KoloStore: the c10d store of a kolo:// group."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, List, Optional

import torch
import torch.distributed as dist

import kolo

from ._common import _timeout_s, _wait_bounded

log = logging.getLogger("kolo.torch.distributed")


# ---- the store --------------------------------------------------------------

_KV_KEY = re.compile(r"[A-Za-z0-9._:/-]+")


class _RendezvousKV:
    """The rendezvous server's KV store (docs/rendezvous.md), for KoloStore."""

    def __init__(self, url: str, job: str, token: str):
        self.url = url.rstrip("/")
        self.job = job
        self.token = token

    @classmethod
    def from_env(cls) -> Optional["_RendezvousKV"]:
        url = os.environ.get("KOLO_RENDEZVOUS")
        if not url:
            return None
        token = os.environ.get("KOLO_TOKEN", "")
        if not token and os.environ.get("KOLO_TOKEN_FILE"):
            with open(os.environ["KOLO_TOKEN_FILE"], encoding="utf-8") as f:
                token = f.read().strip()
        return cls(url, os.environ.get("KOLO_JOB") or "default", token)

    def _request(self, method: str, key: str, data: Optional[bytes], query: str,
                 timeout_s: float) -> tuple:
        path = f"{self.url}/v1/jobs/{urllib.parse.quote(self.job, safe='')}/kv/" \
               f"{urllib.parse.quote(key, safe='/:')}{query}"
        req = urllib.request.Request(path, data=data, method=method)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/octet-stream")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def put(self, key: str, value: bytes) -> None:
        code, body = self._request("PUT", key, value, "", 30.0)
        if code not in (200, 204):
            raise RuntimeError(f"kolo: store set {key!r}: rendezvous answered {code}: "
                               f"{body[:200].decode(errors='replace')}")

    def get(self, key: str, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(0.0, deadline - time.monotonic())
            slice_ms = int(min(left, 30.0) * 1000)
            code, body = self._request("GET", key, None, f"?timeout_ms={slice_ms}",
                                       slice_ms / 1000 + 10)
            if code == 200:
                return body
            if code != 404:
                raise RuntimeError(f"kolo: store get {key!r}: rendezvous answered {code}: "
                                   f"{body[:200].decode(errors='replace')}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"kolo: store key {key!r} was not set within {timeout_s:.0f} s")


class KoloStore(dist.Store):
    """The store of a ``kolo://`` group.

    ``add(key, n)`` with n != 0 is a collective: every rank calls it once for
    a key (as torch's store-based barrier does) and gets the sum over the
    ranks (a kolo allreduce); ``add(key, 0)`` returns that sum. ``set``,
    ``get`` and ``wait`` use the rendezvous server's KV store (keys scoped to
    the membership round), so torch code that exchanges bytes through the
    store (a gloo group made with ``new_group(backend="gloo")``) works.
    Other methods raise."""

    def __init__(self) -> None:
        super().__init__()
        self._counts: dict = {}
        self._kv = _RendezvousKV.from_env()
        self._round = kolo.round() if kolo.is_initialized() else 0

    def _seconds(self) -> float:
        try:
            return _timeout_s(self.timeout)
        except Exception:  # noqa: BLE001 - an older torch without the property
            return 300.0

    def add(self, key: str, value: int) -> int:
        if value == 0:
            return self._counts.get(key, 0)
        x = torch.tensor([int(value)], dtype=torch.int64)
        h = kolo.allreduce_async(x, name=f"c10d.store.{key}", op="sum")
        _wait_bounded(h, self._seconds(), f"the store add of {key!r} (a collective under kolo://)")
        self._counts[key] = self._counts.get(key, 0) + int(x.item())
        return self._counts[key]

    def _kv_key(self, key: str) -> str:
        k = f"c10d/r{self._round}/{key}"
        if len(k) <= 127 and _KV_KEY.fullmatch(k) and "//" not in k:
            return k
        return f"c10d/r{self._round}/h/{hashlib.sha256(key.encode()).hexdigest()[:64]}"

    def _need_kv(self, what: str) -> _RendezvousKV:
        if self._kv is None:
            raise RuntimeError(f"kolo: store {what} needs the rendezvous server's KV store, and "
                               f"this process has none (KOLO_RENDEZVOUS is not set: a job of "
                               f"one worker)")
        return self._kv

    def set(self, key: str, value: Any) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        self._need_kv("set").put(self._kv_key(key), data)

    def get(self, key: str) -> bytes:
        return self._need_kv("get").get(self._kv_key(key), self._seconds())

    def wait(self, keys: List[str], timeout: Any = None) -> None:
        t = self._seconds() if timeout is None else _timeout_s(timeout)
        kv = self._need_kv("wait")
        deadline = time.monotonic() + t
        for k in keys:
            kv.get(self._kv_key(k), max(0.0, deadline - time.monotonic()))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        raise RuntimeError("kolo: KoloStore has no compare_set (set, get, wait and the "
                           "collective add only)")
