#!/usr/bin/env bash
# The GPU tests, benchmarks and sample recordings, in parts that each fit one 10-minute call on a GPU host. From the
# project root on the GPU host, with .gpu/ made by scripts/gpu-host/prepare.sh:   bash scripts/gpu_batch.sh PART
# Logs and results go to $OUT (default /tmp/gpu-out) as one log file and one tarball. Run `tests` first on a fresh
# machine: it JIT-compiles the tiny models' and the fused ops' kernels, which a benchmark would otherwise compile
# inside its time limit. What each part writes is committed as benchmarks/results/<name> (see its README):
#   tests     the GPU test suite beside the detection table, the sticky-error run   gpu_tests.log, docs/detection-h200.json
#             (and the kernels it compiled, as save-kernels.sh parts in $OUT/kernels)
#   clocks    the event clock, %globaltimer drift, a stamp's cost                   event_clock.json, clock_drift.json, stamp_cost.log
#   bench     engine speed, plan-stream share, verify attention bandwidth          engine_speed.*, plan_stream.json, verify_bandwidth.json
#   overhead  tracer overhead: every cell, then the 8B cells with 25 rounds         tracer_overhead.*, tracer_overhead_8b.*
#   ablation  the measurement-only recorders (floor, eager spans)                   recorder_ablation.* (one file of the four runs)
#   host      the recorder's host cost per call, a py-spy profile of tiny bs 1     recorder_host.json, host_profile.txt
#   records   the H200 sample traces, the GPU replays, the SGLang GPU tests         samples/traces/h200-*.db, gpu_replay.txt
#   pair-tiny the old commit's recorder and the working tree's in paired arms, tiny  tracer_overhead_paired.* (merged,
#   pair-8b   the same at the Llama-3-8B shape                                           see below)
# The pair parts need the old commit's package folders, made on the development machine and carried with the tree
# (git-ignored): `bash scripts/base_tree.sh 25cc3e3 .bench/base-25cc3e3` (BASE_TREE names another; NEW_LABEL says
# what the working tree is, e.g. NEW_LABEL="adb22d1 + working tree", as the GPU host has no git). Merge the two calls'
# JSON on the development machine: python benchmarks/tracer_overhead.py --merge paired_tiny.json paired_8b.json
# --out benchmarks/results/tracer_overhead_paired.json
set -uo pipefail
parts="tests|clocks|bench|overhead|ablation|host|records|pair-tiny|pair-8b"
part=${1:?usage: gpu_batch.sh $parts}
case "|$parts|" in *"|$part|"*) ;; *) echo "usage: gpu_batch.sh $parts" >&2; exit 2 ;; esac
out=${OUT:-/tmp/gpu-out}
work=/tmp/gpu-work-$part
mkdir -p "$out" "$work"
log=$out/log-$part.txt
# Kernels saved by an earlier call can travel compressed (.gpu/kernels.tgz, from save-kernels.sh's parts): unpacked
# they would not fit a 64 MiB transfer beside the wheels. Unpack them fresh over any .gpu/aot left on the machine.
if [ -f .gpu/kernels.tgz ]; then rm -rf .gpu/aot && tar xzf .gpu/kernels.tgz -C .gpu; fi
. .gpu/setup.sh >>"$log" 2>&1 || { echo "setup failed"; tail -5 "$log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$log" 2>&1
echo "load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs" >>"$log"
step() {  # step NAME SECONDS CMD...: run with a time limit, log everything, print one status line
  local name=$1 lim=$2; shift 2
  echo "=== $name start $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" >>"$log"
  timeout "$lim" "$@" >>"$log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc $(date +%T)" | tee -a "$log"
}
case $part in
  tests)
    # The detection table runs beside the tests (same GPU, tiny models; neither measures time).
    step detection 400 python scripts/detection_table.py --device cuda --out "$work/detection-h200.json" &
    step gpu-tests 400 python -m pytest -q -m gpu tests/gpu -rs -p no:cacheprovider
    wait
    # A run that hits a sticky CUDA error (wild page id), and what the checker says of its trace.
    step sticky 60 bash -c "specscope run --device cuda --inject wild-page-id --requests 4 --batch-size 2 \
      --max-new-tokens 16 -o $work/sticky.db; echo rc=\$?; specscope check $work/sticky.db --max-per-check 2"
    # The kernels this call compiled, for the next copy's .gpu/aot (scripts/gpu-host/prepare.sh --kernels DIR).
    bash .gpu/save-kernels.sh "$out/kernels" >>"$log" 2>&1
    grep -E "^=== |passed|failed|^saved" "$log"
    ;;
  clocks)
    # Whether CUDA event times and %globaltimer are one clock, how far %globaltimer drifts from the host clock (the
    # recorder corrects none), and what a stamp costs the host and a graph replay.
    step event-clock 60 python scripts/event_clock.py --seconds 20 --out "$out/event_clock.json"
    step clock-drift 120 python scripts/clock_drift.py --seconds 80 --every 2 --out "$out/clock_drift.json"
    step stamp-cost 60 bash -c "python scripts/stamp_cost.py > $out/stamp_cost.log"
    grep -E "^=== |^host ns|ppm" "$log"
    ;;
  bench)
    step engine-speed 240 python benchmarks/engine_speed.py --quick --out-dir "$out"
    step plan-stream 60 python benchmarks/plan_stream.py --out "$out/plan_stream.json"
    step verify-bandwidth 120 python benchmarks/verify_bandwidth.py --out "$out/verify_bandwidth.json"
    grep -E "^=== |busy|hidden" "$log"
    ;;
  overhead)
    # Traced / untraced in every cell with the torch.profiler anchor, then the three 8B cells with 25 rounds (their
    # single rounds spread by several points; `benchmarks/pool_overhead.py` pools both files' rounds).
    step overhead 240 python benchmarks/tracer_overhead.py --quick --rounds 9 --out "$out/tracer_overhead.json"
    step overhead-8b 240 python benchmarks/tracer_overhead.py --models llama3-8b --quick --rounds 25 --no-profiler \
      --out "$out/tracer_overhead_8b.json"
    python benchmarks/pool_overhead.py "$out/tracer_overhead.json" "$out/tracer_overhead_8b.json" >>"$log" 2>&1
    grep -E "^=== |bs +[0-9]+ +off|rounds  median" "$log"
    ;;
  ablation)
    # What recording inside the graphs costs alone (`floor`: graphs captured with the real recorder's nodes, nothing
    # recorded on the host after the captures) and what the eager spans cost (`eager-spans`: the real recorder
    # without them), each against the real recorder in the same rounds.
    step floor-tiny 120 python benchmarks/tracer_overhead.py --models tiny --quick --rounds 9 --no-profiler \
      --ab-ablate floor --out "$out/floor_tiny.json"
    step floor-8b 200 python benchmarks/tracer_overhead.py --models llama3-8b --quick --rounds 9 --no-profiler \
      --ab-ablate floor --out "$out/floor_8b.json"
    step eager-spans 150 python benchmarks/tracer_overhead.py --models tiny,llama3-8b --batch-sizes 1 --quick \
      --rounds 9 --no-profiler --ab-ablate eager-spans --out "$out/eager_spans.json"
    grep -E "^=== |bs +[0-9]+ +off" "$log"
    ;;
  pair-tiny|pair-8b)
    # Paired arms of two trees in the same alternating rounds (each tree's engines in a worker process of its own,
    # both on this GPU): old and new traced over their own untraced, new over old, the profiler as the anchor.
    base=${BASE_TREE:-.bench/base-25cc3e3}
    if [ ! -f "$base/tracer/__init__.py" ]; then
      echo "=== $part: no base tree at $base (bash scripts/base_tree.sh 25cc3e3 $base, and carry it)" | tee -a "$log"
      exit 2
    fi
    model=${part#pair-}; [ "$model" = 8b ] && model=llama3-8b
    step "$part" 480 python benchmarks/tracer_overhead.py --models "$model" --quick --rounds 15 --base-tree "$base" \
      ${NEW_LABEL:+--new-label "$NEW_LABEL"} --out "$out/paired_${part#pair-}.json"
    grep -E "^=== |^tree |bs +[0-9]+ +off|error" "$log"
    ;;
  host)
    # The recorder's host µs per call inside a traced tiny bs 1 run, then where tiny bs 1's traced iteration spends
    # host time: the CPU layout, a JIT warm-up and a py-spy profile of alternating off / on rounds (host_profile.py).
    # py-spy's wheel travels in .gpu/pyspy (`python3 -m pip download --no-deps --only-binary=:all: --platform
    # manylinux2014_x86_64 -d .gpu/pyspy py-spy` on the development machine).
    step recorder-host 60 python benchmarks/recorder_host.py --device cuda --batch-sizes 1 --new-tokens 40 \
      --out "$out/recorder_host.json"
    { lscpu; nproc; for c in 0 1 2 8; do echo "cpu$c siblings $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list)"; done; } >"$work/cpus.txt" 2>&1
    if python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .gpu/pyspy/*.whl >>"$log" 2>&1; then
      step warm 240 python benchmarks/host_profile.py tiny:1 --rounds 3 --per-round 2
      step spy 150 /tmp/pyspy/bin/py-spy record --idle --threads --nonblocking -r 400 -f raw -o "$work/prof_tiny1.txt" \
        -- python benchmarks/host_profile.py tiny:1 --rounds 12 --per-round 6
      python benchmarks/host_profile.py --summarize "$work/prof_tiny1.txt" --top 40 >"$out/host_profile.txt" 2>&1
    else
      echo "=== spy skipped: no py-spy wheel in .gpu/pyspy" | tee -a "$log"
    fi
    grep -E "^=== |^bs |^tiny:1" "$log"
    ;;
  records)
    # The H200 sample traces (samples/traces/h200-*.db), the GPU replays of recorded attention calls, and the SGLang
    # GPU tests (with .sglang-slim carried).
    S=$work/samples; mkdir -p "$S"
    step samples 120 bash -c "
      specscope run --requests 8 --batch-size 4 --max-new-tokens 32 -o $S/h200-default.db --quiet &&
      specscope run --requests 8 --batch-size 4 --max-new-tokens 32 --plan-stream -o $S/h200-plan-stream.db --quiet &&
      specscope run --requests 24 --batch-size 8 --max-new-tokens 48 --record-attention 20 -o $S/h200-graphs-changing-bs.db --quiet &&
      for f in $S/*.db; do specscope check \$f --write >/dev/null; echo \$f check rc=\$?; done"
    step replay 150 bash scripts/gpu_replay.sh "$work/replay"
    step sglang 90 env SPECSCOPE_SGLANG_GPU_OUT="$work/sglang" python -m pytest -q -m gpu tests/unit/test_sglang_gpu.py -rs -s
    grep -E "^=== |passed|failed|rc=" "$log"
    ;;
esac
tar czf "$out/res-$part.tgz" -C "$work" . 2>>"$log"
echo "done $part: $(du -sh "$out/res-$part.tgz" | cut -f1)"
