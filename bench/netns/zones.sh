#!/usr/bin/env bash
# Zone-aware rings on namespace hosts: 4 hosts (1 rank each) in two zones, z0 = {h0, h2} and
# z1 = {h1, h3}, whose only link between them is shaped to RATE Mbit/s (kolo-netns.sh --zones
# 2 --zone-rate RATE); links inside a zone are not shaped. The hosts join in the order h0, h1,
# h2, h3 (zones z0, z1, z0, z1), so ranks by join order make a ring that crosses between the
# zones 4 times (twice each way over the one link); with KOLO_ZONE set, the rendezvous ranks
# h0 h2 h1 h3 and the ring crosses twice (once each way).
#
#   bench/netns/zones.sh [RATE [REPS [MIN MAX]]]   (defaults: 500 3 1M 64M, sizes x4)
#
# Runs kolo-bench allreduce (float32, ITERS timed iterations, default 5, 1 warm-up) REPS
# times without and with KOLO_ZONE, alternating, and prints every run's rank order and busbw
# (GB/s), then per size the median busbw (MB/s) of each, their ratio, and the physical limit:
# busbw equals the bytes every ring link carries per second, so a ring that crosses once each
# way can reach the zone link's rate, one that crosses twice each way half of it.
# Exits 1 when a zone-aware round does not give each zone contiguous ranks, 2 on setup errors.
#
# Environment: KOLO_BIN (kolorun, kolo-rendezvous, kolo-bench; default build/bin), OUT (raw
# outputs; default a new folder under /tmp), ITERS. Needs root.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
netns=$root/tests/netns/kolo-netns.sh
bin=${KOLO_BIN:-$root/build/bin}
out=${OUT:-$(mktemp -d /tmp/kolo-zones-bench.XXXXXX)}
rate=${1:-500} reps=${2:-3} min=${3:-1M} max=${4:-64M} iters=${ITERS:-5}
prefix=kzb$$
H=4
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

pids=()
cleanup() {
	for p in "${pids[@]}"; do
		kill -TERM "$p" 2>/dev/null || true
	done
	"$netns" down --prefix "$prefix" >/dev/null 2>&1 || true
}
trap cleanup EXIT

"$netns" up "$H" --zones 2 --zone-rate "$rate" --prefix "$prefix" >/dev/null
"$netns" --prefix "$prefix" exec br "$bin/kolo-rendezvous" --listen 10.77.0.254:0 \
	--settle-ms 5000 >"$out/rdzv.out" 2>&1 &
pids+=($!)
for ((i = 0; i < 100; i++)); do
	grep -q "listening on" "$out/rdzv.out" 2>/dev/null && break
	sleep 0.1 # waiting for the server's first line, bounded
done
url=http://$(awk '/listening on/ {print $3; exit}' "$out/rdzv.out")

# status JOB: the job's status document (empty when the server does not know it yet).
status() {
	"$netns" --prefix "$prefix" exec br curl -s "$url/v1/jobs/$1" 2>/dev/null || true
}

# wait_for JOB JQ_EXPR: up to 30 s for the status document to satisfy the expression.
wait_for() {
	for ((t = 0; t < 300; t++)); do
		status "$1" | jq -e "$2" >/dev/null 2>&1 && return 0
		sleep 0.1 # polling the status, bounded
	done
	echo "## job $1: timed out waiting for $2" >&2
	return 1
}

# run NAME zones|none: one job, the hosts joining one after another (each waits for the one
# before to be registered); prints its rank order and rank 0's table.
njob=0
run() {
	local name=$1 mode=$2 job h jpids=() zone
	njob=$((njob + 1))
	job=z$njob
	for ((h = 0; h < H; h++)); do
		zone=""
		[ "$mode" = zones ] && zone=$("$netns" --prefix "$prefix" zone "$h")
		"$netns" --prefix "$prefix" exec "$h" env KOLO_LOG_LEVEL=warn KOLO_ZONE="$zone" \
			timeout -k 5 600 "$bin/kolorun" --rendezvous "$url" --job "$job" --host "h$h" \
			-np 1 --min-np "$H" --max-np "$H" -- "$bin/kolo-bench" allreduce -b "$min" \
			-e "$max" -f 4 -d float32 -n "$iters" -w 1 >"$out/$name.h$h" 2>&1 &
		jpids+=($!)
		wait_for "$job" "(.waiting | length) + (.members | length) >= $((h + 1))"
	done
	wait_for "$job" '.members | length == '"$H"
	local order
	order=$(status "$job" | jq -r '[.members[] | .host + "/" + (.zone // "-")] | join(" ")')
	echo "## $name: KOLO_ZONE $mode; ranks: $order; load: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "$order" >"$out/$name.order"
	local rc=0
	for p in "${jpids[@]}"; do
		wait "$p" || rc=$?
	done
	grep -h -E '^\[0\] ' "$out/$name".h* | grep -v ' kolo ' | sed 's/^\[0\] //'
	[ "$rc" = 0 ] || echo "## $name: a kolorun exited $rc (see $out/$name.h*)"
}

# contiguous ORDER: every zone's ranks form one interval (ORDER: "host/zone ..." by rank).
contiguous() {
	tr ' ' '\n' <<<"$1" | awk -F/ '$2 != prev {if (seen[$2]++) bad = 1; prev = $2} END {exit bad}'
}

echo "# zones: z0 = h0 h2, z1 = h1 h3; zone link $rate Mbit/s each way, unshaped inside zones"
echo "# kolo-bench allreduce float32 $min..$max x4, $iters iterations; $reps repetitions"
bad=0
for ((r = 1; r <= reps; r++)); do
	for mode in none zones; do
		run "$mode.$r" "$mode" | tee "$out/$mode.$r.table"
		if [ "$mode" = zones ] && ! contiguous "$(cat "$out/$mode.$r.order")"; then
			echo "## $mode.$r: zones are not contiguous" >&2
			bad=1
		fi
	done
done

# Per size: median busbw without and with zones, their ratio, and the limits. busbw in MB/s
# from the mean time (column 5, us): bytes / time x 2(n-1)/n, finer than the table's GB/s.
link=$(awk -v r="$rate" 'BEGIN {print r / 8}')
echo
echo "# median busbw (MB/s) of $reps runs; the zone link: $rate Mbit/s = $link MB/s each way"
for mode in none zones; do
	cat "$out/$mode".*.table |
		awk -v m="$mode" -v f="$(awk -v n="$H" 'BEGIN {print 2 * (n - 1) / n}')" \
			'!/^#/ && NF >= 9 && $5 > 0 {print m, $1, $1 / $5 * f}'
done | awk -v link="$link" '
	function median(s, a, k, i, j, t) {
		k = split(s, a, " ")
		for (i = 1; i <= k; i++)
			for (j = i + 1; j <= k; j++)
				if (a[j] + 0 < a[i] + 0) {t = a[i]; a[i] = a[j]; a[j] = t}
		return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
	}
	{v[$1 " " $2] = v[$1 " " $2] " " $3; if (!($2 in seen)) {seen[$2] = 1; order[n++] = $2}}
	END {
		printf "%10s %12s %12s %7s %14s %14s\n", "bytes", "no-zone", "zone", "ratio",
			"limit(4 cross)", "limit(2 cross)"
		for (i = 0; i < n; i++) {
			s = order[i]; a = median(v["none " s]); b = median(v["zones " s])
			printf "%10s %12.1f %12.1f %7.2f %14.1f %14.1f\n", s, a, b, (a > 0 ? b / a : 0),
				link / 2, link
		}
	}'
exit "$bad"
