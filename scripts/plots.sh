#!/usr/bin/env bash
# plots.sh: run the benchmarks behind the figures of docs/performance.md, keep their JSON output
# as data and draw the figures.
#
#   scripts/plots.sh [--quick] [--out DIR] [--ranks "4 2"] [--no-torch] [--plot-only DIR]
#
# 1. scripts/bench-side-by-side.sh --sweep --json DIR: allreduce float32 busbw, 1 KiB to 256 MiB
#    by 4, kolo (shared memory and KOLO_SHM=0), Gloo ring_chunked, Open MPI (vader and btl tcp),
#    every run checked, 3 interleaved rounds at the tools' default iteration counts.
# 2. bench/torch/hvd_bench.py step --model comm|compute and bench/torch/ddp_bench.py, 4 ranks
#    under kolorun, each with --json into DIR (kolo.torch DistributedOptimizer and DDP on kolo
#    against DDP on gloo).
# 3. bench/plot.py DIR: docs/img/allreduce-busbw-shm.png, allreduce-busbw-tcp.png,
#    torch-step.png.
#
# DIR defaults to bench/results/<date>. --quick: 3 rounds of the sweep 1 KiB to 64 MiB, 10
# iterations a size above 1 MiB (bench-side-by-side.sh --big-iters 10), and 2 rounds of shorter
# PyTorch runs: about 5 minutes on 2 cores instead of about 15. --no-torch skips step 2;
# --plot-only DIR only redraws the figures from DIR.
#
# Environment: KOLO_BIN (folder with kolorun and kolo-bench; default: build kolo into build/),
# PEERS_BIN as for bench-side-by-side.sh, PYTHON (an interpreter with torch and matplotlib;
# default .venv/bin/python when present, else python3). A peer that is not installed is left
# out of the figures with a note; without torch the PyTorch figure is left out.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
quick=0
out=""
ranks="4 2"
torch=1
plot_only=""

usage() {
	sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

while [ $# -gt 0 ]; do
	case "$1" in
	--quick) quick=1; shift ;;
	--out) out=${2:?}; shift 2 ;;
	--ranks) ranks=${2:?}; shift 2 ;;
	--no-torch) torch=0; shift ;;
	--plot-only) plot_only=${2:?}; shift 2 ;;
	-h | --help) usage ;;
	*) echo "plots.sh: unknown option '$1'" >&2; usage ;;
	esac
done

if [ -n "${PYTHON:-}" ]; then
	py=$PYTHON
elif [ -x "$root/.venv/bin/python" ]; then
	py=$root/.venv/bin/python
else
	py=python3
fi
"$py" -c 'import matplotlib' 2>/dev/null || {
	echo "plots.sh: $py has no matplotlib (pip install matplotlib)" >&2
	exit 2
}

if [ -n "$plot_only" ]; then
	exec "$py" "$root/bench/plot.py" "$plot_only" --img "$root/docs/img"
fi

out=${out:-$root/bench/results/$(date +%F)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/*.json "$out"/*.jsonl "$out"/*.txt
failed=0

# 1. the allreduce sweeps, with the peers
if [ "$quick" = 1 ]; then
	side=(--sweep 1K 64M 4 --rounds 3 --big-iters 10)
else
	side=(--sweep 1K 256M 4 --rounds 3)
fi
echo "## allreduce sweeps: scripts/bench-side-by-side.sh ${side[*]} --ranks \"$ranks\" --json $out"
"$here/bench-side-by-side.sh" "${side[@]}" --ranks "$ranks" --json "$out" \
	2>&1 | tee "$out/side-by-side.txt" || failed=1
bin=${KOLO_BIN:-$root/build/bin}

# 2. PyTorch: kolo.torch and DDP on kolo against DDP on gloo, 4 ranks
if [ "$torch" = 1 ]; then
	if ! "$py" -c 'import torch' 2>/dev/null; then
		echo "## skipping the PyTorch runs: $py has no torch"
		printf '{"left_out": "%s has no torch"}\n' "$py" >"$out/torch-meta.json"
	else
		if [ "$quick" = 1 ]; then
			hvd=(--rounds 2 --iters 3 --warmup 1)
			ddp=(--rounds 2 --steps 3 --iters 3)
		else
			hvd=(--rounds 3 --iters 10 --warmup 3)
			ddp=(--rounds 3 --steps 5 --iters 5)
		fi
		"$py" - "$out/torch-meta.json" "${hvd[*]}" "${ddp[*]}" <<'PY'
import json, os, sys, time, torch
json.dump({"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "cpus": os.cpu_count(),
           "load": [float(x) for x in open("/proc/loadavg").read().split()[:3]],
           "torch": torch.__version__, "hvd_bench": sys.argv[2], "ddp_bench": sys.argv[3]},
          open(sys.argv[1], "w"), indent=1)
PY
		for m in comm compute; do
			echo "## bench/torch/hvd_bench.py step --model $m ${hvd[*]}; load: $(cut -d' ' -f1-3 /proc/loadavg)"
			KOLO_LOG_LEVEL=warn timeout -k 5 900 "$bin/kolorun" -np 4 -- "$py" \
				"$root/bench/torch/hvd_bench.py" step --model "$m" "${hvd[@]}" \
				--json "$out/hvd_step_$m.json" </dev/null 2>&1 |
				tee "$out/hvd_step_$m.txt" || failed=1
		done
		echo "## bench/torch/ddp_bench.py ${ddp[*]}; load: $(cut -d' ' -f1-3 /proc/loadavg)"
		KOLO_LOG_LEVEL=warn timeout -k 5 900 "$bin/kolorun" -np 4 -- "$py" \
			"$root/bench/torch/ddp_bench.py" "${ddp[@]}" --json "$out/ddp.json" </dev/null 2>&1 |
			tee "$out/ddp.txt" || failed=1
	fi
fi

# 3. the figures
echo "## bench/plot.py $out"
"$py" "$root/bench/plot.py" "$out" --img "$root/docs/img" || failed=1
if [ "$failed" != 0 ]; then
	echo "## FAILED: a run failed or reported wrong elements (see above)" >&2
	exit 1
fi
