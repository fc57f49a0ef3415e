#!/bin/bash
# kolo-bench's command line, without a comm: help, unknown subcommands and
# bad options are reported with the right exit status before kolo_init().
# usage: bench_usage.sh KOLO_BENCH
set -u
bench=$1
fail=0
expect() { # status, args...
	local want=$1 got
	shift
	timeout 10 "$bench" "$@" >/dev/null 2>&1
	got=$?
	if [ "$got" != "$want" ]; then
		echo "FAIL: kolo-bench $*: exit $got, want $want"
		fail=1
	fi
}
expect 0 --help
expect 2
expect 2 no-such-subcommand
expect 0 allreduce --help
expect 2 allreduce --no-such-option
expect 2 allreduce -b 1M -e 8
expect 2 allreduce -d float128
expect 2 allreduce -o median
expect 2 allgather --inplace
expect 2 allreduce --device tpu
expect 0 copybw --help
expect 2 copybw -f 1
expect 2 copybw -b 1M -e 1K
help=$(timeout 10 "$bench" --help)
for sub in allreduce allgather broadcast reducescatter alltoall barrier copybw; do
	if ! grep -q "^  $sub " <<<"$help"; then
		echo "FAIL: --help does not list $sub"
		fail=1
	fi
done
exit $fail
