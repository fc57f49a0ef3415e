"""Elastic training for every binding: the state kept across membership
changes and the reset loop, ``hvd.elastic.run`` (Python's twin of C
``kolo_elastic_run``, runtime/reform.c).

    sync the state from rank 0 -> func(state)
    func fails with HorovodInternalError (a peer died, hung or was lost):
        restore the last commit, kolo.reform(), sync, func again
    state.commit() raises HostsUpdatedInterrupt (a join or leave announced):
        kolo.reform() without restoring, sync, func again
    this worker left the job (SIGTERM, kolo.elastic_leave()):
        finalize and exit 0
    the job's straggler policy evicted this worker at a commit point:
        finalize and exit kolo.EXIT_EVICTED (90)

kolo re-forms the same process and comm: no shutdown()/init() as in
Horovod, and every re-form is followed by a sync on every rank, old and new.

The state lives in Python (deep copies in host memory); kolo's own commit
point is used to learn, in one small allreduce, whether a join or a leave is
pending, and to number the commits: every KOLO_DURABLE_EVERY-th, rank 0
hands a pickle of the state to kolo's writer, and a job that lost every
worker resumes from it (docs/durable.md). Each binding subclasses :class:`ObjectState` for its
framework's values (``TorchState``, ``TensorFlowKerasState``) and may
register a hook that runs after every re-form (:func:`register_reform_hook`).
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import pickle
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence

import kolo
from kolo import _lib

from . import basics, handles, objects

__all__ = ["HostsUpdatedInterrupt", "State", "ObjectState", "run", "reset_limit",
           "register_reform_hook"]

log = logging.getLogger("kolo.elastic")

_reform_hooks: List[Callable[[], Any]] = []


_callback_error: List[Optional[kolo.Error]] = [None]


def note_callback_error(e: kolo.Error) -> None:
    """A binding calls this when a kolo error leaves a framework callback
    (TensorFlow's numpy_function, jax's io_callback): the framework raises
    its own error type around it, which :func:`unwrap` maps back."""
    _callback_error[0] = e


def unwrap(e: BaseException) -> Optional[kolo.Error]:
    """The kolo error behind ``e``: ``e`` itself, or the one a framework
    wrapped (noted by :func:`note_callback_error`, its text inside ``e``'s)."""
    if isinstance(e, kolo.Error):
        return e
    k = _callback_error[0]
    if k is not None and str(k) in str(e):
        return k
    return None


def register_reform_hook(hook: Callable[[], Any]) -> None:
    """``hook()`` runs on every rank after each re-form, before the state's
    reset and sync (a binding drops what it kept of the old round)."""
    if hook not in _reform_hooks:
        _reform_hooks.append(hook)


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``state.commit()``/``check_host_updates()`` on every rank
    at once when workers wait to join or a worker leaves: ``run`` re-forms
    the job without restoring (the commit just made is current everywhere).

    ``skip_sync`` is Horovod's; kolo always syncs after a re-form, so that
    old and new workers meet in the same broadcasts (Horovod #3494)."""

    def __init__(self, skip_sync: bool = False, left: bool = False):
        self.skip_sync = skip_sync
        self.left = left
        super().__init__("this worker left the job" if left else
                         "the job's membership changes at this commit point")


class State:
    """Training state kept across membership changes. Subclasses define
    ``save`` (to host memory), ``restore`` (the last save) and ``sync``
    (from rank 0). Every rank creates the same state objects and calls
    ``commit()`` at the same points of its training loop."""

    def __init__(self, bcast_object: Callable = None, get_rank: Callable = None):
        self._bcast_object = bcast_object or objects.broadcast_object
        self._rank = get_rank or kolo.rank
        self._reset_callbacks: List[Callable[[], Any]] = []
        self._commit: Optional[kolo.Commit] = None
        self._commit_comm: Any = None

    def register_reset_callbacks(self, callbacks: Sequence[Callable[[], Any]]) -> None:
        """Functions (no arguments) called on every rank after each re-form,
        before the state is synced: e.g. to scale the learning rate with the
        new ``size()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called by ``run`` after a re-form: ``reset()``, then the
        registered callbacks."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Saves the state (``save()``), then checks for a pending join or
        leave (``check_host_updates()``). Every rank calls it at the same
        points; a failure loses the work since the last commit. Every
        ``KOLO_DURABLE_EVERY``-th commit rank 0 also hands a pickle of the
        committed state to kolo's background writer (docs/durable.md)."""
        self.save()
        try:
            self.check_host_updates()
        finally:
            point = self._commit
            if point is not None and point.durable_due():
                point.durable_put(pickle.dumps(self._durable_snapshot(),
                                               protocol=pickle.HIGHEST_PROTOCOL))

    def _commit_point(self) -> kolo.Commit:
        comm = kolo._get()
        if self._commit is None or self._commit_comm is not comm:
            # A new comm (after shutdown() and init()): a new commit point.
            self._commit = kolo.Commit()
            self._commit_comm = comm
        return self._commit

    def _durable_resume(self) -> None:
        """Before a sync (``run``): on rank 0 of a state that never committed,
        takes the job's durable commit when one exists, so that the sync
        gives it to every rank."""
        got = self._commit_point().durable_resume()
        if got is not None:
            self._durable_load(pickle.loads(got[1]))

    def _durable_snapshot(self) -> Any:
        """The last saved state as one picklable object (a durable commit)."""
        raise NotImplementedError(f"{type(self).__name__} has no durable commits "
                                  "(define _durable_snapshot and _durable_load)")

    def _durable_load(self, obj: Any) -> None:
        """Makes ``obj`` (a ``_durable_snapshot()``) the saved and current state."""
        raise NotImplementedError(f"{type(self).__name__} has no durable commits")

    def check_host_updates(self) -> None:
        """One 8-byte allreduce, called by every rank at the same point:
        raises HostsUpdatedInterrupt on every rank when workers wait to join
        or one leaves (SIGTERM, kolo.elastic_leave()); a peer failure seen
        by this allreduce raises it too (see ``run``). In a job that is not
        elastic it does nothing (no collective)."""
        if self._commit_point().check():
            raise HostsUpdatedInterrupt(False, left=self._commit.left())

    def _left(self) -> bool:
        return (self._commit is not None and self._commit_comm is kolo._comm and
                self._commit.left())

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def reset(self) -> None:
        """Called after a re-form, before the sync (no-op here)."""


class ObjectState(State):
    """Plain Python values as attributes (``state.epoch``, ``state.batch``):
    deep-copied at ``save()`` and again at ``restore()`` (so a value mutated
    in place after a commit is rolled back too), broadcast from rank 0 with
    ``broadcast_object`` at ``sync()`` (the last saved values).

    ``ObjectState(**kwargs)`` or, as in Horovod,
    ``ObjectState(bcast_object, get_rank, **kwargs)``."""

    def __init__(self, bcast_object: Callable = None, get_rank: Callable = None, **kwargs):
        self._saved_state: Dict[str, Any] = dict(kwargs)
        self._set_attrs()
        State.__init__(self, bcast_object, get_rank)

    def save(self) -> None:
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))

    def _durable_snapshot(self) -> Any:
        return self._saved_state

    def _durable_load(self, obj: Any) -> None:
        self._saved_state = dict(obj)
        self._set_attrs()



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
    the process with status 0, or kolo.EXIT_EVICTED when the straggler
    policy evicted it (SystemExit, so finally blocks and atexit handlers
    still run)."""
    if kolo.elastic_evicted():
        why, status = kolo.last_error() or "evicted as a straggler", kolo.EXIT_EVICTED
    else:
        status = 0
    log.info("kolo elastic: %s; finalizing and exiting with status %d", why, status)
    kolo.finalize()
    raise SystemExit(status)


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
                                f"kolo elastic run: reset limit {limit} reached "
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
      the last commit, the comm re-forms (``kolo.reform()``), the
      bindings' re-form hooks run (every DistributedOptimizer forgets its
      pending allreduces), the reset
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
                            f"kolo elastic State (TorchState, TensorFlowKerasState, ...), "
                            f"not a {type(state).__name__}")
        if not kolo.is_initialized():
            raise ValueError("kolo has not been initialized; call init() (hvd.init()) "
                             "before the elastic function")
        limit = reset_limit()
        resets = 0
        while True:
            why: Optional[BaseException] = None
            try:
                state._durable_resume()
                state.sync()
                state.save()
                result = func(state, *args, **kwargs)
                kolo.elastic_done()
                return result
            except HostsUpdatedInterrupt as e:
                if e.left or state._left():
                    _leave("this worker left the job at a commit point (SIGTERM)")
                why = e
            except Exception as raised:
                e = unwrap(raised)  # a kolo error, perhaps inside a framework's
                if e is None or not kolo.elastic_enabled() or not _membership_failure(e):
                    raise
                _callback_error[0] = None
                if state._left():
                    _leave("this worker left the job")
                state.restore()
                why = e
            if limit and resets >= limit:
                raise _limit_error(limit, why) from why
            resets += 1
            log.info("kolo elastic: %s; %s", why,
                     "re-forming" if isinstance(why, HostsUpdatedInterrupt)
                     else "restored the last commit, re-forming")
            try:
                kolo.reform()
            except kolo.ShutdownError as e:
                _leave(f"this worker left the job while re-forming ({e})")
            # The old round's handles are void: forget them (their buffers
            # are released once kolo is done with them), and let each
            # binding drop what it keeps of the old round.
            handles.clear()
            # Sets of the old round are gone with it: the reset callbacks
            # add them again (docs/elastic.md, "Process sets").
            basics.reset_process_sets()
            for hook in list(_reform_hooks):
                hook()
            state.on_reset()

    return wrapper


class VariablesState(ObjectState):
    """A list of variables of any framework with ``.numpy()`` and
    ``.assign()`` (kolo.common.variables) plus plain values: numpy copies at
    ``save()``, assigned back at ``restore()``, rank 0's broadcast at
    ``sync()``. Subclasses say which variables (``_variables()``)."""

    def _variables(self) -> Sequence[Any]:
        raise NotImplementedError

    def __init__(self, **kwargs: Any):
        from . import variables as V
        self._V = V
        super().__init__(**kwargs)
        self._saved_vars = V.values(self._variables())

    def save(self) -> None:
        self._saved_vars = self._V.values(self._variables())
        super().save()

    def restore(self) -> None:
        self._V.assign(self._variables(), self._saved_vars)
        super().restore()

    def _shared_variables(self) -> Sequence[Any]:
        """The variables that ``sync()`` broadcasts (default: all)."""
        return self._variables()

    def sync(self) -> None:
        self._V.broadcast(self._shared_variables(), 0, "elastic.state")
        super().sync()

    def _durable_snapshot(self) -> Any:
        return {"variables": self._saved_vars, "values": super()._durable_snapshot()}

    def _durable_load(self, obj: Any) -> None:
        variables = self._variables()
        if len(variables) != len(obj["variables"]):
            raise ValueError(f"kolo: the durable commit holds {len(obj['variables'])} "
                             f"variables, this state {len(variables)}")
        self._saved_vars = obj["variables"]
        self._V.assign(variables, self._saved_vars)
        super()._durable_load(obj["values"])


class ModelState(VariablesState):
    """A Keras model's variables and its optimizer's (the model's own when
    none is given), and plain values: Horovod's ``TensorFlowKerasState`` and
    ``KerasState``, on Keras 3 (every backend) and tf_keras."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any):
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "optimizer", optimizer)
        super().__init__(**kwargs)

    def _variables(self, shared: bool = False) -> Sequence[Any]:
        # Keras 3 on jax keeps the state outside the variables during fit:
        # attach it first (the trainer then reads it back before its next step).
        attach = getattr(self.model, "jax_state_sync", None)
        if callable(attach):
            attach()
        opt = self.optimizer if self.optimizer is not None else \
            getattr(self.model, "optimizer", None)
        _build_optimizer(self.model, opt)
        return list(self.model.variables) + self._V.optimizer_variables(opt, shared)


def _build_optimizer(model: Any, opt: Any) -> None:
    """Keras creates an optimizer's variables (slots, step count) at its first
    step. A worker that joins a running job, or a rank 0 that resumes a
    durable commit, before that step would hold fewer variables than the
    others or the file, and the sync or the load would fail: build them now,
    on the model's trainable variables, as that first step would. Only for
    optimizers that say they are not built (Keras 3) and a built model."""
    if opt is None or getattr(opt, "built", True) or not callable(getattr(opt, "build", None)):
        return
    if not getattr(model, "built", False) or not list(model.trainable_variables):
        return
    opt.build(model.trainable_variables)

    def _shared_variables(self) -> Sequence[Any]:
        return self._variables(shared=True)
