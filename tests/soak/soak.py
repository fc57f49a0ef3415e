#!/usr/bin/env python3
"""Soak test of elastic training: an elastic job of elastic_worker processes
against an external kolo-rendezvous, for --minutes, while random events are
injected at random moments, one at a time:

  kill        SIGKILL of a worker (rank 0 about a third of the time); a
              replacement joins when fewer than --ranks remain
  term        SIGTERM: the worker leaves at a commit point and exits 0; a
              replacement joins likewise
  stop_short  SIGSTOP for 50 ms .. a quarter of KOLO_TIMEOUT_MS, then SIGCONT:
              nobody is evicted, the round stands, training goes on
  stop_long   SIGSTOP for KOLO_TIMEOUT_MS + 2..7 s: the others re-form
              without it; after SIGCONT it finds itself evicted and joins
              again as a new worker (same process)
  join        one more worker (up to --max-np)
  restart     the rendezvous server is SIGKILLed, training goes on without
              it, and it is restarted on the same port; the workers
              re-register with their round

Each event is checked (who exited how, who re-formed to which size, that
training went on), and before the next one the job must be stable again:
every live worker in the same round, at the size of the live workers, ranks
0..n-1, and stepping. The workers (ELASTIC_WORKER_SOAK=1) check every
allreduce result and their accumulator after every commit against the closed
form of tests/elastic/elastic_worker.c, which holds under any membership
history; each "STEP" line counts as one step checked, a "WRONG" line as a wrong
result. A hang is no STEP line from any worker, or from one live worker that
is not stopped, for --hang-s seconds: diagnostics (every worker's state,
kernel wait channel and last lines, thread stacks when gdb is there, the
server's view of the job) are printed and the run fails.

One worker (the second started) is long-lived: never SIGKILLed or SIGTERMed
(it may be stopped, short or long, so that it does not stay rank 0 for
good). The RSS of every worker (VmRSS, and VmRSS - RssShmem: private) is
sampled once it has done WARM_STEPS steps in a stable round and again at the
end; the growth of every survivor's private RSS must stay within
--rss-bound-mib (the shared-memory rings are sized by the round's shape). At the end every worker gets SIGTERM and must leave with a
correct accumulator. One summary line ("soak: SUMMARY ...") is printed; the
exit status is 0 only when there was no wrong result, no hang, no failed
check and no RSS growth over the bound.

Standard library only. Binaries come from --bin (KOLO_BIN, default build/bin):
kolo-rendezvous and elastic_worker. Nothing is built here."""

import argparse
import collections
import ctypes
import json
import os
import random
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

# Steps a worker does before its RSS is first sampled.
WARM_STEPS = 200
# How long the run may go on past --minutes (the last event's checks, the
# final SIGTERMs) before that is a failed check; soak_2min's ctest timeout
# leaves room for this and the diagnostics.
OVERRUN_S = 45

TOKEN = "soak-token-" + secrets.token_hex(12)


class Failure(Exception):
	"""A failed check: the run stops and reports it."""


class Hang(Exception):
	"""No step progress for --hang-s seconds."""


def now():
	return time.monotonic()


_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
	# PR_SET_PDEATHSIG: a child outlives no killed driver (a ctest timeout).
	_libc.prctl(1, signal.SIGKILL, 0, 0, 0)


def rss_kib(pid, field="VmRSS"):
	try:
		with open("/proc/%d/status" % pid) as f:
			for line in f:
				if line.startswith(field + ":"):
					return int(line.split()[1])
	except OSError:
		pass
	return None


def private_kib(pid):
	"""VmRSS less RssShmem: what the bound is on. The shared-memory rings
	(8 MiB per peer on the host that a rank has a shm connection to) are
	mapped per round and sized by the round's shape (8 to 24 MiB seen), not
	by how long the worker has run; a leak shows in RssAnon or RssFile."""
	rss, shm = rss_kib(pid), rss_kib(pid, "RssShmem")
	return None if rss is None or shm is None else rss - shm


class Worker:
	def __init__(self, soak, name, proc, errpath):
		self.soak = soak
		self.name = name
		self.proc = proc
		self.pid = proc.pid
		self.errpath = errpath
		self.buf = b""
		self.eof = False
		self.status = None  # returncode once reaped
		self.round = -1
		self.size = 0
		self.rank = -1
		self.step = -1
		self.round_steps = 0  # STEP lines since the last ROUND line
		self.steps = 0  # STEP lines in all
		self.rounds = 0
		self.progress_at = now()  # last STEP or ROUND line, or SIGCONT
		self.lines = collections.deque(maxlen=20)
		self.expect = None  # "kill" or "term" once the driver sent it
		self.left = False
		self.started = False  # "START": its SIGTERM handler is in place
		self.term_unhandled = False  # SIGTERMed before "START" was read
		self.failed = ""
		self.stopped = False
		self.long_lived = False
		self.rss_start = self.anon_start = self.priv_start = None
		self.rss_end = self.anon_end = self.priv_end = None
		self.started_at = now()

	@property
	def gone(self):
		return self.status is not None and self.eof

	@property
	def live(self):
		"""Running and not being taken out by the driver."""
		return self.status is None and self.expect is None

	def __str__(self):
		return "%s (pid %d, rank %d, round %d)" % (self.name, self.pid, self.rank, self.round)

	def signal(self, sig):
		if sig == signal.SIGTERM and not self.started:
			self.term_unhandled = True
		self.proc.send_signal(sig)

	def term_ok(self):
		"""A SIGTERMed worker left the job (exit 0 after "LEFT"), or died of
		the signal before its handler was in place: a process just started."""
		return ((self.status == 0 and self.left) or
		        (self.term_unhandled and self.status == -signal.SIGTERM))

	def on_line(self, line):
		self.lines.append(line)
		s = self.soak
		if line.startswith("STEP "):
			self.step = int(line.split()[1])
			self.steps += 1
			self.round_steps += 1
			self.progress_at = now()
			s.steps_checked += 1
			s.last_step_at = self.progress_at
			s.job_steps = max(s.job_steps, self.step)
		elif line.startswith("ROUND "):
			f = line.split()
			self.round, self.size, self.rank = int(f[1]), int(f[3]), int(f[5])
			self.round_steps = 0
			self.rounds += 1
			self.progress_at = now()
			s.rounds_seen.add(self.round)
		elif line.startswith("START"):
			self.started = True
		elif line.startswith("LEFT"):
			self.left = True
		elif line.startswith("WRONG"):
			s.wrong += 1
			s.log("%s: %s" % (self, line))
		elif line.startswith("FAILED") or line.startswith("OPFAIL"):
			self.failed = line
			s.log("%s: %s" % (self, line))


class Soak:
	def __init__(self, a):
		self.a = a
		self.rng = random.Random(a.seed)
		self.bin = a.bin
		self.dir = tempfile.mkdtemp(prefix="kolo-soak-")
		self.job = "soak-" + secrets.token_hex(6)
		self.token_path = os.path.join(self.dir, "token")
		with open(self.token_path, "w") as f:
			f.write(TOKEN)
		self.sel = selectors.DefaultSelector()
		self.workers = []
		self.n_started = 0
		self.server = None
		self.port = 0
		self.t0 = now()
		self.hard_end = self.t0 + a.minutes * 60 + OVERRUN_S
		self.events = collections.Counter()
		self.rank0_victims = 0
		self.rounds_seen = set()
		self.steps_checked = 0
		self.job_steps = 0
		self.last_step_at = now()
		self.wrong = 0
		self.hangs = 0
		self.failures = []
		self.rss_over = []
		self.init_failures = 0
		self.victim_at = -1e9  # when the driver last took a worker out
		self.timeout_ms = a.timeout_ms
		self.last_rss_log = now()

	# ---- output -----------------------------------------------------------

	def log(self, msg):
		print("[%8.1fs] %s" % (now() - self.t0, msg), flush=True)

	# ---- processes --------------------------------------------------------

	def start_server(self):
		logpath = os.path.join(self.dir, "server.log")
		lf = open(logpath, "ab")
		off = lf.tell()
		argv = [os.path.join(self.bin, "kolo-rendezvous"), "--listen",
		        "127.0.0.1:%d" % self.port, "--token-file", self.token_path,
		        "--min-np", str(self.a.min_np), "--max-np", str(self.a.max_np),
		        "--settle-ms", "300", "--lease-ms", str(self.a.lease_ms)]
		env = {k: v for k, v in os.environ.items()
		       if not k.startswith("KOLO_") and not k.startswith("HOROVOD_")}
		self.server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=lf,
		                               stderr=subprocess.STDOUT, env=env,
		                               preexec_fn=_die_with_parent)
		lf.close()
		end = now() + 20
		while now() < end:
			with open(logpath, "rb") as f:
				f.seek(off)
				text = f.read().decode(errors="replace")
			i = text.find("listening on ")
			if i >= 0 and "\n" in text[i:]:
				port = int(text[i:].split("\n")[0].rsplit(":", 1)[1])
				if self.port and port != self.port:
					raise Failure("the server restarted on port %d, not %d" % (port, self.port))
				self.port = port
				return
			if self.server.poll() is not None:
				raise Failure("the server exited (%s): %s" % (self.server.returncode, text))
			self.pump(0.05)
		raise Failure("the server did not say it was listening within 20 s")

	def kill_server(self):
		self.server.send_signal(signal.SIGKILL)
		self.server.wait()

	def start_worker(self):
		self.n_started += 1
		name = "w%d" % self.n_started
		errpath = os.path.join(self.dir, name + ".err")
		env = {k: v for k, v in os.environ.items()
		       if not k.startswith("KOLO_") and not k.startswith("HOROVOD_")}
		env.update({
		        "KOLO_RENDEZVOUS": "http://127.0.0.1:%d" % self.port,
		        "KOLO_JOB": self.job,
		        "KOLO_TOKEN": TOKEN,
		        "KOLO_TOKEN_FILE": "",
		        "KOLO_LAUNCHER_FD": "-1",
		        "KOLO_ELASTIC": "1",
		        "KOLO_IFACE": "127.0.0.1",
		        "KOLO_HEARTBEAT_MS": "300",
		        "KOLO_TIMEOUT_MS": str(self.timeout_ms),
		        # Long stops evict a worker that then joins again, as often
		        # as the soak stops it; 3 is the default limit.
		        "KOLO_ELASTIC_REJOINS": "1000000",
		        "ELASTIC_WORKER_SOAK": "1",
		})
		if self.a.inject == "wrong" and self.n_started == 2:  # the long-lived one
			env["ELASTIC_WORKER_CORRUPT"] = "300"
		if self.a.shm is not None:
			env["KOLO_SHM"] = self.a.shm
		argv = [os.path.join(self.bin, "elastic_worker"), "1000000000000", str(self.a.count),
		        str(self.a.step_ms)]
		if self.a.use_async:
			argv.append("async")
		with open(errpath, "wb") as ef:
			p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
			                     stderr=ef, env=env, preexec_fn=_die_with_parent)
		os.set_blocking(p.stdout.fileno(), False)
		w = Worker(self, name, p, errpath)
		self.sel.register(p.stdout, selectors.EVENT_READ, w)
		self.workers.append(w)
		return w

	def alive(self):
		"""Workers that are running and not being taken out."""
		return [w for w in self.workers if w.live]

	def pump(self, seconds):
		"""Reads the workers' lines and reaps exits for `seconds`, then
		checks for a hang."""
		end = now() + seconds
		while True:
			left = end - now()
			for key, _ in self.sel.select(timeout=max(0.0, min(left, 0.2))):
				w = key.data
				try:
					data = os.read(key.fd, 65536)
				except BlockingIOError:
					continue
				if not data:
					self.sel.unregister(key.fileobj)
					key.fileobj.close()
					w.eof = True
					continue
				w.buf += data
				*lines, w.buf = w.buf.split(b"\n")
				for line in lines:
					w.on_line(line.decode(errors="replace"))
			for w in self.workers:
				if w.status is None and w.proc.poll() is not None:
					w.status = w.proc.returncode
					if w.expect is None and self.first_round_lost(w):
						# kolo_init takes the next round when its first one loses
						# a member while connecting: failing there is a bug.
						self.init_failures += 1
						raise Failure("%s: kolo_init failed when its first round lost a member"
						              " while connecting: %s" % (w, self.init_error(w)))
					elif w.expect is None:
						raise Failure("%s exited unexpectedly with status %s; last lines: %s"
						              % (w, w.status, list(w.lines)[-5:]))
			self.sample_rss_start()
			if self.wrong:
				raise Failure("a worker computed a wrong result")
			self.check_hang()
			if now() > self.hard_end:
				raise Failure("the run is still going %.0f s after its end (an event's checks"
				              " overran)" % (now() - self.hard_end + OVERRUN_S))
			if now() - self.last_rss_log > 60:
				self.last_rss_log = now()
				ll = self.long_lived()
				if ll:
					self.log("RSS of the long-lived %s: %s KiB (RssAnon %s, RssShmem %s)"
					         % (ll.name, rss_kib(ll.pid), rss_kib(ll.pid, "RssAnon"),
					            rss_kib(ll.pid, "RssShmem")))
			if now() >= end:
				return

	def init_error(self, w):
		try:
			with open(w.errpath, errors="replace") as f:
				for line in f:
					if line.startswith("kolo_init: "):
						return line.strip()
		except OSError:
			pass
		return ""

	def first_round_lost(self, w):
		"""A joiner's kolo_init() fails when a member of its first round dies
		while that round connects (the survivors' kolo_reform() goes on to
		the next round; kolo_init() does not). Only that, right after the
		driver took a worker out, is not a failed check; it is counted and
		reported."""
		e = self.init_error(w)
		return (w.rounds == 0 and w.status == 3 and "connecting the ring" in e and
		        now() - self.victim_at < 30)

	def wait(self, pred, seconds, what):
		end = now() + seconds
		while not pred():
			if now() >= end:
				raise Failure("%s: not within %.0f s" % (what, seconds))
			self.pump(0.02)

	def check_hang(self):
		t = now()
		if t - self.last_step_at > self.a.hang_s:
			raise Hang("no worker completed a step for %.0f s" % (t - self.last_step_at))
		for w in self.alive():
			if not w.stopped and t - w.progress_at > self.a.hang_s:
				raise Hang("%s printed nothing for %.0f s" % (w, t - w.progress_at))

	def long_lived(self):
		for w in self.workers:
			if w.long_lived:
				return w
		return None

	# ---- the job's state --------------------------------------------------

	def stable(self, steps=3):
		ws = self.alive()
		if not ws or any(w.stopped for w in ws):
			return False
		r = ws[0].round
		return (r >= 0 and all(w.round == r and w.size == len(ws) and w.round_steps >= steps
		                       for w in ws) and
		        sorted(w.rank for w in ws) == list(range(len(ws))))

	def wait_stable(self, what, seconds=90):
		self.wait(self.stable, seconds, what + ": the job is not stable again")
		self.sample_rss_start()

	def sample_rss_start(self):
		"""A worker's first RSS sample, once it has done WARM_STEPS steps in
		a stable round: each round maps new shared-memory rings (16 MiB with
		two ring neighbours on the host) that its first steps touch, which is
		no growth. The end sample is taken the same way."""
		if not self.stable(WARM_STEPS):
			return
		for w in self.alive():
			if w.rss_start is None:
				w.rss_start, w.priv_start = rss_kib(w.pid), private_kib(w.pid)
				w.anon_start = rss_kib(w.pid, "RssAnon")

	def by_rank(self, rank):
		for w in self.alive():
			if w.rank == rank:
				return w
		return None

	def job_status(self):
		req = urllib.request.Request("http://127.0.0.1:%d/v1/jobs/%s" % (self.port, self.job),
		                             headers={"Authorization": "Bearer " + TOKEN})
		try:
			with urllib.request.urlopen(req, timeout=2) as r:
				return json.loads(r.read())
		except (OSError, urllib.error.URLError, ValueError) as e:
			return {"error": str(e)}

	def random_moment(self):
		"""A random point of a step: victims are hit anywhere in it."""
		self.pump(self.rng.uniform(0, max(0.03, 3 * self.a.step_ms / 1000)))

	# ---- events -----------------------------------------------------------

	def pick_victim(self):
		cands = [w for w in self.alive() if not w.long_lived]
		r0 = self.by_rank(0)
		if r0 in cands and self.rng.random() < 1 / 3:
			return r0
		return self.rng.choice(cands)

	def reform_without(self, victim, old_round, what, seconds=30):
		others = [w for w in self.alive() if w is not victim]
		self.wait(lambda: all(w.round > old_round for w in others), seconds,
		          "%s: the others did not re-form" % what)

	def ev_exit(self, kind):
		sig = signal.SIGKILL if kind == "kill" else signal.SIGTERM
		v = self.pick_victim()
		old_round = v.round
		if v.rank == 0:
			self.rank0_victims += 1
		self.random_moment()
		t = now()
		v.expect = kind
		self.victim_at = now()
		v.signal(sig)
		early = self.rng.random() < 0.5
		if early and len(self.alive()) < self.a.ranks:
			self.start_worker()  # while the others re-form, as kolorun --restart-failed
		self.reform_without(v, old_round, "%s of %s" % (kind, v))
		ms = (now() - t) * 1000
		self.wait(lambda: v.gone, 15, "%s of %s: it did not exit" % (kind, v))
		if kind == "kill" and v.status != -signal.SIGKILL:
			raise Failure("%s: status %s after SIGKILL" % (v, v.status))
		if kind == "term" and not v.term_ok():
			raise Failure("%s: status %s, LEFT %s after SIGTERM; last lines %s"
			              % (v, v.status, v.left, list(v.lines)[-5:]))
		if len(self.alive()) < self.a.ranks:
			self.start_worker()
		self.wait_stable("%s of %s" % (kind, v))
		return "%s of %s: re-formed in %.0f ms; size %d" % (kind, v, ms, len(self.alive()))

	def ev_stop_short(self):
		v = self.rng.choice(self.alive())
		rounds = {w.name: w.round for w in self.alive()}
		ms = self.rng.uniform(50, self.timeout_ms / 4)
		self.random_moment()
		v.stopped = True
		v.proc.send_signal(signal.SIGSTOP)
		self.pump(ms / 1000)
		v.proc.send_signal(signal.SIGCONT)
		v.stopped = False
		v.progress_at = now()
		base = {w.name: w.steps for w in self.alive()}
		self.wait(lambda: all(w.steps >= base[w.name] + 5 for w in self.alive()), 30,
		          "short stop of %s: training did not go on" % v)
		moved = [w for w in self.alive() if w.round != rounds.get(w.name)]
		if moved:
			raise Failure("a stop of %.0f ms (KOLO_TIMEOUT_MS %d) of %s re-formed the job: %s"
			              % (ms, self.timeout_ms, v, ", ".join(map(str, moved))))
		return "stop_short of %s for %.0f ms: no re-form" % (v, ms)

	def ev_stop_long(self):
		ws = self.alive()
		ll = self.long_lived()
		# The long-lived worker becomes rank 0 once the older ones are gone;
		# a long stop of it makes it the youngest again.
		v = ll if ll in ws and ll.rank == 0 and self.rng.random() < 0.5 else self.rng.choice(ws)
		old_round = v.round
		ms = self.timeout_ms + self.rng.uniform(2000, 7000)
		self.random_moment()
		t = now()
		v.stopped = True
		self.victim_at = now()
		v.proc.send_signal(signal.SIGSTOP)
		self.reform_without(v, old_round, "long stop of %s" % v,
		                    seconds=self.timeout_ms / 1000 + 20)
		reform_ms = (now() - t) * 1000
		others = [w for w in self.alive() if w is not v]
		if any(w.size != len(others) for w in others):
			raise Failure("long stop of %s: the others are at sizes %s, not %d"
			              % (v, [w.size for w in others], len(others)))
		self.pump(max(0, t + ms / 1000 - now()))
		v.proc.send_signal(signal.SIGCONT)
		v.stopped = False
		v.progress_at = now()
		self.wait_stable("long stop of %s" % v)
		return ("stop_long of %s for %.0f ms: the others re-formed in %.0f ms, it joined again"
		        " as rank %d of %d" % (v.name, ms, reform_ms, v.rank, v.size))

	def ev_join(self):
		w = self.start_worker()
		t = now()
		self.wait_stable("join of %s" % w.name)
		return "join of %s: in as rank %d of %d after %.0f ms" % (w.name, w.rank, w.size,
		                                                            (now() - t) * 1000)

	def ev_restart(self):
		self.random_moment()
		self.kill_server()
		down = self.rng.uniform(0.5, 5)
		base = {w.name: w.steps for w in self.alive()}
		self.pump(down)
		self.wait(lambda: all(w.steps >= base[w.name] + 5 for w in self.alive()), 30,
		          "training stopped with the server")
		self.start_server()
		n = len(self.alive())

		def back():
			st = self.job_status()
			self.pump(0.1)
			return len(st.get("members", [])) == n and st.get("waiting") == []

		self.wait(back, 30, "the workers did not re-register with the restarted server")
		self.wait_stable("server restart")
		return "restart of the server after %.1f s down: %d workers back" % (down, n)

	def ev_double(self):
		"""Two of kill, term, join and restart within 1.5 s, the second hitting
		the re-form of the first (or the server's downtime): only the
		outcome is checked, victims' exits and a stable job after."""
		n = len(self.alive())
		kinds = []
		for _ in range(2):
			ks = ["join", "restart"]
			if n - 1 >= self.a.min_np:
				ks += ["kill", "term"]
			if n >= self.a.max_np:
				ks.remove("join")
			if "restart" in kinds:
				ks.remove("restart")
			k = self.rng.choice(ks)
			kinds.append(k)
			n += {"kill": -1, "term": -1, "join": 1}.get(k, 0)
		plan = []  # (seconds from now, action)
		t2 = self.rng.uniform(0, 1.5)
		for k, t in zip(kinds, (0.0, t2)):
			if k == "restart":
				plan += [(t, "server_down"), (t + self.rng.uniform(0.2, 3), "server_up")]
			else:
				plan.append((t, k))
		plan.sort()
		self.random_moment()
		t0 = now()
		victims = []
		for t, act in plan:
			self.pump(max(0, t0 + t - now()))
			if act == "server_down":
				self.kill_server()
			elif act == "server_up":
				self.start_server()
			elif act == "join":
				self.start_worker()
			else:
				v = self.pick_victim()
				victims.append((v, act))
				v.expect = act
				self.victim_at = now()
				if v.rank == 0:
					self.rank0_victims += 1
				v.signal(signal.SIGKILL if act == "kill" else signal.SIGTERM)
		for v, act in victims:
			self.wait(lambda: v.gone, 30, "%s of %s: it did not exit" % (act, v))
			if act == "kill" and v.status != -signal.SIGKILL:
				raise Failure("%s: status %s after SIGKILL" % (v, v.status))
			if act == "term" and not v.term_ok():
				raise Failure("%s: status %s, LEFT %s after SIGTERM; last lines %s"
				              % (v, v.status, v.left, list(v.lines)[-5:]))
		while len(self.alive()) < self.a.ranks:
			self.start_worker()
		self.wait_stable("double (%s)" % ", ".join(a for _, a in plan), seconds=120)
		return "double: %s; %s; size %d after %.0f ms" % (
		        ", ".join("%s at +%.0f ms" % (a, t * 1000) for t, a in plan),
		        ", ".join("%s was rank %d" % (v.name, v.rank) for v, _ in victims) or "no victim",
		        len(self.alive()), (now() - t0) * 1000)

	def next_event(self):
		n = len(self.alive())
		kinds = [("kill", 3), ("term", 2), ("stop_short", 2), ("join", 2), ("restart", 1),
		         ("double", 2)]
		if n - 1 >= self.a.min_np + 1:
			kinds.append(("stop_long", 1))
		kinds = [(k, p) for k, p in kinds if k != "join" or n < self.a.max_np]
		if n - 1 < self.a.min_np:
			kinds = [(k, p) for k, p in kinds if k not in ("kill", "term", "double")]
		return self.rng.choices([k for k, _ in kinds], [p for _, p in kinds])[0]

	def event(self, kind):
		self.events[kind] += 1
		rounds = len(self.rounds_seen)
		if kind in ("kill", "term"):
			msg = self.ev_exit(kind)
		else:
			msg = getattr(self, "ev_" + kind)()
		self.log("event %d: %s (rounds seen %d -> %d)" % (sum(self.events.values()), msg,
		                                                    rounds, len(self.rounds_seen)))

	# ---- the run ----------------------------------------------------------

	def run(self):
		a = self.a
		end = self.t0 + a.minutes * 60
		self.start_server()
		self.log("server on port %d, job %s, logs in %s, seed %d" % (self.port, self.job,
		                                                             self.dir, a.seed))
		for i in range(a.ranks):
			w = self.start_worker()
			if i == min(1, a.ranks - 1):
				w.long_lived = True
		self.wait_stable("start")
		self.wait(lambda: self.stable(WARM_STEPS), 60, "start: no %d steps" % WARM_STEPS)
		self.sample_rss_start()
		ll = self.long_lived()
		self.log("%d workers stable in round %d; long-lived %s, RSS %s KiB"
		         % (a.ranks, ll.round, ll.name, ll.rss_start))
		if a.inject == "hang":
			# The detector's own check: every worker stopped behind the
			# driver's back, so that no step completes any more.
			self.log("--inject hang: SIGSTOP of every worker, not announced")
			for w in self.alive():
				w.proc.send_signal(signal.SIGSTOP)
		# The last event must end before the time is up: none starts in the
		# last 20 s (a long stop takes about 15 s).
		while now() < end - 20:
			if len(self.alive()) < a.ranks:  # after init_failures
				while len(self.alive()) < a.ranks:
					self.start_worker()
				self.wait_stable("replacing workers whose kolo_init failed")
			self.pump(self.rng.uniform(0, a.gap_s))
			self.event(self.next_event())
		self.pump(max(0, end - now()))
		self.wait_stable("end")
		self.wait(lambda: self.stable(WARM_STEPS), 60, "end: no %d steps" % WARM_STEPS)
		for w in self.alive():
			w.rss_end, w.priv_end = rss_kib(w.pid), private_kib(w.pid)
			w.anon_end = rss_kib(w.pid, "RssAnon")
		self.finish()

	def finish(self):
		ws = self.alive()
		for w in ws:
			w.expect = "term"
			w.signal(signal.SIGTERM)
		self.wait(lambda: all(w.gone for w in ws), 30, "SIGTERM at the end: workers still run")
		bad = [w for w in ws if not w.term_ok()]
		if bad:
			raise Failure("at the end: %s" % ", ".join(
			        "%s status %s LEFT %s %s" % (w, w.status, w.left, w.failed) for w in bad))

	def diagnose(self):
		print("---- diagnostics ----", flush=True)
		print("server: pid %s running %s; job: %s"
		      % (self.server.pid if self.server else None,
		         self.server is not None and self.server.poll() is None,
		         json.dumps(self.job_status())[:4000]), flush=True)
		for w in self.workers:
			if w.gone:
				continue
			state = wchan = "?"
			try:
				with open("/proc/%d/stat" % w.pid) as f:
					state = f.read().rsplit(")", 1)[1].split()[0]
				with open("/proc/%d/wchan" % w.pid) as f:
					wchan = f.read()
			except OSError:
				pass
			print("%s: state %s wchan %s step %d size %d stopped %s, %.1f s since progress"
			      % (w, state, wchan, w.step, w.size, w.stopped, now() - w.progress_at))
			print("  last lines: %s" % list(w.lines)[-8:])
			try:
				with open(w.errpath, "rb") as f:
					f.seek(0, 2)
					f.seek(max(0, f.tell() - 2000))
					print("  stderr tail:\n    " +
					      f.read().decode(errors="replace").replace("\n", "\n    "))
			except OSError:
				pass
			if state == "T":
				print("  threads: not shown (the process is stopped)")
			elif shutil.which("gdb") and w.status is None:
				try:
					bt = subprocess.run(["gdb", "-p", str(w.pid), "-batch", "-ex",
					                     "thread apply all bt 12"], capture_output=True,
					                    text=True, timeout=8).stdout
					print("  threads:\n    " + "\n    ".join(
					        l for l in bt.splitlines() if l.startswith(("#", "Thread"))))
				except (OSError, subprocess.TimeoutExpired):
					pass
		sys.stdout.flush()

	def cleanup(self):
		for w in self.workers:
			if w.status is None:
				w.proc.send_signal(signal.SIGCONT)
				w.proc.kill()
				w.proc.wait()
		if self.server and self.server.poll() is None:
			self.kill_server()

	def rss_check(self):
		for w in self.workers:
			if w.priv_start is not None and w.priv_end is not None:
				if w.priv_end - w.priv_start > self.a.rss_bound_mib * 1024:
					self.rss_over.append(w)

	def summary(self, wall):
		ll = self.long_lived()
		growth = [(w.priv_end - w.priv_start) for w in self.workers
		          if w.priv_start is not None and w.priv_end is not None]
		ok = not (self.wrong or self.hangs or self.failures or self.rss_over)
		ev = " ".join("%s=%d" % (k, self.events[k])
		              for k in ("kill", "term", "stop_short", "stop_long", "join", "restart",
		                        "double"))
		print("soak: SUMMARY minutes=%g seed=%d wall=%.0fs events=%d (%s rank0_victims=%d)"
		      " reforms=%d steps_checked=%d job_steps=%d wrong=%d hangs=%d failures=%d"
		      " init_failures=%d"
		      " rss_long_lived(%s)=%sKiB->%sKiB private=%sKiB->%sKiB"
		      " max_private_growth=%sKiB bound=%dKiB"
		      " workers=%d result=%s"
		      % (self.a.minutes, self.a.seed, wall, sum(self.events.values()), ev,
		         self.rank0_victims, max(0, len(self.rounds_seen) - 1), self.steps_checked,
		         self.job_steps, self.wrong, self.hangs, len(self.failures), self.init_failures,
		         ll.name if ll else "-", ll.rss_start if ll else "-",
		         ll.rss_end if ll else "-", ll.priv_start if ll else "-",
		         ll.priv_end if ll else "-", max(growth) if growth else "-",
		         self.a.rss_bound_mib * 1024, self.n_started, "PASS" if ok else "FAIL"),
		      flush=True)
		return ok


def main():
	p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
	                            formatter_class=argparse.RawDescriptionHelpFormatter)
	p.add_argument("--minutes", type=float, required=True)
	p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
	p.add_argument("--ranks", type=int, default=4, help="workers kept running (default 4)")
	p.add_argument("--min-np", type=int, default=2)
	p.add_argument("--max-np", type=int, default=6)
	p.add_argument("--count", type=int, default=4096, help="float64 per allreduce")
	p.add_argument("--step-ms", type=int, default=10, help="sleep after each step")
	p.add_argument("--timeout-ms", type=int, default=4000, help="KOLO_TIMEOUT_MS")
	p.add_argument("--lease-ms", type=int, default=10000, help="the server's lease")
	p.add_argument("--gap-s", type=float, default=3.0, help="most time between events")
	p.add_argument("--hang-s", type=float, default=60.0, help="no progress this long: a hang")
	p.add_argument("--rss-bound-mib", type=int, default=8,
	               help="most growth of a worker's private RSS (VmRSS - RssShmem)")
	p.add_argument("--shm", default=None, help="KOLO_SHM for the workers (default: auto)")
	p.add_argument("--async", dest="use_async", action="store_true",
	               help="allreduces through the fusion engine")
	p.add_argument("--bin", default=os.environ.get("KOLO_BIN", "build/bin"))
	p.add_argument("--keep-logs", action="store_true")
	p.add_argument("--inject", choices=("hang", "wrong"),
	               help="check the checker: stop a worker for good (found as a hang), or"
	                    " corrupt the long-lived worker's accumulator at step 300 (a wrong result);"
	                    " the run must then fail")
	a = p.parse_args()
	if a.seed is None:
		a.seed = secrets.randbelow(1 << 31)
	if not (1 <= a.min_np < a.ranks <= a.max_np):
		p.error("need 1 <= --min-np < --ranks <= --max-np")
	for b in ("kolo-rendezvous", "elastic_worker"):
		if not os.access(os.path.join(a.bin, b), os.X_OK):
			p.error("no %s in %s (build first, or set KOLO_BIN)" % (b, a.bin))
	signal.signal(signal.SIGPIPE, signal.SIG_DFL)
	s = Soak(a)
	t0 = now()
	try:
		s.run()
	except Hang as e:
		s.hangs += 1
		s.log("HANG: %s" % e)
		s.diagnose()
	except Failure as e:
		s.failures.append(str(e))
		s.log("FAILED: %s" % e)
		s.diagnose()
	except KeyboardInterrupt:
		s.failures.append("interrupted")
	finally:
		s.cleanup()
	s.rss_check()
	for w in s.rss_over:
		s.log("private RSS of %s grew from %d to %d KiB (bound %d MiB)"
		      % (w.name, w.priv_start, w.priv_end, a.rss_bound_mib))
	for w in s.workers:
		if w.rss_start is not None and w.rss_end is not None:
			s.log("RSS %s: %d -> %d KiB; private %d -> %d KiB (%+d; RssAnon %s -> %s) over"
			      " %.0f s, %d rounds%s"
			      % (w.name, w.rss_start, w.rss_end, w.priv_start, w.priv_end,
			         w.priv_end - w.priv_start, w.anon_start, w.anon_end,
			         now() - w.started_at, w.rounds, ", long-lived" if w.long_lived else ""))
	ok = s.summary(now() - t0)
	if ok and not a.keep_logs:
		shutil.rmtree(s.dir, ignore_errors=True)
	else:
		print("soak: logs in %s" % s.dir, flush=True)
	return 0 if ok else 1


if __name__ == "__main__":
	sys.exit(main())
