#!/bin/bash
# A short checked sweep of one collective through kolorun: every JSON line
# must report wrong == 0, and there must be one line per size.
# usage: bench_check.sh KOLORUN KOLO_BENCH COLLECTIVE
set -u
kolorun=$1
bench=$2
coll=$3
fail=0

# The sizes kolo-bench visits for -b min -e max -f factor.
rows() {
	local b=$1 e=$2 f=$3 n=0
	while [ "$b" -le "$e" ]; do
		n=$((n + 1))
		b=$((b * f))
	done
	echo $n
}

run() { # ranks, min, max, factor, extra args...
	local np=$1 b=$2 e=$3 f=$4 out rc lines want got bad
	shift 4
	out=$(timeout 240 "$kolorun" -np "$np" -- "$bench" "$coll" -b "$b" -e "$e" -f "$f" \
		--check --json --iters 3 --warmup 1 "$@" 2>&1)
	rc=$?
	lines=$(printf '%s\n' "$out" | grep -o '{"op":.*}')
	want=$(rows "$b" "$e" "$f")
	[ "$coll" = barrier ] && want=1
	got=$(printf '%s\n' "$lines" | grep -c "\"op\":\"$coll\".*\"ranks\":$np,")
	bad=$(printf '%s\n' "$lines" | grep -vc '"wrong":0,')
	if [ "$rc" != 0 ] || [ "$got" != "$want" ] || [ "$bad" != 0 ]; then
		echo "FAIL: $coll np=$np $*: exit $rc, $got of $want rows, $bad rows with wrong != 0"
		printf '%s\n' "$out" | tail -40
		fail=1
	else
		echo "ok: $coll np=$np $* ($got rows)"
	fi
}

for np in 2 3 4; do
	run $np 8 1048576 4
done
case $coll in
allreduce)
	# Every dtype, and every op on three of them, on 3 ranks (counts not
	# divisible by the size); then in place.
	for dt in int8 uint8 int32 int64 float16 bfloat16 float32 float64; do
		run 3 4 65536 16 -d "$dt"
	done
	for dt in int8 bfloat16 float32; do
		for op in average min max product; do
			run 3 4 65536 16 -d "$dt" -o "$op"
		done
	done
	run 4 8 1048576 8 --inplace
	;;
reducescatter)
	for op in average min max product; do
		run 3 4 65536 16 -d bfloat16 -o "$op"
	done
	;;
broadcast)
	run 3 8 1048576 8 --root 2
	;;
allgather | alltoall)
	run 3 4 65536 16 -d float16
	;;
esac
exit $fail
