#!/bin/sh
# verbs-check.sh: runs kolo's verbs transport over the real RDMA devices of
# this machine, which CI cannot (CI runs the same suites on the emulation:
# a test of the protocol, not of a NIC).
#
#   scripts/verbs-check.sh [BUILD_DIR]     (default: build)
#
# For each device with an active port (ibv_devices, /sys/class/infiniband):
# the transport conformance and fault suites with their verbs entries on that
# device (loopback through one HCA: both endpoints are processes of this
# machine), then kolo-transport-bench -t verbs. Prints a summary; exit 0 when
# everything passed, 1 on a failure, 77 when there is no device to check.
set -u
build=${1:-build}
bin="$build/bin"
for b in transport_conformance_test transport_fault_test kolo-transport-bench; do
	if [ ! -x "$bin/$b" ]; then
		echo "verbs-check: $bin/$b missing; build first (cmake --build $build)" >&2
		exit 2
	fi
done

# The devices: ibv_devices when rdma-core's tools are there, else sysfs.
devs=""
if command -v ibv_devices >/dev/null 2>&1; then
	devs=$(ibv_devices 2>/dev/null | awk 'NR > 2 && NF >= 1 { print $1 }')
fi
if [ -z "$devs" ] && [ -d /sys/class/infiniband ]; then
	devs=$(ls /sys/class/infiniband 2>/dev/null)
fi
echo "verbs-check: $(uname -n), kernel $(uname -r)"
"$bin/kolo-info" 2>/dev/null | sed -n '/^verbs:/,/^usable cpus/p' | grep -v '^usable' || true
if [ -z "$devs" ]; then
	echo "verbs-check: no RDMA device (no ibv_devices output, no /sys/class/infiniband): nothing to check"
	exit 77
fi
ulimit -l 2>/dev/null | sed 's/^/verbs-check: locked-memory limit (ulimit -l): /'

summary=""
fail=0
checked=0
for d in $devs; do
	# A device whose ports are all down is reported, not tested.
	active=0
	for s in /sys/class/infiniband/"$d"/ports/*/state; do
		[ -r "$s" ] && grep -q ACTIVE "$s" && active=1
	done
	[ -d /sys/class/infiniband/"$d" ] || active=1 # no sysfs: let the transport decide
	if [ "$active" = 0 ]; then
		summary="$summary
  $d: no active port, skipped"
		continue
	fi
	checked=$((checked + 1))
	for t in transport_conformance_test transport_fault_test; do
		log="/tmp/verbs-check.$d.$t.log"
		if KOLO_TT_VERBS_DEVICE="$d" CK_DEFAULT_TIMEOUT=120 timeout 900 "$bin/$t" >"$log" 2>&1; then
			r="passed"
		else
			r="FAILED (see $log)"
			fail=1
		fi
		line=$(grep -E '^[0-9]+%: Checks' "$log" | tail -1)
		summary="$summary
  $d: $t: $r ${line:+($line)}"
	done
	log="/tmp/verbs-check.$d.bench.log"
	if KOLO_IB_DEVICE="$d" timeout 300 "$bin/kolo-transport-bench" -t verbs -s 1 \
		-b 8,64K,1M,16M -n 1G >"$log" 2>&1; then
		summary="$summary
  $d: kolo-transport-bench -t verbs:
$(sed 's/^/      /' "$log")"
	else
		summary="$summary
  $d: kolo-transport-bench -t verbs FAILED (see $log)"
		fail=1
	fi
done

echo "verbs-check summary ($checked device(s) checked):$summary"
[ "$checked" = 0 ] && exit 77
exit $fail
