#!/usr/bin/env python3
"""Step time of gluon data-parallel training on 4 local workers: kolo.mxnet's
DistributedTrainer (under kolorun; as Horovod's, and with sharded_update=True)
against MXNet's own parameter server
(kvstore dist_sync, with as many servers as workers, co-located, and a
scheduler: what MXNet's tools/launch.py starts on one host), same model,
local batch and optimizer, interleaved rounds; a communication-bound MLP
(8.4 M parameters, local batch 8) and a compute-bound one. Then the per-op
cost of kolo.mxnet's engine path against its numpy path.

    bench/mxnet/mx_bench.py [--rounds 3] [--np 4] [--steps 20]

Runs under the MXNet environment (.venv-mxnet, scripts/setup.sh
--with-mxnet; KOLO_MXNET_PYTHON). Prints every run and, per model, the
median of the rounds and the ratios dist_sync / kolo. Each round runs the three
sides in a rotated order."""

import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
WORKER = str(HERE / "mx_worker.py")
PY = os.environ.get("KOLO_MXNET_PYTHON", str(REPO / ".venv-mxnet" / "bin" / "python"))
KOLORUN = str(REPO / "build" / "bin" / "kolorun")


def env(**extra):
    e = dict(os.environ, PYTHONPATH=str(REPO / "python"), OMP_NUM_THREADS="1",
             MXNET_CPU_WORKER_NTHREADS="1", KOLO_LOG_LEVEL="warn")
    e.setdefault("KOLO_LIBRARY", str(REPO / "build" / "lib" / "libkolo.so"))
    e.update({k: str(v) for k, v in extra.items()})
    return e


def parse(out: str) -> dict:
    for line in out.splitlines():
        if "MXBENCH " in line:
            return json.loads(line.split("MXBENCH ", 1)[1])
    raise RuntimeError("no MXBENCH line in:\n" + out[-3000:])


def run_kolo(np_, model, steps, side="kolo"):
    p = subprocess.run([KOLORUN, "-np", str(np_), "--", PY, WORKER, side, model, str(steps)],
                       capture_output=True, text=True, env=env(), timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"kolo run failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return parse(p.stdout)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ps(np_, model, steps):
    """A scheduler, np_ servers and np_ workers, as tools/launch.py -n np_ -s np_ does
    on one host."""
    dmlc = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": free_port(),
            "DMLC_NUM_SERVER": np_, "DMLC_NUM_WORKER": np_, "DMLC_NODE_HOST": "127.0.0.1"}
    daemons = [subprocess.Popen([PY, "-c", "import mxnet"], env=env(DMLC_ROLE=role, **dmlc),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for role in ["scheduler"] + ["server"] * np_]
    workers = [subprocess.Popen([PY, WORKER, "ps", model, str(steps)],
                                env=env(DMLC_ROLE="worker", **dmlc), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(np_)]
    try:
        outs = [w.communicate(timeout=900) for w in workers]
    finally:
        for p in workers + daemons:
            if p.poll() is None:
                p.kill()
        for p in daemons:
            p.wait()
    if any(w.returncode != 0 for w in workers):
        raise RuntimeError("dist_sync run failed:\n" + "\n".join(o[1][-1500:] for o in outs))
    return parse("\n".join(o[0] for o in outs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--models", default="comm,compute")
    ap.add_argument("--perop", type=int, default=2000, help="ops for the per-op cost (0: skip)")
    a = ap.parse_args()
    runs = {}
    for r in range(a.rounds):
        for model in a.models.split(","):
            order = [("kolo", run_kolo), ("dist_sync", run_ps),
                     ("kolo-shard", lambda *x: run_kolo(*x, side="kolo-shard"))]
            order = order[r % 3:] + order[:r % 3]
            for side, fn in order:
                res = fn(a.np, model, a.steps)
                runs.setdefault((model, side), []).append(res["step_ms"])
                print(f"round {r + 1} {model:8s} {side:9s} {res['step_ms']:8.1f} ms/step "
                      f"({res['params'] / 1e6:.2f} M parameters, local batch {res['batch']}, "
                      f"{res['size']} workers)", flush=True)
    summary = {}
    for model in a.models.split(","):
        k = statistics.median(runs[(model, "kolo")])
        d = statistics.median(runs[(model, "dist_sync")])
        sh = statistics.median(runs[(model, "kolo-shard")])
        summary[model] = {"kolo_ms": k, "dist_sync_ms": d, "ratio": d / k,
                          "kolo_shard_ms": sh, "ratio_shard": d / sh}
        print(f"{model}: kolo {k:.1f} ms, kolo sharded_update {sh:.1f} ms, dist_sync "
              f"{d:.1f} ms; dist_sync / kolo = {d / k:.2f}, dist_sync / kolo sharded = "
              f"{d / sh:.2f}")
    if a.perop:
        p = subprocess.run([KOLORUN, "-np", "2", "--", PY, WORKER, "perop", str(a.perop)],
                           capture_output=True, text=True, env=env(), timeout=600)
        res = parse(p.stdout)
        summary["perop"] = res
        print(f"per 8-byte allreduce, 2 ranks, {a.perop} in flight: through MXNet's engine "
              f"{res['engine_us']:.1f} us, through numpy (kolo.common.arrays) "
              f"{res['numpy_us']:.1f} us; one MXNet element-wise op {res['mxnet_op_us']:.1f} us")
    print("MXBENCH-SUMMARY " + json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
