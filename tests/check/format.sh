#!/bin/sh
# format.sh SRC_DIR: every C source and header of the tree is as clang-format
# (the tree's .clang-format) writes it. Lists the files that are not and exits
# 1; exits 77 (skip) without clang-format. Build folders and the corpora of
# the fuzz targets are not sources.
set -u
src=${1:?usage: format.sh SRC_DIR}
cf=$(command -v clang-format || command -v clang-format-14 || true)
[ -n "$cf" ] || {
	echo "SKIP: clang-format not found (Debian: apt-get install clang-format)"
	exit 77
}
cd "$src" || exit 2
if [ -d .git ] && command -v git >/dev/null; then
	files=$(git ls-files '*.c' '*.h')
else
	files=$(find . -path './build*' -prune -o -path ./tests/fuzz/corpus -prune -o \
		\( -name '*.c' -o -name '*.h' \) -print)
fi
bad=0
n=0
for f in $files; do
	n=$((n + 1))
	if ! "$cf" --dry-run --Werror "$f" >/dev/null 2>&1; then
		echo "not formatted: $f (clang-format -i $f)"
		bad=$((bad + 1))
	fi
done
echo "$n files checked with $("$cf" --version | head -n 1): $bad not formatted"
[ "$bad" -eq 0 ]
