"""The kolo module (the C API from Python) on 1, 2, 3 and 4 ranks, numpy only.

Every collective is checked against a float64 reference this file computes
from the inputs (tests/python/workers/core_data.py makes them from the
operation's name and the rank, so both sides can): allreduce of every
dtype x op, with and without prescale/postscale, in place and not; grouped
allreduce; allgather with counts differing by rank; broadcast from every
root; alltoall with and without splits; reducescatter; barrier; join. Also:
results bitwise identical on every rank; mismatches raise MismatchError on
every rank naming the ranks, and the job goes on; bad arguments raise
TypeError/ValueError without enqueuing anything (or using up a name); a
size-1 run without kolorun; an interpreter exiting with operations in flight
neither crashes nor hangs; an uncaught exception on one rank ends the job
within seconds; and the install step: the package with libkolo beside it.
"""

from __future__ import annotations

import base64
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import (LIBRARY, PYTHON, REPO, WORKERS, requires_torch, results, run_worker,
                      worker_env)

sys.path.insert(0, str(WORKERS))
import core_data as D  # noqa: E402

INTS = {"int8", "uint8", "int32", "int64"}
EPS = {"float16": 2.0 ** -10, "float32": 2.0 ** -23, "float64": 2.0 ** -52}

# ---- references ------------------------------------------------------------


def iscale(v: np.ndarray, f: float, dtype: str) -> np.ndarray:
    """kolo's integer scaling: multiply in float64, round half away from
    zero, saturate to the dtype's range."""
    x = np.asarray(v, np.float64) * f
    x = np.sign(x) * np.floor(np.abs(x) + 0.5)
    info = np.iinfo(dtype)
    return np.clip(x, info.min, info.max)


def reduce_ref(inputs: list, dtype: str, op: str, pre: float = 1.0,
               post: float = 1.0, size: int | None = None) -> tuple:
    """(reference in float64, error bound) of kolo's allreduce of
    ``inputs`` (one array per rank): op over ranks of prescale * x, times
    postscale (and 1/size for average). ``size`` is the job size (average
    divides by it even when some ranks contributed zeros after a join)."""
    size = len(inputs) if size is None else size
    if dtype == "bool":
        xs = np.array(inputs, bool)
        return (xs.all(0) if op == "min" else xs.any(0)).astype(np.float64), 0.0
    xs = np.array([np.asarray(x, np.float64) for x in inputs])
    if pre != 1.0:
        xs = iscale(xs, pre, dtype) if dtype in INTS else xs * pre
    if op in ("sum", "average"):
        r = xs.sum(0)
    elif op == "min":
        r = xs.min(0)
    elif op == "max":
        r = xs.max(0)
    else:
        r = xs.prod(0)
    f = post / size if op == "average" else post
    if dtype in INTS:
        # Sums and products stay in range by construction (no wrap-around).
        info = np.iinfo(dtype)
        assert (r >= info.min).all() and (r <= info.max).all()
        return (iscale(r, f, dtype) if f != 1.0 else r), 0.0
    # Floats: the ranks' partial results are rounded to the dtype on the way.
    bound = EPS[dtype] * (len(inputs) + 2) * (np.abs(xs).sum(0) * abs(f) + np.abs(r * f))
    return r * f, bound


def check_close(got: np.ndarray, ref: np.ndarray, bound, what: str) -> None:
    got = np.asarray(got, np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    bad = np.abs(got - ref) > bound
    assert not bad.any(), (f"{what}: {bad.sum()} of {got.size} elements differ, first at "
                           f"{np.argmax(bad)}: {got[bad][:4]} != {ref[bad][:4]}")


# ---- reading what the workers reported -------------------------------------


def arrays(res: dict) -> dict:
    """{rank: {(section, key): (array, extra fields)}} from report_array()."""
    out = {}
    for rank, objs in res.items():
        parts: dict = {}
        for o in objs:
            if "b64" in o:
                parts.setdefault((o["section"], o["key"]), []).append(o)
        mine = {}
        for k, ps in parts.items():
            ps.sort(key=lambda p: p["part"])
            assert [p["part"] for p in ps] == list(range(ps[0]["parts"])), k
            raw = b"".join(base64.b64decode(p["b64"]) for p in ps)
            extra = {n: v for n, v in ps[0].items()
                     if n not in ("section", "key", "dtype", "part", "parts", "b64")}
            mine[k] = (np.frombuffer(raw, ps[0]["dtype"]), extra)
        out[rank] = mine
    return out


def section(res: dict, rank: int, name: str) -> list:
    return [o for o in res[rank] if o.get("section") == name]


# ---- the checks of one ops run ---------------------------------------------


def check_ops_run(res: dict, size: int) -> None:
    """Everything core_ops.py reported, against this file's references."""
    assert sorted(res) == list(range(size)), f"ranks that reported: {sorted(res)}"
    for r in range(size):
        init = section(res, r, "init")[0]
        assert (init["rank"], init["size"], init["round"]) == (r, size, 1)
        assert section(res, r, "done"), f"rank {r} did not finish"
        assert not section(res, r, "stalled"), (
            f"rank {r}: the unnamed allreduce after the bad calls stalled: a bad call used "
            f"up a name or enqueued something")
    arr = arrays(res)
    # Every result is bitwise identical on every rank (where all ranks have it).
    keys = set(arr[0])
    for r in range(size):
        for k, (a, _) in arr[r].items():
            if k in keys and k[0] not in ("alltoall", "reducescatter", "join"):
                assert a.tobytes() == arr[0][k][0].tobytes(), f"{k}: rank {r} != rank 0"

    def got(section_: str, key: str, rank: int = 0):
        assert (section_, key) in arr[rank], f"rank {rank} did not report {section_} {key}"
        return arr[rank][(section_, key)]

    checked = 0
    for c in D.allreduce_cases(size):
        ins = [D.values(c["name"], r, c["dtype"], c["count"], c["op"]) for r in range(size)]
        ref, bound = reduce_ref(ins, c["dtype"], c["op"], c["pre"], c["post"])
        a, _ = got("allreduce", c["name"])
        check_close(a, ref, bound, c["name"])
        checked += 1
    assert checked == len(D.DTYPES) * len(D.OPS) * len(D.SCALES) + 4

    for k in range(3):
        ins = [D.values(f"noname.{k}", r, "float64", 5) for r in range(size)]
        check_close(got("noname", f"noname.{k}")[0], *reduce_ref(ins, "float64", "sum"),
                    f"noname.{k}")

    for gname, dt, op, pre, post in (("grp.f32", "float32", "average", 1.0, 1.0),
                                     ("grp.i32", "int32", "sum", 0.5, 3.0)):
        for i, n in enumerate((5, 17, 1)):
            ins = [D.values(f"{gname}.{i}", r, dt, n) for r in range(size)]
            check_close(got("grouped", f"{gname}.{i}")[0],
                        *reduce_ref(ins, dt, op, pre, post), f"{gname}.{i}")

    for kind in ("float64", "int8"):
        ins = [D.values(f"ag.{kind}", r, kind, D.allgather_count(r, kind)) for r in range(size)]
        a, extra = got("allgather", f"ag.{kind}")
        assert extra["counts"] == [len(x) for x in ins]
        assert a.tobytes() == np.concatenate(ins).astype(kind).tobytes(), f"allgather {kind}"

    for root in range(size):
        for dt in ("int64", "bool"):
            name = f"bc.{dt}.{root}"
            for r in range(size):
                assert got("broadcast", name, r)[0].tobytes() == \
                    D.values(name, root, dt, 9).tobytes(), f"{name} on rank {r}"

    for me in range(size):
        a, extra = got("alltoall", "a2a.equal", me)
        want = np.concatenate([D.values("a2a.equal", i, "float32", 3 * size)[3 * me:3 * me + 3]
                               for i in range(size)])
        assert extra["counts"] == [3] * size and a.tobytes() == want.tobytes(), f"a2a {me}"
        blocks, counts = [], []
        for i in range(size):
            sp = D.alltoall_splits(i, size)
            send = D.values("a2a.splits", i, "int32", sum(sp))
            start = sum(sp[:me])
            blocks.append(send[start:start + sp[me]])
            counts.append(sp[me])
        a, extra = got("alltoall", "a2a.splits", me)
        assert extra["counts"] == counts, f"a2a splits counts on {me}"
        assert a.tobytes() == np.concatenate(blocks).tobytes(), f"a2a splits on {me}"

    for name, dt, op, pre, post in (("rs.f64.sum", "float64", "sum", 1.0, 1.0),
                                    ("rs.i32.avg", "int32", "average", 1.0, 1.0),
                                    ("rs.f32.scaled", "float32", "sum", 0.5, 3.0)):
        ins = [D.values(name, r, dt, 10) for r in range(size)]
        ref, bound = reduce_ref(ins, dt, op, pre, post)
        bound = np.broadcast_to(bound, ref.shape)
        sizes = [10 // size + (r < 10 % size) for r in range(size)]
        for r in range(size):
            lo = sum(sizes[:r])
            check_close(got("reducescatter", name, r)[0], ref[lo:lo + sizes[r]],
                        bound[lo:lo + sizes[r]], f"{name} on rank {r}")

    arrived = max(section(res, r, "barrier")[0]["arrived"] for r in range(size))
    left = min(section(res, r, "barrier")[0]["left"] for r in range(size))
    assert left >= arrived, "a rank left the barrier before the last one arrived"

    for k in range(size):
        for op in ("sum", "average"):
            # Ranks k..size-1 submitted join.k; the others had joined (zeros).
            ins = [D.values(f"join.{k}.{op}", r, "int32", 5) if r >= k else np.zeros(5, "int32")
                   for r in range(size)]
            ref, _ = reduce_ref(ins, "int32", op)
            for r in range(k, size):
                assert got("join", f"join.{k}.{op}", r)[0].tolist() == ref.tolist(), \
                    f"join.{k}.{op} on rank {r}"
    for r in range(size):
        assert section(res, r, "joined")[0]["last"] == size - 1

    errors = {r: {o["label"]: o for o in section(res, r, "error")} for r in range(size)}
    if size > 1:
        others = ",".join(map(str, range(1, size)))
        others = f"rank {others}" if size == 2 else f"ranks {others}"
        for r in range(size):
            for label, name, what in (("mismatch.count", "mm.count", "count"),
                                      ("mismatch.dtype", "mm.dtype", "dtype"),
                                      ("mismatch.root", "mm.root", "root")):
                e = errors[r][label]
                assert (e["type"], e["name"], e["status"]) == ("MismatchError",
                                                               "KOLO_EMISMATCH", 12), e
                assert f"mismatched {what} for '{name}'" in e["message"], e["message"]
                assert "rank 0:" in e["message"] and f"{others}:" in e["message"], e["message"]
        ins = [D.values("after.mismatch", r, "float64", 3) for r in range(size)]
        check_close(got("after", "after.mismatch")[0], *reduce_ref(ins, "float64", "sum"),
                    "after the mismatches")

    type_errors = {"int16", "big-endian", "list", "bool-sum", "grouped-dtypes"}
    bad = errors[0]
    expected = {"non-contiguous", "non-contiguous-2d", "int16", "big-endian", "list",
                "read-only", "bool-sum", "unknown-op", "recv-size", "recv-dtype",
                "nan-prescale", "inf-postscale", "grouped-nan", "grouped-dtypes",
                "grouped-empty", "root-too-big", "root-negative", "root-float",
                "splits-length", "splits-negative", "splits-sum", "rs-recv-count", "rs-nan",
                "empty-name"} | ({"alltoall-indivisible"} if size > 1 else set())
    assert expected <= set(bad), f"bad-argument cases not reported: {expected - set(bad)}"
    for label in expected:
        want = "TypeError" if label in type_errors else "ValueError"
        assert bad[label]["type"] == want and not bad[label]["kolo"], (label, bad[label])
        assert bad[label]["message"].startswith("kolo: "), (label, bad[label]["message"])
    ins = [D.values("after.bad", r, "float64", 4) for r in range(size)]
    check_close(got("after", "after.bad")[0], *reduce_ref(ins, "float64", "sum"),
                "after the bad calls")


# ---- the tests -------------------------------------------------------------


def test_references_are_not_trivial():
    """The reference itself: scaling rounds half away from zero and
    saturates, average divides by the job size, floats carry a bound."""
    assert iscale(np.array([2.5, -2.5, 1.4, 300.0]), 1.0, "int8").tolist() == \
        [3.0, -3.0, 1.0, 127.0]
    ref, _ = reduce_ref([np.array([3], "int32"), np.array([0], "int32")], "int32", "average",
                        size=2)
    assert ref.tolist() == [2.0]
    ref, bound = reduce_ref([np.array([1.0], "float32")] * 3, "float32", "sum")
    assert ref.tolist() == [3.0] and 0 < bound[0] < 1e-5


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_ops_on_ranks(np_):
    proc = run_worker(np_, "core_ops.py", timeout=240)
    check_ops_run(results(proc), np_)


def _size1_env() -> dict:
    env = worker_env()
    for k in list(env):
        if k.startswith("KOLO_") and k not in ("KOLO_LIBRARY", "KOLO_LOG_LEVEL"):
            del env[k]
    return env


def test_ops_size1_without_kolorun():
    """Not started by kolorun (no KOLO_RENDEZVOUS): a job of one worker, and
    every operation still works (the reductions are the identity, scaled)."""
    p = subprocess.run([PYTHON, str(WORKERS / "core_ops.py")], capture_output=True, text=True,
                       timeout=120, env=_size1_env(), cwd=str(REPO))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    check_ops_run(results(p), 1)


def _assert_clean_exit(p, what):
    text = p.stdout + p.stderr
    for bad in ("Fatal Python error", "Segmentation fault", "Traceback", "signal"):
        assert bad not in text, f"{what}: {bad!r} in the output:\n{text[-4000:]}"


@pytest.mark.parametrize("mode", ["return", "sys.exit"])
def test_exit_with_operations_in_flight(mode):
    """Handles dropped or held, operations running or never matched: the
    interpreter exits with status 0, without a crash, within seconds."""
    t0 = time.monotonic()
    p = run_worker(2, "core_exit.py", mode, timeout=60, check=False)
    took = time.monotonic() - t0
    _assert_clean_exit(p, f"exit ({mode})")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = results(p)
    assert sorted(res) == [0, 1]
    for r in (0, 1):
        ex = section(res, r, "exiting")[0]
        assert ex["pending"] >= 1, ex  # an operation really was in flight
    assert took < 30, f"exiting took {took:.1f} s"


def test_uncaught_exception_ends_the_job_fast():
    """Rank 1 raises while ranks 0 and 2 wait in an allreduce it never
    joins: kolo's excepthook aborts its comm, the others' allreduce fails
    with MembershipError at once, and kolorun exits non-zero within seconds
    (not after a collective timeout)."""
    p = run_worker(3, "core_raise.py", timeout=90, check=False)
    end = time.time()
    assert p.returncode != 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = results(p)
    raised = section(res, 1, "raising")[0]["t"]
    assert "RuntimeError: core_raise: rank 1 fails on purpose" in p.stdout + p.stderr
    for r in (0, 2):
        assert not section(res, r, "survived"), f"rank {r} completed an allreduce without rank 1"
        failed = section(res, r, "failed")
        # The survivor saw the failure itself (it was not just killed by kolorun).
        assert failed and failed[0]["type"] == "MembershipError", (r, failed, p.stdout[-2000:])
        assert failed[0]["t"] - raised < 5, f"rank {r} noticed after {failed[0]['t'] - raised} s"
    assert end - raised < 10, f"kolorun exited {end - raised:.1f} s after the exception"


# ---- install -----------------------------------------------------------------


def _build_dir() -> pathlib.Path | None:
    """The build tree this test runs against (the one holding LIBRARY)."""
    for d in pathlib.Path(LIBRARY).resolve().parents:
        if (d / "CMakeCache.txt").exists():
            return d
    return None


def _site(prefix: pathlib.Path) -> pathlib.Path:
    """Where the interpreter's layout puts packages under a prefix, as
    python/CMakeLists.txt asks it: site-packages, or Debian's dist-packages."""
    code = ("import sys, sysconfig; print('%d.%d' % sys.version_info[:2]); "
            "print(sysconfig.get_path('purelib').rsplit('/', 1)[-1])")
    v, site = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True,
                             timeout=60).stdout.split()
    return prefix / "lib" / f"python{v}" / ("dist-packages" if site == "dist-packages"
                                            else "site-packages")


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KOLO_") and k not in ("PYTHONPATH",)}
    env.update(extra)
    return env


PROBE = ("import kolo, numpy; kolo.init(); a = numpy.arange(4.0); "
         "kolo.allreduce_async(a, op='sum', postscale=2).wait(); "
         "print(kolo.library_path()); print(kolo.__file__); print(a.tolist())")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> pathlib.Path:
    """`cmake --install <build> --prefix P` into a temporary P; returns P."""
    if shutil.which("cmake") is None:
        pytest.skip("no cmake")
    build = _build_dir()
    if build is None:
        pytest.skip(f"no CMake build tree above {LIBRARY}")
    prefix = tmp_path_factory.mktemp("install") / "prefix"
    p = subprocess.run(["cmake", "--install", str(build), "--prefix", str(prefix)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return prefix


def test_install_places_package_and_library(installed, tmp_path):
    """`cmake --install <build> --prefix P` puts the package into
    P/lib/python3.X/site-packages/kolo with libkolo in kolo/lib/, and
    the interpreter imports it from there (any cwd, no KOLO_LIBRARY)."""
    site = _site(installed)
    pkg = site / "kolo"
    lib = pkg / "lib" / "libkolo.so"
    assert (pkg / "__init__.py").exists() and (pkg / "_lib.py").exists() and lib.exists()
    assert (pkg / "torch" / "__init__.py").exists() and (installed / "bin" / "kolorun").exists()
    assert not list(pkg.rglob("__pycache__")), "byte code was installed"
    p = subprocess.run([PYTHON, "-c", PROBE], capture_output=True, text=True, timeout=60,
                       cwd=str(tmp_path), env=_clean_env(PYTHONPATH=str(site)))
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0] == str(lib), f"loaded {lines[0]}, not the installed {lib}"
    assert lines[1] == str(pkg / "__init__.py")
    assert lines[2] == "[0.0, 2.0, 4.0, 6.0]"


@requires_torch
def test_installed_kolo_torch_imports(installed, tmp_path):
    """The installed kolo.torch, with the installed library, as a job of one."""
    site = _site(installed)
    probe = ("import kolo, kolo.torch as hvd, torch; hvd.init(); "
             "t = hvd.allreduce(torch.ones(3), name='x'); "
             "print(kolo.library_path()); print(hvd.__file__); print(hvd.size(), t.tolist())")
    p = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=120,
                       cwd=str(tmp_path), env=_clean_env(PYTHONPATH=str(site)))
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0] == str(site / "kolo" / "lib" / "libkolo.so")
    assert lines[1] == str(site / "kolo" / "torch" / "__init__.py")
    assert lines[2] == "1 [1.0, 1.0, 1.0]"


@pytest.mark.skipif(not (REPO / "build" / "lib" / "libkolo.so").exists(),
                    reason="no build/ in the source tree")
def test_source_tree_finds_build_library(tmp_path):
    """Without installing: PYTHONPATH=<repo>/python finds <repo>/build/lib."""
    p = subprocess.run([PYTHON, "-c", PROBE], capture_output=True, text=True, timeout=60,
                       cwd=str(tmp_path), env=_clean_env(PYTHONPATH=str(REPO / "python")))
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.splitlines()[0] == str(REPO / "build" / "lib" / "libkolo.so")


def test_missing_library_is_a_clear_import_error(tmp_path):
    """A package copied without its library and no build tree beside it:
    ImportError naming what was tried (not a crash or a ctypes OSError)."""
    pkg = tmp_path / "site" / "kolo"
    shutil.copytree(REPO / "python" / "kolo", pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "lib"))
    p = subprocess.run([PYTHON, "-c", "import kolo; kolo.init()"], capture_output=True,
                       text=True, timeout=60, cwd=str(tmp_path),
                       env=_clean_env(PYTHONPATH=str(tmp_path / "site"),
                                      KOLO_LIBRARY=str(tmp_path / "nowhere.so"),
                                      LD_LIBRARY_PATH=""))
    if p.returncode == 0:
        pytest.skip("a libkolo is installed system-wide (found by the loader)")
    assert "ImportError: kolo: cannot load libkolo.so" in p.stderr, p.stderr[-2000:]
    assert "nowhere.so (absent)" in p.stderr
