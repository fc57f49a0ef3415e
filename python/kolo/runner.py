"""``kolo.run``: Horovod's ``horovod.run`` on kolo.

``kolo.run(func, args, kwargs, np=N)`` runs ``func(*args, **kwargs)`` in N
local worker processes started by ``kolorun`` and returns their return
values in rank order, so that a script written as::

    import horovod
    horovod.run(main, args=(args,), np=args.num_proc, hosts=args.hosts)

runs on kolo with ``import kolo as horovod``. The function (and its
arguments) travel to the workers pickled with cloudpickle, so functions and
classes defined in ``__main__``, lambdas and closures work; without
cloudpickle, plain pickle ships functions that the workers can import.

How it works: the caller writes ``(func, args, kwargs)`` into a private
temporary directory and runs ``kolorun -np N -- <python> -m
kolo._run_worker <dir>``; each worker unpickles the payload, calls the
function (which calls ``hvd.init()`` itself, or not), and writes one record
into the directory: its rank and the pickled return value, or its rank and
the formatted traceback. The caller echoes the workers' output (prefixed
with the rank by kolorun) to its own ``sys.stdout``/``sys.stderr``, waits,
reads the records and removes the directory.
"""

from __future__ import annotations

import collections
import collections.abc
import ipaddress
import operator
import os
import pathlib
import pickle
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["run", "RunError", "find_kolorun"]

_PACKAGE = pathlib.Path(__file__).resolve().parent
_PAYLOAD = "payload.pkl"
_RECORD = "result."
_TAIL_LINES = 40
_STOP_GRACE_S = 3.0

_CLOUDPICKLE_HINT = "pip install cloudpickle"
# kolorun's report of a failed worker (tools/kolorun/kolorun.c).
_EXIT_LINE = re.compile(r"^kolorun: (rank \d+|worker w\d+) \(pid (\d+)\) "
                        r"(exited with status \d+|was killed by signal \d+)$")


class RunError(RuntimeError):
    """:func:`run`'s job failed. ``rank`` is the rank whose failure is
    reported (None when no worker could say), ``remote_traceback`` that
    worker's formatted traceback (or None), ``exit_status`` kolorun's exit
    status, ``failures`` every worker's ``(rank, exception type name)``."""

    def __init__(self, message: str, rank: Optional[int] = None,
                 remote_traceback: Optional[str] = None, exit_status: Optional[int] = None,
                 failures: Sequence[Tuple[Optional[int], str]] = ()):
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback
        self.exit_status = exit_status
        self.failures = list(failures)


# ---- finding kolorun -------------------------------------------------------


def _executable(p: Union[str, os.PathLike, None]) -> Optional[str]:
    if not p:
        return None
    p = os.path.abspath(os.fspath(p))
    return p if os.path.isfile(p) and os.access(p, os.X_OK) else None


def _library_dir() -> Optional[pathlib.Path]:
    """The directory of the libkolo this process loads (None when it
    cannot be loaded here)."""
    try:
        from . import _lib

        _lib.library()
        p = _lib.path()
    except Exception:  # noqa: BLE001 - any failure only means "not there"
        return None
    return pathlib.Path(p).resolve().parent if p else None


def find_kolorun() -> str:
    """The kolorun binary :func:`run` starts, the first of: ``$KOLO_KOLORUN``;
    ``kolo/bin/kolorun`` inside the package (a wheel); ``bin/kolorun``
    beside the directory of the loaded libkolo (``build/lib`` ->
    ``build/bin``, ``<prefix>/lib`` -> ``<prefix>/bin``); the source
    checkout's ``build/bin/kolorun``; ``kolorun`` on ``PATH``. Raises
    FileNotFoundError listing what was tried."""
    tried = []
    env = os.environ.get("KOLO_KOLORUN")
    if env:
        found = _executable(env)
        if found:
            return found
        tried.append(f"$KOLO_KOLORUN={env}")
    candidates = [_PACKAGE / "bin" / "kolorun"]
    libdir = _library_dir()
    if libdir is not None:
        candidates.append(libdir.parent / "bin" / "kolorun")
    candidates.append(_PACKAGE.parent.parent / "build" / "bin" / "kolorun")
    for c in candidates:
        found = _executable(c)
        if found:
            return found
        tried.append(str(c))
    found = shutil.which("kolorun")
    if found:
        return os.path.abspath(found)
    tried.append("kolorun on PATH")
    raise FileNotFoundError("kolo.run: cannot find kolorun; tried " + ", ".join(tried) +
                            " (build kolo, or set KOLO_KOLORUN to the binary)")


# ---- arguments -------------------------------------------------------------


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"kolo.run: {what} must be an integer >= 1, not {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"kolo.run: {what} must be an integer >= 1, not {value!r}") from None
    if n < 1:
        raise ValueError(f"kolo.run: {what} must be an integer >= 1, not {n}")
    return n


def _either(new: Any, old: Any, new_name: str, old_name: str) -> Any:
    """Horovod's two spellings of one parameter (num_proc / np, ...)."""
    if new is not None and old is not None and new != old:
        raise ValueError(f"kolo.run: {new_name}={new!r} and {old_name}={old!r} disagree; give "
                         f"one of them")
    return new if new is not None else old


def _local_names() -> set:
    names = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
    try:
        h = socket.gethostname()
    except OSError:
        h = ""
    if h:
        names.update({h.lower(), h.split(".")[0].lower()})
    return names


def _is_local(host: str, names: set) -> bool:
    h = host.strip().lower()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if h in names:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        pass
    try:
        fqdn = socket.getfqdn().lower()  # may ask DNS: only when nothing cheaper matched
    except OSError:
        return False
    return h == fqdn


def _parse_hosts(hosts: Union[str, Sequence[str]],
                 default_slots: Optional[int]) -> List[Tuple[str, int]]:
    """``"a:2,b:4"`` (or a list of ``"a:2"``) -> [("a", 2), ("b", 4)]; a host
    without ``:N`` has ``default_slots`` (Horovod's ``slots``, else 1)."""
    if isinstance(hosts, str):
        items = [x for x in hosts.replace(" ", "").split(",") if x]
    else:
        items = [str(x).strip() for x in hosts if str(x).strip()]
    if not items:
        raise ValueError(f"kolo.run: hosts={hosts!r} names no host")
    out = []
    for item in items:
        name, slots = item, None
        if item.startswith("["):  # [::1]:2
            end = item.find("]")
            name, rest = item[:end + 1], item[end + 1:]
            if rest.startswith(":"):
                slots = rest[1:]
        elif item.count(":") == 1:
            name, slots = item.split(":")
        if slots is None:
            n = default_slots or 1
        else:
            try:
                n = int(slots)
            except ValueError:
                n = 0
            if n < 1:
                raise ValueError(f"kolo.run: host {item!r}: the slot count must be an integer "
                                 f">= 1 (host:slots)")
        out.append((name, n))
    return out


def _parse_hostfile(path: Union[str, os.PathLike]) -> List[Tuple[str, int]]:
    """Horovod's host file: one ``<hostname> slots=<n>`` per line; ``#``
    starts a comment; a line without ``slots=`` has 1 slot."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError as e:
        raise ValueError(f"kolo.run: cannot read hostfile {os.fspath(path)!r}: {e}") from None
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = 1
        for p in parts[1:]:
            if p.startswith("slots="):
                try:
                    slots = int(p[len("slots="):])
                except ValueError:
                    slots = 0
        if slots < 1:
            raise ValueError(f"kolo.run: hostfile {os.fspath(path)!r} line {lineno}: slots must "
                             f"be an integer >= 1: {line!r}")
        out.append((parts[0], slots))
    if not out:
        raise ValueError(f"kolo.run: hostfile {os.fspath(path)!r} names no host")
    return out


def _local_slots(entries: List[Tuple[str, int]], source: str) -> int:
    names = _local_names()
    remote = [h for h, _ in entries if not _is_local(h, names)]
    if remote:
        raise ValueError(
            f"kolo.run runs workers on this machine only, and {source} names "
            f"{', '.join(repr(h) for h in remote)}, which is not this host "
            f"({socket.gethostname()!r}, localhost). For a job over several machines start "
            f"kolorun on each host against one rendezvous server: kolo-rendezvous somewhere, "
            f"then `kolorun --rendezvous URL --host NAME -np N -- python train.py` on every "
            f"host (docs/running.md)")
    return sum(n for _, n in entries)


# ---- shipping objects ------------------------------------------------------


def _cloudpickle():
    try:
        import cloudpickle
    except ImportError:
        return None
    return cloudpickle


class _ImportablePickler(pickle.Pickler):
    """Plain pickle that refuses what a worker could not import back:
    functions and classes of ``__main__``, lambdas and local definitions."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)):
            mod = getattr(obj, "__module__", None)
            qual = getattr(obj, "__qualname__", "") or ""
            if mod in (None, "__main__") or "<lambda>" in qual or "<locals>" in qual:
                raise pickle.PicklingError(
                    f"{obj!r} is defined in {mod or 'an unknown module'}"
                    f"{' (a lambda or local definition)' if '<' in qual else ''}, which the "
                    f"workers cannot import")
        return NotImplemented


def _dumps(obj: Any, what: str) -> bytes:
    cp = _cloudpickle()
    if cp is not None:
        return cp.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    import io

    buf = io.BytesIO()
    try:
        _ImportablePickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise ImportError(
            f"kolo.run: {what} cannot be shipped to the workers without cloudpickle ({e}); "
            f"{_CLOUDPICKLE_HINT}, or pass a function defined at the top level of an "
            f"importable module") from e
    return buf.getvalue()


def _loads(data: bytes, what: str) -> Any:
    try:
        return pickle.loads(data)
    except ModuleNotFoundError as e:
        if e.name == "cloudpickle":
            raise ImportError(f"kolo.run: {what} was pickled with cloudpickle, which "
                              f"{sys.executable} cannot import: {_CLOUDPICKLE_HINT}") from e
        raise


# ---- the workers' environment ----------------------------------------------


def _python_path(given: Optional[str]) -> str:
    """PYTHONPATH for the workers: ``given`` (the env argument's), the
    directory holding this kolo package, then the caller's ``sys.path``
    without its interpreter's own directories (which a worker's interpreter
    brings itself, and which would shadow another interpreter's), then the
    caller's PYTHONPATH."""
    skip = []
    for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        if p:
            skip.append(os.path.realpath(p))
    try:
        user = os.path.realpath(site.getusersitepackages())
    except Exception:  # noqa: BLE001
        user = None
    parts: List[str] = []
    if given:
        parts.extend(x for x in given.split(os.pathsep) if x)
    parts.append(str(_PACKAGE.parent))
    for p in sys.path:
        if not isinstance(p, str):
            continue
        p = os.path.abspath(p or os.getcwd())
        real = os.path.realpath(p)
        if not os.path.exists(p) or real == user:
            continue
        if any(real == s or real.startswith(s + os.sep) for s in skip):
            continue
        parts.append(p)
    inherited = os.environ.get("PYTHONPATH")
    if inherited:
        parts.extend(x for x in inherited.split(os.pathsep) if x)
    seen, out = set(), []
    for p in parts:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return os.pathsep.join(out)


def _worker_env(env: Optional[Mapping[str, Any]], start_timeout: Optional[float],
                network_interface: Optional[str], reset_limit: Optional[int]) -> Dict[str, str]:
    out = dict(os.environ)
    given = dict(env or {})
    pp = given.pop("PYTHONPATH", None)
    for k, v in given.items():
        if v is None:
            out.pop(str(k), None)
        else:
            out[str(k)] = str(v)
    out["PYTHONPATH"] = _python_path(None if pp is None else str(pp))
    # Output goes through pipes: without this, print()s would arrive in
    # blocks at exit instead of line by line.
    if "PYTHONUNBUFFERED" not in given:
        out.setdefault("PYTHONUNBUFFERED", "1")
    if start_timeout is not None and "KOLO_INIT_TIMEOUT_MS" not in given:
        out["KOLO_INIT_TIMEOUT_MS"] = str(int(start_timeout * 1000))
    if network_interface and "KOLO_IFACE" not in given:
        out["KOLO_IFACE"] = str(network_interface).split(",")[0]
    if reset_limit is not None and "KOLO_ELASTIC_RESET_LIMIT" not in given:
        out["KOLO_ELASTIC_RESET_LIMIT"] = str(reset_limit)
    return out


# ---- output ----------------------------------------------------------------


class _Output:
    """Echoes kolorun's stdout and stderr to this process's ``sys.stdout``
    and ``sys.stderr`` line by line (so that it shows in notebooks and
    under pytest's capture too), keeps the last lines for error messages,
    and, with ``output_filename``, also writes each rank's lines (without
    the ``[rank] `` prefix) to ``<dir>/rank.<rank>/stdout|stderr``."""

    def __init__(self, proc: subprocess.Popen, outdir: Optional[str], np: int):
        self.tail: collections.deque = collections.deque(maxlen=_TAIL_LINES)
        self.launcher: List[str] = []  # kolorun's own lines ("kolorun: rank 1 (pid ...")
        self.lock = threading.Lock()
        self.outdir = outdir
        self.width = len(str(max(np - 1, 0)))
        self.files: Dict[Tuple[str, str], Any] = {}
        self.threads = [threading.Thread(target=self._pump, args=(proc.stdout, "stdout"),
                                         daemon=True, name="kolo.run stdout"),
                        threading.Thread(target=self._pump, args=(proc.stderr, "stderr"),
                                         daemon=True, name="kolo.run stderr")]
        for t in self.threads:
            t.start()

    def _file(self, line: str, stream: str) -> Tuple[Optional[Any], str]:
        if not line.startswith("["):
            return None, line
        end = line.find("] ")
        tag = line[1:end] if end > 0 else ""
        if tag.isdigit():
            who = f"rank.{int(tag):0{self.width}d}"
        elif tag.startswith("w") and tag[1:].isdigit():
            who = f"slot.{tag[1:]}"  # printed before the worker had its rank
        else:
            return None, line
        key = (who, stream)
        f = self.files.get(key)
        if f is None:
            d = os.path.join(self.outdir, who)
            os.makedirs(d, exist_ok=True)
            f = self.files[key] = open(os.path.join(d, stream), "a", encoding="utf-8")
        return f, line[end + 2:]

    def _pump(self, src: Any, stream: str) -> None:
        for raw in iter(src.readline, b""):
            line = raw.decode("utf-8", "replace")
            with self.lock:
                self.tail.append(line)
                if line.startswith("kolorun: ") and len(self.launcher) < 1000:
                    self.launcher.append(line.rstrip("\n"))
                dst = getattr(sys, stream, None)
                try:
                    if dst is not None:
                        dst.write(line)
                        dst.flush()
                except (OSError, ValueError):
                    pass
                if self.outdir:
                    try:
                        f, text = self._file(line, stream)
                        if f is not None:
                            f.write(text)
                            f.flush()
                    except OSError:
                        pass
        src.close()

    def close(self) -> None:
        for t in self.threads:
            t.join(timeout=10)
        with self.lock:
            for f in self.files.values():
                f.close()
            self.files.clear()

    def exits(self) -> List[Tuple[str, int, str]]:
        """(who, pid, how) of every worker kolorun reported as failed, in
        its order: ("rank 0", 1234, "exited with status 7")."""
        out = []
        with self.lock:
            for line in self.launcher:
                m = _EXIT_LINE.match(line)
                if m:
                    out.append((m.group(1), int(m.group(2)), m.group(3)))
        return out

    def last_lines(self) -> str:
        with self.lock:
            return "".join(self.tail)


def _stop(proc: subprocess.Popen) -> None:
    """Ends the job: SIGINT to kolorun (it forwards it to every worker, whose
    Python raises KeyboardInterrupt), a second one after a grace period
    (kolorun then SIGKILLs them), then SIGKILL to kolorun itself (its
    workers die with it: PR_SET_PDEATHSIG)."""
    for sig, wait_s in ((signal.SIGINT, _STOP_GRACE_S), (signal.SIGINT, 2.0),
                        (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


# ---- records ---------------------------------------------------------------


def _read_records(d: str) -> List[dict]:
    out = []
    for name in sorted(os.listdir(d)):
        if not name.startswith(_RECORD):
            continue
        try:
            with open(os.path.join(d, name), "rb") as f:
                rec = pickle.load(f)
        except Exception:  # noqa: BLE001 - a torn record is reported as missing
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _who(rank: Optional[int], rec: Optional[dict] = None) -> str:
    if rank is not None:
        return f"rank {rank}"
    pid = rec.get("pid") if rec else None
    return f"a worker (pid {pid}) that had no rank yet" if pid else "a worker"


def _code_files(func: Any) -> Dict[str, set]:
    """{code name: source files} of ``func``, the functions nested in it and
    the functions and classes of its module: cloudpickle ships code by value
    with the file name ``<dynamic-code>``, which a traceback can be mapped
    back with."""
    names: Dict[str, set] = {}
    todo: list = []
    seen: set = set()

    def add_function(f: Any) -> None:
        f = getattr(f, "__func__", f)
        code = getattr(f, "__code__", None)
        if isinstance(code, types.CodeType):
            todo.append(code)

    add_function(func)
    mod = getattr(func, "__module__", None)
    for v in list(getattr(func, "__globals__", {}).values()):
        if getattr(v, "__module__", None) != mod:
            continue
        if isinstance(v, type):
            for m in vars(v).values():
                add_function(m)
        else:
            add_function(v)
    while todo:
        code = todo.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        if not code.co_filename.startswith("<"):
            names.setdefault(code.co_name, set()).add(code.co_filename)
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def _map_dynamic(tb: str, files: Dict[str, set]) -> str:
    """``File "<dynamic-code>", line N, in NAME`` -> the file that defines
    NAME (when only one does), with its source line."""
    import linecache

    def sub(m: "re.Match") -> str:
        where = files.get(m.group(3), set())
        if len(where) != 1:
            return m.group(0)
        path = next(iter(where))
        src = linecache.getline(path, int(m.group(2))).strip()
        line = f'{m.group(1)}File "{path}", line {m.group(2)}, in {m.group(3)}'
        return line + (f"\n{m.group(1)}  {src}" if src else "")

    return re.sub(r'^( *)File "<dynamic-code>", line (\d+), in (\S+)$', sub, tb,
                  flags=re.MULTILINE)


def _failure(records: List[dict], status: int, out: _Output, cmd_status: str,
             func: Any = None) -> RunError:
    errors = [r for r in records if r.get("kind") == "error"]
    # The root cause first: an exception of the function itself before the
    # failures it caused on the other ranks (MembershipError, ShutdownError).
    errors.sort(key=lambda r: (bool(r.get("consequence")), r.get("time", 0.0)))
    failures = [(r.get("rank"), r.get("type", "")) for r in errors]
    listed = [f"  {_who(r.get('rank'), r)}: {r.get('summary')}" for r in errors]
    if not errors or errors[0].get("consequence"):
        # No exception of the function: the cause is a worker that died
        # without a record (killed, crashed, os._exit), which kolorun saw.
        reported = {r.get("pid") for r in records}
        silent = [x for x in out.exits() if x[1] not in reported]
        tail = out.last_lines().rstrip()
        if silent:
            who, pid, how = silent[0]
            msg = (f"kolo.run: {who} (pid {pid}) {how} without reporting an exception "
                   f"(killed, crashed or os._exit?); {cmd_status}")
            if listed:
                msg += "\n\nThen failed:\n" + "\n".join(listed)
            elif tail:
                msg += f"\n\nThe last lines of output:\n{tail}"
            return RunError(msg, rank=int(who.split()[1]) if who.startswith("rank ") else None,
                            exit_status=status, failures=failures)
        if not errors:
            return RunError(
                f"kolo.run: the job failed ({cmd_status}) and no worker reported an exception "
                f"(a worker was killed, crashed or called os._exit?)"
                + (f"; the last lines of its output:\n{tail}" if tail else ""),
                exit_status=status)
    first = errors[0]
    rank = first.get("rank")
    tb = first.get("traceback") or ""
    if "<dynamic-code>" in tb and func is not None:
        try:
            tb = _map_dynamic(tb, _code_files(func))
        except Exception:  # noqa: BLE001 - the unmapped traceback is still right
            pass
    msg = (f"kolo.run: {_who(rank, first)} failed with {first.get('summary')} "
           f"({cmd_status})\n\nTraceback of {_who(rank, first)}:\n{tb.rstrip()}")
    if listed[1:]:
        msg += "\n\nAlso failed:\n" + "\n".join(listed[1:])
    return RunError(msg, rank=rank, remote_traceback=tb, exit_status=status,
                    failures=failures)


def _results(records: List[dict], np: int, elastic: bool) -> List[Any]:
    ok: Dict[int, dict] = {}
    for r in records:
        if r.get("kind") != "ok" or r.get("rank") is None:
            continue
        prev = ok.get(r["rank"])
        if prev is not None and not elastic:
            raise RunError(f"kolo.run: two workers reported rank {r['rank']}")
        if prev is None or r.get("time", 0.0) >= prev.get("time", 0.0):
            ok[r["rank"]] = r
    if elastic:
        if not ok:
            raise RunError("kolo.run: the elastic job ended without any worker returning from "
                           "the function")
        ranks = sorted(ok)
    else:
        missing = [i for i in range(np) if i not in ok]
        if missing:
            exits = {r.get("rank"): r.get("code") for r in records if r.get("kind") == "exit"}
            detail = ", ".join(
                f"rank {i}" + (f" (the function raised SystemExit({exits[i]!r}))"
                               if i in exits else "") for i in missing)
            raise RunError(f"kolo.run: every worker exited with status 0, but no return value "
                           f"came from {detail}")
        ranks = list(range(np))
    values = []
    for i in ranks:
        try:
            values.append(_loads(ok[i]["value"], f"the return value of rank {i}"))
        except Exception as e:  # noqa: BLE001
            raise RunError(f"kolo.run: the return value of rank {i} cannot be unpickled "
                           f"here: {type(e).__name__}: {e}", rank=i) from e
    return values


# ---- run -------------------------------------------------------------------


def run(func: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Optional[Mapping[str, Any]] = None,
        num_proc: Optional[int] = None,
        min_num_proc: Optional[int] = None,
        max_num_proc: Optional[int] = None,
        slots: Optional[int] = None,
        reset_limit: Optional[int] = None,
        cooldown_range: Any = None,
        hosts: Union[str, Sequence[str], None] = None,
        hostfile: Union[str, os.PathLike, None] = None,
        start_timeout: Optional[float] = None,
        ssh_port: Any = None,
        ssh_identity_file: Any = None,
        disable_cache: Any = None,
        output_filename: Union[str, os.PathLike, None] = None,
        verbose: Any = None,
        use_gloo: Optional[bool] = None,
        use_mpi: Optional[bool] = None,
        mpi_args: Any = None,
        network_interface: Optional[str] = None,
        executable: Union[str, os.PathLike, None] = None,
        np: Optional[int] = None,
        min_np: Optional[int] = None,
        max_np: Optional[int] = None,
        *,
        use_jsrun: Optional[bool] = None,
        env: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None) -> List[Any]:
    """Runs ``func(*args, **kwargs)`` in ``np`` local worker processes of
    one kolo job and returns the list of their return values, ordered by
    rank: Horovod's ``horovod.run`` (0.28), called by a training script's
    driver code (``import kolo as horovod; horovod.run(main, args=(args,),
    np=4)``) in place of ``horovodrun``.

    Each worker is ``executable`` (default ``sys.executable``) started by
    ``kolorun`` (:func:`find_kolorun`), with the caller's environment plus
    ``env`` and a ``PYTHONPATH`` holding the caller's ``sys.path``, so
    that ``func``'s module and its imports resolve; ``func`` calls
    ``hvd.init()`` (``kolo.init()``) as under ``horovodrun``, and its rank
    is kolo's. ``func``, ``args`` and ``kwargs`` are pickled with
    cloudpickle (functions of ``__main__``, lambdas and closures work);
    without cloudpickle only what plain pickle can import back travels, and
    anything else raises ImportError (``pip install cloudpickle``). Return
    values travel back the same way. The workers' output is written to this
    process's ``sys.stdout``/``sys.stderr`` as it comes, each line prefixed
    with its rank (``[1] ...``).

    Parameters, Horovod's names and meanings:

    - ``num_proc``/``np``: the number of workers (default 1, or the slots
      of ``hosts``). ``min_num_proc``/``min_np`` and ``max_num_proc``/
      ``max_np`` make the job elastic (kolorun ``--min-np``/``--max-np``;
      the function uses ``hvd.elastic.run``); the result then holds the
      values of the workers that returned, in their final ranks' order.
    - ``hosts`` (``"localhost:4"``) and ``hostfile`` (``host slots=N``
      lines) may name only this machine (``localhost``, a loopback address,
      its host name); ``np`` must fit in their slots. Other hosts are a
      ValueError: start ``kolorun --rendezvous URL`` on each host instead
      (docs/running.md).
    - ``start_timeout`` (seconds): how long ``hvd.init()`` waits for the job
      to form (``KOLO_INIT_TIMEOUT_MS``). ``network_interface``:
      ``KOLO_IFACE``. ``reset_limit``: ``KOLO_ELASTIC_RESET_LIMIT``. A
      variable set in ``env`` wins over these.
    - ``output_filename``: a directory; each rank's output is also written
      to ``<dir>/rank.<rank>/stdout`` and ``stderr`` (lines printed before
      a worker had its rank: ``slot.<n>/``).
    - ``verbose``: prints the kolorun command line to ``sys.stderr``.
    - ``use_gloo``, ``use_mpi``, ``use_jsrun``, ``mpi_args``, ``ssh_port``,
      ``ssh_identity_file``, ``disable_cache``, ``cooldown_range`` and
      ``slots`` (beyond the default slots of a host without ``:N``) are
      accepted and have no effect: kolo has its own transport and starts
      only local processes. As in Horovod, ``use_gloo`` and ``use_mpi``
      together, and ``hosts`` with ``hostfile``, are a ValueError.

    kolo's own keyword-only parameters: ``env``, a dict of variables for
    the workers on top of the caller's environment (a value of None removes
    the variable; its ``PYTHONPATH`` comes first in the workers'), and
    ``timeout``, seconds after which the job is stopped and TimeoutError
    raised (default: no limit).

    Returns the list of return values, index = rank. Raises
    :class:`RunError` (a RuntimeError) when a worker fails: the message
    names the rank whose function raised first and carries its traceback
    (the failures it caused on other ranks are listed after it); ValueError
    or TypeError for bad arguments, before anything is started. On
    KeyboardInterrupt (or the timeout) the workers are stopped (SIGINT,
    then SIGKILL) before it propagates; the temporary directory is always
    removed.
    """
    # Every check first: nothing is written or started for bad arguments.
    if not callable(func):
        raise TypeError(f"kolo.run: func must be callable, not {type(func).__name__}")
    if isinstance(args, (str, bytes)) or not isinstance(args, collections.abc.Iterable):
        raise TypeError(f"kolo.run: args must be a tuple or list of arguments, not "
                        f"{type(args).__name__}")
    args = tuple(args)
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"kolo.run: kwargs must be a dict, not {type(kwargs).__name__}")
    kwargs = dict(kwargs)
    if env is not None and not isinstance(env, Mapping):
        raise TypeError(f"kolo.run: env must be a dict, not {type(env).__name__}")
    if hosts is not None and hostfile is not None:
        raise ValueError("kolo.run: give hosts or hostfile, not both")
    if use_gloo and use_mpi:
        raise ValueError("kolo.run: use_gloo and use_mpi cannot both be set")
    n = _either(num_proc, np, "num_proc", "np")
    lo = _either(min_num_proc, min_np, "min_num_proc", "min_np")
    hi = _either(max_num_proc, max_np, "max_num_proc", "max_np")
    if slots is not None:
        slots = _count(slots, "slots")
    capacity = None
    if hosts is not None:
        capacity = _local_slots(_parse_hosts(hosts, slots), f"hosts={hosts!r}")
    elif hostfile is not None:
        capacity = _local_slots(_parse_hostfile(hostfile), f"hostfile {os.fspath(hostfile)!r}")
    n = _count(n, "np") if n is not None else (capacity or 1)
    if capacity is not None and n > capacity:
        raise ValueError(f"kolo.run: np={n} workers do not fit in the {capacity} slots of "
                         f"{'hosts' if hosts is not None else 'hostfile'}")
    lo = None if lo is None else _count(lo, "min_np")
    hi = None if hi is None else _count(hi, "max_np")
    if lo is not None and lo > n:
        raise ValueError(f"kolo.run: min_np={lo} exceeds np={n}: no round would form")
    if hi is not None and hi < n:
        raise ValueError(f"kolo.run: max_np={hi} is below np={n}")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"kolo.run: min_np={lo} exceeds max_np={hi}")
    for name, v in (("start_timeout", start_timeout), ("timeout", timeout)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or
                              not v > 0):
            raise ValueError(f"kolo.run: {name} must be a number of seconds > 0, not {v!r}")
    if reset_limit is not None:
        if isinstance(reset_limit, bool) or not isinstance(reset_limit, int) or reset_limit < 0:
            raise ValueError(f"kolo.run: reset_limit must be an integer >= 0, not "
                             f"{reset_limit!r}")
    python = os.fspath(executable) if executable is not None else sys.executable
    if not python:
        raise ValueError("kolo.run: sys.executable is empty; pass executable=")
    if os.sep in python:
        if not _executable(python):
            raise ValueError(f"kolo.run: executable {python!r} is not an executable file")
        python = os.path.abspath(python)
    elif not shutil.which(python):
        raise ValueError(f"kolo.run: executable {python!r} is not on PATH")
    kolorun = find_kolorun()
    elastic = (lo is not None and lo < n) or (hi is not None and hi > n)
    payload = _dumps((func, args, kwargs), f"{getattr(func, '__qualname__', func)!r}")
    wenv = _worker_env(env, start_timeout, network_interface, reset_limit)

    d = tempfile.mkdtemp(prefix="kolo-run-")
    proc = None
    out = None
    try:
        with open(os.path.join(d, _PAYLOAD), "wb") as f:
            f.write(payload)
        del payload
        cmd = [kolorun, "-np", str(n)]
        if lo is not None or hi is not None:
            cmd += ["--min-np", str(lo if lo is not None else n),
                    "--max-np", str(hi if hi is not None else max(n, lo or n))]
        cmd += ["--", python, "-m", "kolo._run_worker", d]
        if verbose:
            print(f"kolo.run: {' '.join(cmd)}", file=sys.stderr, flush=True)
        outdir = os.fspath(output_filename) if output_filename is not None else None
        if outdir:
            os.makedirs(outdir, exist_ok=True)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=wenv)
        out = _Output(proc, outdir, n)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    _stop(proc)
                    out.close()
                    tail = out.last_lines().rstrip()
                    raise TimeoutError(f"kolo.run: the job did not finish within {timeout} s "
                                       f"and was stopped" +
                                       (f"; the last lines of its output:\n{tail}" if tail
                                        else ""))
                try:
                    status = proc.wait(timeout=None if left is None else min(left, 1.0))
                    break
                except subprocess.TimeoutExpired:
                    continue
        except BaseException:
            _stop(proc)
            raise
        out.close()
        records = _read_records(d)
        if verbose:
            print(f"kolo.run: kolorun exited with status {status}; {len(records)} worker "
                  f"records", file=sys.stderr, flush=True)
        if status != 0:
            how = (f"kolorun exited with status {status}" if status > 0 else
                   f"kolorun was killed by signal {-status}")
            raise _failure(records, status, out, how, func)
        return _results(records, n, elastic)
    finally:
        if proc is not None and proc.poll() is None:
            _stop(proc)
        if out is not None:
            out.close()
        shutil.rmtree(d, ignore_errors=True)


# ---- the worker side -------------------------------------------------------


def _write_record(d: str, rec: dict) -> None:
    rec.setdefault("pid", os.getpid())
    rec.setdefault("time", time.time())
    name = f"{_RECORD}{os.getpid()}"
    tmp = os.path.join(d, "." + name + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(rec, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, os.path.join(d, name))


def _summary(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 300:
        first = first[:300] + "..."
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def worker_main(argv: Sequence[str]) -> int:
    """The body of ``python -m kolo._run_worker DIR``, run by every worker
    of :func:`run`: loads ``(func, args, kwargs)`` from DIR, calls the
    function and writes DIR/result.<pid>: ``{"kind": "ok", "rank", "value"}``
    (the pickled return value) or ``{"kind": "error", "rank", "type",
    "summary", "traceback", "consequence"}``. Exit status: 0 when the value
    was written; the exception propagates otherwise (status 1, after kolo's
    exception hook aborted the job so that the other ranks fail at once),
    and ``sys.exit(n)`` inside the function keeps its status."""
    if len(argv) != 1:
        print("usage: python -m kolo._run_worker DIR (started by kolo.run)", file=sys.stderr)
        return 2
    d = argv[0]
    import kolo

    seen: Dict[str, Optional[int]] = {"rank": None}

    def current_rank() -> Optional[int]:
        if kolo.is_initialized():
            try:
                return kolo.rank()
            except Exception:  # noqa: BLE001
                pass
        return seen["rank"]

    # The function may shut kolo down before it returns (hvd.shutdown()):
    # remember the rank it had then. kolo's atexit hook looks finalize up
    # when kolo is initialized, so it runs this one too.
    original = kolo.finalize

    def finalize() -> None:
        r = current_rank()
        if r is not None:
            seen["rank"] = r
        original()

    kolo.finalize = kolo.shutdown = finalize

    def error(e: BaseException, rank: Optional[int], what: str = "") -> None:
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        try:
            _write_record(d, {
                "kind": "error", "rank": rank, "type": type(e).__name__,
                "summary": what + _summary(e), "traceback": tb,
                "consequence": isinstance(e, (kolo.MembershipError, kolo.ShutdownError)),
            })
        except Exception as w:  # noqa: BLE001
            print(f"kolo.run worker: cannot write the error record: {w}", file=sys.stderr)

    try:
        with open(os.path.join(d, _PAYLOAD), "rb") as f:
            func, args, kwargs = _loads(f.read(), "the function")
    except BaseException as e:
        error(e, None, "loading the function: ")
        raise
    try:
        value = func(*args, **kwargs)
    except SystemExit as e:
        if e.code in (None, 0):
            _write_record(d, {"kind": "exit", "rank": current_rank(), "code": e.code})
        else:
            error(e, current_rank(), f"sys.exit({e.code!r}): ")
        raise
    except BaseException as e:
        error(e, current_rank())
        raise
    del func, args, kwargs
    rank = current_rank()
    if rank is None:
        # The function never joined the job: join now, only to learn the
        # rank that orders this worker's value (every worker does the same).
        kolo.init()
        rank = kolo.rank()
    try:
        blob = _dumps(value, f"the return value of rank {rank}")
    except BaseException as e:
        error(e, rank, "pickling the return value: ")
        raise
    _write_record(d, {"kind": "ok", "rank": rank, "value": blob})
    return 0
