#!/usr/bin/env bash
# bench-side-by-side.sh: kolo's allreduce against Gloo and Open MPI on this machine (loopback),
# the implementations interleaved so that a change of load hits all of them alike.
#
#   scripts/bench-side-by-side.sh [--rounds R] [--ranks "2 4"] [--sizes "64M 8"]
#                                 [--sweep [MIN MAX FACTOR]] [--oop] [--quick]
#                                 [--iters N] [--warmup N] [--big-iters N] [--json DIR]
#
# For each round (default 3), each rank count (default 2 and 4) and each size (default 64 MiB,
# the headline, and 8 bytes, the latency), back to back: kolo as shipped (ranks of one host
# talk through shared memory), kolo with KOLO_SHM=0 (loopback TCP), Gloo's ring_chunked, Open
# MPI with its TCP transport forced (--mca btl tcp,self --mca btl_tcp_if_include lo) and Open MPI
# as launched by default (shared memory, vader); at sizes up to 64 KiB also Gloo's default
# gloo::allreduce(). --oop adds kolo TCP and Open MPI TCP out of place. Everything else runs in
# place (Gloo's ring_chunked only works in place). float32 sum throughout. Every run uses
# --check; the script exits 1 if any run fails or reports wrong != 0.
#
# --sweep runs one sweep per implementation instead (-b MIN -e MAX -f FACTOR, default 1K 256M 4,
# the tools' default iteration counts; Gloo's default algorithm left out: it takes up to 600 ms
# per call from 32 KiB up). Without --iters, sizes up to 4 KiB run 2000 iterations after 200
# warmups, larger ones the tools' defaults (about 1 GiB per size; 16 after 3 at 64 MiB).
# --big-iters N (with --sweep and an integer FACTOR): sizes above 1 MiB run N iterations after
# N/5 warmups (at least 2) and the smaller ones the tools' defaults, as two sweeps per
# implementation: a short sweep whose small sizes still get the iterations that bring every
# implementation to its steady state (kolo's adaptive spin among them).
# --quick: one round, sizes 4M and 8, 5 iterations (200 at 8 bytes).
# --json DIR: also keep the figures as data in DIR (created): allreduce.jsonl, every row of every
# run (the benchmarks' --json objects, each with "round", "impl", "label" and "launched" added);
# rounds.jsonl, each round's start, load average and tcp_pump result; meta.json, the machine, the
# peers' versions and the peers left out (with the reason). bench/plot.py reads them.
#
# Prints the load average and the loopback TCP ceiling (tcp_pump) before each round, a table
# per round with the speed ratios of kolo against the peers, then the medians over the rounds.
#
# Environment: KOLO_BIN (folder with kolorun and kolo-bench; default: build kolo into build/
# and use build/bin), PEERS_BIN (where bench/peers is built; default KOLO_BIN/../peers), OUT
# (folder for the raw outputs; default a new one under /tmp). A peer that is not installed
# (Debian: apt-get install -y libgloo-dev openmpi-bin libopenmpi-dev) is skipped with a line
# saying so.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
rounds=3
ranks="2 4"
sizes="64M 8"
sweep=""
oop=0
iters=""
warmup=""
quick=0
big_iters=""
json=""
argv="$*"

usage() {
	sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) rounds=${2:?}; shift 2 ;;
	--ranks) ranks=${2:?}; shift 2 ;;
	--sizes) sizes=${2:?}; shift 2 ;;
	--sweep)
		sweep="1K 256M 4"
		shift
		if [ $# -ge 3 ] && [[ $1 != --* ]]; then
			sweep="$1 $2 $3"
			shift 3
		fi
		;;
	--oop) oop=1; shift ;;
	--iters) iters=${2:?}; shift 2 ;;
	--warmup) warmup=${2:?}; shift 2 ;;
	--quick) quick=1; shift ;;
	--json) json=${2:?}; shift 2 ;;
	--big-iters) big_iters=${2:?}; shift 2 ;;
	-h | --help) usage ;;
	*) echo "bench-side-by-side.sh: unknown option '$1'" >&2; usage ;;
	esac
done
if [ "$quick" = 1 ]; then
	rounds=1
	sizes="4M 8"
fi
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "--rounds: a positive number" >&2; exit 2; }
if [ -n "$big_iters" ]; then
	[[ $big_iters =~ ^[1-9][0-9]*$ ]] || { echo "--big-iters: a positive number" >&2; exit 2; }
	[ -n "$sweep" ] && [[ $(cut -d' ' -f3 <<<"$sweep") =~ ^[2-9][0-9]*$ ]] || {
		echo "--big-iters: only with --sweep and an integer FACTOR of at least 2" >&2
		exit 2
	}
	[ -z "$iters" ] || { echo "--big-iters and --iters exclude each other" >&2; exit 2; }
fi

out=${OUT:-$(mktemp -d /tmp/kolo-side.XXXXXX)}
mkdir -p "$out"
if [ -n "$json" ]; then
	mkdir -p "$json"
	json=$(cd "$json" && pwd)
	: >"$json/allreduce.jsonl"
	: >"$json/rounds.jsonl"
fi

# kolo: KOLO_BIN, or a build of this tree
if [ -n "${KOLO_BIN:-}" ]; then
	bin=$KOLO_BIN
else
	echo "## building kolo into $root/build"
	cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build "$root/build" -j"$(nproc)" >"$out/build.log" 2>&1 || {
		echo "kolo's build failed (see $out/build.log)" >&2
		exit 1
	}
	bin=$root/build/bin
fi
for b in kolorun kolo-bench; do
	[ -x "$bin/$b" ] || { echo "no $bin/$b: build first or set KOLO_BIN" >&2; exit 2; }
done
bin=$(cd "$bin" && pwd)

# the peers: built from bench/peers when installed, skipped otherwise
peers=$(realpath -m "${PEERS_BIN:-$(dirname "$bin")/peers}") # make -C needs it absolute
have_gloo=0 have_mpi=0
skip_gloo="" skip_mpi=""
make -s -C "$root/bench/peers" O="$peers" pump >"$out/peers-build.log" 2>&1 || {
	echo "bench/peers: tcp_pump does not build (see $out/peers-build.log)" >&2
	exit 1
}
if [ -f /usr/include/gloo/allreduce_ring_chunked.h ]; then
	make -s -C "$root/bench/peers" O="$peers" gloo >>"$out/peers-build.log" 2>&1 || {
		echo "bench/peers: gloo_bench does not build (see $out/peers-build.log)" >&2
		exit 1
	}
	have_gloo=1
else
	skip_gloo="libgloo-dev is not installed (apt-get install -y libgloo-dev)"
	echo "## skipping Gloo: $skip_gloo"
fi
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
	make -s -C "$root/bench/peers" O="$peers" mpi >>"$out/peers-build.log" 2>&1 || {
		echo "bench/peers: mpi_bench does not build (see $out/peers-build.log)" >&2
		exit 1
	}
	have_mpi=1
else
	skip_mpi="no mpicc/mpirun (apt-get install -y openmpi-bin libopenmpi-dev)"
	echo "## skipping Open MPI: $skip_mpi"
fi

mpirun_=(mpirun --allow-run-as-root --oversubscribe)
mpi_tcp=(--mca btl "tcp,self" --mca btl_tcp_if_include lo)

# bytes SIZE: "64M" -> 67108864
bytes() {
	local v=${1%[KkMmGg]} m=1
	case "$1" in
	*[Kk]) m=1024 ;;
	*[Mm]) m=1048576 ;;
	*[Gg]) m=1073741824 ;;
	esac
	echo $((v * m))
}

# The implementations in the order they run: NAME|LABEL. Gloo's default algorithm only at
# sizes up to 64 KiB (see above).
impls() { # impls MAXBYTES
	echo "kolo_tcp|kolo TCP (KOLO_SHM=0), in place"
	[ "$oop" = 0 ] || echo "kolo_tcp_oop|kolo TCP, out of place"
	echo "kolo|kolo default (shm), in place"
	if [ "$have_gloo" = 1 ]; then
		echo "gloo|Gloo ring_chunked (TCP), in place"
		[ "$1" -gt 65536 ] || echo "gloo_default|Gloo allreduce() (TCP), in place"
	fi
	if [ "$have_mpi" = 1 ]; then
		echo "mpi_tcp|Open MPI TCP forced, in place"
		[ "$oop" = 0 ] || echo "mpi_tcp_oop|Open MPI TCP, out of place"
		echo "mpi|Open MPI default (sm), in place"
	fi
}

# run NAME N ARGS...: one run of implementation NAME on N ranks with the bench ARGS; appends
# its JSON rows, tagged with the round, N and NAME, to $out/results.tsv.
failed=0
run() {
	local name=$1 n=$2 rc=0
	shift 2
	local args=("$@" --check --json) log="$out/r$round.n$n.$name"
	[ ! -e "$log.out" ] || log="$log.2" # the second half of a --big-iters sweep
	local t=(timeout -k 5 900)
	case "$name" in
	kolo_tcp) KOLO_SHM=0 KOLO_LOG_LEVEL=warn "${t[@]}" "$bin/kolorun" -np "$n" -- \
		"$bin/kolo-bench" allreduce "${args[@]}" --inplace ;;
	kolo_tcp_oop) KOLO_SHM=0 KOLO_LOG_LEVEL=warn "${t[@]}" "$bin/kolorun" -np "$n" -- \
		"$bin/kolo-bench" allreduce "${args[@]}" ;;
	kolo) KOLO_LOG_LEVEL=warn "${t[@]}" "$bin/kolorun" -np "$n" -- \
		"$bin/kolo-bench" allreduce "${args[@]}" --inplace ;;
	gloo) "${t[@]}" "$peers/gloo_bench" -np "$n" "${args[@]}" --algo ring_chunked ;;
	gloo_default) "${t[@]}" "$peers/gloo_bench" -np "$n" "${args[@]}" --algo default --inplace ;;
	mpi_tcp) "${t[@]}" "${mpirun_[@]}" -np "$n" "${mpi_tcp[@]}" "$peers/mpi_bench" \
		"${args[@]}" --inplace ;;
	mpi_tcp_oop) "${t[@]}" "${mpirun_[@]}" -np "$n" "${mpi_tcp[@]}" "$peers/mpi_bench" \
		"${args[@]}" ;;
	mpi) "${t[@]}" "${mpirun_[@]}" -np "$n" "$peers/mpi_bench" "${args[@]}" --inplace ;;
	esac </dev/null >"$log.out" 2>"$log.err" || rc=$?
	if [ "$rc" != 0 ]; then
		echo "## $name on $n ranks ($*) exited $rc (see $log.err)"
		failed=1
	fi
	grep -o '{.*}' "$log.out" | sed "s/^/$round\t$n\t$name\t/" >>"$out/results.tsv" || true
	if [ -n "$json" ]; then
		local label
		label=$(grep "^$name|" "$out/labels" | head -1 | cut -d'|' -f2)
		grep -o '{.*}' "$log.out" | sed "s|^{|{\"round\":$round,\"impl\":\"$name\",\"label\":\"$label\",\"launched\":$n,|" \
			>>"$json/allreduce.jsonl" || true
	fi
}

# counts BYTES: the iteration options for one size
counts() {
	if [ -n "$iters" ]; then
		echo "--iters $iters${warmup:+ --warmup $warmup}"
	elif [ "$quick" = 1 ]; then
		[ "$1" -le 4096 ] && echo "--iters 200 --warmup 20" || echo "--iters 5 --warmup 1"
	elif [ "$1" -le 4096 ]; then
		echo "--iters 2000 --warmup 200"
	fi
}

cat >"$out/report.py" <<'PY'
import collections, statistics, sys

# report.py RESULTS MODE [ROUND]: MODE "round" prints round ROUND's table and ratios, "summary"
# the medians over the rounds; both check that every row has wrong == 0.
results, mode = sys.argv[1], sys.argv[2]
want = int(sys.argv[3]) if len(sys.argv) > 3 else None
import json
labels = dict(l.split("|", 1) for l in open(sys.argv[4] if len(sys.argv) > 4 else "/dev/null")
              .read().splitlines() if "|" in l)
rows, ceilings = [], {}
for line in open(results):
    rnd, n, name, js = line.rstrip("\n").split("\t", 3)
    rows.append((int(rnd), int(n), name, json.loads(js)))
bad = [r for r in rows if r[3].get("wrong") != 0]
order = ["kolo_tcp", "kolo_tcp_oop", "kolo", "gloo", "gloo_default", "mpi_tcp", "mpi_tcp_oop",
         "mpi"]

def size(b):
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= m and b % m == 0:
            return "%d %s" % (b // m, unit)
    return "%d B" % b

def speed(a, b, bytes_):
    """How many times faster a is than b: busbw from 64 KiB up, median time below."""
    if bytes_ >= 65536:
        return a["busbw_gbps"] / b["busbw_gbps"] if b["busbw_gbps"] > 0 else float("nan")
    return b["median_us"] / a["median_us"] if a["median_us"] > 0 else float("nan")

pairs = [("kolo_tcp", "gloo"), ("kolo", "gloo"), ("kolo_tcp", "mpi_tcp"), ("kolo", "mpi_tcp"),
         ("kolo", "mpi"), ("kolo_tcp", "gloo_default"), ("kolo_tcp_oop", "mpi_tcp_oop")]
short = {"kolo_tcp": "kolo TCP", "kolo": "kolo default", "gloo": "Gloo ring_chunked",
         "gloo_default": "Gloo allreduce()", "mpi_tcp": "Open MPI TCP", "mpi": "Open MPI default",
         "kolo_tcp_oop": "kolo TCP oop", "mpi_tcp_oop": "Open MPI TCP oop"}

def table(sel):
    by = collections.defaultdict(dict)
    for rnd, n, name, js in sel:
        by[(n, js["bytes"])][name] = js
    print("  %-38s %5s %9s %10s %11s %11s %12s %6s" % ("implementation", "ranks", "size",
          "busbw_GB/s", "time_us", "median_us", "bus_GB/cpu_s", "wrong"))
    for (n, b) in sorted(by):
        for name in order:
            js = by[(n, b)].get(name)
            if js:
                print("  %-38s %5d %9s %10.3f %11.2f %11.2f %12.3f %6s" % (
                    labels.get(name, name), n, size(b), js["busbw_gbps"], js["time_us"],
                    js["median_us"], js["bus_gb_per_cpu_s"], js["wrong"]))
    return by

if mode == "round":
    sel = [r for r in rows if r[0] == want]
    by = table(sel)
    for (n, b) in sorted(by):
        d = by[(n, b)]
        rat = ["%s / %s = %.3g" % (short[a], short[c], speed(d[a], d[c], b))
               for a, c in pairs if a in d and c in d]
        if rat:
            print("  round %d, %d ranks, %s (%s): %s" % (want, n, size(b),
                  "busbw" if b >= 65536 else "median time", ", ".join(rat)))
else:
    rounds = sorted({r[0] for r in rows})
    by = collections.defaultdict(list)
    for rnd, n, name, js in rows:
        by[(n, js["bytes"], name)].append(js)
    print("  %-38s %5s %9s %22s %16s %14s" % ("implementation", "ranks", "size",
          "busbw_GB/s median", "median_us med.", "bus_GB/cpu_s"))
    keys = sorted({(k[0], k[1]) for k in by})
    for (n, b) in keys:
        for name in order:
            js = by.get((n, b, name))
            if not js:
                continue
            bw = [j["busbw_gbps"] for j in js]
            pc = [j["bus_gb_per_cpu_s"] for j in js]
            print("  %-38s %5d %9s %10.3f (%d rounds) %16.2f %6.2f-%-7.2f" % (
                labels.get(name, name), n, size(b), statistics.median(bw), len(bw),
                statistics.median([j["median_us"] for j in js]), min(pc), max(pc)))
    for (n, b) in keys:
        for a, c in pairs:
            per = []
            for rnd in rounds:
                ja = [j for (r2, n2, nm, j) in rows if r2 == rnd and n2 == n and nm == a and j["bytes"] == b]
                jc = [j for (r2, n2, nm, j) in rows if r2 == rnd and n2 == n and nm == c and j["bytes"] == b]
                if ja and jc:
                    per.append(speed(ja[0], jc[0], b))
            if per:
                print("  %d ranks, %s: %s / %s = %s (median %.3g)" % (n, size(b), short[a], short[c],
                      " ".join("%.3g" % p for p in per), statistics.median(per)))
if mode == "round":
    bad = [r for r in bad if r[0] == want]
if bad:
    for rnd, n, name, js in bad:
        print("## WRONG: round %d, %s on %d ranks, %d bytes: wrong = %s" % (
            rnd, name, n, js["bytes"], js.get("wrong")))
    sys.exit(1)
PY

impls 0 >"$out/labels" # every label, for the report
impls 1 >>"$out/labels"
: >"$out/results.tsv"
ncpu=$(nproc)
echo "## kolo: $bin; peers: $peers; raw outputs: $out; $ncpu CPUs"
if [ -n "$json" ]; then
	/usr/bin/python3 - "$json/meta.json" "$ncpu" "$have_gloo" "$skip_gloo" "$have_mpi" "$skip_mpi" \
		"$root" "$argv" <<'PY'
import json, platform, subprocess, sys, time
path, ncpu, hg, sg, hm, sm, root = sys.argv[1:8]
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip() or None
    except OSError:
        return None
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), None)
mem = next((int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
json.dump({
    "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    "script": "scripts/bench-side-by-side.sh " + sys.argv[8],
    "cpus": int(ncpu), "cpu_model": cpu, "mem_gib": round(mem / 2**20, 1),
    "kernel": platform.release(),
    "kolo_commit": sh("git -C '%s' rev-parse --short HEAD 2>/dev/null" % root),
    "peers": {
        "gloo": sh("dpkg-query -W -f '${Version}' libgloo-dev 2>/dev/null") if hg == "1" else None,
        "openmpi": sh("dpkg-query -W -f '${Version}' libopenmpi-dev 2>/dev/null || mpirun --version | head -1") if hm == "1" else None,
    },
    "left_out": {k: v for k, v in (("gloo", sg), ("openmpi", sm)) if v},
}, open(path, "w"), indent=1)
PY
fi
for ((round = 1; round <= rounds; round++)); do
	pump=$("$peers/tcp_pump" 1024 --json)
	echo "## round $round of $rounds: $(date +%T), load: $(cut -d' ' -f1-3 /proc/loadavg)"
	if [ -n "$json" ]; then
		echo "{\"round\":$round,\"start\":\"$(date +%T)\",\"load\":[$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' ,)],\"tcp_pump\":$pump}" \
			>>"$json/rounds.jsonl"
	fi
	/usr/bin/python3 - "$pump" "$ncpu" "$ranks" <<'PY'
import json, sys
p, c = json.loads(sys.argv[1]), int(sys.argv[2])
bound = ", ".join("%s ranks busbw <= %.2f GB/s" % (n, c / (int(n) * p["cpu_s_per_gb"]))
                  for n in sys.argv[3].split())
print("  tcp_pump: %.3f GB/s, %.3f CPU-s per GB (sender %.3f, receiver %.3f); loopback TCP "
      "ceiling on %d CPUs: %s" % (p["gbps"], p["cpu_s_per_gb"], p["sender_cpu_s_per_gb"],
                                  p["receiver_cpu_s_per_gb"], c, bound))
PY
	for n in $ranks; do
		if [ -n "$sweep" ]; then
			read -r smin smax sfac <<<"$sweep"
			# with --big-iters: the sizes of the sweep up to 1 MiB, then from the next one on
			small_max=$(bytes "$smax") big_min=""
			if [ -n "$big_iters" ]; then
				s=$(bytes "$smin") small_max=0
				while [ "$s" -le "$(bytes "$smax")" ] && [ "$s" -le 1048576 ]; do
					small_max=$s
					s=$((s * sfac))
				done
				[ "$s" -gt "$(bytes "$smax")" ] || big_min=$s
				big_warm=$((big_iters / 5 < 2 ? 2 : big_iters / 5))
			fi
			while IFS='|' read -r name _; do
				[ "$name" = gloo_default ] && continue
				if [ "$small_max" -gt 0 ]; then
					# shellcheck disable=SC2046
					run "$name" "$n" -b "$smin" -e "$small_max" -f "$sfac" \
						$(if [ -n "$iters" ]; then echo "--iters $iters${warmup:+ --warmup $warmup}"; fi)
				fi
				if [ -n "$big_min" ]; then
					run "$name" "$n" -b "$big_min" -e "$smax" -f "$sfac" \
						--iters "$big_iters" --warmup "$big_warm"
				fi
			done < <(impls "$(bytes "$smax")")
		else
			for s in $sizes; do
				while IFS='|' read -r name _; do
					# shellcheck disable=SC2046
					run "$name" "$n" -b "$s" -e "$s" $(counts "$(bytes "$s")")
				done < <(impls "$(bytes "$s")")
			done
		fi
	done
	/usr/bin/python3 "$out/report.py" "$out/results.tsv" round "$round" "$out/labels" || failed=1
done
echo "## medians over $rounds round(s); ratios are how many times faster kolo is (busbw from 64 KiB up, median time below)"
/usr/bin/python3 "$out/report.py" "$out/results.tsv" summary 0 "$out/labels" || failed=1
echo "## raw outputs: $out"
if [ "$failed" != 0 ]; then
	echo "## FAILED: a run failed or reported wrong elements" >&2
	exit 1
fi
