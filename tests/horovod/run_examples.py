#!/usr/bin/python3
"""Runs Horovod's own PyTorch examples on kolo, with only their import
changed, on 4 local ranks, and checks what they print.

    run_examples.py --horovod-src DIR [--python PY] [--only NAME,...]

DIR is a Horovod checkout (a worktree, whose files are read as they are on
disk), a bare git directory (read at --rev, default HEAD), or a folder that
holds the examples (e.g. a copy of Horovod's examples/). Nothing of Horovod
is kept in this repository: each example is found in DIR by its file name,
copied into a fresh work folder, and changed there by exactly

    import horovod.torch as hvd  ->  import kolo.torch as hvd
    import horovod               ->  import kolo as horovod

the runner asserting that the difference is those lines and nothing else,
and that no other import of horovod remains. The data are made locally by
make_data.py (an MNIST in torchvision's raw IDX layout, so that
``datasets.MNIST(..., download=True)`` finds it and downloads nothing; an
ImageFolder tree of small JPEG images); nothing is downloaded.

The examples, each with small options of its own (few iterations, small
batches) and a timeout:

  synthetic          examples/pytorch/pytorch_synthetic_benchmark.py under
                     kolorun -np 4: the "Iter #i", "Img/sec per CPU" and
                     "Total img/sec on 4 CPU(s)" lines
  mnist              examples/pytorch/pytorch_mnist.py under kolorun -np 4:
                     one "Test set" line per epoch, every rank training, the
                     last accuracy >= --min-accuracy
  mnist_num_proc     the same script with --num-proc 4, which calls
                     horovod.run (kolo.run) and needs no launcher
  mnist_adasum       the same script with --use-adasum
                     (DistributedOptimizer(op=hvd.Adasum))
  imagenet           examples/pytorch/pytorch_imagenet_resnet50.py under
                     kolorun -np 4, 1 epoch, --batches-per-allreduce 2: its
                     train and validation progress bars complete, the
                     checkpoint and the TensorBoard events are written
  synthetic_elastic  examples/elastic/pytorch/
                     pytorch_synthetic_benchmark_elastic.py
  mnist_elastic      examples/elastic/pytorch/pytorch_mnist_elastic.py
                     both as `kolorun -np 4 --min-np 2 --max-np 4` against a
                     kolo-rendezvous started here: once training runs, one
                     worker is SIGKILLed; the 3 survivors re-form; a second
                     `kolorun -np 1` joins and the job grows back to 4 (the
                     rounds are read from the server's log); training goes on
                     after the join, the job finishes at size 4, the joiner's
                     kolorun exits 0
  tf2_synthetic      examples/tensorflow2/tensorflow2_synthetic_benchmark.py
  tf2_keras_synthetic examples/tensorflow2/tensorflow2_keras_synthetic_benchmark.py
                     under kolorun -np 4 on the legacy tf.keras
                     (TF_USE_LEGACY_KERAS=1, tf_keras), with
                     "import horovod.tensorflow[.keras] as hvd" changed to
                     kolo.tensorflow[.keras]: the benchmark lines
  tf2_mnist          examples/tensorflow2/tensorflow2_mnist.py and
  tf2_keras_mnist    tensorflow2_keras_mnist.py, the same way, run to their
                     end (2500 and 3000 steps, 20 to 30 minutes each on 2
                     CPU cores; run only when named): the loss falls,
                     the Keras one reaches --min-accuracy, rank 0 writes its
                     checkpoint
  tf2_mnist_elastic  examples/elastic/tensorflow2/tensorflow2_mnist_elastic.py
  tf2_keras_mnist_elastic   and tensorflow2_keras_mnist_elastic.py: the
                     kill-and-join scenario above, on the legacy tf.keras
                     The TensorFlow MNIST examples call
                     keras.datasets.mnist.load_data, which downloads; the
                     runner puts tests/horovod/keras_data first on PYTHONPATH,
                     whose sitecustomize answers it from the local files
  mx_mnist           examples/mxnet/mxnet_mnist.py (gluon, DistributedTrainer,
                     broadcast_parameters) under kolorun -np 4 with
                     "import horovod.mxnet as hvd" changed to kolo.mxnet, run
                     by --mxnet-python (default $KOLO_MXNET_PYTHON or
                     .venv-mxnet): its 5 epochs; it asserts a validation
                     accuracy above 0.96 itself. It downloads mnist.zip into
                     data-<rank>/ unless the file is there: the runner puts
                     one there, made from the local files
  mx2_mnist          examples/mxnet/mxnet2_mnist.py, the same on MXNet 2's
                     API (mx.gluon.metric): on MXNet 1.9.1 it must fail with
                     MXNet's own AttributeError, not kolo's (run only when
                     named)
  mx_imagenet        examples/mxnet/mxnet_imagenet_resnet50.py on its synthetic
                     data, in module and in gluon mode (needs gluoncv): its
                     epoch is ImageNet-sized, so the runner stops it after the
                     first 4 logged batches of each (run only when named)

One summary line per example ("run_examples: SUMMARY <name>: PASS ...") and
a closing count; the exit status is 0 only when every selected example
passed. The work folders (each example's changed copy, its import diff, its
output) are kept under --work-dir, or a temporary folder that is removed
unless --keep or a failure.

The interpreter (--python, default $KOLO_HOROVOD_PYTHON or this one) needs
torch and torchvision, plus what the examples import: filelock and packaging
(the MNIST ones), tqdm and tensorboard (ImageNet), cloudpickle (--num-proc).
kolo comes from this source tree (PYTHONPATH=python, KOLO_LIBRARY=
build/lib/libkolo.so unless set). Standard library only.
"""

from __future__ import annotations

import argparse
import ctypes
import difflib
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MAKE_DATA = os.path.join(HERE, "make_data.py")
NP = 4

# ---- finding and changing the examples ---------------------------------------

# (pattern, replacement): the whole change. A line that matches neither is
# left as it is.
IMPORT_RULES = [
    (re.compile(r"^(\s*)import horovod\.torch as hvd(\s*(?:#.*)?)$"), r"\1import kolo.torch as hvd\2"),
    (re.compile(r"^(\s*)import horovod\.tensorflow\.keras as hvd(\s*(?:#.*)?)$"),
     r"\1import kolo.tensorflow.keras as hvd\2"),
    (re.compile(r"^(\s*)import horovod\.tensorflow as hvd(\s*(?:#.*)?)$"),
     r"\1import kolo.tensorflow as hvd\2"),
    (re.compile(r"^(\s*)import horovod\.mxnet as hvd(\s*(?:#.*)?)$"), r"\1import kolo.mxnet as hvd\2"),
    (re.compile(r"^(\s*)import horovod(\s*(?:#.*)?)$"), r"\1import kolo as horovod\2"),
]
HOROVOD_IMPORT = re.compile(r"^\s*(?:import\s+horovod\b|from\s+horovod\b)")


class ExampleError(Exception):
    """A check failed: the message says which and why."""


class Source:
    """Horovod's files, from a worktree or folder on disk, or a git dir at a
    revision."""

    def __init__(self, path: str, rev: str | None):
        self.path = os.path.abspath(path)
        if not os.path.isdir(self.path):
            raise SystemExit(f"run_examples: --horovod-src {path}: not a directory")
        self.git_dir = None
        self.rev = rev
        inside = self._git("rev-parse", "--is-inside-git-dir", cwd=self.path)
        is_git_dir = inside is not None and inside.strip() == "true"
        if rev is not None or is_git_dir:
            gd = self._git("rev-parse", "--absolute-git-dir", cwd=self.path)
            if gd is None:
                raise SystemExit(f"run_examples: --rev {rev} given but {path} is in no git "
                                 "repository")
            self.git_dir = gd.strip()
            self.rev = rev or "HEAD"
            names = self._git("ls-tree", "-r", "--name-only", self.rev, git_dir=self.git_dir)
            if names is None:
                raise SystemExit(f"run_examples: cannot list {self.rev} in {self.git_dir}")
            self.files = names.splitlines()
            commit = self._git("rev-parse", "--short=12", self.rev, git_dir=self.git_dir)
            self.where = f"{self.git_dir} at {self.rev} ({(commit or '?').strip()})"
        else:
            self.files = []
            for top, dirs, files in os.walk(self.path):
                dirs[:] = [d for d in dirs if d != ".git"]
                for f in files:
                    self.files.append(os.path.relpath(os.path.join(top, f), self.path))
            commit = self._git("rev-parse", "--short=12", "HEAD", cwd=self.path)
            self.where = self.path + (f" (worktree at {commit.strip()})" if commit else "")

    @staticmethod
    def _git(*args, git_dir=None, cwd=None):
        cmd = ["git"] + ([f"--git-dir={git_dir}"] if git_dir else []) + list(args)
        try:
            p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return p.stdout if p.returncode == 0 else None

    def find(self, filename: str, elastic: bool) -> str:
        """The path of ``filename``: among the files of that name, those
        under an "elastic" folder for an elastic example (others not), and
        not those of the Spark or Ray integrations; the shortest path wins."""
        hits = [f for f in self.files if os.path.basename(f) == filename]
        ok = [f for f in hits
              if ("elastic" in f.split("/")[:-1]) == elastic and
              not {"spark", "ray"} & set(f.split("/")[:-1])]
        if not ok:
            raise ExampleError(f"{filename} not found in {self.where}" +
                               (f" (only at {', '.join(hits)})" if hits else ""))
        return min(ok, key=lambda f: (len(f.split("/")), f))

    def read(self, rel: str) -> str:
        if self.git_dir:
            text = self._git("show", f"{self.rev}:{rel}", git_dir=self.git_dir)
            if text is None:
                raise ExampleError(f"git show {self.rev}:{rel} failed in {self.git_dir}")
            return text
        with open(os.path.join(self.path, rel), encoding="utf-8") as f:
            return f.read()


def change_imports(text: str, name: str) -> tuple:
    """The example with the import change applied, and its unified diff.
    Raises ExampleError unless the change is exactly the import lines and
    leaves no import of horovod behind."""
    old = text.splitlines(keepends=True)
    new = []
    for line in old:
        body = line.rstrip("\r\n")
        for rx, rep in IMPORT_RULES:
            if rx.match(body):
                body = rx.sub(rep, body)
                break
        new.append(body + line[len(line.rstrip("\r\n")):])
    if not any(rx.match(line.rstrip("\r\n")) for line in old for rx, _ in IMPORT_RULES[:4]):
        raise ExampleError(f"{name}: no line 'import horovod.torch as hvd' (or "
                           f"horovod.tensorflow, horovod.tensorflow.keras, horovod.mxnet) to "
                           f"change")
    diff = list(difflib.unified_diff(old, new, f"a/{name}", f"b/{name}", n=0))
    removed = [d[1:].rstrip("\r\n") for d in diff if d.startswith("-") and not d.startswith("---")]
    added = [d[1:].rstrip("\r\n") for d in diff if d.startswith("+") and not d.startswith("+++")]
    if len(removed) != len(added):
        raise ExampleError(f"{name}: the change is not line for line: {diff}")
    for r, a in zip(removed, added):
        if not any(rx.match(r) and rx.sub(rep, r) == a for rx, rep in IMPORT_RULES):
            raise ExampleError(f"{name}: the change touches more than an import: {r!r} -> {a!r}")
    for i, line in enumerate(new, 1):
        if HOROVOD_IMPORT.match(line):
            raise ExampleError(f"{name}:{i}: still imports horovod after the change "
                               f"(more than the one-line change would be needed): {line.strip()}")
    return "".join(new), "".join(diff), list(zip(removed, added))


# ---- processes -----------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _child_setup():
    os.setsid()  # its own process group: a timeout ends the whole tree
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: none outlives the runner


class Proc:
    """A process (kolorun, a script, the rendezvous server) whose stdout
    and stderr lines are kept with their time and queued for waiters.
    Lines are split at \\n and \\r (tqdm's progress bars)."""

    def __init__(self, cmd: list, env: dict, cwd: str, log_prefix: str, stdin=None):
        self.cmd = [str(c) for c in cmd]
        self.t0 = time.monotonic()
        self.log_out = open(log_prefix + ".stdout", "w")
        self.log_err = open(log_prefix + ".stderr", "w")
        self.log_out.write(f"$ {shlex.join(self.cmd)}\n")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=stdin if stdin is not None else subprocess.DEVNULL,
                                     env=env, cwd=cwd, preexec_fn=_child_setup)
        self.out: list = []   # (time, line)
        self.err: list = []
        self.lines: queue.Queue = queue.Queue()  # (stream, time, line)
        self.threads = [threading.Thread(target=self._read, args=(self.proc.stdout, "out"),
                                         daemon=True),
                        threading.Thread(target=self._read, args=(self.proc.stderr, "err"),
                                         daemon=True)]
        for t in self.threads:
            t.start()

    def _read(self, f, stream: str) -> None:
        keep, log = (self.out, self.log_out) if stream == "out" else (self.err, self.log_err)
        buf = b""
        while True:
            chunk = f.read1(65536) if hasattr(f, "read1") else f.read(65536)
            if not chunk:
                break
            log.write(chunk.decode("utf-8", "replace"))
            log.flush()
            buf += chunk
            parts = re.split(rb"[\r\n]", buf)
            buf = parts.pop()
            for p in parts:
                if p:
                    self._line(keep, stream, p)
        if buf:
            self._line(keep, stream, buf)

    def _line(self, keep: list, stream: str, raw: bytes) -> None:
        t = time.monotonic()
        line = raw.decode("utf-8", "replace")
        keep.append((t, line))
        self.lines.put((stream, t, line))

    def wait_line(self, rx, deadline: float, stream: str | None = None, what: str = "",
                  watch: "Proc | None" = None) -> tuple:
        """(time, match) of the next queued line matching ``rx``; raises
        ExampleError at ``deadline`` or when the process, or ``watch``,
        ends first."""
        rx = re.compile(rx) if isinstance(rx, str) else rx
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ExampleError(f"no line matching {rx.pattern!r} ({what}) before the deadline")
            try:
                s, t, line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                if watch is not None and watch.proc.poll() is not None:
                    raise ExampleError(f"{os.path.basename(watch.cmd[0])} exited "
                                       f"{watch.proc.returncode} while waiting for {what}")
                if self.proc.poll() is not None:
                    for th in self.threads:
                        th.join(timeout=5)
                    if self.lines.empty():
                        raise ExampleError(f"{os.path.basename(self.cmd[0])} exited "
                                           f"{self.proc.returncode} before a line matching "
                                           f"{rx.pattern!r} ({what})")
                continue
            if stream is not None and s != stream:
                continue
            m = rx.search(line)
            if m:
                return t, m

    def finish(self, deadline: float) -> int:
        """The exit status; the process group is killed at the deadline."""
        try:
            rc = self.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            self.kill()
            raise ExampleError(f"{os.path.basename(self.cmd[0])} still running at the "
                               f"timeout: killed")
        for th in self.threads:
            th.join(timeout=10)
        self.log_out.close()
        self.log_err.close()
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        for th in self.threads:
            th.join(timeout=5)
        self.log_out.close()
        self.log_err.close()

    def stdout(self) -> str:
        return "\n".join(line for _, line in self.out)

    def stderr(self) -> str:
        return "\n".join(line for _, line in self.err)

    def children(self) -> list:
        """The pids of this process's children (kolorun's workers)."""
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                return sorted(int(p) for p in f.read().split())
        except OSError:
            return []


class Rendezvous:
    """A kolo-rendezvous on a free loopback port; its log says when each
    round forms and with how many workers."""

    FORMED = re.compile(r"job (\S+) round (\d+) formed: (\d+) workers")

    def __init__(self, bindir: str, work: str, env: dict):
        self.token = os.path.join(work, "token")
        with open(self.token, "w") as f:
            f.write("horovod-examples-" + os.urandom(12).hex() + "\n")
        # A long settle time: the first round waits for all 4 workers (it
        # forms at once when max-np are there) even when one starts slowly,
        # so that every rank builds its DistributedSampler for size 4; a
        # failure re-forms at once and a join to max-np forms at once.
        # Its log at info level: the "round N formed" lines are what is read.
        self.proc = Proc([os.path.join(bindir, "kolo-rendezvous"), "--listen", "127.0.0.1:0",
                          "--token-file", self.token, "--min-np", "2", "--max-np", str(NP),
                          "--settle-ms", "120000"], dict(env, KOLO_LOG_LEVEL="info"), work,
                         os.path.join(work, "rendezvous"))
        _, m = self.proc.wait_line(r"listening on (\S+):(\d+)", time.monotonic() + 30,
                                   stream="out", what="the server's address")
        self.url = f"http://127.0.0.1:{m.group(2)}"
        self.rounds: list = []  # (time, round, size)

    def wait_round(self, pred, deadline: float, what: str, watch: Proc | None = None) -> tuple:
        """The first round formed from now on that satisfies ``pred``
        (time, round, size); fails when ``watch`` (the job) ends first."""
        while True:
            t, m = self.proc.wait_line(self.FORMED, deadline, stream="err", what=what,
                                       watch=watch)
            r = (t, int(m.group(2)), int(m.group(3)))
            self.rounds.append(r)
            if pred(r):
                return r

    def close(self) -> None:
        self.proc.kill()


# ---- the examples ------------------------------------------------------------------

class Context:
    def __init__(self, a, src: Source):
        self.a = a
        self.src = src
        self.python = a.python
        self.bindir = a.bin
        self.kolorun = os.path.join(a.bin, "kolorun")
        lib = os.environ.get("KOLO_LIBRARY") or os.path.join(os.path.dirname(a.bin), "lib",
                                                             "libkolo.so")
        self.env = dict(os.environ)
        self.env.update({
            "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "python")] +
                                          ([os.environ["PYTHONPATH"]]
                                           if os.environ.get("PYTHONPATH") else [])),
            "KOLO_LIBRARY": lib, "KOLO_KOLORUN": self.kolorun,
            "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "KOLO_IFACE": "127.0.0.1",
        })
        self.env.setdefault("KOLO_LOG_LEVEL", "warn")
        self.data: dict = {}


class Example:
    """One of Horovod's examples: where it is, how it runs, what it must
    print."""

    name = ""
    filename = ""
    elastic = False
    timeout = 600
    args: list = []
    framework = "torch"
    extra_env: dict = {}
    default = True  # in the default run (--only not given)

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.work = os.path.join(ctx.a.work_dir, self.name)
        self.figures = ""

    # -- preparation --
    def prepare(self) -> str:
        os.makedirs(self.work, exist_ok=True)
        rel = self.ctx.src.find(self.filename, self.elastic)
        text, diff, changed = change_imports(self.ctx.src.read(rel), rel)
        self.script = os.path.join(self.work, self.filename)
        with open(self.script, "w", encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(self.work, "import.diff"), "w", encoding="utf-8") as f:
            f.write(diff)
        self.rel = rel
        self.home = os.path.join(self.work, "home")  # ~/.horovod_lock of the MNIST ones
        os.makedirs(self.home, exist_ok=True)
        return f"{rel}, changed: " + "; ".join(f"{r.strip()!r} -> {a.strip()!r}"
                                               for r, a in changed)

    def env(self) -> dict:
        env = dict(self.ctx.env)
        env["HOME"] = self.home
        env.update(self.extra_env)
        return env

    def example_args(self) -> list:
        return list(self.args) + shlex.split(self.ctx.a.extra.get(self.name, ""))

    def deadline(self) -> float:
        return time.monotonic() + self.timeout * self.ctx.a.timeout_scale

    def kolorun(self, n: int, launcher: list, tag: str) -> Proc:
        return Proc([self.ctx.kolorun, "-np", n, *launcher, "--", self.ctx.python, self.script,
                     *self.example_args()], self.env(), self.work, os.path.join(self.work, tag))

    # -- checks shared by several --
    @staticmethod
    def need(cond: bool, why: str) -> None:
        if not cond:
            raise ExampleError(why)

    @staticmethod
    def no_traceback(*procs: Proc) -> None:
        for p in procs:
            if "Traceback (most recent call last)" in p.stdout() + p.stderr():
                raise ExampleError(f"a traceback in the output of {shlex.join(p.cmd[:3])}")


def data_mnist(ctx: Context) -> str:
    if "mnist" not in ctx.data:
        root = os.path.join(ctx.a.work_dir, "data", "mnist")
        run_make_data(ctx, ["mnist", "--root", root, "--train", str(ctx.a.mnist_train),
                            "--test", str(ctx.a.mnist_test)])
        ctx.data["mnist"] = root
    return ctx.data["mnist"]


def data_imagenet(ctx: Context) -> tuple:
    if "imagenet" not in ctx.data:
        root = os.path.join(ctx.a.work_dir, "data", "imagenet")
        run_make_data(ctx, ["imagenet", "--root", root, "--classes", "4", "--train-per-class",
                            "8", "--val-per-class", "2", "--size", "32", "--format", "jpeg"])
        ctx.data["imagenet"] = (os.path.join(root, "train"), os.path.join(root, "val"))
    return ctx.data["imagenet"]


def run_make_data(ctx: Context, args: list) -> None:
    """make_data.py with these arguments, unless a run with the same ones
    already filled this work folder."""
    root = args[args.index("--root") + 1]
    stamp = os.path.join(root, ".made-with")
    want = shlex.join(args)
    if os.path.isfile(stamp) and open(stamp).read() == want:
        print(f"run_examples: data in {root} already made with {want}", flush=True)
        return
    p = subprocess.run([ctx.python, MAKE_DATA, *args], capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise ExampleError(f"make_data.py {want} failed: {p.stderr[-2000:]}")
    with open(stamp, "w") as f:
        f.write(want)
    print(f"run_examples: {p.stdout.strip()}", flush=True)


IMG_SEC = re.compile(r"Iter #(\d+): ([0-9.]+) img/sec per (\w+)")
IMG_MEAN = re.compile(r"Img/sec per (\w+): ([0-9.]+) \+-([0-9.]+)")
IMG_TOTAL = re.compile(r"Total img/sec on (\d+) (\w+)\(s\): ([0-9.]+) \+-([0-9.]+)")
TEST_SET = re.compile(r"Test set: Average loss: ([0-9.]+), Accuracy: ([0-9.]+)%")
TRAIN_EPOCH = re.compile(r"^\[(\d+)\] Train Epoch: (\d+) \[(\d+)/(\d+)")


def check_benchmark(out: str, iters: int, size: int) -> str:
    got = IMG_SEC.findall(out)
    Example.need(sorted({int(i) for i, _, _ in got}) == list(range(iters)),
                 f"'Iter #i' lines for {sorted({int(i) for i, _, _ in got})}, "
                 f"not 0..{iters - 1}")
    mean, total = IMG_MEAN.findall(out), IMG_TOTAL.findall(out)
    Example.need(len(mean) == 1 and len(total) == 1,
                 f"{len(mean)} 'Img/sec per' and {len(total)} 'Total img/sec' lines, not 1 each")
    Example.need(int(total[0][0]) == size, f"the total is over {total[0][0]} ranks, not {size}")
    return (f"Img/sec per {mean[0][0]}: {mean[0][1]} +-{mean[0][2]}; Total img/sec on "
            f"{total[0][0]} {total[0][1]}(s): {total[0][2]} +-{total[0][3]}")


def opt(args: list, name: str, default):
    """The last value of option ``name`` in an argument list."""
    v = default
    for i, a in enumerate(args[:-1]):
        if a == name:
            v = args[i + 1]
    return type(default)(v)


class Synthetic(Example):
    name = "synthetic"
    filename = "pytorch_synthetic_benchmark.py"
    args = ["--model", "resnet50", "--batch-size", "2", "--num-warmup-batches", "1",
            "--num-batches-per-iter", "2", "--num-iters", "3"]

    def run(self) -> None:
        p = self.kolorun(NP, [], "kolorun")
        rc = p.finish(self.deadline())
        self.need(rc == 0, f"kolorun exited {rc}")
        out = p.stdout()
        self.need(f"Number of CPUs: {NP}" in out or f"Number of GPUs: {NP}" in out,
                  f"no 'Number of CPUs: {NP}' line")
        self.figures = check_benchmark(out, opt(self.example_args(), "--num-iters", 10), NP)
        self.no_traceback(p)


class Mnist(Example):
    name = "mnist"
    filename = "pytorch_mnist.py"
    timeout = 900
    args = ["--epochs", "3", "--batch-size", "16", "--test-batch-size", "250",
            "--log-interval", "20"]
    num_proc = False

    def example_args(self) -> list:
        return (["--data-dir", data_mnist(self.ctx)] + super().example_args() +
                (["--num-proc", str(NP)] if self.num_proc else []))

    def start(self) -> Proc:
        return self.kolorun(NP, [], "kolorun")

    def run(self) -> None:
        p = self.start()
        rc = p.finish(self.deadline())
        self.need(rc == 0, f"exit status {rc}")
        out = p.stdout()
        if self.num_proc:
            self.need("Running training through horovod.run" in out,
                      "no 'Running training through horovod.run' line")
        epochs = opt(self.example_args(), "--epochs", 10)
        tests = TEST_SET.findall(out)
        self.need(len(tests) == epochs, f"{len(tests)} 'Test set' lines, not one per epoch "
                                        f"({epochs})")
        ranks = {int(m.group(1)) for m in map(TRAIN_EPOCH.match, out.splitlines()) if m}
        self.need(ranks == set(range(NP)), f"'Train Epoch' lines from ranks {sorted(ranks)}, "
                                           f"not 0..{NP - 1}")
        shard = {int(m.group(4)) for m in map(TRAIN_EPOCH.match, out.splitlines()) if m}
        want = -(-self.ctx.a.mnist_train // NP)
        self.need(shard == {want}, f"each rank's partition is {shard}, not {want}")
        acc = float(tests[-1][1])
        self.figures = ("test accuracy by epoch " + ", ".join(f"{a}%" for _, a in tests) +
                        f"; final loss {tests[-1][0]}")
        self.need(acc >= self.ctx.a.min_accuracy,
                  f"final test accuracy {acc}% < {self.ctx.a.min_accuracy}%")
        self.no_traceback(p)


class MnistNumProc(Mnist):
    name = "mnist_num_proc"
    num_proc = True

    def start(self) -> Proc:
        return Proc([self.ctx.python, self.script, *self.example_args()], self.env(),
                    self.work, os.path.join(self.work, "python"))


class MnistAdasum(Mnist):
    """The same script with --use-adasum: DistributedOptimizer(op=hvd.Adasum)
    and the learning rate not scaled by the size, as Horovod runs it."""
    name = "mnist_adasum"
    args = Mnist.args + ["--use-adasum"]


class Imagenet(Example):
    name = "imagenet"
    filename = "pytorch_imagenet_resnet50.py"
    timeout = 1200
    args = ["--batch-size", "2", "--val-batch-size", "2", "--epochs", "1",
            "--batches-per-allreduce", "2"]

    BAR = re.compile(r"(Train|Validate) Epoch\s+#(\d+): 100%.*\| (\d+)/(\d+) .*"
                     r"loss=([0-9.e+-]+), accuracy=([0-9.e+-]+)")

    def example_args(self) -> list:
        train, val = data_imagenet(self.ctx)
        return ["--train-dir", train, "--val-dir", val,
                "--log-dir", os.path.join(self.work, "logs"),
                "--checkpoint-format", os.path.join(self.work, "checkpoint-{epoch}.pth.tar"),
                ] + super().example_args()

    def run(self) -> None:
        p = self.kolorun(NP, [], "kolorun")
        rc = p.finish(self.deadline())
        self.need(rc == 0, f"kolorun exited {rc}")
        epochs = opt(self.example_args(), "--epochs", 90)
        bars = {}
        for m in self.BAR.finditer(p.stderr()):
            bars[(m.group(1), int(m.group(2)))] = m
        figures = []
        for e in range(1, epochs + 1):
            for kind in ("Train", "Validate"):
                m = bars.get((kind, e))
                self.need(m is not None, f"no completed '{kind} Epoch #{e}' progress bar")
                figures.append(f"{kind.lower()} #{e}: {m.group(3)}/{m.group(4)} batches, "
                               f"loss {float(m.group(5)):.3f}, accuracy {float(m.group(6)):.1f}%")
        ckpt = os.path.join(self.work, f"checkpoint-{epochs}.pth.tar")
        self.need(os.path.isfile(ckpt) and os.path.getsize(ckpt) > 0, f"no checkpoint {ckpt}")
        logs = os.path.join(self.work, "logs")
        events = [f for f in os.listdir(logs) if f.startswith("events.")] \
            if os.path.isdir(logs) else []
        self.need(bool(events), f"no TensorBoard events in {logs}")
        self.no_traceback(p)
        self.figures = "; ".join(figures) + (f"; checkpoint {os.path.getsize(ckpt) >> 20} MiB")


class ElasticExample(Example):
    """The kill-and-join scenario, against a rendezvous server of its own."""

    elastic = True
    timeout = 1200
    kill_after = ""   # a line of the example's stdout; the kill comes after it
    kill_after_n = 1  # ... after this many of them
    progress = ""     # a line that shows training going on

    def run(self) -> None:
        deadline = self.deadline()
        env = self.env()
        env.update({"KOLO_HEARTBEAT_MS": "300", "KOLO_ELASTIC_LEAVE_GRACE_MS": "20000"})
        server = Rendezvous(self.ctx.bindir, self.work, env)
        launcher = ["--rendezvous", server.url, "--token-file", server.token, "--job",
                    self.name, "--min-np", "2", "--max-np", str(NP)]
        job = joiner = None
        try:
            job = Proc([self.ctx.kolorun, "-np", NP, *launcher, "--", self.ctx.python,
                        self.script, *self.example_args()], env, self.work,
                       os.path.join(self.work, "kolorun"))
            first = server.wait_round(lambda r: True, deadline, "the first round", job)
            self.need(first[2] == NP, f"the first round formed with {first[2]} workers, "
                                      f"not {NP}")
            for _ in range(self.kill_after_n):
                job.wait_line(self.kill_after, deadline, stream="out",
                              what="training under way")
            workers = job.children()
            self.need(len(workers) == NP, f"kolorun has {len(workers)} workers, not {NP}")
            victim = workers[1]
            t_kill = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            shrink = server.wait_round(lambda r: r[1] > first[1], deadline,
                                       "the round after the kill", job)
            self.need(shrink[2] == NP - 1, f"after the kill round {shrink[1]} formed with "
                                           f"{shrink[2]} workers, not {NP - 1}")
            joiner = Proc([self.ctx.kolorun, "-np", 1, *launcher, "--", self.ctx.python,
                           self.script, *self.example_args()], env, self.work,
                          os.path.join(self.work, "kolorun-join"))
            t_join = time.monotonic()
            grow = server.wait_round(lambda r: r[1] > shrink[1], deadline,
                                     "the round with the joiner", joiner)
            self.need(grow[2] == NP, f"after the join round {grow[1]} formed with {grow[2]} "
                                     f"workers, not {NP}")
            rc = job.finish(deadline)
            rc_join = joiner.finish(deadline)
            # Rounds formed later than the join (none expected).
            while True:
                try:
                    server.wait_round(lambda r: True, time.monotonic() + 0.5, "")
                except ExampleError:
                    break
        finally:
            for p in (job, joiner):
                if p is not None:
                    p.kill()
            server.close()
        self.need(rc in (0, 128 + signal.SIGKILL),
                  f"the first kolorun exited {rc} (0, or 137 for the killed worker, expected)")
        self.need(rc_join == 0, f"the joiner's kolorun exited {rc_join}")
        self.need(any(f"killed by signal {int(signal.SIGKILL)}" in line for _, line in job.err),
                  "kolorun did not report its worker killed by signal 9")
        sizes = [r[2] for r in server.rounds]
        self.need(sizes == [NP, NP - 1, NP], f"rounds of sizes {sizes}, not [4, 3, 4]")
        after = [t for t, line in job.out + joiner.out
                 if t > grow[0] and re.search(self.progress, line)]
        self.need(bool(after), "no training progress printed after the joiner came in "
                               "(give the example more iterations or epochs)")
        self.no_traceback(job, joiner)
        out = job.stdout() + "\n" + joiner.stdout()
        self.figures = (f"killed pid {victim}; rounds {sizes} (re-formed "
                        f"{shrink[0] - t_kill:.2f} s after the kill, grew "
                        f"{grow[0] - t_join:.1f} s after the joiner started); "
                        f"{len(after)} progress lines after the join; "
                        f"exit statuses {rc}, {rc_join}; " + self.result(out))


class SyntheticElastic(ElasticExample):
    name = "synthetic_elastic"
    filename = "pytorch_synthetic_benchmark_elastic.py"
    args = ["--model", "resnet18", "--batch-size", "2", "--num-warmup-batches", "2",
            "--num-batches-per-iter", "2", "--num-iters", "25"]
    kill_after = r"Iter #1:"
    progress = r"Iter #\d+:"

    def result(self, out: str) -> str:
        return check_benchmark(out, opt(self.example_args(), "--num-iters", 10), NP)


class MnistElastic(ElasticExample):
    name = "mnist_elastic"
    filename = "pytorch_mnist_elastic.py"
    args = ["--epochs", "4", "--batch-size", "16", "--test-batch-size", "250",
            "--log-interval", "10"]
    kill_after = r"Train Epoch: 1 \["
    kill_after_n = 8  # two log lines from each rank
    progress = r"Train Epoch: \d+ \["

    def example_args(self) -> list:
        return ["--data-dir", data_mnist(self.ctx)] + super().example_args()

    def result(self, out: str) -> str:
        tests = TEST_SET.findall(out)
        self.need(len(tests) == 1, f"{len(tests)} 'Test set' lines, not 1")
        acc = float(tests[0][1])
        self.need(acc >= self.ctx.a.min_accuracy,
                  f"test accuracy {acc}% < {self.ctx.a.min_accuracy}%")
        return f"test accuracy {acc}%, loss {tests[0][0]}"


class TfSynthetic(Synthetic):
    """examples/tensorflow2/tensorflow2_synthetic_benchmark.py (a
    GradientTape loop with DistributedGradientTape, ResNet50) on the legacy
    tf.keras, as its users run it on TF 2.21."""
    name = "tf2_synthetic"
    filename = "tensorflow2_synthetic_benchmark.py"
    framework = "tensorflow"
    extra_env = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    timeout = 900
    args = ["--batch-size", "4", "--num-warmup-batches", "1", "--num-batches-per-iter", "2",
            "--num-iters", "2"]


class TfKerasSynthetic(TfSynthetic):
    """examples/tensorflow2/tensorflow2_keras_synthetic_benchmark.py (fit with
    DistributedOptimizer and the broadcast callback)."""
    name = "tf2_keras_synthetic"
    filename = "tensorflow2_keras_synthetic_benchmark.py"
    args = ["--model", "MobileNet", "--batch-size", "4", "--num-batches-per-iter", "2",
            "--num-iters", "2"]


KERAS_DATA = os.path.join(HERE, "keras_data")  # its sitecustomize serves MNIST locally
TF_STEP = re.compile(r"Step #(\d+)\tLoss: ([0-9.]+)")
KERAS_EPOCH = re.compile(r"Epoch (\d+)/(\d+)")
KERAS_ACC = re.compile(r" - loss: ([0-9.]+) - accuracy: ([0-9.]+)")


class TfMnistData:
    """The TensorFlow MNIST examples call keras.datasets.mnist.load_data,
    which downloads: tests/horovod/keras_data/sitecustomize.py answers it
    from make_data.py's files (KOLO_EXAMPLE_MNIST), the example unchanged."""

    framework = "tensorflow"

    def env(self) -> dict:
        env = super().env()
        env.update({"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
                    "KOLO_EXAMPLE_MNIST": os.path.join(data_mnist(self.ctx), "MNIST", "raw"),
                    "PYTHONPATH": os.pathsep.join([KERAS_DATA, env["PYTHONPATH"]])})
        return env

    def check_losses(self, out: str) -> str:
        steps = [(int(a), float(b)) for a, b in TF_STEP.findall(out)]
        self.need(len(steps) >= 2, f"{len(steps)} 'Step #' lines")
        first, last = steps[0][1], min(x for _, x in steps[-3:])
        self.need(last < first, f"the loss did not fall: {first} at step {steps[0][0]}, "
                                f"{steps[-1][1]} at step {steps[-1][0]}")
        return f"loss {first} at step {steps[0][0]} -> {steps[-1][1]} at step {steps[-1][0]}"


class TfMnistPlain(TfMnistData, Example):
    """A TensorFlow MNIST example under kolorun -np 4, run to its end; check()
    reads its output and returns the figures."""
    timeout = 3600
    default = False  # 20 to 30 minutes on 2 CPU cores

    def run(self) -> None:
        p = self.kolorun(NP, [], "kolorun")
        rc = p.finish(self.deadline())
        self.need(rc == 0, f"kolorun exited {rc}")
        self.figures = self.check(p.stdout())
        self.no_traceback(p)


class TfMnist(TfMnistPlain):
    """examples/tensorflow2/tensorflow2_mnist.py: a tf.function step with
    DistributedGradientTape and broadcast_variables after the first step,
    10000 // size steps; rank 0 writes a checkpoint."""
    name = "tf2_mnist"
    filename = "tensorflow2_mnist.py"

    def check(self, out: str) -> str:
        steps = [int(a) for a, _ in TF_STEP.findall(out)]
        self.need(steps and steps[-1] == (10000 // NP - 1) // 10 * 10,
                  f"the last 'Step #' line is {steps[-1:]}, not of step {10000 // NP - 1}")
        self.need(any(f.startswith("checkpoints") for f in os.listdir(self.work)),
                  "rank 0 wrote no checkpoint")
        return self.check_losses(out) + f"; {len(steps)} lines, checkpoint written"


class TfKerasMnist(TfMnistPlain):
    """examples/tensorflow2/tensorflow2_keras_mnist.py: fit with
    DistributedOptimizer, the broadcast, metric-average and warm-up
    callbacks, 24 epochs of 500 // size steps; rank 0 checkpoints each."""
    name = "tf2_keras_mnist"
    filename = "tensorflow2_keras_mnist.py"

    def check(self, out: str) -> str:
        epochs = KERAS_EPOCH.findall(out)
        self.need(epochs and epochs[-1] == ("24", "24"), f"the last epoch line is {epochs[-1:]}")
        accs = [float(a) for _, a in KERAS_ACC.findall(out)]
        self.need(accs and accs[-1] * 100 >= self.ctx.a.min_accuracy,
                  f"final training accuracy {accs[-1:]} < {self.ctx.a.min_accuracy}%")
        self.need(os.path.exists(os.path.join(self.work, "checkpoint-24.h5")),
                  "no checkpoint-24.h5 from rank 0")
        return f"training accuracy {accs[-1]:.4f} after 24 epochs; checkpoint-24.h5"


class TfMnistElastic(TfMnistData, ElasticExample):
    """examples/elastic/tensorflow2/tensorflow2_mnist_elastic.py:
    TensorFlowKerasState committed every step, 100 // size steps per call of
    the elastic function."""
    name = "tf2_mnist_elastic"
    filename = "tensorflow2_mnist_elastic.py"
    kill_after = r"Step #0\t"
    progress = r"Step #\d+\t"

    def result(self, out: str) -> str:
        return self.check_losses(out)


class TfKerasMnistElastic(TfMnistData, ElasticExample):
    """examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py: fit
    with KerasState and the commit, batch and epoch callbacks, 24 epochs."""
    name = "tf2_keras_mnist_elastic"
    filename = "tensorflow2_keras_mnist_elastic.py"
    timeout = 3600
    default = False  # 20 to 30 minutes on 2 CPU cores
    kill_after = r"Epoch 2/"
    progress = r"Epoch \d+/"

    def result(self, out: str) -> str:
        accs = [float(a) for _, a in KERAS_ACC.findall(out)]
        self.need(bool(accs), "no accuracy printed")
        return f"last training accuracy printed {accs[-1]:.4f}"


class MxMnist(Example):
    """examples/mxnet/mxnet_mnist.py: gluon with broadcast_parameters and
    DistributedTrainer, 5 epochs; it asserts validation accuracy > 0.96 on
    rank 0 itself. mnist.zip is put where its download() looks first."""
    name = "mx_mnist"
    filename = "mxnet_mnist.py"
    framework = "mxnet"
    timeout = 900
    EPOCH = re.compile(r"Epoch\[(\d+)\]\tTrain: accuracy=([0-9.]+)\tValidation: "
                       r"accuracy=([0-9.]+)")

    def prepare(self) -> str:
        what = super().prepare()
        raw = os.path.join(data_mnist(self.ctx), "MNIST", "raw")
        for r in range(NP):
            d = os.path.join(self.work, f"data-{r}")
            os.makedirs(d, exist_ok=True)
            with zipfile.ZipFile(os.path.join(d, "mnist.zip"), "w") as z:
                for f in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
                    z.write(os.path.join(raw, f), f)
        return what

    def kolorun(self, n: int, launcher: list, tag: str) -> Proc:
        return Proc([self.ctx.kolorun, "-np", n, *launcher, "--", self.ctx.a.mxnet_python,
                     self.script, *self.example_args()], self.env(), self.work,
                    os.path.join(self.work, tag))

    def run(self) -> None:
        p = self.kolorun(NP, [], "kolorun")
        rc = p.finish(self.deadline())
        self.need(rc == 0, f"kolorun exited {rc}")
        self.no_traceback(p)
        epochs = self.EPOCH.findall(p.stderr())
        self.need(len(epochs) == 5, f"{len(epochs)} 'Epoch[N] Train: ... Validation' lines")
        self.figures = "validation accuracy by epoch " + ", ".join(
            f"{float(v) * 100:.2f}%" for _, _, v in epochs)


class Mx2Mnist(MxMnist):
    """examples/mxnet/mxnet2_mnist.py: written for MXNet 2 (mx.gluon.metric),
    which MXNet 1.9.1 lacks; expected to stop at MXNet's AttributeError."""
    name = "mx2_mnist"
    filename = "mxnet2_mnist.py"
    default = False

    def run(self) -> None:
        p = self.kolorun(NP, [], "kolorun")
        rc = p.finish(self.deadline())
        err = p.stderr()
        self.need(rc != 0, "it ran to its end on MXNet 1.x")
        self.need("has no attribute 'metric'" in err,
                  "it failed, but not at mx.gluon.metric (the MXNet 2 API)")
        self.figures = "stops at mx.gluon.metric (MXNet 2 only), as on MXNet 1.9.1 without kolo"


class MxImagenet(MxMnist):
    """examples/mxnet/mxnet_imagenet_resnet50.py on its synthetic data
    (needs gluoncv for the model): ResNet-50 v1, batch 2 per rank. Its epoch
    is ImageNet's 1281167 images, days on 2 CPU cores, so the runner stops it
    after its first STEPS logged batches in each mode: module (Module.fit with
    DistributedOptimizer and broadcast_parameters of arg and aux params) and
    gluon (DistributedTrainer), checking that every rank logged them."""
    name = "mx_imagenet"
    filename = "mxnet_imagenet_resnet50.py"
    default = False
    timeout = 900
    STEPS = 4
    args = ["--batch-size", "2", "--num-epochs", "1", "--no-cuda", "--log-interval", "1",
            "--warmup-epochs", "0"]

    def prepare(self) -> str:
        return Example.prepare(self)

    LOGGED = re.compile(r"Epoch\[0\] (?:Rank\[(\d+)\] )?Batch ?\[(?:\d+-)?(\d+)\]\s+"
                        r"(?:Speed: ([0-9.]+))?")

    def run(self) -> None:
        figures = []
        for mode in ("module", "gluon"):
            self.ctx.a.extra[self.name] = f"--mode {mode}"
            p = self.kolorun(NP, [], f"kolorun-{mode}")
            speeds: list = []
            ranks: set = set()  # gluon: the ranks that logged batch STEPS themselves
            try:
                while len(speeds) < self.STEPS or (mode == "gluon" and len(ranks) < NP):
                    _, m = p.wait_line(self.LOGGED, self.deadline(), what=f"{mode}: a batch")
                    if m.group(3) is not None:
                        speeds.append(float(m.group(3)))
                    elif m.group(1) is not None and int(m.group(2)) >= self.STEPS:
                        ranks.add(int(m.group(1)))
            finally:
                p.kill()
            self.no_traceback(p)
            figures.append(f"{mode}: {len(speeds)} batches logged, {speeds[-1]:.2f} samples/s "
                           f"in all")
        self.figures = "; ".join(figures) + " (stopped there: an epoch is ImageNet's)"


EXAMPLES = [Synthetic, Mnist, MnistNumProc, MnistAdasum, Imagenet, SyntheticElastic, MnistElastic,
            TfSynthetic, TfKerasSynthetic, TfMnist, TfKerasMnist, TfMnistElastic,
            TfKerasMnistElastic, MxMnist, Mx2Mnist, MxImagenet]
NAMES = [e.name for e in EXAMPLES]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="examples: " + ", ".join(NAMES))
    p.add_argument("--horovod-src", required=True,
                   help="a Horovod worktree, bare git dir, or a folder holding its examples")
    p.add_argument("--rev", default=None,
                   help="read the examples from this git revision (default: a worktree's "
                        "files as they are; HEAD of a bare git dir)")
    p.add_argument("--python", default=os.environ.get("KOLO_HOROVOD_PYTHON", sys.executable),
                   help="interpreter with torch and torchvision (default $KOLO_HOROVOD_PYTHON "
                        "or this one)")
    p.add_argument("--mxnet-python",
                   default=os.environ.get("KOLO_MXNET_PYTHON",
                                          os.path.join(REPO, ".venv-mxnet", "bin", "python")),
                   help="interpreter with MXNet 1.9 for the mx_ examples (default "
                        "$KOLO_MXNET_PYTHON or .venv-mxnet)")
    p.add_argument("--bin", default=os.environ.get("KOLO_BIN_DIR",
                                                   os.path.join(REPO, "build", "bin")),
                   help="folder of kolorun and kolo-rendezvous (default $KOLO_BIN_DIR or "
                        "build/bin)")
    p.add_argument("--only", default=",".join(e.name for e in EXAMPLES if e.default),
                   help="comma-separated examples to run (default: all but tf2_mnist, "
                        "tf2_keras_mnist and tf2_keras_mnist_elastic, which run thousands of "
                        "steps as Horovod wrote them)")
    p.add_argument("--work-dir", default=None,
                   help="where the changed copies, data and logs go (default: a temporary "
                        "folder)")
    p.add_argument("--keep", action="store_true", help="keep the temporary work folder")
    p.add_argument("--min-accuracy", type=float, default=90.0,
                   help="the MNIST examples' least final test accuracy, in %% (default 90)")
    p.add_argument("--mnist-train", type=int, default=12000,
                   help="synthetic MNIST training images (default 12000)")
    p.add_argument("--mnist-test", type=int, default=1000,
                   help="synthetic MNIST test images (default 1000)")
    p.add_argument("--timeout-scale", type=float, default=1.0,
                   help="multiplies every example's timeout (default 1)")
    p.add_argument("--args", action="append", default=[], metavar="NAME=ARGS",
                   help="more arguments for one example, e.g. synthetic='--num-iters 5' "
                        "(repeatable; a later option overrides the default)")
    a = p.parse_args(argv)
    only = [n.strip() for n in a.only.split(",") if n.strip()]
    bad = [n for n in only if n not in NAMES]
    if bad:
        p.error(f"unknown example(s) {', '.join(bad)}; known: {', '.join(NAMES)}")
    a.extra = {}
    for item in a.args:
        name, sep, rest = item.partition("=")
        if not sep or name not in NAMES:
            p.error(f"--args {item!r}: expected NAME=ARGS with NAME one of {', '.join(NAMES)}")
        a.extra[name] = (a.extra.get(name, "") + " " + rest).strip()
    a.bin = os.path.abspath(a.bin)
    for b in ("kolorun", "kolo-rendezvous"):
        if not os.access(os.path.join(a.bin, b), os.X_OK):
            p.error(f"no {b} in {a.bin} (build kolo, or pass --bin)")
    frameworks = {c.framework for c in EXAMPLES if c.name in only}
    probes = {"torch": "import torch, torchvision; print('torch', torch.__version__, "
                       "'torchvision', torchvision.__version__)",
              "tensorflow": "import tensorflow as tf, tf_keras; print('tensorflow', "
                            "tf.__version__, 'tf_keras', tf_keras.__version__)",
              "mxnet": "import mxnet, numpy; print('mxnet', mxnet.__version__, 'numpy', "
                       "numpy.__version__)"}
    versions = []
    for fw in sorted(frameworks):
        py = a.mxnet_python if fw == "mxnet" else a.python
        probe = subprocess.run([py, "-c", probes[fw]], capture_output=True, text=True,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        if probe.returncode != 0:
            print(f"run_examples: {py} cannot run the {fw} examples: "
                  f"{probe.stderr.strip().splitlines()[-1:]}", flush=True)
            return 77
        versions.append(probe.stdout.strip())
    versions = "; ".join(versions)
    temp = a.work_dir is None
    a.work_dir = os.path.abspath(a.work_dir or tempfile.mkdtemp(prefix="kolo-horovod-examples."))
    os.makedirs(a.work_dir, exist_ok=True)
    src = Source(a.horovod_src, a.rev)
    ctx = Context(a, src)
    print(f"run_examples: Horovod examples from {src.where}; {a.python} ({versions}); kolo "
          f"from {REPO}; work folder {a.work_dir}", flush=True)
    results = []
    for cls in EXAMPLES:
        if cls.name not in only:
            continue
        ex = cls(ctx)
        t0 = time.monotonic()
        try:
            what = ex.prepare()
            print(f"run_examples: {ex.name}: {what}", flush=True)
            ex.run()
            verdict, detail = "PASS", ex.figures
        except ExampleError as e:
            verdict, detail = "FAIL", f"{e}; logs in {ex.work}"
        results.append(verdict)
        print(f"run_examples: SUMMARY {ex.name}: {verdict} in {time.monotonic() - t0:.0f} s: "
              f"{detail}", flush=True)
    passed, failed = results.count("PASS"), results.count("FAIL")
    print(f"run_examples: {passed} passed, {failed} failed", flush=True)
    if temp and not a.keep and not failed:
        shutil.rmtree(a.work_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
