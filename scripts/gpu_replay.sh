#!/usr/bin/env bash
# Replay recorded attention calls on the GPU (kernel vs reference), clean and with a fault; writes into DIR.
set -uo pipefail
D=${1:?usage: gpu_replay.sh DIR}
mkdir -p "$D"
specscope run --requests 8 --batch-size 4 --max-new-tokens 32 --record-attention 1 --quiet -o "$D/h200-attention.db"
# On the H200 max-seq-len-q-override makes XQA refuse the call (K1) at the first verify, so nothing is left to
# replay; stale-page-table runs and reads pages nobody wrote for these rows: kernel-vs-truth disagrees.
specscope run --requests 8 --batch-size 4 --max-new-tokens 32 --page-size 16 --inject stale-page-table \
  --record-attention 1 --quiet -o "$D/h200-attention-fault.db"
pick='import sys
from specscope.tracer.store import TraceReader
r = TraceReader(sys.argv[1]); m = sys.argv[2]
print(next((s.index for s in r.iter_summaries() if s.mode.value == m and s.graph.value != "capture"
            and s.batch_size >= (1 if m == "EXTEND" else 2)), ""))'
for T in h200-attention h200-attention-fault; do
  for M in TARGET_VERIFY DRAFT_DECODE DRAFT_EXTEND EXTEND; do
    S=$(python -c "$pick" "$D/$T.db" "$M")
    [ -n "$S" ] || { echo "$T $M: no such step recorded"; continue; }
    for dev in cuda cpu; do
      specscope replay "$D/$T.db" --step "$S" --device "$dev" > "$D/$T-$M-$dev.txt" 2>&1
      echo "$T $M step $S $dev rc=$?"
    done
  done
done
specscope export "$D/h200-attention-fault.db" --bundle "$D/h200-fault-bundle.zip" --steps 0:40 --attention flagged
ls -la "$D/h200-fault-bundle.zip"
python -m pytest -q -m gpu tests/unit/test_replay.py -rs
cat "$D/h200-attention-TARGET_VERIFY-cuda.txt"
