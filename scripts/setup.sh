#!/usr/bin/env bash
# Installs kolo's Debian dependencies (the C build's; idempotent), makes the
# project's Python virtual environment .venv (torch 2.13.0 CPU, numpy, pytest
# and the rest of scripts/requirements.txt; pip runs again only when that file
# changes) and builds into build/. Nothing is installed into the system
# interpreter. The venv is made from KOLO_VENV_PYTHON, else python3.11, else
# python3 (3.9 or newer). --with-digits also installs scikit-learn into the
# venv, only for the UCI digits data file that examples/torch/train_digits.py
# reads (without it the example trains on synthetic data). --no-venv skips
# the venv (a C-only build). --with-mxnet also makes .venv-mxnet, MXNet's own
# environment (scripts/requirements-mxnet.txt: MXNet 1.9.1 needs numpy 1.23.5,
# which the main venv's torch and TensorFlow cannot share); the MXNet tests run
# under it and skip without it.
# Usage: scripts/setup.sh [--deps-only] [--no-venv] [--with-digits] [--with-mxnet]
#                         [--sanitizer address|thread] [--build-dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

deps_only=0
venv=1
with_digits=0
with_mxnet=0
sanitizer=""
build_dir=build
while [ $# -gt 0 ]; do
	case "$1" in
	--deps-only) deps_only=1 ;;
	--no-venv) venv=0 ;;
	--with-digits) with_digits=1 ;;
	--with-mxnet) with_mxnet=1 ;;
	--sanitizer) sanitizer="$2"; shift ;;
	--build-dir) build_dir="$2"; shift ;;
	*) echo "setup.sh: unknown option $1" >&2; exit 2 ;;
	esac
	shift
done

packages=(build-essential cmake pkg-config libmicrohttpd-dev libjansson-dev
	libcurl4-openssl-dev libssl-dev libibverbs-dev check curl iproute2 clang-format python3
	python3-venv)
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

# The virtual environment. A stamp holds the hash of what was installed, so a
# second run costs one comparison.
make_venv() {
	local base want have extra=()
	base=${KOLO_VENV_PYTHON:-$(command -v python3.11 || command -v python3)}
	if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys' 2>/dev/null; then
		echo "setup.sh: making .venv with $base ($("$base" --version 2>&1))"
		rm -rf .venv
		"$base" -m venv .venv
	fi
	if [ "$with_digits" = 1 ]; then extra=(scikit-learn); fi
	want=$( (cat scripts/requirements.txt; echo "${extra[*]}") | sha256sum | cut -d' ' -f1)
	have=$(cat .venv/.kolo-requirements 2>/dev/null || true)
	[ "$want" = "$have" ] && return 0
	echo "setup.sh: installing scripts/requirements.txt into .venv"
	.venv/bin/python -m pip install -q --disable-pip-version-check -r scripts/requirements.txt \
		"${extra[@]}"
	echo "$want" >.venv/.kolo-requirements
}
# MXNet's environment, beside .venv (the same stamp scheme).
make_mxnet_venv() {
	local base want
	base=${KOLO_VENV_PYTHON:-$(command -v python3.11 || command -v python3)}
	if [ ! -x .venv-mxnet/bin/python ] || ! .venv-mxnet/bin/python -c 'import sys' 2>/dev/null; then
		echo "setup.sh: making .venv-mxnet with $base ($("$base" --version 2>&1))"
		rm -rf .venv-mxnet
		"$base" -m venv .venv-mxnet
	fi
	want=$(sha256sum scripts/requirements-mxnet.txt | cut -d' ' -f1)
	[ "$want" = "$(cat .venv-mxnet/.kolo-requirements 2>/dev/null || true)" ] && return 0
	echo "setup.sh: installing scripts/requirements-mxnet.txt into .venv-mxnet"
	.venv-mxnet/bin/python -m pip install -q --disable-pip-version-check \
		-r scripts/requirements-mxnet.txt
	echo "$want" >.venv-mxnet/.kolo-requirements
}
if [ "$venv" = 1 ]; then make_venv; fi
if [ "$with_mxnet" = 1 ]; then make_mxnet_venv; fi
[ "$deps_only" = 1 ] && exit 0

cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKOLO_SANITIZER="$sanitizer" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
