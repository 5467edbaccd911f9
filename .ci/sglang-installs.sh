#!/usr/bin/env bash
# Unpack every SGLang release wheel that .ci/sglang-wheels.sh downloaded into a folder of its own, for the parity
# sweep and the drive on each release (tests/unit/test_sglang_releases.py, scripts/sglang_fidelity.py).
# Usage: .ci/sglang-installs.sh [WHEELS [DEST]] (defaults: $SPECSCOPE_SGLANG_WHEELS or .sglang-wheels/, and
# .sglang/ at the repository root). A wheel is a zip archive: unpacking it is what `pip install --no-deps --target`
# does, without the network. A release already unpacked (its dist-info present) is left as it is.
set -euo pipefail

cd "$(dirname "$0")/.."

# Keep in step with VERSIONS in .ci/sglang-wheels.sh and TESTED_RELEASES in integrations/sglang_versions.py.
VERSIONS=(0.5.12 0.5.13 0.5.14 0.5.15 0.5.16 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22 0.5.23)

wheels="${1:-${SPECSCOPE_SGLANG_WHEELS:-.sglang-wheels}}"
dest="${2:-.sglang}"
mkdir -p "$dest"
py="$(command -v python || command -v python3)"

for v in "${VERSIONS[@]}"; do
    if [ -f "$dest/$v/sglang-$v.dist-info/METADATA" ]; then
        continue
    fi
    whl="$(compgen -G "$wheels/sglang-$v-*.whl" | head -n 1 || true)"
    if [ -z "$whl" ]; then
        echo "sglang-installs: no wheel of sglang $v in $wheels (run .ci/sglang-wheels.sh)" >&2
        exit 1
    fi
    # Unpacked beside the target and renamed, so an interrupted run never leaves a half folder that looks done.
    rm -rf "$dest/$v.partial" "$dest/$v"
    "$py" -m zipfile -e "$whl" "$dest/$v.partial"
    mv "$dest/$v.partial" "$dest/$v"
done

for v in "${VERSIONS[@]}"; do
    echo "$dest/$v"
done
