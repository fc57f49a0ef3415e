"""Horovod's own PyTorch examples on kolo with only their import changed
(tests/horovod/run_examples.py), and the pieces of that runner that need no
Horovod checkout: the import change and the local data.

The examples run only where a Horovod checkout is given (KOLO_HOROVOD_SRC: a
worktree, a bare git dir or a copy of its examples/; nothing of Horovod is in
this repository) and an interpreter with torch and torchvision
(KOLO_HOROVOD_PYTHON, default this one); otherwise they are skipped with the
reason. See docs/horovod-migration.md."""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
import pathlib

import pytest

HERE = pathlib.Path(__file__).resolve().parent
RUNNER = HERE.parent / "horovod" / "run_examples.py"
MAKE_DATA = HERE.parent / "horovod" / "make_data.py"


def _load_runner():
    spec = importlib.util.spec_from_file_location("run_examples", RUNNER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


runner = _load_runner()


# ---- the import change -------------------------------------------------------

EXAMPLE = """import argparse
import horovod.torch as hvd  # the API
import horovod
import torch

hvd.init()
horovod.run(main, np=2)
"""


def test_change_imports_is_exactly_the_import_lines():
    new, diff, pairs = runner.change_imports(EXAMPLE, "ex.py")
    assert pairs == [("import horovod.torch as hvd  # the API",
                      "import kolo.torch as hvd  # the API"),
                     ("import horovod", "import kolo as horovod")]
    old_lines, new_lines = EXAMPLE.splitlines(), new.splitlines()
    assert len(old_lines) == len(new_lines)
    changed = [i for i, (a, b) in enumerate(zip(old_lines, new_lines)) if a != b]
    assert changed == [1, 2], diff
    assert "horovod.run(main, np=2)" in new  # calls through the alias are untouched


@pytest.mark.parametrize("line", ["from horovod.torch import allreduce",
                                  "import horovod.torch.elastic as he",
                                  "from horovod import run"])
def test_change_imports_refuses_what_one_line_cannot_cover(line):
    with pytest.raises(runner.ExampleError, match="still imports horovod"):
        runner.change_imports(EXAMPLE + line + "\n", "ex.py")


def test_change_imports_covers_mxnet():
    new, _, pairs = runner.change_imports("import mxnet as mx\nimport horovod.mxnet as hvd\n",
                                          "mx.py")
    assert pairs == [("import horovod.mxnet as hvd", "import kolo.mxnet as hvd")]
    assert new == "import mxnet as mx\nimport kolo.mxnet as hvd\n"


def test_change_imports_needs_the_torch_import():
    with pytest.raises(runner.ExampleError, match="no line 'import horovod.torch as hvd'"):
        runner.change_imports("import torch\n", "ex.py")


# ---- the local data -----------------------------------------------------------

def _idx(path: pathlib.Path) -> tuple:
    data = path.read_bytes()
    magic, n = struct.unpack(">II", data[:8])
    dims = [n] + [struct.unpack(">I", data[8 + 4 * i:12 + 4 * i])[0]
                  for i in range((magic & 0xFF) - 1)]
    return magic, dims, data[4 + 4 * len(dims):]


def test_make_data_mnist_is_torchvision_raw_idx(tmp_path):
    p = subprocess.run([sys.executable, str(MAKE_DATA), "mnist", "--root", str(tmp_path),
                        "--train", "200", "--test", "50"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    raw = tmp_path / "MNIST" / "raw"
    for split, n in (("train", 200), ("t10k", 50)):
        magic, dims, body = _idx(raw / f"{split}-images-idx3-ubyte")
        assert magic == 0x803 and dims == [n, 28, 28] and len(body) == n * 28 * 28
        magic, dims, labels = _idx(raw / f"{split}-labels-idx1-ubyte")
        assert magic == 0x801 and dims == [n] and len(labels) == n
        assert set(labels) == set(range(10)), f"{split}: classes {sorted(set(labels))}"
        # Drawn digits, not blank images: most pixels dark, some bright.
        assert 0.02 < sum(b > 128 for b in body) / len(body) < 0.5


# ---- the examples -----------------------------------------------------------------

SRC = os.environ.get("KOLO_HOROVOD_SRC")
PYTHON = os.environ.get("KOLO_HOROVOD_PYTHON", sys.executable)


def _has_torchvision() -> bool:
    p = subprocess.run([PYTHON, "-c", "import torch, torchvision"], capture_output=True,
                       timeout=300)
    return p.returncode == 0


needs_horovod = pytest.mark.skipif(
    not SRC, reason="KOLO_HOROVOD_SRC (a Horovod checkout, for its examples) is not set")


@needs_horovod
@pytest.mark.parametrize("name", [e.name for e in runner.EXAMPLES if e.default])
def test_horovod_example(name, tmp_path):
    if not _has_torchvision():
        pytest.skip(f"{PYTHON} cannot import torch and torchvision (KOLO_HOROVOD_PYTHON)")
    cmd = [sys.executable, str(RUNNER), "--horovod-src", SRC, "--python", PYTHON,
           "--only", name, "--work-dir", str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    assert f"SUMMARY {name}: PASS" in out, out[-6000:]
