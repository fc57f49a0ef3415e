#!/bin/bash
# The elastic example end to end, against a kolo-rendezvous server:
#   1. kolorun starts 3 workers (elastic, --restart-failed); rank 1 kills itself
#      with SIGKILL at step 200; kolorun starts a replacement, which joins.
#   2. After the first epoch, a second kolorun adds one more worker: it joins
#      the running job at a commit point (no failure, no rollback).
# Passes when rank 0 reports bitwise-identical weights on all 4 ranks and the
# target accuracy, and every process exits 0. Every wait is bounded.
#   run_elastic_mlp.sh KOLORUN KOLO_RENDEZVOUS KOLO_ELASTIC_MLP
set -u
kolorun=$1 server=$2 mlp=$3
dir=$(mktemp -d /tmp/kolo-elastic-mlp-XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$dir"/*.log; do echo "--- $f"; tail -30 "$f"; done; exit 1; }

head -c 24 /dev/urandom | base64 > "$dir/token"
"$server" --listen 127.0.0.1:0 --token-file "$dir/token" --min-np 2 --max-np 4 \
	--settle-ms 300 > "$dir/server.out" 2> "$dir/server.log" &
pids+=($!)
port=""
for _ in $(seq 200); do
	port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$dir/server.out")
	[ -n "$port" ] && break
	sleep 0.05
done
[ -n "$port" ] || fail "the server did not start"
url=http://127.0.0.1:$port
common=(--rendezvous "$url" --token-file "$dir/token" --job mlp --min-np 2 --max-np 4)
export KOLO_HEARTBEAT_MS=300 KOLO_IFACE=127.0.0.1

timeout 300 "$kolorun" -np 3 "${common[@]}" --restart-failed --max-restarts 1 -- \
	"$mlp" --epochs 4 --kill-at 200 > "$dir/main.log" 2>&1 &
main=$!
pids+=($main)
for _ in $(seq 1200); do
	grep -q "epoch 1/4" "$dir/main.log" && break
	kill -0 $main 2>/dev/null || break
	sleep 0.1
done
grep -q "epoch 1/4" "$dir/main.log" || fail "no first epoch"
timeout 300 "$kolorun" -np 1 "${common[@]}" -- "$mlp" --epochs 4 > "$dir/join.log" 2>&1 &
join=$!
pids+=($join)
wait $main; rc_main=$?
wait $join; rc_join=$?
grep -q "killing myself" "$dir/main.log" || fail "the worker did not kill itself"
grep -q "started replacement" "$dir/main.log" || fail "no replacement was started"
grep -q "weights bitwise identical on all 4 ranks" "$dir/main.log" ||
	fail "weights not identical on 4 ranks"
grep -q "reached test accuracy" "$dir/main.log" || fail "target accuracy missed"
[ $rc_main = 0 ] || fail "kolorun (main) exited $rc_main"
[ $rc_join = 0 ] || fail "kolorun (joiner) exited $rc_join"
grep "epoch \|trained\|reached\|identical\|round [0-9]*: rank" "$dir/main.log" "$dir/join.log" |
	sed "s|$dir/||"
echo "PASS"
