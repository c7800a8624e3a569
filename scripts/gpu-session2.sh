#!/usr/bin/env bash
# Device calls of the second 2026-12-01 session (each under the 10-minute limit; results in $OUT):
#   scripts/gpu-session2.sh verify   build, every GPU / CPU / mini-decoder test, then
#                                    compute-sanitizer memcheck and racecheck over the tests of
#                                    the kernels not yet run under it (DeepSeek-V4, tensor-core
#                                    attention d256/512, the token fast path, LayeredCache)
#   scripts/gpu-session2.sh bench    (re)build, then the benchmark rows of docs/performance.md and
#                                    the PyTorch anchors, each binary under its own time limit
#   scripts/gpu-session2.sh recheck  (after fixes) every GPU test, memcheck over the fixed tests,
#                                    the step and token-score rows, the Python pytest on the GPU
#   scripts/gpu-session2.sh final    the token-score tests and rows after the last kernel change
# A step stops early when the call's deadline (DEADLINE seconds after the start, default 560)
# is near, and says so in summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session2  # gpu-check writes gpu-out/ (its summary.txt too)
source scripts/gpu-lib.sh

case "${1:-verify}" in
  verify)
    build
    all_tests
    grep -A8 'snapshot_difference' gpu-out/gpu-tests.log | head -20 >> "$out/summary.txt"
    new='*Dsv4*:*AttentionMma*:*TokenScores*:*LayeredCache*:*DecodeStep*'
    skip='*Footprint*:*1000Steps*:*AllocateNothing*:*AllocatesNothing*'
    sanitize memcheck memcheck "$new-$skip" 200
    sanitize racecheck racecheck "*AttentionMma*:*Dsv4_Attention*:*TokenScores*-$skip" 200
    ;;
  bench)
    [ -x build-gpu/benchmarks/step_bench ] || build
    bench 90 step_bench .
    bench 100 attention_bench .
    bench 70 index_bench 'h32x8x128/B(1|8)/N131072/|h9x3x64/B8/N32768/'
    bench 60 topk_bench '^BM_TopK/|^BM_TopKLatency/'
    bench 40 store_bench .
    bench 60 dsv4_bench .
    bench 40 layered_step_bench .
    l=$(left)
    if (( l > 40 )); then
      OUT="$out" timeout $(( l - 20 )) python3 benchmarks/anchors/torch_anchors.py \
        > "$out/torch_anchors.log" 2>&1
      say "torch anchors: rc=$?"
    fi
    python3 scripts/perf-report.py "$out" > "$out/performance_table.md" 2>&1
    ;;
  recheck)
    # After the token-score and test fixes: every GPU test again, memcheck over what failed
    # under it, the step and token-score rows, and the Python package's pytest on the GPU.
    build
    scripts/gpu-check test > "$out/test-step.log" 2>&1
    cat gpu-out/summary.txt >> "$out/summary.txt" 2>/dev/null
    grep -E '^\[  FAILED  \]' gpu-out/gpu-tests.log | head -20 | tee -a "$out/summary.txt"
    sanitize memcheck memcheck '*LayeredCache*:*TokenScores*:*DecodeStep*-*1000Steps*:*AllocateNothing*' 150
    bench 60 step_bench .
    bench 40 index_bench 'h32x8x128/B(1|8)/N131072/token|h32x8x128/B8/N131072/mean_k/f16'
    l=$(left)
    if (( l > 60 )); then
      { cmake -S . -B build-gpu -DKVC_BUILD_PYTHON=ON > "$out/python-configure.log" 2>&1 &&
        cmake --build build-gpu --target _kvc -j "$(nproc)" > "$out/python-build.log" 2>&1 &&
        PYTHONPATH=$PWD/build-gpu/python timeout $(( l - 30 )) python3 -m pytest -q -p no:cacheprovider \
          tests/python > "$out/pytest.log" 2>&1; } 
      say "pytest (GPU machine): rc=$? $(tail -1 "$out/pytest.log" 2>/dev/null)"
    fi
    ;;
  final)
    # The last call: the token kernel's prefetching version against the CPU, then its rows.
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVC_WITH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DKVC_BUILD_TESTS=ON -DKVC_BUILD_BENCHMARKS=ON \
      -DKVC_BUILD_EXAMPLES=OFF > "$out/configure.log" 2>&1
    cmake --build build-gpu -j "$(nproc)" --target kvc_cuda_tests step_bench index_bench \
      > "$out/build.log" 2>&1
    say "build: rc=$? at $(( $(date +%s) - t0 )) s"
    build-gpu/tests/kvc_cuda_tests --gtest_brief=1 \
      --gtest_filter='*TokenScores*:*DecodeStep*:*BlockIndex*' > "$out/gpu-tests.log" 2>&1
    say "gpu tests (token scores, decode step, block index): rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/gpu-tests.log" | tr '\n' ' ')"
    bench 40 step_bench 'DecodeStep/.*/0/1/'
    bench 30 index_bench 'h32x8x128/B(1|8)/N131072/token_(mass|max)/mxfp4/sum/fast'
    ;;
  *) echo "gpu-session2.sh: verify, bench, recheck or final" >&2; exit 2 ;;
esac
# This session packed all of gpu-out/ (gpu-check's logs beside session2/).
say "total $(( $(date +%s) - t0 )) s"
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/results.tar.gz" -C gpu-out .
  cp "$out/summary.txt" "$OUT/"
fi
cat "$out/summary.txt"
