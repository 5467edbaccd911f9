#!/usr/bin/env bash
# The H200 runs a session makes, in parts that each fit one 10-minute device call. From the project root on the
# GPU host:   bash scripts/gpu_batch.sh PART   (PART: see the usage line below). Logs and results go to
# $OUT as one log file and one tarball (the device tool brings back at most 8 files). Run `tests` first on a fresh
# machine: it JIT-compiles the tiny models' and the fused ops' kernels, which a benchmark would otherwise compile
# inside its time limit.
set -uo pipefail
part=${1:?usage: gpu_batch.sh tests|recheck|records|bench|overhead|switches|diag|ab|ab-each|floor|last|plan|s12|s12b|final}
case $part in tests|recheck|records|bench|overhead|switches|diag|ab|ab-each|floor|last|plan|s12|s12b|final) ;; *) echo "usage: gpu_batch.sh tests|recheck|records|bench|overhead|switches|diag|ab|ab-each|floor|last|plan|s12|s12b|final" >&2; exit 2 ;; esac
out=${OUT:-/tmp/gpu-out}
work=/tmp/gpu-work-$part
mkdir -p "$out" "$work"
log=$out/log-$part.txt
# Kernels saved by an earlier call travel compressed (.gpu/kernels.tgz, from save-kernels.sh): unpacked they would not
# fit the device tool's 64 MiB beside the wheels.
if [ -f .gpu/kernels.tgz ]; then rm -rf .gpu/aot && tar xzf .gpu/kernels.tgz -C .gpu; fi
. .gpu/setup.sh >>"$log" 2>&1 || { echo "setup failed"; tail -5 "$log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$log" 2>&1
step() {  # step NAME SECONDS CMD...: run with a time limit, log everything, print one status line
  local name=$1 lim=$2; shift 2
  echo "=== $name start $(date +%T)" >>"$log"
  timeout "$lim" "$@" >>"$log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc $(date +%T)" | tee -a "$log"
}
# Every recorder setting before session 10 (the sender thread for every message, stamp launches that let the GIL go,
# torch drains, resolving at every poll): the B build of the `ab` and `final` A/B runs.
old=SPECSCOPE_TRACE_SENDER=thread,SPECSCOPE_STAMP_GIL=release,SPECSCOPE_TORCH_DRAINS=1,SPECSCOPE_RESOLVE_BATCH=1
sticky_run() {  # a run that hits a sticky CUDA error (wild page id), and what the checker says of its trace
  step sticky 60 bash -c "specscope run --device cuda --inject wild-page-id --requests 4 --batch-size 2 \
    --max-new-tokens 16 -o $work/sticky.db; echo rc=\$?; specscope check $work/sticky.db --max-per-check 2"
}
case $part in
  tests)
    # The detection table runs beside the tests (same GPU, tiny models; neither measures time).
    step detection 400 python scripts/detection_table.py --device cuda --out "$work/detection-h200.json" &
    step gpu-tests 400 python -m pytest -q -m gpu tests/gpu -rs -p no:cacheprovider
    wait
    sticky_run
    # Whether CUDA event times and %globaltimer are one clock (scripts/event_clock.py), and the recorder's host µs per
    # call on the GPU host at tiny bs 1 (what each call costs inside a run, after session 10's cuts).
    step event-clock 50 python scripts/event_clock.py --seconds 20 --out "$out/event_clock.json"
    step recorder-host 60 python benchmarks/recorder_host.py --device cuda --batch-sizes 1 --new-tokens 40 \
      --out "$out/recorder_host_cuda.json"
    grep -E "^=== |passed|failed|^host ns|^t |ppm" "$log"
    ;;
  recheck)
    # What session 9's GPU run of the deferred replay records (1f074cb) did not reach before its time limit: the
    # sticky error, the snapshot ring against host copies, the last fault tests, ring pack and stamps; the clock
    # brackets (written after that run); then the sticky run of the detection table.
    step recheck 420 python -m pytest -q -m gpu -rs -p no:cacheprovider \
      "tests/gpu/test_engine_gpu.py::test_sticky_cuda_error_keeps_every_pending_step" \
      "tests/gpu/test_engine_gpu.py::test_snapshot_ring_records_what_host_copies_record_on_gpu" \
      "tests/gpu/test_engine_gpu.py::test_fault_is_caught_on_gpu" \
      "tests/gpu/test_engine_gpu.py::test_a_gpu_run_records_its_clock_brackets" \
      tests/gpu/test_ring_pack_gpu.py tests/gpu/test_stamps_gpu.py
    sticky_run
    ;;
  records)
    step retest 200 python -m pytest -q -m gpu -rs -p no:cacheprovider \
      "tests/gpu/test_engine_gpu.py::test_no_plan_wait_race_is_caught_on_gpu" \
      "tests/gpu/test_engine_gpu.py::test_sticky_cuda_error_keeps_every_pending_step"
    step detection 200 python scripts/detection_table.py --device cuda --out "$work/detection-h200.json"
    S=$work/samples; mkdir -p "$S"
    step samples 120 bash -c "
      specscope run --requests 8 --batch-size 4 --max-new-tokens 32 -o $S/h200-default.db --quiet &&
      specscope run --requests 8 --batch-size 4 --max-new-tokens 32 --plan-stream -o $S/h200-plan-stream.db --quiet &&
      specscope run --requests 24 --batch-size 8 --max-new-tokens 48 --record-attention 20 -o $S/h200-graphs-changing-bs.db --quiet &&
      for f in $S/*.db; do specscope check \$f --write >/dev/null; echo \$f check rc=\$?; done"
    step replay 150 bash scripts/gpu_replay.sh "$work/replay"
    step sglang 90 env SPECSCOPE_SGLANG_GPU_OUT="$work/sglang" python -m pytest -q -m gpu tests/unit/test_sglang_gpu.py -rs -s
    ;;
  bench)
    step engine-speed 420 python benchmarks/engine_speed.py --quick --out-dir "$work/bench"
    ;;
  overhead)
    # Issue 12's recorder numbers: traced / untraced (tiny, then the 8B shape), the recorder's host µs per call,
    # and how far %globaltimer drifts from the host clock (the recorder corrects none).
    step overhead-tiny 240 python benchmarks/tracer_overhead.py --models tiny --quick --rounds 9 \
      --out "$work/tracer_overhead_tiny.json"
    step overhead-8b 180 python benchmarks/tracer_overhead.py --models llama3-8b --quick --rounds 9 \
      --out "$work/tracer_overhead_8b_quick.json"
    step recorder-host 60 python benchmarks/recorder_host.py --device cuda --batch-sizes 1,16 --new-tokens 40 \
      --out "$work/recorder_host_cuda.json"
    step clock-drift 60 python scripts/clock_drift.py --seconds 40 --every 2 --out "$work/clock_drift.json"
    ;;
  switches)
    # The recorder's switches against the default, as alternating processes (two passes, so each switch has a
    # neighbour of the default on both sides): tiny and the 8B shape at bs 1, 7 rounds, 45 s each (12 x 45 s fit one
    # call). Run `tests` first on a fresh machine (tiny's first process JIT-compiles for ~90 s).
    for pass in 1 2; do
      for sw in default SPECSCOPE_DEFER_SNAPSHOTS=0 SPECSCOPE_TRACE_SENDER=0; do
        for m in tiny llama3-8b; do
          step "$m-$sw-$pass" 45 env ${sw/default/SPECSCOPE_SWITCH=none} python benchmarks/tracer_overhead.py \
            --models $m --batch-sizes 1 --quick --rounds 7 --out "$work/switch_${m}_${sw%%=*}_$pass.json"
        done
      done
    done
    ;;
  ab)
    # Session 10's recorder host-path changes on the GPU: their GPU tests first (stamps and drains, ring pack, the
    # engine: sync-debug, lossless greedy, ring == host copies, faults, sticky error), then the paired A/B in one
    # process per model (the default build against one with every previous setting: the sender thread for every
    # message, stamp launches that let the GIL go, torch drains, resolving at every poll), then the other GPU tests.
    step tests-recorder 210 python -m pytest -q -m gpu -rs -p no:cacheprovider tests/gpu/test_stamps_gpu.py \
      tests/gpu/test_ring_pack_gpu.py tests/gpu/test_engine_gpu.py
    step ab-tiny 110 python benchmarks/tracer_overhead.py --models tiny --batch-sizes 1,16 --quick --rounds 9 \
      --no-profiler --ab-env "$old" --out "$out/ab_tiny.json"
    step ab-8b 150 python benchmarks/tracer_overhead.py --models llama3-8b --batch-sizes 1,16 --quick --rounds 9 \
      --no-profiler --ab-env "$old" --out "$out/ab_8b.json"
    step tests-rest 60 python -m pytest -q -m gpu -rs -p no:cacheprovider tests/gpu --ignore \
      tests/gpu/test_stamps_gpu.py --ignore tests/gpu/test_ring_pack_gpu.py --ignore tests/gpu/test_engine_gpu.py
    grep -E "^=== |passed|failed|error|bs +[0-9]+ +off" "$log"
    ;;
  ab-each)
    # What each of session 10's four host-path changes buys alone: the default against one previous setting at a time,
    # in the same process and rounds (tiny and the 8B shape, bs 1); then the event clock.
    for sw in SPECSCOPE_TRACE_SENDER=thread SPECSCOPE_STAMP_GIL=release SPECSCOPE_TORCH_DRAINS=1 \
              SPECSCOPE_RESOLVE_BATCH=1; do
      step "ab-${sw%%=*}" 100 python benchmarks/tracer_overhead.py --models tiny,llama3-8b --batch-sizes 1 --quick \
        --rounds 9 --no-profiler --ab-env "$sw" --out "$out/ab_${sw%%=*}.json"
    done
    # Whether eager spans could be event records on the stamps' clock (scripts/event_clock.py's docstring).
    step event-clock 60 python scripts/event_clock.py --seconds 30 --out "$out/event_clock.json"
    grep -E "^=== |bs +[0-9]+ +off|^host ns|^t |ppm" "$log"
    ;;
  floor)
    # Session 11: what recording inside the graphs costs alone (the measurement-only `floor` recorder: graphs captured
    # with the real recorder's nodes, nothing recorded on the host after the captures) and what the eager spans cost
    # (`eager-spans`: the real recorder without them), each against the real recorder in the same rounds.
    step floor-tiny 120 python benchmarks/tracer_overhead.py --models tiny --quick --rounds 9 --no-profiler \
      --ab-ablate floor --out "$out/floor_tiny.json"
    step floor-8b 150 python benchmarks/tracer_overhead.py --models llama3-8b --batch-sizes 1,16 --quick --rounds 9 \
      --no-profiler --ab-ablate floor --out "$out/floor_8b.json"
    step eager-spans 150 python benchmarks/tracer_overhead.py --models tiny,llama3-8b --batch-sizes 1 --quick \
      --rounds 9 --no-profiler --ab-ablate eager-spans --out "$out/eager_spans.json"
    step event-clock 50 python scripts/event_clock.py --seconds 20 --out "$out/event_clock.json"
    grep -E "^=== |bs +[0-9]+ +off|^host ns|^t |ppm" "$log"
    ;;
  last)
    # Session 11's last call, on the final code (the recorder as at ce0b109): issue 12's table (every cell, with the
    # profiler anchor), then the two borderline 8B cells again with 15 rounds.
    step overhead 200 python benchmarks/tracer_overhead.py --quick --rounds 9 --out "$out/tracer_overhead.json"
    step overhead-8b-15 150 python benchmarks/tracer_overhead.py --models llama3-8b --batch-sizes 1,16 --quick \
      --rounds 15 --no-profiler --out "$out/tracer_overhead_8b_15.json"
    grep -E "^=== |bs +[0-9]+ +off" "$log"
    ;;
  plan)
    # The plan-stream share on the final code, and the floor at 8B bs 64 (the one cell `floor` left out).
    step plan-stream 60 python benchmarks/plan_stream.py --out "$out/plan_stream.json"
    step floor-8b-64 90 python benchmarks/tracer_overhead.py --models llama3-8b --batch-sizes 64 --quick --rounds 9 \
      --no-profiler --ab-ablate floor --out "$out/floor_8b_64.json"
    grep -E "^=== |bs +[0-9]+ +off|hidden" "$log"
    ;;
  s12)
    # Session 12, on the draft loop that makes every step's metadata first: issue 12's table (every cell, with the
    # profiler anchor), the two borderline 8B cells again with 15 rounds, and the plan-stream share (the verify plan
    # now comes after the whole draft loop).
    step overhead 210 python benchmarks/tracer_overhead.py --quick --rounds 9 --out "$out/tracer_overhead.json"
    step overhead-8b-15 150 python benchmarks/tracer_overhead.py --models llama3-8b --batch-sizes 1,16 --quick \
      --rounds 15 --no-profiler --out "$out/tracer_overhead_8b_15.json"
    step plan-stream 60 python benchmarks/plan_stream.py --out "$out/plan_stream.json"
    grep -E "^=== |bs +[0-9]+ +off|hidden" "$log"
    ;;
  s12b)
    # Session 12's last call: the engine's speed on the draft loop that makes every step's metadata first (issue 12's
    # engine targets), and the three 8B cells again with 25 rounds (the 15-round bs 16 cell spread 0.95-1.11).
    step engine-speed 200 python benchmarks/engine_speed.py --quick --out-dir "$out"
    step overhead-8b-25 240 python benchmarks/tracer_overhead.py --models llama3-8b --quick --rounds 25 \
      --no-profiler --out "$out/tracer_overhead_8b_25.json"
    grep -E "^=== |bs +[0-9]+ +off|busy|ms/it" "$log"
    ;;
  final)
    # Session 10's last call: issue 12's overhead table (every cell, with the profiler anchor), the A/B against the
    # previous settings at bs 64, the plan-stream share, then the GPU tests that `ab` did not run.
    step overhead 200 python benchmarks/tracer_overhead.py --quick --rounds 9 --out "$out/tracer_overhead.json"
    step ab-64 90 python benchmarks/tracer_overhead.py --models tiny,llama3-8b --batch-sizes 64 --quick --rounds 9 \
      --no-profiler --ab-env "$old" --out "$out/ab_64.json"
    step plan-stream 45 python benchmarks/plan_stream.py --out "$out/plan_stream.json"
    step tests-rest 170 python -m pytest -q -m gpu -rs -p no:cacheprovider tests/gpu --ignore \
      tests/gpu/test_stamps_gpu.py --ignore tests/gpu/test_ring_pack_gpu.py --ignore tests/gpu/test_engine_gpu.py
    grep -E "^=== |passed|failed|error|bs +[0-9]+ +off|hidden" "$log"
    ;;
  diag)
    # Where tiny bs 1's traced iteration loses its time: the CPU layout, a JIT warm-up, a py-spy profile of
    # alternating off / on rounds (host_profile.py; .gpu/pyspy carries the wheel; --nonblocking, as session 10's
    # blocking sampling slowed both arms ~3x), and the writer-side switches
    # (no live checker; the writer child discarding; the pipe written on the engine's thread) against the default,
    # each one process of host_profile's alternating rounds.
    { lscpu; nproc; for c in 0 1 2 8; do echo "cpu$c siblings $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list)"; done; } >"$work/cpus.txt" 2>&1
    python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .gpu/pyspy/*.whl >>"$log" 2>&1
    step warm 240 python scripts/host_profile.py tiny:1 --rounds 3 --per-round 2
    step spy 150 /tmp/pyspy/bin/py-spy record --idle --threads --nonblocking -r 400 -f raw -o "$work/prof_tiny1.txt" -- \
      python scripts/host_profile.py tiny:1 --rounds 12 --per-round 6
    python scripts/host_profile.py --summarize "$work/prof_tiny1.txt" --top 40 >"$work/prof_tiny1_summary.txt" 2>&1
    # One process each, the default first and last (host_profile prints each arm's median and on/off of medians).
    step default-1 45 python scripts/host_profile.py tiny:1 --rounds 8 --per-round 3
    step nocheck 45 python scripts/host_profile.py tiny:1 --rounds 8 --per-round 3 --no-live-check
    step discard-nocheck 45 env SPECSCOPE_TRACE_DISCARD=1 python scripts/host_profile.py tiny:1 --rounds 8 \
      --per-round 3 --no-live-check
    step sender0 45 env SPECSCOPE_TRACE_SENDER=0 python scripts/host_profile.py tiny:1 --rounds 8 --per-round 3
    step default-2 45 python scripts/host_profile.py tiny:1 --rounds 8 --per-round 3
    grep -E "^=== |^tiny:1" "$log"
    bash .gpu/save-kernels.sh "$out/k" >>"$log" 2>&1  # the JIT's kernels, for later calls' .gpu/aot
    ;;
esac
rm -rf "$work/k"
tar czf "$out/res-$part.tgz" -C "$work" . 2>>"$log"
echo "done $part: $(du -sh "$out/res-$part.tgz" | cut -f1)"
