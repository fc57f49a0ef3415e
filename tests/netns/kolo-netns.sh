#!/usr/bin/env bash
# kolo-netns.sh: test hosts made of Linux network namespaces.
#
#   kolo-netns.sh up N [--rate MBIT] [--prefix NAME]   create hosts h0..h(N-1)
#          [--zones K [--zone-rate MBIT]]               ... in K zones (host I in zone I mod K)
#   kolo-netns.sh zone I                                print host I's zone (z0, z1, ...)
#   kolo-netns.sh exec I CMD [ARGS...]                  run CMD on host I ("br": the bridge)
#   kolo-netns.sh addr I                                print host I's address ("br" too)
#   kolo-netns.sh link I up|down                        connect / cut host I's link
#   kolo-netns.sh block I J on|off                      drop / pass traffic between hosts I and J
#   kolo-netns.sh rate I MBIT|NUMkbit|off               shape / unshape host I's link to hosts
#   kolo-netns.sh list                                  print the hosts and their addresses
#   kolo-netns.sh down [--prefix NAME]                  remove everything (idempotent)
#
# A global `--prefix NAME` may also come first: kolo-netns.sh --prefix t1 exec 0 hostname.
# Layout: namespace PREFIX-br holds a bridge "br0"; each host is a namespace PREFIX-hI with
# loopback up and one interface "eth0", a veth whose other end ("vhI") is a port of br0. Hosts
# get 10.77.0.(I+1)/24 and the bridge 10.77.0.254/24 (a place for a rendezvous server that is
# on no host). The /24 exists only inside these namespaces: no default route, nothing in the
# root namespace gets an interface, an address or a route, and no other address is touched.
# Every veth is created directly inside its namespace, so names never clash with the root's.
#
# --rate MBIT shapes each host's link in both directions with tc tbf: the host-side eth0
# egress (host -> bridge) and the bridge-side vhI egress (bridge -> host). `rate I` shapes one
# host's link at any time (whole Mbit/s, or e.g. 8kbit for a link that all but stalls), in both
# directions, for its traffic with the other hosts only: what it exchanges with the bridge's
# address (a rendezvous there) passes unshaped, as over a separate management network.
# `rate I off` removes the shaping.
#
# Host names: `exec I` runs CMD in a new UTS namespace whose host name is "hI" (so
# gethostname() answers hI) and with KOLO_HOSTNAME=hI in its environment, so the rendezvous
# computes local and cross ranks as it would on real machines.
#
# --zones K (2..16) gives each zone z its own bridge "brz" in PREFIX-br; host I is a port of
# the bridge of zone I mod K, and the bridge of every zone z > 0 is joined to br0 by one veth
# pair (zlz on br0's side, zbz on brz's): what crosses zones shares that link, as traffic
# between two real zones shares their interconnect. The bridges form one L2 segment (the /24
# and the bridge's address stay as above). --zone-rate MBIT shapes every zone link in both
# directions, for traffic between hosts only (the rendezvous on the bridge's address passes).
#
# The prefix (default "kolo", or $KOLO_NETNS_PREFIX) names the namespaces, so several sets can
# coexist (tests use a unique prefix). Needs root, iproute2 and util-linux's unshare.
set -euo pipefail

prog=${0##*/}
prefix=${KOLO_NETNS_PREFIX:-kolo}
subnet=10.77.0

die() {
	echo "$prog: $*" >&2
	exit 1
}

usage() {
	sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

valid_prefix() {
	[[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,30}$ ]] || die "bad prefix '$1'"
}

ns_of() { # ns_of I|br -> namespace name
	if [ "$1" = br ]; then
		echo "$prefix-br"
	elif [[ $1 =~ ^[0-9]+$ ]]; then
		echo "$prefix-h$1"
	else
		die "bad host '$1' (a number or br)"
	fi
}

addr_of() { # addr_of I|br -> address
	if [ "$1" = br ]; then
		echo "$subnet.254"
	else
		echo "$subnet.$(($1 + 1))"
	fi
}

ns_exists() {
	[ -e "/run/netns/$1" ]
}

# Our namespaces, bridge last so hosts go first on teardown.
our_namespaces() {
	local all
	all=$(ip netns list 2>/dev/null | awk '{print $1}')
	awk -v p="$prefix-h" 'index($0, p) == 1 && substr($0, length(p) + 1) ~ /^[0-9]+$/' \
		<<<"$all" | sort -V
	awk -v b="$prefix-br" '$0 == b' <<<"$all"
}

cmd_down() {
	local ns pid pids tries
	# A namespace lives on while a process is inside it: stop what `exec` started there.
	for ns in $(our_namespaces); do
		for pid in $(ip netns pids "$ns" 2>/dev/null || true); do
			kill -TERM "$pid" 2>/dev/null || true
		done
	done
	for ((tries = 0; tries < 20; tries++)); do
		pids=$(for ns in $(our_namespaces); do ip netns pids "$ns" 2>/dev/null || true; done)
		[ -z "$pids" ] && break
		if [ "$tries" -eq 10 ]; then
			for pid in $pids; do
				kill -KILL "$pid" 2>/dev/null || true
			done
		fi
		sleep 0.1 # waiting for the kernel to reap; bounded by the loop
	done
	for ns in $(our_namespaces); do
		ip netns del "$ns" 2>/dev/null || true
	done
	# Anything left (a race with a concurrent exec that pinned a namespace) is reported.
	if [ -n "$(our_namespaces)" ]; then
		die "could not remove: $(our_namespaces | tr '\n' ' ')"
	fi
}

shape() { # shape NS DEV KBIT
	local ns=$1 dev=$2 kbit=$3
	# tbf needs a bucket of at least rate/HZ bytes; 10 ms of line rate, never below 64 KiB
	# (one GSO super-packet), keeps the long-run rate exact without starving the link.
	local burst=$((kbit * 1000 / 8 / 100))
	[ "$burst" -lt 65536 ] && burst=65536
	ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "${kbit}kbit" \
		burst "$burst" latency 50ms
}

cmd_up() {
	[ $# -ge 1 ] || usage
	local n=$1 rate="" zones=1 zone_rate=""
	shift
	if ! [[ $n =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt 200 ]; then
		die "N must be 1..200"
	fi
	while [ $# -gt 0 ]; do
		case "$1" in
		--rate) rate=${2:-}; shift ;;
		--prefix) prefix=${2:-}; valid_prefix "$prefix"; shift ;;
		--zones) zones=${2:-}; shift ;;
		--zone-rate) zone_rate=${2:-}; shift ;;
		*) die "unknown option $1" ;;
		esac
		shift
	done
	if [ -n "$rate" ]; then
		if ! [[ $rate =~ ^[0-9]+$ ]] || [ "$rate" -lt 1 ]; then
			die "--rate takes whole Mbit/s"
		fi
	fi
	if ! [[ $zones =~ ^[0-9]+$ ]] || [ "$zones" -lt 1 ] || [ "$zones" -gt 16 ]; then
		die "--zones takes 1..16"
	fi
	if [ -n "$zone_rate" ] && { ! [[ $zone_rate =~ ^[0-9]+$ ]] || [ "$zone_rate" -lt 1 ]; }; then
		die "--zone-rate takes whole Mbit/s"
	fi
	[ "$(id -u)" -eq 0 ] || die "needs root"
	[ -z "$(our_namespaces)" ] || die "namespaces with prefix '$prefix' exist; run: $prog down --prefix $prefix"

	# From here on a failure removes what was built.
	built=0
	trap '[ "$built" = 1 ] || cmd_down >/dev/null 2>&1 || true' EXIT
	local br
	br=$(ns_of br)
	ip netns add "$br"
	ip -n "$br" link set lo up
	ip -n "$br" link add br0 type bridge
	ip -n "$br" addr add "$(addr_of br)/24" dev br0
	ip -n "$br" link set br0 up
	zones_up "$br" "$zones" "$zone_rate"
	local i ns
	for ((i = 0; i < n; i++)); do
		ns=$(ns_of "$i")
		ip netns add "$ns"
		ip -n "$ns" link set lo up
		ip link add eth0 netns "$ns" type veth peer name "vh$i" netns "$br"
		ip -n "$br" link set "vh$i" master "br$((i % zones))"
		ip -n "$br" link set "vh$i" up
		ip -n "$ns" addr add "$(addr_of "$i")/24" dev eth0
		ip -n "$ns" link set eth0 up
		if [ -n "$rate" ]; then
			shape "$ns" eth0 $((rate * 1000))
			shape "$br" "vh$i" $((rate * 1000))
		fi
	done
	built=1
	cmd_list
}

# zones_up BRNS K ZONE_RATE: bridges br1..br(K-1), each joined to br0 by a veth pair.
zones_up() {
	local br=$1 k=$2 zrate=$3 z
	for ((z = 1; z < k; z++)); do
		ip -n "$br" link add "br$z" type bridge
		ip -n "$br" link set "br$z" up
		ip -n "$br" link add "zl$z" type veth peer name "zb$z"
		ip -n "$br" link set "zl$z" master br0
		ip -n "$br" link set "zb$z" master "br$z"
		ip -n "$br" link set "zl$z" up
		ip -n "$br" link set "zb$z" up
		if [ -n "$zrate" ]; then
			# zl egress: zone 0 -> zone z; zb egress: zone z -> zone 0
			shape_data "$br" "zl$z" $((zrate * 1000)) src
			shape_data "$br" "zb$z" $((zrate * 1000)) dst
		fi
	done
}

cmd_zone() {
	[ $# -eq 1 ] && [[ $1 =~ ^[0-9]+$ ]] || usage
	local master
	master=$(ip -n "$(ns_of br)" -o link show "vh$1" 2>/dev/null |
		sed -n 's/.* master br\([0-9]*\) .*/\1/p')
	[ -n "$master" ] || die "no host $1"
	echo "z$master"
}

cmd_exec() {
	[ $# -ge 2 ] || usage
	local host=$1 ns name
	shift
	ns=$(ns_of "$host")
	ns_exists "$ns" || die "no namespace $ns (run: $prog up N --prefix $prefix)"
	if [ "$host" = br ]; then
		name=br
	else
		name=h$host
	fi
	# shellcheck disable=SC2016 # $0 and $@ belong to the inner shell
	exec ip netns exec "$ns" env KOLO_HOSTNAME="$name" \
		unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

cmd_addr() {
	[ $# -eq 1 ] || usage
	ns_exists "$(ns_of "$1")" || die "no namespace $(ns_of "$1")"
	addr_of "$1"
}

cmd_link() {
	[ $# -eq 2 ] || usage
	[[ $1 =~ ^[0-9]+$ ]] || die "link takes a host number"
	case "$2" in
	up | down) ;;
	*) usage ;;
	esac
	ns_exists "$(ns_of "$1")" || die "no namespace $(ns_of "$1")"
	# Cut at the bridge port: the host keeps its address and sees no carrier change
	# it could react to, as when a cable or a switch port fails.
	ip -n "$(ns_of br)" link set "vh$1" "$2"
}

cmd_block() {
	[ $# -eq 3 ] || usage
	[[ $1 =~ ^[0-9]+$ && $2 =~ ^[0-9]+$ && $1 != "$2" ]] || die "block takes two host numbers"
	case "$3" in
	on | off) ;;
	*) usage ;;
	esac
	local a b
	# A blackhole route in each of the two hosts towards the other: what they send each
	# other vanishes without an error or a reset (an established connection times out),
	# while both still reach every other host and the bridge's address (the rendezvous).
	for a in "$1" "$2"; do
		b=$([ "$a" = "$1" ] && echo "$2" || echo "$1")
		ns_exists "$(ns_of "$a")" || die "no namespace $(ns_of "$a")"
		if [ "$3" = on ]; then
			ip -n "$(ns_of "$a")" route replace blackhole "$(addr_of "$b")/32"
		else
			ip -n "$(ns_of "$a")" route del blackhole "$(addr_of "$b")/32" 2>/dev/null || true
		fi
	done
}

shape_data() { # shape_data NS DEV KBIT src|dst: shape, but the bridge's address passes
	local ns=$1 dev=$2 kbit=$3 dir=$4
	local burst=$((kbit * 1000 / 8 / 100))
	[ "$burst" -lt 65536 ] && burst=65536
	# htb: class 1:20 is shaped and takes every IP packet but those of the bridge's address;
	# they and ARP go to 1:10, which has the line rate.
	local tc="ip netns exec $ns tc"
	$tc qdisc replace dev "$dev" root handle 1: htb default 10
	$tc class replace dev "$dev" parent 1: classid 1:10 htb rate 10gbit quantum 65536
	$tc class replace dev "$dev" parent 1: classid 1:20 htb rate "${kbit}kbit" \
		ceil "${kbit}kbit" burst "$burst" cburst "$burst" quantum 1514
	$tc filter replace dev "$dev" parent 1: protocol ip prio 1 u32 \
		match ip "$dir" "$(addr_of br)/32" flowid 1:10
	$tc filter replace dev "$dev" parent 1: protocol ip prio 2 u32 match u32 0 0 flowid 1:20
}

cmd_rate() {
	[ $# -eq 2 ] || usage
	[[ $1 =~ ^[0-9]+$ ]] || die "rate takes a host number"
	local ns br kbit
	ns=$(ns_of "$1")
	br=$(ns_of br)
	ns_exists "$ns" || die "no namespace $ns"
	if [ "$2" = off ]; then
		ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
		ip netns exec "$br" tc qdisc del dev "vh$1" root 2>/dev/null || true
		return
	fi
	if [[ $2 =~ ^([0-9]+)kbit$ ]]; then
		kbit=${BASH_REMATCH[1]}
	elif [[ $2 =~ ^[0-9]+$ ]]; then
		kbit=$(($2 * 1000))
	else
		die "rate takes whole Mbit/s, NUMkbit or off"
	fi
	[ "$kbit" -ge 1 ] || die "rate must be at least 1kbit"
	shape_data "$ns" eth0 "$kbit" dst
	shape_data "$br" "vh$1" "$kbit" src
}

cmd_list() {
	local ns
	for ns in $(our_namespaces); do
		local h=${ns#"$prefix"-}
		if [ "$h" = br ]; then
			echo "br $ns $(addr_of br)"
		else
			echo "${h} $ns $(addr_of "${h#h}")"
		fi
	done
}

if [ "${1:-}" = --prefix ]; then
	prefix=${2:-}
	shift 2 || usage
fi
[ $# -ge 1 ] || usage
sub=$1
shift
# --prefix may also follow the subcommand of down/list/addr/link/block/rate.
args=()
while [ $# -gt 0 ]; do
	if [ "$1" = --prefix ] && [ "$sub" != up ] && [ "$sub" != exec ]; then
		prefix=${2:-}
		shift 2
		continue
	fi
	args+=("$1")
	shift
done
valid_prefix "$prefix"
case "$sub" in
up) cmd_up "${args[@]}" ;;
down) cmd_down ;;
exec) cmd_exec "${args[@]}" ;;
addr) cmd_addr "${args[@]}" ;;
link) cmd_link "${args[@]}" ;;
block) cmd_block "${args[@]}" ;;
rate) cmd_rate "${args[@]}" ;;
zone) cmd_zone "${args[@]}" ;;
list) cmd_list ;;
-h | --help | help) usage ;;
*) usage ;;
esac
