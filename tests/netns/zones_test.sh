#!/usr/bin/env bash
# Zone-aware ranks and the zone level in a real job: 4 namespace hosts in two zones joined by
# one 100 Mbit/s link, joining zone by zone alternately (bench/netns/zones.sh with one small
# run of each mode, every element checked against a float64 reference). Checks that with
# KOLO_ZONE every zone's ranks are contiguous and every result right (zones.sh exits 1
# otherwise), that the zone-aware ring is not slower than the ring in join order (which crosses
# the link twice as often, so it should be about half as fast), and that the zone level is
# chosen (its links measured) and not slower than the zone-aware ring (it should be about 1.5
# times as fast: the link carries the buffer once each way instead of 1.5 times).
# Exits 77 (ctest SKIP_RETURN_CODE) when not root or when a tool it needs is missing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bench=$here/../../bench/netns/zones.sh

[ "$(id -u)" -eq 0 ] || {
	echo "SKIP: not root (network namespaces need root)"
	exit 77
}
for t in ip tc unshare curl jq; do
	command -v "$t" >/dev/null || {
		echo "SKIP: $t not found"
		exit 77
	}
done
[ -n "${KOLO_BIN:-}" ] || {
	echo "FAIL: KOLO_BIN is not set" >&2
	exit 1
}

out=$(mktemp -d /tmp/kolo-zones-test.XXXXXX)
trap 'rm -rf "$out"' EXIT
rc=0
text=$(OUT=$out ITERS=3 CHECK=1 "$bench" 100 1 4M 4M) || rc=$?
[ "$rc" = 0 ] || {
	echo "$text"
	echo "FAIL: zones.sh exited $rc" >&2
	exit 1
}
echo "$text"
# the summary's line: bytes, busbw of none, ring and level, ring/none, level/ring, limits
read -r ring level < <(awk '$1 == 4194304 && NF == 9 && $3 != "float32" {print $5, $6}' \
	<<<"$text") || true
[ -n "${ring:-}" ] && [ -n "${level:-}" ] || {
	echo "FAIL: no summary line" >&2
	exit 1
}
awk -v r="$ring" 'BEGIN {exit !(r >= 1)}' || {
	echo "FAIL: the zone-aware ring is slower than the ring in join order (busbw ratio $ring)" >&2
	exit 1
}
grep -q "go by the zone level" "$out"/level.1.h0 || {
	echo "FAIL: the zone level was not chosen for large buffers:" >&2
	grep -h "zone level\|hierarch" "$out"/level.1.h* >&2 || true
	exit 1
}
awk -v r="$level" 'BEGIN {exit !(r >= 1)}' || {
	echo "FAIL: the zone level is slower than the zone-aware ring (busbw ratio $level)" >&2
	exit 1
}
echo "PASS: zones contiguous, results right; busbw ring (zone-aware) / join order = $ring," \
	"zone level / ring = $level"
