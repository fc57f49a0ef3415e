"""``torchrun --rdzv-backend=kolo``: torchrun's rendezvous, kept in kolo-rendezvous.

    torchrun --nnodes=2:3 --nproc-per-node=2 --max-restarts=3 \\
        --rdzv-backend=kolo --rdzv-endpoint=http://HOST:PORT --rdzv-id=JOB train.py

torch's own dynamic rendezvous (the one behind ``--rdzv-backend=c10d``:
rounds, ``--nnodes=MIN:MAX``, heartbeats, re-rendezvous after a failure,
``--max-restarts``) runs unchanged; what differs is where its state lives.
c10d keeps it in a TCPStore hosted by one of the agents, so losing that
node loses the job. Here the state is one key of the job's KV store on
kolo-rendezvous, updated with the server's atomic compare_set, and the store
torchrun's agents use among themselves is the same KV store: no store lives
in any agent. The workers' own store of a round (``MASTER_ADDR``/``PORT``)
is made afresh by that round's rank 0, as with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, which this backend sets.

The token: ``--rdzv-conf token_file=PATH``, else ``KOLO_TOKEN`` or
``KOLO_TOKEN_FILE``; never the command line. Other ``--rdzv-conf`` keys:
``read_timeout`` (seconds a store ``get``/``wait`` waits, 300),
``retry_timeout`` (seconds a request retries an unreachable server, 30), and
torch's own (``join_timeout``, ``last_call_timeout``, ``close_timeout``,
``heartbeat``, ``keep_alive_interval``, ``keep_alive_max_attempt``).

kolo's wheel declares the entry point ``kolo`` in group ``torchrun.handlers``,
which torchrun loads by itself; without the wheel, :func:`register` does the
same in the agent's process."""

from __future__ import annotations

import datetime
import os
from typing import Any, Callable, List, Optional, Tuple

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousBackend,
    Token,
    create_handler as _torch_create_handler,
)

from ._common import _timeout_s
from ._kv import RendezvousKV, kv_key, read_token

NAME = "kolo"
_STATE_KEY = "torchrun/state"


def _bytes(v: Any) -> bytes:
    return v.encode() if isinstance(v, str) else bytes(v)


class RendezvousKVStore(dist.Store):
    """A c10d store in kolo-rendezvous's KV store of one job: set, get, add,
    compare_set, wait, check, delete_key, num_keys, multi_get, multi_set,
    each one request, atomic on the server."""

    def __init__(self, kv: RendezvousKV, timeout_s: float = 300.0, prefix: str = "torchrun"):
        super().__init__()
        self._kv = kv
        self._prefix = prefix
        self.set_timeout(datetime.timedelta(seconds=timeout_s))

    def _k(self, key: str) -> str:
        return kv_key(self._prefix, key)

    def _timeout(self, timeout: Any = None) -> float:
        return _timeout_s(self.timeout if timeout is None else timeout)

    def set(self, key: str, value: Any) -> None:
        self._kv.put(self._k(key), _bytes(value))

    def get(self, key: str) -> bytes:
        return self._kv.get(self._k(key), self._timeout())

    def add(self, key: str, value: int) -> int:
        return self._kv.add(self._k(key), int(value))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        exp = _bytes(expected)
        now = self._kv.compare_set(self._k(key), exp, _bytes(desired))
        return exp if now is None else now  # TCPStore's answer for an absent key

    def wait(self, keys: List[str], timeout: Any = None) -> None:
        self._kv.wait([self._k(k) for k in keys], self._timeout(timeout))

    def check(self, keys: List[str]) -> bool:
        return all(self._kv.try_get(self._k(k)) is not None for k in keys)

    def delete_key(self, key: str) -> bool:
        return self._kv.delete(self._k(key))

    def num_keys(self) -> int:
        return self._kv.num_keys()

    def multi_get(self, keys: List[str]) -> List[bytes]:
        return [self.get(k) for k in keys]

    def multi_set(self, keys: List[str], values: List[Any]) -> None:
        for k, v in zip(keys, values):
            self.set(k, v)


class KoloRendezvousBackend(RendezvousBackend):
    """torch's rendezvous state as one KV key; the token is the value itself,
    so set_state is a compare_set against the value last read."""

    def __init__(self, kv: RendezvousKV):
        self._kv = kv

    @property
    def name(self) -> str:
        return NAME

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except (RuntimeError, ConnectionError, TimeoutError, ValueError) as e:
            raise RendezvousConnectionError(
                f"kolo: the rendezvous server's KV store failed: {e}") from e

    def get_state(self) -> Optional[Tuple[bytes, Token]]:
        v = self._call(self._kv.try_get, _STATE_KEY)
        return None if v is None else (v, v)

    def set_state(self, state: bytes, token: Optional[Token] = None
                  ) -> Optional[Tuple[bytes, Token, bool]]:
        if token is not None and not isinstance(token, bytes):
            now = self.get_state()
            return None if now is None else (*now, False)
        now = self._call(self._kv.compare_set, _STATE_KEY, token or b"", state)
        if now is None:
            return None
        return now, now, now == state


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torchrun's creator for ``--rdzv-backend=kolo``."""
    if params.get("token"):
        raise ValueError("kolo: a token on the command line would be visible to every user of "
                         "the machine; give --rdzv-conf token_file=PATH, or KOLO_TOKEN / "
                         "KOLO_TOKEN_FILE in the environment")
    if not params.endpoint:
        raise ValueError("kolo: --rdzv-backend=kolo needs --rdzv-endpoint=http://HOST:PORT of "
                         "kolo-rendezvous")
    kv = RendezvousKV(params.endpoint, params.run_id, read_token(params.get("token_file")),
                      retry_s=float(params.get_as_int("retry_timeout", 30)))
    store = RendezvousKVStore(kv, float(params.get_as_int("read_timeout", 300)))
    # Each round's rank 0 makes the workers' TCPStore afresh: none outlives its round in an agent.
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return _torch_create_handler(store, KoloRendezvousBackend(kv), params)


def entry_point() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The object of the ``torchrun.handlers`` entry point: torchrun calls it
    and registers what it returns."""
    return create_handler


def register() -> None:
    """Registers ``--rdzv-backend=kolo`` in this process (torchrun does it by
    itself through the entry point when kolo's wheel is installed)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as registry
    if NAME not in getattr(registry, "_registry", {}):
        registry.register(NAME, create_handler)
