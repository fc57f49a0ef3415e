"""Shared helpers of the Python tests: start ranks under kolorun with a
timeout and read what each rank reported.

A worker reports with ``report(obj)`` (tests/python/workers/_common.py),
which prints one ``KOLO-RESULT <json>`` line; kolorun prefixes each line
with ``[rank]``; :func:`results` maps every rank to the list of objects it
reported, so that tests compare them with references they compute
themselves."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
WORKERS = HERE / "workers"
PYTHON = os.environ.get("KOLO_PYTHON", sys.executable)
KOLORUN = os.environ.get("KOLO_KOLORUN", str(REPO / "build" / "bin" / "kolorun"))
LIBRARY = os.environ.get("KOLO_LIBRARY", str(REPO / "build" / "lib" / "libkolo.so"))

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

requires_torch = pytest.mark.skipif(not HAVE_TORCH, reason=f"{sys.executable} has no torch "
                                    "(scripts/setup.sh makes .venv with torch)")


def worker_env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python"), str(WORKERS)] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["KOLO_LIBRARY"] = LIBRARY
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    env.setdefault("KOLO_LOG_LEVEL", "warn")
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def kolorun(np, argv, timeout=180, env=None, launcher_args=(), check=True):
    """Runs ``kolorun -np N [launcher_args] -- argv``; returns the completed
    process (stdout and stderr as text). Fails the test on a timeout, and on
    a non-zero exit when check is set."""
    cmd = [KOLORUN, "-np", str(np), *map(str, launcher_args), "--", *map(str, argv)]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout, env=worker_env(env), cwd=str(REPO))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after {timeout} s: {' '.join(cmd)}\nstdout:\n{e.stdout}\n"
                    f"stderr:\n{e.stderr}")
    if check and p.returncode != 0:
        pytest.fail(f"exit {p.returncode}: {' '.join(cmd)}\nstdout:\n{p.stdout[-6000:]}\n"
                    f"stderr:\n{p.stderr[-6000:]}")
    return p


def run_worker(np, script, *args, **kw):
    """Runs tests/python/workers/<script> on np ranks under KOLO_PYTHON."""
    return kolorun(np, [PYTHON, str(WORKERS / script), *args], **kw)


_RESULT = re.compile(r"^(?:\[(\d+)\] )?KOLO-RESULT (.*)$")


def results(proc):
    """{rank: [reported objects]} from a kolorun run's stdout."""
    out = {}
    for line in proc.stdout.splitlines():
        m = _RESULT.match(line)
        if m:
            rank = int(m.group(1)) if m.group(1) is not None else 0
            out.setdefault(rank, []).append(json.loads(m.group(2)))
    return out


def check_cases(proc, np_, minimum):
    """For workers that run named cases (workers/_common.Cases): every rank
    reported the same cases, at least ``minimum``, all passed, ending with a
    count. Returns (case names, results)."""
    res = results(proc)
    assert sorted(res) == list(range(np_)), f"ranks that reported: {sorted(res)}"
    names = None
    for rank, items in sorted(res.items()):
        cases = [x for x in items if "case" in x]
        summary = [x for x in items if "cases" in x]
        assert summary and summary[-1]["cases"] == len(cases), \
            f"rank {rank}: the worker did not finish ({len(cases)} cases reported)"
        failed = [f"{c['case']}: {c['detail']}" for c in cases if not c["ok"]]
        assert not failed, f"rank {rank} of {np_}: {len(failed)} failed:\n" + "\n".join(failed)
        got = [c["case"] for c in cases]
        assert len(got) >= minimum
        if names is None:
            names = got
        assert got == names, f"rank {rank} ran other cases than rank 0"
    return names, res
