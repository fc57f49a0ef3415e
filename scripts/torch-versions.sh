#!/usr/bin/env bash
# Which torch releases have each construct kolo.torch depends on.
#
#   scripts/torch-versions.sh [--dir DIR] [VERSION ...]
#
# Reads torch's own files at each release: the Python sources of the macOS
# arm64 wheel from PyPI (the smallest wheel; the Python files are the same on
# every platform) and, for the one C++ binding kolo imports, the strings of
# libtorch_python. Wheels are downloaded into DIR (default
# ${XDG_CACHE_HOME:-~/.cache}/kolo-torch-wheels) unless already there; about
# 60-90 MB each. Prints one row per construct: the releases that have it.
# docs/torch-versions.md is the reading of this output.
set -euo pipefail

dir=${XDG_CACHE_HOME:-$HOME/.cache}/kolo-torch-wheels
if [ "${1:-}" = --dir ]; then dir=$2; shift 2; fi
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(2.0.0 2.1.0 2.2.0 2.3.0 2.4.0 2.5.0 2.6.0 2.7.0 2.8.0
                                         2.9.0 2.10.0 2.11.0 2.12.0 2.13.0 2.14.1)
here=$(cd "$(dirname "$0")/.." && pwd)
pip=${KOLO_PIP:-$here/.venv/bin/pip}
mkdir -p "$dir"

wheel_of() {  # the wheel file of version $1, downloading it when missing
  local w
  w=$(ls "$dir"/torch-"$1"-*macosx*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$w" ]; then
    "$pip" download -q "torch==$1" --no-deps --only-binary=:all: --python-version 3.11 \
      --platform macosx_11_0_arm64 --platform macosx_14_0_arm64 -d "$dir" >&2
    w=$(ls "$dir"/torch-"$1"-*macosx*.whl | head -n1)
  fi
  echo "$w"
}

# name | files in the wheel (space-separated) | extended regular expression
checks=(
  "Python ProcessGroup subclass returned as the group|torch/distributed/distributed_c10d.py|(issubclass\(type\(backend_class\)|isinstance\(backend_class), ProcessGroup\)"
  "register_backend(extended_api=...)|torch/distributed/distributed_c10d.py|def register_backend\(cls, name, func, extended_api|^ +extended_api(: bool)? ?= ?False,"
  "register_backend(devices=...)|torch/distributed/distributed_c10d.py|devices: Optional\[Union\[str, List\[str\]\]\]|^ +devices: (Optional|str \| list)"
  "collectives wrapped by _exception_logger|torch/distributed/distributed_c10d.py|^@_exception_logger"
  "all_gather_into_tensor calls _allgather_base|torch/distributed/distributed_c10d.py|group\._allgather_base\(|default_pg\._allgather_base\("
  "all_gather_into_tensor calls all_gather_single|torch/distributed/distributed_c10d.py|group\.all_gather_single\("
  "reduce_scatter_tensor calls _reduce_scatter_base|torch/distributed/distributed_c10d.py|group\._reduce_scatter_base\(|default_pg\._reduce_scatter_base\("
  "reduce_scatter_tensor calls reduce_scatter_single|torch/distributed/distributed_c10d.py|group\.reduce_scatter_single\("
  "Backend._plugins|torch/distributed/distributed_c10d.py|_plugins: [Dd]ict"
  "register_rendezvous_handler|torch/distributed/rendezvous.py|def register_rendezvous_handler"
  "torch.futures.Future(devices=...)|torch/futures/__init__.py|devices: "
  "Tensor.register_post_accumulate_grad_hook|torch/_tensor.py|def register_post_accumulate_grad_hook"
  "Optimizer step wrapper marks step.hooked|torch/optim/optimizer.py|getattr\(self\.__class__\.step, \"hooked\""
  "torch.amp.GradScaler|torch/amp/__init__.py|GradScaler"
  "torch.uint16/uint32/uint64|torch/_C/__init__.pyi|^uint16: dtype"
  "_create_work_from_future (binding)|torch/lib/libtorch_python.dylib|_create_work_from_future"
  "float8 dtypes|torch/_C/__init__.pyi torch/lib/libtorch_python.dylib|float8_e4m3fn"
)

for v in "${versions[@]}"; do wheel_of "$v" >/dev/null; done
for c in "${checks[@]}"; do
  IFS='|' read -r name file re <<<"$c"
  re=${c#*|*|}
  have=() lack=()
  for v in "${versions[@]}"; do
    n=$( (unzip -p "$(wheel_of "$v")" $file 2>/dev/null || true) | grep -acE -- "$re" || true)
    if [ "${n:-0}" -gt 0 ]; then
      have+=("$v"); else lack+=("$v"); fi
  done
  printf '%-52s has: %s\n' "$name" "${have[*]:-none}"
  [ ${#lack[@]} -eq 0 ] || printf '%-52s lacks: %s\n' "" "${lack[*]}"
done
