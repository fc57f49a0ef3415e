"""KoloStore: the c10d store of a kolo:// group."""

from __future__ import annotations

import logging
from typing import Any, List

import torch
import torch.distributed as dist

import kolo

from ._common import _timeout_s, _wait_bounded
from ._kv import RendezvousKV as _RendezvousKV, kv_key

log = logging.getLogger("kolo.torch.distributed")


# ---- the store --------------------------------------------------------------

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
        return kv_key(f"c10d/r{self._round}", key)

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
        self._need_kv("wait").wait([self._kv_key(k) for k in keys], t)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        raise RuntimeError("kolo: KoloStore has no compare_set (set, get, wait and the "
                           "collective add only)")
