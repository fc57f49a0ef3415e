"""torchrun's rendezvous, --rdzv-backend=kolo against c10d: the time from the
moment every agent has been started to the moment every worker has
initialised its process group.

    python bench/torch/torchrun_rdzv_bench.py --agents 32 [--rounds 3]
    python bench/torch/torchrun_rdzv_bench.py --netns --agents 3   # root: namespace hosts

N agents (``--nnodes=N --nproc-per-node=1``, so N workers) run
``torchrun_rdzv_worker.py``, which initialises a gloo process group from
torchrun's environment, passes a barrier and writes the wall time. Each round
starts kolo-rendezvous and the N agents of kolo, then the N agents of c10d
(agent 0 hosts c10d's store: ``is_host=1``), all agents of a run started at
once. Both include what torchrun does either way: the agents' and the workers'
Python start-up and torch imports, which on a small machine dominate.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("KOLO_BIN_DIR", os.path.join(REPO, "build", "bin"))
NETNS = os.path.join(REPO, "tests", "netns", "kolo-netns.sh")
CONF = "join_timeout=300,last_call_timeout=1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def entry_point(tmp):
    """A dist-info declaring kolo's torchrun.handlers entry point, as the wheel does."""
    d = os.path.join(tmp, "ep", "kolo-0.0.0.dist-info")
    os.makedirs(d)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: kolo\nVersion: 0.0.0\n")
    with open(os.path.join(d, "entry_points.txt"), "w") as f:
        f.write("[torchrun.handlers]\nkolo = kolo.torch.distributed._torchrun:entry_point\n")
    return os.path.dirname(d)


class Hosts:
    """Agents as processes of this machine (``--netns``: on namespace hosts)."""

    def __init__(self, netns, n):
        self.netns = netns
        self.prefix = f"krb{os.getpid() % 100000}"
        if netns:
            subprocess.run([NETNS, "--prefix", self.prefix, "up", str(n)], check=True,
                           stdout=subprocess.DEVNULL)

    def addr(self, i):
        return f"10.77.0.{i + 1}" if self.netns else "127.0.0.1"

    def server_addr(self):
        return "10.77.0.254" if self.netns else "127.0.0.1"

    def wrap(self, where, cmd):
        return [NETNS, "--prefix", self.prefix, "exec", str(where), *cmd] if self.netns else cmd

    def close(self):
        if self.netns:
            subprocess.run([NETNS, "--prefix", self.prefix, "down"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)


def run(hosts, backend, n, tmp, env, timeout):
    out = tempfile.mkdtemp(dir=tmp, prefix=backend + "-")
    server = None
    if backend == "kolo":
        token = os.path.join(tmp, "token")
        with open(token, "w") as f:
            f.write("t0k3n-" + os.urandom(8).hex() + "\n")
        os.chmod(token, 0o600)
        server = subprocess.Popen(
            hosts.wrap("br", [os.path.join(BIN, "kolo-rendezvous"), "--listen",
                              f"{hosts.server_addr()}:0", "--token-file", token]),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        endpoint = "http://" + server.stdout.readline().split()[-1]
        confs = [f"{CONF},token_file={token}"] * n
    else:
        endpoint = f"{hosts.addr(0)}:{29400 if hosts.netns else free_port()}"
        confs = [f"{CONF},is_host={int(i == 0)}" for i in range(n)]
    agents = []
    try:
        for i in range(n):
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={n}",
                   "--nproc-per-node=1", f"--rdzv-backend={backend}",
                   f"--rdzv-endpoint={endpoint}", "--rdzv-id=bench", f"--rdzv-conf={confs[i]}",
                   "--max-restarts=0", f"--local-addr={hosts.addr(i)}",
                   os.path.join(HERE, "torchrun_rdzv_worker.py"), out]
            agents.append(subprocess.Popen(hosts.wrap(i, cmd), env=env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                           text=True))
        started = time.time()
        codes = [a.wait(timeout) for a in agents]
        if any(codes):
            err = next(a.stderr.read() for a, c in zip(agents, codes) if c)
            raise RuntimeError(f"{backend}: agents exited {codes}: {err[-2000:]}")
        done = []
        for name in os.listdir(out):
            with open(os.path.join(out, name)) as f:
                done.append(json.load(f))
        if len(done) != n:
            raise RuntimeError(f"{backend}: {len(done)} of {n} workers reported")
        return {"all_initialised_s": max(d["initialised"] for d in done) - started,
                "first_worker_start_s": min(d["started"] for d in done) - started}
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
        if server is not None:
            server.kill()
            server.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--netns", action="store_true", help="agents on network-namespace hosts")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="kolo-rdzv-bench-")
    env = dict(os.environ, OMP_NUM_THREADS="1", KOLO_LOG_LEVEL="warn",
               GLOO_SOCKET_IFNAME="eth0" if args.netns else "lo",
               PYTHONPATH=os.pathsep.join([entry_point(tmp), os.path.join(REPO, "python")] + (
                   [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    hosts = Hosts(args.netns, args.agents)
    res = {"kolo": [], "c10d": []}
    try:
        for r in range(args.rounds):
            for b in res:
                res[b].append(run(hosts, b, args.agents, tmp, env, args.timeout))
            print(f"round {r + 1}/{args.rounds}: " + "; ".join(
                f"{b} {v[-1]['all_initialised_s']:.2f} s (first worker at "
                f"{v[-1]['first_worker_start_s']:.2f} s)" for b, v in res.items()), flush=True)
    finally:
        hosts.close()
        shutil.rmtree(tmp, ignore_errors=True)
    med = {b: statistics.median(x["all_initialised_s"] for x in v) for b, v in res.items()}
    where = "namespace hosts" if args.netns else "local agents"
    print(f"\n{args.agents} {where}, 1 worker each, median of {args.rounds} rounds: all agents "
          f"started -> all workers initialised: kolo {med['kolo']:.2f} s, c10d "
          f"{med['c10d']:.2f} s (c10d / kolo {med['c10d'] / med['kolo']:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "torchrun_rdzv", "agents": args.agents, "netns": args.netns,
                       "rounds": res, "median_s": med}, f, indent=1)


if __name__ == "__main__":
    main()
