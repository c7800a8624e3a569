# Shared helpers of the per-session device scripts (scripts/gpu-session*.sh): source it after
# setting $out (the session's result folder). Each helper respects the call's deadline
# (DEADLINE seconds after the start, default 560) and writes one line to $out/summary.txt.
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$out"
t0=$(date +%s)
deadline=${DEADLINE:-560}
left() { echo $(( deadline - ($(date +%s) - t0) )); }
say() { echo "$*" | tee -a "$out/summary.txt"; }
: > "$out/summary.txt"

# Everything (tests, benchmarks, examples) in build-gpu/ through scripts/gpu-check.
build() {
  scripts/gpu-check build > "$out/build-step.log" 2>&1
  say "build: rc=$? at $(( $(date +%s) - t0 )) s"
}

# [limit]: every test through gpu-check (GPU, CPU, mini-decoder; GTEST_FILTER narrows the GPU
# ones), its summary and failed tests into summary.txt.
all_tests() {
  if [ -n "${1:-}" ]; then
    timeout "$1" scripts/gpu-check test > "$out/test-step.log" 2>&1
  else
    scripts/gpu-check test > "$out/test-step.log" 2>&1
  fi
  cat gpu-out/summary.txt >> "$out/summary.txt" 2>/dev/null
  grep -E '^\[  FAILED  \]' gpu-out/gpu-tests.log gpu-out/cpu-tests.log \
    gpu-out/mini-decoder-tests.log 2>/dev/null | head -20 | tee -a "$out/summary.txt"
}

# name tool filter limit: one compute-sanitizer tool over the GPU tests matching filter.
sanitize() {
  local l limit=$4
  l=$(left)
  (( l < 30 )) && { say "sanitizer $1: not run (deadline)"; return; }
  (( limit > l - 15 )) && limit=$(( l - 15 ))
  timeout "$limit" compute-sanitizer --tool "$2" --print-limit 200 --error-exitcode 99 \
    build-gpu/tests/kvc_cuda_tests --gtest_filter="$3" --gtest_brief=1 \
    > "$out/sanitizer-$1.log" 2>&1
  say "sanitizer $1: rc=$? $(grep -E '(ERROR|RACECHECK) SUMMARY' "$out/sanitizer-$1.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' "$out/sanitizer-$1.log" | tr '\n' ' ')"
}

# name filter limit: GPU tests matching filter under a timeout.
gtests() {
  local l limit=$3
  l=$(left)
  (( l < 20 )) && { say "tests $1: not run (deadline)"; return; }
  (( limit > l - 10 )) && limit=$(( l - 10 ))
  timeout "$limit" build-gpu/tests/kvc_cuda_tests --gtest_brief=1 --gtest_filter="$2" \
    > "$out/gtests-$1.log" 2>&1
  say "tests $1: rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/gtests-$1.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$out/gtests-$1.log" | head -10 >> "$out/summary.txt"
}

# name binary benchmark-filter kernel-regex [extra ncu args]: one ncu report (text) of one launch.
profile() {
  local l name=$1 bin=$2 filter=$3 kernel=$4
  shift 4
  l=$(left)
  (( l < 40 )) && { say "ncu $name: not run (deadline)"; return; }
  timeout 60 ncu --target-processes all -k "regex:$kernel" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section InstructionStats "$@" \
    build-gpu/benchmarks/$bin --benchmark_filter="$filter" --benchmark_min_time=1x \
    --benchmark_repetitions=1 > "$out/ncu-$name.txt" 2>&1
  say "ncu $name: rc=$? $(grep -E '^ +Duration' "$out/ncu-$name.txt" | head -1 | tr -s ' ')"
}

# limit binary filter [tag]: one benchmark binary's matching rows (medians of BENCH_REPS,
# default 3, at BENCH_TIME, default 0.05s) into JSON, at most `limit` seconds (and what the
# deadline leaves).
bench() {
  local l limit=$1 tag=${4:-}
  l=$(left)
  (( l < 25 )) && { say "$2$tag: not run (deadline)"; return; }
  (( limit > l - 10 )) && limit=$(( l - 10 ))
  timeout "$limit" build-gpu/benchmarks/$2 --benchmark_min_time=${BENCH_TIME:-0.05s} \
    --benchmark_repetitions=${BENCH_REPS:-3} --benchmark_report_aggregates_only=true \
    --benchmark_filter="$3" --benchmark_out="$out/$2$tag.json" --benchmark_out_format=json \
    > "$out/$2$tag.log" 2>&1
  say "$2$tag: rc=$? $(grep -c '_median' "$out/$2$tag.log") rows"
}

# The Python package (in-tree module of build-gpu) under pytest on the GPU machine; $@ narrows.
pytest_gpu() {
  local l
  l=$(left)
  (( l < 60 )) && { say "pytest: not run (deadline)"; return; }
  { cmake -S . -B build-gpu -DKVC_BUILD_PYTHON=ON > "$out/python-configure.log" 2>&1 &&
    cmake --build build-gpu --target _kvc -j "$(nproc)" > "$out/python-build.log" 2>&1 &&
    PYTHONPATH=$PWD/build-gpu/python timeout $(( l - 30 )) python3 -X faulthandler -m pytest -q \
      -p no:cacheprovider -rs "${@:-tests/python}" > "$out/pytest.log" 2>&1; }
  say "pytest ${*:-tests/python} (GPU machine): rc=$? $(grep -E 'passed|failed' "$out/pytest.log" | tail -1)"
  grep -E '^FAILED|SKIPPED' "$out/pytest.log" | head -10 >> "$out/summary.txt"
}

# name sha256 parts...: joins model parts into models/<name> once and checks its checksum.
join_model() {
  local name=$1 sum=$2
  shift 2
  [ -f "models/$name" ] || cat "$@" > "models/$name"
  echo "$sum  models/$name" | sha256sum -c --quiet - || { say "$name: checksum mismatch"; return 1; }
}

# Packs $out into $OUT/results.tar.gz (the device tool brings it back) and prints the summary.
finish() {
  say "total $(( $(date +%s) - t0 )) s"
  if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/results.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
    cp "$out/summary.txt" "$OUT/"
  fi
  cat "$out/summary.txt"
}
