#!/bin/sh
# kolo_info_cuda.sh KOLO_INFO HAVE_CUDA HAVE_NCCL: kolo-info's CUDA section is
# there (alone with --cuda, and in the full report), says what the build was
# compiled with, and agrees with what this script finds on the machine
# itself (ldconfig for libcuda.so.1, nvidia-smi for the GPUs).
set -u
info=$1 have_cuda=$2 have_nccl=$3
out=$(mktemp "${TMPDIR:-/tmp}/kolo-info-cuda.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT
failures=0
check() { # check DESCRIPTION PATTERN: a line of the section matches PATTERN
	if grep -Eq "$2" "$out"; then
		echo "ok   $1"
	else
		echo "FAIL $1: no line matches /$2/"
		failures=$((failures + 1))
	fi
}

"$info" --cuda >"$out" 2>&1 || { echo "FAIL kolo-info --cuda exited $?"; cat "$out"; exit 1; }
cat "$out"
for key in "cuda build" "cuda runtime" "cuda driver" "cuda devices" "nccl library" "cuda memory"; do
	check "line '$key:'" "^$key: "
done
# The full report carries the same section.
full=$("$info" 2>&1)
while IFS= read -r line; do
	case "$full" in
	*"$line"*) ;;
	*) echo "FAIL the full report lacks: $line"; failures=$((failures + 1)) ;;
	esac
done <"$out"

if [ "$have_cuda" = 1 ]; then
	check "built with CUDA headers" '^cuda build: CUDA [0-9]+\.[0-9] headers \(CUDART_VERSION [0-9]+\)'
	if [ "$have_nccl" = 1 ]; then
		check "built with NCCL headers" 'NCCL [0-9]+\.[0-9]+\.[0-9]+ headers'
	else
		check "built without NCCL headers" 'no NCCL headers'
	fi
	driver=unknown
	if command -v ldconfig >/dev/null 2>&1 || [ -x /sbin/ldconfig ]; then
		ldc=$(command -v ldconfig || echo /sbin/ldconfig)
		if "$ldc" -p | grep -q 'libcuda\.so\.1 '; then driver=yes; else driver=no; fi
	fi
	if grep -q '^cuda runtime: none:' "$out"; then
		check "no libcudart: its reason" '^cuda runtime: none: libcudart\.so.* not found'
		check "no libcudart: host only" '^cuda memory: every buffer is host memory: '
	elif [ "$driver" = no ]; then
		check "no driver: said so" '^cuda driver: none: CUDA driver not found \(libcuda\.so\.1\): no GPU$'
		check "no driver: no devices" '^cuda devices: none: no CUDA device visible'
		check "no driver: host only" '^cuda memory: every buffer is host memory: CUDA driver not found'
	elif [ "$driver" = yes ]; then
		check "driver version" '^cuda driver: version [0-9]+\.[0-9]$'
		if command -v nvidia-smi >/dev/null 2>&1; then
			n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
			if [ "$n" -gt 0 ] && [ -z "${CUDA_VISIBLE_DEVICES+x}" ]; then
				check "$n GPUs as nvidia-smi lists" "^cuda devices: $n visible$"
				check "device 0 described" '^cuda device 0: .+, [0-9.]+ GiB, compute capability [0-9]+\.[0-9]+$'
				check "device pointers refused" '^cuda memory: device pointers are recognised and refused'
			fi
		fi
	fi
else
	check "built without CUDA" '^cuda build: without CUDA'
	check "stub: host only" '^cuda memory: every buffer is host memory: this libkolo was built without CUDA$'
	check "stub: no NCCL" '^nccl library: none: this libkolo was built without CUDA$'
fi
echo "$failures failed"
[ "$failures" -eq 0 ]
