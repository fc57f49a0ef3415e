#!/bin/bash
# Warm spares (kolorun --spares): 3 members and 2 spares with the embedded
# rendezvous; rank 1 kills itself with SIGKILL at step 100. Passes when the
# next round has 3 ranks again, one of them a spare (the server's log adds it
# in the round that drops the dead worker), every rank of it starts at the
# same step, the weights end bitwise identical on 3 ranks with the target
# accuracy, the unused spare is told that the job finished, and kolorun exits
# 0; and the weights equal those of a run of 3 workers with no failure (the
# job never shrank: same sizes, same data per step, same sums). Every wait is
# bounded.
#   run_elastic_spares.sh KOLORUN KOLO_ELASTIC_MLP
set -u
kolorun=$1 mlp=$2
dir=$(mktemp -d /tmp/kolo-elastic-spares-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; tail -60 "$dir/run.log"; exit 1; }

export KOLO_HEARTBEAT_MS=300 KOLO_IFACE=127.0.0.1 KOLO_LOG_LEVEL=info
args=(--epochs 1 --target 0.85)
timeout 300 "$kolorun" -np 3 -- "$mlp" "${args[@]}" > "$dir/plain.log" 2>&1 ||
	{ tail -30 "$dir/plain.log"; fail "the run without a failure failed"; }
hash=$(sed -n 's/.*weights bitwise identical on all 3 ranks (hash \([0-9a-f]*\)).*/\1/p' \
	"$dir/plain.log")
[ -n "$hash" ] || fail "no hash from the run without a failure"
timeout 300 "$kolorun" -np 3 --spares 2 -- "$mlp" "${args[@]}" --kill-at 100 > "$dir/run.log" 2>&1
rc=$?
[ $rc = 0 ] || fail "kolorun exited $rc"
grep -q "killing myself" "$dir/run.log" || fail "the worker did not kill itself"
r2=$(grep "round 2 formed" "$dir/run.log")
[ -n "$r2" ] || fail "no round 2"
echo "$r2" | grep -q "round 2 formed: 3 workers" || fail "round 2 is not of 3 workers: $r2"
echo "$r2" | grep -q "added=\[w-[0-9a-f]*@" || fail "round 2 added no spare: $r2"
# Its kolorun reports the dead worker by id; a survivor may report its rank first.
echo "$r2" | grep -Eq "dropped=\[w-[0-9a-f]*@[^]]* \((its process died|reported failed in round 1)\)" ||
	fail "round 2 dropped nobody: $r2"
starts=$(grep -c "kolo-elastic-mlp: round 2: rank [0-2] of 3, epoch 1, step 100 " "$dir/run.log")
[ "$starts" = 3 ] || fail "$starts ranks of round 2 started at step 100, not 3"
grep -q "weights bitwise identical on all 3 ranks (hash $hash)" "$dir/run.log" ||
	fail "weights not identical on 3 ranks, or not those of the run without a failure ($hash)"
grep -q "reached test accuracy" "$dir/run.log" || fail "target accuracy missed"
grep -q "nothing to do" "$dir/run.log" || fail "the unused spare was not told the job finished"
grep -E "killing myself|round [0-9]+ formed|round 2: rank|trained|reached|identical|nothing to do" \
	"$dir/run.log" | sed -E 's/^[0-9T:.-]+Z //'
echo "PASS: the same weights as without a failure (hash $hash)"
