#!/usr/bin/env bash
# Run on the development machine (where PyPI is reachable), from the project's root:
#   bash scripts/gpu-host/prepare.sh [--kernels DIR]
# Fills the git-ignored folder .gpu/ with what an offline GPU host needs: the wheels (wheels.sh), setup.sh and
# save-kernels.sh. With --kernels DIR it also installs prebuilt flashinfer kernels: DIR holds the kernels.tgz.* parts
# that save-kernels.sh wrote on a GPU host, unpacked into .gpu/aot (replacing what was there). Without prebuilt
# kernels flashinfer compiles each kernel on its first use on the GPU host. Then .gpu/ travels with the checkout to
# the GPU host, where `. .gpu/setup.sh` makes it ready.
set -euo pipefail
usage="usage: bash scripts/gpu-host/prepare.sh [--kernels DIR]"
here=$(cd "$(dirname "$0")" && pwd)
kernels=
while [ $# -gt 0 ]; do
  case $1 in
    --kernels) [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }; kernels=$2; shift 2 ;;
    --kernels=*) kernels=${1#--kernels=}; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
[ -f pyproject.toml ] && [ -d scripts/gpu-host ] || { echo "prepare.sh: run it from the project's root" >&2; exit 2; }
if [ -n "$kernels" ] && ! ls "$kernels"/kernels.tgz.* >/dev/null 2>&1; then
  echo "prepare.sh: no kernels.tgz.* parts in $kernels (bash .gpu/save-kernels.sh DIR writes them on a GPU host)" >&2
  exit 2
fi
mkdir -p .gpu
# Every wheel the host lacks (flashinfer and its tvm-ffi, the project's base dependencies, the TUI's textual); skipped
# when .gpu/wheels already has them, so a second run needs no network.
if [ -z "$(ls .gpu/wheels/flashinfer*.whl 2>/dev/null)" ] || [ -z "$(ls .gpu/wheels/zstandard-*.whl 2>/dev/null)" ]; then
  bash "$here/wheels.sh" .gpu/wheels >/dev/null
fi
cp "$here/setup.sh" "$here/save-kernels.sh" .gpu/
if [ -n "$kernels" ]; then
  rm -rf .gpu/aot
  cat "$kernels"/kernels.tgz.* | tar xzf - -C .gpu
fi
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || true)
if [ -n "$exclude" ] && ! grep -qsx '/.gpu/' .gitignore "$exclude"; then
  mkdir -p "$(dirname "$exclude")" && echo '/.gpu/' >> "$exclude"
fi
echo ".gpu ready: $(ls .gpu/wheels | wc -l) wheels, $(find .gpu/aot -name '*.so' 2>/dev/null | wc -l) prebuilt kernels, $(du -sh .gpu | cut -f1)"
