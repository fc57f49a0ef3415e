#!/bin/sh
# kolo-doctor against a real kolo-rendezvous: a job of 4 workers registered
# with curl, flight-recorder reports put into its KV by hand (rank 2 skipped
# step.20), and the errors: unknown job, no token, usage, no server.
# usage: kolo_doctor_test.sh KOLO_RENDEZVOUS KOLO_DOCTOR
set -u
SERVER=$1
DOCTOR=$2
command -v curl >/dev/null || { echo "SKIP: no curl"; exit 77; }
DIR=$(mktemp -d)
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
echo "test-token-$$" > "$DIR/token"
KOLO_LOG_LEVEL=warn "$SERVER" --listen 127.0.0.1:0 --token-file "$DIR/token" \
	--lease-ms 60000 > "$DIR/out" 2> "$DIR/err" &
PID=$!
for _ in $(seq 100); do
	grep -q listening "$DIR/out" && break
	sleep 0.1
done
U=http://$(sed -n 's/^listening on //p' "$DIR/out")
[ "$U" != "http://" ] || { echo "FAIL: the server did not start"; cat "$DIR/err"; exit 1; }
A="Authorization: Bearer $(cat "$DIR/token")"
export KOLO_TOKEN_FILE="$DIR/token"
fails=0
check() { # check NAME EXPECTED_RC ACTUAL_RC [PATTERN FILE]
	if [ "$2" != "$3" ]; then
		echo "FAIL: $1: exit $3, expected $2"; cat "$DIR/doc"; fails=$((fails + 1))
	elif [ $# -ge 5 ] && ! grep -q -- "$4" "$5"; then
		echo "FAIL: $1: no \"$4\" in"; cat "$5"; fails=$((fails + 1))
	else
		echo "ok: $1"
	fi
}

"$DOCTOR" "$U" nojob --no-request > "$DIR/doc" 2>&1
check "unknown job" 2 $? "unknown job nojob" "$DIR/doc"

curl -sf -X PUT -H "$A" "$U/v1/jobs/j" -d '{"min_np":4,"max_np":4}' > /dev/null
for h in hostA hostA hostB hostB; do
	curl -sf -X POST -H "$A" "$U/v1/jobs/j/workers" -d "{\"host\":\"$h\"}" > /dev/null
done
"$DOCTOR" "$U" j --wait-ms 300 > "$DIR/doc" 2>&1
check "no reports: no stall" 0 $? "no stalled collective" "$DIR/doc"
grep -q "no_report" "$DIR/doc" || { echo "FAIL: no no_report row"; fails=$((fails + 1)); }

now=$(date +%s%3N)
put_report() { # put_report RANK HOST ENTRIES
	curl -sf -X PUT -H "$A" "$U/v1/jobs/j/kv/diag/report/$1" --data-binary \
		"{\"version\":1,\"rank\":$1,\"size\":4,\"round\":1,\"host\":\"$2\",\"gen\":1,\"time_ms\":$now,\"comms\":[{\"label\":\"job\",\"members\":[0,1,2,3],\"activity\":\"negotiating\",\"waiting_on\":-1,\"waiting_ms\":0,\"entries\":[$3]}]}"
}
DONE19='{"name":"step.19","op":"allreduce","state":"done","age_ms":3300.0,"status":"KOLO_OK"}'
OPEN20='{"name":"step.20","op":"allreduce","state":"submitted","age_ms":3200.0,"status":"KOLO_OK"}'
put_report 0 hostA "$DONE19,$OPEN20"
put_report 1 hostA "$DONE19,$OPEN20"
put_report 2 hostB "$DONE19"
put_report 3 hostB "$DONE19,$OPEN20"
"$DOCTOR" "$U" j --no-request > "$DIR/doc" 2>&1
check "skipped allreduce" 1 $? \
	"rank 2 (host hostB) never submitted allreduce 'step.20' that ranks 0, 1, 3 wait in" "$DIR/doc"
cat "$DIR/doc"
"$DOCTOR" "$U" j --no-request --json > "$DIR/doc" 2>&1
check "--json" 1 $? '"kind":"not_submitted"' "$DIR/doc"
# The ops have been open 3.2 s: with --min-ms 5000 that is no stall yet.
"$DOCTOR" "$U" j --no-request --min-ms 5000 > "$DIR/doc" 2>&1
check "--min-ms above the ops' age" 0 $? "no stalled collective" "$DIR/doc"
"$DOCTOR" "$U" j --no-request --min-ms 100 > "$DIR/doc" 2>&1
check "--min-ms below it" 1 $? "never submitted allreduce 'step.20'" "$DIR/doc"
"$DOCTOR" "$U" j --min-ms -1 > "$DIR/doc" 2>&1
check "bad --min-ms" 2 $? "bad value" "$DIR/doc"

curl -s -X POST -H "$A" "$U/v1/jobs/j/diagnosis" > "$DIR/doc"
check "POST makes request 2 (reports answered 1)" 0 $? '{"request":2}' "$DIR/doc"
curl -s -H "$A" "$U/v1/jobs/j/kv/diag/request/2" > "$DIR/doc"
check "the request key is in the KV" 0 $? '"request":2' "$DIR/doc"
curl -s -H "$A" "$U/v1/jobs/j/diagnosis?request=2" > "$DIR/doc"
check "GET ?request=2 is not complete" 0 $? '"complete":false' "$DIR/doc"
curl -s -H "$A" "$U/v1/jobs/j/diagnosis?min_ms=x" > "$DIR/doc"
check "bad min_ms" 0 $? 'must be integers' "$DIR/doc"
curl -s -X DELETE -H "$A" -D "$DIR/hdr" "$U/v1/jobs/j/diagnosis" > "$DIR/doc"
check "DELETE is 405" 0 $? 'Allow: GET, POST' "$DIR/hdr"
curl -s "$U/v1/jobs/j/diagnosis" > "$DIR/doc"
check "no token is 401" 0 $? 'bearer token' "$DIR/doc"

KOLO_TOKEN_FILE= KOLO_TOKEN= "$DOCTOR" "$U" j --no-request > "$DIR/doc" 2>&1
check "kolo-doctor without a token" 2 $?
"$DOCTOR" "$U" > "$DIR/doc" 2>&1
check "usage error" 2 $? "usage" "$DIR/doc"
"$DOCTOR" "$U" j --wait-ms x > "$DIR/doc" 2>&1
check "bad --wait-ms" 2 $? "bad value" "$DIR/doc"
kill $PID; wait $PID 2>/dev/null
"$DOCTOR" "$U" j --no-request > "$DIR/doc" 2>&1
check "no server" 2 $?
[ $fails -eq 0 ] || { echo "$fails failed"; exit 1; }
echo "all passed"
