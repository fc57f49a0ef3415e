#!/usr/bin/env bash
# Soak test of elastic training (tests/soak/soak.py, docs/testing.md "Soak
# test"): an elastic job under random SIGKILLs, SIGTERMs, SIGSTOP/SIGCONT,
# joins and rendezvous restarts for M minutes, every step's result checked.
#
#   scripts/soak.sh --minutes M [--seed S] [--ranks N] [--min-np A] [--max-np B]
#                   [--async] [--shm 0] [--hang-s S] [--rss-bound-mib MIB] ...
#
#   scripts/soak.sh --torch [--seconds S] [--seed S] ...
#                   the same for PyTorch training with Horovod's elastic API
#                   (tests/soak/soak_torch.py): kills, leaves, stops and joins
#                   for S seconds, then identical replicas at the end
#
# Builds nothing: it takes kolo-rendezvous and elastic_worker (or kolorun)
# from KOLO_BIN (default build/bin; run scripts/setup.sh or scripts/test.sh
# first). Prints one "soak: SUMMARY ..." line and exits 0 only when no result
# was wrong, nothing hung, every check held and no worker's RSS grew past
# the bound. `scripts/soak.sh [--torch] --help` lists every option.
set -euo pipefail
cd "$(dirname "$0")/.."
export KOLO_BIN=${KOLO_BIN:-build/bin}
if [ $# -eq 0 ]; then
	sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 64
fi
py=${KOLO_PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
if [ "$1" = --torch ]; then
	shift
	exec "$py" tests/soak/soak_torch.py --python "$py" "$@"
fi
exec "$py" tests/soak/soak.py "$@"
