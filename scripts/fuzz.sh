#!/usr/bin/env bash
# Builds the fuzz targets with clang's libFuzzer (+ASan+UBSan) in build-fuzz
# and runs each for a while, starting from the committed corpus.
# Usage: scripts/fuzz.sh [--seconds N] [--jobs N] [TARGET...]
#   TARGET: rdzv_json, rdzv_http, rdzv_reply, negotiate_record, tcp_hello (default: all), see tests/fuzz/.
# New inputs go to build-fuzz/corpus/TARGET; crashes to build-fuzz/crash-*.
# To keep the interesting new inputs:
#   build-fuzz/bin/fuzz_TARGET -merge=1 tests/fuzz/corpus/TARGET build-fuzz/corpus/TARGET
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
jobs=1
targets=()
while [ $# -gt 0 ]; do
	case "$1" in
	--seconds) seconds="$2"; shift ;;
	--jobs) jobs="$2"; shift ;;
	-h | --help) sed -n '2,9p' "$0"; exit 0 ;;
	*) targets+=("$1") ;;
	esac
	shift
done
[ ${#targets[@]} -gt 0 ] || targets=(rdzv_json rdzv_http rdzv_reply negotiate_record tcp_hello)

if ! command -v clang >/dev/null || [ ! -e "$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a)" ]; then
	sudo_cmd=""
	[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
	$sudo_cmd apt-get install -y --no-install-recommends clang libclang-rt-dev >/dev/null ||
		$sudo_cmd apt-get install -y --no-install-recommends clang libclang-rt-14-dev >/dev/null
fi
scripts/setup.sh --deps-only
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKOLO_SANITIZER=fuzzer \
	-DKOLO_WITH_CUDA=OFF >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]/#/fuzz_}"

export KOLO_LOG_LEVEL=error
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
for t in "${targets[@]}"; do
	mkdir -p "build-fuzz/corpus/$t"
	echo "== fuzz_$t for $seconds s"
	par=()
	[ "$jobs" -le 1 ] || par=(-jobs="$jobs" -workers="$jobs") # logs go to fuzz-N.log
	(cd build-fuzz && "bin/fuzz_$t" -max_total_time="$seconds" -timeout=10 "${par[@]}" \
		-print_final_stats=1 -dict="../tests/fuzz/$t.dict" "corpus/$t" "../tests/fuzz/corpus/$t")
done
