#!/usr/bin/env bash
# Run on the GPU host after a run that compiled flashinfer kernels (from the project's root, after
# `. .gpu/setup.sh`):   bash .gpu/save-kernels.sh OUTDIR      (prepare.sh copies it there from scripts/gpu-host/)
# Collects every compiled kernel library (the .so files only: no object files) from this run's JIT folder and from
# .gpu/aot into an AOT layout, and writes it to OUTDIR as kernels.tgz.aa, .ab, ... (parts of at most 15 MB). Back on
# the development machine:   bash scripts/gpu-host/prepare.sh --kernels OUTDIR
set -euo pipefail
out=${1:?usage: save-kernels.sh OUTDIR}
gpu=${GPU_DIR:-.gpu}
stage=$(mktemp -d)
mkdir -p "$stage/aot" "$out"
[ -d "$gpu/aot" ] && cp -r "$gpu"/aot/. "$stage/aot/"
find "$gpu/jit" -path '*/cached_ops/*' -name '*.so' 2>/dev/null | while read -r so; do
  name=$(basename "$so" .so)
  [ "$(basename "$(dirname "$so")")" = "$name" ] || continue
  mkdir -p "$stage/aot/$name" && cp "$so" "$stage/aot/$name/"
done
tar czf - -C "$stage" aot | split -b 15m - "$out/kernels.tgz."
echo "saved $(find "$stage/aot" -name '*.so' | wc -l) kernels ($(du -sh "$stage/aot" | cut -f1)) to $out/kernels.tgz.*"
rm -rf "$stage"
