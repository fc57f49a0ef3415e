#!/usr/bin/env bash
# wheel_test.sh SRC_DIR PYTHON VERSION: the kolo wheel, end to end.
#
#  1. pip wheel SRC_DIR (scikit-build-core over the CMake build, with build
#     isolation: its build requirements come from the package index);
#  2. the wheel holds the package, kolo/lib/libkolo.so and the four binaries
#     at kolo/bin, its version is VERSION, and none of its ELF files needs
#     CUDA, NCCL or libibverbs (they are opened at run time);
#  3. a new venv gets the wheel with its torch and numpy extras, torch pinned
#     by KOLO_WHEEL_TORCH (default torch==2.13.0);
#  4. from a directory outside the source tree, with neither PYTHONPATH nor
#     KOLO_LIBRARY set: the package loads its own kolo/lib/libkolo.so, the
#     console scripts are on PATH and run their binaries, kolo-info says
#     where libkolo is, and `kolorun -np 2 -- python train_digits.py` (a copy
#     of examples/torch/train_digits.py, with examples/digits_data.py beside
#     it) reaches its accuracy with bitwise identical parameters on both ranks.
#
# Every step is bounded by timeout and timed. Exits 77 (skipped) only when
# PYTHON has no pip or cannot make a venv.
set -u -o pipefail
src=${1:?usage: wheel_test.sh SRC_DIR PYTHON VERSION}
py=${2:?usage: wheel_test.sh SRC_DIR PYTHON VERSION}
version=${3:?usage: wheel_test.sh SRC_DIR PYTHON VERSION}
torch_req=${KOLO_WHEEL_TORCH:-torch==2.13.0}

skip() {
	echo "SKIP: $*"
	exit 77
}
fail() {
	echo "FAIL: $*"
	exit 1
}

command -v "$py" >/dev/null 2>&1 || skip "no interpreter $py"
"$py" -m pip --version >/dev/null 2>&1 || skip "$py has no pip (Debian: python3-pip)"
"$py" -c 'import ensurepip, venv' >/dev/null 2>&1 ||
	skip "$py cannot make a venv (Debian: python3-venv)"
command -v timeout >/dev/null || fail "no timeout(1)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kolo-wheel.XXXXXX") || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONDONTWRITEBYTECODE=1
unset PYTHONPATH KOLO_LIBRARY PYTHONHOME VIRTUAL_ENV

t_start=$(date +%s)
t_last=$t_start
took() { # took STEP: prints how long STEP took
	local now
	now=$(date +%s)
	echo "-- $1: $((now - t_last)) s"
	t_last=$now
}

# ---- 1. the wheel ----------------------------------------------------------
echo "== pip wheel $src (with $("$py" -m pip --version | cut -d' ' -f1-2), $py)"
timeout 420 "$py" -m pip wheel --no-deps -w "$tmp/dist" "$src" >"$tmp/wheel.log" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
	tail -n 60 "$tmp/wheel.log"
	fail "pip wheel exited $rc"
fi
took "pip wheel"
whl=$(ls "$tmp"/dist/kolo-*.whl 2>/dev/null)
[ -n "$whl" ] && [ "$(echo "$whl" | wc -l)" -eq 1 ] || fail "not one kolo wheel in $tmp/dist: $whl"
name=$(basename "$whl")
echo "wheel: $name, $(wc -c <"$whl") bytes"
case $name in
kolo-"$version"-py3-none-*.whl) ;;
*) fail "wheel $name: expected kolo-$version-py3-none-<platform>.whl" ;;
esac

# ---- 2. what it holds ------------------------------------------------------
mkdir -p "$tmp/unpacked"
"$py" - "$whl" "$tmp/unpacked" <<'EOF' || fail "the wheel's contents"
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = set(z.namelist())
need = ["kolo/__init__.py", "kolo/_lib.py", "kolo/_cli.py", "kolo/torch/__init__.py",
        "kolo/torch/distributed/__init__.py", "kolo/torch/distributed/_torchrun.py",
        "kolo/lib/libkolo.so"]
need += ["kolo/bin/" + b for b in ("kolorun", "kolo-rendezvous", "kolo-info", "kolo-bench",
                                   "kolo-doctor")]
missing = [n for n in need if n not in names]
stray = [n for n in names if "__pycache__" in n or n.endswith(".pyc")
         or n.startswith(("include/", "bin/", "lib/"))]
for n in sorted(names):
    print("  ", z.getinfo(n).file_size, n)
if missing or stray:
    sys.exit(f"missing {missing}, stray {stray}")
for n in need:
    if n.startswith("kolo/bin/") and not (z.getinfo(n).external_attr >> 16) & 0o111:
        sys.exit(f"{n} is not executable")
z.extractall(sys.argv[2])
EOF
if command -v readelf >/dev/null; then
	for f in "$tmp"/unpacked/kolo/lib/libkolo.so "$tmp"/unpacked/kolo/bin/*; do
		needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
		echo "NEEDED ${f#"$tmp"/unpacked/}: $needed"
		case " $needed" in
		*" libcuda"* | *" libnccl"* | *" libibverbs"*)
			fail "${f#"$tmp"/unpacked/} links a run-time-loaded library: $needed" ;;
		esac
	done
	for f in "$tmp"/unpacked/kolo/bin/*; do
		dyn=$(readelf -d "$f")
		grep -Eq '\((RPATH|RUNPATH)\).*\[\$ORIGIN/\.\./lib\]' <<<"$dyn" ||
			fail "${f#"$tmp"/unpacked/} has no RPATH \$ORIGIN/../lib"
	done
else
	echo "(no readelf: the NEEDED lists are not checked)"
fi
took "contents"

# ---- 3. a new venv ---------------------------------------------------------
echo "== venv, the wheel with [torch,numpy] and $torch_req"
timeout 120 "$py" -m venv "$tmp/venv" || fail "$py -m venv exited $?"
vpy=$tmp/venv/bin/python
timeout 420 "$vpy" -m pip install "$whl[torch,numpy]" "$torch_req" >"$tmp/install.log" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
	tail -n 40 "$tmp/install.log"
	fail "pip install exited $rc"
fi
grep -E '^Successfully installed' "$tmp/install.log"
took "venv and install"

# ---- 4. outside the source tree --------------------------------------------
# The copy sits two levels below $tmp, so that the example's fallback to
# <checkout>/python ($tmp/python) finds nothing: only the venv's kolo can load.
mkdir -p "$tmp/job/run"
cp "$src/examples/torch/train_digits.py" "$src/examples/digits_data.py" "$tmp/job/run/" ||
	fail "copy the example"
cd "$tmp/job/run" || fail "cd"
export PATH="$tmp/venv/bin:$PATH"
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')

out=$(timeout 60 "$vpy" -c '
import importlib.metadata, kolo
print(kolo.__file__)
print(kolo.library_path())
print(importlib.metadata.version("kolo"), kolo.__version__)
') || fail "import kolo in the venv: $out"
echo "$out"
[ "$(echo "$out" | sed -n 1p)" = "$site/kolo/__init__.py" ] || fail "kolo is not the venv's"
[ "$(echo "$out" | sed -n 2p)" = "$site/kolo/lib/libkolo.so" ] ||
	fail "libkolo is not the wheel's kolo/lib/libkolo.so"
[ "$(echo "$out" | sed -n 3p)" = "$version $version" ] ||
	fail "versions: the dist-info and kolo.__version__ say '$(echo "$out" | sed -n 3p)', the C project $version"

for b in kolorun kolo-rendezvous kolo-info kolo-bench kolo-doctor; do
	[ "$(command -v "$b")" = "$tmp/venv/bin/$b" ] || fail "$b on PATH is $(command -v "$b"), not the venv's"
done
info=$(timeout 30 kolo-info) || fail "kolo-info exited $?: $info"
echo "$info" | sed -n '1,/^parameters:/p' | sed '$d'
grep -qxF "kolo $version" <<<"$info" || fail "kolo-info: no 'kolo $version'"
grep -qxF "libkolo: $version, linked into $site/kolo/bin/kolo-info" <<<"$info" ||
	fail "kolo-info: libkolo is not the wheel's"
grep -qxF "libkolo.so: $site/kolo/lib/libkolo.so (beside this binary)" <<<"$info" ||
	fail "kolo-info: no libkolo.so beside the binary"
grep -q '^cuda runtime: ' <<<"$info" || fail "kolo-info: no cuda section"
grep -q '^verbs: ' <<<"$info" || fail "kolo-info: no verbs section"
timeout 30 kolo-rendezvous --version || fail "kolo-rendezvous --version exited $?"
timeout 30 kolo-bench --help >/dev/null || fail "kolo-bench --help exited $?"
timeout 30 kolo-doctor --help >/dev/null || fail "kolo-doctor --help exited $?"
timeout 30 kolorun --help >/dev/null || fail "kolorun --help exited $?"
ep=$(timeout 60 python -c '
from torch.distributed.elastic.rendezvous import registry
from torch.distributed.elastic.rendezvous.api import rendezvous_handler_registry as r
registry._register_out_of_tree_handlers()
print(r._registry["kolo"].__module__)
') || fail "torchrun does not find --rdzv-backend=kolo through the entry point: $ep"
[ "$ep" = "kolo.torch.distributed._torchrun" ] || fail "torchrun's kolo handler is $ep"
took "kolo-info, the console scripts and torchrun's entry point"

echo "== kolorun -np 2 -- python train_digits.py (in $PWD)"
timeout 240 kolorun -np 2 -- python train_digits.py >"$tmp/train.log" 2>&1
rc=$?
tail -n 6 "$tmp/train.log"
[ "$rc" -eq 0 ] || {
	cat "$tmp/train.log"
	fail "kolorun exited $rc"
}
grep -Eq '^\[0\] train_digits: reached test accuracy [0-9.]+ >= target 0\.90$' "$tmp/train.log" ||
	fail "the target accuracy was not reported"
grep -Eq '^\[0\] train_digits: parameters bitwise identical on all 2 ranks \(sha256 [0-9a-f]{16}\)$' \
	"$tmp/train.log" || fail "identical parameters were not reported"
h0=$(sed -n 's/^\[0\] train_digits: rank 0: parameters sha256 \([0-9a-f]*\)$/\1/p' "$tmp/train.log")
h1=$(sed -n 's/^\[1\] train_digits: rank 1: parameters sha256 \([0-9a-f]*\)$/\1/p' "$tmp/train.log")
[ -n "$h0" ] && [ "$h0" = "$h1" ] || fail "the ranks' parameter hashes: '$h0' and '$h1'"
took "2-rank training"

echo "PASS: $name: built, installed into a new venv and trained on 2 ranks in $(($(date +%s) - t_start)) s"
