"""examples/torch/train_digits.py, the PyTorch main job, as the README runs it.

On 4 ranks under kolorun (the README's command: no PYTHONPATH, the example
finds the source tree's kolo itself), on the digits data when Debian's
python3-sklearn ships it and on the synthetic fallback; as a single process
without kolorun; and a negative control (--no-broadcast: the replicas start
apart and must be reported as different). The test does not take the
program's word for it: each rank prints the sha256 of its parameters, which
the test compares itself, and the model rank 0 saves is evaluated here on
the test split.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess

import pytest

from conftest import KOLORUN, LIBRARY, PYTHON, REPO, requires_torch

EXAMPLE = REPO / "examples" / "torch" / "train_digits.py"
TIMEOUT = 600  # for hangs only; a run takes 10-40 s on a loaded 2-core machine


def example_env() -> dict:
    """The README's environment: nothing set but the library of this build."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KOLO_") and k != "PYTHONPATH"}
    env.update(KOLO_LIBRARY=LIBRARY, OMP_NUM_THREADS="1", KOLO_LOG_LEVEL="warn",
               PYTHONDONTWRITEBYTECODE="1")
    return env


def run(np_: int | None, *args: str) -> subprocess.CompletedProcess:
    cmd = [PYTHON, str(EXAMPLE), *args]
    if np_ is not None:
        cmd = [KOLORUN, "-np", str(np_), "--", *cmd]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT,
                              env=example_env(), cwd=str(REPO))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after {TIMEOUT} s: {cmd}\n{e.stdout}\n{e.stderr}")


def load_example():
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def final_accuracy(out: str) -> float:
    accs = re.findall(r"epoch +\d+/\d+ .*test acc ([0-9.]+)", out)
    assert accs, out[-3000:]
    return float(accs[-1])


def rank_hashes(out: str) -> dict:
    return {int(r): h for r, h in
            re.findall(r"train_digits: rank (\d+): parameters sha256 ([0-9a-f]{16})", out)}


def evaluate(saved, data: str) -> tuple:
    """Test accuracy of the saved model on the example's fixed test split,
    computed here, in one batch."""
    import torch

    ex = load_example()
    _, test, _ = ex.dataset(data)
    model = ex.MLP()
    model.load_state_dict(torch.load(saved))
    model.eval()
    x, y = test.tensors
    with torch.no_grad():
        return (model(x).argmax(1) == y).double().mean().item(), len(y)


def check_run(p, size: int, data: str, saved) -> float:
    out = p.stdout
    assert p.returncode == 0, out[-4000:] + p.stderr[-4000:]
    want = "UCI digits" if data == "digits" else "synthetic data"
    assert want in out, out[:2000]
    acc = final_accuracy(out)
    assert acc >= 0.9 and f"reached test accuracy {acc:.4f} >= target 0.90" in out
    if size > 1:
        assert f"parameters bitwise identical on all {size} ranks" in out
        hashes = rank_hashes(out)
        assert sorted(hashes) == list(range(size)), out[-3000:]
        assert len(set(hashes.values())) == 1, f"ranks report different parameters: {hashes}"
    mine, n = evaluate(saved, data)
    # The program evaluates in shards; the same model evaluated here at once
    # may differ by a sample whose two best logits are within round-off.
    assert abs(mine - acc) <= 1.5 / n, f"program says {acc}, evaluated here: {mine}"
    return acc


def digits_present() -> bool:
    return load_example().DIGITS.exists()


@requires_torch
def test_four_ranks_as_in_the_readme(tmp_path):
    """The README's first command: the default data (digits when present)."""
    saved = tmp_path / "model.pt"
    p = run(4, "--save", str(saved))
    check_run(p, 4, "digits" if digits_present() else "synthetic", saved)


@requires_torch
def test_four_ranks_synthetic(tmp_path):
    """The fallback data reaches the same target (CI without sklearn runs
    only this path: the README's command then uses it)."""
    if not digits_present():
        pytest.skip("the digits file is absent: test_four_ranks_as_in_the_readme used the "
                    "synthetic data already")
    saved = tmp_path / "model.pt"
    check_run(run(4, "--data", "synthetic", "--save", str(saved)), 4, "synthetic", saved)


@requires_torch
def test_single_process_without_kolorun(tmp_path):
    saved = tmp_path / "model.pt"
    p = run(None, "--data", "synthetic", "--save", str(saved))
    check_run(p, 1, "synthetic", saved)
    assert "1 rank;" in p.stdout and "one rank: nothing to compare" in p.stdout


@requires_torch
def test_without_broadcast_the_replicas_differ():
    """Negative control: ranks that skip the initial broadcast start from
    different weights and stay apart; the final check must say so (exit 2)."""
    p = run(2, "--no-broadcast", "--epochs", "2", "--target", "0")
    assert p.returncode == 2, p.stdout[-3000:] + p.stderr[-3000:]
    assert "REPLICAS DIFFER: ranks [1]" in p.stdout
    hashes = rank_hashes(p.stdout)
    assert sorted(hashes) == [0, 1] and hashes[0] != hashes[1], hashes


def test_usage_error_exits_64():
    p = subprocess.run([PYTHON, str(EXAMPLE), "--epochs", "0"], capture_output=True, text=True,
                       timeout=120, env=example_env(), cwd=str(REPO))
    if "No module named 'torch'" in p.stderr:
        pytest.skip("no torch")
    assert p.returncode == 64, p.stderr[-2000:]
