#!/usr/bin/env bash
# Download the wheels an offline GPU host (CPython 3.12, x86-64, a CUDA 13 image with torch preinstalled) lacks, into
# DIR (default .gpu/wheels, relative to the current folder). Run it where PyPI is reachable; prepare.sh calls it.
#   bash scripts/gpu-host/wheels.sh [DIR] [EXTRA_SPEC ...]      (PYTHON_VERSION=3.12 by default)
# - flashinfer-python and apache-tvm-ffi: the GPU kernels;
# - zstandard, msgspec, zlib-ng: specscope's base dependencies (numpy comes with the host's torch);
# - textual, platformdirs, linkify-it-py, uc-micro-py (pure Python, ~0.9 MB), so `specscope tui --live` runs there
#   (rich, markdown-it-py and pygments are on the image);
# - EXTRA_SPEC: any further package spec (e.g. a trace-store dependency).
# zstandard's wheel carries two backends and imports its C one by default; the 12 MB cffi one is dropped, so a
# checkout plus .gpu/ stays under a 64 MiB transfer (installed wheels are not checked against RECORD).
# `. .gpu/setup.sh` on the host installs every wheel in .gpu/wheels.
set -euo pipefail
dir=${1:-.gpu/wheels}; shift || true
py=${PYTHON_VERSION:-3.12}
mkdir -p "$dir"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
pkgs=("flashinfer-python==0.6.18.post1" "apache-tvm-ffi==0.1.15.post2" zstandard msgspec zlib-ng "$@")
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp "${platforms[@]}" \
  -d "$dir" "${pkgs[@]}" 2>&1 | grep -v "^WARNING: Location" || true
python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir" textual platformdirs linkify-it-py uc-micro-py \
  2>&1 | grep -v "^WARNING: Location" || true
WHEELS=$dir python3 - <<'PY'
import glob, os, zipfile
for whl in glob.glob(os.path.join(os.environ["WHEELS"], "zstandard-*.whl")):
    with zipfile.ZipFile(whl) as z:
        keep = [(i, z.read(i)) for i in z.infolist() if not os.path.basename(i.filename).startswith("_cffi")]
        dropped = len(z.infolist()) - len(keep)
    if dropped:
        with zipfile.ZipFile(whl + ".tmp", "w", zipfile.ZIP_DEFLATED) as z:
            for info, data in keep:
                z.writestr(info, data)
        os.replace(whl + ".tmp", whl)
PY
for want in flashinfer_python apache_tvm_ffi zstandard msgspec zlib_ng textual; do
  ls "$dir"/"$want"-*.whl >/dev/null 2>&1 || { echo "wheels.sh: no $want wheel in $dir (is PyPI reachable?)" >&2; exit 1; }
done
ls -1 "$dir"
du -sh "$dir"
