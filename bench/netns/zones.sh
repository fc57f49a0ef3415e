#!/usr/bin/env bash
# Zone-aware allreduce on namespace hosts: 4 hosts (1 rank each) in two zones, z0 = {h0, h2}
# and z1 = {h1, h3}, whose only link between them is shaped to RATE Mbit/s (kolo-netns.sh
# --zones 2 --zone-rate RATE); links inside a zone are not shaped. The hosts join in the order
# h0, h1, h2, h3 (zones z0, z1, z0, z1). Three modes:
#   none   no KOLO_ZONE: ranks by join order make a ring that crosses between the zones 4
#          times (twice each way over the one link);
#   ring   KOLO_ZONE set, KOLO_HIERARCHICAL_ZONES=0: the rendezvous ranks h0 h2 h1 h3, and the
#          one ring crosses twice (once each way);
#   level  KOLO_ZONE set, the zone level on auto (docs/hierarchical.md, "Zones"): reduce
#          inside each zone, allreduce between the zones, spread inside each zone; where the
#          cost model (its links measured at set-up) picks it, each zone link direction
#          carries the buffer once instead of 1.5 times.
#
#   bench/netns/zones.sh [RATE [REPS [MIN MAX]]]   (defaults: 500 3 1M 64M, sizes x4)
#
# Runs kolo-bench allreduce (float32, ITERS timed iterations, default 5, 1 warm-up; CHECK=1
# adds --check, every element against a float64 reference) REPS times in each mode, in turn,
# and prints every run's rank order and busbw (GB/s), then per size the median busbw (MB/s)
# of each mode, the ratios, and the physical limits: busbw is bytes x 2(n-1)/n per second,
# so a ring that crosses once each way can reach the zone link's rate, one that crosses
# twice each way half of it, and the zone level 2(n-1)/n = 1.5 times it.
# Exits 1 when a zone-aware round does not give each zone contiguous ranks or a kolorun
# fails, 2 on setup errors.
#
# Environment: KOLO_BIN (kolorun, kolo-rendezvous, kolo-bench; default build/bin), OUT (raw
# outputs, with each rank's log at info level in level.R.hN; default a new folder under
# /tmp), ITERS, CHECK, MODES (default "none ring level"), NP (ranks per host, default 1:
# with 2 or more, the zone level sits under the host level's cross comm, and n = 4 NP in
# the busbw factor 2(n-1)/n). Needs root.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
netns=$root/tests/netns/kolo-netns.sh
bin=${KOLO_BIN:-$root/build/bin}
out=${OUT:-$(mktemp -d /tmp/kolo-zones-bench.XXXXXX)}
rate=${1:-500} reps=${2:-3} min=${3:-1M} max=${4:-64M} iters=${ITERS:-5}
modes=${MODES:-none ring level} check=()
[ "${CHECK:-0}" = 1 ] && check=(--check)
prefix=kzb$$
H=4 np=${NP:-1} n=$((4 * ${NP:-1}))
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

# run NAME none|ring|level: one job, the hosts joining one after another (each waits for the
# one before to be registered); prints its rank order and rank 0's table.
run() {
	local name=$1 mode=$2 job=z-${1//./-} h jpids=() zone level=0 log=warn
	[ "$mode" = level ] && level=auto log=info
	for ((h = 0; h < H; h++)); do
		zone=""
		[ "$mode" != none ] && zone=$("$netns" --prefix "$prefix" zone "$h")
		"$netns" --prefix "$prefix" exec "$h" env KOLO_LOG_LEVEL=$log KOLO_ZONE="$zone" \
			KOLO_HIERARCHICAL_ZONES=$level \
			timeout -k 5 600 "$bin/kolorun" --rendezvous "$url" --job "$job" --host "h$h" \
			-np "$np" --min-np "$n" --max-np "$n" -- "$bin/kolo-bench" allreduce -b "$min" \
			-e "$max" -f 4 -d float32 -n "$iters" -w 1 "${check[@]}" >"$out/$name.h$h" 2>&1 &
		jpids+=($!)
		wait_for "$job" "(.waiting | length) + (.members | length) >= $(((h + 1) * np))"
	done
	wait_for "$job" '.members | length == '"$n"
	local order
	order=$(status "$job" | jq -r '[.members[] | .host + "/" + (.zone // "-")] | join(" ")')
	echo "## $name: mode $mode; ranks: $order; load: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "$order" >"$out/$name.order"
	local rc=0
	for p in "${jpids[@]}"; do
		wait "$p" || rc=$?
	done
	grep -h -E '^\[0\] ' "$out/$name".h* | grep -v ' kolo ' | sed 's/^\[0\] //'
	grep -h -o 'zone level .*' "$out/$name".h* | head -1 | sed 's/^/## /' || true
	[ "$rc" = 0 ] || {
		echo "## $name: a kolorun exited $rc (see $out/$name.h*)"
		return 1
	}
}

# contiguous ORDER: every zone's ranks form one interval (ORDER: "host/zone ..." by rank).
contiguous() {
	tr ' ' '\n' <<<"$1" | awk -F/ '$2 != prev {if (seen[$2]++) bad = 1; prev = $2} END {exit bad}'
}

echo "# zones: z0 = h0 h2, z1 = h1 h3; zone link $rate Mbit/s each way, unshaped inside zones"
echo "# kolo-bench allreduce float32 $min..$max x4, $iters iterations ${check[*]}; $reps repetitions"
bad=0
for ((r = 1; r <= reps; r++)); do
	for mode in $modes; do
		run "$mode.$r" "$mode" | tee "$out/$mode.$r.table" || bad=1
		if [ "$mode" != none ] && ! contiguous "$(cat "$out/$mode.$r.order")"; then
			echo "## $mode.$r: zones are not contiguous" >&2
			bad=1
		fi
	done
done

# Per size: the median busbw of each mode, the ratios, and the limits. busbw in MB/s from
# the mean time (column 5, us): bytes / time x 2(n-1)/n, finer than the table's GB/s.
link=$(awk -v r="$rate" 'BEGIN {print r / 8}')
echo
echo "# median busbw (MB/s) of $reps runs; the zone link: $rate Mbit/s = $link MB/s each way"
for mode in $modes; do
	cat "$out/$mode".*.table |
		awk -v m="$mode" -v f="$(awk -v n="$n" 'BEGIN {print 2 * (n - 1) / n}')" \
			'!/^#/ && NF >= 9 && $5 > 0 {print m, $1, $1 / $5 * f}'
done | awk -v link="$link" -v f="$(awk -v n="$n" 'BEGIN {print 2 * (n - 1) / n}')" '
	function median(s, a, k, i, j, t) {
		k = split(s, a, " ")
		if (k == 0)
			return 0
		for (i = 1; i <= k; i++)
			for (j = i + 1; j <= k; j++)
				if (a[j] + 0 < a[i] + 0) {t = a[i]; a[i] = a[j]; a[j] = t}
		return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
	}
	{v[$1 " " $2] = v[$1 " " $2] " " $3; if (!($2 in seen)) {seen[$2] = 1; order[n++] = $2}}
	END {
		printf "%10s %9s %9s %9s %10s %11s %9s %9s %9s\n", "bytes", "none", "ring", "level",
			"ring/none", "level/ring", "lim-none", "lim-ring", "lim-level"
		for (i = 0; i < n; i++) {
			s = order[i]; a = median(v["none " s]); b = median(v["ring " s])
			c = median(v["level " s])
			printf "%10s %9.1f %9.1f %9.1f %10.2f %11.2f %9.1f %9.1f %9.1f\n", s, a, b, c,
				(a > 0 ? b / a : 0), (b > 0 ? c / b : 0), link / 2, link, link * f
		}
	}'
exit "$bad"
