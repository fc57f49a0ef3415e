#!/usr/bin/env bash
# The namespace test hosts work: 3 hosts with their own host names and addresses reach each
# other over TCP, a link shaped to 100 Mbit/s carries 100 Mbit/s (±25%), a cut link is cut,
# the root namespace's addresses and routes are untouched, and teardown leaves nothing.
# Exits 77 (ctest SKIP_RETURN_CODE) when not root or when the kernel lacks what it needs.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
netns=$here/kolo-netns.sh
probe=$here/netns_probe.py
prefix=kolot$$
rate=100
mbytes=12

skip() {
	echo "SKIP: $*"
	exit 77
}
fail() {
	echo "FAIL: $*" >&2
	exit 1
}

[ "$(id -u)" -eq 0 ] || skip "not root (network namespaces need root; CI runs as root)"
for t in ip tc unshare; do
	command -v "$t" >/dev/null || skip "$t not found (iproute2 / util-linux)"
done
py=$(command -v /usr/bin/python3 || command -v python3 || true)
[ -n "$py" ] || skip "python3 not found"

# What the kernel allows, tried in a throwaway namespace.
pns=$prefix-probe
ip netns add "$pns" 2>/dev/null || skip "'ip netns add' fails here (no network namespaces)"
trap 'ip netns del "$pns" 2>/dev/null || true' EXIT
ip -n "$pns" link add pa type veth peer name pb 2>/dev/null || skip "no veth in this kernel"
ip -n "$pns" link add pbr type bridge 2>/dev/null || skip "no bridge in this kernel"
ip netns exec "$pns" tc qdisc add dev pa root tbf rate 10mbit burst 64kb latency 50ms \
	2>/dev/null || skip "no tc tbf in this kernel"
unshare --uts true 2>/dev/null || skip "unshare --uts fails here"
ip netns del "$pns"

routes_before=$(ip route show table all 2>/dev/null; ip -6 route show table all 2>/dev/null)
addrs_before=$(ip -o addr show | awk '{print $2, $3, $4}')

trap '"$netns" down --prefix "$prefix" >/dev/null 2>&1 || true' EXIT
"$netns" up 3 --rate "$rate" --prefix "$prefix"
run() { # run I CMD...: CMD on host I
	"$netns" --prefix "$prefix" exec "$@"
}

# Host names and addresses.
for i in 0 1 2; do
	[ "$(run "$i" hostname)" = "h$i" ] || fail "host $i: hostname is not h$i"
	[ "$(run "$i" printenv KOLO_HOSTNAME)" = "h$i" ] || fail "host $i: KOLO_HOSTNAME is not h$i"
	a=$("$netns" addr "$i" --prefix "$prefix")
	[ "$a" = "10.77.0.$((i + 1))" ] || fail "host $i: address $a"
	grep -q " $a/24 " <<<"$(run "$i" ip -o -4 addr show dev eth0)" || fail "host $i: $a not on eth0"
	grep -q "UP" <<<"$(run "$i" ip -o link show lo)" || fail "host $i: loopback down"
	if grep -q default <<<"$(run "$i" ip route)"; then
		fail "host $i has a default route"
	fi
done
[ "$(hostname)" != h0 ] || fail "the root UTS namespace's host name changed"
echo "ok: host names h0..h2, addresses 10.77.0.1-3, no route out"

# Every host reaches every other over TCP (6 ordered pairs).
for j in 0 1 2; do
	aj=$("$netns" addr "$j" --prefix "$prefix")
	out=$(mktemp)
	run "$j" "$py" "$probe" serve "$aj" 5000 2 --timeout 20 >"$out" &
	srv=$!
	for i in 0 1 2; do
		[ "$i" = "$j" ] && continue
		run "$i" "$py" "$probe" send "$aj" 5000 1000 --timeout 20 ||
			fail "h$i cannot send to h$j"
	done
	wait "$srv" || fail "h$j: server failed"
	for i in 0 1 2; do
		[ "$i" = "$j" ] && continue
		grep -q "^got 10.77.0.$((i + 1)) 1000 " "$out" || fail "h$j did not get 1000 bytes from h$i: $(cat "$out")"
	done
	rm -f "$out"
done
echo "ok: all 6 host pairs connect and deliver"

# Shaped throughput, in two directions through different pairs of shaped links.
lo=$((rate * 75 / 100))
hi=$((rate * 125 / 100))
for pair in "0 1" "2 0"; do
	read -r s d <<<"$pair"
	ad=$("$netns" addr "$d" --prefix "$prefix")
	out=$(mktemp)
	run "$d" "$py" "$probe" serve "$ad" 5001 1 --timeout 30 >"$out" &
	srv=$!
	run "$s" "$py" "$probe" send "$ad" 5001 $((mbytes * 1000000)) --timeout 30 ||
		fail "h$s -> h$d transfer failed"
	wait "$srv" || fail "h$d: server failed"
	mbit=$(awk '{printf "%d", $5}' "$out")
	echo "h$s -> h$d: $(awk '{print $3}' "$out") bytes in $(awk '{print $4}' "$out") s = $mbit Mbit/s (link $rate)"
	if [ "$mbit" -lt "$lo" ] || [ "$mbit" -gt "$hi" ]; then
		fail "h$s -> h$d ran at $mbit Mbit/s, outside $lo..$hi"
	fi
	rm -f "$out"
done
echo "ok: shaped links run within 25% of $rate Mbit/s"

# A cut link is cut; restored, it carries traffic again.
a2=$("$netns" addr 2 --prefix "$prefix")
"$netns" link 2 down --prefix "$prefix"
if run 0 "$py" "$probe" connect "$a2" 5002 --timeout 1 2>/dev/null; then
	fail "h0 reached h2 through a cut link"
fi
"$netns" link 2 up --prefix "$prefix"
out=$(mktemp)
run 2 "$py" "$probe" serve "$a2" 5002 1 --timeout 20 >"$out" &
srv=$!
run 0 "$py" "$probe" send "$a2" 5002 1000 --timeout 20 || fail "h0 cannot reach h2 after the link came back"
wait "$srv" || fail "h2: server failed"
rm -f "$out"
echo "ok: link down cuts h2 off; link up restores it"

# The root namespace is untouched, and teardown is complete and idempotent.
routes_now=$(ip route show table all 2>/dev/null; ip -6 route show table all 2>/dev/null)
[ "$routes_now" = "$routes_before" ] || fail "the root namespace's routes changed"
[ "$(ip -o addr show | awk '{print $2, $3, $4}')" = "$addrs_before" ] ||
	fail "the root namespace's addresses changed"
if grep -q "10\.77\.0\." <<<"$(ip -o addr show)"; then
	fail "10.77.0.0/24 leaked into the root namespace"
fi
"$netns" down --prefix "$prefix"
"$netns" down --prefix "$prefix"
if grep -q "^$prefix-" <<<"$(ip netns list)"; then
	fail "namespaces left after down: $(ip netns list | grep "^$prefix-")"
fi
echo "ok: root namespace untouched; down removed everything (twice)"
echo PASS
