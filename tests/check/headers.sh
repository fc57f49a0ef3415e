#!/bin/sh
# Compiles every header on its own (see tests/check/CMakeLists.txt).
#
#   headers.sh --cc CC --cxx CXX --lib LIBKOLO --public INCLUDE_DIR [--modules MANIFEST]
#   headers.sh --selftest --cc CC --cxx CXX --lib LIBKOLO
#
# Public headers (INCLUDE_DIR/kolo/*.h): included twice (the guard) into an
# otherwise empty C11 file, -pedantic and the project's warnings, -Werror;
# then into a C++17 file the same way; then a C++ program that takes the
# address of every KOLO_API function the header declares is linked against
# LIBKOLO: without extern "C" the C++ names are mangled and the link fails.
# MANIFEST: one line per module, tab-separated: its folder, then the -I/-D
# flags of its sources; each *.h of the folder is compiled alone as C11.
# --selftest: runs the checks on headers broken on purpose and passes only
# if each is refused. Exit 0: all passed; 1: a header failed; 77: no C++
# compiler (the C checks still ran).
set -u

cc=cc cxx="" lib="" public="" modules="" selftest=0
while [ $# -gt 0 ]; do
	case "$1" in
	--cc) cc=$2; shift 2 ;;
	--cxx) cxx=$2; shift 2 ;;
	--lib) lib=$2; shift 2 ;;
	--public) public=$2; shift 2 ;;
	--modules) modules=$2; shift 2 ;;
	--selftest) selftest=1; shift ;;
	*) echo "headers.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
case "$cxx" in *NOTFOUND) cxx="" ;; esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kolo-headers.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

CWARN="-Wall -Wextra -Werror -pedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes
-Wformat=2 -Wvla -Wwrite-strings"
XWARN="-Wall -Wextra -Werror -pedantic -Wshadow -Wformat=2 -Wwrite-strings"

failures=0
fail() {
	echo "FAIL $1"
	sed 's/^/    /' "$tmp/out"
	failures=$((failures + 1))
}

# The KOLO_API function names a header declares, one a line. A KOLO_API line
# that names none (other than the macro's own definition) is an error, so
# that no declaration escapes the link check.
api_names() {
	sed -nE 's/^KOLO_API[^(]*[ *](kolo_[A-Za-z0-9_]+)\(.*/\1/p' "$1"
	grep -E '^KOLO_API' "$1" | grep -vE '^KOLO_API[^(]*[ *]kolo_[A-Za-z0-9_]+\(' |
		sed 's/^/unparsed: /'
}

# check_public DIR NAME: the three checks of DIR/kolo/NAME.
check_public() {
	dir=$1 h=$2
	printf '#include "kolo/%s"\n#include "kolo/%s"\n' "$h" "$h" >"$tmp/t.c"
	# shellcheck disable=SC2086
	if "$cc" -std=c11 $CWARN -fsyntax-only -I"$dir" "$tmp/t.c" >"$tmp/out" 2>&1; then
		echo "ok   kolo/$h: C11 alone"
	else
		fail "kolo/$h: does not compile alone as C11"
	fi
	[ -n "$cxx" ] || return 0
	cp "$tmp/t.c" "$tmp/t.cc"
	# shellcheck disable=SC2086
	if "$cxx" -std=c++17 $XWARN -fsyntax-only -I"$dir" "$tmp/t.cc" >"$tmp/out" 2>&1; then
		echo "ok   kolo/$h: C++17 alone"
	else
		fail "kolo/$h: does not compile alone as C++17"
		return 0
	fi
	api_names "$dir/kolo/$h" >"$tmp/names"
	if grep -q '^unparsed: ' "$tmp/names"; then
		grep '^unparsed: ' "$tmp/names" >"$tmp/out"
		fail "kolo/$h: KOLO_API declarations the check cannot read"
		return 0
	fi
	n=$(wc -l <"$tmp/names")
	[ "$n" -gt 0 ] || { echo "ok   kolo/$h: declares no function"; return 0; }
	{
		printf '#include "kolo/%s"\n' "$h"
		echo 'typedef void (*fn_t)(void);'
		echo 'fn_t volatile kolo_check_fns[] = {'
		sed 's/.*/\treinterpret_cast<fn_t>(\&&),/' "$tmp/names"
		echo '};'
		echo 'int main() { return kolo_check_fns[0] == nullptr; }'
	} >"$tmp/link.cc"
	# shellcheck disable=SC2086
	if "$cxx" -std=c++17 $XWARN -I"$dir" "$tmp/link.cc" "$lib" -o "$tmp/link" >"$tmp/out" 2>&1
	then
		echo "ok   kolo/$h: $n functions link from C++ (C linkage)"
	else
		fail "kolo/$h: its functions do not link from C++ (extern \"C\" missing?)"
	fi
}

# check_module DIR FLAGS...: each DIR/*.h alone as C11.
check_module() {
	dir=$1
	shift
	for f in "$dir"/*.h; do
		[ -e "$f" ] || continue
		printf '#include "%s"\n#include "%s"\n' "${f##*/}" "${f##*/}" >"$tmp/m.c"
		# shellcheck disable=SC2086
		if "$cc" -std=c11 $CWARN -fsyntax-only "$@" "$tmp/m.c" >"$tmp/out" 2>&1; then
			echo "ok   ${dir##*/}/${f##*/}: C11 alone"
		else
			fail "${dir##*/}/${f##*/}: does not compile alone as C11"
		fi
	done
}

if [ "$selftest" = 1 ]; then
	# Each header is wrong in one way; the check must refuse every one.
	mkdir -p "$tmp/bad/needs-include/kolo" "$tmp/bad/not-cxx/kolo" "$tmp/bad/no-extern-c/kolo"
	cat >"$tmp/bad/needs-include/kolo/x.h" <<-'EOF'
		#ifndef X_H
		#define X_H
		size_t kolo_x_size(void); /* size_t without <stddef.h> */
		#endif
	EOF
	cat >"$tmp/bad/not-cxx/kolo/x.h" <<-'EOF'
		#ifndef X_H
		#define X_H
		struct kolo_x { int class; }; /* a C++ keyword */
		#endif
	EOF
	cat >"$tmp/bad/no-extern-c/kolo/x.h" <<-'EOF'
		#ifndef X_H
		#define X_H
		#define KOLO_API
		KOLO_API const char *kolo_strerror(int status); /* no extern "C" */
		#endif
	EOF
	bad=0
	for what in needs-include not-cxx no-extern-c; do
		if [ "$what" != needs-include ] && [ -z "$cxx" ]; then
			echo "skip $what: no C++ compiler"
			continue
		fi
		before=$failures
		check_public "$tmp/bad/$what" x.h >"$tmp/log" 2>&1
		if [ "$failures" -gt "$before" ]; then
			echo "ok   $what: refused ($(grep -m1 '^FAIL' "$tmp/log"))"
		else
			echo "FAIL $what: accepted"
			sed 's/^/    /' "$tmp/log"
			bad=$((bad + 1))
		fi
	done
	[ "$bad" = 0 ] || exit 1
	[ -n "$cxx" ] || exit 77
	exit 0
fi

[ -n "$public" ] || { echo "headers.sh: --public is required" >&2; exit 2; }
[ -n "$cxx" ] || echo "skip C++ checks: no C++ compiler"
count=0
for f in "$public"/kolo/*.h; do
	check_public "$public" "${f##*/}"
	count=$((count + 1))
done
[ "$count" -gt 0 ] || { echo "FAIL no header in $public/kolo"; exit 1; }
if [ -n "$modules" ]; then
	tab=$(printf '\t')
	while IFS= read -r line; do
		[ -n "$line" ] || continue
		old_ifs=$IFS
		IFS=$tab
		# shellcheck disable=SC2086
		set -- $line
		IFS=$old_ifs
		dir=$1
		shift
		# Drop the bare -I / -D of an empty list.
		n=$#
		while [ "$n" -gt 0 ]; do
			a=$1
			shift
			case "$a" in -I | -D) ;; *) set -- "$@" "$a" ;; esac
			n=$((n - 1))
		done
		check_module "$dir" "$@"
	done <"$modules"
fi
echo "$failures failed"
[ "$failures" = 0 ] || exit 1
[ -n "$cxx" ] || exit 77
exit 0
