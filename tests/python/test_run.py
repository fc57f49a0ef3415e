"""kolo.run, Horovod's horovod.run: a function run in N workers under
kolorun, its return values back in rank order.

Checked: the values come back ordered by rank and equal to references this
file computes (an allreduce inside the function against a float64 numpy
sum); a closure and a lambda defined in a test travel by cloudpickle; the
plain-pickle fallback ships importable functions and refuses the others
with an ImportError naming cloudpickle; kwargs, env and local hosts reach
the workers; an exception on rank 1 makes run() raise promptly with rank
1's traceback in the message; a worker that dies without a word, and the
timeout, end the call too; bad arguments raise ValueError before anything
is started; the temporary directory is always removed. Every job runs
under run()'s own timeout.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import kolo
from kolo import runner
from conftest import LIBRARY, REPO, requires_torch

try:
    import cloudpickle  # noqa: F401

    HAVE_CLOUDPICKLE = True
except ImportError:
    HAVE_CLOUDPICKLE = False

requires_cloudpickle = pytest.mark.skipif(not HAVE_CLOUDPICKLE, reason=f"{sys.executable} has "
                                          "no cloudpickle (pip install cloudpickle)")

JOB_TIMEOUT = 120  # seconds, for every job a test starts


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    """The build under test, for the workers too (run() passes the
    environment on), and the temporary directories run() makes."""
    monkeypatch.setenv("KOLO_LIBRARY", LIBRARY)
    monkeypatch.setenv("KOLO_LOG_LEVEL", os.environ.get("KOLO_LOG_LEVEL", "warn"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    made = []
    real = tempfile.mkdtemp

    def mkdtemp(*a, **kw):
        d = real(*a, **kw)
        made.append(d)
        return d

    monkeypatch.setattr(runner.tempfile, "mkdtemp", mkdtemp)
    yield made
    for d in made:
        assert not os.path.exists(d), f"run() left its temporary directory {d}"


def _forbid_start(monkeypatch):
    """Makes starting a process or writing the payload fail the test."""
    def refuse(*a, **kw):
        raise AssertionError(f"run() started something for bad arguments: {a}")

    monkeypatch.setattr(runner.subprocess, "Popen", refuse)
    monkeypatch.setattr(runner.tempfile, "mkdtemp", refuse)


# ---- functions the workers import (plain pickle can ship these) ------------


def rank_data(rank: int, n: int = 1000) -> np.ndarray:
    return np.random.default_rng(1234 + rank).standard_normal(n).astype(np.float32)


def torch_allreduce(n: int, scale: float = 1.0) -> dict:
    import torch

    import kolo.torch as hvd

    hvd.init()
    t = torch.from_numpy(rank_data(hvd.rank(), n)) * scale
    total = hvd.allreduce(t, op=hvd.Sum, name="run.sum")
    return {"rank": hvd.rank(), "size": hvd.size(), "sum": total.numpy()}


def numpy_allreduce(n: int) -> tuple:
    kolo.init()
    print(f"rank {kolo.rank()} of {kolo.size()}", flush=True)
    x = rank_data(kolo.rank(), n).astype(np.float64)
    kolo.allreduce_async(x, name="run.np").wait()
    return kolo.rank(), x


def with_kwargs(a, b=0, *, c=None, var="KOLO_RUN_TEST_VAR") -> tuple:
    # Never joins the job itself: run() then joins after it, for the rank.
    print(f"hello from with_kwargs {a}", flush=True)
    return a, b, c, os.environ.get(var), os.environ.get("KOLO_RUN_TEST_GONE")


def _explode() -> None:
    raise ValueError("boom on rank 1")


def fail_on_rank1() -> None:
    kolo.init()
    if kolo.rank() == 1:
        time.sleep(0.2)
        _explode()
    # The others wait in an allreduce rank 1 never joins: its exception
    # must end them at once (kolo.abort through the exception hook).
    kolo.allreduce_async(np.ones(4, np.float32), name="run.never").wait()


def vanish_on_rank0() -> None:
    kolo.init()
    if kolo.rank() == 0:
        os._exit(7)
    kolo.allreduce_async(np.ones(4, np.float32), name="run.never").wait()


def sleep_long() -> None:
    time.sleep(300)


# ---- tests -----------------------------------------------------------------


@requires_torch
def test_results_in_rank_order_allreduce():
    n, np_ = 1000, 3
    t0 = time.monotonic()
    res = kolo.run(torch_allreduce, args=(n,), kwargs={"scale": 0.5}, np=np_,
                   timeout=JOB_TIMEOUT)
    assert isinstance(res, list) and len(res) == np_
    ref = sum(rank_data(r, n).astype(np.float64) * 0.5 for r in range(np_))
    bound = 2.0 ** -23 * (np_ + 2) * sum(np.abs(rank_data(r, n).astype(np.float64)) * 0.5
                                         for r in range(np_))
    for i, r in enumerate(res):
        assert r["rank"] == i and r["size"] == np_
        assert r["sum"].dtype == np.float32 and r["sum"].shape == (n,)
        assert np.all(np.abs(r["sum"].astype(np.float64) - ref) <= bound)
        assert np.array_equal(r["sum"], res[0]["sum"])  # bitwise identical on every rank
    assert time.monotonic() - t0 < JOB_TIMEOUT


def test_plain_pickle_ships_importable_functions(tmp_path, monkeypatch):
    """Without cloudpickle, a function of an importable module still
    travels (numpy only: no torch needed)."""
    monkeypatch.setattr(runner, "_cloudpickle", lambda: None)
    n = 64
    res = kolo.run(numpy_allreduce, (n,), np=2, output_filename=tmp_path, timeout=JOB_TIMEOUT)
    for r in range(2):
        assert (tmp_path / f"rank.{r}" / "stdout").read_text() == f"rank {r} of 2\n"
    ref = rank_data(0, n).astype(np.float64) + rank_data(1, n).astype(np.float64)
    assert [r for r, _ in res] == [0, 1]
    for _, x in res:
        assert np.allclose(x, ref, rtol=0, atol=1e-12)


def test_plain_pickle_refuses_closures(monkeypatch):
    monkeypatch.setattr(runner, "_cloudpickle", lambda: None)
    _forbid_start(monkeypatch)
    k = 3
    with pytest.raises(ImportError, match="pip install cloudpickle"):
        kolo.run(lambda: k, np=2)

    def local():
        return k

    with pytest.raises(ImportError, match="pip install cloudpickle"):
        kolo.run(local, np=2)


@requires_cloudpickle
def test_closure_and_lambda_by_cloudpickle():
    offset = 100
    square = lambda v: v * v  # noqa: E731 - a lambda on purpose

    def job(extra, *, fn):
        import kolo.torch as hvd

        hvd.init()
        r, s = hvd.rank(), hvd.size()
        x = np.full(8, float(r + 1))
        kolo.allreduce_async(x, name="run.closure").wait()
        hvd.shutdown()  # the rank is still known after a shutdown
        return fn(r) + offset + extra, s, float(x[0])

    res = kolo.run(job, args=(1,), kwargs={"fn": square}, np=3, timeout=JOB_TIMEOUT)
    assert res == [(r * r + offset + 1, 3, 6.0) for r in range(3)]


def test_kwargs_env_and_local_hosts(tmp_path, monkeypatch):
    monkeypatch.setenv("KOLO_RUN_TEST_GONE", "set in the caller")
    hosts = f"{socket.gethostname()}:1,localhost:1"
    out = tmp_path / "out"
    res = kolo.run(with_kwargs, args=("a",), kwargs={"b": 2, "c": [3]}, np=2, hosts=hosts,
                   use_gloo=True, use_mpi=False, use_jsrun=False, start_timeout=60,
                   env={"KOLO_RUN_TEST_VAR": 42, "KOLO_RUN_TEST_GONE": None},
                   output_filename=str(out), timeout=JOB_TIMEOUT)
    assert res == [("a", 2, [3], "42", None)] * 2
    # Printed before the worker had its rank: under slot.<n>/ (output_filename).
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("stdout"))
    assert written == ["slot.0/stdout", "slot.1/stdout"], written
    for p in out.rglob("stdout"):
        assert p.read_text() == "hello from with_kwargs a\n"
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# this machine\nlocalhost slots=2\n")
    res = kolo.run(with_kwargs, (1,), {"var": "PATH"}, hostfile=str(hostfile),
                   timeout=JOB_TIMEOUT)
    assert res == [(1, 0, None, os.environ["PATH"], "set in the caller")] * 2


def test_exception_on_rank1_raises_with_its_traceback():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        kolo.run(fail_on_rank1, np=3, timeout=JOB_TIMEOUT)
    took = time.monotonic() - t0
    e = info.value
    msg = str(e)
    assert isinstance(e, runner.RunError)
    assert e.rank == 1, msg
    assert "rank 1 failed with ValueError: boom on rank 1" in msg
    assert "Traceback (most recent call last)" in msg and "_explode" in msg
    assert "ValueError: boom on rank 1" in e.remote_traceback
    assert e.exit_status != 0
    # Prompt: the others fail at once (kolo.abort), not after KOLO_TIMEOUT_MS.
    assert took < 60, f"run() took {took:.1f} s to report the failure"


def test_worker_vanishing_raises():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        kolo.run(vanish_on_rank0, np=2, timeout=JOB_TIMEOUT)
    msg = str(info.value)
    # Rank 1's MembershipError comes after rank 0's exit, and is no cause.
    assert "rank 0 (pid" in msg and "exited with status 7 without reporting" in msg, msg
    assert info.value.rank == 0 and info.value.exit_status in (1, 7)
    assert time.monotonic() - t0 < 60


def test_timeout_stops_the_job():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 3 s"):
        kolo.run(sleep_long, np=2, timeout=3)
    assert time.monotonic() - t0 < 30


def test_bad_arguments_start_nothing(tmp_path, monkeypatch):
    _forbid_start(monkeypatch)
    t0 = time.monotonic()
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="np must be an integer >= 1"):
            kolo.run(with_kwargs, (1,), np=bad)
    with pytest.raises(ValueError, match="num_proc"):
        kolo.run(with_kwargs, (1,), num_proc=2, np=3)
    with pytest.raises(ValueError) as info:
        kolo.run(with_kwargs, (1,), np=2, hosts="localhost:1,gpu-node-7.example.com:4")
    assert "gpu-node-7.example.com" in str(info.value) and "kolorun" in str(info.value)
    assert "docs/running.md" in str(info.value)
    remote = tmp_path / "hostfile"
    remote.write_text("localhost slots=2\n10.11.12.13 slots=2\n")
    with pytest.raises(ValueError, match="10.11.12.13"):
        kolo.run(with_kwargs, (1,), np=2, hostfile=str(remote))
    with pytest.raises(ValueError, match="do not fit"):
        kolo.run(with_kwargs, (1,), np=3, hosts="localhost:2")
    with pytest.raises(ValueError, match="not both"):
        kolo.run(with_kwargs, (1,), np=2, hosts="localhost:2", hostfile=str(remote))
    with pytest.raises(ValueError, match="use_gloo and use_mpi"):
        kolo.run(with_kwargs, (1,), np=2, use_gloo=True, use_mpi=True)
    with pytest.raises(ValueError, match="min_np=3 exceeds np=2"):
        kolo.run(with_kwargs, (1,), np=2, min_np=3)
    with pytest.raises(ValueError, match="max_np=1 is below np=2"):
        kolo.run(with_kwargs, (1,), np=2, max_np=1)
    with pytest.raises(ValueError, match="timeout"):
        kolo.run(with_kwargs, (1,), np=2, timeout=0)
    with pytest.raises(ValueError, match="executable"):
        kolo.run(with_kwargs, (1,), np=2, executable=str(tmp_path / "no-such-python"))
    with pytest.raises(TypeError, match="callable"):
        kolo.run(42, np=2)
    with pytest.raises(TypeError, match="args"):
        kolo.run(with_kwargs, "abc", np=2)
    assert time.monotonic() - t0 < 30


def test_dynamic_code_mapped_to_its_file():
    """cloudpickle names shipped code "<dynamic-code>"; the message names
    the caller's file and line again."""
    def inner_fn():
        raise KeyError("x")  # the line the traceback must show

    line = inner_fn.__code__.co_firstlineno + 1
    tb = ("Traceback (most recent call last):\n"
          f'  File "<dynamic-code>", line {line}, in inner_fn\n'
          '  File "<dynamic-code>", line 3, in nowhere_defined\n'
          "KeyError: 'x'\n")
    out = runner._map_dynamic(tb, runner._code_files(inner_fn))
    assert f'  File "{__file__}", line {line}, in inner_fn\n' in out
    assert "    raise KeyError(\"x\")  # the line the traceback must show\n" in out
    assert '  File "<dynamic-code>", line 3, in nowhere_defined' in out


def test_worker_module_usage():
    p = subprocess.run([sys.executable, "-m", "kolo._run_worker"], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ), cwd=str(REPO))
    assert p.returncode == 2 and "started by kolo.run" in p.stderr
