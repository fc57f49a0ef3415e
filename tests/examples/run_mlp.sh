#!/bin/sh
# Runs kolo-mlp under kolorun and checks what a user would see.
# usage: run_mlp.sh KOLORUN KOLO_MLP NP STATUS "PATTERN[|PATTERN...]" -- [kolo-mlp args...]
# STATUS is the exit status expected from kolorun; with 0 the output must also
# have the first epoch's line, the accuracy line and the identical-weights
# line. Every extra PATTERN (an extended regex) must match some line.
set -u
kolorun=$1 mlp=$2 np=$3 want=$4 extra=$5
shift 5
[ "${1:-}" = "--" ] && shift
out=$("$kolorun" -np "$np" -- "$mlp" "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
fail=0
if [ "$rc" -ne "$want" ]; then
	echo "run_mlp: FAIL: kolorun exited with $rc, expected $want"
	fail=1
fi
check() {
	if ! printf '%s\n' "$out" | grep -Eq -- "$1"; then
		echo "run_mlp: FAIL: no line matches: $1"
		fail=1
	fi
}
if [ "$want" -eq 0 ]; then
	check '^\[0\] epoch 1/'
	check '^\[0\] kolo-mlp: reached test accuracy 0\.[0-9]+ >= target'
	check "^\[0\] kolo-mlp: weights bitwise identical on all $np ranks"
fi
if [ -n "$extra" ]; then
	old_ifs=$IFS
	IFS='|'
	for p in $extra; do
		IFS=$old_ifs
		check "$p"
	done
	IFS=$old_ifs
fi
exit $fail
