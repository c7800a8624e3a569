#!/usr/bin/env bash
# Device calls of the twenty-seventh session, 2026-12-05 (each under the 10-minute limit; results
# in $OUT, helpers in scripts/gpu-lib.sh):
#   tokens    the two-stage token kernels' latency chains cut: the ring CTA's K rows loaded 32
#             elements per round trip (dot_heads: one 16-byte load at a time, each waited for,
#             before), a shared row's kv heads over grid.z, the candidates' block ids loaded
#             beside the slot's length, the finish kernel's lse values and partials batched;
#             the set path's tests after session 26's review mend (never run on a GPU): the
#             selector's set / decode tests, the two-stage, token and decode-step tests, memcheck
#             and racecheck over the two-stage and set tests, the step rows, and Nsight Compute
#             (clocks not locked, so durations compare with the graph's) of one two-stage step
#   final     the same-run table for latest.json: kvc's rows, then PyTorch's and CUB's anchors in
#             the same call (carry [".anchors/p1/wheels", ".anchors/p1/bin", ".anchors/p1/MANIFEST"])
#   flashinfer  FlashInfer's anchors, back to back after `final` on the same warm machine
#             (carry [".anchors/p1/flashinfer-sm90a.tar.xz", ".anchors/p1/wheels/apache_tvm_ffi-
#             <version>.whl", ".anchors/p1/MANIFEST"])
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session27
source scripts/gpu-lib.sh

# name filter: Nsight Compute (SpeedOfLight, Occupancy, LaunchStats; clocks as the GPU runs them,
# --clock-control none) of every kernel of one decode step of step_bench's row `filter`.
step_ncu() {
  local l
  l=$(left)
  (( l < 40 )) && { say "ncu $1: not run (deadline)"; return; }
  timeout 90 ncu --target-processes all --clock-control none \
    -k 'regex:summary|topm|spread|set_topk|policy|token|finish|select|attn|attention|decode|score|combine' \
    --launch-skip "${NCU_SKIP:-14}" --launch-count 14 --section SpeedOfLight --section Occupancy \
    --section LaunchStats build-gpu/benchmarks/step_bench --benchmark_filter="$2" \
    --benchmark_min_time=1x --benchmark_repetitions=1 > "$out/ncu-$1.txt" 2>&1
  say "ncu $1: rc=$?"
  awk '/^  [a-z_].*\(/{k=$1; if (k == "void") k = $2} /^    Duration/{print "  " k, $3, $2}' "$out/ncu-$1.txt" |
    head -14 >> "$out/summary.txt"
}

step_rows='/(1|8)/131072/0/(1|3)/1/|/32/32768/0/3/1/'
case "${1:-tokens}" in
  tokens)
    build_targets kvc_cuda_tests step_bench
    gtests set '*Cuda_Selector_Set.*:*Cuda_Selector_Decode*:*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*:*Cuda_DecodeStep*' 100
    KVC_TEST_MAX_ROW=8192 sanitize memcheck memcheck '*Cuda_Selector_Set.*:*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*' 70
    KVC_TEST_MAX_ROW=8192 sanitize racecheck racecheck '*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*' 60
    bench 50 step_bench "$step_rows"
    step_ncu two-stage-B1 'BM_DecodeStep/1/131072/0/3/1/'
    report
    ;;
  final)
    build_targets kvc_cuda_tests step_bench index_bench attention_bench topk_bench store_bench \
      dsv4_bench
    gtests set '*Cuda_Selector_Set.*:*Cuda_Selector_Decode*:*Cuda_BlockIndex_TwoStage*:*Cuda_BlockIndex_Token*:*Cuda_DecodeStep*' 90
    same_run_kvc
    bench 30 topk_bench 'BM_TopKSet/' -set
    ANCHORS="torch cub" anchors_and_report
    ;;
  flashinfer)
    l=$(left)
    ANCHORS="flashinfer_decode flashinfer_topk" DEADLINE=$(( l - 15 )) \
      benchmarks/anchors/run-anchors.sh "$out" > "$out/run-anchors-flashinfer.out" 2>&1
    say "flashinfer anchors: rc=$? $(tail -2 "$out/run-anchors-flashinfer.out" | tr '\n' ' ')"
    ;;
  *) echo "gpu-session27.sh: tokens | final | flashinfer" >&2; exit 2 ;;
esac
finish
