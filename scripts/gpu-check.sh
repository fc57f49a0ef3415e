#!/usr/bin/env bash
# gpu-check.sh: on a machine with a GPU, builds kolo with CUDA
# (-DKOLO_WITH_CUDA=ON, in build-gpu-check/), runs the CUDA tests and
# kolo-info, and prints a summary; 8 minutes at most (timeout). What it
# checks so far (docs/gpu.md): that the CUDA build compiles with -Werror,
# that libcudart, the driver, the GPUs and libnccl are found at run time,
# that device memory is recognised (device, managed, pinned host) and that
# every collective, blocking and async, refuses it with KOLO_EUNSUPPORTED.
# There is no device data path yet, so there is no kolo-bench --device cuda
# sweep to run; the script says so.
#
# Usage: scripts/gpu-check.sh [--build-dir DIR] [--jobs N]
# Environment: CUDAToolkit_ROOT (default /usr/local/cuda), NCCL_HOME (a
# folder with include/nccl.h and lib/libnccl.so.2; found in the Python
# package nvidia-nccl-* when unset and the toolkit has no nccl.h).
# Exit status: 0 every check passed, 1 a check failed, 2 it could not build,
# 3 no GPU visible (the gpu tests were skipped), 124 out of time.
set -uo pipefail
cd "$(dirname "$0")/.."

build=build-gpu-check
jobs=$(nproc 2>/dev/null || echo 2)
while [ $# -gt 0 ]; do
	case "$1" in
	--build-dir) build=$2; shift 2 ;;
	--jobs) jobs=$2; shift 2 ;;
	-h | --help) sed -n '2,18p' "$0"; exit 0 ;;
	*) echo "gpu-check.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done

# The whole check runs under one deadline: re-run under timeout(1).
if [ -z "${KOLO_GPU_CHECK_INNER:-}" ]; then
	KOLO_GPU_CHECK_INNER=1 timeout --foreground -k 10 480 "$0" --build-dir "$build" --jobs "$jobs"
	st=$?
	[ $st -eq 124 ] && echo "gpu-check: out of time (8 minutes)"
	exit $st
fi

t0=$(date +%s)
log() { printf '== [%3ds] %s\n' $(($(date +%s) - t0)) "$*"; }
python=$(command -v python3 || echo /usr/bin/python3)

# ---- where the toolkit and NCCL are ---------------------------------------
cuda_root=${CUDAToolkit_ROOT:-/usr/local/cuda}
cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DKOLO_WITH_CUDA=ON -DCUDAToolkit_ROOT="$cuda_root")
libdirs="$cuda_root/lib64:$cuda_root/lib"
nccl_home=${NCCL_HOME:-}
if [ -z "$nccl_home" ] && [ ! -f "$cuda_root/include/nccl.h" ]; then
	# pip's nvidia-nccl-cu12/-cu13 (a CUDA torch's dependency) carries it.
	nccl_home=$("$python" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
fi
if [ -n "$nccl_home" ]; then
	cmake_args+=(-DKOLO_NCCL_INCLUDE="$nccl_home/include")
	libdirs="$libdirs:$nccl_home/lib"
fi
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log "toolkit $cuda_root; NCCL ${nccl_home:-from the toolkit or the system paths}"

# ---- what the build needs besides CUDA --------------------------------------
missing=""
for pc in libmicrohttpd jansson libcurl libcrypto check; do
	pkg-config --exists "$pc" 2>/dev/null || missing="$missing $pc"
done
[ -f /usr/include/infiniband/verbs.h ] || missing="$missing libibverbs-dev(infiniband/verbs.h)"
if [ -n "$missing" ]; then
	echo "gpu-check: missing build dependencies:$missing"
	echo "  install them with scripts/setup.sh --deps-only (Debian/Ubuntu, needs the network),"
	echo "  or unpack their -dev .deb packages and point PKG_CONFIG_PATH at them"
	exit 2
fi

# ---- build ------------------------------------------------------------------
log "configure $build (KOLO_WITH_CUDA=ON)"
mkdir -p "$build"
if ! cmake -S . -B "$build" "${cmake_args[@]}" >"$build/configure.log" 2>&1; then
	tail -n 20 "$build/configure.log"
	echo "gpu-check: configure failed (log: $build/configure.log)"
	exit 2
fi
grep 'kolo: CUDA headers' "$build/configure.log"
log "build (-j$jobs, -Werror)"
if ! cmake --build "$build" -j "$jobs" >"$build/build.log" 2>&1; then
	grep -E 'error|warning' "$build/build.log" | head -n 30
	echo "gpu-check: build failed (log: $build/build.log)"
	exit 2
fi

# ---- what kolo finds ----------------------------------------------------------
log "kolo-info --cuda"
"$build/bin/kolo-info" --cuda | tee "$build/kolo-info-cuda.txt"
command -v nvidia-smi >/dev/null && nvidia-smi -L

# ---- tests ----------------------------------------------------------------------
log "ctest: the loader (gpu_test), the checker on host memory, kolo-info (label cuda), the device tests (label gpu)"
(cd "$build" && ctest --output-on-failure --timeout 120 -R '^gpu_test$|^gpu_args_test$|^kolo_info_cuda$|^gpu_device_test$|^api_test$') 2>&1 |
	tee "$build/ctest-gpu.txt"
ctest_st=${PIPESTATUS[0]}
# The cost figure gpu_device_test prints, for docs/gpu.md.
"$build/bin/gpu_device_test" 2>&1 | grep -E '^kolo_mem_kind|^SKIP' | tee "$build/mem-kind-cost.txt"

# A CUDA torch, when there is one: kolo.torch refuses its tensors clearly.
torch_line="python: no torch with CUDA here"
if "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	if KOLO_LIBRARY="$PWD/$build/lib/libkolo.so" PYTHONPATH="$PWD/python" "$python" -m pytest -q \
		-p no:cacheprovider tests/python/test_cuda_tensors.py >"$build/pytest-cuda.txt" 2>&1; then
		torch_line="python: CUDA tensors refused clearly (tests/python/test_cuda_tensors.py passed)"
	else
		torch_line="python: tests/python/test_cuda_tensors.py FAILED (log: $build/pytest-cuda.txt)"
		ctest_st=1
	fi
fi

# ---- summary ------------------------------------------------------------------------
echo
echo "== summary ($(($(date +%s) - t0)) s)"
echo "build: KOLO_WITH_CUDA=ON compiled with -Werror"
grep -E '^cuda (runtime|driver|devices|memory)|^nccl library' "$build/kolo-info-cuda.txt"
grep -E 'tests passed|tests failed|Skipped|\*\*\*' "$build/ctest-gpu.txt"
cat "$build/mem-kind-cost.txt"
echo "$torch_line"
echo "kolo-bench --device cuda: not yet (no device data path; docs/gpu.md)"
if [ "$ctest_st" -ne 0 ]; then
	echo "gpu-check: FAILED"
	exit 1
fi
if grep -q 'gpu_device_test .*Skipped' "$build/ctest-gpu.txt"; then
	echo "gpu-check: no GPU visible: the gpu tests were skipped"
	exit 3
fi
echo "gpu-check: passed"
