#!/usr/bin/env bash
# Multi-host tests on namespace hosts (tests/netns/kolo-netns.sh), one kolorun per host against
# a kolo-rendezvous in the bridge namespace:
#
#   netns_coll_test.sh matrix_flat   4 hosts x 2 ranks, KOLO_HIERARCHICAL=0: coll_check matrix
#   netns_coll_test.sh matrix_hier   the same with KOLO_HIERARCHICAL=1 (hierarchy checked active)
#   netns_coll_test.sh linkcut       4 x 2, large allreduces, host 3's link cut: hosts 0-2 report
#                                    an error within KOLO_TIMEOUT_MS (3000) + slack and exit
#   netns_coll_test.sh shmkill       2 x 2, a local rank SIGKILLed mid-allreduce: the others fail,
#                                    and nothing is left in /dev/shm or mapped from a kolo memfd
#
# Environment (set by CTest): KOLO_BIN (kolorun, kolo-rendezvous), KOLO_NETNS, COLL_CHECK.
# Exits 77 (ctest SKIP_RETURN_CODE) when not root or namespaces are unavailable.
set -euo pipefail

mode=${1:-}
bin=${KOLO_BIN:?KOLO_BIN: folder of kolorun and kolo-rendezvous}
netns=${KOLO_NETNS:?KOLO_NETNS: tests/netns/kolo-netns.sh}
check=${COLL_CHECK:?COLL_CHECK: the coll_check program}
prefix=knc$$
work=""

skip() {
	echo "SKIP: $*"
	exit 77
}
fail() {
	echo "FAIL ($mode): $*" >&2
	for f in "$work"/*.out; do
		[ -e "$f" ] || continue
		echo "---- ${f##*/} (last 30 lines)" >&2
		tail -n 30 "$f" >&2
	done
	exit 1
}

case "$mode" in
matrix_flat | matrix_hier | linkcut | shmkill) ;;
*)
	echo "usage: $0 matrix_flat|matrix_hier|linkcut|shmkill" >&2
	exit 2
	;;
esac
[ "$(id -u)" -eq 0 ] || skip "not root (network namespaces need root; CI runs as root)"
for t in ip tc unshare; do
	command -v "$t" >/dev/null || skip "$t not found (iproute2 / util-linux)"
done
probe_ns=$prefix-probe
ip netns add "$probe_ns" 2>/dev/null || skip "'ip netns add' fails here (no network namespaces)"
ip -n "$probe_ns" link add pbr type bridge 2>/dev/null || {
	ip netns del "$probe_ns"
	skip "no bridge in this kernel"
}
ip netns del "$probe_ns"
unshare --uts true 2>/dev/null || skip "unshare --uts fails here"

work=$(mktemp -d /tmp/kolo-netns-coll.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do
		kill -TERM "$p" 2>/dev/null || true
	done
	"$netns" down --prefix "$prefix" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

L=2
H=4
[ "$mode" = shmkill ] && H=2
N=$((H * L))
"$netns" up "$H" --prefix "$prefix" >/dev/null

# The rendezvous on the bridge, on a port the kernel picks.
"$netns" --prefix "$prefix" exec br "$bin/kolo-rendezvous" --listen 10.77.0.254:0 \
	--settle-ms 200 >"$work/rdzv.out" 2>&1 &
pids+=($!)
for ((i = 0; i < 100; i++)); do
	grep -q "listening on" "$work/rdzv.out" 2>/dev/null && break
	sleep 0.1 # polling a file for the server's first line, bounded
done
url=http://$(awk '/listening on/ {print $3; exit}' "$work/rdzv.out")
[ "$url" != http:// ] || fail "kolo-rendezvous did not start"

host_pids=()
start_hosts() { # start_hosts ENV... -- coll_check args
	local envs=()
	while [ "$1" != -- ]; do
		envs+=("$1")
		shift
	done
	shift
	for ((h = 0; h < H; h++)); do
		"$netns" --prefix "$prefix" exec "$h" env KOLO_LOG_LEVEL=warn "${envs[@]}" \
			timeout -k 5 80 "$bin/kolorun" --rendezvous "$url" --job "t$$" --host "h$h" \
			-np "$L" --min-np "$N" --max-np "$N" -- "$check" "$@" >"$work/h$h.out" 2>&1 &
		host_pids[h]=$!
		pids+=($!)
	done
}

wait_lines() { # wait_lines PATTERN COUNT SECONDS
	local end=$((SECONDS + $3))
	while [ "$(cat "$work"/h*.out 2>/dev/null | grep -c -- "$1" || true)" -lt "$2" ]; do
		[ "$SECONDS" -lt "$end" ] || fail "only $(cat "$work"/h*.out | grep -c -- "$1" || true) of $2 '$1' lines after $3 s"
		sleep 0.1 # polling output files, bounded by the deadline
	done
}

# Waits for host h's kolorun; its status in rc[h]. Fails past the deadline (seconds since
# the epoch).
declare -a rc
wait_host() { # wait_host H DEADLINE
	local h=$1 end=$2
	while kill -0 "${host_pids[h]}" 2>/dev/null; do
		[ "$(date +%s)" -lt "$end" ] || fail "host $h still runs $(( $(date +%s) - t_event )) s after the event: hung"
		sleep 0.1 # polling a child's exit, bounded by the deadline
	done
	set +e
	wait "${host_pids[h]}"
	rc[h]=$?
	set -e
}

case "$mode" in
matrix_flat | matrix_hier)
	hier=0
	[ "$mode" = matrix_hier ] && hier=1
	KOLO_LOG_LEVEL=info
	start_hosts KOLO_LOG_LEVEL=info KOLO_HIERARCHICAL=$hier -- matrix
	t_event=$(date +%s)
	for ((h = 0; h < H; h++)); do
		wait_host "$h" $((t_event + 75))
		[ "${rc[h]}" -eq 0 ] || fail "host $h: kolorun exited ${rc[h]}"
	done
	passes=$(cat "$work"/h*.out | grep -c "PASS rank" || true)
	[ "$passes" -eq "$N" ] || fail "$passes of $N ranks passed"
	active=$(cat "$work"/h*.out | grep -c "hierarchical allreduce on" || true)
	if [ "$hier" = 1 ]; then
		[ "$active" -eq "$N" ] || fail "hierarchical allreduce active on $active of $N ranks"
	else
		[ "$active" -eq 0 ] || fail "hierarchical allreduce active with KOLO_HIERARCHICAL=0"
	fi
	grep -h "PASS rank 0" "$work"/h*.out
	echo "ok: $N ranks on $H namespace hosts, KOLO_HIERARCHICAL=$hier: every collective right and identical on every rank"
	;;
linkcut)
	start_hosts KOLO_TIMEOUT_MS=3000 -- loop 60 64
	wait_lines "ready pid" "$N" 40
	# Let a few large allreduces cross the links, then cut host 3's.
	sleep 1
	t_event=$(date +%s)
	"$netns" link 3 down --prefix "$prefix"
	for ((h = 0; h < 3; h++)); do
		wait_host "$h" $((t_event + 3 + 12))
		[ "${rc[h]}" -ne 0 ] || fail "host $h exited 0 although host 3 was cut off"
		grep -q "ERROR" "$work/h$h.out" || fail "host $h did not report an error"
	done
	echo "ok: host 3 cut off at +0 s; hosts 0-2 reported and exited after $(( $(date +%s) - t_event )) s (KOLO_TIMEOUT_MS=3000):"
	grep -h "ERROR" "$work"/h[012].out | sed -n 1,6p
	;;
shmkill)
	kolo_shm() { ls -1 /dev/shm 2>/dev/null | grep -i kolo || true; }
	before=$(kolo_shm)
	start_hosts KOLO_TIMEOUT_MS=3000 -- loop 60 16
	wait_lines "ready pid" "$N" 40
	victim=$(awk '/ready pid .* local 1/ {for (i = 1; i < NF; i++) if ($i == "pid") { print $(i + 1); exit }}' "$work/h0.out")
	[ -n "$victim" ] || fail "no local rank 1 on host 0"
	# The victim holds kolo memfd mappings while it runs (so the check below can fail).
	grep -q "memfd:kolo" "/proc/$victim/maps" || fail "rank on host 0 (pid $victim) maps no kolo memfd"
	sleep 1
	t_event=$(date +%s)
	kill -KILL "$victim"
	for ((h = 0; h < H; h++)); do
		wait_host "$h" $((t_event + 3 + 12))
		[ "${rc[h]}" -ne 0 ] || fail "host $h exited 0 although a rank was killed"
	done
	grep -q "ERROR" "$work"/h*.out || fail "no rank reported an error"
	echo "ok: pid $victim SIGKILLed; every host exited within $(( $(date +%s) - t_event )) s:"
	grep -h "ERROR" "$work"/h*.out | sed -n 1,4p
	left=""
	for ns in $(ip netns list | awk -v p="$prefix-h" 'index($1, p) == 1 {print $1}'); do
		left="$left$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
	done
	[ -z "${left// /}" ] || fail "processes left in the namespaces: $left"
	maps=""
	for m in $(grep -l "memfd:kolo" /proc/[0-9]*/maps 2>/dev/null || true); do
		p=${m#/proc/}
		p=${p%/maps}
		case "$(ip netns identify "$p" 2>/dev/null || true)" in
		"$prefix"-*) maps="$maps $p" ;;
		esac
	done
	[ -z "$maps" ] || fail "processes of this test still map kolo memfds: $maps"
	after=$(kolo_shm)
	[ "$before" = "$after" ] || fail "/dev/shm changed: before [$before] after [$after]"
	echo "ok: /dev/shm unchanged ($(ls -1 /dev/shm | wc -l) entries), no kolo memfd mapped by this test's processes"
	;;
esac
echo PASS
