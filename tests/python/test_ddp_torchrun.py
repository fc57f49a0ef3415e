"""kolo.torch.distributed under torchrun: init_process_group("kolo") with
env://, kolo's data plane bootstrapped through torch's own TCPStore.

torchrun runs on 127.0.0.1 only (--rdzv_backend c10d, a free port). Debian's
torch 1.13 under Python 3.11 cannot parse torchrun's default --redirects 0 /
--tee 0 (Std.from_str iterates an IntFlag, which skips the 0 member since
3.11), so the tests pass --redirects 2 --tee 2: stderr goes to a log folder
and is echoed, stdout is untouched.

Checked: every collective against numpy and gloo (test_ddp.check_collectives),
DDP against gloo and single-process training (test_ddp.check_ddp), torch
2.x's cases of test_ddp_torch2 (point-to-point on the bootstrapped comm's p2p
endpoints, functional collectives, FSDP2, ZeRO) against gloo, the
bootstrapped comm finalized by destroy_process_group and bootstrapped again;
and, with a plain env:// launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
set by the test), a rank SIGKILLed mid-step: every survivor's step raises
kolo's error quickly and the survivors exit (kolo.abort() before finalize,
no barrier that would wait for the dead rank)."""

import json
import socket
import subprocess
import time

import pytest

import test_ddp as T
import test_ddp_torch2 as T2
from conftest import PYTHON, WORKERS, requires_torch, worker_env

pytestmark = requires_torch
ENV = {"GLOO_SOCKET_IFNAME": "lo", "KOLO_LOG_LEVEL": "warn"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def by_rank(stdout):
    """{rank: [reports]} from lines without a launcher prefix (each report
    carries its rank; the per-step parameter lines come from rank 0)."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("KOLO-RESULT "):
            o = json.loads(line.split(" ", 1)[1])
            out.setdefault(o.get("rank", 0), []).append(o)
    return out


def torchrun(nproc, script, *args, tmp_path, timeout=240):
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}",
           "--max_restarts", "0", "--redirects", "2", "--tee", "2",
           "--log_dir", str(tmp_path / "torchrun"), str(WORKERS / script), *map(str, args)]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout, env=worker_env(ENV))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after {timeout} s: {' '.join(cmd)}\n{str(e.stdout)[-3000:]}\n"
                    f"{str(e.stderr)[-3000:]}")
    if p.returncode != 0:
        pytest.fail(f"exit {p.returncode}: {' '.join(cmd)}\nstdout:\n{p.stdout[-4000:]}\n"
                    f"stderr:\n{p.stderr[-6000:]}")
    return p


def test_torchrun_collectives_match_numpy_and_gloo(tmp_path):
    p = torchrun(2, "ddp_collectives.py", "--launcher", "env", tmp_path=tmp_path)
    T.check_collectives(by_rank(p.stdout), 2)


def test_torchrun_ddp_matches_gloo_and_single_process(tmp_path):
    steps = 6
    p = torchrun(2, "ddp_train.py", "--launcher", "env", "--steps", steps, tmp_path=tmp_path)
    T.check_ddp(by_rank(p.stdout), 2, steps)


def test_torchrun_torch2_cases_match_gloo(tmp_path):
    p = torchrun(2, "ddp_torch2.py", "--launcher=env", tmp_path=tmp_path)
    out = {}
    for rank, items in by_rank(p.stdout).items():
        for item in items:
            out.setdefault((item["case"], item.get("backend")), {})[rank] = item
    run = (2, out)
    T2.test_point_to_point_matches_gloo_and_the_values_sent(run)
    T2.test_functional_collectives_match_gloo_and_float64(run)
    for kind in ("fsdp2", "zero"):
        T2.test_training_matches_gloo_and_single_process(run, kind)


def spawn_env(size, script, args, tmp_path, timeout=120):
    """Starts size processes with env:// variables (127.0.0.1, a free port)
    and waits for all of them; returns ([return codes], [outputs], {rank:
    time it exited}). Kills what is left after the timeout."""
    port = free_port()
    procs, logs = [], []
    for r in range(size):
        env = worker_env({**ENV, "RANK": r, "LOCAL_RANK": r, "WORLD_SIZE": size,
                          "LOCAL_WORLD_SIZE": size, "MASTER_ADDR": "127.0.0.1",
                          "MASTER_PORT": port})
        out = open(tmp_path / f"rank{r}.out", "w+")
        logs.append(out)
        procs.append(subprocess.Popen([PYTHON, str(WORKERS / script), *map(str, args)],
                                      stdout=out, stderr=subprocess.STDOUT, env=env, text=True))
    ended = {}
    deadline = time.monotonic() + timeout
    try:
        while len(ended) < size and time.monotonic() < deadline:
            for r, p in enumerate(procs):
                if r not in ended and p.poll() is not None:
                    ended[r] = time.time()
            time.sleep(0.02)  # polls the processes' exit; measures, does not synchronise
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = []
    for f in logs:
        f.seek(0)
        text.append(f.read())
        f.close()
    assert len(ended) == size, "a process did not exit:\n" + "\n".join(t[-2000:] for t in text)
    return [p.returncode for p in procs], text, ended


def test_env_destroy_finalizes_then_bootstraps_again(tmp_path):
    rcs, text, _ = spawn_env(2, "ddp_train.py", ["--launcher", "env", "--steps", 2, "--reinit",
                                                  "--reinit-port", free_port()], tmp_path)
    assert rcs == [0, 0], "\n".join(t[-3000:] for t in text)
    again = [o for t in text for o in by_rank(t).get(0, []) + by_rank(t).get(1, [])
             if "reinit" in o]
    assert sorted(o["rank"] for o in again) == [0, 1]
    assert all(o["reinit"] == 3.0 and o["size"] == 2 for o in again)


@pytest.mark.parametrize("model", ["ddp", "fsdp2", "allreduce", "recv"])
def test_env_rank_killed_mid_step(tmp_path, model):
    size, victim, timeout = 3, 1, 10.0
    rcs, text, ended = spawn_env(size, "ddp_kill.py", ["--launcher", "env", "--victim", victim,
                                                       "--kill-at", 3, "--timeout", timeout,
                                                       "--model", model],
                                 tmp_path)
    assert rcs[victim] == -9
    reports = {r: [json.loads(ln.split(" ", 1)[1]) for ln in t.splitlines()
                   if ln.startswith("KOLO-RESULT ")] for r, t in enumerate(text)}
    killed_at = [o for o in reports[victim] if "killed_at" in o][0]["killed_at"]
    for r in range(size):
        if r == victim:
            continue
        assert rcs[r] == 1, text[r][-3000:]  # the uncaught exception
        raised = [o for o in reports[r] if "raised_at" in o]
        assert len(raised) == 1, text[r][-3000:]
        assert "MembershipError" in raised[0]["error"] or "KOLO_EPEER" in raised[0]["error"]
        assert raised[0]["raised_at"] - killed_at < 2.0
        exit_s = ended[r] - killed_at
        print(f"rank {r}: raised {1000 * (raised[0]['raised_at'] - killed_at):.0f} ms and "
              f"exited {exit_s:.2f} s after the SIGKILL")
        assert exit_s < timeout
