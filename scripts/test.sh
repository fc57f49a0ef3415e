#!/usr/bin/env bash
# Builds kolo and runs every test: the plain build, then (with --all) the
# ASan+UBSan and TSan builds. Usage: scripts/test.sh [--all] [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

all=0
if [ "${1:-}" = "--all" ]; then
	all=1
	shift
fi

run() { # run BUILD_DIR SANITIZER [ctest args]
	local dir=$1 san=$2
	shift 2
	echo "== build $dir ${san:+(sanitizer: $san)}"
	scripts/setup.sh --build-dir "$dir" --sanitizer "$san"
	echo "== test $dir"
	(cd "$dir" && ctest --output-on-failure --timeout 300 "$@")
}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp}

run build "" "$@"
if [ "$all" = 1 ]; then
	run build-asan address -LE nosan "$@"
	run build-tsan thread -LE "nosan|notsan" "$@"
fi
