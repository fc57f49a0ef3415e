"""Every ctypes declaration of libkolo, in one place.

Nothing else in the package touches ``ctypes.CDLL``. ``PROTOTYPES`` lists each
public function of ``include/kolo/*.h`` with its C result and argument types;
``tests/python/test_abi.py`` parses the headers and fails when the two
disagree, because a wrong prototype crashes the process instead of raising.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
import threading

from ctypes import POINTER, c_bool, c_char_p, c_double, c_int, c_int64, c_size_t, c_void_p

c_comm_p = c_void_p  # kolo_comm_t *
c_handle_p = c_void_p  # kolo_handle_t *
c_state_p = c_void_p  # kolo_state_t *
c_bootstrap_p = c_void_p  # kolo_bootstrap_t *
c_status = c_int  # kolo_status_t
c_dtype = c_int  # kolo_dtype_t
c_op = c_int  # kolo_op_t
c_callback = c_void_p  # kolo_callback_fn: always NULL from Python
c_train_fn = c_void_p  # kolo_train_fn: never called from Python

# Status codes of KOLO_STATUS_MAP (include/kolo/kolo.h); checked by test_abi.py.
STATUS = {
    "OK": 0,
    "EINVAL": 1,
    "ETIMEDOUT": 2,
    "EPEER": 3,
    "EMEMBERSHIP": 4,
    "ENOMEM": 5,
    "ESYSTEM": 6,
    "EPROTO": 7,
    "EAUTH": 8,
    "ENOTFOUND": 9,
    "ERENDEZVOUS": 10,
    "ECLOSED": 11,
    "EMISMATCH": 12,
    "ESHUTDOWN": 13,
    "EUNSUPPORTED": 14,
}

# enum kolo_dtype and enum kolo_op; checked by test_abi.py.
DTYPES = {
    "int8": 0,
    "uint8": 1,
    "int32": 2,
    "int64": 3,
    "float16": 4,
    "bfloat16": 5,
    "float32": 6,
    "float64": 7,
}
OPS = {"sum": 0, "average": 1, "min": 2, "max": 3, "product": 4, "adasum": 8}

BOOTSTRAP_CARD_SIZE = 256  # KOLO_BOOTSTRAP_CARD_SIZE
BOOTSTRAP_HOST_MAX = 256  # KOLO_BOOTSTRAP_HOST_MAX


class BootstrapConfig(ctypes.Structure):
    """struct kolo_bootstrap_config (include/kolo/bootstrap.h)."""

    _fields_ = [
        ("rank", c_int),
        ("size", c_int),
        ("job", c_char_p),
        ("token", c_char_p),
        ("route_to", c_char_p),
        ("timeout_ms", c_int),
    ]


P = POINTER
# name: (restype, [argtypes]); the order of the headers.
PROTOTYPES = {
    # kolo.h
    "kolo_strerror": (c_char_p, [c_status]),
    "kolo_status_name": (c_char_p, [c_status]),
    "kolo_dtype_size": (c_size_t, [c_dtype]),
    "kolo_dtype_name": (c_char_p, [c_dtype]),
    "kolo_dtype_parse": (c_status, [c_char_p, P(c_dtype)]),
    "kolo_op_name": (c_char_p, [c_op]),
    "kolo_op_parse": (c_status, [c_char_p, P(c_op)]),
    "kolo_init": (c_status, [P(c_comm_p)]),
    "kolo_init_error": (c_char_p, []),
    "kolo_finalize": (c_status, [c_comm_p]),
    "kolo_abort": (None, [c_comm_p]),
    "kolo_rank": (c_int, [c_comm_p]),
    "kolo_size": (c_int, [c_comm_p]),
    "kolo_local_rank": (c_int, [c_comm_p]),
    "kolo_local_size": (c_int, [c_comm_p]),
    "kolo_cross_rank": (c_int, [c_comm_p]),
    "kolo_cross_size": (c_int, [c_comm_p]),
    "kolo_is_homogeneous": (c_int, [c_comm_p]),
    "kolo_round": (c_int64, [c_comm_p]),
    "kolo_last_error": (c_char_p, [c_comm_p]),
    "kolo_allreduce": (c_status, [c_comm_p, c_void_p, c_void_p, c_size_t, c_dtype, c_op]),
    "kolo_allreduce_scaled": (
        c_status,
        [c_comm_p, c_void_p, c_void_p, c_size_t, c_dtype, c_op, c_double, c_double],
    ),
    "kolo_allgather": (c_status, [c_comm_p, c_void_p, c_void_p, c_size_t, c_dtype]),
    "kolo_allgatherv": (
        c_status,
        [c_comm_p, c_void_p, c_size_t, c_void_p, P(c_size_t), c_dtype],
    ),
    "kolo_broadcast": (c_status, [c_comm_p, c_void_p, c_size_t, c_dtype, c_int]),
    "kolo_reducescatter": (c_status, [c_comm_p, c_void_p, c_void_p, c_size_t, c_dtype, c_op]),
    "kolo_reducescatter_count": (c_size_t, [c_size_t, c_int, c_int]),
    "kolo_alltoall": (c_status, [c_comm_p, c_void_p, c_void_p, c_size_t, c_dtype]),
    "kolo_alltoallv": (
        c_status,
        [c_comm_p, c_void_p, P(c_size_t), c_void_p, P(c_size_t), c_dtype],
    ),
    "kolo_barrier": (c_status, [c_comm_p]),
    "kolo_process_set_create": (c_status, [c_comm_p, P(c_int), c_int, P(c_comm_p)]),
    "kolo_process_set_free": (c_status, [c_comm_p]),
    "kolo_cuda_set_stream": (c_status, [c_void_p]),
    "kolo_cuda_get_stream": (c_void_p, []),
    # async.h
    "kolo_allreduce_async": (
        c_status,
        [c_comm_p, c_char_p, c_void_p, c_void_p, c_size_t, c_dtype, c_op, c_double, c_double,
         c_callback, c_void_p, P(c_handle_p)],
    ),
    "kolo_grouped_allreduce_async": (
        c_status,
        [c_comm_p, c_int, P(c_char_p), P(c_void_p), P(c_void_p), P(c_size_t), c_dtype, c_op,
         c_double, c_double, c_callback, c_void_p, P(c_handle_p)],
    ),
    "kolo_allgather_async": (
        c_status,
        [c_comm_p, c_char_p, c_void_p, c_size_t, c_dtype, P(c_void_p), P(c_size_t),
         c_callback, c_void_p, P(c_handle_p)],
    ),
    "kolo_alltoall_into_async": (
        c_status,
        [c_comm_p, c_char_p, c_void_p, c_size_t, P(c_size_t), c_dtype, c_void_p, c_size_t,
         P(c_size_t), c_callback, c_void_p, P(c_handle_p)],
    ),
    "kolo_allgather_into_async": (
        c_status,
        [c_comm_p, c_char_p, c_void_p, c_size_t, c_dtype, c_void_p, c_size_t, P(c_size_t),
         c_callback, c_void_p, P(c_handle_p)],
    ),
    "kolo_broadcast_async": (
        c_status,
        [c_comm_p, c_char_p, c_void_p, c_size_t, c_dtype, c_int, c_callback, c_void_p,
         P(c_handle_p)],
    ),
    "kolo_alltoall_async": (
        c_status,
        [c_comm_p, c_char_p, c_void_p, c_size_t, P(c_size_t), c_dtype, P(c_void_p),
         P(c_size_t), c_callback, c_void_p, P(c_handle_p)],
    ),
    "kolo_reducescatter_async": (
        c_status,
        [c_comm_p, c_char_p, c_void_p, c_void_p, c_size_t, c_dtype, c_op, c_double, c_double,
         c_callback, c_void_p, P(c_handle_p)],
    ),
    "kolo_barrier_async": (c_status, [c_comm_p, c_callback, c_void_p, P(c_handle_p)]),
    "kolo_send_async": (
        c_status, [c_comm_p, c_void_p, c_size_t, c_int, c_int, c_callback, c_void_p, P(c_handle_p)],
    ),
    "kolo_recv_async": (
        c_status,
        [c_comm_p, c_void_p, c_size_t, c_int, c_int, P(c_int), c_callback, c_void_p,
         P(c_handle_p)],
    ),
    "kolo_send": (c_status, [c_comm_p, c_void_p, c_size_t, c_int, c_int]),
    "kolo_recv": (c_status, [c_comm_p, c_void_p, c_size_t, c_int, c_int, P(c_int)]),
    "kolo_poll": (c_status, [c_handle_p, P(c_int)]),
    "kolo_wait_for": (c_status, [c_handle_p, c_int, P(c_int)]),
    "kolo_wait": (c_status, [c_handle_p]),
    "kolo_handle_release": (None, [c_handle_p]),
    "kolo_join": (c_status, [c_comm_p, P(c_int)]),
    "kolo_free": (None, [c_void_p]),
    "kolo_timeline_start": (c_status, [c_comm_p, c_char_p]),
    "kolo_timeline_stop": (c_status, [c_comm_p]),
    # elastic.h
    "kolo_elastic_enabled": (c_bool, [c_comm_p]),
    "kolo_elastic_evicted": (c_bool, [c_comm_p]),
    "kolo_reform": (c_status, [c_comm_p]),
    "kolo_state_create": (c_status, [c_comm_p, P(c_state_p)]),
    "kolo_state_destroy": (None, [c_state_p]),
    "kolo_state_register": (c_status, [c_state_p, c_char_p, c_void_p, c_size_t, c_dtype]),
    "kolo_state_commit": (c_status, [c_state_p]),
    "kolo_state_restore": (c_status, [c_state_p]),
    "kolo_state_sync": (c_status, [c_state_p]),
    "kolo_state_left": (c_bool, [c_state_p]),
    "kolo_state_commit_number": (c_int64, [c_state_p]),
    "kolo_durable_due": (c_bool, [c_state_p]),
    "kolo_durable_put": (c_status, [c_state_p, c_void_p, c_size_t]),
    "kolo_durable_resume": (c_status, [c_state_p, P(c_void_p), P(c_size_t), P(c_int64)]),
    "kolo_elastic_leave": (None, []),
    "kolo_elastic_leaving": (c_bool, []),
    "kolo_elastic_preemption": (c_int, [c_char_p, c_size_t]),
    "kolo_elastic_preemption_deadline_ms": (c_int64, []),
    "kolo_elastic_run": (c_status, [c_comm_p, c_state_p, c_train_fn, c_void_p]),
    "kolo_elastic_resets": (c_int, [c_comm_p]),
    "kolo_elastic_done": (None, [c_comm_p]),
    # bootstrap.h
    "kolo_bootstrap_create": (c_status, [P(BootstrapConfig), P(c_bootstrap_p)]),
    "kolo_bootstrap_host": (c_char_p, [c_bootstrap_p]),
    "kolo_bootstrap_listen": (c_status, [c_bootstrap_p, P(c_char_p), c_void_p]),
    "kolo_bootstrap_connect": (c_status, [c_bootstrap_p, c_void_p, P(c_comm_p)]),
    "kolo_bootstrap_destroy": (None, [c_bootstrap_p]),
    # mxnet.h
    "kolo_mx_bind": (c_status, [c_char_p]),
    "kolo_mx_allreduce": (
        c_status,
        [c_comm_p, c_int, P(c_char_p), P(c_void_p), P(c_void_p), P(c_size_t), c_dtype, c_op,
         c_double, c_double, c_int, c_void_p],
    ),
    "kolo_mx_broadcast": (
        c_status, [c_comm_p, c_char_p, c_void_p, c_size_t, c_dtype, c_int, c_int, c_void_p],
    ),
    "kolo_mx_reducescatter": (
        c_status,
        [c_comm_p, c_char_p, c_void_p, c_size_t, c_dtype, c_op, c_double, c_double, c_int,
         c_void_p],
    ),
    "kolo_mx_allgather": (
        c_status, [c_comm_p, c_char_p, c_void_p, c_size_t, c_dtype, c_int, c_void_p],
    ),
    "kolo_mx_take_error": (c_status, [c_char_p, c_size_t]),
    "kolo_mx_pending": (c_int, []),
}

# Functions of PROTOTYPES a libkolo may lack (they came with the CUDA data
# path, docs/gpu.md): an older library still loads, and kolo then takes host
# buffers only (has() says). test_abi.py checks them against the headers
# like the others, and lets a header without them pass.
OPTIONAL = frozenset({"kolo_cuda_set_stream", "kolo_cuda_get_stream"})

_lock = threading.Lock()
_lib = None
_path = None
_has: set = set()


def candidates() -> list[str]:
    """Where the library is looked for, in order."""
    out = []
    env = os.environ.get("KOLO_LIBRARY")
    if env:
        out.append(env)
    here = pathlib.Path(__file__).resolve().parent
    # A copy installed with the package (cmake --install puts it here).
    out += [str(here / "lib" / "libkolo.so"), str(here / "libkolo.so")]
    # The build tree of a source checkout: <repo>/python/kolo -> <repo>/build*/lib.
    repo = here.parent.parent
    for build in ("build", "build-asan", "build-tsan"):
        out.append(str(repo / build / "lib" / "libkolo.so"))
    out.append("libkolo.so.0")  # the system loader
    found = ctypes.util.find_library("kolo")
    if found:
        out.append(found)
    return out


def load_mode() -> int:
    """How libkolo is loaded: RTLD_LOCAL, and RTLD_DEEPBIND so that its own
    libraries come first. TensorFlow makes its bundled copies of libcurl and
    of BoringSSL (which names its functions as OpenSSL does) global; without
    DEEPBIND, a libkolo loaded after ``import tensorflow`` would call TF's
    curl and TF's HMAC, and one loaded before would mix the two copies on one
    curl handle. KOLO_DEEPBIND=0 turns it off (a sanitizer's interposed
    allocator needs the global scope first)."""
    mode = getattr(os, "RTLD_LOCAL", 0)
    if os.environ.get("KOLO_DEEPBIND", "1") != "0" and hasattr(os, "RTLD_DEEPBIND"):
        mode |= os.RTLD_DEEPBIND
    return mode


def library():
    """The loaded libkolo with every prototype declared (loaded once)."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        lib = None
        for path in candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append(f"{path} (absent)")
                continue
            try:
                lib = ctypes.CDLL(path, mode=load_mode())
                _path = path
                break
            except OSError as e:
                tried.append(f"{path} ({e})")
        if lib is None:
            raise ImportError(
                "kolo: cannot load libkolo.so; tried:\n  " + "\n  ".join(tried)
                + "\nSet KOLO_LIBRARY to the library's path, or build kolo (scripts/setup.sh)."
            )
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError as e:
                if name in OPTIONAL:
                    continue
                raise ImportError(f"kolo: {_path} has no {name}: an older libkolo?") from e
            fn.restype = restype
            fn.argtypes = argtypes
            _has.add(name)
        _lib = lib
        return lib


def has(name: str) -> bool:
    """Whether the loaded libkolo exports ``name`` (one of :data:`OPTIONAL`;
    every other prototype is there once it has loaded)."""
    library()
    return name in _has


# ---- the CUDA runtime, for copies into outputs on the device ------------------

# cudaMemcpyKind cudaMemcpyDefault: the direction from the pointers.
CUDA_MEMCPY_DEFAULT = 4
CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
_cudart = None


def cudart():
    """The CUDA runtime libkolo uses (the one of CUDART_NAMES already in the
    process, found by its soname), with the few functions the package calls
    declared. Only asked for once a device buffer exists, so libkolo has
    loaded it. Raises OSError when none loads."""
    global _cudart
    if _cudart is not None:
        return _cudart
    with _lock:
        if _cudart is not None:
            return _cudart
        # One libkolo has loaded first (RTLD_NOLOAD finds only those), so that
        # the copies run on the runtime kolo uses even where another one is
        # in the process too (a CUDA torch brings its own).
        rt, errors = None, []
        for mode in (getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LOCAL, os.RTLD_LOCAL):
            for name in CUDART_NAMES:
                try:
                    rt = ctypes.CDLL(name, mode=mode)
                    break
                except OSError as e:
                    errors.append(str(e))
            if rt is not None:
                break
        if rt is None:
            raise OSError("kolo: cannot load the CUDA runtime: " + "; ".join(errors[-3:]))
        decl = {
            "cudaMemcpyAsync": [c_void_p, c_void_p, c_size_t, c_int, c_void_p],
            "cudaStreamSynchronize": [c_void_p],
            "cudaGetDevice": [POINTER(c_int)],
            "cudaSetDevice": [c_int],
        }
        for name, argtypes in decl.items():
            fn = getattr(rt, name)
            fn.restype = c_int
            fn.argtypes = argtypes
        rt.cudaGetErrorString.restype = c_char_p
        rt.cudaGetErrorString.argtypes = [c_int]
        _cudart = rt
        return rt


def path() -> str | None:
    """The path libkolo was loaded from, or None before it is loaded."""
    return _path


def text(b: bytes | None) -> str:
    return b.decode("utf-8", "replace") if b else ""
