"""Elastic DDP: ElasticState and elastic_run."""

from __future__ import annotations

import copy
import gc
import logging
import os
import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

import kolo

from . import _state
from ._common import _DEFAULT_TIMEOUT
from ._init import _kolo_groups, destroy_process_group, init

log = logging.getLogger("kolo.torch.distributed")


# ---- elastic DDP --------------------------------------------------------------


class _Reform(Exception):
    """A join or leave was announced at a commit point: re-form, no restore."""


class ElasticState:
    """What an elastic DDP job keeps across membership changes: the plain
    ``model`` (not DDP-wrapped), its ``optimizer`` and picklable attributes
    given as keywords (``step=0, epoch=0``, read and set as attributes).

    ``ddp`` is the DistributedDataParallel wrapper of ``model``, rebuilt by
    :func:`elastic_run` on every (re)start with ``ddp_kwargs``. Every worker
    builds the same state; after a re-form rank 0's copy wins."""

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 ddp_kwargs: Optional[dict] = None, **attrs: Any):
        d = self.__dict__
        d["model"] = model
        d["optimizer"] = optimizer
        d["ddp_kwargs"] = dict(ddp_kwargs or {})
        d["ddp"] = None
        d["_attrs"] = dict(attrs)
        d["_saved"] = None
        d["_commit"] = None

    def __getattr__(self, name: str) -> Any:
        attrs = self.__dict__.get("_attrs", {})
        if name in attrs:
            return attrs[name]
        raise AttributeError(f"ElasticState has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__["_attrs"]:
            self.__dict__["_attrs"][name] = value
        else:
            self.__dict__[name] = value

    def save(self) -> None:
        """Copies the state in memory (local; no communication)."""
        opt = self.optimizer.state_dict() if self.optimizer is not None else None
        self.__dict__["_saved"] = (copy.deepcopy(self.model.state_dict()), copy.deepcopy(opt),
                                   copy.deepcopy(self._attrs))

    def restore(self) -> None:
        """Goes back to the last :meth:`save`/:meth:`commit` (local)."""
        if self._saved is None:
            return
        model, opt, attrs = self._saved
        with torch.no_grad():
            self.model.load_state_dict(model)
        if self.optimizer is not None and opt is not None:
            self.optimizer.load_state_dict(opt)
        self.model.zero_grad(set_to_none=True)
        self.__dict__["_attrs"] = copy.deepcopy(attrs)

    def commit(self) -> None:
        """A commit point; every rank calls it at the same step. Saves the
        state, then (elastic jobs) agrees with the others whether a worker
        joins or leaves, and if so raises to re-form (caught by
        :func:`elastic_run`; the saved state is kept, nothing is lost)."""
        self.save()
        if not kolo.elastic_enabled():
            return
        if self._commit is None:
            self.__dict__["_commit"] = kolo.Commit()
        if self._commit.check():
            raise _Reform()

    def sync(self) -> None:
        """Makes every rank hold rank 0's state and wraps the model in a new
        DDP (whose construction broadcasts rank 0's parameters and buffers).
        Every rank of the (new) default group calls it; elastic_run does."""
        objs = [self._attrs, self.optimizer.state_dict() if self.optimizer is not None else None]
        dist.broadcast_object_list(objs, src=0)
        if dist.get_rank() != 0:
            self.__dict__["_attrs"] = objs[0]
            if self.optimizer is not None and objs[1] is not None:
                self.optimizer.load_state_dict(objs[1])
        self.model.zero_grad(set_to_none=True)
        self.__dict__["ddp"] = torch.nn.parallel.DistributedDataParallel(self.model,
                                                                         **self.ddp_kwargs)
        self.save()

    def _drop_ddp(self) -> None:
        self.__dict__["ddp"] = None


def _membership_failure(exc: BaseException, mark: int) -> bool:
    if isinstance(exc, kolo.MembershipError):
        return True
    return _state.failure_count > mark and isinstance(_state.last_failure, kolo.MembershipError)


def _teardown() -> None:
    groups = _kolo_groups()
    if dist.is_initialized():
        destroy_process_group()
    for pg in groups:
        pg._shutdown("destroyed for a re-form", 30.0)
    gc.collect()  # the old DDP's reducer (and its autograd hooks) must go now


def elastic_run(train: Callable[..., Any], state: ElasticState, *args: Any,
                timeout: Any = _DEFAULT_TIMEOUT, **kwargs: Any) -> Any:
    """Runs ``train(state, *args, **kwargs)`` on a DDP model that survives
    membership changes (``kolorun --min-np A --max-np B``). Every worker calls
    it; a worker added later calls it too and starts from rank 0's state.

    Before each (re)start it makes the default group (kolo://), broadcasts
    rank 0's optimizer state and attributes and re-wraps ``state.model`` in
    DDP (``state.ddp``). When a collective fails because a peer died or
    hung (kolo.MembershipError, directly or as the RuntimeError of a DDP
    step), it restores the last commit; when a join or leave is announced at
    ``state.commit()``, it keeps the state. Either way it destroys the group,
    re-forms kolo's comm in place (``kolo.reform()``: the survivors are not
    restarted), and starts again. ``train`` must use ``dist.get_rank()`` and
    ``dist.get_world_size()`` afresh on every call, and commit at points every
    rank reaches together. ``KOLO_ELASTIC_RESET_LIMIT`` bounds the re-forms.

    Returns what ``train`` returns, or None on a worker that left the job
    (SIGTERM; it should then exit 0). Other exceptions propagate."""
    limit = int(os.environ.get("KOLO_ELASTIC_RESET_LIMIT", "0") or 0)
    resets = 0
    since: Optional[tuple] = None  # (monotonic time, why) of the last re-form's cause
    while True:
        restore = True
        mark = _state.failure_count
        try:
            init(timeout)
            state.sync()
            if since is not None:
                (log.warning if since[1] == "failure" else log.info)(
                    "kolo: elastic DDP: training again as rank %d of %d, %.0f ms after the %s",
                    dist.get_rank(), dist.get_world_size(), 1000 * (time.monotonic() - since[0]),
                    since[1])
                since = None
            result = train(state, *args, **kwargs)
            kolo.elastic_done()
            return result
        except _Reform:
            restore = False
            log.info("kolo: elastic DDP: a worker joins or leaves; re-forming")
        except kolo.ShutdownError:
            if state._commit is not None and state._commit.left():
                return None
            raise
        except Exception as e:  # noqa: BLE001 - classified, re-raised unless a membership change
            if not (_membership_failure(e, mark) and kolo.is_initialized()
                    and kolo.elastic_enabled()):
                raise
            log.warning("kolo: elastic DDP: %s; restoring the last commit and re-forming",
                        str(e).splitlines()[0])
            del e  # its traceback holds the old DDP and the step's tensors
        if limit and resets >= limit:
            raise RuntimeError(f"kolo: elastic DDP re-formed {resets} times "
                               f"(KOLO_ELASTIC_RESET_LIMIT={limit})")
        if since is None:
            since = (time.monotonic(), "failure" if restore else "membership change")
        state._drop_ddp()
        _teardown()
        if restore:
            state.restore()
        try:
            kolo.reform()
        except kolo.ShutdownError:
            if state._commit is not None and state._commit.left():
                return None
            raise
        resets += 1
