#!/usr/bin/env bash
# Download the SGLang release wheels that `specscope sglang-audit`'s tests read (tests/unit/test_sglang_audit.py).
# Usage: .ci/sglang-wheels.sh [DIR] (default: $SPECSCOPE_SGLANG_WHEELS, else .sglang-wheels/ at the repository root).
# Only the wheel files are fetched (--no-deps, --only-binary): the audit reads them as zip archives, statically,
# so nothing is installed and no GPU stack is pulled in. A wheel already in DIR is not downloaded again.
set -euo pipefail

cd "$(dirname "$0")/.."

# Every release the audit's tests cover; keep in step with RELEASES in tests/unit/test_sglang_audit.py.
VERSIONS=(0.5.12 0.5.13 0.5.14 0.5.15 0.5.16 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22 0.5.23)

dir="${1:-${SPECSCOPE_SGLANG_WHEELS:-.sglang-wheels}}"
mkdir -p "$dir"
py="$(command -v python || command -v python3)"

for v in "${VERSIONS[@]}"; do
    if compgen -G "$dir/sglang-$v-*.whl" >/dev/null; then
        continue
    fi
    # Pinned to the tags every release is published with, so any host and Python fetch the same files.
    "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
        --abi cp311 --platform manylinux_2_34_x86_64 --dest "$dir" "sglang==$v"
done

ls -1 "$dir"/sglang-*.whl
