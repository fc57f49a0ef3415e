#!/usr/bin/env bash
# Installs kolo's Debian dependencies (idempotent) and builds into build/: the
# C build's, and what the Python layer and its tests use from /usr/bin/python3
# (numpy, torch, pytest). --with-digits also installs python3-sklearn, only
# for the UCI digits data file that examples/torch/train_digits.py reads
# (about 50 MB of downloads with scipy, BLAS and Boost headers, for a 57 KB
# file; without it the example trains on synthetic data).
# Usage: scripts/setup.sh [--deps-only] [--with-digits] [--sanitizer address|thread]
#                         [--build-dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

deps_only=0
with_digits=0
sanitizer=""
build_dir=build
while [ $# -gt 0 ]; do
	case "$1" in
	--deps-only) deps_only=1 ;;
	--with-digits) with_digits=1 ;;
	--sanitizer) sanitizer="$2"; shift ;;
	--build-dir) build_dir="$2"; shift ;;
	*) echo "setup.sh: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done

packages=(build-essential cmake pkg-config libmicrohttpd-dev libjansson-dev
	libcurl4-openssl-dev libssl-dev libibverbs-dev check curl iproute2 clang-format python3
	python3-yaml python3-numpy python3-torch python3-pytest)
[ "$with_digits" = 1 ] && packages+=(python3-sklearn)
missing=()
for p in "${packages[@]}"; do
	[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "setup.sh: installing ${missing[*]}"
	sudo_cmd=""
	[ "$(id -u)" -ne 0 ] && sudo_cmd=sudo
	export DEBIAN_FRONTEND=noninteractive
	$sudo_cmd apt-get update -qq
	$sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ "$deps_only" = 1 ] && exit 0

cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKOLO_SANITIZER="$sanitizer" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
