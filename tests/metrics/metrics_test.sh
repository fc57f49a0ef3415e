#!/bin/sh
# The worker's metrics endpoint through kolorun (tests/metrics/CMakeLists.txt).
# usage: metrics_test.sh KOLORUN METRICS_WORKER DOCS_METRICS_MD OUTDIR
set -u
kolorun=$1
worker=$2
doc=$3
dir=$4
fail=0
mkdir -p "$dir" || exit 2

# run LISTEN: two workers with KOLO_METRICS_LISTEN=LISTEN; sets $out, $rc.
run() {
	out=$(KOLO_METRICS_LISTEN=$1 timeout 60 "$kolorun" -np 2 -- "$worker" "$dir/scrape.txt" 2>&1)
	rc=$?
}

report() { # NAME OK
	if [ "$2" = 1 ]; then
		echo "ok: $1"
	else
		echo "FAIL: $1 (exit $rc)"
		printf '%s\n' "$out" | tail -30
		fail=1
	fi
}

# Port 0: each worker takes a free port; they find each other's through an
# allgather.
run 127.0.0.1:0
report "port 0" "$([ "$rc" = 0 ] && [ "$(printf '%s\n' "$out" | grep -c 'metrics ok')" = 2 ] &&
	echo 1)"

# :PORT: every address, PORT + local rank (the worker checks it). A base
# that another program holds is retried with another.
for try in 1 2 3 4 5; do
	base=$((30000 + ($$ * 7 + try * 7919) % 30000))
	run ":$base"
	case $out in
	*"cannot listen"*) continue ;;
	esac
	break
done
report "port $base + local rank" "$([ "$rc" = 0 ] &&
	[ "$(printf '%s\n' "$out" | grep -c 'metrics ok')" = 2 ] && echo 1)"

# The scraped families are the documented ones.
scraped=$(grep '^# TYPE ' "$dir/scrape.txt" | awk '{print $3}' | sort -u)
documented=$(grep -o '^| `kolo_[a-z0-9_]*`' "$doc" | tr -d '|` ' | sort -u)
if [ -n "$scraped" ] && [ "$scraped" = "$documented" ]; then
	echo "ok: $(printf '%s\n' "$scraped" | wc -l) metric families, as docs/metrics.md"
else
	echo "FAIL: scraped and documented metrics differ (< scraped, > docs/metrics.md):"
	printf '%s\n' "$scraped" >"$dir/scraped-names.txt"
	printf '%s\n' "$documented" >"$dir/documented-names.txt"
	diff "$dir/scraped-names.txt" "$dir/documented-names.txt"
	fail=1
fi

# A failure re-form: rank 2 of three exits; the two survivors re-form and
# check the re-form's counters and phases (metrics_worker --elastic).
out=$(KOLO_METRICS_LISTEN=127.0.0.1:0 timeout 60 "$kolorun" -np 3 --min-np 2 --max-np 3 -- \
	"$worker" --elastic 2>&1)
rc=$?
report "elastic re-form" "$([ "$rc" = 0 ] &&
	[ "$(printf '%s\n' "$out" | grep -c 'elastic ok')" = 2 ] && echo 1)"

# Malformed values: kolo_init fails at once, saying what is wrong.
for bad in nope :70000 127.0.0.1:http :-1; do
	out=$(KOLO_METRICS_LISTEN=$bad timeout 30 "$kolorun" -np 1 -- "$worker" 2>&1)
	rc=$?
	report "KOLO_METRICS_LISTEN=$bad refused" "$([ "$rc" != 0 ] &&
		printf '%s\n' "$out" | grep -q "kolo_init: KOLO_METRICS_LISTEN=\"$bad\"" && echo 1)"
done
exit $fail
