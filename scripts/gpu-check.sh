#!/usr/bin/env bash
# gpu-check.sh: on a machine with a GPU, builds kolo with CUDA
# (-DKOLO_WITH_CUDA=ON, in build-gpu-check/), runs the CUDA tests and a
# short kolo-bench --device cuda sweep, and prints a summary; 8 minutes at
# most, every step bounded (timeout) so that the summary always prints.
#
# Steps (docs/gpu-user.md):
#  1. configure and build with -Werror;
#  2. kolo-info --cuda (what libkolo finds: runtime, driver, GPUs, NCCL);
#  3. ctest -L 'gpu|cuda': the gpu tests on the real libcudart (no fake on
#     LD_LIBRARY_PATH), and the cuda tests, which bring the fake of
#     tests/gpu/fake themselves where they use it;
#  4. on 2 and 4 ranks sharing the GPU(s): kolo-bench allreduce
#     --device cuda --check, the host sweep of the same bytes, and copybw
#     (pinned host <-> device, every rank at once), 1 KiB..256 MiB;
#  5. the Python CUDA tests (tests/python/test_cuda_tensors.py), with
#     torch's CUDA when a python3 with a CUDA torch is found (the others run
#     anyway: the fake and the real runtime without torch);
#  6. the summary: per size, busbw(device) / min(busbw(host), copy limit),
#     where the copy limit is copybw's bidirectional figure (each direction
#     while the other runs, as the staged pipeline copies) in busbw units
#     (x 2(n-1)/n: a rank copies the whole buffer down and up once). The
#     issue's target is >= 0.9 at 64 MiB and up.
#
# Usage: scripts/gpu-check.sh [--build-dir DIR] [--jobs N] [--max-bytes SIZE]
# Environment: CUDAToolkit_ROOT (default /usr/local/cuda), NCCL_HOME (a
# folder with include/nccl.h and lib/libnccl.so.2; found in the Python
# package nvidia-nccl-* when unset and the toolkit has no nccl.h).
# Exit status: 0 every check passed, 1 a check failed, 2 it could not build,
# 3 no GPU visible (the gpu tests were skipped), 124 out of time. A ratio
# under the target is reported in the summary, not in the exit status.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

build="build-gpu-check"
jobs=$(nproc 2>/dev/null || echo 2)
max_bytes=256M
while [ $# -gt 0 ]; do
	case "$1" in
	--build-dir) build=$2; shift 2 ;;
	--jobs) jobs=$2; shift 2 ;;
	--max-bytes) max_bytes=$2; shift 2 ;;
	-h | --help) sed -n '2,33p' "$0"; exit 0 ;;
	*) echo "gpu-check.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done

# The whole check runs under one deadline: re-run under timeout(1). Each
# step below gets what is left of it, less a reserve for the summary.
total=480
if [ -z "${KOLO_GPU_CHECK_INNER:-}" ]; then
	KOLO_GPU_CHECK_INNER=1 timeout --foreground -k 10 $total "$0" --build-dir "$build" \
		--jobs "$jobs" --max-bytes "$max_bytes"
	st=$?
	[ $st -eq 124 ] && echo "gpu-check: out of time (8 minutes)"
	exit $st
fi

t0=$(date +%s)
log() { printf '== [%3ds] %s\n' $(($(date +%s) - t0)) "$*"; }
# budget N: N seconds, or what is left before the deadline less 25 s.
budget() {
	local left=$((total - 25 - ($(date +%s) - t0)))
	[ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"
}
failures=()

# A python3 whose torch has CUDA, if any (the project's .venv, the image's, else Debian's).
python=""
for p in "$PWD/.venv/bin/python" "$(command -v python3 || true)" /usr/bin/python3; do
	[ -x "$p" ] || continue
	[ -n "$p" ] || continue
	if timeout 60 "$p" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
		2>/dev/null; then
		python=$p
		break
	fi
done
anypython=${python:-$(command -v python3 || echo /usr/bin/python3)}

# ---- where the toolkit and NCCL are ---------------------------------------
cuda_root=${CUDAToolkit_ROOT:-/usr/local/cuda}
cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DKOLO_WITH_CUDA=ON -DCUDAToolkit_ROOT="$cuda_root")
libdirs="$cuda_root/lib64:$cuda_root/lib"
nccl_home=${NCCL_HOME:-}
if [ -z "$nccl_home" ] && [ ! -f "$cuda_root/include/nccl.h" ]; then
	# pip's nvidia-nccl-cu12/-cu13 (a CUDA torch's dependency) carries it.
	nccl_home=$(timeout 60 "$anypython" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
fi
if [ -n "$nccl_home" ]; then
	cmake_args+=(-DKOLO_NCCL_INCLUDE="$nccl_home/include")
	libdirs="$libdirs:$nccl_home/lib"
fi
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log "toolkit $cuda_root; NCCL ${nccl_home:-from the toolkit or the system paths}; python with CUDA torch: ${python:-none}"

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

# ---- 1. build -----------------------------------------------------------------
log "configure $build (KOLO_WITH_CUDA=ON)"
mkdir -p "$build"
out=$PWD/$build/gpu-check
mkdir -p "$out"
if ! timeout "$(budget 120)" cmake -S . -B "$build" "${cmake_args[@]}" >"$out/configure.log" 2>&1; then
	tail -n 20 "$out/configure.log"
	echo "gpu-check: configure failed (log: $out/configure.log)"
	exit 2
fi
grep 'kolo: CUDA headers' "$out/configure.log"
log "build (-j$jobs, -Werror)"
if ! timeout "$(budget 240)" cmake --build "$build" -j "$jobs" >"$out/build.log" 2>&1; then
	grep -E 'error|warning' "$out/build.log" | head -n 30
	echo "gpu-check: build failed or ran out of time (log: $out/build.log)"
	exit 2
fi
bin=$PWD/$build/bin

# ---- 2. what kolo finds ---------------------------------------------------------
log "kolo-info --cuda"
timeout 30 "$bin/kolo-info" --cuda | tee "$out/kolo-info-cuda.txt"
command -v nvidia-smi >/dev/null && timeout 30 nvidia-smi -L | tee "$out/nvidia-smi.txt"

# ---- 3. ctest -L 'gpu|cuda' -------------------------------------------------------
log "ctest -L 'gpu|cuda' (gpu: the real libcudart; cuda: the fake where a test uses it)"
(cd "$build" && timeout "$(budget 200)" ctest -L 'gpu|cuda' -j 4 --output-on-failure --timeout 120) \
	>"$out/ctest-gpu.txt" 2>&1
ctest_st=$?
grep -E 'tests passed|tests failed|Test +#.*(Failed|Timeout|Skipped|Not Run)' "$out/ctest-gpu.txt"
[ $ctest_st -eq 0 ] || failures+=("ctest -L 'gpu|cuda' (log: $out/ctest-gpu.txt)")
# The cost figure gpu_device_test prints, for docs/gpu.md.
timeout "$(budget 60)" "$bin/gpu_device_test" 2>&1 | grep -E '^kolo_mem_kind|^SKIP' \
	>"$out/mem-kind-cost.txt"

# ---- 4. the sweeps ------------------------------------------------------------------
gpus=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
kinds="cuda cpu"
if [ "${gpus:-0}" -eq 0 ]; then
	log "no GPU visible (nvidia-smi -L): the device sweeps and copybw are skipped"
	kinds=cpu
fi
for np in 2 4; do
	for kind in $kinds; do
		log "kolo-bench allreduce --device $kind, $np ranks, 1K..$max_bytes"
		f="$out/allreduce-$kind-$np.json"
		if ! KOLO_LOG_LEVEL=warn timeout "$(budget 100)" "$bin/kolorun" -np $np -- \
			"$bin/kolo-bench" allreduce --device $kind --check --json -b 1K -e "$max_bytes" -f 4 \
			>"$f.raw" 2>"$out/allreduce-$kind-$np.err"; then
			tail -n 5 "$out/allreduce-$kind-$np.err"
			failures+=("kolo-bench allreduce --device $kind on $np ranks")
		fi
		sed -n 's/^\[0\] //p' "$f.raw" | grep '^{' >"$f"
		if grep -q '"wrong":[1-9]' "$f"; then
			failures+=("kolo-bench allreduce --device $kind on $np ranks: wrong elements")
		fi
	done
	[ "$kinds" = cpu ] && continue
	log "kolo-bench copybw, $np ranks at once, 1K..$max_bytes"
	if ! KOLO_LOG_LEVEL=warn timeout "$(budget 60)" "$bin/kolorun" -np $np -- \
		"$bin/kolo-bench" copybw --json -b 1K -e "$max_bytes" -f 4 \
		>"$out/copybw-$np.raw" 2>"$out/copybw-$np.err"; then
		tail -n 5 "$out/copybw-$np.err"
		failures+=("kolo-bench copybw on $np ranks")
	fi
	sed -n 's/^\[0\] //p' "$out/copybw-$np.raw" | grep '^{' >"$out/copybw-$np.json"
done

# ---- 5. Python --------------------------------------------------------------------
torch_line="python: no python3 with a CUDA torch here; test_cuda_tensors.py ran without torch's CUDA"
pyrun=${python:-/usr/bin/python3}
: >"$out/pytest-cuda.txt"
log "pytest tests/python/test_cuda_tensors.py ($pyrun)"
if ! timeout 60 "$pyrun" -c 'import pytest, numpy' >/dev/null 2>&1; then
	torch_line="python: $pyrun lacks pytest or numpy (pip install pytest numpy): the Python CUDA tests did not run"
	failures+=("test_cuda_tensors.py: no pytest/numpy for $pyrun")
elif KOLO_LIBRARY="$PWD/$build/lib/libkolo.so" KOLO_KOLORUN="$bin/kolorun" KOLO_PYTHON="$pyrun" \
	PYTHONPATH="$PWD/python" timeout "$(budget 240)" "$pyrun" -m pytest -q -rs -p no:cacheprovider \
	tests/python/test_cuda_tensors.py >"$out/pytest-cuda.txt" 2>&1; then
	[ -n "$python" ] && torch_line="python: CUDA tensors through kolo.torch and DDP passed ($python)"
else
	torch_line="python: tests/python/test_cuda_tensors.py FAILED (log: $out/pytest-cuda.txt)"
	failures+=("test_cuda_tensors.py")
fi
tail -n 5 "$out/pytest-cuda.txt"

# ---- 6. summary ------------------------------------------------------------------------
table() {
	# The side-by-side table of one rank count, from the JSON rows.
	"$anypython" - "$1" "$out" <<'EOF'
import json, os, sys
np_, out = int(sys.argv[1]), sys.argv[2]
def rows(name):
    p = os.path.join(out, name)
    if not os.path.exists(p):
        return {}
    with open(p) as f:
        return {r["bytes"]: r for r in map(json.loads, filter(str.strip, f))}
dev, host, copy = rows(f"allreduce-cuda-{np_}.json"), rows(f"allreduce-cpu-{np_}.json"), rows(f"copybw-{np_}.json")
factor = 2.0 * (np_ - 1) / np_
print(f"{np_} ranks: busbw GB/s (allreduce float32 sum); copy = copybw GB/s h2d/d2h/bidir; limit = min(host, bidir x {factor:g})")
print(f"  {'bytes':>10} {'device':>9} {'host':>9} {'h2d':>7} {'d2h':>7} {'bidir':>7} {'limit':>8} {'ratio':>6}")
verdicts = []
for b in sorted(set(dev) | set(host)):
    d, h, c = dev.get(b), host.get(b), copy.get(b)
    lim = None
    if h and c:
        lim = min(h["busbw_gbps"], c["bidir_gbps"] * factor)
    ratio = d["busbw_gbps"] / lim if d and lim else None
    fmt = lambda v, w=9: f"{v:>{w}.3f}" if v is not None else f"{'-':>{w}}"
    print(f"  {b:>10} {fmt(d and d['busbw_gbps'])} {fmt(h and h['busbw_gbps'])} "
          f"{fmt(c and c['h2d_gbps'], 7)} {fmt(c and c['d2h_gbps'], 7)} {fmt(c and c['bidir_gbps'], 7)} "
          f"{fmt(lim, 8)} {fmt(ratio, 6)}")
    if b >= 64 << 20 and ratio is not None:
        verdicts.append((b, ratio))
bad = [f"{b >> 20} MiB: {r:.2f}" for b, r in verdicts if r < 0.9]
if not verdicts:
    print(f"  target (>= 0.9 at 64 MiB and up): no figures")
elif bad:
    print(f"  target (>= 0.9 at 64 MiB and up): NOT met ({', '.join(bad)})")
else:
    print(f"  target (>= 0.9 at 64 MiB and up): met ({', '.join(f'{b >> 20} MiB: {r:.2f}' for b, r in verdicts)})")
EOF
}
{
	echo
	echo "== summary ($(($(date +%s) - t0)) s)"
	echo "build: KOLO_WITH_CUDA=ON compiled with -Werror"
	grep -E '^cuda (runtime|driver|devices|device [0-9]|memory)|^nccl library' "$out/kolo-info-cuda.txt"
	echo "gpus (nvidia-smi -L): ${gpus:-0}"
	grep -E 'tests passed|tests failed' "$out/ctest-gpu.txt" | sed 's/^/ctest gpu|cuda: /'
	grep -E 'Test +#.*(Failed|Timeout|Skipped|Not Run)' "$out/ctest-gpu.txt" | sed 's/^/  /'
	cat "$out/mem-kind-cost.txt"
	echo "$torch_line"
	grep -E 'passed|failed|skipped' "$out/pytest-cuda.txt" | tail -n 1 | sed 's/^/  pytest: /'
	for np in 2 4; do
		table $np
	done
} | tee "$out/summary.txt"
echo "(every log and JSON row: $out)"

if [ ${#failures[@]} -gt 0 ]; then
	printf 'gpu-check: FAILED: %s\n' "${failures[@]}"
	exit 1
fi
if [ "${gpus:-0}" -eq 0 ] || grep -q 'gpu_device_test .*Skipped' "$out/ctest-gpu.txt"; then
	echo "gpu-check: no GPU visible: the gpu tests were skipped"
	exit 3
fi
echo "gpu-check: passed"
