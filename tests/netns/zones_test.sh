#!/usr/bin/env bash
# Zone-aware ranks in a real job: 4 namespace hosts in two zones joined by one 100 Mbit/s
# link, joining zone by zone alternately (bench/netns/zones.sh with one small run). Checks that
# with KOLO_ZONE every zone's ranks are contiguous (zones.sh exits 1 otherwise) and that the
# zone-aware ring is not slower than the ring in join order (which crosses the link twice as
# often, so it should be about half as fast).
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

text=$(ITERS=3 "$bench" 100 1 4M 4M) || {
	echo "$text"
	echo "FAIL: zones.sh exited $?" >&2
	exit 1
}
echo "$text"
ratio=$(awk '$1 == 4194304 && NF == 6 {print $4}' <<<"$text")
[ -n "$ratio" ] || {
	echo "FAIL: no summary line" >&2
	exit 1
}
awk -v r="$ratio" 'BEGIN {exit !(r >= 1)}' || {
	echo "FAIL: the zone-aware ring is slower (busbw ratio $ratio)" >&2
	exit 1
}
echo "PASS: zones contiguous; busbw zone-aware / join order = $ratio"
