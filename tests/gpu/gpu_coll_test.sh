#!/bin/sh
# gpu_coll_test.sh KOLORUN WORKER NP MODE LIBDIR [TIMELINE]: runs
# gpu_coll_worker MODE on NP ranks. LIBDIR holds the fake libcudart.so.13 and
# libnccl.so.2 (tests/gpu/fake), put first on LD_LIBRARY_PATH; "none" uses
# the machine's own CUDA (a real GPU). Exits 77 (skipped) without the fake or
# without a visible device. MODE all and timeout: every worker must pass
# (timeout with KOLO_TIMEOUT_MS=500). MODE kill: the
# last rank dies, and every other one must report its failed collectives
# within the bound (no hang).
set -u
kolorun=$1 worker=$2 np=$3 mode=$4 libdir=$5 timeline=${6:-}
if [ "$libdir" != none ]; then
	if [ ! -e "$libdir/libcudart.so.13" ]; then
		echo "skipped: the fake CUDA runtime is not built ($libdir/libcudart.so.13)"
		exit 77
	fi
	LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	export LD_LIBRARY_PATH
fi
# Chunks small enough that every staged allreduce and broadcast of the test
# is pipelined; a cycle long enough that the small tensors enqueued together
# fuse. A dead peer is seen by EOF at once; the timeout only bounds the test.
KOLO_GPU_STAGE_CHUNK_BYTES=65536 KOLO_CYCLE_TIME=20 KOLO_TIMEOUT_MS=15000
[ "$mode" = timeout ] && KOLO_TIMEOUT_MS=500
export KOLO_GPU_STAGE_CHUNK_BYTES KOLO_CYCLE_TIME KOLO_TIMEOUT_MS
out=$(mktemp "${TMPDIR:-/tmp}/gpu-coll.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT
timeout 100 "$kolorun" -np "$np" -- "$worker" "$mode" $timeline >"$out" 2>&1
rc=$?
cat "$out"
if grep -q "gpu_coll_worker: skipped" "$out"; then
	exit 77
fi
if [ "$mode" = kill ]; then
	[ $rc -eq 124 ] && { echo "FAIL: the job hung"; exit 1; }
	want=$((np - 1))
	got=$(grep -c "survivor rank .*: async KOLO_E[A-Z]*, blocking KOLO_E[A-Z]* after" "$out")
	slow=$(grep "survivor rank" "$out" | sed 's/.* after \([0-9]*\) ms.*/\1/' |
		awk '$1 > 20000' | wc -l)
	if [ "$got" -ne "$want" ] || [ "$slow" -ne 0 ]; then
		echo "FAIL: $got of $want survivors failed as they must ($slow too slowly)"
		exit 1
	fi
	echo "ok: $got survivors failed their collectives, none hung"
	exit 0
fi
[ $rc -eq 0 ] || { echo "FAIL: kolorun exited $rc"; exit 1; }
exit 0
