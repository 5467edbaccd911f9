#!/usr/bin/env bash
# Adds the wheels of specscope's own base dependencies (zstandard, msgspec, zlib-ng) for an offline GPU host's
# CPython to the git-ignored .gpu/wheels, after `bash ../shared/gpu-host/prepare.sh` (which fetches flashinfer).
# `. .gpu/setup.sh` on the host installs every wheel there. numpy comes with the host's torch. The TUI's textual
# (pure Python, ~0.9 MB with the packages the GPU image lacks) comes too, so `specscope tui --live` runs there;
# rich, markdown-it-py and pygments are on the image.
#   bash scripts/gpu_wheels.sh [PYTHON_VERSION (default 3.12)] [PLATFORM (default manylinux2014_x86_64)]
set -euo pipefail
py=${1:-3.12}
plat=${2:-manylinux2014_x86_64}
mkdir -p .gpu/wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --platform "$plat" \
  --platform manylinux_2_17_x86_64 -d .gpu/wheels zstandard msgspec zlib-ng
python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu/wheels textual platformdirs linkify-it-py uc-micro-py
# zstandard's wheel carries two backends; its C one is the one imported by default. Dropping the 12 MB cffi one keeps a
# checkout plus .gpu/ under the 64 MiB a device tool carries (installed wheels are not checked against RECORD).
python3 - <<'PY'
import glob, os, zipfile
for whl in glob.glob(".gpu/wheels/zstandard-*.whl"):
    with zipfile.ZipFile(whl) as z:
        keep = [(i, z.read(i)) for i in z.infolist() if not os.path.basename(i.filename).startswith("_cffi")]
        dropped = len(z.infolist()) - len(keep)
    if dropped:
        with zipfile.ZipFile(whl + ".tmp", "w", zipfile.ZIP_DEFLATED) as z:
            for info, data in keep:
                z.writestr(info, data)
        os.replace(whl + ".tmp", whl)
PY
ls .gpu/wheels
