#!/usr/bin/env bash
# Benchmarks on network-namespace hosts (tests/netns/kolo-netns.sh). Needs root.
#
#   bench/netns/run.sh busbw  [RATE]   4 hosts x 1 rank, links at RATE Mbit/s (default 1000):
#                                      allreduce float32 1 MiB..256 MiB, busbw / link rate
#   bench/netns/run.sh hier   [RATE]   2 hosts x 2 ranks at RATE: flat ring vs hierarchical
#   bench/netns/run.sh shm             1 host x 2 ranks, no shaping: loopback TCP vs shared memory
#   bench/netns/run.sh small           4 hosts x 1 rank, no shaping: 8-byte allreduce latency,
#                                      ring (KOLO_SMALL_ALLREDUCE_BYTES=0) vs small-message
#   bench/netns/run.sh peers [RATE [gloo|mpi|lat]] 4 hosts x 1 rank at RATE: Gloo (ring_chunked), Open MPI
#                                      (TCP BTL on eth0) allreduce float32 1 MiB..256 MiB, and
#                                      the 8-byte latency of both on unshaped hosts
#   bench/netns/run.sh wire [RATE [ROUNDS [MIN MAX [FACTOR]]]]
#                                      4 hosts x 1 rank at RATE (default 1000): kolo and Gloo
#                                      ring_chunked interleaved ROUNDS times (default 3) over
#                                      MIN..MAX (default 1M 256M, x4), checked, and in every
#                                      round the wire's TCP ceiling (the ring pump below);
#                                      busbw/link, kolo/Gloo and kolo/ceiling per size and
#                                      round, and their medians
#   bench/netns/run.sh pump [RATE [SECONDS]]
#                                      4 hosts x 1 rank at RATE: the TCP ceiling of a ring
#                                      allreduce on that wire: every host streams to the next
#                                      one while it reads from the one before (tcp_pump --to),
#                                      for about SECONDS (default 25: longer than BBR's 10 s
#                                      ProbeRTT period); GB/s per link, its minimum over links
#   bench/netns/run.sh job H L RATE [VAR=VALUE...] -- kolo-bench ARGS...
#                                      any kolo-bench run on H hosts x L ranks (RATE 0: unshaped)
#
# Elastic recovery from a vanished host, a partition and a stopped rank: bench/netns/vanish.py.
#
# Environment: KOLO_BIN (folder with kolorun, kolo-rendezvous, kolo-bench; default
# build/bin), PEERS_BIN (where the peer benchmarks of bench/peers are built, with its Makefile,
# for peers and wire; default KOLO_BIN/../peers), OUT (folder for the raw outputs; default a
# new one under /tmp). Every run prints rank 0's table and the load average at its start.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
netns=$root/tests/netns/kolo-netns.sh
bin=${KOLO_BIN:-$root/build/bin}
out=${OUT:-$(mktemp -d /tmp/kolo-netns-bench.XXXXXX)}
prefix=knb$$
mkdir -p "$out"

[ "$(id -u)" -eq 0 ] || {
	echo "needs root (network namespaces)" >&2
	exit 2
}
for b in kolorun kolo-rendezvous kolo-bench; do
	[ -x "$bin/$b" ] || {
		echo "no $bin/$b: build first or set KOLO_BIN" >&2
		exit 2
	}
done

hosts_up=0
pids=()
cleanup() {
	for p in "${pids[@]}"; do
		kill -TERM "$p" 2>/dev/null || true
	done
	[ "$hosts_up" = 0 ] || "$netns" down --prefix "$prefix" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# hosts H RATE: (re)creates H hosts, shaped when RATE > 0, and a rendezvous on the bridge.
url=""
hosts() {
	cleanup
	pids=()
	local args=("$1" --prefix "$prefix")
	[ "$2" -gt 0 ] && args+=(--rate "$2")
	"$netns" up "${args[@]}" >/dev/null
	hosts_up=1
	"$netns" --prefix "$prefix" exec br "$bin/kolo-rendezvous" --listen 10.77.0.254:0 \
		--settle-ms 200 >"$out/rdzv.out" 2>&1 &
	pids+=($!)
	for ((i = 0; i < 100; i++)); do
		grep -q "listening on" "$out/rdzv.out" 2>/dev/null && break
		sleep 0.1 # waiting for the server's first line, bounded
	done
	url=http://$(awk '/listening on/ {print $3; exit}' "$out/rdzv.out")
}

# job NAME H L [VAR=VALUE...] -- kolo-bench ARGS: one kolorun per host on the current hosts;
# prints rank 0's output (without log lines) and keeps every host's in $OUT/NAME.hI.
njob=0
job() {
	local name=$1 H=$2 L=$3
	shift 3
	local envs=()
	while [ "$1" != -- ]; do
		envs+=("$1")
		shift
	done
	shift
	njob=$((njob + 1))
	local N=$((H * L)) jpids=() h
	echo "## $name: $H hosts x $L ranks ${envs[*]}; load: $(cut -d' ' -f1-3 /proc/loadavg)"
	for ((h = 0; h < H; h++)); do
		"$netns" --prefix "$prefix" exec "$h" env KOLO_LOG_LEVEL=warn "${envs[@]}" \
			timeout -k 5 900 "$bin/kolorun" --rendezvous "$url" --job "b$njob" --host "h$h" \
			-np "$L" --min-np "$N" --max-np "$N" -- "$bin/kolo-bench" "$@" \
			>"$out/$name.h$h" 2>&1 &
		jpids+=($!)
	done
	local rc=0
	for p in "${jpids[@]}"; do
		wait "$p" || rc=$?
	done
	cat "$out"/"$name".h* | grep -E '^\[0\] ' | grep -v ' kolo ' | sed 's/^\[0\] //'
	[ "$rc" = 0 ] || echo "## $name: a kolorun exited $rc (see $out/$name.h*)"
}

# ratio RATE [COLUMN]: appends busbw / link rate to a table whose busbw (GB/s) is in COLUMN
# (8: kolo-bench and the peer benchmarks print the same columns).
ratio() {
	awk -v col="${2:-8}" -v link="$(awk -v r="$1" 'BEGIN {print r * 1e6 / 8 / 1e9}')" '
		/^#/ && /busbw/ {print $0 "  busbw/link"; next}
		/^#/ {print; next}
		NF >= 9 {printf "%s  %10.3f\n", $0, $col / link; next}
		{print}'
}

# The peer benchmarks (bench/peers), built on demand: peers_build gloo|mpi...
peers=$(realpath -m "${PEERS_BIN:-$(dirname "$bin")/peers}") # make -C needs it absolute
peers_build() {
	local p
	for p in "$@"; do
		case "$p" in
		gloo) [ -f /usr/include/gloo/allreduce_ring_chunked.h ] || {
			echo "no Gloo: apt-get install -y libgloo-dev" >&2
			exit 2
		} ;;
		mpi) command -v mpicc >/dev/null && command -v mpirun >/dev/null || {
			echo "no Open MPI: apt-get install -y openmpi-bin libopenmpi-dev" >&2
			exit 2
		} ;;
		esac
		make -s -C "$root/bench/peers" O="$peers" "$p" >>"$out/peers-build.log" 2>&1 || {
			echo "bench/peers: $p does not build (see $out/peers-build.log)" >&2
			exit 1
		}
	done
}

# gloo NAME ARGS...: gloo_bench, one rank per host of the 4 current hosts (GLOO_RANK,
# GLOO_ADDR; the FileStore folder is shared: namespaces share the file system). Prints rank
# 0's output; returns 1 if a rank failed.
gloo() {
	local name=$1 h gp=() rc=0
	shift
	rm -rf "$out/gstore"
	mkdir -p "$out/gstore"
	echo "## $name: 4 hosts x 1 rank; load: $(cut -d' ' -f1-3 /proc/loadavg)"
	for ((h = 0; h < 4; h++)); do
		"$netns" --prefix "$prefix" exec "$h" env GLOO_RANK=$h GLOO_SIZE=4 \
			GLOO_DIR="$out/gstore" GLOO_ADDR="$("$netns" --prefix "$prefix" addr "$h")" \
			timeout -k 5 900 "$peers/gloo_bench" "$@" >"$out/$name.h$h" 2>&1 </dev/null &
		gp+=($!)
	done
	for p in "${gp[@]}"; do
		wait "$p" || rc=1
	done
	[ "$rc" = 0 ] || echo "## $name: a rank failed (see $out/$name.h*)"
	cat "$out/$name.h0"
	return "$rc"
}

# pump NAME SECONDS: tcp_pump's ring on the 4 current hosts (each streams to the next one and
# reads from the one before), sized to run about SECONDS at the link rate $rate (at most
# 8 GiB a link: at 10 Gbit/s the CPUs, not the link, are the limit). Prints one line
# "links GB/s: a b c d; min m" and returns 1 if a host failed.
pump() {
	local name=$1 secs=$2 h gp=() rc=0 mib
	mib=$((rate * secs / 8))
	[ "$mib" -gt 8192 ] && mib=8192
	[ "$mib" -lt 64 ] && mib=64
	echo "## $name: 4 hosts x 1 tcp_pump, $mib MiB a link; load: $(cut -d' ' -f1-3 /proc/loadavg)"
	for ((h = 0; h < 4; h++)); do
		"$netns" --prefix "$prefix" exec "$h" timeout -k 5 900 "$peers/tcp_pump" \
			--listen "$("$netns" --prefix "$prefix" addr "$h"):5001" \
			--to "$("$netns" --prefix "$prefix" addr $(((h + 1) % 4))):5001" "$mib" --json \
			>"$out/$name.h$h" 2>&1 </dev/null &
		gp+=($!)
	done
	for p in "${gp[@]}"; do
		wait "$p" || rc=1
	done
	[ "$rc" = 0 ] || { echo "## $name: a host failed (see $out/$name.h*)"; return 1; }
	cat "$out/$name".h* | grep -o '"gbps":[0-9.]*' | cut -d: -f2 |
		awk '{v[NR] = $1; if (NR == 1 || $1 < m) m = $1}
			END {printf "links GB/s:"; for (i = 1; i <= NR; i++) printf " %s", v[i];
			printf "; min %s\n", m}'
}

# mpi NAME ARGS...: mpi_bench on the 4 current hosts, one rank per host. mpirun runs on the
# bridge, where every host reaches its PMIx server (PMIx's client-server link is TCP; the
# hosts cannot reach the root namespace's loopback), and each rank enters its host's
# namespace through a wrapper; the BTL talks over eth0.
mpi() {
	local name=$1
	shift
	cat >"$out/mpi_ns.sh" <<SH
#!/bin/sh
exec ip netns exec $prefix-h\$OMPI_COMM_WORLD_RANK "\$@"
SH
	chmod +x "$out/mpi_ns.sh"
	echo "## $name: 4 hosts x 1 rank; load: $(cut -d' ' -f1-3 /proc/loadavg)"
	ip netns exec "$prefix-br" env PMIX_MCA_ptl_tcp_if_include=br0 \
		PMIX_MCA_ptl_tcp_remote_connections=1 timeout -k 5 900 mpirun --allow-run-as-root \
		--oversubscribe -np 4 -x PMIX_MCA_ptl_tcp_if_include \
		-x PMIX_MCA_ptl_tcp_remote_connections --mca btl "tcp,self" \
		--mca btl_tcp_if_include eth0 --mca oob_tcp_if_include br0 \
		"$out/mpi_ns.sh" "$peers/mpi_bench" "$@" >"$out/$name.out" 2>&1 </dev/null ||
		echo "## $name: mpirun failed (see $out/$name.out)"
	grep -v '^\[' "$out/$name.out" | sed -n 1,40p
}

sub=${1:-}
shift || true
case "$sub" in
busbw)
	rate=${1:-1000}
	hosts 4 "$rate"
	job busbw 4 1 -- allreduce -b 1M -e 256M -f 2 -d float32 | ratio "$rate"
	;;
hier)
	rate=${1:-1000}
	hosts 2 "$rate"
	for mode in 0 1 auto; do
		job "hier_$mode" 2 2 KOLO_HIERARCHICAL=$mode -- allreduce -b 1M -e 256M -f 4 -d float32 |
			ratio "$rate"
	done
	;;
shm)
	hosts 1 0
	job shm_off 1 2 KOLO_SHM=0 -- allreduce -b 4K -e 256M -f 4 -d float32
	job shm_on 1 2 -- allreduce -b 4K -e 256M -f 4 -d float32
	;;
small)
	hosts 4 0
	job small_ring 4 1 KOLO_SMALL_ALLREDUCE_BYTES=0 -- allreduce -b 8 -e 8 -n 2000 -w 200
	job small_rd 4 1 -- allreduce -b 8 -e 8 -n 2000 -w 200
	# the 4 hosts share this machine's CPUs, which no host can see by itself
	job small_rd_yield 4 1 KOLO_SPIN_YIELD=1 -- allreduce -b 8 -e 8 -n 2000 -w 200
	;;
peers)
	rate=${1:-1000}
	which=${2:-all} # all, gloo, mpi, or lat (only the 8-byte latency of both)
	case "$which" in
	all | lat) peers_build gloo mpi ;;
	gloo | mpi) peers_build "$which" ;;
	*) echo "peers: all, gloo, mpi or lat" >&2; exit 2 ;;
	esac
	if [ "$which" != lat ]; then
		hosts 4 "$rate"
		[ "$which" = mpi ] || { gloo gloo_busbw -b 1M -e 256M -f 2 --algo ring_chunked \
			--check --cpu || true; } | ratio "$rate"
		[ "$which" = gloo ] || mpi mpi_busbw -b 1M -e 256M -f 2 --check --cpu | ratio "$rate"
	fi
	hosts 4 0
	[ "$which" = mpi ] || gloo gloo_lat --algo ring_chunked -b 8 -e 8 --iters 2000 \
		--warmup 200 --check || true
	[ "$which" = gloo ] || mpi mpi_lat -b 8 -e 8 --iters 2000 --warmup 200 --check
	;;
wire)
	rate=${1:-1000} rounds=${2:-3} wmin=${3:-1M} wmax=${4:-256M} wfac=${5:-4}
	[ "$rate" -gt 0 ] && [ "$rounds" -gt 0 ] || { echo "wire: RATE and ROUNDS > 0" >&2; exit 2; }
	peers_build gloo pump
	hosts 4 "$rate"
	sweep=(-b "$wmin" -e "$wmax" -f "$wfac" --check --json)
	: >"$out/wire.tsv"
	wire_failed=0
	wire_kolo() {
		job "wire_kolo_r$1" 4 1 -- allreduce "${sweep[@]}" >"$out/wire_kolo_r$1.txt" || true
		grep '^##' "$out/wire_kolo_r$1.txt" || true
		grep -q 'exited' "$out/wire_kolo_r$1.txt" && wire_failed=1
		grep -o '{.*}' "$out/wire_kolo_r$1.txt" | sed "s/^/$1\tkolo\t/" >>"$out/wire.tsv" || true
	}
	wire_gloo() {
		gloo "wire_gloo_r$1" --algo ring_chunked "${sweep[@]}" >"$out/wire_gloo_r$1.txt" ||
			wire_failed=1
		grep '^##' "$out/wire_gloo_r$1.txt" || true
		grep -o '{.*}' "$out/wire_gloo_r$1.txt" | sed "s/^/$1\tgloo\t/" >>"$out/wire.tsv" || true
	}
	wire_pump() {
		local line
		line=$(pump "wire_pump_r$1" 25) || wire_failed=1
		echo "$line"
		echo "$line" | awk -v r="$1" '/^links/ {printf "%s\tpump\t{\"min_gbps\":%s}\n", r, $NF}' \
			>>"$out/wire.tsv"
	}
	for ((r = 1; r <= rounds; r++)); do
		wire_pump "$r"
		# alternate which goes first, so that a drift of the load favours neither
		if [ $((r % 2)) = 1 ]; then
			wire_kolo "$r"
			wire_gloo "$r"
		else
			wire_gloo "$r"
			wire_kolo "$r"
		fi
	done
	/usr/bin/python3 - "$out/wire.tsv" "$rate" "$rounds" <<'PY' || wire_failed=1
import collections, json, statistics, sys

rows = collections.defaultdict(dict)  # (round, bytes) -> impl -> row
ceil = {}  # round -> the TCP ring's slowest link, GB/s
for line in open(sys.argv[1]):
    rnd, impl, js = line.rstrip("\n").split("\t", 2)
    j = json.loads(js)
    if impl == "pump":
        ceil[int(rnd)] = j["min_gbps"]
        continue
    rows[(int(rnd), j["bytes"])][impl] = j
rate, rounds = float(sys.argv[2]), int(sys.argv[3])
link = rate * 1e6 / 8 / 1e9
sizes = sorted({b for (_, b) in rows})

def mib(b):
    return "%g MiB" % (b / 2**20) if b >= 2**20 else "%d B" % b

print("## wire: 4 hosts x 1 rank at %g Mbit/s (link %.4f GB/s); busbw GB/s (busbw/link); "
      "TCP ceiling: the ring pump's slowest link in that round" % (rate, link))
print("  %5s %9s %18s %18s %10s %18s %10s" % ("round", "size", "kolo", "Gloo ring_chunked",
                                               "kolo/Gloo", "TCP ceiling", "kolo/ceil"))
kc = collections.defaultdict(list)  # bytes -> kolo / ceiling per round
ratios = collections.defaultdict(list)
bw = collections.defaultdict(list)
bad = 0
for r in range(1, rounds + 1):
    for b in sizes:
        d = rows.get((r, b), {})
        k, g = d.get("kolo"), d.get("gloo")
        for impl, j in d.items():
            bw[(impl, b)].append(j["busbw_gbps"])
            if j.get("wrong") != 0:
                print("## WRONG: round %d, %s, %d bytes: wrong = %s" % (r, impl, b, j.get("wrong")))
                bad = 1
        cell = lambda j: "%8.4f (%5.3f)" % (j["busbw_gbps"], j["busbw_gbps"] / link) if j else "%18s" % "-"
        ratio = ""
        if k and g and g["busbw_gbps"] > 0:
            ratios[b].append(k["busbw_gbps"] / g["busbw_gbps"])
            ratio = "%10.3f" % ratios[b][-1]
        c, kcr = ceil.get(r), ""
        if k and c:
            kc[b].append(k["busbw_gbps"] / c)
            kcr = "%10.3f" % kc[b][-1]
        cc = "%8.4f (%5.3f)" % (c, c / link) if c else "%18s" % "-"
        print("  %5d %9s %s %s %10s %s %s" % (r, mib(b), cell(k), cell(g), ratio, cc, kcr))
print("## medians over %d round(s)" % rounds)
print("  %9s %18s %18s %10s %10s   %s" % ("size", "kolo", "Gloo ring_chunked", "kolo/Gloo",
                                         "kolo/ceil", "kolo/Gloo per round"))
for b in sizes:
    k = statistics.median(bw[("kolo", b)]) if bw[("kolo", b)] else float("nan")
    g = statistics.median(bw[("gloo", b)]) if bw[("gloo", b)] else float("nan")
    rs = ratios[b]
    print("  %9s %8.4f (%5.3f) %8.4f (%5.3f) %10s %10s   %s" % (
        mib(b), k, k / link, g, g / link, "%.3f" % statistics.median(rs) if rs else "-",
        "%.3f" % statistics.median(kc[b]) if kc[b] else "-", " ".join("%.3f" % x for x in rs)))
if ceil:
    cs = [ceil[r] for r in sorted(ceil)]
    print("## TCP ceiling (ring pump, slowest link) per round: %s GB/s = %s of the link" % (
        " ".join("%.4f" % c for c in cs), " ".join("%.3f" % (c / link) for c in cs)))
allr = [(x, b) for b in sizes for x in ratios[b]]
if allr:
    lo = min(allr)
    every = sum(1 for b in sizes if ratios[b] and min(ratios[b]) >= 1.0)
    print("## kolo/Gloo: lowest %.3f (%s); kolo >= Gloo in every round at %d of %d sizes" % (
        lo[0], mib(lo[1]), every, len(sizes)))
    if 64 * 2**20 in ratios:
        rs = ratios[64 * 2**20]
        print("## 64 MiB: kolo/Gloo %s, median %.3f (targets: >= 1.0 at 1000 Mbit/s, >= 1.3 at "
              "10000 Mbit/s)" % (" ".join("%.3f" % x for x in rs), statistics.median(rs)))
sys.exit(bad)
PY
	[ "$wire_failed" = 0 ] || {
		echo "## wire: a run failed or reported wrong elements (see $out)"
		echo "## raw outputs: $out"
		exit 1
	}
	;;
pump)
	rate=${1:-1000} secs=${2:-25}
	[ "$rate" -gt 0 ] && [ "$secs" -gt 0 ] || { echo "pump: RATE and SECONDS > 0" >&2; exit 2; }
	peers_build pump
	hosts 4 "$rate"
	line=$(pump pump "$secs") || { echo "$line"; exit 1; }
	echo "$line" | awk -v link="$(awk -v r="$rate" 'BEGIN {print r * 1e6 / 8 / 1e9}')" '
		/^links/ {print; printf "## TCP ceiling at %s GB/s links: %.3f of the link (slowest)\n",
			link, $NF / link; next} {print}'
	;;
job)
	H=$1 L=$2 rate=$3
	shift 3
	hosts "$H" "$rate"
	job custom "$H" "$L" "$@"
	;;
*)
	sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
echo "## raw outputs: $out"
