#!/bin/sh
# kolo_info_fake.sh KOLO_INFO: with the fakes first on LD_LIBRARY_PATH (and
# KOLO_FAKE_CUDA_DEVICES=2), kolo-info --cuda reports the fake's devices and
# NCCL, loaded from that directory.
set -u
out=$("$1" --cuda 2>&1) || { echo "FAIL kolo-info --cuda exited $?"; echo "$out"; exit 1; }
echo "$out"
dir=${LD_LIBRARY_PATH%%:*}
failures=0
for pattern in "^cuda runtime: $dir/libcudart\.so\.13, version 13\.0$" '^cuda devices: 2 visible$' \
	'^cuda device 0: kolo fake GPU 0, 16\.0 GiB, compute capability 9\.0$' \
	'^cuda device 1: kolo fake GPU 1, ' "^nccl library: $dir/libnccl\.so\.2, version 2\.28\.9$"; do
	if echo "$out" | grep -Eq "$pattern"; then
		echo "ok   /$pattern/"
	else
		echo "FAIL no line matches /$pattern/"
		failures=$((failures + 1))
	fi
done
[ "$failures" -eq 0 ]
