#!/bin/sh
# kolo-bench --device cuda on 2 ranks, every collective, checked (--check:
# each output element against the float64 reference the ranks compute), and
# copybw; over the fake CUDA runtime of tests/gpu/fake when FAKE_LIB is a
# folder that holds it, over the real one when FAKE_LIB is "none" (a GPU
# machine). Without a device kolo-bench must fail with the reason.
#
# Usage: bench_cuda_test.sh KOLORUN KOLO_BENCH FAKE_LIB
# Exit: 0 passed, 1 failed, 77 skipped (the fake is not built, no GPU).
set -u
kolorun=$1 bench=$2 fake=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

if [ "$fake" != none ]; then
	if [ ! -e "$fake/libcudart.so.13" ]; then
		echo "SKIP: the fake CUDA runtime is not built ($fake/libcudart.so.13 absent)"
		exit 77
	fi
	LD_LIBRARY_PATH="$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	export LD_LIBRARY_PATH
	# Two ranks on one fake GPU, as on the one-GPU machine.
	KOLO_FAKE_CUDA_DEVICES=1
	export KOLO_FAKE_CUDA_DEVICES
elif ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
	echo "SKIP: no GPU visible (nvidia-smi -L)"
	exit 77
fi
KOLO_LOG_LEVEL=warn
export KOLO_LOG_LEVEL

# Each collective: a few sizes, every row checked; the JSON rows must say
# device cuda and 0 wrong elements, one row per size.
for coll in allreduce allgather broadcast reducescatter alltoall; do
	for extra in "" "--dtype float16" "--inplace"; do
		[ "$extra" = --inplace ] && [ "$coll" != allreduce ] && continue
		out=$tmp/$coll.json
		# shellcheck disable=SC2086
		if ! timeout 120 "$kolorun" -np 2 -- "$bench" "$coll" --device cuda --check --json \
			-b 1K -e 256K -f 16 --iters 3 --warmup 1 $extra >"$out" 2>"$tmp/err"; then
			cat "$out" "$tmp/err"
			fail "kolo-bench $coll --device cuda $extra"
		fi
		rows=$(grep -c '"device":"cuda"' "$out")
		good=$(grep '"device":"cuda"' "$out" | grep -c '"wrong":0[,}]')
		# 1K, 16K, 256K
		[ "$rows" -eq 3 ] || { cat "$out"; fail "$coll $extra: $rows device rows, want 3"; }
		[ "$good" -eq 3 ] || { cat "$out"; fail "$coll $extra: wrong elements"; }
		echo "ok: $coll --device cuda $extra: $rows sizes checked"
	done
done

# The table's header names the device.
timeout 60 "$kolorun" -np 2 -- "$bench" allreduce --device cuda -b 4K -e 4K --iters 2 \
	>"$tmp/table" 2>"$tmp/err" || { cat "$tmp/table" "$tmp/err"; fail "allreduce table"; }
grep -q '^\[0\] # device: rank 0 on cuda:0 ' "$tmp/table" || { cat "$tmp/table"; fail "no device line"; }
grep '# device:' "$tmp/table"

# copybw: alone and on 2 ranks at once, 4K..1M by 4 (5 sizes), every figure positive.
for np in 1 2; do
	if [ $np -eq 1 ]; then
		timeout 60 "$bench" copybw -b 4K -e 1M --json >"$tmp/copy" 2>"$tmp/err"
	else
		timeout 60 "$kolorun" -np 2 -- "$bench" copybw -b 4K -e 1M --json >"$tmp/copy" 2>"$tmp/err"
	fi || { cat "$tmp/copy" "$tmp/err"; fail "copybw on $np ranks"; }
	n=$(grep -c '"op":"copybw"' "$tmp/copy")
	pos=$(grep '"op":"copybw"' "$tmp/copy" | grep -vc '_gbps":0\.0000')
	[ "$n" -eq 5 ] && [ "$pos" -eq 5 ] || { cat "$tmp/copy"; fail "copybw on $np ranks: $n rows, $pos positive"; }
	echo "ok: copybw on $np rank(s): $n sizes"
done

# Without any CUDA runtime (the fake's folder dropped, no libcudart found),
# --device cuda fails with the reason rather than running on the host.
if [ "$fake" != none ]; then
	if env LD_LIBRARY_PATH=/nonexistent timeout 60 "$kolorun" -np 2 -- "$bench" allreduce \
		--device cuda -b 1K -e 1K >"$tmp/none" 2>&1; then
		if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
			cat "$tmp/none"
			fail "--device cuda ran with no CUDA device"
		fi
	else
		grep -q -- '--device cuda: no CUDA device' "$tmp/none" || { cat "$tmp/none"; fail "no reason given"; }
		echo "ok: no device: $(grep -m1 -o -- '--device cuda: .*' "$tmp/none")"
	fi
fi
echo "PASS"
