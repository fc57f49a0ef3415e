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
#                                      the 8-byte latency of both on unshaped hosts; needs the
#                                      peer benchmarks of $PEERS (gloo_bench.cc, mpi_bench)
#   bench/netns/run.sh job H L RATE [VAR=VALUE...] -- kolo-bench ARGS...
#                                      any kolo-bench run on H hosts x L ranks (RATE 0: unshaped)
#
# Elastic recovery from a vanished host, a partition and a stopped rank: bench/netns/vanish.py.
#
# Environment: KOLO_BIN (folder with kolorun, kolo-rendezvous, kolo-bench; default
# build/bin), OUT (folder for the raw outputs; default a new one under /tmp). Every run
# prints rank 0's kolo-bench table and the load average at its start.
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
# (kolo-bench: 8; the peer benchmarks: 7).
ratio() {
	awk -v col="${2:-8}" -v link="$(awk -v r="$1" 'BEGIN {print r * 1e6 / 8 / 1e9}')" '
		/^#/ && /busbw/ {print $0 "  busbw/link"; next}
		/^#/ {print; next}
		NF >= 9 {printf "%s  %10.3f\n", $0, $col / link; next}
		{print}'
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
	peers=${PEERS:-/work/peers}
	[ -f "$peers/gloo_bench.cc" ] && [ -x "$peers/mpi_bench" ] || {
		echo "no peer benchmarks in $peers" >&2
		exit 2
	}
	# gloo_bench forks its ranks on 127.0.0.1; this copy runs one rank per host instead
	# (GLOO_RANK, GLOO_ADDR; the FileStore directory is shared: namespaces share the file
	# system).
	python3 - "$peers/gloo_bench.cc" "$out/gloo_bench_ns.cc" <<'PY'
import sys
s = open(sys.argv[1]).read()
s = s.replace('attr.hostname = "127.0.0.1";',
              'attr.hostname = getenv("GLOO_ADDR") ? getenv("GLOO_ADDR") : "127.0.0.1";')
s = s.replace('	char tmpl[] = "/tmp/gloo_bench.XXXXXX";',
              '	if (getenv("GLOO_RANK"))\n'
              '		return rank_main(o, atoi(getenv("GLOO_RANK")), getenv("GLOO_DIR"));\n'
              '	char tmpl[] = "/tmp/gloo_bench.XXXXXX";', 1)
open(sys.argv[2], "w").write(s)
PY
	g++ -O3 -std=c++17 -o "$out/gloo_bench_ns" "$out/gloo_bench_ns.cc" -lgloo -lpthread
	# Open MPI: every rank enters its host's namespace; the BTL talks over eth0.
	cat >"$out/mpi_ns.sh" <<SH
#!/bin/sh
exec ip netns exec $prefix-h\$OMPI_COMM_WORLD_RANK "\$@"
SH
	chmod +x "$out/mpi_ns.sh"
	gloo() { # gloo NAME ARGS...: one gloo rank per host
		local name=$1 h gp=()
		shift
		rm -rf "$out/gstore"
		mkdir -p "$out/gstore"
		echo "## $name: 4 hosts x 1 rank; load: $(cut -d' ' -f1-3 /proc/loadavg)"
		for ((h = 0; h < 4; h++)); do
			"$netns" --prefix "$prefix" exec "$h" env GLOO_RANK=$h GLOO_DIR="$out/gstore" \
				GLOO_ADDR="$("$netns" --prefix "$prefix" addr "$h")" \
				timeout -k 5 900 "$out/gloo_bench_ns" -np 4 "$@" >"$out/$name.h$h" 2>&1 &
			gp+=($!)
		done
		for p in "${gp[@]}"; do wait "$p" || echo "## $name: a rank failed (see $out/$name.h*)"; done
		cat "$out/$name.h0"
	}
	mpi() { # mpi NAME ARGS...
		local name=$1
		shift
		echo "## $name: 4 hosts x 1 rank; load: $(cut -d' ' -f1-3 /proc/loadavg)"
		# mpirun runs on the bridge, where every host reaches its PMIx server (PMIx's
		# client-server link is TCP; the hosts cannot reach the root namespace's loopback).
		ip netns exec "$prefix-br" env PMIX_MCA_ptl_tcp_if_include=br0 \
			PMIX_MCA_ptl_tcp_remote_connections=1 timeout -k 5 900 mpirun --allow-run-as-root \
			--oversubscribe -np 4 -x PMIX_MCA_ptl_tcp_if_include \
			-x PMIX_MCA_ptl_tcp_remote_connections --mca btl tcp,self \
			--mca btl_tcp_if_include eth0 --mca oob_tcp_if_include br0 \
			"$out/mpi_ns.sh" "$peers/mpi_bench" "$@" >"$out/$name.out" 2>&1 ||
			echo "## $name: mpirun failed (see $out/$name.out)"
		grep -v '^\[' "$out/$name.out" | sed -n 1,40p
	}
	which=${2:-all} # all, gloo, mpi, or lat (only the 8-byte latency of both)
	if [ "$which" != lat ]; then
		hosts 4 "$rate"
		[ "$which" = mpi ] || gloo gloo_busbw -b 1M -e 256M -f 2 --algo ring_chunked | ratio "$rate" 7
		[ "$which" = gloo ] || mpi mpi_busbw -b 1M -e 256M -f 2 | ratio "$rate" 7
	fi
	hosts 4 0
	[ "$which" = mpi ] || gloo gloo_lat --algo ring_chunked -b 8 -e 8 --iters 2000 --warmup 200
	[ "$which" = gloo ] || mpi mpi_lat -b 8 -e 8 --iters 2000 --warmup 200
	;;
job)
	H=$1 L=$2 rate=$3
	shift 3
	hosts "$H" "$rate"
	job custom "$H" "$L" "$@"
	;;
*)
	sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
echo "## raw outputs: $out"
