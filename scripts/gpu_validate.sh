#!/usr/bin/env bash
# Issue 12's GPU checks and benchmarks on a GPU host that is set up already (`. .gpu/setup.sh`, see
# ../shared/gpu-host/README.md), in parts that each fit a 10-minute device call. Every result file is named by the
# commit; logs go beside them. Run `tests` first on a fresh machine: it JIT-compiles the tiny models' kernels, which
# the benchmarks would otherwise compile inside their timed cells.
#
#   bash scripts/gpu_validate.sh tests     OUT   # pytest -m gpu (sync-debug, lossless greedy, faults, ring, live TUI)
#   bash scripts/gpu_validate.sh overhead  OUT   # tracer_overhead, tiny and 8B, --quick, 9 rounds; recorder_host
#   bash scripts/gpu_validate.sh speed     OUT   # engine_speed --quick, plan_stream, clock_drift (2 min)
#
# OUT defaults to benchmarks/results/gpu-<commit>. Exit status: the number of parts' commands that failed.
set -u
part=${1:-}
case "$part" in
  tests|overhead|speed) ;;
  *) echo "usage: bash scripts/gpu_validate.sh tests|overhead|speed [OUT]" >&2; exit 2 ;;
esac
commit=$(git rev-parse --short HEAD 2>/dev/null || cut -c1-7 backend/archive_commit.txt)
out=${2:-benchmarks/results/gpu-$commit}
mkdir -p "$out"
failed=0

step() {  # step NAME LIMIT_S CMD...: run CMD under a time limit, its output in OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - t0)) s  ($*)"
  grep -E "passed|failed| bs |target|wrote|rror" "$out/$name.log" | cut -c1-220 | tail -8
  [ "$rc" = 0 ] || failed=$((failed + 1))
}

case "$part" in
  tests)
    step "pytest_gpu-$commit" 480 python -m pytest -q -m gpu tests/gpu tests/unit tests/tui/test_live.py -n 4 \
      -p no:cacheprovider -rs
    ;;
  overhead)
    step "tracer_overhead_tiny-$commit" 120 python benchmarks/tracer_overhead.py --models tiny --quick --rounds 9 \
      --out "$out/tracer_overhead_tiny-$commit.json"
    step "tracer_overhead_8b-$commit" 240 python benchmarks/tracer_overhead.py --models llama3-8b --quick --rounds 9 \
      --out "$out/tracer_overhead_8b-$commit.json"
    step "recorder_host_cuda-$commit" 90 python benchmarks/recorder_host.py --device cuda --batch-sizes 1,16 \
      --new-tokens 40 --out "$out/recorder_host_cuda-$commit.json"
    ;;
  speed)
    step "engine_speed-$commit" 240 python benchmarks/engine_speed.py --quick --out-dir "$out"
    step "plan_stream-$commit" 120 python benchmarks/plan_stream.py --out "$out/plan_stream-$commit.json"
    step "clock_drift-$commit" 150 python scripts/clock_drift.py --seconds 120 --every 2 \
      --out "$out/clock_drift-$commit.json"
    ;;
esac
exit "$failed"
