"""Joining (kolo:// and env://), the backend's creator and its registration with torch."""

from __future__ import annotations

import atexit
import functools
import inspect
import itertools
import json
import logging
import os
import secrets
import sys
import time
import urllib.parse
from typing import Any, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

import kolo

from . import _state
from . import _functional
from ._common import BACKEND, SCHEME, _DEFAULT_TIMEOUT, _kolo_timeout_ms, _timeout_s
from ._group import ProcessGroupKolo
from ._store import KoloStore

log = logging.getLogger("kolo.torch.distributed")


# ---- joining: kolo:// and env:// ---------------------------------------------


def _join_kolo(timeout: Any) -> None:
    """kolo.init() for kolo://, after checking the launcher and setting
    KOLO_TIMEOUT_MS from torch's timeout (unless the user set it)."""
    if kolo.is_initialized():
        return
    if not os.environ.get("KOLO_RENDEZVOUS") and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise RuntimeError(
            "kolo: init_method='kolo://' joins kolo's rendezvous (run under kolorun, or set "
            "KOLO_RENDEZVOUS), but this process was started by torchrun or another launcher "
            f"(WORLD_SIZE={os.environ.get('WORLD_SIZE')}): use init_process_group('kolo') "
            "(env://) there")
    ms = _kolo_timeout_ms(timeout)
    if ms and not os.environ.get("KOLO_TIMEOUT_MS") and not os.environ.get(
            "HOROVOD_GLOO_TIMEOUT_SECONDS"):
        os.environ["KOLO_TIMEOUT_MS"] = str(ms)
    kolo.init()


def _rendezvous(url: str, timeout: Any = _DEFAULT_TIMEOUT, **kwargs: Any):
    """The ``kolo://`` rendezvous handler: yields (KoloStore, rank, size)."""
    query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    want_rank = int(query.get("rank", ["-1"])[0])
    want_size = int(query.get("world_size", ["-1"])[0])
    _join_kolo(timeout)
    rank, size = kolo.rank(), kolo.size()
    if want_rank not in (-1, rank) or want_size not in (-1, size):
        raise ValueError(f"kolo: init_process_group(rank={want_rank}, world_size={want_size}) but "
                         f"kolo's rendezvous made this process rank {rank} of {size}; leave rank "
                         f"and world_size out with kolo://")
    store = KoloStore()
    with _state.lock:
        _state.stores.append(store)
    yield store, rank, size
    raise RuntimeError("kolo: kolo:// cannot rendezvous again; in an elastic job call "
                       "kolo.reform(), then init_process_group again (see elastic_run)")


class _Bootstrap:
    """The comm this module bootstrapped through a c10d store (env://)."""

    def __init__(self, store: Any, rank: int, size: int, prefix: str, timeout: Any):
        self.store = store
        self.rank = rank
        self.size = size
        self.prefix = prefix
        self.timeout = timeout


_boot: Optional[_Bootstrap] = None
_boot_count = 0
_exit_hook = False

FINALIZE_BARRIER_S = 60.0  # longest wait for the other ranks before finalizing


def _connect(store: Any, rank: int, size: int, prefix: str, timeout: Any) -> int:
    """A comm of ``size`` ranks connected through ``store`` (every one of
    them calls it with the same prefix); its pointer."""
    if rank == 0:
        store.set(f"{prefix}/secret", json.dumps({"job": "torch-" + secrets.token_hex(8),
                                                  "token": secrets.token_hex(32)}))
    secret = json.loads(bytes(store.get(f"{prefix}/secret")).decode())
    calls = itertools.count()

    def allgather(data: bytes) -> list:
        i = next(calls)
        store.set(f"{prefix}/allgather{i}/{rank}", data)
        return [bytes(store.get(f"{prefix}/allgather{i}/{r}")) for r in range(size)]

    ptr, _ = kolo.bootstrap_connect(rank, size, allgather, job=secret["job"],
                                    token=secret["token"],
                                    route_to=os.environ.get("MASTER_ADDR", ""),
                                    timeout_ms=_kolo_timeout_ms(timeout))
    return ptr


def _bootstrap(store: Any, rank: int, size: int, timeout: Any) -> None:
    """Connects kolo's data plane through the c10d store (every rank)."""
    global _boot, _boot_count, _exit_hook
    prefix = f"kolo/bootstrap/{_boot_count}"
    _boot_count += 1
    kolo.adopt(_connect(store, rank, size, prefix, timeout))
    _boot = _Bootstrap(store, rank, size, prefix, timeout)
    if not _exit_hook:
        _exit_hook = True
        atexit.register(_finish_bootstrap)  # runs before kolo's own atexit finalize


def _store_barrier(b: _Bootstrap, deadline_s: float) -> bool:
    key = f"{b.prefix}/finalize"
    b.store.add(key, 1)
    end = time.monotonic() + deadline_s
    while b.store.add(key, 0) < b.size:
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def _finish_bootstrap() -> None:
    """Finalizes a bootstrapped comm: barrier through the store (unless an
    operation failed), then kolo.finalize(); kolo.abort() first when the
    barrier could not be completed or something failed."""
    global _boot
    b, _boot = _boot, None
    if b is None or not kolo.is_initialized():
        return
    limit = min(_timeout_s(b.timeout), FINALIZE_BARRIER_S)
    drained = all(pg._shutdown("destroyed", limit) for pg in list(_state.groups))
    failed = _state.failure_count > 0 or bool(getattr(kolo, "_failed", False)) or not drained
    ok = False
    if not failed:
        try:
            ok = _store_barrier(b, limit)
        except Exception as e:  # noqa: BLE001 - the store's host may be gone
            log.info("kolo: the finalize barrier through the store failed: %s", e)
    if not ok:
        kolo.abort()
    kolo.finalize()


# ---- the backend creator ----------------------------------------------------


def _create(opts: Any, pg_options: Any = None) -> ProcessGroupKolo:
    """Backend.register_backend's creator (extended API)."""
    if pg_options is not None:
        raise ValueError("kolo: process group options (pg_options) are not supported")
    ranks = list(opts.global_ranks_in_group)
    if not kolo.is_initialized():
        if ranks:
            raise RuntimeError("kolo: the default process group must use kolo before new_group")
        _bootstrap(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    rank, size = kolo.rank(), kolo.size()
    if ranks and sorted(ranks) != list(range(size)):
        return _subgroup(opts, ranks)
    if opts.group_size != size or opts.group_rank != rank:
        raise RuntimeError(f"kolo: torch made this process rank {opts.group_rank} of "
                           f"{opts.group_size}, but the kolo comm it joined says rank {rank} of "
                           f"{size}")
    return _track(ProcessGroupKolo(rank, size, str(opts.group_id), opts.timeout))


def _subgroup(opts: Any, ranks: List[int]) -> ProcessGroupKolo:
    """A group of some of the ranks (new_group(ranks), new_subgroups, a
    DeviceMesh dimension): torch calls the creator on its members only, so
    their comm is connected through the group's own store, among them
    alone, with its own rings and fusion (as a kolo process set)."""
    comm = kolo.Comm(_connect(opts.store, opts.group_rank, opts.group_size, "kolo/subgroup",
                              opts.timeout), True, list(ranks))
    pg = ProcessGroupKolo(opts.group_rank, opts.group_size, str(opts.group_id), opts.timeout,
                          comm=comm, store=opts.store)
    return _track(pg)


def _track(pg: ProcessGroupKolo) -> ProcessGroupKolo:
    with _state.lock:
        _state.groups.append(pg)
        global _groups_hook
        if not _groups_hook:  # registered after kolo's own: runs before its finalize
            _groups_hook = True
            atexit.register(_stop_groups)
    return pg


_groups_hook = False


def _stop_groups() -> None:
    """At interpreter exit: lets the operations in flight complete and stops
    the completion threads, so that none runs Python code while the
    interpreter is finalized."""
    for pg in _kolo_groups():
        pg._shutdown("stopped at interpreter exit", min(_timeout_s(pg._timeout), 30.0))


def _kolo_groups() -> List[ProcessGroupKolo]:
    return [pg for pg in _state.groups if not pg._closed]


_orig_destroy = _c10d.destroy_process_group
_orig_new_group = _c10d.new_group
_orig_init = _c10d.init_process_group
_orig_monitored = _c10d.monitored_barrier


@functools.wraps(_orig_init)
def init_process_group(*args: Any, **kwargs: Any) -> None:
    _orig_init(*args, **kwargs)
    device = kwargs.get("device_id")
    pg = _c10d._get_default_group()
    if device is not None and isinstance(pg, ProcessGroupKolo) and pg.bound_device_id is None:
        if isinstance(device, int):  # as torch reads it: an index of the accelerator
            device = torch.device(torch.accelerator.current_accelerator().type, device)
        pg.bound_device_id = device  # torch set it on the group kolo's replaced


@functools.wraps(_orig_monitored)
def monitored_barrier(group: Optional[Any] = None, timeout: Any = None,
                      wait_all_ranks: bool = False) -> None:
    pg = group
    if pg is None and _c10d.is_initialized():
        pg = _c10d._get_default_group()
    if isinstance(pg, ProcessGroupKolo):  # torch itself allows gloo only
        return pg.monitored_barrier(timeout, wait_all_ranks)
    return _orig_monitored(group, timeout, wait_all_ranks)


@functools.wraps(_orig_destroy)
def destroy_process_group(group: Optional[Any] = None) -> None:
    whole = group is None or group is _c10d.GroupMember.WORLD
    targets = [pg for pg in _kolo_groups() if whole or pg is group]
    _orig_destroy(group)
    for pg in targets:
        pg._shutdown("destroyed")
    if whole and _boot is not None:
        _finish_bootstrap()


def _register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
            dist.Backend.register_backend(BACKEND, _create, extended_api=True,
                                          devices=["cpu", "cuda"])
        else:  # torch < 2.2
            dist.Backend.register_backend(BACKEND, _create, extended_api=True)
    import torch.distributed.rendezvous  # noqa: F401 - the module, not dist.rendezvous()
    handlers = sys.modules["torch.distributed.rendezvous"]._rendezvous_handlers
    if SCHEME not in handlers:
        dist.register_rendezvous_handler(SCHEME, _rendezvous)
    _functional.register()
    for mod in (_c10d, dist):
        if getattr(mod, "destroy_process_group", None) is _orig_destroy:
            mod.destroy_process_group = destroy_process_group
        if getattr(mod, "init_process_group", None) is _orig_init:
            mod.init_process_group = init_process_group
        if getattr(mod, "monitored_barrier", None) is _orig_monitored:
            mod.monitored_barrier = monitored_barrier


_register()


def init(timeout: Any = _DEFAULT_TIMEOUT) -> None:
    """``init_process_group("kolo", init_method="kolo://")`` unless a default
    group exists. Every worker of a kolorun job calls it."""
    if not dist.is_initialized():
        dist.init_process_group(BACKEND, init_method=f"{SCHEME}://", timeout=timeout)
