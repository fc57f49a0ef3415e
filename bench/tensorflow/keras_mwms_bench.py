#!/usr/bin/env python3
"""Step time of tf.keras ``fit`` data-parallel on 4 local workers (one
intra-op thread each): kolo.tensorflow.keras's DistributedOptimizer against
TensorFlow's own ``MultiWorkerMirroredStrategy`` (its ring collectives over
gRPC on loopback), same model, same global batch, interleaved rounds, for a
communication-bound model (an MLP of 10.5 M parameters, local batch 8) and a
compute-bound one (a small CNN, local batch 32).

    bench/tensorflow/keras_mwms_bench.py [--rounds 2] [--np 4]

Both sides run on tf_keras (TF_USE_LEGACY_KERAS=1): on TF 2.21 Keras 3's
``fit`` under MultiWorkerMirroredStrategy fails ("unsupported type PerReplica
to a Tensor"; docs/keras.md), so tf_keras is what a TF user runs it with.
Prints every run's median step time and, per model, the median of the
rounds and the ratio MWMS / kolo."""

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
WORKER = HERE / "keras_mwms_worker.py"
PY = str(REPO / ".venv" / "bin" / "python")
KOLORUN = str(REPO / "build" / "bin" / "kolorun")


def env():
    e = dict(os.environ, PYTHONPATH=str(REPO / "python"), OMP_NUM_THREADS="1",
             TF_CPP_MIN_LOG_LEVEL="3", KOLO_LOG_LEVEL="warn")
    e.setdefault("KOLO_LIBRARY", str(REPO / "build" / "lib" / "libkolo.so"))
    return e


def parse(out: str) -> dict:
    for line in out.splitlines():
        if "BENCH " in line:
            return json.loads(line.split("BENCH ", 1)[1])
    raise RuntimeError(f"no BENCH line in:\n{out[-3000:]}")


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_kolo(n, model, lb):
    p = subprocess.run([KOLORUN, "-np", str(n), "--", PY, str(WORKER), "--mode", "kolo",
                        "--model", model, "--local-batch", str(lb)], env=env(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    return parse(p.stdout)


def run_mwms(n, model, lb):
    ports = free_ports(n)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs = []
    for i in range(n):
        e = env()
        e["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        procs.append(subprocess.Popen([PY, str(WORKER), "--mode", "mwms", "--model", model,
                                       "--local-batch", str(lb)], env=e, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = [pr.communicate(timeout=600)[0] for pr in procs]
    return parse(outs[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--np", type=int, default=4)
    a = ap.parse_args()
    for model, lb in (("comm", 8), ("compute", 32)):
        got = {"kolo": [], "mwms": []}
        for r in range(a.rounds):
            for side, fn in (("kolo", run_kolo), ("mwms", run_mwms)):
                res = fn(a.np, model, lb)
                got[side].append(res["median_ms"])
                print(f"round {r} {model:8s} {side:5s} median step {res['median_ms']:8.1f} ms "
                      f"(global batch {res['global_batch']}, {res['steps']} steps)", flush=True)
        k, m = statistics.median(got["kolo"]), statistics.median(got["mwms"])
        print(f"{model:8s}: kolo {k:.1f} ms, MultiWorkerMirroredStrategy {m:.1f} ms, "
              f"MWMS/kolo {m / k:.2f}x", flush=True)


if __name__ == "__main__":
    sys.exit(main())
