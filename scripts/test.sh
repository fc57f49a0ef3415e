#!/usr/bin/env bash
# Builds kolo and runs every test: the plain build, then (with --all) the
# ASan+UBSan and TSan builds. Usage: scripts/test.sh [--all] [ctest args...]
# The plain build's tests run KOLO_TEST_JOBS at a time (default 2; the tests that
# measure time or load every CPU are RUN_SERIAL), the sanitizer builds' one at a
# time (KOLO_SAN_TEST_JOBS, default 1: instrumented ranks are several times slower).
set -euo pipefail
cd "$(dirname "$0")/.."

all=0
if [ "${1:-}" = "--all" ]; then
	all=1
	shift
fi

run() { # run BUILD_DIR SANITIZER JOBS [ctest args]
	local dir=$1 san=$2 jobs=$3
	shift 3
	echo "== build $dir ${san:+(sanitizer: $san)}"
	scripts/setup.sh --build-dir "$dir" --sanitizer "$san"
	echo "== test $dir ($jobs at a time)"
	(cd "$dir" && ctest --output-on-failure --timeout 300 -j "$jobs" "$@")
}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp}

jobs=${KOLO_TEST_JOBS:-2} san_jobs=${KOLO_SAN_TEST_JOBS:-1}
run build "" "$jobs" "$@"
if [ "$all" = 1 ]; then
	run build-asan address "$san_jobs" -LE nosan "$@"
	run build-tsan thread "$san_jobs" -LE "nosan|notsan" "$@"
fi
