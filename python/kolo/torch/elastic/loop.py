"""The elastic loop, ``hvd.elastic.run``: Python's twin of C
``kolo_elastic_run`` (runtime/reform.c).

    sync the state from rank 0 -> func(state)
    func fails with HorovodInternalError (a peer died, hung or was lost):
        restore the last commit, kolo.reform(), sync, func again
    state.commit() raises HostsUpdatedInterrupt (a join or leave announced):
        kolo.reform() without restoring, sync, func again
    this worker left the job (SIGTERM, kolo.elastic_leave()):
        finalize and exit 0

kolo re-forms the same process and comm: no shutdown()/init() as in
Horovod, and every re-form is followed by a sync on every rank, old and new.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, NoReturn, Optional

import kolo
from kolo import _lib

from .. import mpi_ops as _mpi_ops
from .. import optimizer as _optimizer
from .state import HostsUpdatedInterrupt, State

__all__ = ["run", "reset_limit"]

log = logging.getLogger("kolo.torch.elastic")


def reset_limit() -> int:
    """KOLO_ELASTIC_RESET_LIMIT: the most re-forms one ``run`` call does
    (0, the default: no limit). Read when the decorated function is called."""
    raw = os.environ.get("KOLO_ELASTIC_RESET_LIMIT", "").strip()
    if not raw:
        return 0
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"kolo: KOLO_ELASTIC_RESET_LIMIT must be an integer >= 0, not {raw!r}")
    return n


def _leave(why: str) -> NoReturn:
    """This worker is no longer a member of the job: free the comm and end
    the process with status 0 (SystemExit, so finally blocks and atexit
    handlers still run)."""
    log.info("kolo.torch.elastic: %s; finalizing and exiting with status 0", why)
    kolo.finalize()
    raise SystemExit(0)


# The failures a new round cures, as runtime/reform.c's membership_failure():
# kolo.MembershipError's (EMEMBERSHIP, EPEER, ETIMEDOUT), ECLOSED, and
# ENOTFOUND (a peer's address gone from a restarted server's KV).
_CURABLE = {_lib.STATUS[k] for k in ("EMEMBERSHIP", "EPEER", "ETIMEDOUT", "ECLOSED",
                                     "ENOTFOUND")}


def _membership_failure(e: kolo.Error) -> bool:
    return isinstance(e, kolo.MembershipError) or getattr(e, "status", None) in _CURABLE


def _limit_error(limit: int, why: BaseException) -> kolo.MembershipError:
    status = getattr(why, "status", _lib.STATUS["EMEMBERSHIP"])
    name = getattr(why, "name", "KOLO_EMEMBERSHIP")
    detail = getattr(why, "message", None) or str(why)
    return kolo.MembershipError(status, name,
                                f"kolo.torch.elastic.run: reset limit {limit} reached "
                                f"(KOLO_ELASTIC_RESET_LIMIT); last event: {detail}")


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: ``func(state, *args, **kwargs)`` runs as an elastic
    training function, as with ``horovod.torch.elastic.run``.

    Every rank calls the decorated function once, after ``init()``, with
    its State (same kind, same values registered, on every rank); no
    collective may run between ``init()`` and that call (a joiner syncs
    there). It syncs the state from rank 0 (and saves it as the last
    commit), then calls ``func``, and returns what ``func`` returns:

    - when ``func`` raises HorovodInternalError (``kolo.MembershipError``:
      a peer failed, or the job's round ended), the state is restored to
      the last commit, the comm re-forms (``kolo.reform()``), every
      DistributedOptimizer forgets its pending allreduces, the reset
      callbacks run, the state is synced from rank 0 (the oldest
      survivor) and ``func`` is called again;
    - when ``state.commit()`` raises HostsUpdatedInterrupt (workers join,
      or one leaves on SIGTERM), the same without the restore;
    - on the worker that leaves (SIGTERM at a commit point, or while
      re-forming): ``kolo.finalize()`` and ``SystemExit(0)``: the process
      ends with status 0 and code after the decorated call does not run
      there (it is no longer a member; use try/finally or atexit to clean
      up);
    - after ``KOLO_ELASTIC_RESET_LIMIT`` re-forms (if set), the next event
      raises HorovodInternalError saying so; when ``kolo.reform()`` fails
      (fewer than min-np workers and none joined within
      ``KOLO_ELASTIC_TIMEOUT_MS``) its error is raised.

    In a job that is not elastic, a HorovodInternalError is raised as is.

    A peer failure seen inside the commit point's own allreduce raises
    HostsUpdatedInterrupt rather than HorovodInternalError (kolo's commit
    reports both as a membership change); the state was saved just before
    that allreduce, so not restoring it is the same as restoring it, and
    kolo.reform() still treats the round's end as a failure.
    """
    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(state, State):
            raise TypeError(f"kolo: the first argument of an elastic function must be a "
                            f"kolo.torch.elastic.State, not a {type(state).__name__}")
        if not kolo.is_initialized():
            raise ValueError("kolo has not been initialized; call kolo.torch.init() before "
                             "the elastic function")
        limit = reset_limit()
        resets = 0
        while True:
            why: Optional[BaseException] = None
            try:
                state.sync()
                state.save()
                result = func(state, *args, **kwargs)
                kolo.elastic_done()
                return result
            except kolo.Error as e:
                if not kolo.elastic_enabled() or not _membership_failure(e):
                    raise
                if state._left():
                    _leave("this worker left the job")
                state.restore()
                why = e
            except HostsUpdatedInterrupt as e:
                if e.left or state._left():
                    _leave("this worker left the job at a commit point (SIGTERM)")
                why = e
            if limit and resets >= limit:
                raise _limit_error(limit, why) from why
            resets += 1
            log.info("kolo.torch.elastic: %s; %s", why,
                     "re-forming" if isinstance(why, HostsUpdatedInterrupt)
                     else "restored the last commit, re-forming")
            try:
                kolo.reform()
            except kolo.ShutdownError as e:
                _leave(f"this worker left the job while re-forming ({e})")
            # The old round's handles are void: forget them (their buffers
            # are released once kolo is done with them).
            clear = getattr(_mpi_ops, "_clear_handles", None)
            if clear is not None:
                clear()
            _optimizer._reset_after_reform()
            state.on_reset()

    return wrapper
