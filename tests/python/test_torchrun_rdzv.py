"""torchrun --rdzv-backend=kolo: torch's dynamic rendezvous with its state in
kolo-rendezvous (kolo/torch/distributed/_torchrun.py).

The store is checked operation by operation against torch's own HashStore
(the same calls, the same answers). The elastic test runs three torchrun
agents (--nnodes=2:3 --nproc-per-node=2, DDP on kolo or on gloo) on three
hosts: network-namespace hosts on a bridge (tests/netns/kolo-netns.sh) with
kolo-rendezvous on the bridge where the test runs as root, else sessions of
this machine;
once every rank of the 6-rank round has finished step HOLD, a host is lost
(its agent and workers SIGKILLed). With kolo the two other agents re-rendezvous and train to the end
from the checkpoint, and the final parameters equal single-process training
on the concatenated batches of the ranks of each phase. The same run with
--rdzv-backend=c10d, killing the node whose agent hosts c10d's store (the
first agent started), loses the job: the surviving agents exit with an
error."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import PYTHON, REPO, WORKERS, requires_torch, worker_env

pytestmark = requires_torch
RENDEZVOUS = os.path.join(os.environ.get("KOLO_BIN_DIR", str(REPO / "build" / "bin")),
                          "kolo-rendezvous")
ENV = {"GLOO_SOCKET_IFNAME": "lo", "KOLO_LOG_LEVEL": "warn"}
STEPS, HOLD = 16, 5
RDZV_CONF = "last_call_timeout=3,join_timeout=150,keep_alive_interval=1,keep_alive_max_attempt=3"


@pytest.fixture
def server(tmp_path):
    token = tmp_path / "token"
    token.write_text("t0k3n-" + os.urandom(8).hex() + "\n")
    os.chmod(token, 0o600)
    p = subprocess.Popen([RENDEZVOUS, "--listen", "127.0.0.1:0", "--token-file", str(token)],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("listening on "), line
        yield f"http://{line.split()[-1]}", token
    finally:
        p.kill()
        p.wait(10)


@pytest.fixture
def entry_point(tmp_path):
    """A dist-info that declares kolo's torchrun.handlers entry point, as the
    wheel does, so torchrun finds the backend by itself."""
    d = tmp_path / "ep" / "kolo-0.0.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: kolo\nVersion: 0.0.0\n")
    (d / "entry_points.txt").write_text(
        "[torchrun.handlers]\nkolo = kolo.torch.distributed._torchrun:entry_point\n")
    return d.parent


def _store(url, token, timeout_s=5.0):
    sys.path.insert(0, str(REPO / "python"))
    from kolo.torch.distributed._kv import RendezvousKV
    from kolo.torch.distributed._torchrun import RendezvousKVStore
    return RendezvousKVStore(RendezvousKV(url, "store-test", token.read_text().strip()),
                             timeout_s)


def _ops(store):
    """The same operations on any c10d store; returns what each answered."""
    import datetime
    import torch.distributed as dist
    out = []
    rec = out.append
    store.set("a", b"1")
    rec(store.get("a"))
    rec(store.add("n", 5))
    rec(store.add("n", -2))
    rec(store.get("n"))
    rec(store.compare_set("c", "", "x"))        # absent, expected empty: set
    rec(store.compare_set("c", "x", "y"))       # matches: set
    rec(store.compare_set("c", "nope", "z"))    # does not match: unchanged
    rec(store.compare_set("absent", "e", "z"))  # absent, expected given: nothing set
    rec(store.check(["a", "c"]))
    rec(store.check(["a", "absent"]))
    rec(store.delete_key("a"))
    rec(store.delete_key("a"))
    rec(store.check(["a"]))
    store.multi_set(["m1", "m2"], [b"v1", b"v2"])
    rec(store.multi_get(["m1", "m2"]))
    store.set("weird key/with spaces//", b"w")
    rec(store.get("weird key/with spaces//"))
    rec(store.num_keys())
    t0 = time.monotonic()
    try:
        store.wait(["never"], datetime.timedelta(seconds=1))
        rec("no timeout")
    except Exception:  # noqa: BLE001 - both stores raise, with their own types
        rec(("timed out", time.monotonic() - t0 < 5))
    p = dist.PrefixStore("pre", store)
    p.set("k", b"pv")
    rec(p.get("k"))
    rec(p.add("cnt", 3))
    return out


def test_store_answers_as_torchs_hash_store(server):
    import torch.distributed as dist
    url, token = server
    ours = _ops(_store(url, token))
    ref = _ops(dist.HashStore())
    assert ours == ref


def test_the_store_refuses_a_wrong_token(server):
    url, _token = server
    sys.path.insert(0, str(REPO / "python"))
    from kolo.torch.distributed._kv import RendezvousKV
    from kolo.torch.distributed._torchrun import RendezvousKVStore
    s = RendezvousKVStore(RendezvousKV(url, "store-test", "wrong"), 2.0)
    with pytest.raises(RuntimeError, match="401"):
        s.set("k", b"v")


# ---- torchrun through a node's SIGKILL ----------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(host, port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


class LocalHosts:
    """Hosts that are sessions of this machine: a host's loss is the SIGKILL of
    its agent and of the workers it started (torch starts them in sessions of
    their own)."""

    env = {"GLOO_SOCKET_IFNAME": "lo"}

    def __init__(self, server=None):
        self.server = server
        self.procs = []

    def addr(self, i):
        return "127.0.0.1"

    def c10d_endpoint(self):
        return f"127.0.0.1:{_free_port()}"

    def start(self, i, cmd, env):
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, start_new_session=True)
        self.procs.append(p)
        return p

    def kill(self, i, held):
        agent = self.procs[i].pid
        for pid in [agent] + [p["pid"] for p in held if p["agent"] == agent]:
            os.kill(pid, signal.SIGKILL)

    def host_of(self, report):
        return next(i for i, p in enumerate(self.procs) if p.pid == report["agent"])

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


NETNS = REPO / "tests" / "netns" / "kolo-netns.sh"


class NetnsHosts(LocalHosts):
    """Network-namespace hosts h0..h2 (tests/netns/kolo-netns.sh) on a bridge,
    kolo-rendezvous on the bridge's address; a host's loss is the SIGKILL of
    every process in its namespace."""

    env = {"GLOO_SOCKET_IFNAME": "eth0"}

    def __init__(self, token):
        super().__init__()
        self.prefix = f"ktr{os.getpid() % 100000}"
        up = subprocess.run([str(NETNS), "--prefix", self.prefix, "up", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if up.returncode != 0:
            pytest.skip(f"no network-namespace hosts here: {up.stdout.strip()[-300:]}")
        self.rdzv = subprocess.Popen(
            [str(NETNS), "--prefix", self.prefix, "exec", "br", RENDEZVOUS, "--listen",
             "10.77.0.254:0", "--token-file", str(token)], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        line = self.rdzv.stdout.readline()
        assert line.startswith("listening on "), line
        self.server = (f"http://{line.split()[-1]}", token)

    def addr(self, i):
        return f"10.77.0.{i + 1}"

    def c10d_endpoint(self):
        return f"{self.addr(0)}:29400"

    def start(self, i, cmd, env):
        return super().start(i, [str(NETNS), "--prefix", self.prefix, "exec", str(i), *cmd],
                             env)

    def kill(self, i, held):
        pids = subprocess.run(["ip", "netns", "pids", f"{self.prefix}-h{i}"],
                              stdout=subprocess.PIPE, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def host_of(self, report):
        return int(report["host"][1:])

    def close(self):
        super().close()
        self.rdzv.kill()
        self.rdzv.wait(10)
        subprocess.run([str(NETNS), "--prefix", self.prefix, "down"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def _agent_cmd(i, hosts, rdzv, endpoint, backend, out, conf):
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nnodes=2:3", "--nproc-per-node=2",
           f"--rdzv-backend={rdzv}", f"--rdzv-endpoint={endpoint}", "--rdzv-id=job1",
           f"--rdzv-conf={conf}", "--max-restarts=3", "--monitor-interval=0.5",
           f"--local-addr={hosts.addr(i)}",
           str(WORKERS / "torchrun_elastic.py"), "--backend", backend, "--steps", STEPS,
           "--out", str(out), "--hold-at", HOLD, "--hold-world", 6]
    return [str(c) for c in cmd]


def _progress(out):
    lines = []
    for f in out.glob("progress-*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass  # a line being written
    return lines


def _wait_for(pred, limit_s, what, agents):
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        if all(a.poll() is not None for a in agents):
            break
        time.sleep(0.1)
    logs = "\n".join((a.stdout.read() if a.poll() is not None else "(running)")[-3000:]
                     for a in agents)
    pytest.fail(f"{what} did not happen within {limit_s} s\n{logs}")


def _held(out):
    held = [p for p in _progress(out) if p["step"] == HOLD and p["world"] == 6]
    return held if len(held) == 6 else None


def _run(hosts, rdzv, backend, tmp_path, entry=None):
    """Three agents; once the 6-rank round holds, the loss of one host (kolo:
    the host of node 0; c10d: host 0, whose agent holds c10d's store). Returns
    (out dir, the survivors' exit codes, their logs, kill time, kill wall time)."""
    out = tmp_path / f"{rdzv}-{backend}"
    out.mkdir()
    if rdzv == "kolo":
        endpoint, token = hosts.server
        conf = f"{RDZV_CONF},token_file={token}"
    else:
        endpoint, conf = hosts.c10d_endpoint(), RDZV_CONF
    env = worker_env({**ENV, **hosts.env})
    if entry is not None:
        env["PYTHONPATH"] = f"{entry}{os.pathsep}{env['PYTHONPATH']}"
    confs = [conf] * 3
    if rdzv == "c10d" and isinstance(hosts, NetnsHosts):
        # torch guesses who hosts the store from the host name, which the namespace hosts
        # cannot resolve: say it
        confs = [f"{conf},is_host={int(i == 0)}" for i in range(3)]
    agents = [hosts.start(0, _agent_cmd(0, hosts, rdzv, endpoint, backend, out, confs[0]), env)]
    if rdzv == "c10d" and type(hosts) is LocalHosts:
        host, port = endpoint.split(":")  # every local agent could host it: let host 0 bind
        _wait_for(lambda: _port_open(host, int(port)), 60, "the c10d store", agents)
    agents += [hosts.start(i, _agent_cmd(i, hosts, rdzv, endpoint, backend, out, confs[i]), env)
               for i in (1, 2)]
    held = _wait_for(lambda: _held(out), 240, "a 6-rank round reaching the hold", agents)
    victim = 0 if rdzv == "c10d" else hosts.host_of(next(p for p in held if p["node"] == 0))
    assert len([p for p in held if hosts.host_of(p) == victim]) == 2, held
    hosts.kill(victim, held)
    killed_at, killed_wall = time.monotonic(), time.time()
    (out / "release").write_text("go")
    survivors = [a for i, a in enumerate(agents) if i != victim]
    codes = []
    for a in survivors:
        try:
            codes.append(a.wait(max(1.0, 240 - (time.monotonic() - killed_at))))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for a in survivors:
        if a.poll() is None:  # its log, for the failure message
            os.killpg(a.pid, signal.SIGKILL)
            a.wait(10)
    logs = [a.stdout.read() for a in survivors]
    for i, log in enumerate(logs):  # kept beside the run, for a failure's reader
        (out / f"survivor-{i}.log").write_text(log)
    return out, codes, logs, killed_at, killed_wall


@pytest.fixture
def hosts(request, tmp_path):
    """Network-namespace hosts where this runs as root (the realistic case),
    else sessions of this machine (KOLO_TORCHRUN_HOSTS=local|netns forces one)."""
    kind = os.environ.get("KOLO_TORCHRUN_HOSTS") or ("netns" if os.geteuid() == 0 else "local")
    if kind == "local":
        h = LocalHosts(request.getfixturevalue("server"))
    else:
        if os.geteuid() != 0:
            pytest.skip("network-namespace hosts need root")
        token = tmp_path / "netns-token"
        token.write_text("t0k3n-" + os.urandom(8).hex() + "\n")
        os.chmod(token, 0o600)
        h = NetnsHosts(token)
    try:
        yield h
    finally:
        h.close()


def _reference():
    """Single-process training on the ranks' concatenated batches: 6 ranks
    up to HOLD, 4 after it (the checkpoint of step HOLD is where they resume)."""
    import torch
    if str(WORKERS) not in sys.path:
        sys.path.insert(0, str(WORKERS))
    import torchrun_elastic as W
    m = W.model()
    opt = torch.optim.SGD(m.parameters(), lr=W.LR)
    for step in range(STEPS):
        world = 6 if step < HOLD else 4
        xs, ys = zip(*[W.batch(step, r) for r in range(world)])
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return torch.cat([q.detach().reshape(-1) for q in m.parameters()]).tolist()


@pytest.mark.parametrize("backend", ["kolo", "gloo"])
def test_kolo_rendezvous_survives_the_loss_of_node_0(hosts, entry_point, tmp_path, backend):
    out, codes, logs, _, killed_wall = _run(hosts, "kolo", backend, tmp_path, entry_point)
    assert codes == [0, 0], "\n".join(logs)[-6000:]
    done = json.loads((out / "done.json").read_text())
    assert done["world"] == 4 and done["same_on_every_rank"]
    after = [p for p in _progress(out) if p["world"] == 4]
    assert after and min(p["step"] for p in after) == HOLD + 1
    assert max(p["step"] for p in after) == STEPS
    assert {p["node"] for p in after} == {0, 1}
    assert done["params"] == pytest.approx(_reference(), abs=1e-5)
    print(f"{type(hosts).__name__}: kolo rendezvous, DDP on {backend}: training again on 4 "
          f"ranks {min(p['t'] for p in after) - killed_wall:.1f} s after the SIGKILL")


def test_c10d_rendezvous_loses_the_job_with_node_0(hosts, tmp_path):
    out, codes, logs, killed_at, _ = _run(hosts, "c10d", "gloo", tmp_path)
    assert not (out / "done.json").exists()
    assert all(c != 0 for c in codes), codes
    why = sorted({line.strip() for log in logs for line in log.splitlines()
                  if "Error" in line and ("rendezvous" in line.lower() or "store" in line.lower())})
    print(f"{type(hosts).__name__}: c10d: survivors ended with {codes} "
          f"{time.monotonic() - killed_at:.1f} s after the SIGKILL: "
          f"{why[-1][:300] if why else '(no message)'}")
